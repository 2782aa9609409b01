"""A run killed with SIGKILL leaves no server of its own running (21_llama_server.reaped): a child Python process
starts a real llama.cpp server or a real vLLM server (from a worker thread that then ends, as a rollout pool's thread
would), is killed with SIGKILL once the server answers, and within 60 s every process it had started, and every
process in their groups, is gone."""
import json, os, signal, subprocess, sys, time, urllib.request
from pathlib import Path
import pytest

CHILD = r"""
import json, sys, threading, time
kind, out = sys.argv[1], {}


def start():
    if kind == "llama":
        from scope_nb.users.llama_server import LlamaServer
        srv = LlamaServer("smollm2", n_ctx=512, parallel=1).start()
        out["health"] = f"http://127.0.0.1:{srv.port}/health"
    else:
        from scope_nb.users.vllm_engine import VLLMServer
        srv = VLLMServer("smollm2", max_model_len=512).start()
        out["health"] = srv.url + "/health"


t = threading.Thread(target=start)
t.start()
t.join()
print(json.dumps(out), flush=True)
time.sleep(3600)
"""


def _procs() -> dict:
    "pid -> (parent pid, process group, state, start time) of every process on the machine."
    out = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                f = (p / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            out[int(p.name)] = (int(f[1]), int(f[2]), f[0], f[19])
    return out


def _descendants(root: int) -> dict:
    "pid -> (group, start time) of every live process under `root`."
    procs, out, todo = _procs(), {}, [root]
    while todo:
        parent = todo.pop()
        for pid, (ppid, pgid, state, start) in procs.items():
            if ppid == parent and state != "Z":
                out[pid] = (pgid, start)
                todo.append(pid)
    return out


def _left(started: dict) -> list[int]:
    """The processes of `started` still alive (same pid and start time, not a zombie: init may reap those late), and
    any live process in their groups (except this test's own group)."""
    procs, groups = _procs(), {g for g, _ in started.values()} - {os.getpgrp()}
    same = [p for p, (g, t) in started.items() if p in procs and procs[p][3] == t and procs[p][2] != "Z"]
    return sorted(set(same) | {p for p, (_, g, s, _) in procs.items() if g in groups and s != "Z"})


@pytest.mark.parametrize("kind", ["llama", "vllm"])
def test_a_killed_run_leaves_no_server(kind, tmp_path):
    if kind == "vllm":
        from scope_nb.users.vllm_engine import vllm_python
        if vllm_python() is None:
            pytest.fail("vLLM is not installed: `make venv` (scope vllm install) puts it in .venv/engines/vllm")
    err = open(tmp_path / "child.err", "wb")
    child = subprocess.Popen([sys.executable, "-c", CHILD, kind], stdout=subprocess.PIPE, stderr=err, text=True,
                             cwd=tmp_path)  # not the repo: the installed package, as a run imports it
    started = {}
    try:
        line = child.stdout.readline()  # after the server answered /health (vLLM: a minute or more on 2 cores)
        assert line, f"the child died before its server answered:\n{(tmp_path / 'child.err').read_text()[-3000:]}"
        with urllib.request.urlopen(json.loads(line)["health"], timeout=30) as r:
            assert r.status == 200                                  # alive and serving before the kill
        started = _descendants(child.pid)
        assert started and _left(started), started
        child.send_signal(signal.SIGKILL)
        child.wait()
        t0 = time.time()
        while _left(started) and time.time() - t0 < 60:            # a hang guard: the watchdog acts within a second
            time.sleep(0.5)
        left = _left(started)
        print(kind, "gone after", round(time.time() - t0, 1), "s;", len(started), "processes started")
        assert not left, f"{kind}: still running 60 s after the kill: {left}"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        for pid in _left(started):                                  # never leave a server behind, pass or fail
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
