"""`scope eval` on the three kinds of agent a user evaluates: (a) a trained checkpoint of a run folder, (b) the
packaged SmolLM2 served by llama.cpp, (c) an OpenAI-compatible endpoint (a stand-in with a known success rate per
task, so reward and pass^k have a known truth); each writes a run folder `scope report` turns into its table."""
import json, re, subprocess, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
import pytest
from conftest import ROOT

SCOPE = str(Path(sys.executable).parent / "scope")


def _scope(*args, timeout=1800):
    r = subprocess.run([SCOPE, *map(str, args)], capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def _report_table(tmp_path, run: Path) -> str:
    _scope("report", run, "--out", tmp_path / "report")
    return (tmp_path / "report" / "table.md").read_text()


def test_eval_of_a_trained_checkpoint(tmp_path):
    _scope("train", ROOT / "configs" / "echo_tiny.toml", "--no-progress", "--set", f"run.out_dir='{tmp_path}'")
    run = next(p.parent for p in tmp_path.rglob("config.toml"))
    out = _scope("eval", run, "--trials", 3, "--tasks", 2, "--success", 0.5, "--out", tmp_path / "ev")
    print(out)
    s = json.loads((tmp_path / "ev" / "eval.json").read_text())
    assert s["checkpoint"].endswith(max(p.name for p in (run / "checkpoints").glob("step_*")))   # the newest one
    sim = next(iter(s["simulators"].values()))
    assert sim["tasks"] == 2 and sim["episodes"] == 6 and [r["k"] for r in sim["pass_k"]] == [1, 2, 3]
    assert "pass^3" in out and "reward" in out
    assert "| " in _report_table(tmp_path, tmp_path / "ev")
    again = _scope("eval", run, "--trials", 3, "--tasks", 2, "--success", 0.5, "--out", tmp_path / "ev")
    assert json.loads((tmp_path / "ev" / "eval.json").read_text()) == s and "pass^3" in again   # read, not replayed


def test_eval_of_smollm2_served_by_llama_cpp(tmp_path):
    out = _scope("eval", "--set", "env.name='ask'", "--set", "agent.model='llama:smollm2'", "--set", "agent.train=false",
                 "--set", "agent.max_new_tokens=24", "--set", "user.model='llama:smollm2'", "--set", "user.max_new_tokens=16",
                 "--trials", 2, "--tasks", 3, "--out", tmp_path / "ev")
    print(out)
    s = json.loads((tmp_path / "ev" / "eval.json").read_text())
    sim = s["simulators"]["llama-smollm2"]
    assert sim["tasks"] == 3 and sim["episodes"] == 6 and sim["failed"] == 0
    assert 0 <= sim["reward"] <= 1 and [r["k"] for r in sim["pass_k"]] == [1, 2]
    assert out.splitlines()[0].startswith("llama:smollm2 against 1 simulator(s), 2 trials per task")
    assert "| " in _report_table(tmp_path, tmp_path / "ev")


class _StandIn:
    """An OpenAI-compatible /v1/chat/completions (non-streaming, the response schema of the OpenAI API) for two models:
    `agent-standin` offers the topic of its system prompt; `user-standin` says yes only to music and crosswords."""
    YES = ("music", "crossword")

    def __init__(self):
        me, self.models = self, []

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a): pass

            def do_POST(self):
                if self.path.rstrip("/") != "/v1/chat/completions":
                    self.send_response(404); self.end_headers(); return
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                msgs, model = body["messages"], body["model"]
                me.models.append(model)
                if model == "agent-standin":
                    topic = re.search(r"offering the user (.+?)\.", msgs[0]["content"]).group(1)
                    text = f"Would you like {topic}?"
                elif model == "user-standin":
                    text = "yes, please" if any(w in msgs[-1]["content"] for w in me.YES) else "no, thank you"
                else:
                    self.send_response(404); self.end_headers(); return
                out = json.dumps({"id": "cmpl-1", "object": "chat.completion", "created": 0, "model": model,
                                  "choices": [{"index": 0, "finish_reason": "stop",
                                               "message": {"role": "assistant", "content": text}}],
                                  "usage": {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14}}).encode()
                self.send_response(200); self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out))); self.end_headers(); self.wfile.write(out)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"


