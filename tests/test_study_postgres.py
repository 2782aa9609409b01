"""The study store on a real PostgreSQL (Debian's server, started by the test on loopback as the `postgres` user):
the checks the SQLite store passes — 50 concurrent participants with balanced arms, the app killed (-9) and restarted
mid-study with no acknowledged turn or survey lost — against `postgresql+psycopg://`. The agent is the scripted
OpenAI-compatible endpoint of `test_study_faults` (the store, not the model, is under test)."""
import asyncio, glob, json, os, pwd, shutil, subprocess, tempfile, time
from types import SimpleNamespace
import httpx
import pytest
from scope_nb.core import free_port
from test_study import TOKEN, App, _participant, write_config
from test_study_faults import Scripted


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
        app = App(cfg, tmp_path / "app.log").start()
        acked, done = {}, {}

        async def main():
            tasks = [asyncio.create_task(_participant(i, app.url, acked, done)) for i in range(50)]
            while len(acked) < 15: await asyncio.sleep(0.05)
            app.kill()                                   # kill -9 mid-study, then restart on the same database
            await asyncio.sleep(1.0)
            await asyncio.to_thread(app.start)
            await asyncio.gather(*tasks)

        try: asyncio.run(main())
        finally: app.stop()
        assert len(done) == 50
        app2 = App(cfg, tmp_path / "app2.log").start()
        try:
            rows = [json.loads(l) for l in httpx.get(app2.url + "/admin/export", headers={"Authorization": f"Bearer {TOKEN}"},
                                                     timeout=300).text.splitlines()]
        finally: app2.stop()
    finally:
        ep.server.shutdown()
    assert len(rows) == 50 and all(r["status"] == "surveyed" for r in rows)
    by_pid = {r["pid"]: r for r in rows}
    for pid, msgs in acked.items():
        if pid.endswith("/survey"):
            assert {k: v for k, v in by_pid[pid[:-7]]["survey"].items() if k != "comment"} == msgs[0]
            continue
        assert all(m in [t["content"] for t in by_pid[pid]["transcript"] if t["role"] == "user"] for m in msgs), pid
    n = [sum(r["arm"] == a for r in rows) for a in ("base", "rl-single", "vs", "co-training")]
    assert max(n) - min(n) <= 1, n
    # the rows really are in PostgreSQL, not in a SQLite file next to the config
    assert not list(tmp_path.glob("*.db"))
    import sqlalchemy as sa
    with sa.create_engine(postgres).connect() as c:
        assert c.execute(sa.text("select count(*) from sessions")).scalar() == 50
