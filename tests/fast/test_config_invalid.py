"""Hundreds of generated invalid run configs: each must fail in `load_config`, before any speaker is built, with a
message that names the offending key. None may be accepted silently.

The cases are generated from the config's own declarations (every leaf field: wrong types, values just outside its
range or choices; every table: an unknown key) plus settings that are fine alone but impossible together."""
import typing
from pathlib import Path

import pytest

from scope_nb.train import run as run_mod
from scope_nb.train.config import Config, ConfigError, from_dict, load_config
from scope_nb.core.dialogue import settings_model

WRONG = {int: ["3", 1.5, True], float: ["0.5", True], bool: [1, "yes"], str: [5, ["x"]]}


def _leaves(model, path=""):
    "(dotted key, field info) of every scalar or list field of the config, nested tables included."
    for name, info in model.model_fields.items():
        key = f"{path}.{name}" if path else name
        sub = settings_model(info.annotation)
        if sub is not None and typing.get_origin(info.annotation) is not list: yield from _leaves(sub, key)
        elif sub is None: yield key, info


def _tables(model, path=""):
    for name, info in model.model_fields.items():
        sub = settings_model(info.annotation)
        if sub is not None and typing.get_origin(info.annotation) is not list:
            key = f"{path}.{name}" if path else name
            yield key, sub
            yield from _tables(sub, key)


def _outside(info) -> list:
    "Values just outside a field's declared range or choices."
    if typing.get_origin(info.annotation) is typing.Literal: return ["no-such-choice"]
    out = []
    for m in info.metadata:
        if getattr(m, "ge", None) is not None: out.append(m.ge - 1)
        if getattr(m, "gt", None) is not None: out.append(m.gt)
        if getattr(m, "le", None) is not None: out.append(m.le + 1)
        if getattr(m, "lt", None) is not None: out.append(m.lt)
        if getattr(m, "min_length", None): out.append("")
    return out


def _set(d: dict, key: str, value) -> dict:
    node, parts = d, key.split(".")
    for p in parts[:-1]: node = node.setdefault(p, {})
    node[parts[-1]] = value
    return d


IMPOSSIBLE = [  # (settings, the key the message must name)
    ({"grpo": {"group_size": 1}}, "grpo.group_size"),
    ({"grpo": {"group_size": 1, "advantage": "mean"}}, "grpo.group_size"),
    ({"agent": {"train": False}}, "agent.train"),
    ({"user": {"model": "same", "train": True}, "agent": {"temperature": 1.0}}, "user.temperature"),
    ({"user": {"model": "same"}}, "user.train"),
    ({"agent": {"model": "same"}}, "agent.model"),
    ({"user": {"mode": "vs"}}, "user.mode"),                                   # scripted users cannot verbalize
    ({"user": {"mode": "rotation", "rotation": {"models": ["scripted:echo"]}}}, "user.rotation.models"),
    ({"user": {"mode": "rotation", "rotation": {"models": ["scripted:echo", "scripted:nope"]}}}, "user.rotation.models[1]"),
    ({"user": {"mode": "pool"}}, "user.mode"),                                 # pool needs a trained local user
    ({"user": {"mode": "persona", "persona": {"source": "/no/such/personas.txt"}}}, "user.persona.source"),
    ({"user": {"train": True}}, "user.train"),                                 # a scripted user has no weights
    ({"env": {"name": "ask"}}, "agent.model"),                                 # tiny needs a vocabulary
    ({"user": {"model": "lab:frugal@4"}}, "user.model"),                       # lab speakers outside the lab
    ({"user": {"model": "api:gpt-5-mini", "api": {"key_env": "SCOPE_TEST_UNSET_KEY"}}}, "user.api.key_env"),
    ({"agent": {"model": "llama-70b"}}, "agent.model"),
    ({"user": {"model": "scripted:nope"}}, "user.model"),
    ({"eval": {"panel": [{"name": "a", "model": "scripted:echo"}, {"name": "a", "model": "scripted:echo"}]}}, "eval.panel[1].name"),
    ({"eval": {"panel": [{"name": "a", "model": "scripted:echo", "cell": "seen"}]}}, "eval.panel[0].cell"),
    ({"eval": {"panel": [{"name": "a", "model": "scripted:echo", "cell": "a"}]}}, "eval.panel[0].cell"),
    ({"eval": {"panel": [{"name": "a", "model": "nope-model"}]}}, "eval.panel[0].model"),
    ({"eval": {"panel": [{"model": "scripted:echo"}]}}, "eval.panel[0].name"),
    ({"eval": {"panel": [{"name": "a b", "model": "scripted:echo"}]}}, "eval.panel[0].name"),
    ({"eval": {"panel": "scripted:echo"}}, "eval.panel"),
    ({"run": {"name": ".."}}, "run.name"),
    ({"run": {"name": "a/b"}}, "run.name"),
    ({"grpo": {"betas": [0.9]}}, "grpo.betas"),
    ({"grpo": {"betas": [1.5, 0.9]}}, "grpo.betas"),
    ({"grpo": {"lr": float("inf")}}, "grpo.lr"),
    ({"grpo": {"lr": float("nan")}}, "grpo.lr"),
    ({"user": {"vs_n": 3, "vs": {"n": 4}}}, "user.vs.n"),
    ({"user": "frozen"}, "user"),
    ({"env": {"name": "lab", "max_turns": 3}, "agent": {"model": "lab-agent"}, "user": {"model": "lab:frugal@4"}}, "env.max_turns"),
    ({"env": {"name": "shop", "max_turns": 1}, "agent": {"model": "smollm2"}, "user": {"model": "shop:student"}}, "env.max_turns"),
]


