"""Run loop end to end with the tiny policy: learnability (and its negative control), crash safety, bad input."""
import json, os, random, signal, subprocess, sys, time
from pathlib import Path
import pytest
from conftest import ROOT
from scope_nb.train.config import load_config
from scope_nb.train.run import read_metrics, train

SCOPE = str(Path(sys.executable).parent / "scope")
ECHO = str(ROOT / "configs" / "echo_tiny.toml")


def _run(tmp, *extra, flip=False):
    cfg = load_config(ECHO, [f"run.out_dir='{tmp}'", "run.name='r'", "eval.every=60", *extra] + (["grpo.flip_advantage=true"] if flip else []))
    return read_metrics(train(cfg, progress=False) / "metrics.jsonl")


def test_grpo_learns_echo_and_flipped_advantage_fails(tmp_path):
    "Seeded, CPU, < 60 s: GRPO raises held-out reward by a clear margin; training against the advantage does not."
    t0 = time.time()
    up = _run(tmp_path / "up")
    down = _run(tmp_path / "down", flip=True)
    print(f"eval/mean: learn {up[0]['eval/mean']:.3f} -> {up[-1]['eval/mean']:.3f}; "
          f"flipped {down[0]['eval/mean']:.3f} -> {down[-1]['eval/mean']:.3f}; {time.time() - t0:.0f}s")
    assert up[0]["eval/mean"] == down[0]["eval/mean"]            # same seed, same untrained policy
    assert up[-1]["eval/mean"] >= up[0]["eval/mean"] + 0.3
    assert down[-1]["eval/mean"] <= down[0]["eval/mean"] + 0.02
    assert up[-1]["train/entropy"] < up[1]["train/entropy"]       # the policy sharpens as it learns
    assert time.time() - t0 < 120


def _cli(*args, **kw):
    return subprocess.run([SCOPE, "train", *args, "--no-progress"], capture_output=True, text=True, timeout=600, **kw)


def _stable(rows):
    return [{k: v for k, v in r.items() if not k.startswith("time/") and k != "wall_time"} for r in rows]