def test_eval_of_an_openai_compatible_endpoint_has_its_known_reward_and_pass_k(tmp_path):
    ep = _StandIn()
    try:
        out = _scope("eval", "--set", "env.name='ask'", "--set", "agent.model='api:agent-standin'",
                     "--set", "agent.train=false", "--set", f"agent.api.base_url='{ep.url}'", "--set", "agent.api.key_env=''",
                     "--set", "user.model='api:user-standin'", "--set", f"user.api.base_url='{ep.url}'",
                     "--set", "user.api.key_env=''", "--trials", 3, "--out", tmp_path / "ev")
    finally:
        ep.server.shutdown()
    print(out)
    s = json.loads((tmp_path / "ev" / "eval.json").read_text())
    sim = s["simulators"]["api-user-standin"]
    # the ask environment's 3 test topics: a music playlist and a crossword get a yes (every trial), a fun fact never
    assert sim["tasks"] == 3 and sim["episodes"] == 9 and sim["failed"] == 0
    assert sim["reward"] == pytest.approx(2 / 3)
    assert [round(r["pass_k"], 6) for r in sim["pass_k"]] == [round(2 / 3, 6)] * 3   # all-or-nothing tasks: p^k = p
    assert {"agent-standin", "user-standin"} <= set(ep.models)
    assert "pass^1 0.667" in out and "pass^3 0.667" in out
    assert "| " in _report_table(tmp_path, tmp_path / "ev")


def test_exported_chats_are_valid_openai_messages(tmp_path):
    "`scope export` of an evaluation, and a conversation with a tool call, checked against the OpenAI SDK's own types."
    from pydantic import TypeAdapter
    from openai.types.chat import ChatCompletionMessageParam
    from scope_nb.core.dialogue import Conversation, ToolCall
    check = TypeAdapter(list[ChatCompletionMessageParam]).validate_python
    ep = _StandIn()
    try:
        _scope("eval", "--set", "env.name='ask'", "--set", "agent.model='api:agent-standin'", "--set", "agent.train=false",
               "--set", f"agent.api.base_url='{ep.url}'", "--set", "agent.api.key_env=''", "--set", "user.model='api:user-standin'",
               "--set", f"user.api.base_url='{ep.url}'", "--set", "user.api.key_env=''", "--trials", 2, "--out", tmp_path / "ev")
    finally:
        ep.server.shutdown()
    out = _scope("export", tmp_path / "ev", "--out", tmp_path / "chats.jsonl", "--roles", "agent,user")
    chats = [json.loads(l) for l in (tmp_path / "chats.jsonl").read_text().splitlines()]
    assert out.startswith(f"{len(chats)} chats") and len(chats) == 2 * 6          # 3 tasks x 2 trials, both roles
    for c in chats:
        check(c["messages"])
    yes = [c for c in chats if c["role"] == "agent" and c["reward"] == 1.0]
    assert yes and all(c["messages"][-1] == {"role": "user", "content": "yes, please"} for c in yes)
    conv = Conversation(system={"agent": "You help.", "user": "You ask."})
    conv.say("user", "What is my order's status?")
    conv.say("agent", None, [ToolCall("call_0", "get_order", '{"id": "7"}')])
    conv.tool_result("agent", "call_0", '{"status": "shipped"}', name="get_order")
    conv.say("agent", "It has shipped.")
    msgs = conv.view("agent")
    check(msgs)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "assistant"], msgs
    with pytest.raises(Exception):   # the check can fail: a role the API does not have is refused
        check(msgs[:1] + [{"role": "bot", "content": "hi"}])
    # pydantic validates the SDK's `Iterable` tool_calls lazily, so the calls are checked against its schema by hand
    calls = [c for m in msgs for c in m.get("tool_calls", [])]
    assert calls == [{"id": "call_0", "type": "function", "function": {"name": "get_order", "arguments": '{"id": "7"}'}}]
    assert msgs[3] == {"role": "tool", "content": '{"status": "shipped"}', "tool_call_id": "call_0", "name": "get_order"} or \
        {k: msgs[3][k] for k in ("role", "content", "tool_call_id")} == {"role": "tool", "content": '{"status": "shipped"}', "tool_call_id": "call_0"}


