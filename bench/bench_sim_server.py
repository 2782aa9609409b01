"""The embedded simulator server (llama.cpp's llama-server serving SmolLM2 on this machine's cores), side by side.
The model is served as the library serves it (`--quant auto`: the packaged Q4_1 file re-encoded as Q8_0, see
`nbs/users/21_llama_server.ipynb`); `--quant none` serves the packaged file itself.

    .venv/bin/python bench/bench_sim_server.py [--episodes 8] [--turns 4] [--repeats 3] [--parts 1234] [--quant Q8_0]
        [--parallel 8] [--server-args='-ctk q8_0 -ctv q8_0']

Part 1 (batching): `--episodes` P4G episodes (SmolLM2 persuader and persuadee, `--turns` turns each) sent one request
at a time (concurrency 1) vs all at once (concurrency = episodes), alternating, no injected latency. The server
decodes concurrent requests in one batch, so the concurrent run overlaps compute, not just waiting.
Throughput = completion tokens per second (sampled replies differ in length between runs) and episodes per second.

Part 2 (Verbalized Sampling): the persuadee's first turn of the same episodes, plain (<= 48 tokens) vs VS with
n = 5 candidates asked two ways: one JSON answer listing the five (`list`, the library's `propose`,
grammar-constrained) and five samples of a one-candidate JSON answer in one request (`samples`, `n = 5`, sharing the
prompt). Two settings: all turns at once as in a rollout group, and each turn alone (one conversation waiting for its
simulator; times summed over the turns). Per-turn time ratio to plain, the share of turns with five valid candidates
(one attempt), and what the candidates are like: the spread (mean pairwise Jaccard distance of their word sets) and
the top stated share (largest probability of the normalised set; 0.2 is flat). This part runs on its own server with
a slot per stream (episodes x 5, 3072 tokens each), so `samples` is not queued behind 8 slots; the `list` answers use
the format a `llama:` user spec asks for (JSON object with a schema that bounds each text, so five fit the budget).

Part 3 (the study): a τ² retail session's agent reply through the study's streaming call on a server that also
serves a P4G session: the first reply (cold: the τ² prompt, ~4k tokens, is processed) and the next one (warm: the
slot keeps the prefix), each while a P4G reply is generated alongside.

Part 4 (fidelity of the served copy): greedy replies of the packaged file vs its F16 and Q8_0 copies.
"""
import argparse, asyncio, json, re, statistics, sys, time, urllib.request

from scope_nb.users.llama_server import LlamaServer
from scope_nb.envs.p4g import P4GEnv
from scope_nb.train.rollout import rollout
from scope_nb.users.simulators import ApiConfig, ApiSpeaker, Request
from scope_nb.users.verbalized import VSConfig, parse_vs, vs_instructions, vs_response_format

OPENER = "Hello! I work with Save the Children. Have you heard of the charity, and would you consider a donation?"


def speaker(srv, conc, name, max_tokens=48):
    cfg = ApiConfig(model=srv.model_name, base_url=srv.base_url, api_key_env=None, concurrency=conc,
                    max_tokens=max_tokens, timeout=600.0)
    return ApiSpeaker(cfg, name=name, temperature=0.7)


def metrics(srv) -> dict:
    "The server's counters (`--metrics`): prompt tokens processed, tokens decoded, decode calls, ..."
    with urllib.request.urlopen(srv.base_url.removesuffix("/v1") + "/metrics", timeout=60) as r:
        text = r.read().decode()
    return {m[1]: float(m[2]) for m in re.finditer(r"^llamacpp:(\w+_total) (\S+)$", text, re.M)}


def episodes(srv, env, n, conc, seed):
    "One rollout of n episodes; (seconds, completion tokens, failed episodes, server counters' increase)."
    agent, user = speaker(srv, conc, "agent"), speaker(srv, conc, "user")
    agent.reseed(seed), user.reseed(seed)
    tasks = (env.tasks("train") * n)[:n]
    m0, t0 = metrics(srv), time.perf_counter()
    res = rollout(env, tasks, 1, {"agent": agent, "user": user}, (), {"agent": 0.7, "user": 0.7})
    dt, m1 = time.perf_counter() - t0, metrics(srv)
    failed = sum(e.status == "failed" for e in res.episodes)
    tokens = agent.stats["completion_tokens"] + user.stats["completion_tokens"]
    return dt, tokens, failed, {k: m1[k] - m0[k] for k in m1}


