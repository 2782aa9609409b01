"""Collapse meter on a real model: a colder simulator is measured as more collapsed; the CLI writes its report."""
import json, subprocess, sys
from pathlib import Path
from scope_nb.diagnostics.collapse import collapse_meter
from scope_nb.core.models import load_causal_lm
from scope_nb.core.policy import LocalPolicy

SCOPE = str(Path(sys.executable).parent / "scope")
HISTORIES = [[{"role": "system", "content": "You are a busy person. Reply in one short sentence."},
              {"role": "user", "content": q}] for q in ("Would you like a cup of tea?", "Can I tell you a joke?", "Do you have a minute?")]


def test_colder_smollm2_is_more_collapsed():
    lm = load_causal_lm("smollm2")
    sim = LocalPolicy(lm.model, lm.tokenizer, name="smollm2", max_new_tokens=10, seed=0)
    cold = collapse_meter(sim, HISTORIES, M=16, temperature=0.2)
    hot = collapse_meter(sim, HISTORIES, M=16, temperature=1.0)
    print(f"eps_hat T=0.2: {cold.eps_hat:.3f} {cold.eps_per_history}; T=1.0: {hot.eps_hat:.3f}")
    assert cold.eps_hat < hot.eps_hat
    assert all(c <= h for c, h in zip(cold.classes_per_history, hot.classes_per_history))


def test_collapse_meter_cli(tmp_path):
    out = tmp_path / "cm.json"
    r = subprocess.run([SCOPE, "collapse-meter", "--episodes", "2", "--M", "6", "--max-new-tokens", "16", "--out", str(out)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    rep = json.loads(out.read_text())
    assert rep["M"] == 6 and len(rep["eps_per_history"]) >= 2 and 0 <= rep["eps_hat"] <= 1 and rep["eps_bar_H"] >= rep["eps_hat"] - 1e-9


def test_embedding_labeler_groups_paraphrases():
    from scope_nb.diagnostics.collapse import EmbeddingLabeler, eps_hat
    lab = EmbeddingLabeler(threshold=0.75)
    texts = ["No thanks, I'm busy.", "No thank you, I am too busy right now.", "Sorry, I'm busy, no thanks.",
             "Sure, I'd love a cup of tea!", "Yes please, tea sounds lovely."]
    labels = lab(texts)
    assert labels[0] == labels[1] == labels[2] and labels[3] != labels[0]
    assert abs(eps_hat(labels, "plugin") - 0.4) < 1e-9
