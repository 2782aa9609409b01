"""FSDP2 over 2 gloo processes gives the same gradients (rtol 1e-5) and parameters after 3 steps as the single-process trainer."""
import pickle
import numpy as np
import torch
import torch.multiprocessing as mp
from scope_nb.core import free_port
from scope_nb.fsdp import FSDPTrainer, init_local_group
from scope_nb.grpo import GRPOConfig, GRPOTrainer, role_items
from scope_nb.lab import LAB_VOCAB, LabEnv, LabSimulator
from scope_nb.rollout import rollout
from scope_nb.training import tiny_policy

CFG = GRPOConfig(lr=1e-3, kl_coef=0.005, micro_batch=4)
STEPS = 3


def _policy():
    return tiny_policy(LAB_VOCAB, hidden=32, layers=2, seed=5, name="agent", trainable=True, temperature=1.0, max_new_tokens=2)


def _batches():
    "Three steps of (trajectory, advantage) items from real lab rollouts of the same initial policy."
    env, pol, out = LabEnv(), _policy(), []
    for s in range(STEPS):
        pol.reseed(s)
        res = rollout(env, env.sample_tasks("train", 4, np.random.default_rng(s)), 4, {"agent": pol, "user": LabSimulator("busy", 2.0, seed=s)}, ("agent",))
        out.append(role_items(res.episodes, "agent")[0])
    return out


def _grads_and_params(tr, batches, full):
    grads = None
    for i, items in enumerate(batches):
        tr.step(items)
        if i == 0: grads = {n: full(p.grad) for n, p in tr.model.named_parameters()}
    return grads, {n: full(p.detach()) for n, p in tr.model.named_parameters()}


def _rank(rank, world, port, path):
    torch.set_num_threads(1)
    init_local_group(rank, world, port)
    try:
        batches = pickle.loads(open(path + ".in", "rb").read())
        out = _grads_and_params(FSDPTrainer(_policy(), CFG), batches, lambda t: t.full_tensor().clone())
        if rank == 0: torch.save(out, path + ".out")
    finally:
        torch.distributed.destroy_process_group()


def test_fsdp2_matches_single_process(tmp_path):
    batches = _batches()
    assert sum(len(b) for b in batches) == 48 and len({round(a, 6) for b in batches for _, a in b}) > 2
    want_g, want_p = _grads_and_params(GRPOTrainer(_policy(), CFG), batches, lambda t: t.clone())
    path = str(tmp_path / "fsdp")
    open(path + ".in", "wb").write(pickle.dumps(batches))
    mp.spawn(_rank, args=(2, free_port(), path), nprocs=2, join=True)
    got_g, got_p = torch.load(path + ".out")
    assert set(got_g) == set(want_g)
    for n in want_g:
        torch.testing.assert_close(got_g[n], want_g[n], rtol=1e-5, atol=1e-7, msg=f"gradient of {n}")
        torch.testing.assert_close(got_p[n], want_p[n], rtol=1e-5, atol=1e-7, msg=f"parameter {n} after {STEPS} steps")
    moved = max(float((want_p[n] - p0).abs().max().detach()) for n, p0 in _policy().model.named_parameters())
    assert moved > 1e-3   # the steps did change the weights, so equal parameters mean equal updates
