"""Persuasion for Good: donation parsing (table-driven), reward clamp, splits, and evaluation on the test split only."""
import pytest
from scope_nb.core import Conversation
from scope_nb.p4g import P4GEnv, episode_donation, p4g_reward, parse_donation

CASES = [
    ("[DONATE 2]", 2.0), ("[DONATE $2]", 2.0), ("[GIVE $.50]", 0.5), ("[give $0.5]", 0.5), ("[Donate $1.25]", 1.25),
    ("I'll do it: [DONATE $1,000]", 1000.0), ("[DONATE $ 1]", 1.0), ("[ donate $1 ]", 1.0), ("[DONATE: $0.75]", 0.75),
    ("[DONATE $1] no wait [DONATE $0.20]", 0.2), ("[GIVE $2] ... actually [DONATE $0]", 0.0),
    ("give 2 minutes", None), ("I could give $2", None), ("DONATE $2", None), ("[DONATE]", None), ("[DONATE $abc]", None),
    ("(DONATE $1)", None), ("[DONATE -1]", None), ("", None), (None, None), ("[GIVE 0.01]", 0.01), ("[donate 1.5]", 1.5),
]


@pytest.mark.parametrize("text,amount", CASES)
def test_parse_donation(text, amount):
    assert parse_donation(text) == amount


def _conv(*turns):
    c = Conversation()
    for who, text in turns: c.say(who, text)
    return c


@pytest.mark.parametrize("turns,donation", [
    ((("agent", "[DONATE $2] please"), ("user", "no")), 0.0),                       # the agent's markers never count
    ((("user", "[DONATE $1]"), ("agent", "thanks"), ("user", "[GIVE $0.30]")), 0.3),  # the last marker over the user's turns
    ((("user", "[DONATE $1,000]"),), 2.0),                                           # clipped to the $2 payment
    ((("user", "[DONATE $1]"), ("user", "nothing more")), 1.0),
])
def test_episode_donation(turns, donation):
    assert episode_donation(_conv(*turns)) == donation


@pytest.mark.parametrize("donation,reward", [(0, 0.0), (0.5, 0.25), (2, 1.0), (1000, 1.0), (-3, 0.0)])
def test_reward_clamp(donation, reward):
    assert p4g_reward(donation) == reward


def test_evaluation_never_draws_a_training_persona(tmp_path):
    from scope_nb.config import load_config
    from scope_nb.core import ScriptedSpeaker
    from scope_nb.run import evaluate
    env = P4GEnv(max_turns=1)
    train = {t.data["persuadee_id"] for t in env.tasks("train")}
    cfg = load_config(overrides=["env.name='echo'", "eval.tasks=100", "eval.samples=2"])
    agent, user = ScriptedSpeaker(lambda m: "Would you donate?", "a"), ScriptedSpeaker(lambda m: "[DONATE $1]", "u")
    from scope_nb.config import PanelEntry
    out = evaluate(cfg, env, agent, [(PanelEntry(name="u", model="scripted:echo"), user)], 0, tmp_path)
    from scope_nb.files import read_jsonl
    eps = read_jsonl(tmp_path / "eval" / "step_000000" / "u.jsonl")
    assert eps and not {e.task_id.split("/")[1] for e in eps} & train
    assert out["eval/u/reward"] == 0.5
