"""Study app paths a small local model does not exercise, driven by a scripted OpenAI-compatible endpoint (a stand-in
only where a fault or a specific reply must be injected): an agent tool call executed server-side by the real τ²
environment and scored by tau2's evaluator, endpoint failures (retried, then a retry button, never a silent 0), and
the message and time limits."""
import json, os, time
import pytest
from fastapi.testclient import TestClient
from scope_nb.study.app import create_app
from scope_nb.study.store import ARMS, Store, study_config
from scripted_endpoint import Scripted


@pytest.fixture()
def setup(tmp_path, monkeypatch):
    monkeypatch.setenv("SCOPE_STUDY_SECRET", "s"); monkeypatch.setenv("SCOPE_STUDY_ADMIN_TOKEN", "t")
    ep = Scripted()
    cfg = study_config({"study_id": "s1", "db_url": f"sqlite:///{tmp_path / 'db.sqlite'}", "max_turns": 2, "max_minutes": 5,
                        "agent_timeout": 3.0, "agent_retries": 3, "min_turns": 1,
                        "task_types": {"tau2-retail": ["5"]}, "arms": {a: {"base_url": ep.url, "model": a} for a in ARMS}})
    with TestClient(create_app(cfg)) as c:
        yield c, ep, cfg
    ep.server.shutdown()


def _events(r):
    out = []
    for chunk in r.text.strip().split("\n\n"):
        lines = chunk.splitlines()
        out.append((lines[0][7:], json.loads(lines[1][6:])))
    return out


def _start(c, pid="P1"):
    return c.post("/api/start", json={"pid": pid, "study": "s1", "session": "x"}).json()


def test_tool_call_runs_in_the_real_tau2_environment(setup):
    c, ep, _ = setup
    s = _start(c)
    assert s["task_type"] == "tau2-retail" and s["turns"][0]["role"] == "agent"   # τ²'s canned greeting
    ep.script = [("tool", "find_user_id_by_name_zip", {"first_name": "Yusuf", "last_name": "Rossi", "zip": "19122"}),
                 ("text", "I found your account. How can I help?")]
    evs = _events(c.post("/api/message", json={"session_id": s["session_id"], "text": "I am Yusuf Rossi, zip 19122"}))
    kinds = [e for e, _ in evs]
    assert kinds[:2] == ["ack", "turn"] and kinds[-2:] == ["turn", "done"] and set(kinds[2:-2]) == {"delta"}
    assert "".join(d["text"] for e, d in evs if e == "delta") == "I found your account. How can I help? "
    assert evs[1][1]["tool_calls"] == 1
    # the second request carried the tool's answer from the τ² database back to the model
    tool_msgs = [m for m in ep.requests[1]["messages"] if m["role"] == "tool"]
    assert tool_msgs and "yusuf_rossi_9620" in tool_msgs[0]["content"]
    assert ep.requests[0]["tools"] and any(t["function"]["name"] == "find_user_id_by_name_zip" for t in ep.requests[0]["tools"])
    c.post("/api/end", json={"session_id": s["session_id"]})
    rows = [json.loads(l) for l in c.get("/admin/export", headers={"Authorization": "Bearer t"}).text.splitlines()]
    roles = [t["role"] for t in rows[0]["transcript"]]
    assert roles == ["user", "agent", "tool", "agent"] and rows[0]["transcript"][1]["tool_calls"][0]["name"] == "find_user_id_by_name_zip"
    assert rows[0]["tau2_reward"] == 0.0 and "reward_breakdown" in rows[0]["tau2_info"]   # scored by tau2 (task not done)


def test_endpoint_failures_are_retried_then_offered_again_never_scored(setup):
    c, ep, _ = setup
    s = _start(c)
    ep.script = [("status", 500), ("status", 429), ("text", "Hello there")]          # two faults, then an answer: retried inside
    evs = _events(c.post("/api/message", json={"session_id": s["session_id"], "text": "hi"}))
    assert evs[-2] == ("turn", {"text": "Hello there ", "tool_calls": 0}) and len(ep.requests) == 3
    ep.script = [("status", 503)] * 4                                                  # all retries fail
    evs = _events(c.post("/api/message", json={"session_id": s["session_id"], "text": "still there?"}))
    assert evs[-1][0] == "error" and "Retry" in evs[-1][1]["message"]
    again = _start(c)
    assert again["agent_pending"] and again["turns"][-1] == {"role": "you", "text": "still there?"}   # the message was kept
    r = c.post("/api/message", json={"session_id": s["session_id"], "text": "hello?"})
    assert r.status_code == 409 and "Retry" in r.json()["error"]
    ep.script = [("text", "Sorry, yes.")]
    assert _events(c.post("/api/agent", json={"session_id": s["session_id"]}))[-2][0] == "turn"
    assert not _start(c)["agent_pending"]


