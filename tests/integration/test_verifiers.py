"""verifiers (0.4, the real package) both ways: (b) a verifiers taskset written here trains in scope_nb with a VS user
and its own rewards as the agent's reward; (a) a scope_nb VS simulator answers as the user inside a verifiers rollout
(`vf.load_environment` by name, verifiers' null chat harness in its subprocess runtime, SmolLM2 on llama.cpp as the
assistant), its draws recorded on the trace the task scores."""
import asyncio, json, os, re, subprocess, sys, textwrap
from pathlib import Path
import pytest
from conftest import ROOT

import verifiers.v1 as vf  # the verifiers extra (make venv installs it)
SCOPE = str(Path(sys.executable).parent / "scope")
FRUITS = ("mango", "plum", "fig", "kiwi", "pear", "lime")

TASKSET = '''
import verifiers.v1 as vf
__all__ = ["FruitTaskset"]

class FruitData(vf.TaskData):
    fruit: str

class FruitTask(vf.Task[FruitData]):
    @vf.reward
    async def named(self, trace) -> float:
        return float(any(self.data.fruit in (m.content or "").lower() for m in trace.assistant_messages))

class FruitTaskset(vf.Taskset[FruitTask, vf.TasksetConfig]):
    def load(self):
        return [FruitTask(FruitData(prompt=f"You want to buy fruit at a market stall. You came for {f}.", fruit=f),
                          self.config.task) for f in FRUITS]
'''


def _taskset(folder: Path, name: str = "fruit_stall") -> str:
    "Write the taskset module `name` into `folder` (a verifiers taskset id is a module name)."
    (folder / f"{name}.py").write_text(f"FRUITS = {FRUITS!r}\n" + textwrap.dedent(TASKSET))
    return name


def _named(fruit: str, conversation_turns: list[dict]) -> float:
    "The task's reward recomputed from a scope_nb episode: did the agent name the fruit?"
    return float(any(t["speaker"] == "agent" and fruit in (t["message"]["content"] or "").lower()
                     for t in conversation_turns))