def part1(srv, a):
    env = P4GEnv(max_turns=a.turns)
    episodes(srv, env, 2, 2, 99)  # warm-up: model pages and the shared system prompt in the cache
    seq, conc = [], []
    for r in range(a.repeats):
        seq.append(episodes(srv, env, a.episodes, 1, r))
        conc.append(episodes(srv, env, a.episodes, a.episodes, r))
    assert not any(r[2] for r in seq + conc), "failed episodes"
    tps = lambda runs: statistics.median(r[1] / r[0] for r in runs)
    eps = lambda runs: statistics.median(a.episodes / r[0] for r in runs)
    med = lambda runs, k: statistics.median(r[3][k] for r in runs)
    print(f"Part 1: {a.episodes} P4G episodes ({a.turns} turns a side), SmolLM2 on llama-server "
          f"({srv.parallel} slots, {srv.n_threads or 'all'} threads), medians of {a.repeats}")
    for name, runs in (("one at a time", seq), (f"{a.episodes} at once", conc)):
        print(f"  {name:<14} {statistics.median(r[0] for r in runs):6.1f} s  {eps(runs):5.3f} episodes/s  "
              f"{tps(runs):6.1f} tokens/s  (tokens per run {statistics.median(r[1] for r in runs):.0f}; server: "
              f"{med(runs, 'prompt_tokens_total'):.0f} prompt tokens processed, "
              f"{med(runs, 'prompt_tokens_cached_total'):.0f} from slot caches, "
              f"{med(runs, 'n_decode_total'):.0f} decode calls)")
    return tps(conc) / tps(seq), eps(conc) / eps(seq)


def user_turns(env, n):
    "The persuadee's first turn of n episodes: messages after the persuader's opener."
    out = []
    for i, task in enumerate((env.tasks("train") * n)[:n]):
        st = env.reset(task)
        if st.next == "agent":
            env.apply(st, "agent", OPENER)
        out.append(Request(st.conversation.view("user"), key=f"u{i}"))
    return out


