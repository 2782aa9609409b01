"""The sampled estimators the training diagnostics use agree with the exact quantities of 00_theory."""
import numpy as np
from scope_nb.diagnostics.theory import (collapse_error, game_variance_split, random_game, random_simulator, random_theta,
                             variance_split, DialogueGame)


def _sample_table(game: DialogueGame, theta, phi, rng, rows=3000, cols=8, x=0):
    "Reward table for task x: one row per agent randomness ξπ (a deterministic policy), one column per simulator draw."
    pi = game.policy(theta)
    ix = np.flatnonzero(game.task == x)
    s, a, g, u = game.s[ix], game.a[ix], game.g[ix], game.u[ix]
    p_user = phi[g, u].prod(1)
    out = np.empty((rows, cols))
    for i in range(rows):
        d = np.array([rng.choice(game.n_agent, p=p) for p in pi])   # one action for every agent state
        P = (d[s] == a).all(1) * p_user
        out[i] = game.R[ix][rng.choice(len(ix), cols, p=P / P.sum())]
    return out


def test_sampled_variance_split_matches_exact():
    rng = np.random.default_rng(5)
    G = random_game(rng, 1, 2, 3, 2, binary=True)
    th, ph = random_theta(G, rng), random_simulator(G, rng, 2.0)
    exact = game_variance_split(G, th, ph)[0]
    est = variance_split(_sample_table(G, th, ph, rng))   # the unbiased split: no correction needed here
    assert abs(est["simulator"] - exact["simulator"]) < 0.02, (est, exact)
    assert abs(est["agent"] - exact["agent"]) < 0.02, (est, exact)
    assert abs(est["total"] - exact["total"]) < 0.03, (est, exact)
    assert exact["simulator"] <= G.R_max ** 2 * exact["eps_bar"]


def test_collapse_error_from_reply_frequencies():
    "ε̂ from empirical reply counts converges to ε_φ (what sim/collapse_eps reports)."
    rng = np.random.default_rng(6)
    phi = np.array([0.8, 0.15, 0.05])
    counts = np.bincount(rng.choice(3, 20000, p=phi), minlength=3)
    assert abs(collapse_error(counts / counts.sum()) - collapse_error(phi)) < 0.01
