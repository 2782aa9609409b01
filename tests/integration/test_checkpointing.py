"""grpo.gradient_checkpointing and bf16 weights against the plain float32 path, for each trainer: checkpointing
recomputes the same activations, so gradients match to float32 round-off (rtol 1e-5) for the single-process, FSDP2
(2 gloo ranks) and megatron (tensor-parallel 2, full recompute) trainers; bf16 weights give gradients within bf16's
precision of the float32 ones (cosine > 0.99 per tensor, norm within 5%)."""
import pickle
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from scope_nb.core.dialogue import free_port
from scope_nb.scale.fsdp import FSDPTrainer, init_local_group
from scope_nb.train.grpo import GRPOTrainer
from test_fsdp import CFG, _batches, _grads_and_params, _policy

GC = CFG.model_copy(update={"gradient_checkpointing": True})


@pytest.fixture(scope="module")
def batches():
    return _batches()


@pytest.fixture(scope="module")
def plain(batches):
    return _grads_and_params(GRPOTrainer(_policy(), CFG), batches, lambda t: t.clone())


def _same(got, want):
    got_g, got_p = got
    want_g, want_p = want
    assert set(got_g) == set(want_g)
    for n in want_g:
        torch.testing.assert_close(got_g[n], want_g[n], rtol=1e-5, atol=1e-6, msg=f"gradient of {n}")
        torch.testing.assert_close(got_p[n], want_p[n], rtol=1e-5, atol=1e-6, msg=f"parameter {n} after 3 steps")


def test_checkpointing_single_process_gives_the_same_gradients(batches, plain):
    tr = GRPOTrainer(_policy(), GC)
    on = lambda m: getattr(m, "is_activation_checkpointing", None) or m.is_gradient_checkpointing
    seen = []
    tr._update = lambda items, stats, f=tr._update: (seen.append(on(tr.model)), f(items, stats))[1]
    _same(_grads_and_params(tr, batches, lambda t: t.clone()), plain)
    # on during each update, off afterwards: with it on, transformers generates without its KV cache (9x slower)
    assert seen == [True] * len(batches) and not on(tr.model)


def test_bf16_weights_give_the_float32_gradients_within_bf16_precision(batches, plain):
    pol = _policy()
    pol.model.to(torch.bfloat16)
    grads, _ = _grads_and_params(GRPOTrainer(pol, CFG), batches[:1], lambda t: t.clone())
    want = plain[0]
    for n, g in grads.items():
        assert g.dtype == torch.bfloat16
        a, b = g.float().flatten(), want[n].flatten()
        cos = float(torch.nn.functional.cosine_similarity(a, b, dim=0))
        assert cos > 0.99 and abs(a.norm() / b.norm() - 1) < 0.05, (n, cos, float(a.norm()), float(b.norm()))


def _fsdp_rank(rank, world, port, path):
    torch.set_num_threads(1)
    init_local_group(rank, world, port)
    try:
        batches = pickle.loads(open(path + ".in", "rb").read())
        tr = FSDPTrainer(_policy(), GC)
        out = _grads_and_params(tr, batches, lambda t: t.full_tensor().clone())
        if rank == 0: torch.save(out, path + ".out")
    finally:
        dist.destroy_process_group()


def test_checkpointing_fsdp2_gives_the_single_process_gradients(tmp_path, batches, plain):
    path = str(tmp_path / "fsdp")
    open(path + ".in", "wb").write(pickle.dumps(batches))
    mp.spawn(_fsdp_rank, args=(2, free_port(), path), nprocs=2, join=True)
    _same(torch.load(path + ".out"), plain)


def _megatron_rank(rank, world, port, path):
    torch.set_num_threads(1)
    init_local_group(rank, world, port)
    try:
        from scope_nb.scale.megatron import megatron_to_hf
        from scope_nb.scale.megatron_train import MegatronTrainer, tp_unshard
        batches = pickle.loads(open(path + ".in", "rb").read())
        tr = MegatronTrainer(_policy(), GC)
        assert tr.model.recompute_layers
        grads = None
        for i, items in enumerate(batches):
            tr.step(items)
            if i == 0:
                parts = [{} for _ in range(world)]
                for n, p in tr.model.named_parameters():
                    got = [torch.empty_like(p.grad) for _ in range(world)]
                    dist.all_gather(got, p.grad.detach().contiguous())
                    for r in range(world): parts[r][n] = got[r]
                grads = megatron_to_hf(tp_unshard(parts, tr.hf_config.vocab_size), tr.hf_config)
        params = tr._gather()
        if rank == 0: torch.save((grads, params), path + ".out")
    finally:
        dist.destroy_process_group()


def test_checkpointing_megatron_tp2_gives_the_single_process_gradients(tmp_path, batches, plain):
    path = str(tmp_path / "mg")
    open(path + ".in", "wb").write(pickle.dumps(batches))
    mp.spawn(_megatron_rank, args=(2, free_port(), path), nprocs=2, join=True)
    _same(torch.load(path + ".out"), plain)
