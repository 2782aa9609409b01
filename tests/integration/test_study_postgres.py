"""The study store on a real PostgreSQL (Debian's server, started by the test on loopback as the `postgres` user):
the checks the SQLite store passes — 50 concurrent participants with balanced arms, the app killed (-9) and restarted
mid-study with no acknowledged turn or survey lost — against `postgresql+psycopg://`. The agent is the scripted
OpenAI-compatible endpoint of `test_study_faults` (the store, not the model, is under test)."""
import glob, os, pwd, shutil, subprocess, tempfile
from types import SimpleNamespace
import pytest
from scope_nb.core.dialogue import free_port
from test_study import check_durable, run_with_a_kill, write_config
from scripted_endpoint import Scripted


def _pg_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}")) or [shutil.which(name)]
    if not found[-1]:
        pytest.fail("no PostgreSQL server: install Debian's package (apt-get install postgresql); `make test` does this "
                    "when run as root")
    return found[-1]


@pytest.fixture(scope="module")
def postgres():
    "A throwaway PostgreSQL cluster on 127.0.0.1 (initdb + pg_ctl), owned by the `postgres` user when we are root."
    d = tempfile.mkdtemp(prefix="scope-pg-")
    as_user = []
    if os.geteuid() == 0:
        pw = pwd.getpwnam("postgres")
        os.chown(d, pw.pw_uid, pw.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    os.chmod(d, 0o700)
    port = free_port()
    run = lambda *cmd: subprocess.run([*as_user, *cmd], check=True, capture_output=True, text=True, timeout=300)
    run(_pg_bin("initdb"), "-D", f"{d}/data", "-U", "postgres", "--auth=trust", "-E", "UTF8")
    run(_pg_bin("pg_ctl"), "-D", f"{d}/data", "-l", f"{d}/log", "-w", "-t", "300", "-o",
        f"-h 127.0.0.1 -p {port} -k {d} -c fsync=on", "start")
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*as_user, _pg_bin("pg_ctl"), "-D", f"{d}/data", "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(d, ignore_errors=True)


def test_fifty_participants_on_postgres_balanced_and_durable_through_a_restart(tmp_path, postgres):
    ep = Scripted()
    try:
        endpoint = SimpleNamespace(base_url=ep.url, model_name="scripted")
        cfg = write_config(tmp_path / "study.toml", endpoint, {"p4g": ["0", "1", "2"]}, max_tokens=8,
                           db_url=postgres, agent_timeout=60.0)
        rows, acked = run_with_a_kill(cfg, tmp_path)
    finally:
        ep.server.shutdown()
    check_durable(rows, acked)
    n = [sum(r["arm"] == a for r in rows) for a in ("base", "rl-single", "vs", "co-training")]
    assert max(n) - min(n) <= 1, n
    # the rows really are in PostgreSQL, not in a SQLite file next to the config
    assert not list(tmp_path.glob("*.db"))
    import sqlalchemy as sa
    with sa.create_engine(postgres).connect() as c:
        assert c.execute(sa.text("select count(*) from sessions")).scalar() == 50