def test_ask_tasks_from_a_datasets_folder_train_and_evaluate(tmp_path):
    "A DatasetDict saved to a folder in the test supplies ask's tasks: SmolLM2 trains on its train rows, is evaluated on its test rows."
    import datasets
    folder = tmp_path / "offers"
    datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({"offer": ["a cup of cocoa", "a paper crane", "a short poem"],
                                             "id": ["cocoa", "crane", "poem"]}),
        "test": datasets.Dataset.from_dict({"offer": ["a biscuit", "a riddle"], "id": ["biscuit", "riddle"]}),
    }).save_to_disk(str(folder))
    common = ["--set", f"env.tasks='{folder}'", "--set", "env.task_columns.topic='offer'"]
    _scope("train", ROOT / "configs" / "smoke_smollm2.toml", "--no-progress", "--set", f"run.out_dir='{tmp_path}'", *common)
    run = tmp_path / "smoke-smollm2"
    trained = {json.loads(l)["task_id"] for f in (run / "trajectories").glob("*.jsonl") for l in f.read_text().splitlines()}
    evaluated = {json.loads(l)["task_id"] for f in (run / "eval").glob("*/*.jsonl") for l in f.read_text().splitlines()}
    assert trained and trained <= {"cocoa", "crane", "poem"} and evaluated == {"biscuit", "riddle"}, (trained, evaluated)
    first = json.loads(next((run / "trajectories").glob("*.jsonl")).read_text().splitlines()[0])
    assert any(o in first["conversation"]["system"]["agent"] for o in ("cocoa", "paper crane", "short poem"))
    out = _scope("eval", run, "--trials", 2, "--out", tmp_path / "ev")
    s = json.loads((tmp_path / "ev" / "eval.json").read_text())
    assert next(iter(s["simulators"].values()))["tasks"] == 2 and "pass^2" in out
    r = subprocess.run([SCOPE, "train", ROOT / "configs" / "smoke_smollm2.toml", "--set", f"env.tasks='{folder}'",
                        "--set", f"run.out_dir='{tmp_path / 'x'}'"], capture_output=True, text=True)
    assert r.returncode == 2 and "no column 'topic' for the task field 'topic'" in r.stderr and "Traceback" not in r.stderr


def test_eval_against_an_experiments_panel(tmp_path):
    "`--panel collapse-lab`: a lab agent evaluated against that experiment's ten seen/unseen simulators, not its own user."
    lab = ["env.name='lab'", "env.max_turns=2", "agent.model='lab-agent'", "agent.train=false", "agent.max_new_tokens=2",
           "user.model='lab:frugal@4'", "user.max_new_tokens=2"]
    sets = [x for s in lab for x in ("--set", s)]
    out = _scope("eval", *sets, "--panel", "collapse-lab", "--trials", 1, "--tasks", 2, "--out", tmp_path / "ev")
    s = json.loads((tmp_path / "ev" / "eval.json").read_text())
    assert len(s["simulators"]) == 10 and {"frugal", "analyst-g4"} <= set(s["simulators"]), sorted(s["simulators"])
    assert all(v["tasks"] == 2 and v["episodes"] == 2 for v in s["simulators"].values())
    assert "against 10 simulator(s)" in out.splitlines()[0], out
    r = subprocess.run([SCOPE, "eval", *sets, "--panel", "llm-collapse", "--out", tmp_path / "x"], capture_output=True,
                       text=True)
    assert r.returncode == 2 and "plays the agent's environment 'lab'" in r.stderr and "Traceback" not in r.stderr, r.stderr