def test_a_verifiers_taskset_trains_in_scope_nb_with_a_vs_user(tmp_path):
    ts = _taskset(tmp_path)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    sets = ["env.name='verifiers'", f"env.options.taskset='{ts}'", "env.max_turns=2", "user.model='llama:smollm2'",
            "user.mode='vs'", "user.vs.n=3", "user.max_new_tokens=160", "grpo.batch_tasks=2", "eval.tasks=2",
            # a 616-token VS proposal among 8 parallel slots on two busy cores can take minutes: a deadline per attempt
            # that generous keeps the check about the answers, not the machine's load (19_calls)
            "user.api.timeout=900",
            f"run.out_dir='{tmp_path}'"]
    args = [SCOPE, "train", ROOT / "configs" / "smoke_smollm2.toml", "--no-progress"]
    r = subprocess.run(args + [x for s in sets for x in ("--set", s)], capture_output=True, text=True, env=env, timeout=2400)
    assert r.returncode == 0, r.stderr[-3000:]
    run = tmp_path / "smoke-smollm2"
    rows = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    trained = {row["step"]: row for row in rows if "train/loss" in row}
    assert sorted(trained) == [1, 2] and all(row["train/grad_norm"] >= 0 for row in trained.values()), rows
    eps = [json.loads(l) for f in sorted((run / "trajectories").glob("*.jsonl")) for l in f.read_text().splitlines()]
    assert len(eps) == 2 * 2 * 2, len(eps)  # 2 steps x 2 tasks x group 2
    train_ids = {f"vf/{i}" for i in range(len(FRUITS) - 2)}  # the last quarter (2 of 6) is held out
    vs_turns = 0
    for ep in eps:
        assert ep["task_id"] in train_ids and ep["status"] != "failed", (ep["task_id"], ep["status"], ep["error"])
        fruit = FRUITS[int(ep["task_id"].split("/")[1])]
        assert fruit in ep["conversation"]["system"]["user"]  # the task's prompt is the user's scenario
        assert fruit not in (ep["conversation"]["system"].get("agent") or "")  # ... and not the agent's
        want = _named(fruit, ep["conversation"]["turns"])
        assert ep["rewards"]["agent"] == want and ep["info"]["reward_info"]["rewards"] == {"named": want}, ep["rewards"]
        for t in ep["info"].get("turns", []):
            if t["role"] == "user" and "vs" in t:
                vs_turns += 1
                assert t["vs"]["n"] == 3 and "candidates" in t["vs"] or not t["vs"]["parse_ok"]
    assert vs_turns >= len(eps), vs_turns  # every episode's user opened with a VS draw
    for step, row in trained.items():  # the logged train reward is the mean of the task's own rewards
        mine = [ep["rewards"]["agent"] for ep in eps if ep["step"] == step]
        assert len(mine) == 4 and abs(row["train/reward"] - sum(mine) / 4) < 1e-9, (step, row["train/reward"], mine)
    assert (run / "checkpoints").exists() and any((run / "checkpoints").iterdir())
    evaluated = {json.loads(l)["task_id"] for f in (run / "eval").glob("*/*.jsonl") for l in f.read_text().splitlines()}
    assert evaluated == {"vf/4", "vf/5"}, evaluated
    bad = subprocess.run(args + ["--set", "env.name='verifiers'", "--set", "env.options.taskset='no_such_tasks'",
                                 "--set", f"run.out_dir='{tmp_path / 'x'}'"], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and "env.options.taskset = 'no_such_tasks'" in bad.stderr and "Traceback" not in bad.stderr


def _episode(env, task, ctx):
    async def go():
        async with env.serving():
            return await env.run_episode(task, ctx)
    return asyncio.run(go())


def test_a_scope_nb_vs_user_answers_inside_a_verifiers_rollout(tmp_path, monkeypatch):
    from scope_nb.interop.verifiers import offline_uv_env
    from scope_nb.users.llama_server import LlamaServer

    monkeypatch.syspath_prepend(str(tmp_path))
    ts = _taskset(tmp_path)
    for k, v in offline_uv_env().items():  # verifiers' chat program installed by uv from the wheels make venv fetched
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("SCOPE_TEST_KEY", "none")
    from scope_nb.core.models import cache_dir
    monkeypatch.setenv("SCOPE_NB_CACHE", str(cache_dir()))  # the served models stay where they are ...
    monkeypatch.setenv("HOME", str(tmp_path))  # ... and verifiers' runtime keeps its scripts and uv environments here
    user = {"model": "llama:smollm2", "mode": "vs", "vs": {"n": 3}, "max_new_tokens": 160}
    assistant = {"harness": {"id": "null"}, "runtime": {"type": "subprocess"}, "sampling": {"max_tokens": 48}}
    env = vf.load_environment(vf.resolve_env_config({"id": "scope-nb-user", "taskset": {"id": ts}, "user": user,
                                                     "assistant": assistant, "max_turns": 2}))
    assert type(env).__name__ == "ScopeUserEnv"
    task = list(env.taskset)[0]
    with LlamaServer("smollm2") as srv:  # the assistant: SmolLM2 behind llama.cpp's streaming endpoint
        ctx = vf.ModelContext(model=srv.model_name,
                              client=vf.EvalClientConfig(base_url=srv.base_url, api_key_var="SCOPE_TEST_KEY"))
        ep = _episode(env, task, ctx)
    assert ep.ok, [e.message[:500] for e in ep.errors]
    (trace,) = ep.traces
    rec = trace.info["scope_user"]
    assert (rec["model"], rec["mode"]) == ("llama:smollm2", "vs")
    said = [m.content for m in trace.messages if m.role == "user"]
    drawn = [t["vs"]["candidates"][t["vs"]["drawn"]] for t in rec["turns"] if t["vs"].get("parse_ok")]
    assert drawn and trace.metrics["scope_user/turns"] == len(rec["turns"]) >= 1
    assert said == [t["text"] for t in rec["turns"] if "###DONE###" not in t["text"]]  # what it said, as it said it
    for t in rec["turns"]:  # ... each one the candidate its VS draw picked
        if t["vs"].get("parse_ok"):
            assert t["text"] == t["vs"]["candidates"][t["vs"]["drawn"]] and len(t["vs"]["candidates"]) <= 3
    assert [m.role for m in trace.messages if m.role in ("user", "assistant")][:2] == ["user", "assistant"]
    assert task.data.fruit not in " ".join(m.content or "" for m in trace.messages if m.role == "system")
    want = float(any(task.data.fruit in (m.content or "").lower() for m in trace.assistant_messages))
    assert trace.reward == want and trace.rewards["named"].score == want  # scored by the task, as any verifiers trace

    # a user whose endpoint is down fails the episode with its error; no empty user message is sent on
    down = {"model": "api:nobody", "api": {"base_url": "http://127.0.0.1:9/v1", "key_env": "", "max_retries": 0}}
    env2 = vf.load_environment(vf.resolve_env_config({"id": "scope-nb-user", "taskset": {"id": ts}, "user": down}))
    ep2 = _episode(env2, task, ctx)
    assert not ep2.ok and any("failed after its retries" in e.message for e in ep2.errors), ep2.errors
