"""`scope simulate-vs` against an endpoint that answers 500 to every call: the files are written, the failed episodes
and turns are counted (a failed turn leaves no turn record, so they are counted from the episodes), and the command
exits 1 with one line naming how many failed and where the episodes are."""
import json, os, subprocess, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
import pytest

SCOPE = str(Path(sys.executable).parent / "scope")
EPISODES = 3


@pytest.fixture(scope="module")
def failing():
    "A loopback endpoint answering every request with HTTP 500; `calls` counts them."
    calls = []

    class H(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            calls.append(self.path)
            body = b'{"error": {"message": "injected failure"}}'
            self.send_response(500)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1", calls
    srv.shutdown()


def _simulate_vs(tmp_path, url, agent):
    out = tmp_path / "svs"
    r = subprocess.run([SCOPE, "simulate-vs", "--env", "ask", "--agent", agent, "--sim", "api:m", "--base-url", url,
                        "--api-key-env", "", "--max-retries", "0", "--attempts", "1", "--episodes", str(EPISODES),
                        "--out", str(out)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                       env={**os.environ, "OPENAI_API_KEY": ""})
    return r, out, json.loads((out / "summary.json").read_text())


def test_every_call_failing_exits_nonzero_and_counts_the_failed_episodes(tmp_path, failing):
    "Both speakers on the failing endpoint: the agent speaks first, so its turn ends every episode."
    url, calls = failing
    r, out, s = _simulate_vs(tmp_path, url, "api:m")
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
    assert (s["episodes"], s["failed_episodes"], s["failed_by"]) == (EPISODES, EPISODES, {"agent": EPISODES})
    assert s["status"] == {"failed": EPISODES} and s["turn_counts"]["failed"] == 0 and s["turns"] == 0
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith(f"scope: simulate-vs: {EPISODES} of {EPISODES} episodes failed (agent {EPISODES}; first: "), line
    assert str(out / "episodes.jsonl") in line and "Traceback" not in r.stderr
    assert len((out / "episodes.jsonl").read_text().splitlines()) == EPISODES and len(calls) >= EPISODES


def test_a_failing_simulator_counts_its_failed_turns(tmp_path, failing):
    """A local scripted agent and the simulator on the failing endpoint: every simulator turn fails (its proposal,
    then its plain fallback); they are counted as failed, not as plain replies."""
    url, _ = failing
    r, out, s = _simulate_vs(tmp_path, url, "scripted:echo")
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
    assert (s["failed_episodes"], s["failed_by"]) == (EPISODES, {"user": EPISODES})
    assert s["turn_counts"] == {"drawn": 0, "plain": 0, "failed": EPISODES, "retried": 0}
    assert s["turns"] == EPISODES and s["parse_success_rate"] == 0.0
    assert s["api"]["failures"] == 2 * EPISODES   # per turn: the proposal call and the plain fallback's call
    assert f"{EPISODES} of {EPISODES} episodes failed (user {EPISODES}; first: user (" in r.stderr
