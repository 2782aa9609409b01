"""Property tests: JSONL round-trips any valid episode exactly; invalid ones fail naming the field."""
import json, math
import pytest
from hypothesis import given, settings, strategies as st, HealthCheck
from scope_nb.core.dialogue import Conversation, Message, ToolCall, Turn, ValidationError
from scope_nb.core.episodes import Episode, RoleTrajectory, STATUSES
from scope_nb.core.files import read_jsonl, write_jsonl

finite = st.floats(allow_nan=False, allow_infinity=False)
logprob = st.floats(max_value=0.0, allow_nan=False, allow_infinity=False)
text = st.text(st.characters(exclude_categories=()), max_size=40)  # any unicode, lone surrogates included
ident = st.text(min_size=1, max_size=12)
json_val = st.recursive(st.none() | st.booleans() | st.integers() | finite | text,
                        lambda ch: st.lists(ch, max_size=4) | st.dictionaries(text, ch, max_size=4), max_leaves=12)


@st.composite
def trajectories(draw, role):
    n = draw(st.integers(0, 30))
    status = draw(st.sampled_from(STATUSES))
    return RoleTrajectory(role, draw(st.lists(st.integers(0, 2**31), min_size=n, max_size=n)),
                          draw(st.lists(st.sampled_from([0, 1]), min_size=n, max_size=n)),
                          draw(st.lists(logprob, min_size=n, max_size=n)),
                          None if status == "failed" else draw(st.none() | finite), status,
                          draw(st.none() | ident))


@st.composite
def turns(draw):
    speaker = draw(st.sampled_from(["agent", "user"]))
    if draw(st.booleans()):
        calls = draw(st.lists(st.builds(ToolCall, ident, ident, text), max_size=2))
        content = draw(text if not calls else st.none() | text)
        return Turn(speaker, Message("assistant", content, calls, name=draw(st.none() | ident)))
    return Turn(speaker, Message("tool", draw(text), tool_call_id=draw(ident), name=draw(st.none() | ident)))


@st.composite
def episodes(draw):
    status = draw(st.sampled_from(STATUSES))
    roles = draw(st.sets(st.sampled_from(["agent", "user"])))
    rew = st.none() if status == "failed" else st.none() | finite
    return Episode(task_id=draw(ident),
                   conversation=Conversation(draw(st.dictionaries(st.sampled_from(["agent", "user"]), text)),
                                             draw(st.lists(turns(), max_size=6))),
                   trajectories={r: draw(trajectories(r)) for r in roles},
                   rewards=draw(st.dictionaries(st.sampled_from(["agent", "user"]), rew)),
                   status=status, error=draw(ident) if status == "failed" else draw(st.none() | text),
                   group=draw(text), sample=draw(st.integers(0, 63)), step=draw(st.none() | st.integers(0, 10**6)),
                   info=draw(st.dictionaries(text, json_val, max_size=4)))


def _bits(x):
    "A float's exact identity (so -0.0 and 0.0 differ)."
    return (type(x).__name__, math.copysign(1, x), x.hex()) if isinstance(x, float) else x


def _exact(o):
    if isinstance(o, dict): return {k: _exact(v) for k, v in o.items()}
    if isinstance(o, list): return [_exact(v) for v in o]
    return _bits(o)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(episodes(), min_size=1, max_size=4))
def test_jsonl_roundtrip_is_lossless(tmp_path, eps):
    p = write_jsonl(tmp_path / "eps.jsonl", eps)
    back = read_jsonl(p)
    assert back == eps
    assert [_exact(e.to_dict()) for e in back] == [_exact(e.to_dict()) for e in eps]
    # writing what was read gives the same bytes
    assert write_jsonl(tmp_path / "again.jsonl", back).read_bytes() == p.read_bytes()


@settings(max_examples=60, deadline=None)
@given(trajectories("agent").filter(lambda t: len(t.token_ids) > 0))
def test_short_mask_is_named(t):
    t.loss_mask = t.loss_mask[:-1]
    with pytest.raises(ValidationError) as e: t.validate("trajectories.agent")
    assert e.value.field == "trajectories.agent.loss_mask"
    assert "differs from token_ids length" in str(e.value)


def _good():
    c = Conversation({"agent": "sys"}); c.say("agent", "hello"); c.say("user", "hi")
    return Episode("p4g/3", c, {"agent": RoleTrajectory("agent", [1, 2, 3], [0, 1, 1], [0.0, -0.1, -2.5], 0.5)},
                   {"agent": 0.5}, group="p4g/3@0")


def _set(path, value):
    def f(d):
        *keys, last = path
        for k in keys: d = d[k]
        d[last] = value
    return f


BROKEN = [
    (_set(["trajectories", "agent", "loss_mask"], [0, 1]), "trajectories.agent.loss_mask"),
    (_set(["trajectories", "agent", "logprobs"], [0.0, -0.1]), "trajectories.agent.logprobs"),
    (_set(["trajectories", "agent", "logprobs"], [0.0, 0.5, -1.0]), "trajectories.agent.logprobs[1]"),
    (_set(["trajectories", "agent", "token_ids"], [-1, 2, 3]), "trajectories.agent.token_ids[0]"),
    (_set(["trajectories", "agent", "status"], "done"), "trajectories.agent.status"),
    (_set(["trajectories", "agent", "role"], "user"), "trajectories.agent.role"),
    (_set(["status"], "finished"), "status"),
    (_set(["rewards", "agent"], "high"), "rewards.agent"),
    (_set(["conversation", "turns", 0, "speaker"], "bot"), "conversation.turns[0].speaker"),
    (_set(["conversation", "turns", 1, "message", "role"], "dragon"), "conversation.turns[1].message.role"),
    (_set(["colour"], "blue"), "colour"),
    (lambda d: d.pop("task_id"), "task_id"),
    (lambda d: d.update(status="failed", error="simulator timed out"), "rewards.agent"),
]


@pytest.mark.parametrize("breakit,field", BROKEN, ids=[f for _, f in BROKEN])
def test_invalid_episode_names_field(tmp_path, breakit, field):
    good = _good()
    d = good.to_dict()
    breakit(d)
    p = tmp_path / "eps.jsonl"
    p.write_text(json.dumps(good.to_dict()) + "\n" + json.dumps(d) + "\n")
    with pytest.raises(ValidationError) as e: read_jsonl(p)
    assert e.value.field == f"eps.jsonl:2: {field}", str(e.value)


def test_write_refuses_invalid_and_keeps_old_file(tmp_path):
    p = write_jsonl(tmp_path / "eps.jsonl", [_good()])
    before = p.read_bytes()
    bad = _good(); bad.trajectories["agent"].loss_mask.append(1)
    with pytest.raises(ValidationError, match=r"episodes\[1\]\.trajectories\.agent\.loss_mask"):
        write_jsonl(p, [_good(), bad])
    assert p.read_bytes() == before
    assert [x.name for x in tmp_path.iterdir()] == ["eps.jsonl"]  # no temp files left behind
