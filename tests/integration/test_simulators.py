"""Simulators against a real llama.cpp server (packaged SmolLM2): frozen replies, Verbalized Sampling,
`scope simulate-vs`, fault injection through a proxy, and API keys that never reach any file."""
import json, os, subprocess, sys
from pathlib import Path
import pytest
from faultproxy import FaultProxy
from scope_nb.users.llama_server import LlamaServer
from scope_nb.users.simulators import ApiConfig, ApiSpeaker, Verbalized
from scope_nb.core.dialogue import Request

SCOPE = str(Path(sys.executable).parent / "scope")
MSGS = [{"role": "system", "content": "You are a busy person. Reply in one short sentence."},
        {"role": "user", "content": "Would you like a cup of tea?"}]


@pytest.fixture(scope="module")
def server():
    with LlamaServer("smollm2") as srv: yield srv


def _speaker(base_url, model, **kw):
    cfg = dict(model=model, base_url=base_url, api_key_env=None, max_tokens=24, timeout=20.0, concurrency=4) | kw
    return ApiSpeaker(ApiConfig(**cfg), temperature=0.7)


def test_frozen_simulator_answers(server):
    sp = _speaker(server.base_url, server.model_name)
    reps = sp.respond([Request(MSGS, key=f"k{i}") for i in range(3)])
    assert all(r.content and not r.failed for r in reps)
    api = reps[0].info["api"]
    assert api["attempts"] == 1 and api["completion_tokens"] > 0 and api["latency"] > 0
    assert sp.stats["calls"] == 3 and sp.stats["failures"] == 0


def test_request_seeds_make_draws_depend_on_episode_not_call_order(server):
    """Without a request seed a fresh llama.cpp server draws its k-th answer alike in every run, so runs with
    different seeds shared their simulators' draws. With per-request seeds: same (seed, key, turn) -> same answer,
    whatever the order; another run seed -> other answers. Bit-for-bit only for one call at a time without the
    prompt cache: llama-server's logits depend on the batch a request is decoded in and on how much of its prompt
    came from the cache, so the same seed can otherwise diverge after a few tokens (21_llama_server)."""
    reqs = [Request(MSGS, key=f"ep{i}") for i in range(6)]
    def answers(seed, order):
        sp = _speaker(server.base_url, server.model_name, concurrency=1, extra_body={"cache_prompt": False})
        sp.temperature = 1.0; sp.reseed(seed)
        got = sp.respond([reqs[i] for i in order])
        return {reqs[i].key: r.content for i, r in zip(order, got)}
    first, shuffled, other = answers(1, range(6)), answers(1, [5, 2, 0, 4, 1, 3]), answers(2, range(6))
    assert first == shuffled
    assert sum(first[k] != other[k] for k in first) >= 3, (first, other)
    assert len(set(first.values())) >= 3, first              # episodes of one run do not share a draw


def test_simulate_vs_writes_jsonl_and_summary(tmp_path):
    out = tmp_path / "svs"
    # each attempt's deadline is the whole call's time (19_calls): on two busy cores a 300-token VS proposal among
    # eight parallel slots can take minutes, so the deadline is generous here; the checks are of the answers
    r = subprocess.run([SCOPE, "simulate-vs", "--episodes", "14", "--max-new-tokens", "24", "--out", str(out),
                        "--timeout", "600"], capture_output=True, text=True, timeout=1800)
    s = json.loads((out / "summary.json").read_text())
    # exit 1 exactly when an episode failed (a simulator turn the guard gave up on; rare against a healthy server)
    assert r.returncode == (1 if s["failed_episodes"] else 0) and s["failed_episodes"] <= 1, r.stderr[-2000:]
    print({k: s[k] for k in ("turns", "parse_success_rate", "complete_rate", "valid_draw_rate", "mean_unique_candidates")})
    assert s["turns"] >= 20                              # 14 episodes of up to 2 customer turns each
    assert s["complete_rate"] >= 0.95 and s["valid_draw_rate"] >= 0.95
    lines = (out / "episodes.jsonl").read_text().splitlines()
    assert len(lines) == 14
    turn = next(t["vs"] for l in lines for t in json.loads(l)["info"]["turns"] if t["role"] == "user" and "drawn" in t.get("vs", {}))
    assert len(turn["candidates"]) == 5 and 0 <= turn["drawn"] < 5 and turn["parse_ok"]
    conv_texts = [t["message"]["content"] for l in lines for t in json.loads(l)["conversation"]["turns"]]
    assert not any('"responses"' in (c or "") for c in conv_texts)   # raw JSON never enters the conversation