def cases():
    out = []
    for key, info in _leaves(Config):
        tp = info.annotation
        base = typing.get_origin(tp) or tp
        if base is typing.Literal: base = str
        wrong = WRONG.get(base, ["x", 1] if base in (list, tuple) else [])
        for v in wrong + _outside(info): out.append((_set({}, key, v), key))
    for key, sub in _tables(Config):
        name = next(iter(sub.model_fields))
        out.append((_set({}, f"{key}.{name}x", 1), f"{key}.{name}x"))
    out.append(({"colour": {"x": 1}}, "colour"))
    out += IMPOSSIBLE
    return out


CASES = cases()


def test_enough_cases():
    assert len(CASES) >= 300, len(CASES)


def test_every_invalid_config_fails_before_any_model_loads(tmp_path, monkeypatch):
    "Each case goes the way `scope train` goes (build the Config, then train); building a speaker would mean it was accepted."
    built = []
    def no_build(*a, **k):
        built.append(1)
        raise AssertionError("a speaker was built")
    monkeypatch.setattr(run_mod, "build_run_speakers", no_build)
    monkeypatch.delenv("SCOPE_TEST_UNSET_KEY", raising=False)
    monkeypatch.chdir(tmp_path)   # an accepted config would write under ./runs here
    accepted, unnamed = [], []
    for d, key in CASES:
        try:
            run_mod.train(from_dict(Config, d), progress=False)
            accepted.append((d, key))
        except ConfigError as e:
            if key not in str(e): unnamed.append((d, key, str(e)))
        except AssertionError: accepted.append((d, key))
    assert not built and not accepted, f"accepted: {accepted[:5]}"
    assert not unnamed, "\n".join(f"{d} -> {e!r} (expected {k})" for d, k, e in unnamed[:8])


def test_a_toml_file_fails_the_same_way(tmp_path):
    "The file route names the key too (a sample: one unknown key, one range, one combination)."
    for text, key in (("[grpo]\nlrr = 1\n", "grpo.lrr"), ("[user.vs]\nn = 0\n", "user.vs.n"), ("[grpo]\ngroup_size = 1\n", "grpo.group_size")):
        Path(tmp_path, "c.toml").write_text(text)
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")): load_config(Path(tmp_path, "c.toml"))
