"""No simulator output enters a conversation raw, whatever path produced it: `scope simulate-vs` and a short training
run against a misbehaving OpenAI-compatible endpoint. The endpoint stand-in wraps the real llama.cpp server (a share
of the user's requests are answered by SmolLM2) and injects, for VS and plain requests alike, what misbehaving
endpoints send: VS JSON to a plain request, fenced JSON, JSON with prose, truncated JSON, bare lists, wrong keys,
empty answers, markup. The agent's side is a fixed list of questions (the agent is not under test)."""
import json, random, re, subprocess, sys, threading, urllib.error, urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
import pytest
from scope_nb.users.llama_server import LlamaServer

AGENT_LINES = ["Would you like to try it?", "Can I interest you in this?", "It only takes a minute, yes?"]
VS = '{"responses": [{"text": "Yes, sure.", "probability": 0.6}, {"text": "No, thanks.", "probability": 0.4}]}'
MESS = [
    VS,                                                                           # a VS answer (also to plain requests)
    "Here are my options:\n```json\n" + VS + "\n```",                             # fenced, with prose
    "Sure! " + VS + " Hope that helps.",                                          # JSON inside prose
    '{"responses": [{"text": "Yes", "probability": 0.5}, {"text": "N',            # truncated
    '["Maybe later.", "Why not."]',                                               # a bare list of candidates
    '{"answer": "yes", "confidence": 0.9}',                                       # wrong keys
    '{"responses": [{"text": "{\\"responses\\": [\\"nested\\"]}", "probability": 1.0}]}',   # a candidate that is JSON
    "",                                                                           # empty
    "<p>Yes, <b>please</b>.</p>",                                                 # markup (plain text: allowed)
    "[1, 2, 3]",                                                                  # a list that is not candidates
]
LEAK = re.compile(r'"responses"|"probability"|no_json|no_responses|no_valid_items|parser_error|verbalized sampling:')


def leaks(text: str) -> bool:
    "A VS answer's structure, a bare JSON list, or a parse-failure marker in what should be one plain reply."
    s = (text or "").strip()
    if LEAK.search(s): return True
    try: return isinstance(json.loads(s), (list, dict))
    except ValueError: return False


class Misbehaving:
    "OpenAI-compatible /v1/chat/completions: the agent's fixed questions; for the user, SmolLM2 (real) or injected mess."
    def __init__(self, upstream: str, real_share: float = 0.15, seed: int = 0):
        self.rng, self.lock, self.counts = random.Random(seed), threading.Lock(), {"real": 0, "mess": 0, "agent": 0}
        me = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a): pass

            def do_GET(self):   # /v1/models and health checks go to the real server
                with urllib.request.urlopen(upstream + self.path.removeprefix("/v1"), timeout=60) as r: body = r.read()
                self._json(body)

            def _json(self, body: bytes):
                self.send_response(200); self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)

            def do_POST(self):
                req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with me.lock:
                    kind = "agent" if req.get("model") == "agent" else "real" if me.rng.random() < real_share else "mess"
                    me.counts[kind] += 1
                    pick = me.rng.choice(AGENT_LINES if kind == "agent" else MESS)
                if kind == "real":
                    fwd = {**req, "max_tokens": min(int(req.get("max_tokens") or 16), 16)}
                    r = urllib.request.Request(upstream + "/chat/completions", data=json.dumps(fwd).encode(),
                                               headers={"Content-Type": "application/json"})
                    try:
                        with urllib.request.urlopen(r, timeout=600) as resp: return self._json(resp.read())
                    except urllib.error.HTTPError as e:   # the real server's own refusal, passed on as it came
                        body = e.read()
                        self.send_response(e.code); self.send_header("Content-Length", str(len(body)))
                        self.end_headers(); self.wfile.write(body); return
                msg = {"role": "assistant", "content": pick}
                self._json(json.dumps({"id": "x", "object": "chat.completion", "model": req.get("model"),
                                       "choices": [{"index": 0, "message": msg, "finish_reason": "stop"}],
                                       "usage": {"prompt_tokens": 1, "completion_tokens": 1}}).encode())

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"


@pytest.fixture(scope="module")
def endpoint():
    srv = LlamaServer("smollm2").start()
    ep = Misbehaving(srv.base_url.rstrip("/"))
    yield ep
    ep.server.shutdown()
    srv.stop()


def test_simulate_vs_never_enters_a_vs_answer_raw(tmp_path, endpoint):
    out = tmp_path / "svs"
    p = subprocess.run([str(Path(sys.executable).parent / "scope"), "simulate-vs", "--env", "ask", "--agent", "api:agent",
                        "--sim", "api:user", "--base-url", endpoint.url, "--episodes", "200", "--out", str(out),
                        "--max-new-tokens", "32", "--attempts", "2", "--api-key-env", ""], capture_output=True, text=True, timeout=1800)
    summary = json.loads((out / "summary.json").read_text())
    # turns the guard gave up on fail their episodes: both files written, then exit 1 with the count
    assert p.returncode == 1 and f"{summary['failed_episodes']} of 200 episodes failed" in p.stderr, p.stderr[-3000:]
    print(json.dumps({k: summary[k] for k in ("turns", "turn_counts", "guard", "status")}), endpoint.counts)
    eps = [json.loads(l) for l in (out / "episodes.jsonl").read_text().splitlines()]
    user_turns = [t["message"]["content"] for e in eps for t in e["conversation"]["turns"] if t["speaker"] == "user"]
    assert summary["turns"] >= 250 and len(user_turns) >= 200
    assert [t for t in user_turns if leaks(t)] == []
    counts = summary["turn_counts"]
    assert counts["drawn"] > 0 and counts["retried"] > 0 and counts["failed"] > 0     # every path was exercised
    assert summary["guard"]["plain_answers_drawn_from"] > 0 and summary["guard"]["candidates_dropped"] > 0
    assert '"turn_counts"' in p.stdout                                                  # printed for the user
    assert endpoint.counts["real"] > 20                                                 # the real server answered too


def test_a_training_run_against_the_misbehaving_endpoint_trains_on_clean_turns(tmp_path, endpoint):
    from scope_nb.train.config import load_config
    from scope_nb.train.run import train
    cfg = load_config(overrides=[f"run.out_dir='{tmp_path}'", "run.name='g'", "run.steps=2", "env.name='echo'",
                                 "agent.model='tiny'", "user.model='api:user'", "user.mode='vs'", "user.vs.n=2",
                                 f"user.api.base_url='{endpoint.url}'", "user.api.key_env=''", "user.max_new_tokens=32", "grpo.batch_tasks=4",
                                 "grpo.group_size=2", "eval.every=2", "eval.tasks=4", "run.max_failed_frac=1.0"])
    run_dir = train(cfg, progress=False)
    files = list((run_dir / "trajectories").glob("*.jsonl")) + list((run_dir / "eval").glob("*/*.jsonl"))
    eps = [json.loads(l) for f in files for l in f.read_text().splitlines()]
    turns = [t["message"]["content"] for e in eps for t in e["conversation"]["turns"] if t["speaker"] == "user"]
    assert len(turns) >= 20 and [t for t in turns if leaks(t)] == []