def test_faults_are_retried_counted_and_exhaustion_fails_with_reason(server):
    # the client's timeout must only catch the proxy's injected hangs, never a slow answer of a busy machine
    with FaultProxy(server.base_url, rate=0.2, seed=1, hang=45.0) as proxy:
        sp = _speaker(proxy.base_url, server.model_name, timeout=30.0, backoff=0.05, max_backoff=0.2, max_retry_after=1.0)
        replies = []
        for b in range(5):  # 50 simulated turns
            replies += sp.respond([Request(MSGS, key=f"b{b}/{i}") for i in range(10)])
    assert len(replies) == 50 and all(not r.failed and r.content for r in replies)
    print(proxy.counts, sp.stats["errors"])
    assert proxy.n_faults >= 5 and all(proxy.counts[k] > 0 for k in ("429", "500", "drop", "truncated", "timeout"))
    errs, attempts = sp.stats["errors"], sum(proxy.counts.values())
    # every attempt reached the proxy, and every attempt but the 50 that answered was an error, retried and counted
    assert attempts == 50 + sp.stats["retries"] and sp.stats["retries"] == sum(errs.values())
    assert sum(len(r.info["api"]["errors"]) for r in replies) == sp.stats["retries"]
    # faults the proxy answers itself are seen exactly as injected
    assert (errs.get("429", 0), errs.get("500", 0), errs.get("connection", 0)) == (proxy.counts["429"], proxy.counts["500"], proxy.counts["drop"])
    # faults that wait on the real server can also meet the client's timeout when a busy machine answers slowly
    # (CI once saw 10 client timeouts for 4 injected hangs); nothing is lost, it is only counted as a timeout
    malformed = sum(v for k, v in errs.items() if k.startswith("malformed"))
    timed_out = sum(errs.get(k, 0) for k in ("timeout", "deadline", "idle"))  # a hang meets the attempt's deadline
    assert malformed <= proxy.counts["truncated"] and timed_out >= proxy.counts["timeout"]
    assert timed_out + malformed == proxy.counts["timeout"] + proxy.counts["truncated"] + proxy.counts["ok"] - 50
    with FaultProxy(server.base_url, rate=1.0, faults=("500",), seed=2) as proxy:
        sp = _speaker(proxy.base_url, server.model_name, max_retries=2, backoff=0.01)
        rep = sp.respond([Request(MSGS, key="x")])[0]
    assert rep.failed and rep.error == "gave up after 3 attempts (500, 500, 500)"


def test_vs_survives_faults(server):
    # no hang is injected here, so the client's timeout only has to outlast a slow answer on a busy machine (at 20 s,
    # CI's 2 test processes once made the client give up on real answers: "gave up after ... (timeout ...)")
    with FaultProxy(server.base_url, rate=0.2, faults=("500", "truncated", "429"), seed=3) as proxy:
        vs = Verbalized(_speaker(proxy.base_url, server.model_name, timeout=300.0, backoff=0.05, max_retry_after=1.0), n=5, structured="json_object_schema")
        reps = vs.respond([Request(MSGS, key=f"v{i}") for i in range(6)])
    assert all(r.content and not r.failed for r in reps), [(r.error, r.info.get("api", {}).get("errors")) for r in reps if r.failed]
    assert all("candidates" in r.info["vs"] or r.info["vs"].get("fallback") == "plain" for r in reps)


def test_api_key_never_reaches_logs_or_files(server, tmp_path):
    key = "sk-test-DO-NOT-LEAK-4f9a8b7c6d5e"
    out = tmp_path / "svs"
    with FaultProxy(server.base_url, rate=0.5, faults=("auth_echo",), seed=4) as proxy:
        r = subprocess.run([SCOPE, "simulate-vs", "--episodes", "3", "--max-new-tokens", "16", "--out", str(out),
                            "--agent", f"api:{server.model_name}", "--sim", f"api:{server.model_name}", "--base-url", proxy.base_url,
                            "--api-key-env", "SCOPE_TEST_KEY", "--max-retries", "1"],
                           capture_output=True, text=True, timeout=900, env={**os.environ, "SCOPE_TEST_KEY": key})
    # a refused call fails its episode: exit 1, and the line naming the first error carries no key either
    failed = json.loads((out / "summary.json").read_text())["failed_episodes"]
    assert r.returncode == (1 if failed else 0), r.stderr[-2000:]
    assert f"Bearer {key}" in proxy.seen_auth and proxy.counts["auth_echo"] > 0   # the key was really sent, and echoed back
    blobs = [r.stdout, r.stderr] + [p.read_text(errors="replace") for p in out.rglob("*") if p.is_file()]
    assert not any(key in b or key[:12] in b for b in blobs)
    assert any("HTTP 401" in b for b in blobs)                                  # the failure reason was kept, redacted


def test_a_run_whose_api_simulator_always_fails_exits_nonzero(server, tmp_path):
    "An endpoint answering 500 on every call: `scope train` stops at the first evaluation, exit code 2, the error named."
    echo = str(Path(__file__).parents[2] / "configs" / "echo_tiny.toml")
    with FaultProxy(server.base_url, rate=1.0, faults=("500",), seed=5) as proxy:
        r = subprocess.run([SCOPE, "train", echo, "--no-progress", "--set", f"run.out_dir='{tmp_path}'",
                            "--set", f"user.model='api:{server.model_name}'", "--set", f"user.api.base_url='{proxy.base_url}'",
                            "--set", "user.api.key_env=''", "--set", "user.api.max_retries=1", "--set", "eval.tasks=2"],
                           capture_output=True, text=True, timeout=900)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "scope: error: step 0: 4 of 4 evaluation episodes against" in r.stderr and "gave up after 2 attempts (500, 500)" in r.stderr
    assert "Traceback" not in r.stderr
