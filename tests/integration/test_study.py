"""The human-study web app against a real local model server (llama.cpp serving SmolLM2): hostile input is refused with
clear messages; 50 concurrent participants complete sessions with balanced arms while the app is killed and restarted
in the middle, and nothing acknowledged is lost."""
import asyncio, json, os, signal, subprocess, sys, time
from pathlib import Path
import httpx
import pytest
from scope_nb.core.dialogue import free_port
from scope_nb.users.llama_server import LlamaServer
from scope_nb.study.store import P4G_ITEMS, TAU2_ITEMS

SECRET, TOKEN = "test-secret", "test-admin-token"


@pytest.fixture(scope="module")
def llama():
    srv = LlamaServer("smollm2").start()
    yield srv
    srv.stop()


def write_config(path: Path, llama, task_types: dict, max_tokens: int = 24, **kw) -> Path:
    kw = {"agent_timeout": 600.0, "min_turns": 1, "start_limit": 1000, **kw}   # llama.cpp on a shared CPU: a τ² prompt
    # or 50 queued participants take minutes; one message earns a code here; 50 participants start from one address
    kw.setdefault("db_url", f"sqlite:///{path.parent / 'study.db'}")
    lines = ['study_id = "s1"', 'max_turns = 3', 'max_chars = 500',
             'redirect_url = "https://example.org/done?cc={code}"'] + [f"{k} = {json.dumps(v)}" for k, v in kw.items()]
    lines.append("[task_types]")
    lines += [f"{k} = {json.dumps(v)}" for k, v in task_types.items()]
    for arm in ("base", "rl-single", "vs", "co-training"):
        lines += [f"[arms.{arm}]", f'base_url = "{llama.base_url}"', f'model = "{llama.model_name}"', f"max_tokens = {max_tokens}", "temperature = 0.7"]
    path.write_text("\n".join(lines) + "\n")
    return path


class App:
    "The study app as a real server process (uvicorn), so that it can be killed and restarted."
    def __init__(self, config: Path, log: Path):
        self.config, self.log, self.port, self.proc = config, log, free_port(), None
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self):
        env = {**os.environ, "SCOPE_STUDY_SECRET": SECRET, "SCOPE_STUDY_ADMIN_TOKEN": TOKEN}
        self.proc = subprocess.Popen([str(Path(sys.executable).parent / "scope"), "study", "serve", str(self.config), "--port", str(self.port)],
                                     stdout=open(self.log, "ab"), stderr=subprocess.STDOUT, env=env)
        for _ in range(300):
            try:
                if httpx.get(self.url + "/", timeout=1).status_code == 200: return self
            except httpx.TransportError: pass
            if self.proc.poll() is not None: raise RuntimeError(f"study app exited: {self.log.read_text()[-2000:]}")
            time.sleep(0.2)
        raise RuntimeError("study app did not come up")

    def kill(self):
        self.proc.send_signal(signal.SIGKILL); self.proc.wait()

    def stop(self):
        if self.proc and self.proc.poll() is None: self.proc.terminate(); self.proc.wait(10)


@pytest.fixture()
def app(tmp_path, llama):
    # one τ² participant: the agent's first reply evaluates the 5k-token τ² prompt on the CPU (~1 min)
    a = App(write_config(tmp_path / "study.toml", llama, {"tau2-airline": ["4"]}, max_tokens=16), tmp_path / "app.log").start()
    yield a
    a.stop()


def sse(text: str) -> list[tuple[str, dict]]:
    out = []
    for chunk in text.strip().split("\n\n"):
        ev = [l[7:] for l in chunk.splitlines() if l.startswith("event: ")]
        data = [l[6:] for l in chunk.splitlines() if l.startswith("data: ")]
        if ev: out.append((ev[0], json.loads(data[0]) if data else {}))
    return out


