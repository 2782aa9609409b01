"""Verbalized Sampling parser fuzzing and draw statistics."""
import json, math
import numpy as np
from hypothesis import example, given, settings, strategies as st, HealthCheck
from scope_nb.users.verbalized import parse_vs, vs_draw, vs_weights, VSParse

ERRORS = {"no_json", "no_responses", "no_valid_items"}
prob_like = st.one_of(st.floats(-2, 2), st.integers(-3, 5), st.none(), st.just(float("nan")),
                      st.sampled_from(["0.3", "40%", "high", "", "1e-3"]))
word_text = st.text(st.characters(categories=("L", "N", "Zs", "P")), min_size=0, max_size=30)


@st.composite
def vs_outputs(draw):
    "A VS answer as a model might write it, then possibly mangled; returns (text, clean_items or None)."
    items = draw(st.lists(st.tuples(word_text, prob_like), min_size=0, max_size=7))
    objs = []
    for t, p in items:
        o = {"text": t}
        if draw(st.booleans()) or p is not None: o[draw(st.sampled_from(["probability", "prob"]))] = p
        objs.append(o)
    payload = {"responses": objs} if draw(st.booleans()) else objs
    style = draw(st.sampled_from(["json", "python"]))
    try: text = json.dumps(payload) if style == "json" else repr(payload)
    except ValueError: text = repr(payload)
    clean = style == "json" or "nan" not in text   # a Python repr of nan is not a literal anyone can parse
    i = text.rfind("}]")  # the list's end: an item's text may hold "}]" too, but only before it
    if i >= 0 and draw(st.booleans()): text = text[:i] + "},]" + text[i + 2:]   # trailing comma after the last item
    if draw(st.booleans()): text = "```json\n" + text + "\n```"
    if draw(st.booleans()): text = draw(word_text) + "\n" + text + "\n" + draw(word_text); clean = clean and not set("{[") & set(text.split("\n")[0])
    mut = draw(st.sampled_from(["none", "truncate", "delete", "insert", "garbage"]))
    if mut == "truncate" and text: text = text[: draw(st.integers(0, len(text) - 1))]; clean = False
    elif mut == "delete" and text:
        i = draw(st.integers(0, len(text) - 1)); text = text[:i] + text[i + 1:]; clean = False
    elif mut == "insert":
        i = draw(st.integers(0, len(text))); text = text[:i] + draw(st.sampled_from(list('{}[]",:\'\\'))) + text[i:]; clean = False
    elif mut == "garbage": text = draw(st.text(max_size=200)); clean = False
    return text, (objs if clean else None)


@settings(max_examples=5000, deadline=None, suppress_health_check=list(HealthCheck))
@given(vs_outputs(), st.integers(1, 6))
@example(('[{"text": "}]", "probability": 0.5},]', [{"text": "}]", "probability": 0.5}]), 1)  # "}]" inside a text
def test_parser_never_raises_and_is_typed(case, n):
    text, clean = case
    p = parse_vs(text, n)
    assert isinstance(p, VSParse)
    if p.ok:
        assert 1 <= len(p.texts) <= n and len(p.probs) == len(p.texts)
        assert all(isinstance(t, str) and t.strip() == t and t for t in p.texts)
        assert all(x is None or (isinstance(x, float) and math.isfinite(x)) for x in p.probs)
        w, _ = vs_weights(p.probs, "prob")
        assert abs(w.sum() - 1) < 1e-9 and (w >= 0).all()
    else:
        assert p.error in ERRORS or p.error.startswith("parser_error") and not p.texts
        assert not p.texts
    if clean is not None:  # an unmangled answer: exactly its valid items, in order
        expect = [o["text"].strip() for o in clean if isinstance(o["text"], str) and o["text"].strip()][:n]
        assert (p.texts if p.ok else []) == expect


def _freqs(parse, method, trials=10_000, seed=0):
    rng = np.random.default_rng(seed)
    counts = np.bincount([vs_draw(parse, method, rng)[0] for _ in range(trials)], minlength=len(parse.texts))
    return counts / trials


def test_prob_draws_match_stated_probabilities():
    p = VSParse(["a", "b", "c", "d", "e"], [0.4, 0.25, 0.2, 0.1, 0.05])
    f, N = _freqs(p, "prob"), 10_000
    w = np.array(p.probs)
    assert np.all(np.abs(f - w) <= 3 * np.sqrt(w * (1 - w) / N)), (f, w)


def test_unnormalised_and_invalid_probabilities():
    p = VSParse(["a", "b", "c"], [3.0, None, 1.0])          # renormalised to .75/0/.25
    f = _freqs(p, "prob", seed=1)
    assert f[1] == 0 and abs(f[0] - 0.75) <= 3 * np.sqrt(0.75 * 0.25 / 10_000)


def test_random_draws_are_uniform():
    p = VSParse(["a", "b", "c", "d"], [0.97, 0.01, 0.01, 0.01])
    f, N = _freqs(p, "random", seed=2), 10_000
    assert np.all(np.abs(f - 0.25) <= 3 * np.sqrt(0.25 * 0.75 / N)), f
