"""Every outgoing call ends on time and reads a bounded reply (19_calls): an API simulator and the study app's agent
stream against a loopback server that drips, hangs, pads with whitespace, sends 10 MB or echoes the key
(tests/faultserver.py). Each call must end within `call_bound` of its settings; the checks give it three times that
before they call it stuck, so a busy machine does not fail them."""
import asyncio, json, os, subprocess, sys, threading, time
from pathlib import Path
import pytest
from faultserver import FaultServer
from scope_nb.core.dialogue import Request
from scope_nb.users.calls import call_bound
from scope_nb.users.simulators import ApiConfig, ApiSpeaker

MSGS = [{"role": "user", "content": "hello"}]
KEY = "sk-test-DO-NOT-LEAK-4f9a8b7c6d5e"
ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def faults():
    with FaultServer(gap=0.5) as s:
        yield s


def _speaker(url, **kw):
    cfg = dict(model="m", base_url=url, api_key_env=None, timeout=2.0, max_retries=1, backoff=0.05, max_tokens=8) | kw
    return ApiSpeaker(ApiConfig(**cfg))


def _ended_on_time(sp: ApiSpeaker, key="k"):
    "One reply of `sp`, or a failure if it is still running at three times its call bound."
    c, out = sp.cfg, []
    bound = call_bound(c.timeout, c.max_retries, c.max_backoff, c.max_retry_after)
    t = threading.Thread(target=lambda: out.append(sp.respond([Request(MSGS, key=key)])[0]), daemon=True)
    t0 = time.monotonic()
    t.start()
    t.join(3 * bound)
    assert out, f"the call was still running after {time.monotonic() - t0:.0f} s (its bound: {bound:.0f} s)"
    return out[0], time.monotonic() - t0


def test_a_dripping_endpoint_fails_at_each_attempts_deadline(faults):
    "One byte every 0.5 s never trips a wait-between-bytes timeout; the total deadline ends each attempt at 2 s."
    rep, took = _ended_on_time(_speaker(faults.url("drip")))
    assert rep.failed and rep.info["api"]["errors"] == ["deadline", "deadline"], rep.info
    assert 4.0 <= took, took  # two whole attempts were given their time


def test_whitespace_keepalive_trips_the_idle_limit(faults):
    rep, _ = _ended_on_time(_speaker(faults.url("pad"), timeout=30.0, idle_timeout=1.0, max_retries=0))
    assert rep.failed and rep.info["api"]["errors"] == ["idle"], rep.info


def test_a_hanging_endpoint_fails_and_is_retried(faults):
    rep, _ = _ended_on_time(_speaker(faults.url("hang")))
    assert rep.failed and len(rep.info["api"]["errors"]) == 2, rep.info
    assert set(rep.info["api"]["errors"]) <= {"timeout", "deadline"}, rep.info


