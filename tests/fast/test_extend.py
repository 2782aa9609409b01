"""An environment and a user mode from a separately installed package, used by registration alone: the package
declares them as entry points (`scope_nb.envs`, `scope_nb.modes`), pip installs it, and `scope train` runs them with
no change to scope_nb. A contract break (a reward outside [0, 1]) stops the run naming the environment."""
import json, os, subprocess, sys, textwrap
from pathlib import Path
import pytest

SCOPE = str(Path(sys.executable).parent / "scope")

PACKAGE = '''
"""coin_env: a coin-calling game and a user mode, shipped outside scope_nb."""
import numpy as np
from pydantic import Field
from scope_nb.core.dialogue import Conversation, Settings, Speaker
from scope_nb.envs.base import Env, EnvState, Task
from scope_nb.train.specs import UserMode

class CoinEnv(Env):
    "The user calls coins ('say heads tails'); the agent scores by repeating each call."
    name, vocab = "coin", ("heads", "tails", "say", "ok")
    def __init__(self, max_turns=2):
        self.max_turns, rng = max_turns, np.random.default_rng(0)
        calls = [" ".join(rng.choice(["heads", "tails"], max_turns)) for _ in range(16)]
        self._t = [Task(f"coin/{i}", "train" if i < 12 else "test", {"calls": c}) for i, c in enumerate(calls)]
    def tasks(self, split="train"): return [t for t in self._t if t.split == split]
    def reset(self, task):
        return EnvState(task, Conversation(system={"agent": "coin", "user": "say " + task.data["calls"]}))
    def _apply(self, state, speaker, content, tool_calls):
        state.conversation.say(speaker, content or "")
        if speaker == "agent" and state.agent_turns >= self.max_turns: state.next = None
        else: self.alternate(state, speaker)
    def reward(self, state):
        t = state.conversation.turns
        hits = [a.message.content.split()[:1] == u.message.content.split()[:1]
                for u, a in zip(t, t[1:]) if u.speaker == "user" and a.speaker == "agent"]
        r = float(np.mean(hits)) if hits else 0.0
        return {"agent": r, "user": 1.0 - r}

class LoudCoinEnv(CoinEnv):
    "Breaks the contract: rewards up to 2."
    name = "coin-loud"
    def reward(self, state): return {k: 2.0 for k in super().reward(state)}

class TallySettings(Settings):
    every: int = Field(1, ge=1, description="log the running total every this many steps")

class Tally(Speaker):
    "The base user, counting every reply it gives over the whole run (state across steps and restarts)."
    def __init__(self, base, s):
        self.base, self.s, self.total = base, s, 0
        self.name, self.concurrent, self.api = f"tally-{base.name}", base.concurrent, base.api
    def reseed(self, seed): self.base.reseed(seed)
    def respond(self, requests, temperature=None):
        self.total += len(requests)
        return self.base.respond(requests, temperature)

def _after(sp, run, step, row):
    if step % sp.s.every == 0: row["sim/replies_total"] = sp.total

TALLY = UserMode("tally", lambda base, sec, *ctx: Tally(base, sec.tally), label="RL + Tally", settings=TallySettings,
                 wraps=True, after_step=_after, state=lambda sp: {"total": sp.total},
                 on_resume=lambda sp, step, st: setattr(sp, "total", st["total"]) if st else None)
'''

PYPROJECT = '''
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"
[project]
name = "coin-env"
version = "0.1"
[tool.setuptools]
py-modules = ["coin_env"]
[project.entry-points."scope_nb.envs"]
coin = "coin_env:CoinEnv"
coin-loud = "coin_env:LoudCoinEnv"
[project.entry-points."scope_nb.modes"]
tally = "coin_env:TALLY"
'''

BASE = ["--no-progress", "--set", "env.max_turns=2", "--set", "run.steps=4", "--set", "checkpoint.every=2",
        "--set", "eval.every=2", "--set", "grpo.batch_tasks=4", "--set", "grpo.group_size=4"]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    "coin-env, built and installed by pip into its own folder (what PYTHONPATH adds below)."
    root = tmp_path_factory.mktemp("coin")
    (root / "pkg").mkdir()
    (root / "pkg" / "coin_env.py").write_text(textwrap.dedent(PACKAGE))
    (root / "pkg" / "pyproject.toml").write_text(PYPROJECT)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--disable-pip-version-check", "--target", str(root / "site"), str(root / "pkg")], check=True)
    assert (root / "site" / "coin_env.py").exists()
    return root / "site"


def scope(args, site, out, *extra):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if site:
        env["PYTHONPATH"] = str(site)
    return subprocess.run([SCOPE, "train", *BASE, "--set", f"run.out_dir='{out}'", *args, *extra],
                          capture_output=True, text=True, env=env)


def metrics(path):
    return [json.loads(l) for l in (path / "metrics.jsonl").read_text().splitlines() if l.strip()]


def test_installed_environment_and_mode_train_by_name(site, tmp_path):
    r = scope(["--set", "env.name='coin'", "--set", "user.mode='tally'", "--set", "user.tally.every=2",
               "--set", "run.name='full'"], site, tmp_path)
    assert r.returncode == 0, r.stderr
    rows = metrics(tmp_path / "full")
    assert [x["step"] for x in rows] == [0, 1, 2, 3, 4] and all(0 <= x["train/reward"] <= 1 for x in rows[1:])
    assert [x["step"] for x in rows if "sim/replies_total" in x] == [0, 2, 4]
    assert rows[-1]["sim/replies_total"] > rows[2]["sim/replies_total"] > 0
    saved = (tmp_path / "full" / "config.toml").read_text()
    assert 'name = "coin"' in saved and "[user.tally]" in saved and "every = 2" in saved
    # stopped after step 2 and resumed: the mode's state comes back from the checkpoint, so the totals agree
    cut = ["--set", "env.name='coin'", "--set", "user.mode='tally'", "--set", "user.tally.every=2", "--set", "run.name='cut'"]
    assert scope(cut + ["--set", "run.steps=2"], site, tmp_path).returncode == 0
    r = scope(cut + ["--resume"], site, tmp_path)
    assert r.returncode == 0, r.stderr
    assert [x.get("sim/replies_total") for x in metrics(tmp_path / "cut")] == [x.get("sim/replies_total") for x in rows]


def test_module_class_name_needs_no_entry_point(site, tmp_path):
    r = scope(["--set", "env.name='coin_env:CoinEnv'", "--set", "run.steps=1"], site, tmp_path)
    assert r.returncode == 0, r.stderr


def test_uninstalled_and_contract_breaking_environments_are_named(site, tmp_path):
    r = scope(["--set", "env.name='coin'"], None, tmp_path)
    assert r.returncode == 2 and "unknown environment; known: ask, cooperbench, echo" in r.stderr, r.stderr
    r = scope(["--set", "env.name='coin-loud'", "--set", "run.steps=1"], site, tmp_path)
    assert r.returncode == 2 and "coin-loud.reward gave agent 2.0" in r.stderr and "[0.0, 1.0]" in r.stderr, r.stderr