def test_message_and_time_limits(setup):
    c, ep, cfg = setup
    s = _start(c)
    for k in range(2):
        assert _events(c.post("/api/message", json={"session_id": s["session_id"], "text": f"m{k}"}))[-1][0] == "done"
    r = c.post("/api/message", json={"session_id": s["session_id"], "text": "one more"})
    assert r.status_code == 409 and "maximum of 2 messages" in r.json()["error"]
    s2 = _start(c, "P2")
    store = c.app.state.store
    with store.engine.begin() as con:   # the session started 6 minutes ago (limit: 5)
        con.execute(store.t["sessions"].update().where(store.t["sessions"].c.id == s2["session_id"]).values(started=time.time() - 360))
    r = c.post("/api/message", json={"session_id": s2["session_id"], "text": "late"})
    assert r.status_code == 409 and "time for this chat is up" in r.json()["error"]


def test_hostile_bodies_are_refused_as_json_and_the_csv_export_neutralises_formulas(setup):
    "Oversized (declared or chunked) and invalid-UTF-8 bodies, lone surrogates, a formula comment: refused or neutralised."
    import csv, io
    c, ep, _ = setup
    r = c.post("/api/start", content=b"{}", headers={"Content-Length": str(10**9),
                                                             "Content-Type": "application/json"})   # declared: refused unread
    assert r.status_code == 413 and "at most 16000 bytes" in r.json()["error"]
    r = c.post("/api/start", content=(b"x" * 4096 for _ in range(10_000)),           # 40 MB chunked: refused while reading
               headers={"Content-Type": "application/json"})
    assert r.status_code == 413
    r = c.post("/api/start", content=b'{"pid": "\xff\xfe"}', headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "not JSON" in r.json()["error"]
    s = _start(c)
    r = c.post("/api/message", content=b'{"session_id": "%s", "text": "hi \\ud800"}' % s["session_id"].encode(),
               headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "not valid text" in r.json()["error"]
    ep.script = [("text", "Hello")]
    _events(c.post("/api/message", json={"session_id": s["session_id"], "text": "=HYPERLINK(\"http://x\",\"y\")"}))
    c.post("/api/end", json={"session_id": s["session_id"]})
    items = {k: 5 for k in ("task_success", "helpfulness", "honesty", "efficiency", "instruction_following", "safety",
                            "frustration", "overall")}
    bad = c.post("/api/survey", content=json.dumps({"session_id": s["session_id"], "answers": {**items, "comment": "x"}})
                 .replace('"x"', '"\\ud800"').encode(), headers={"Content-Type": "application/json"})
    assert bad.status_code == 400 and "comment" in bad.json()["error"]
    ok = c.post("/api/survey", json={"session_id": s["session_id"], "answers": {**items, "comment": "=1+1"}})
    assert ok.status_code == 200, ok.text
    text = c.get("/admin/export?format=csv", headers={"Authorization": "Bearer t"}).text
    row = next(csv.DictReader(io.StringIO(text)))
    assert row["comment"] == "'=1+1" and not any(v.startswith(("=", "+", "@")) for v in row.values())


def test_every_endpoint_fault_ends_in_one_retryable_error_and_nothing_partial_is_stored(setup):
    "Empty replies are retried; malformed chunks, cut streams, a tool loop, exhausted retries: one error event each."
    c, ep, cfg = setup
    s = _start(c)
    sid = s["session_id"]
    ep.script = [("text", ""), ("text", "A whole answer")]     # an empty reply is retried
    evs = _events(c.post("/api/message", json={"session_id": sid, "text": "hi"}))
    assert evs[-2] == ("turn", {"text": "A whole answer ", "tool_calls": 0}) and len(ep.requests) == 2
    for fault in ([("raw", b"data: {not json\n\n")] * 4, [("cut", "Cut again")] * 4, [("text", "")] * 4):
        ep.script = list(fault)
        if ep.script[0][0] == "cut":   # a stream that started showing text is not retried: one request, one error
            ep.script = ep.script[:1]
        evs = _events(c.post("/api/agent", json={"session_id": sid})) if _start(c)["agent_pending"] else \
            _events(c.post("/api/message", json={"session_id": sid, "text": "again?"}))
        assert evs[-1][0] == "error" and set(evs[-1][1]) == {"message"} and "Retry" in evs[-1][1]["message"], evs
        snap = _start(c)
        assert snap["agent_pending"] and snap["turns"][-1]["role"] == "you"   # nothing partial stored: still retryable
    ep.script = [("tool", "find_user_id_by_name_zip", {"first_name": "Yusuf", "last_name": "Rossi", "zip": "19122"})] * 9
    evs = _events(c.post("/api/agent", json={"session_id": sid}))
    assert evs[-1][0] == "error" and sum(e == "turn" for e, _ in evs) == 8   # the loop cap: an error, never a silent 'done'


def test_a_hanging_endpoint_errors_within_its_timeout_and_end_is_always_possible(setup):
    c, ep, cfg = setup
    s = _start(c)
    ep.script = [("sleep", 30)] * (cfg.agent_retries + 1)
    t0 = time.perf_counter()
    evs = _events(c.post("/api/message", json={"session_id": s["session_id"], "text": "hello?"}))
    took = time.perf_counter() - t0
    assert evs[-1][0] == "error" and took < (cfg.agent_retries + 1) * (cfg.agent_timeout + 2) + 10, took
    assert c.post("/api/end", json={"session_id": s["session_id"]}).status_code == 200