def test_hostile_input_is_refused_with_clear_messages(app):
    c = httpx.Client(base_url=app.url, timeout=900)   # a τ² reply on a busy CPU can take minutes
    page = c.get("/")
    assert "script-src 'sha256-" in page.headers["content-security-policy"] and "innerHTML" not in page.text
    # malformed / missing ids
    for body, field in [({"pid": "<script>", "study": "s1", "session": "x"}, "PROLIFIC_PID"), ({"study": "s1", "session": "x"}, "PROLIFIC_PID"),
                        ({"pid": "P1", "study": "s1"}, "SESSION_ID"), ({"pid": "P1", "study": "other", "session": "x"}, "STUDY_ID")]:
        r = c.post("/api/start", json=body)
        assert r.status_code == 400 and field in r.json()["error"], (body, r.text)
    assert c.post("/api/start", content=b"not json", headers={"Content-Type": "application/json"}).status_code == 400
    r = c.post("/api/start", content=b'{"pid": "P9"}', headers={"Content-Type": "text/plain"})   # a cross-site form post
    assert r.status_code == 415 and "application/json" in r.json()["error"]
    for path in ("/api/start", "/api/message", "/api/end"):   # JSON, but not an object
        r = c.post(path, json=["session_id"])
        assert r.status_code == 400 and "JSON object" in r.json()["error"], (path, r.text)
    s = c.post("/api/start", json={"pid": "P1", "study": "s1", "session": "x"}).json()
    sid = s["session_id"]
    if s["agent_pending"]: assert sse(c.post("/api/agent", json={"session_id": sid}).text)[-1][0] == "done"
    # script/HTML in a message is stored and returned as text, never interpreted by the page (textContent only)
    evil = '<img src=x onerror="alert(1)"><script>alert(2)</script>'
    evs = sse(c.post("/api/message", json={"session_id": sid, "text": evil}).text)
    assert evs[0] == ("ack", {"text": evil}) and evs[-1][0] == "done"
    assert any(t["text"] == evil and t["role"] == "you" for t in c.post("/api/start", json={"pid": "P1", "study": "s1", "session": "x"}).json()["turns"])
    # oversized message, unknown session, survey before the end
    r = c.post("/api/message", json={"session_id": sid, "text": "x" * 501})
    assert r.status_code == 400 and "at most 500 characters" in r.json()["error"]
    assert c.post("/api/message", json={"session_id": "nope", "text": "hi"}).status_code == 404
    assert c.post("/api/survey", json={"session_id": sid, "answers": {}}).status_code == 409
    assert c.post("/api/end", json={"session_id": sid}).status_code == 200
    assert c.post("/api/message", json={"session_id": sid, "text": "hi"}).status_code == 409
    items = P4G_ITEMS if s["task_type"] == "p4g" else TAU2_ITEMS
    good = {k: 5 for k in items} | ({"donation": 1.0} if s["task_type"] == "p4g" else {})
    for bad, field in [({**good, items[0]: 9}, items[0]), ({**good, items[1]: "7"}, items[1]), ({**good, "admin": True}, "admin")]:
        r = c.post("/api/survey", json={"session_id": sid, "answers": bad})
        assert r.status_code == 400 and field in r.json()["error"], r.text
    ok = c.post("/api/survey", json={"session_id": sid, "answers": good})
    assert ok.status_code == 200 and len(ok.json()["code"]) == 10 and ok.json()["code"] in ok.json()["redirect"]
    replay = c.post("/api/survey", json={"session_id": sid, "answers": {**good, items[0]: 1}})
    assert replay.status_code == 409 and "already submitted" in replay.json()["error"]
    # the returning participant sees the same code again
    again = c.post("/api/start", json={"pid": "P1", "study": "s1", "session": "x"}).json()
    assert again["status"] == "surveyed" and again["code"] == ok.json()["code"]
    # admin export needs the token
    assert c.get("/admin/export").status_code == 401
    assert c.get("/admin/export", headers={"Authorization": "Bearer wrong"}).status_code == 401
    rows = [json.loads(l) for l in c.get("/admin/export", headers={"Authorization": f"Bearer {TOKEN}"}).text.splitlines()]
    assert len(rows) == 1 and rows[0]["survey"][items[0]] == 5 and any(t["content"] == evil for t in rows[0]["transcript"])
    assert rows[0]["task_type"] == "tau2-airline" and rows[0]["tau2_reward"] in (0.0, 1.0)   # tau2's evaluator scored the session
    assert any(t["role"] == "agent" and t["content"] for t in rows[0]["transcript"])
    csv_text = c.get("/admin/export?format=csv", headers={"Authorization": f"Bearer {TOKEN}"}).text
    assert csv_text.splitlines()[0].startswith("id,pid,study_id")


