"""τ²-bench through our environment: gold replays score 1 with tau2's evaluator, a dropped write scores 0, and a real
SmolLM2 agent against a SmolLM2 customer served locally runs to completion."""
import pytest
from scope_nb.envs.tau2 import Tau2Airline, Tau2Retail, gold_changes_db, replay


@pytest.mark.parametrize("cls", [Tau2Retail, Tau2Airline], ids=["retail", "airline"])
def test_gold_replay_of_every_test_task(cls):
    env = cls()
    full, dropped, n_write = [], [], 0
    for task in env.tasks("test"):
        full.append(replay(env, task)[0])
        if gold_changes_db(env, task):
            n_write += 1
            dropped.append(replay(env, task, drop_last_write=True)[0])
    print(f"{env.name}: {len(full)} test tasks, gold replay mean {sum(full) / len(full):.3f}; {n_write} with writes, dropped-write mean "
          f"{sum(dropped) / max(1, len(dropped)):.3f}")
    assert len(full) == {"tau2-retail": 40, "tau2-airline": 20}[env.name]
    assert all(r == 1.0 for r in full)
    assert n_write > 0 and all(r == 0.0 for r in dropped)


def test_smollm2_agent_and_customer_run_a_retail_episode():
    from scope_nb.train.specs import UserSettings
    from scope_nb.train.rollout import rollout
    from scope_nb.users.modes import Servers
    from scope_nb.train.specs import build_speaker
    env = Tau2Retail(max_turns=3)
    with Servers() as servers:
        agent = build_speaker("smollm2", UserSettings(model="smollm2", temperature=0.7, max_new_tokens=48), env, "agent", 0)
        user = build_speaker("llama:smollm2", UserSettings(model="llama:smollm2", temperature=0.7, max_new_tokens=48), env, "user", 1, False, servers)
        res = rollout(env, env.tasks("test")[:1], 1, {"agent": agent, "user": user}, ("agent",), {"agent": 0.7, "user": 0.7})
    ep = res.episodes[0]
    ep.validate()
    assert ep.status != "failed" and ep.rewards["agent"] in (0.0, 1.0)
    assert ep.conversation.n_turns("agent") >= 2 and ep.conversation.n_turns("user") >= 1
    assert ep.trajectories["agent"].n_generated > 0
    print(ep.status, ep.rewards, [(t.speaker, (t.message.content or "")[:60]) for t in ep.conversation.turns])
