"""`--resume` at its edges, each on a tiny echo run of a few steps: stray `step_*` names that are not checkpoints, a
checkpoint that verifies but does not load, a full disk inside the weights or optimizer writer, and a metrics file
whose last line is complete but invalid (or torn by a crash)."""
import argparse, errno, hashlib, io, json, os, shutil
from pathlib import Path
import pytest
import torch
from conftest import ROOT
from scope_nb.core.dialogue import ConfigError
from scope_nb.train.config import load_config
from scope_nb.train.crash_safety import MetricsError, latest_checkpoint, read_metrics
from scope_nb.train.run import train

ECHO = str(ROOT / "configs" / "echo_tiny.toml")
SMALL = ["run.name='r'", "eval.tasks=4", "grpo.batch_tasks=2", "grpo.group_size=2"]


def _cfg(out: Path, *extra):
    return load_config(ECHO, [f"run.out_dir='{out}'", *SMALL, *extra])


def _stable(rows):
    return [{k: v for k, v in r.items() if not k.startswith("time/") and k != "wall_time"} for r in rows]


def _rehash(folder: Path):
    "Write the hashes of the files as they now are into the checkpoint's state.json: it verifies, whatever it holds."
    state = json.loads((folder / "state.json").read_text())
    state["files"] = {rel: hashlib.sha256((folder / rel).read_bytes()).hexdigest() for rel in state["files"]}
    (folder / "state.json").write_text(json.dumps(state))


def test_stray_step_names_are_not_checkpoints_nor_steps(tmp_path):
    "A backup `checkpoints/step_000002.bak` (and the like under eval/ and trajectories/) is neither read nor pruned."
    cfg = _cfg(tmp_path, "run.steps=2", "eval.every=2", "checkpoint.every=1", "checkpoint.keep=1", "checkpoint.best=''")
    rd = train(cfg, progress=False)
    ck = rd / "checkpoints"
    shutil.copytree(ck / "step_000002", ck / "step_000002.bak")   # a user's copy, a complete and verified one
    shutil.copytree(rd / "eval" / "step_000002", rd / "eval" / "step_000002.bak")
    shutil.copy(rd / "trajectories" / "step_000002.jsonl", rd / "trajectories" / "step_000002.jsonl.bak")
    (ck / "step_2").mkdir()   # not the six-digit name the run writes
    assert latest_checkpoint(rd) == (2, ck / "step_000002")
    train(_cfg(tmp_path, "run.steps=4", "eval.every=2", "checkpoint.every=1", "checkpoint.keep=1",
               "checkpoint.best=''"), resume=True, progress=False)
    assert [r["step"] for r in read_metrics(rd / "metrics.jsonl")] == [0, 1, 2, 3, 4]
    assert sorted(p.name for p in ck.iterdir() if p.is_dir()) == ["step_000002.bak", "step_000004", "step_2"]
    assert (rd / "eval" / "step_000002.bak").is_dir() and (rd / "trajectories" / "step_000002.jsonl.bak").is_file()


def _refused_pickle(folder: Path):
    "An optimizer state holding a Python object `torch.load(weights_only=True)` refuses (a pickled Namespace)."
    torch.save({"state": {}, "param_groups": [], "args": argparse.Namespace(lr=1)}, folder / "agent" / "optimizer.pt")


def _other_shape(folder: Path, tmp_path: Path):
    "The weights and config of a model of another width (hidden 16, the run's is 32)."
    other = train(_cfg(tmp_path / "other", "run.steps=1", "eval.every=9", "checkpoint.every=1", "agent.hidden=16"),
                  progress=False)
    for f in ("model.safetensors", "config.json"):
        shutil.copy(other / "checkpoints" / "step_000001" / "agent" / f, folder / "agent" / f)


@pytest.mark.parametrize("damage, why", [("pickle", "UnpicklingError"), ("shape", "size mismatch")])
def test_a_verified_checkpoint_that_does_not_load_falls_back_to_the_previous(tmp_path, capsys, damage, why):
    "Its files match their hashes, yet loading fails: resume says so on one line and continues from the one before."
    common = ["run.steps=4", "eval.every=2", "checkpoint.every=2", "checkpoint.keep=3"]
    rd = train(_cfg(tmp_path, *common), progress=False)
    ref = _stable(read_metrics(rd / "metrics.jsonl"))
    ck = rd / "checkpoints" / "step_000004"
    _refused_pickle(ck) if damage == "pickle" else _other_shape(ck, tmp_path)
    _rehash(ck)
    assert latest_checkpoint(rd) == (4, ck)   # it verifies
    capsys.readouterr()
    train(_cfg(tmp_path, *common), resume=True, progress=False)
    err = [line for line in capsys.readouterr().err.splitlines() if "step_000004" in line]
    assert len(err) == 1 and err[0].startswith("resume: skipping checkpoint step_000004: ") and why in err[0], err
    assert _stable(read_metrics(rd / "metrics.jsonl")) == ref   # steps 3 and 4 replayed from step 2, as before