async def _participant(i: int, url: str, acked: dict, done: dict):
    "One simulated participant: start (or resume), one message, end, survey; retries through server restarts."
    pid = f"P{i:03d}"
    async with httpx.AsyncClient(base_url=url, timeout=300) as c:
        for _ in range(200):
            try:
                if "scope_client" not in c.cookies: await c.get("/")   # as a browser does: the page sets the cookie
                s = (await c.post("/api/start", json={"pid": pid, "study": "s1", "session": f"S{i}"})).json()
                sid = s["session_id"]
                if s["status"] == "surveyed": done[pid] = s["code"]; return
                if s["status"] == "active":
                    if s["agent_pending"]: await c.post("/api/agent", json={"session_id": sid})
                    s = (await c.post("/api/start", json={"pid": pid, "study": "s1", "session": f"S{i}"})).json()
                    if s["agent_pending"]: continue
                    if not any(t["role"] == "you" for t in s["turns"]):
                        async with c.stream("POST", "/api/message", json={"session_id": sid, "text": f"hello from {pid}"}) as r:
                            if r.status_code != 200: await asyncio.sleep(0.2); continue
                            async for line in r.aiter_lines():
                                if line == "event: ack": acked.setdefault(pid, []).append(f"hello from {pid}")
                        continue   # re-read the state: the reply may have been cut by a restart
                    r = await c.post("/api/end", json={"session_id": sid})
                    if r.status_code != 200: await asyncio.sleep(0.2); continue
                items = P4G_ITEMS if s["task_type"] == "p4g" else TAU2_ITEMS
                answers = {k: 1 + (i + j) % 7 for j, k in enumerate(items)} | ({"donation": round((i % 5) * 0.5, 2)} if s["task_type"] == "p4g" else {})
                r = await c.post("/api/survey", json={"session_id": sid, "answers": answers})
                if r.status_code == 200: done[pid] = r.json()["code"]; acked.setdefault(pid + "/survey", []).append(answers); return
                if r.status_code == 409 and "already" in r.text: continue
            except (httpx.TransportError, httpx.RemoteProtocolError):
                await asyncio.sleep(0.3)
    raise AssertionError(f"{pid} never finished")


def run_with_a_kill(cfg: Path, tmp_path: Path, participants: int = 50) -> tuple[list[dict], dict]:
    """`participants` concurrent participants finish a study while the app is killed (-9) and restarted on the same
    database once 15 have an acknowledged turn; (the export read back by a fresh app, what was acknowledged)."""
    app = App(cfg, tmp_path / "app.log").start()
    acked, done = {}, {}

    async def main():
        tasks = [asyncio.create_task(_participant(i, app.url, acked, done)) for i in range(participants)]
        while len(acked) < 15: await asyncio.sleep(0.05)   # kill -9 in the middle of the run, then restart
        app.kill()
        await asyncio.sleep(1.0)
        await asyncio.to_thread(app.start)
        await asyncio.gather(*tasks)

    try: asyncio.run(main())
    finally: app.stop()
    assert len(done) == participants
    app2 = App(cfg, tmp_path / "app2.log").start()
    try:
        rows = [json.loads(l) for l in httpx.get(app2.url + "/admin/export", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=300).text.splitlines()]
    finally: app2.stop()
    return rows, acked


def check_durable(rows: list[dict], acked: dict, participants: int = 50) -> None:
    "Every session surveyed, every acknowledged turn and survey in the export."
    assert len(rows) == participants and all(r["status"] == "surveyed" for r in rows)
    by_pid = {r["pid"]: r for r in rows}
    for pid, msgs in acked.items():
        if pid.endswith("/survey"): assert {k: v for k, v in by_pid[pid[:-7]]["survey"].items() if k != "comment"} == msgs[0]; continue
        texts = [t["content"] for t in by_pid[pid]["transcript"] if t["role"] == "user"]
        assert all(m in texts for m in msgs), (pid, msgs, texts)   # every acknowledged turn survived the kill


def test_fifty_participants_balanced_and_durable_through_a_restart(tmp_path, llama):
    # P4G only: its 300-token prompts keep 50 sessions to about a minute of CPU generation (a τ² prompt takes ~1 min cold)
    cfg = write_config(tmp_path / "study.toml", llama, {"p4g": ["0", "1", "2"]}, max_tokens=8)
    rows, acked = run_with_a_kill(cfg, tmp_path)
    check_durable(rows, acked)
    n = [sum(r["arm"] == a for r in rows) for a in ("base", "rl-single", "vs", "co-training")]
    assert max(n) - min(n) <= 1, n
    assert sorted({r["task_id"] for r in rows}) == ["0", "1", "2"]      # personas rotate
    assert sum(t["role"] == "agent" for r in rows for t in r["transcript"]) >= 100   # opening + reply in every session


ARTIFACTS = Path(os.environ.get("SCOPE_TEST_ARTIFACTS", Path(__file__).resolve().parents[2] / "test-artifacts")) / "study"


def _chromium() -> str:
    "Debian's Chromium (installed by `make test`'s set-up; Playwright never downloads a browser here)."
    import shutil
    for name in ("chromium", "chromium-browser"):
        if shutil.which(name): return shutil.which(name)
    pytest.fail("no Chromium: install Debian's package (apt-get install chromium); `make test` does this when run as root")