@pytest.mark.parametrize("fault", ["huge", "huge_chunked"])
def test_a_10mb_reply_is_refused_without_reading_it(faults, fault):
    "A 10 MB reply to a request for 8 tokens is a failed attempt; the process's peak memory does not grow by 10 MB."
    code = f"""
import resource, sys
sys.path.insert(0, {str(ROOT / 'tests')!r})
from scope_nb.core.dialogue import Request
from scope_nb.users.simulators import ApiConfig, ApiSpeaker
def sp(url): return ApiSpeaker(ApiConfig(model="m", base_url=url, api_key_env=None, timeout=20, max_retries=0, max_tokens=8))
MSGS = [{{"role": "user", "content": "hi"}}]
assert not sp({faults.url('ok')!r}).respond([Request(MSGS, key="a")])[0].failed   # everything imported and warm
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
rep = sp({faults.url(fault)!r}).respond([Request(MSGS, key="b")])[0]
grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(rep.failed, rep.info["api"]["errors"], grew)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    line = r.stdout.strip().splitlines()[-1]
    failed, rest = line.split(" ", 1)
    errors, grew_kb = rest.rsplit(" ", 1)
    assert failed == "True" and errors == "['too_large']", line
    assert int(grew_kb) < 4 * 1024, f"peak memory grew by {int(grew_kb) / 1024:.1f} MB reading a refused reply"


def test_the_default_base_url_reaches_the_providers_url(faults, monkeypatch):
    "user.api.base_url = '' means the provider's default URL (the openai client's, OPENAI_BASE_URL here)."
    monkeypatch.setenv("OPENAI_BASE_URL", faults.url("ok"))
    rep = _speaker(None).respond([Request(MSGS, key="d")])[0]
    assert not rep.failed and rep.content == "fine", rep.error


def test_a_run_with_the_default_base_url_gets_past_step_0(faults, tmp_path):
    "The documented default in a run config: no AttributeError, the evaluation's episodes answered."
    r = subprocess.run([str(Path(sys.executable).parent / "scope"), "train", str(ROOT / "configs" / "echo_tiny.toml"),
                        "--no-progress", "--set", f"run.out_dir='{tmp_path}'", "--set", "run.steps=1", "--set", "grpo.batch_tasks=2", "--set", "grpo.group_size=2",
                        "--set", "user.model='api:m'", "--set", "user.api.base_url=''", "--set", "user.api.key_env=''",
                        "--set", "eval.tasks=2", "--set", "eval.samples=1", "--set", "checkpoint.every=1"],
                       capture_output=True, text=True, timeout=600, env={**os.environ, "OPENAI_BASE_URL": faults.url("ok")})
    assert r.returncode == 0, r.stderr[-2000:]
    assert "AttributeError" not in r.stderr


def test_a_run_against_a_dripping_endpoint_stops_by_itself_with_one_line(faults, tmp_path):
    "Every evaluation call drips: the run stops on its failure budget at step 0, exit 2, the cause in one line."
    t0 = time.monotonic()
    r = subprocess.run([str(Path(sys.executable).parent / "scope"), "train", str(ROOT / "configs" / "echo_tiny.toml"),
                        "--no-progress", "--set", f"run.out_dir='{tmp_path}'", "--set", "user.model='api:m'",
                        "--set", f"user.api.base_url='{faults.url('drip')}'", "--set", "user.api.key_env=''",
                        "--set", "user.api.timeout=2.0", "--set", "user.api.max_retries=1", "--set", "eval.tasks=2"],
                       capture_output=True, text=True, timeout=600)
    took = time.monotonic() - t0
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "gave up after 2 attempts (deadline, deadline)" in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    assert took < 300, took


def test_a_key_echoed_by_the_endpoint_never_reaches_replies_or_errors(faults, monkeypatch):
    monkeypatch.setenv("SCOPE_TEST_KEY", KEY)
    for fault in ("echo_key", "echo_key_401"):
        rep = _speaker(faults.url(fault), api_key_env="SCOPE_TEST_KEY").respond([Request(MSGS, key="e")])[0]
        said = json.dumps([rep.content, rep.error, rep.info])
        assert all(KEY[i : i + 6] not in said for i in range(len(KEY) - 5)), said
    assert any(auth == f"Bearer {KEY}" for _, _, auth in faults.requests)   # the key was really sent
    assert "***" in said  # the 401's message was kept, redacted


def test_the_study_agent_stream_ends_at_its_deadline(faults):
    "A stream that sends a word every 0.5 s forever: the agent's turn fails after (retries + 1) x agent_timeout."
    from scope_nb.study.sessions import AgentError, stream_chat

    class Ep:
        base_url, model, api_key_env, temperature, max_tokens = faults.url("sse_drip"), "m", None, 0.0, 16

    async def go():
        seen = []
        try:
            async for ev in stream_chat(Ep, MSGS, None, retries=1, timeout=2.0):
                seen.append(ev)
        except AgentError as e:
            return seen, str(e)
        return seen, None

    t0 = time.monotonic()
    seen, err = asyncio.run(asyncio.wait_for(go(), 60))
    assert err is not None and "deadline" in err, (err, seen[-3:])
    assert seen and all(k == "delta" for k, *_ in seen)   # words were shown, then the attempt was cut off
    assert time.monotonic() - t0 < 30


def test_the_study_agent_stream_refuses_an_oversized_reply(faults):
    from scope_nb.study.sessions import AgentError, stream_chat

    class Ep:
        base_url, model, api_key_env, temperature, max_tokens = faults.url("huge_chunked"), "m", None, 0.0, 16

    async def go():
        try:
            async for _ in stream_chat(Ep, MSGS, None, retries=0, timeout=20.0):
                pass
        except AgentError as e:
            return str(e)

    assert "too_large" in asyncio.run(asyncio.wait_for(go(), 60))


def test_a_run_configs_call_limits_reach_the_speaker(faults):
    "[user.api] timeout and idle_timeout of a run config are the speaker's limits: the pad endpoint fails on idle."
    from scope_nb.train.config import Config
    from scope_nb.train.specs import build_speaker

    api = {"key_env": "", "base_url": faults.url("pad"), "timeout": 30.0, "idle_timeout": 1.0, "max_retries": 0}
    cfg = Config.model_validate({"user": {"model": "api:m", "api": api}})
    sp = build_speaker("api:m", cfg.user, None, "user", 0)
    rep, _ = _ended_on_time(sp)
    assert rep.failed and rep.info["api"]["errors"] == ["idle"], rep.info