def test_when_no_verified_checkpoint_loads_resume_refuses_instead_of_starting_over(tmp_path):
    "Restarting from step 0 would throw the run's metrics away: resume stops, naming each checkpoint and why."
    common = ["run.steps=4", "eval.every=2", "checkpoint.every=2", "checkpoint.keep=3"]
    rd = train(_cfg(tmp_path, *common), progress=False)
    before = (rd / "metrics.jsonl").read_bytes()
    for step in (2, 4):
        _refused_pickle(rd / "checkpoints" / f"step_{step:06d}")
        _rehash(rd / "checkpoints" / f"step_{step:06d}")
    with pytest.raises(ConfigError, match=r"no checkpoint .* loads: step_000004: .*UnpicklingError.*step_000002: "):
        train(_cfg(tmp_path, *common), resume=True, progress=False)
    assert (rd / "metrics.jsonl").read_bytes() == before


def _main(*args):
    from scope_nb.cli.commands import main
    return main(["train", ECHO, "--no-progress", *[a for s in SMALL for a in ("--set", s)], *args])


def _safetensors_on_a_full_disk(*a, **kw):
    "safetensors' writer on a full disk (the message of a full tmpfs): the OS error is only in the text."
    from safetensors import SafetensorError
    raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")


_TORCH_SAVE = torch.save


def _torch_save_on_a_full_disk(obj, f, *a, **kw):
    """torch.save on a full disk, as seen on a full tmpfs: given a path, the C++ writer fails with no OS error in sight;
    given a Python file, the file's OSError (ENOSPC) is the context of the RuntimeError it raises."""
    if isinstance(f, (str, os.PathLike)):
        try:
            raise RuntimeError("basic_ios::clear: iostream error")
        except RuntimeError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534") from None

    class Full(io.RawIOBase):
        def writable(self): return True
        def write(self, b): raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    return _TORCH_SAVE(obj, Full(), *a, **kw)


@pytest.mark.parametrize("writer", ["safetensors", "torch.save"])
def test_a_full_disk_while_writing_a_checkpoint_is_the_one_line_message(tmp_path, capsys, monkeypatch, writer):
    "Whichever library's writer meets the full disk, `scope train` ends with the one line that names --resume."
    import transformers.modeling_utils
    if writer == "safetensors":
        monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", _safetensors_on_a_full_disk)
    else:
        monkeypatch.setattr(torch, "save", _torch_save_on_a_full_disk)
    rc = _main("--set", f"run.out_dir='{tmp_path}'", "--set", "run.steps=2", "--set", "checkpoint.every=1",
               "--set", "eval.every=9")
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err, err[-2000:]
    lines = [line for line in err.splitlines() if line.strip() and "it/s]" not in line]   # less the progress bars
    assert len(lines) == 1, err
    err = lines[0]
    assert err.startswith(f"scope: error: no space left on the device writing under {tmp_path / 'r'} ("), err
    assert err.endswith("--resume` continues from the last complete checkpoint (nothing written so far is torn)"), err
    assert not list((tmp_path / "r" / "checkpoints").glob(".tmp_*")), "the half-written checkpoint holds space"


def test_a_complete_but_invalid_last_metrics_line_stops_resume_naming_it(tmp_path):
    "A whole last line (newline included) that is not JSON is no crash's doing: resume refuses, the file untouched."
    rd = train(_cfg(tmp_path, "run.steps=2", "eval.every=2", "checkpoint.every=2"), progress=False)
    m = rd / "metrics.jsonl"
    lines = m.read_text().splitlines(keepends=True)
    assert json.loads(lines[2])["step"] == 2 and "eval/mean" in lines[2]   # the checkpointed step, with its eval
    m.write_text("".join(lines[:2]) + lines[2].replace('"step": 2', '"step": 2,,', 1))
    before = m.read_bytes()
    with pytest.raises(MetricsError, match=r"metrics.jsonl:3: not a JSON line .*repair"):
        train(_cfg(tmp_path, "run.steps=2", "eval.every=2", "checkpoint.every=2"), resume=True, progress=False)
    assert m.read_bytes() == before


def test_a_torn_last_metrics_line_is_dropped_and_said(tmp_path, capsys):
    "A last line without its newline (a crash mid-write, after the checkpoint): dropped, replayed, and said on stderr."
    rd = train(_cfg(tmp_path, "run.steps=2", "eval.every=2", "checkpoint.every=2"), progress=False)
    m = rd / "metrics.jsonl"
    with open(m, "a") as f: f.write('{"step": 3, "eval/me')
    capsys.readouterr()
    train(_cfg(tmp_path, "run.steps=3", "eval.every=2", "checkpoint.every=2"), resume=True, progress=False)
    assert [r["step"] for r in read_metrics(m)] == [0, 1, 2, 3]
    assert f"resume: {m}:4: dropped a line cut short by a crash" in capsys.readouterr().err
