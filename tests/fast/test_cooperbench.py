"""CooperBench on the local sandbox, through the environment interface, on the shipped fixture tasks."""
import json
from scope_nb.envs.cooperbench import CooperBenchEnv, ScriptedCoder, bash_call
from scope_nb.core.dialogue import ToolCall
from scope_nb.train.rollout import rollout


def _task(env, name):
    return next(t for t in env.tasks("train") + env.tasks("test") if t.id.startswith(name))


def test_coop_right_patches_succeed_and_conflicting_patch_fails():
    env = CooperBenchEnv(setting="coop", command_timeout=10)
    t = _task(env, "toycalc/task2")
    f1, f2 = t.data["features"]
    a = ScriptedCoder([(None, [bash_call(f"git apply {f1}/feature.patch")])])
    b = ScriptedCoder([(None, [bash_call(f"git apply {f2}/feature.patch")])])
    ep = rollout(env, [t], 1, {"agent": a, "user": b}).episodes[0]
    assert ep.rewards == {"agent": 1.0, "user": 1.0} and ep.status == "completed"
    bad = ScriptedCoder([(None, [bash_call("printf 'def add(a, b):\\n    return a - -b\\n' > calc/core.py")])])
    ep = rollout(env, [t], 1, {"agent": a, "user": bad}).episodes[0]
    assert ep.rewards == {"agent": 0.0, "user": 0.0}          # both edit add(): the merge conflicts


def test_wrong_implementation_fails_and_partial_credit():
    env = CooperBenchEnv(setting="coop", command_timeout=10, partial_credit=True)
    t = _task(env, "toycalc/task1")
    f1, _ = t.data["features"]
    a = ScriptedCoder([(None, [bash_call(f"git apply {f1}/feature.patch")])])
    b = ScriptedCoder([(None, [bash_call("printf 'def sub(a, b):\\n    return b - a\\n' > calc/sub.py")])])   # wrong
    ep = rollout(env, [t], 1, {"agent": a, "user": b}).episodes[0]
    assert ep.rewards["agent"] == 0.5


def test_looping_command_is_killed_and_huge_output_is_capped():
    env = CooperBenchEnv(setting="solo", command_timeout=2, output_cap=10_000)
    t = _task(env, "toycalc/task1")
    st = env.reset(t)
    env.apply(st, "agent", None, [bash_call("while true; do :; done", 0), bash_call("python3 -c \"print('y' * 10_000_000)\"", 1)])
    loop, big = [x.message.content for x in st.conversation.turns if x.message.role == "tool"]
    assert "killed after 2s timeout" in loop
    assert len(big) < 10_300 and "characters cut" in big and big.startswith("yyyy")
    assert not st.done and st.next == "agent"                   # the episode goes on
    env.apply(st, "agent", None, [ToolCall("x", "finish", "{}")])
    assert st.done and env.reward(st)["agent"] == 0.0           # nothing implemented


def test_solo_and_baseline_settings():
    env = CooperBenchEnv(setting="solo", command_timeout=10)
    t = _task(env, "toycalc/task1")
    f1, f2 = t.data["features"]
    solo = ScriptedCoder([(None, [bash_call(f"git apply {f1}/feature.patch && git apply {f2}/feature.patch")])])
    ep = rollout(env, [t], 1, {"agent": solo, "user": solo}).episodes[0]
    assert ep.rewards["agent"] == 1.0 and ep.conversation.n_turns("user") == 0
    base = CooperBenchEnv(setting="baseline")
    assert len(base.tasks("train")) + len(base.tasks("test")) == 4        # one task per feature
    bt = _task(base, "toycalc/task2/baseline/feature2")
    ep = rollout(base, [bt], 1, {"agent": ScriptedCoder([(None, [bash_call(f"git apply {bt.data['features'][0]}/feature.patch")])]),
                                 "user": solo}).episodes[0]
    assert ep.rewards["agent"] == 1.0
