"""Helpers for the 2-rank trainer tests: a hang guard around torch.multiprocessing.spawn, and a device abstraction in
which a collective on a tensor that is not on the process group's device fails, as NCCL does on a GPU."""
import contextlib, time
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor", "reduce_scatter",
               "broadcast", "reduce", "all_to_all_single")


def spawn_or_fail(fn, args, nprocs: int = 2, timeout: float = 900.0):
    "mp.spawn that fails the test (and kills the ranks) instead of hanging when the ranks wait for each other forever."
    ctx = mp.spawn(fn, args=args, nprocs=nprocs, join=False)
    deadline = time.monotonic() + timeout   # a hang guard, not a speed limit: the ranks take seconds when they finish
    while not ctx.join(timeout=5):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"the {nprocs} ranks did not finish in {timeout:.0f} s: a collective that not every rank issues")


@contextlib.contextmanager
def strict_group_device():
    """Inside: the default device is 'meta' (a tensor made without an explicit device lands where no collective
    runs, as a CPU tensor does beside GPU weights), and every collective checks that its tensors are on the group's
    device (`scope_nb.scale.fsdp.group_device`), so a CPU tensor in an NCCL collective has a CPU analogue that fails."""
    from scope_nb.scale.fsdp import group_device
    saved = {name: getattr(dist, name) for name in COLLECTIVES}
    want = group_device()

    def checked(name, real):
        def call(*args, **kw):
            ts = [a for a in args if torch.is_tensor(a)] + [t for a in args if isinstance(a, (list, tuple)) for t in a
                                                             if torch.is_tensor(t)]
            bad = [str(t.device) for t in ts if t.device != want]
            if bad:
                raise RuntimeError(f"dist.{name} on a tensor on {bad[0]}; the group's device is {want}")
            return real(*args, **kw)
        return call

    for name, real in saved.items():
        setattr(dist, name, checked(name, real))
    try:
        with torch.device("meta"):
            yield
    finally:
        for name, real in saved.items():
            setattr(dist, name, real)


def _rank(rank, world, port, path, body):
    import pickle
    from scope_nb.scale.fsdp import init_local_group
    torch.set_num_threads(1)
    init_local_group(rank, world, port)
    try:
        out = body(rank, pickle.loads(open(path + ".in", "rb").read()))
        if rank == 0: torch.save(out, path + ".out")
    finally:
        dist.destroy_process_group()


def on_ranks(body, payload, folder, world: int = 2):
    "body(rank, payload) on `world` gloo ranks of one group (with the hang guard); returns rank 0's result."
    import pickle
    from scope_nb.core.dialogue import free_port
    path = str(folder / body.__name__)
    open(path + ".in", "wb").write(pickle.dumps(payload))
    spawn_or_fail(_rank, (world, free_port(), path, body), nprocs=world)
    return torch.load(path + ".out")
