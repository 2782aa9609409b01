"""Persuasion for Good: donation parsing (table-driven), reward clamp, splits, and evaluation on the test split only."""
import pytest
from scope_nb.core.dialogue import Conversation
from scope_nb.envs.p4g import P4GEnv, episode_donation, p4g_reward, parse_donation

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
    from scope_nb.train.config import load_config
    from scope_nb.core.dialogue import ScriptedSpeaker
    from scope_nb.train.run import evaluate
    env = P4GEnv(max_turns=1)
    train = {t.data["persuadee_id"] for t in env.tasks("train")}
    cfg = load_config(overrides=["env.name='echo'", "eval.tasks=100", "eval.samples=2"])
    agent, user = ScriptedSpeaker(lambda m: "Would you donate?", "a"), ScriptedSpeaker(lambda m: "[DONATE $1]", "u")
    from scope_nb.train.config import PanelEntry
    out = evaluate(cfg, env, agent, [(PanelEntry(name="u", model="scripted:echo"), user)], 0, tmp_path)
    from scope_nb.core.files import read_jsonl
    eps = read_jsonl(tmp_path / "eval" / "step_000000" / "u.jsonl")
    assert eps and not {e.task_id.split("/")[1] for e in eps} & train
    assert out["eval/u/reward"] == 0.5


def _convokit_corpus(d, n_persuaders=3, n_persuadees=12):
    "A ConvoKit persuasionforgood-layout folder: speakers.json (with metadata) and utterances.jsonl (roles 0 / 1)."
    import json
    d.mkdir()
    er = [f"ER{i}" for i in range(n_persuaders)]
    ee = [f"EE{i:02d}" for i in range(n_persuadees)]
    meta = lambda i: {"age": 20 + i, "sex": "Female" if i % 2 else "Male", "extrovert": 4.5, "care": 1.5}
    (d / "speakers.json").write_text(json.dumps({s: {"meta": meta(i)} for i, s in enumerate(er + ee)}))
    utts = []
    for k, s in enumerate(ee):
        c, p = f"C{k}", er[k % len(er)]
        utts += [{"id": f"{c}a", "conversation_id": c, "speaker": p, "text": "Hi!", "meta": {"role": 0}},
                 {"id": f"{c}b", "conversation_id": c, "speaker": s, "text": "Hello.", "meta": {"role": 1}}]
    (d / "utterances.jsonl").write_text("".join(json.dumps(u) + "\n" for u in utts))
    return d


def test_p4g_trains_and_evaluates_on_a_convokit_corpus_with_prompt_templates(tmp_path):
    "env.corpus and env.prompts: the run's tasks come from the corpus (eval from its test split), the models receive the templates."
    import json
    from scope_nb.train.config import ConfigError, load_config
    from scope_nb.core.models import load_causal_lm
    from scope_nb.train.run import train
    corpus = _convokit_corpus(tmp_path / "corpus")
    prompts = tmp_path / "prompts"
    prompts.mkdir()
    (prompts / "agent.txt").write_text("AGENT-TEMPLATE. You speak for a charity; be brief ({word_limit} words). You are: {persona}")
    (prompts / "user.txt").write_text("USER-TEMPLATE. Play this person: {persona} Donate with [DONATE $N] if convinced.")
    env = P4GEnv(corpus_dir=corpus)
    test_ids = {t.id for t in env.tasks("test")}
    assert test_ids and env.tasks("train")
    base = [f"run.out_dir='{tmp_path}'", "run.name='p'", "run.steps=1", "env.name='p4g'", "env.max_turns=1",
            "agent.model='smollm2'", "agent.train=true", "agent.max_new_tokens=6", "user.model='smollm2'",
            "user.max_new_tokens=6", "grpo.batch_tasks=2", "grpo.group_size=2", "grpo.micro_batch=2", "eval.every=1",
            "eval.tasks=2", "eval.samples=1", "checkpoint.every=1"]
    cfg = load_config(overrides=base + [f"env.corpus='{corpus}'", f"env.prompts='{prompts}'"])
    run_dir = train(cfg, progress=False)
    eps = [json.loads(l) for l in (run_dir / "trajectories" / "step_000001.jsonl").read_text().splitlines()]
    assert eps and all(e["task_id"].startswith("p4g/EE") and e["task_id"] not in test_ids for e in eps)
    evals = [json.loads(l) for f in (run_dir / "eval").glob("step_*/*.jsonl") for l in f.read_text().splitlines()]
    assert evals and all(e["task_id"] in test_ids for e in evals)
    # what the trained model received: its stored prompt tokens decode to the rendered template
    tok = load_causal_lm("smollm2").tokenizer
    text = tok.decode(eps[0]["trajectories"]["agent"]["token_ids"])
    assert "AGENT-TEMPLATE. You speak for a charity; be brief (50 words). You are: " in text
    assert eps[0]["conversation"]["system"]["user"].startswith("USER-TEMPLATE. Play this person: ")
    # a template with an unknown placeholder, or a corpus that is not one, fails when the config is read
    (prompts / "user.txt").write_text("You are {persona}; you have {budget} dollars.")
    with pytest.raises(ConfigError, match=r"unknown placeholder \{budget\}; p4g's user prompt may use \{persona\}, \{word_limit\}"):
        load_config(overrides=base + [f"env.prompts='{prompts}'"])
    with pytest.raises(ConfigError, match="env.corpus = .*not a ConvoKit corpus directory"):
        load_config(overrides=base + [f"env.corpus='{tmp_path}'"])
