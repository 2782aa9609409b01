"""`run.loggers`: a tiny run mirrors metrics.jsonl to TensorBoard event files and an offline W&B run; both are read
back (TensorBoard's event reader; the records of the W&B run file) and must equal metrics.jsonl."""
import glob, json, math, struct, subprocess, sys
from pathlib import Path
from conftest import ROOT
from scope_nb.train.config import load_config
from scope_nb.train.run import read_metrics, train

ECHO = str(ROOT / "configs" / "echo_tiny.toml")


def wandb_history(path) -> list[dict]:
    """The `history` records of a W&B run file (`run-ID.wandb`): a LevelDB-style log (7-byte file header, 32 KiB
    blocks, records with a 7-byte header: crc32, length, type 1 full / 2 first / 3 middle / 4 last) of protobuf
    `Record`s."""
    from wandb.proto import wandb_internal_pb2 as pb
    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", path
    pos, block, out, buf = 7, 32768, [], b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pos += 7
        if n == 0 and kind == 0: break
        buf, pos = buf + data[pos:pos + n], pos + n
        if kind in (1, 4):
            r = pb.Record()
            r.ParseFromString(buf)
            buf = b""
            if r.WhichOneof("record_type") == "history":
                out.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item})
    return out


def _numbers(row):
    return {k: v for k, v in row.items() if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)
            and math.isfinite(v)}


def test_tensorboard_and_wandb_mirror_metrics_jsonl(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    cfg = load_config(ECHO, [f"run.out_dir='{tmp_path}'", "run.name='r'", "run.steps=4", "eval.every=2", "eval.tasks=4",
                             'run.loggers=["jsonl", "tensorboard", "wandb"]', "run.wandb.project='scope-test'"])
    run_dir = train(cfg, progress=False)
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    # TensorBoard: every finite number of every row, at its step (event files store float32)
    ea = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    ea.Reload()
    expected = {(k, r["step"]): v for r in rows for k, v in _numbers(r).items()}
    got = {(k, e.step): e.value for k in ea.Tags()["scalars"] for e in ea.Scalars(k)}
    assert set(got) == set(expected)
    assert all(math.isclose(got[key], expected[key], rel_tol=1e-6, abs_tol=1e-6) for key in expected)
    assert {"train/reward", "eval/mean", "train/entropy"} <= {k for k, _ in got}
    # W&B: one offline run under the run folder, its history rows equal to metrics.jsonl (exact: stored as JSON)
    files = glob.glob(str(run_dir / "wandb" / "offline-run-*" / "run-*.wandb"))
    assert len(files) == 1, files
    hist = wandb_history(files[0])
    assert [h["_step"] for h in hist] == [0, 1, 2, 3, 4]
    for h, r in zip(hist, rows):
        assert {k: v for k, v in h.items() if not k.startswith("_")} == _numbers(r)


def test_a_logger_that_is_not_installed_fails_before_the_run(tmp_path):
    "The check names the extra; run in a subprocess where `wandb` cannot be imported."
    code = ("import sys; sys.modules['wandb'] = None\n"
            "import importlib.util; real = importlib.util.find_spec\n"
            "importlib.util.find_spec = lambda n, *a: None if n == 'wandb' else real(n, *a)\n"
            "from scope_nb.cli.commands import main; sys.exit(main(sys.argv[1:]))")
    p = subprocess.run([sys.executable, "-c", code, "train", ECHO, "--set", f"run.out_dir='{tmp_path}'",
                        "--set", 'run.loggers=["jsonl", "wandb"]', "--no-progress"], capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 2 and "pip install 'scope_nb[wandb]'" in p.stderr, p.stderr[-1500:]
    assert not (tmp_path / "echo-tiny").exists()   # nothing started
