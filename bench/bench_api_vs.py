"""API concurrency and the cost of Verbalized Sampling, against a real local model server (llama.cpp serving
SmolLM2), side by side.

    .venv/bin/python bench/bench_api_vs.py [--episodes 8] [--vs-episodes 4] [--latency 1.0] [--repeats 3]

Part 1 (API concurrency): `--episodes` AskEnv episodes whose agent and user are API speakers behind a loopback
proxy that adds `--latency` seconds to every call (as a remote API would). Sequential (concurrency 1) vs concurrent
(concurrency = episodes), alternating; the concurrent run should take about one episode's time, not the sum.
(Written for a server that ran one request at a time; llama-server now batches concurrent requests, measured
without injected latency in `bench_sim_server.py`.)
Part 2 (VS cost): `--vs-episodes` of the same episodes without injected latency (fewer, to keep `make bench` short), the user played plainly vs through Verbalized
Sampling (n = 5 candidates in one JSON reply, drawn by probability). Rollout time ratio VS / plain. The paper's
~1.12x is per training step on GPUs, where the update dominates; here the ratio is of generation alone on a CPU
(VS asks for five candidates, so it generates more tokens per user turn).
"""
import argparse, statistics, sys, threading, time, urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from scope_nb.envs.base import AskEnv
from scope_nb.users.llama_server import LlamaServer
from scope_nb.train.rollout import rollout
from scope_nb.users.simulators import ApiConfig, ApiSpeaker, Verbalized


def latency_proxy(target: str, latency: float) -> ThreadingHTTPServer:
    "A loopback proxy that waits `latency` seconds, then forwards the request to `target` (a /v1 base URL)."
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a): pass
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            time.sleep(latency)
            req = urllib.request.Request(target.rsplit("/v1", 1)[0] + self.path, data=body, headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=600) as r: data = r.read()
            self.send_response(200); self.send_header("Content-Type", "application/json"); self.send_header("Content-Length", str(len(data)))
            self.end_headers(); self.wfile.write(data)
    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def speaker(base_url, model, concurrency, name, max_tokens=24):
    return ApiSpeaker(ApiConfig(model=model, base_url=base_url, api_key_env=None, concurrency=concurrency, max_tokens=max_tokens), name=name, temperature=0.7)


def timed(env, n, agent, user) -> float:
    tasks = (env.tasks("train") * n)[:n]
    t0 = time.perf_counter()
    res = rollout(env, tasks, 1, {"agent": agent, "user": user}, (), {"agent": 0.7, "user": 0.7})
    assert all(e.status != "failed" for e in res.episodes), [e.status for e in res.episodes]
    return time.perf_counter() - t0


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=8); ap.add_argument("--latency", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=3); ap.add_argument("--vs-episodes", type=int, default=4)
    a = ap.parse_args()
    srv = LlamaServer("smollm2").start()
    try:
        env = AskEnv(max_turns=2)
        proxy = latency_proxy(srv.base_url, a.latency)
        purl = f"http://127.0.0.1:{proxy.server_address[1]}/v1"
        seq, conc = [], []
        for _ in range(a.repeats):
            seq.append(timed(env, a.episodes, speaker(purl, srv.model_name, 1, "agent"), speaker(purl, srv.model_name, 1, "user")))
            conc.append(timed(env, a.episodes, speaker(purl, srv.model_name, a.episodes, "agent"), speaker(purl, srv.model_name, a.episodes, "user")))
        proxy.shutdown()
        plain, vs = [], []
        n = a.vs_episodes
        for _ in range(a.repeats):
            agent = speaker(srv.base_url, srv.model_name, n, "agent")
            plain.append(timed(env, n, agent, speaker(srv.base_url, srv.model_name, n, "user")))
            v = Verbalized(speaker(srv.base_url, srv.model_name, n, "user", max_tokens=160), n=5, structured="json_object_schema", seed=0)
            vs.append(timed(env, n, agent, v))
    finally: srv.stop()
    s, c, p, v_ = map(statistics.median, (seq, conc, plain, vs))
    calls = a.episodes * 4   # 2 agent + 2 user turns per episode
    print(f"{a.episodes} AskEnv episodes (2 rounds), SmolLM2 on llama.cpp, medians of {a.repeats}")
    print(f"API concurrency, +{a.latency:.1f} s per call: sequential {s:.1f} s, concurrent {c:.1f} s -> {s / c:.2f}x "
          f"(latency alone would sum to {calls * a.latency:.0f} s sequentially; one episode's latency is {4 * a.latency:.0f} s)")
    print(f"VS cost ({a.vs_episodes} episodes, no injected latency): plain {p:.1f} s, VS n=5 {v_:.1f} s -> {v_ / p:.2f}x")
    print(f"headline: concurrent speed-up = {s / c:.2f}x; VS / plain rollout time = {v_ / p:.2f}x")