def test_sigkill_and_resume_gives_identical_metrics(tmp_path):
    common = [ECHO, "--set", "run.steps=24", "--set", "checkpoint.every=3", "--set", "eval.every=5", "--set", "run.name='r'"]
    ref = _cli(*common, "--set", f"run.out_dir='{tmp_path / 'ref'}'")
    assert ref.returncode == 0, ref.stderr[-2000:]
    out = tmp_path / "crash"
    rng = random.Random(os.environ.get("CRASH_SEED", "7"))
    kills = 0
    for attempt in range(2):  # kill twice at random points, then let it finish
        target = rng.randint(3 + 8 * attempt, 10 + 8 * attempt)
        args = [*common, "--set", f"run.out_dir='{out}'"] + (["--resume"] if attempt else [])
        p = subprocess.Popen([SCOPE, "train", *args, "--no-progress"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        m = out / "r" / "metrics.jsonl"
        while p.poll() is None and len(read_metrics(m)) < target: time.sleep(0.01)
        if p.poll() is None: os.kill(p.pid, signal.SIGKILL); kills += 1
        p.wait()
    assert kills >= 1
    fin = _cli(*common, "--set", f"run.out_dir='{out}'", "--resume")
    assert fin.returncode == 0, fin.stderr[-2000:]
    a, b = read_metrics(tmp_path / "ref" / "r" / "metrics.jsonl"), read_metrics(out / "r" / "metrics.jsonl")
    assert [r["step"] for r in b] == list(range(25))                # no duplicated, missing or torn lines
    assert _stable(a) == _stable(b)
    assert sorted(p.name for p in (out / "r" / "trajectories").iterdir()) == [f"step_{s:06d}.jsonl" for s in range(1, 25)]


@pytest.mark.parametrize("override,message", [
    ("grpo.lrr=1e-6", "grpo.lrr: unknown key; did you mean 'grpo.lr'?"),
    ("grpo.group_size='eight'", "grpo.group_size = 'eight': input should be a valid integer"),
    ("agent.model='llama-405b'", "agent.model = 'llama-405b': not a packaged model"),
    ("grpo.group_size=1", "set grpo.group_size >= 2 or grpo.advantage = 'raw'"),
])
def test_bad_input_fails_before_any_work(tmp_path, override, message):
    r = _cli(ECHO, "--set", f"run.out_dir='{tmp_path}'", "--set", override)
    assert r.returncode == 2
    assert message in r.stderr and "Traceback" not in r.stderr
    assert not any(tmp_path.iterdir())                               # nothing was written


def test_resume_without_a_run_is_a_clear_error(tmp_path):
    r = _cli(ECHO, "--set", f"run.out_dir='{tmp_path}'", "--resume")
    assert r.returncode == 2 and "holds no run" in r.stderr


def _boom(messages):
    raise RuntimeError("simulator down")


def test_failure_budget_stops_a_run_whose_simulator_always_fails(tmp_path):
    "Every training episode failing (a broken simulator) stops the run at step 1 with the error, never trains on it."
    from scope_nb.train.run import RunFailed
    from scope_nb.train.specs import SCRIPTED_FNS
    SCRIPTED_FNS["boom"] = _boom
    try:
        panel = "eval.panel=[{name='echo', model='scripted:echo', seen=true}]"   # evaluation works, training does not
        cfg = load_config(ECHO, [f"run.out_dir='{tmp_path}'", "run.name='r'", "user.model='scripted:boom'", panel])
        with pytest.raises(RunFailed, match=r"step 1: 64 of 64 training episodes failed .*user \(user\): "
                                             r"RuntimeError: simulator down"):
            train(cfg, progress=False)
        rows = read_metrics(tmp_path / "r" / "metrics.jsonl")
        assert [r["step"] for r in rows] == [0, 1] and rows[1]["train/frac_failed"] == 1.0 and "train/loss" not in rows[1]
        assert not (tmp_path / "r" / "checkpoints").exists()
        cfg = load_config(ECHO, [f"run.out_dir='{tmp_path}'", "run.name='e'", "user.model='scripted:boom'"])
        with pytest.raises(RunFailed, match="step 0: 32 of 32 evaluation episodes against scripted-boom failed"):
            train(cfg, progress=False)   # the default panel is the training user: evaluation fails first
        cfg = load_config(ECHO, [f"run.out_dir='{tmp_path}'", "run.name='b'", "user.model='scripted:boom'", panel,
                                 "run.max_failed_frac=1.0", "run.steps=2"])
        assert read_metrics(train(cfg, progress=False) / "metrics.jsonl")[-1]["train/frac_failed"] == 1.0   # 1 = never stop
    finally:
        del SCRIPTED_FNS["boom"]


def test_a_non_finite_update_stops_the_run_before_anything_is_saved(tmp_path, monkeypatch):
    "A NaN loss (injected into the real trainer's result) stops the run naming the step; no checkpoint is written."
    from scope_nb.train.grpo import GRPOTrainer
    from scope_nb.train.run import RunFailed
    real = GRPOTrainer.step
    def nan_at_3(self, items):
        st = real(self, items)
        return {**st, "loss": float("nan")} if nan_at_3.calls == 2 else (setattr(nan_at_3, "calls", nan_at_3.calls + 1) or st)
    nan_at_3.calls = 0
    monkeypatch.setattr(GRPOTrainer, "step", nan_at_3)
    cfg = load_config(ECHO, [f"run.out_dir='{tmp_path}'", "run.name='r'", "checkpoint.every=1"])
    with pytest.raises(RunFailed, match=r"step 3: the update of agent \(agent\) gave a non-finite loss"):
        train(cfg, progress=False)
    assert sorted(p.name for p in (tmp_path / "r" / "checkpoints").iterdir() if p.is_dir())[-1].endswith("2")


def test_a_second_writer_is_refused_and_a_killed_one_leaves_no_stale_lock(tmp_path):
    "Two processes on one run folder: the second is refused naming the first's PID; after kill -9 a resume proceeds."
    common = [ECHO, "--set", "run.steps=200", "--set", "checkpoint.every=2", "--set", "run.name='r'", "--set", f"run.out_dir='{tmp_path}'"]
    first = subprocess.Popen([SCOPE, "train", *common, "--no-progress"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        m = tmp_path / "r" / "metrics.jsonl"
        while first.poll() is None and len(read_metrics(m)) < 3: time.sleep(0.05)
        assert first.poll() is None
        for extra in ([], ["--resume"]):   # a fresh start and a resume are both refused while it writes
            second = _cli(*common, *extra)
            assert second.returncode == 2 and f"is being written by process {first.pid}" in second.stderr, second.stderr[-1500:]
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    last = read_metrics(m)[-1]["step"]
    again = _cli(*common, "--resume", "--set", f"run.steps={last + 3}")   # the stale lock of the killed process is taken over
    assert again.returncode == 0, again.stderr[-1500:]
    assert [r["step"] for r in read_metrics(m)] == list(range(last + 4)) and last >= 2


def test_resume_with_changed_settings_records_them_in_config_toml(tmp_path):
    "`--resume --set run.steps=9` trains to 9 and config.toml says so, with the step the change took effect."
    import tomllib
    common = [ECHO, "--set", "run.steps=4", "--set", "checkpoint.every=2", "--set", "run.name='r'", "--set", f"run.out_dir='{tmp_path}'"]
    assert _cli(*common).returncode == 0
    r = _cli(*common, "--resume", "--set", "run.steps=6", "--set", "grpo.lr=0.002")
    assert r.returncode == 0, r.stderr[-1500:]
    text = (tmp_path / "r" / "config.toml").read_text()
    assert text.splitlines()[0] == "# resumed at step 5 with run.steps = 4 -> 6, grpo.lr = 0.003 -> 0.002", text[:300]
    cfg = tomllib.loads(text)
    assert (cfg["run"]["steps"], cfg["grpo"]["lr"]) == (6, 0.002)
    assert [r["step"] for r in read_metrics(tmp_path / "r" / "metrics.jsonl")] == list(range(7))
    assert _cli(*common, "--resume", "--set", "run.steps=6", "--set", "grpo.lr=0.002").returncode == 0   # nothing new: no line
    assert (tmp_path / "r" / "config.toml").read_text() == text


def test_metrics_readers_name_the_file_and_line_of_a_foreign_row(tmp_path):
    "Garbage, a row without a step, and a foreign row appended out of order each fail naming file:line; a torn end is fine."
    from scope_nb.train.crash_safety import MetricsError
    m = tmp_path / "metrics.jsonl"
    good = "".join(json.dumps({"step": s, "eval/mean": 0.1 * s}) + "\n" for s in range(4))
    for bad, line, why in (('{"step": 4, "eval/me', 5, None), ("not json\n" + '{"step": 9}\n', 5, "not a JSON line"),
                           ('{"eval/mean": 0.9}\n', 5, "a metrics row needs an integer 'step'"),
                           ('{"step": 2, "eval/mean": 9.0}\n', 5, "step 2 after step 3: rows out of order")):
        m.write_text(good + bad)
        if why is None: assert [r["step"] for r in read_metrics(m)] == [0, 1, 2, 3]   # a torn last line: the crash case
        else:
            with pytest.raises(MetricsError, match=f"metrics.jsonl:{line}: {why}"): read_metrics(m)


def test_resume_skips_a_torn_checkpoint_and_matches_an_uninterrupted_run(tmp_path):
    "A truncated weights file and a garbage latest.json: --resume falls back to the newest checkpoint that verifies."
    common = [ECHO, "--set", "run.steps=10", "--set", "checkpoint.every=2", "--set", "checkpoint.keep=3",
              "--set", "eval.every=5", "--set", "run.name='r'"]
    ref = _cli(*common, "--set", f"run.out_dir='{tmp_path / 'ref'}'")
    assert ref.returncode == 0, ref.stderr[-1500:]
    out = tmp_path / "crash"
    first = _cli(*common, "--set", f"run.out_dir='{out}'", "--set", "run.steps=6")   # as if killed after step 6
    assert first.returncode == 0
    ck = out / "r" / "checkpoints"
    w = next((ck / "step_000006" / "agent").glob("*.safetensors"))
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])        # torn by a full disk
    (ck / "latest.json").write_text("{garbage")
    (out / "r" / "trajectories" / "step_000006.jsonl").write_text("")   # later files are dropped and replayed
    again = _cli(*common, "--set", f"run.out_dir='{out}'", "--resume")
    assert again.returncode == 0, again.stderr[-1500:]
    assert "skipping checkpoint step_000006: agent/model.safetensors does not match the hash" in again.stderr
    assert "Traceback" not in again.stderr
    assert _stable(read_metrics(out / "r" / "metrics.jsonl")) == _stable(read_metrics(tmp_path / "ref" / "r" / "metrics.jsonl"))
    assert (out / "r" / "trajectories" / "step_000006.jsonl").stat().st_size > 0


def test_keep_holds_the_best_checkpoint_besides_the_newest(tmp_path):
    "A run whose held-out reward falls (trained against its advantage) keeps its best early checkpoint with keep = 1."
    cfg = load_config(ECHO, [f"run.out_dir='{tmp_path}'", "run.name='r'", "run.steps=10", "eval.every=2",
                             "checkpoint.every=2", "checkpoint.keep=1", "grpo.flip_advantage=true"])
    rows = read_metrics(train(cfg, progress=False) / "metrics.jsonl")
    scored = {r["step"]: r["eval/mean"] for r in rows if r["step"] in (2, 4, 6, 8, 10)}
    best = max(scored, key=lambda s: (scored[s], -s))
    assert best != 10, scored   # the scenario: the best is not the newest
    ck = tmp_path / "r" / "checkpoints"
    assert sorted(p.name for p in ck.glob("step_*")) == [f"step_{best:06d}", "step_000010"]
    assert json.loads((ck / "best.json").read_text()) == {"step": best, "metric": "eval/mean", "value": scored[best],
                                                          "path": f"step_{best:06d}"}


def test_a_full_disk_is_one_message_naming_the_run_folder_and_resume_continues(tmp_path):
    "A 400 KB tmpfs (a private mount namespace) fills during the run: exit 2, no traceback; with space again, --resume ends it."
    import shutil as _sh
    if _sh.which("unshare") is None: pytest.fail("needs util-linux's unshare (a private mount namespace for a small tmpfs)")
    d = tmp_path / "small"
    d.mkdir()
    run = (f"{SCOPE} train {ECHO} --no-progress --set run.out_dir='{d}' --set checkpoint.every=2 --set run.name='r'")
    script = (f"mount -t tmpfs -o size=400k tmpfs {d} && ({run} > /dev/null 2> {tmp_path}/full.err; echo $? > {tmp_path}/full.rc); "
              f"mount -o remount,size=64m {d} && {run} --resume > /dev/null 2> {tmp_path}/resume.err; echo $? > {tmp_path}/resume.rc; "
              f"cp {d}/r/metrics.jsonl {tmp_path}/metrics.jsonl")
    r = subprocess.run(["unshare", "-m", "bash", "-c", script], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-1500:]
    err = (tmp_path / "full.err").read_text()
    assert (tmp_path / "full.rc").read_text().strip() == "2" and "Traceback" not in err
    assert f"scope: error: no space left on the device writing under {d}/r" in err, err[-1500:]
    assert (tmp_path / "resume.rc").read_text().strip() == "0", (tmp_path / "resume.err").read_text()[-1500:]
    assert [x["step"] for x in read_metrics(tmp_path / "metrics.jsonl")] == list(range(61))