def test_browser_participant_flow_end_to_end(tmp_path, llama):
    "Playwright drives Chromium through link -> task panel -> 3 messages -> End (confirm) -> survey -> completion code."
    from playwright.sync_api import expect, sync_playwright
    app = App(write_config(tmp_path / "study.toml", llama, {"p4g": ["0"]}, max_tokens=24), tmp_path / "app.log").start()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=_chromium(), args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 900, "height": 900})
            page.set_default_timeout(180_000)
            expect.set_options(timeout=180_000)   # `expect` waits 5 s by default: a busy machine answers slower than that
            page.goto(f"{app.url}/?PROLIFIC_PID=BROWSER01&STUDY_ID=s1&SESSION_ID=sess01")
            expect(page.locator("#title")).to_have_text("Charity conversation")
            assert "Save the Children" in page.locator("#instructions").inner_text() and page.locator("#persona").inner_text().strip()
            expect(page.locator(".msg.agent")).to_have_count(1)          # the persuader opens
            expect(page.locator("#status")).to_have_text("")
            page.screenshot(path=str(ARTIFACTS / "1-task-and-opening.png"), full_page=True)
            for k, text in enumerate(["Hi, who are you?", "<b>What does</b> the charity do?", "I am not sure I want to donate."]):
                page.fill("#text", text)
                page.click("#send")
                expect(page.locator(".msg.you")).to_have_count(k + 1)
                expect(page.locator(".msg.agent")).to_have_count(k + 2)
                expect(page.locator("#status")).to_have_text("")
            assert page.locator(".msg.you").nth(1).inner_text() == "<b>What does</b> the charity do?"   # shown as text, not markup
            assert page.locator(".msg.you b").count() == 0
            page.screenshot(path=str(ARTIFACTS / "2-chat.png"), full_page=True)
            page.click("#end")
            expect(page.locator("#confirm")).to_be_visible()
            page.screenshot(path=str(ARTIFACTS / "3-confirm-end.png"), full_page=True)
            page.click("#yes")
            expect(page.locator("#s-survey")).to_be_visible()
            page.fill("#donation", "0.5")
            for item in P4G_ITEMS: page.check(f'input[name="{item}"][value="5"]')
            page.fill("#comment", "fine")
            page.screenshot(path=str(ARTIFACTS / "4-survey.png"), full_page=True)
            page.click("#submit")
            expect(page.locator("#s-done")).to_be_visible()
            code = page.locator("#code").inner_text()
            assert len(code) == 10 and code in page.locator("#redirect").get_attribute("href")
            assert "AI" in page.locator("#debrief").inner_text()
            page.screenshot(path=str(ARTIFACTS / "5-completion-code.png"), full_page=True)
            browser.close()
    finally:
        app.stop()
    for f in ("1-task-and-opening", "2-chat", "3-confirm-end", "4-survey", "5-completion-code"):
        assert (ARTIFACTS / f"{f}.png").stat().st_size > 5000, f


@pytest.mark.parametrize("task_type", ["p4g", "tau2-airline"])
def test_a_one_gigabyte_body_is_refused_while_reading(tmp_path, llama, task_type, request):
    """An unauthenticated 1 GB chunked POST: refused after 16 KB; the server's memory does not grow with the body and
    stays under 300 MB. A τ² study server holds tau2's environment; it used to start at ~301 MB because tau2's prompt
    and evaluator modules import litellm (~160 MB), which `12_tau2._defer_tau2_llm` now leaves unloaded."""
    app = App(write_config(tmp_path / "study.toml", llama, {task_type: ["4" if task_type != "p4g" else "0"]}),
              tmp_path / "app.log").start()
    request.addfinalizer(app.stop)
    status = lambda key: next(int(l.split()[1]) for l in Path(f"/proc/{app.proc.pid}/status").read_text().splitlines()
                              if l.startswith(key))
    before_kb = status("VmHWM")
    sent = [0]
    def body():
        for _ in range(2**30 // 2**20):
            sent[0] += 2**20
            yield b"x" * 2**20
    try:
        r = httpx.post(app.url + "/api/start", content=body(), headers={"Content-Type": "application/json"}, timeout=120)
        assert r.status_code == 413 and "at most 16000 bytes" in r.json()["error"]
    except httpx.TransportError:   # the server may close the connection before the client has finished sending
        pass
    assert httpx.get(app.url + "/", timeout=30).status_code == 200       # still serving
    peak_kb = status("VmHWM")
    print(f"sent {sent[0] / 2**20:.0f} MB; server peak RSS {before_kb / 1024:.0f} MB before, {peak_kb / 1024:.0f} MB after")
    # the body must not reach memory: the peak grows by less than 32 MB over the process's own footprint (the server
    # imports neither torch nor the trainer); a buffered 1 GB body would add 1 GB
    assert peak_kb - before_kb < 32 * 1024
    assert peak_kb < 300 * 1024