def post(srv, body):
    req = urllib.request.Request(f"{srv.base_url}/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def vs_samples(srv, reqs, n, max_tokens):
    """n samples of a one-candidate VS answer per request, all requests at once; per request (n valid, texts,
    stated probabilities)."""
    fmt = vs_response_format(1, "prob", "json_object_schema", max_chars=3 * max_tokens)
    block = vs_instructions(1, "prob")
    def one(i_req):
        i, r = i_req
        msgs = [dict(m) for m in r.messages]
        msgs[0]["content"] = (msgs[0]["content"] or "") + "\n\n" + block
        out = post(srv, {"model": srv.model_name, "messages": msgs, "n": n, "temperature": 0.7, "seed": i,
                         "max_tokens": max_tokens + 40, "response_format": fmt})
        ps = [parse_vs(c["message"]["content"], 1) for c in out["choices"]]
        ok = [p for p in ps if p.ok]
        return len(ok) == n, [p.texts[0] for p in ok], [p.probs[0] for p in ok]
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(len(reqs)) as ex:
        return list(ex.map(one, enumerate(reqs)))


def spread(texts):
    "Mean pairwise Jaccard distance of the candidates' word sets (0: all alike, 1: no word shared)."
    sets = [set(t.lower().split()) for t in texts]
    pairs = [(x, y) for i, x in enumerate(sets) for y in sets[i + 1:]]
    return statistics.mean(1 - len(x & y) / max(1, len(x | y)) for x, y in pairs) if pairs else 0.0


def top_share(probs):
    "The largest stated probability after normalising the set (1/n: flat, 1: one candidate holds all)."
    q = [max(0.0, float(x or 0)) for x in probs]
    return max(q) / sum(q) if sum(q) > 0 else 1 / max(1, len(q))


def vs_shapes(srv, plain_sp, vs_sp, reqs, r):
    "One plain turn, one VS `list` turn and one VS `samples` turn of `reqs` sent at once: seconds, valid, sets."
    vs = VSConfig(n=5, attempts=1)
    plain_sp.reseed(r), vs_sp.reseed(r)
    t0 = time.perf_counter(); reps = plain_sp.respond(reqs); tp = time.perf_counter() - t0
    t0 = time.perf_counter(); props = vs_sp.propose(reqs, vs); tl = time.perf_counter() - t0
    t0 = time.perf_counter(); samp = vs_samples(srv, reqs, 5, 48); ts = time.perf_counter() - t0
    return {
        "plain": (tp, [bool(x.content and not x.failed) for x in reps], []),
        "list": (tl, [p["parse"].ok and p["parse"].complete for p in props],
                 [(p["parse"].texts, p["parse"].probs) for p in props if p["parse"].ok and p["parse"].complete]),
        "samples": (ts, [ok for ok, _, _ in samp], [(t, q) for ok, t, q in samp if ok]),
    }


def part2(srv, a):
    """The persuadee's turn of the episodes at once (a rollout group) and each turn alone (one conversation waiting
    for its simulator), plain vs the two VS shapes."""
    env = P4GEnv(max_turns=a.turns)
    reqs = user_turns(env, a.episodes)
    plain_sp, vs_sp = speaker(srv, a.episodes, "user"), speaker(srv, a.episodes, "user")
    vs_sp.vs_format = "json_object_schema"  # what a `llama:` user spec asks for (texts bounded to fit the budget)
    out = {}
    for setting in ("at once", "alone"):
        runs = []
        for r in range(a.repeats):
            if setting == "at once":
                runs.append(vs_shapes(srv, plain_sp, vs_sp, reqs, r))
            else:  # the turns one after another, each alone on the server; times summed
                one = [vs_shapes(srv, plain_sp, vs_sp, [q], r) for q in reqs]
                runs.append({k: (sum(o[k][0] for o in one), [v for o in one for v in o[k][1]],
                                 [x for o in one for x in o[k][2]]) for k in one[0]})
        med = {k: statistics.median(run[k][0] for run in runs) for k in runs[0]}
        valid = {k: statistics.mean(v for run in runs for v in run[k][1]) for k in runs[0]}
        sets = {k: [x for run in runs for x in run[k][2]] for k in runs[0]}
        print(f"Part 2: the persuadee's turn of {a.episodes} episodes {setting}, medians of {a.repeats}")
        for k in med:
            div = (f"  candidates: spread {statistics.mean(spread(t) for t, _ in sets[k]):.2f}, top stated share "
                   f"{statistics.mean(top_share(q) for _, q in sets[k]):.2f}") if sets[k] else ""
            print(f"  {k:<8} {med[k]:6.2f} s  {med[k] / med['plain']:5.2f}x plain  valid {valid[k]:.0%}{div}")
        out[setting] = ({k: med[k] / med["plain"] for k in ("list", "samples")}, valid)
    return out


def part3(srv, a):
    from scope_nb.study.sessions import make_study_env
    from scope_nb.study.sessions import stream_chat
    from scope_nb.study.store import Endpoint

    ep = Endpoint(base_url=srv.base_url, model=srv.model_name, max_tokens=128)
    tau, p4g = make_study_env("tau2-retail", 10), make_study_env("p4g", 10)
    st = tau.reset(tau.tasks("test")[0])
    pst = p4g.reset(sorted(p4g.tasks("train"), key=lambda t: t.id)[0])

    async def reply(env, state):
        t0, first = time.perf_counter(), None
        async for ev in stream_chat(ep, state.conversation.view("agent"), env.tools(state, "agent")):
            if ev[0] == "delta" and first is None:
                first = time.perf_counter() - t0
            if ev[0] == "final":
                env.apply(state, "agent", ev[1] or "(tool call)")
        return time.perf_counter() - t0, first

    async def both(user_text, p4g_text):
        tau.apply(st, "user", user_text)
        if pst.next == "user":
            p4g.apply(pst, "user", p4g_text)
        (t, f), _ = await asyncio.gather(reply(tau, st), reply(p4g, pst))
        return t, f

    cold = asyncio.run(both("Hi, I want to return a pair of shoes I bought last week.", "Hi, who are you?"))
    while st.next == "agent":  # tool-call turns: let the agent finish before the customer speaks again
        asyncio.run(reply(tau, st))
    warm = asyncio.run(both("My order number is #W2378156 and my email is yusuf.rossi@example.com.",
                            "I am not sure I can afford it."))
    print("Part 3: a τ² retail study reply with a P4G session on the same server (agent: SmolLM2, <= 128 tokens)")
    print(f"  cold (first reply, prompt processed): {cold[0]:5.1f} s (first token after {cold[1] or 0:.1f} s)")
    print(f"  warm (next reply, prefix cached):     {warm[0]:5.1f} s (first token after {warm[1] or 0:.1f} s)")
    return cold[0], warm[0]


def part4(a, n=16):
    """Fidelity of re-encoded copies: greedy replies (temperature 0, one request at a time, no prompt cache) of the
    packaged file and of its F16 and Q8_0 copies to the persuadee's first turn of n episodes. F16 holds the packaged
    weights exactly up to f16 rounding, so its divergence is what different kernels alone cause."""
    reqs = user_turns(P4GEnv(max_turns=a.turns), n)

    def replies(quant):
        with LlamaServer(a.model, parallel=1, n_ctx=4096, quant=quant) as srv:
            return [post(srv, {"model": srv.model_name, "messages": r.messages, "max_tokens": 48, "temperature": 0,
                               "cache_prompt": False})["choices"][0]["message"]["content"] for r in reqs]

    def common(x, y):
        k = 0
        for u, v in zip(x.split(), y.split()):
            if u != v:
                break
            k += 1
        return k

    base = replies(None)
    words = statistics.mean(len(b.split()) for b in base)
    print(f"Part 4: greedy replies to {n} persuadee turns (<= 48 tokens, mean {words:.1f} words) of the packaged file "
          "vs its copies")
    out = {}
    for q in ("F16", "Q8_0"):
        got = replies(q)
        out[q] = statistics.mean(common(x, y) for x, y in zip(base, got))
        print(f"  {q:<5} identical {sum(x == y for x, y in zip(base, got))}/{n}, words in common before the first "
              f"difference: mean {out[q]:.1f}")
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=8); ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3); ap.add_argument("--parts", default="1234")
    ap.add_argument("--parallel", type=int, default=8); ap.add_argument("--model", default="smollm2")
    ap.add_argument("--quant", default="auto", help="GGUF type to serve the model as: auto (the library's), none, Q8_0")
    ap.add_argument("--server-args", default="",
                    help="more llama-server flags for parts 1 and 3, given with =, e.g. --server-args='--poll 0'")
    a = ap.parse_args()
    head = []
    quant = {"auto": "auto", "none": None}.get(a.quant, a.quant)
    extra = ("--metrics", *a.server_args.split())
    with LlamaServer(a.model, parallel=a.parallel, quant=quant, extra_args=extra) as srv:
        print(f"model file served: {srv.served.name}")
        if "1" in a.parts:
            tok, eps = part1(srv, a)
            head.append(f"batching {tok:.2f}x tokens/s ({eps:.2f}x episodes/s)")
        if "3" in a.parts:
            cold, warm = part3(srv, a)
            head.append(f"τ² study reply cold {cold:.1f} s, warm {warm:.1f} s")
    if "2" in a.parts:  # a slot per stream: `samples` decodes episodes x 5 streams at once
        with LlamaServer(a.model, parallel=5 * a.episodes, n_ctx=3072, quant=quant) as srv:
            res = part2(srv, a)
        head.insert(1 if "1" in a.parts else 0, "VS/plain turn " + ", ".join(
            f"{setting}: list {r['list']:.2f}x (valid {v['list']:.0%}), samples {r['samples']:.2f}x "
            f"(valid {v['samples']:.0%})" for setting, (r, v) in res.items()))
    if "4" in a.parts:
        fid = part4(a)
        head.append(f"greedy agreement with the packaged file: F16 {fid['F16']:.1f} words, Q8_0 {fid['Q8_0']:.1f}")
    print("headline: " + "; ".join(head))
    sys.exit(0)
