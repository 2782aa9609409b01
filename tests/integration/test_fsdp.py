"""FSDP2 over 2 gloo processes gives the same gradients (rtol 1e-5) and parameters after 3 steps as the single-process trainer."""
import pickle
import numpy as np
import torch
import torch.multiprocessing as mp
from scope_nb.core.dialogue import free_port
from scope_nb.scale.fsdp import FSDPTrainer, init_local_group
from scope_nb.train.grpo import GRPOConfig, GRPOTrainer, role_items
from scope_nb.envs.lab import LAB_VOCAB, LabEnv, LabSimulator
from scope_nb.train.rollout import rollout
from scope_nb.core.policy import tiny_policy

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


# --- item counts that do not split evenly over the ranks, and collectives on the group's device -----------------------
UNEVEN_CFG = GRPOConfig(lr=1e-3, kl_coef=0.005, micro_batch=2)
UNEVEN = (1, 5, 7)   # 2 ranks, micro-batch 2: rank 1 has no item; rank 0 runs 2 micro-batches, rank 1 one; 2 and 2


def uneven_batches():
    """Steps of 1, 5 and 7 trajectories of real lab rollouts (failed or empty episodes leave any count), with fixed
    nonzero advantages: most lab groups have zero variance, and a step whose true gradient is exactly 0 would compare
    float noise, which AdamW scales up to a step of size lr."""
    trajs = [t for b in _batches() for t, _ in b]
    cuts = np.cumsum((0,) + UNEVEN)
    return [[(t, (-1.0) ** i * (0.5 + 0.1 * i)) for i, t in enumerate(trajs[a:b])] for a, b in zip(cuts, cuts[1:])]


def stepwise(tr, batches, full):
    "Each step's statistics and every parameter after it (full tensors)."
    out = []
    for items in batches:
        stats = tr.step(items)
        out.append((stats, {n: full(p.detach()) for n, p in tr.model.named_parameters()}))
    return out


def _uneven_body(rank, batches):
    from dist_checks import strict_group_device
    tr = FSDPTrainer(_policy(), UNEVEN_CFG)
    with strict_group_device():
        return stepwise(tr, batches, lambda t: t.full_tensor().clone())


def check_stepwise(got, want, rtol=1e-5, atol=1e-7):
    for k, ((gs, gp), (ws, wp)) in enumerate(zip(got, want, strict=True)):
        for s in ("loss", "kl", "entropy", "clipfrac", "grad_norm", "tokens"):
            assert abs(gs[s] - ws[s]) <= atol + rtol * abs(ws[s]) * 10, (UNEVEN[k], s, gs[s], ws[s])
        for n in wp: torch.testing.assert_close(gp[n], wp[n], rtol=rtol, atol=atol, msg=f"{n} after the {UNEVEN[k]}-item step")


def test_fsdp2_uneven_item_counts_and_an_idle_rank(tmp_path):
    "1, 5 and 7 items over 2 ranks with micro-batch 2 finish (no hang) and give the single-process update, step by step."
    from dist_checks import on_ranks
    batches = uneven_batches()
    assert [len(b) for b in batches] == list(UNEVEN)
    want = stepwise(GRPOTrainer(_policy(), UNEVEN_CFG), batches, lambda t: t.clone())
    check_stepwise(on_ranks(_uneven_body, batches, tmp_path), want)


def _bf16_body(rank, items):
    tr = FSDPTrainer(_policy(), GRPOConfig(lr=1e-3, kl_coef=0.005, micro_batch=2, mixed_precision="bf16"))
    stats = tr.step(items)
    return stats, {n: p.full_tensor().clone() for n, p in tr.model.named_parameters()}


def test_fsdp2_bf16_compute_with_float32_master_weights(tmp_path):
    "mixed_precision = 'bf16': FSDP2 computes in bfloat16, keeps float32 weights, and updates as the single-process bf16 trainer does."
    from dist_checks import on_ranks
    items = uneven_batches()[1]
    cfg = GRPOConfig(lr=1e-3, kl_coef=0.005, micro_batch=2, mixed_precision="bf16")
    p0 = {n: p.detach().clone() for n, p in _policy().model.named_parameters()}
    ref = GRPOTrainer(_policy(), cfg)
    want = ref.step(items)
    got, params = on_ranks(_bf16_body, items, tmp_path)
    assert all(p.dtype == torch.float32 for p in params.values())
    for s in ("loss", "entropy", "grad_norm"): assert abs(got[s] - want[s]) <= 0.02 * abs(want[s]) + 1e-3, (s, got[s], want[s])
    # AdamW's first step is about ±lr wherever a gradient is nonzero, so elements whose bf16 gradient is noise may flip
    # sign: compare the whole update's direction instead
    d_want = torch.cat([(p.detach() - p0[n]).flatten() for n, p in ref.model.named_parameters()])
    d_got = torch.cat([(params[n] - p0[n]).flatten() for n, _ in ref.model.named_parameters()])
    cos = float(d_got @ d_want / (d_got.norm() * d_want.norm()))
    print("cosine of the bf16 updates", cos)
    assert cos > 0.9 and float(d_got.norm()) > 0.5 * float(d_want.norm()), cos


def _push_body(rank, payload):
    import tempfile
    from pathlib import Path
    from scope_nb.scale.ray_backend import move_optimizer_state, write_weights
    items, folder = payload
    pol = _policy()
    tr = FSDPTrainer(pol, GRPOConfig(lr=1e-3, kl_coef=0.0, micro_batch=2))
    tr.step(items)
    full = tr.full_state_dict()   # a collective; with cpu_offload only rank 0 gets the weights
    path = write_weights(Path(folder) / "agent_v000001", tr.model, pol.tok, full, bf16=True) if rank == 0 else None
    shard = sum(p.to_local().numel() for p in tr.model.parameters())
    moved = move_optimizer_state(tr.opt, "meta")   # the device abstracted: every sharded moment leaves the rank
    left = [k for st in tr.opt.state.values() for k, v in st.items() if k != "step" and not v.is_meta]
    return path, {k: v.clone() for k, v in full.items()}, moved, shard, left


def test_fsdp2_rank0_writes_the_engine_folder_and_the_moments_leave_the_rank(tmp_path):
    "What a Ray trainer rank does after an update: rank 0 writes the gathered weights of the sharded model as a bf16 folder an engine loads; each rank's sharded AdamW moments move off its device (offload)."
    from transformers import AutoModelForCausalLM
    from dist_checks import on_ranks
    path, full, moved, shard, left = on_ranks(_push_body, (uneven_batches()[1], str(tmp_path)), tmp_path)
    back = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).state_dict()
    assert set(back) == set(full) and all(torch.equal(back[k], full[k].to(torch.bfloat16)) for k in full)
    assert moved == 2 * 4 * shard and not left   # rank 0's shard: exp_avg and exp_avg_sq in float32
