"""A scripted OpenAI-compatible /chat/completions endpoint on loopback, for the study tests that must inject a fault or
a specific reply (tests/fast/test_study_faults.py, tests/integration/test_study_hostile.py, tests/integration/test_study_postgres.py)."""
import json, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Scripted:
    "An OpenAI-compatible /chat/completions that streams scripted replies: ('text', s), ('tool', name, args) or ('status', code)."
    def __init__(self):
        self.script, self.requests = [], []
        me = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a): pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                me.requests.append(body)
                item = me.script.pop(0) if me.script else ("text", "ok")
                if item[0] == "status":
                    self.send_response(item[1]); self.end_headers(); return
                if item[0] == "sleep":   # a hanging endpoint
                    time.sleep(item[1]); self.send_response(200); self.end_headers(); return
                self.send_response(200); self.send_header("Content-Type", "text/event-stream"); self.end_headers()
                if item[0] == "raw":     # whatever bytes the fault needs (a malformed chunk)
                    self.wfile.write(item[1]); return
                if item[0] in ("text", "cut"):
                    deltas = [{"content": w + " "} for w in item[1].split()]
                else:
                    deltas = [{"tool_calls": [{"index": 0, "id": "call_1", "function": {"name": item[1], "arguments": ""}}]},
                              {"tool_calls": [{"index": 0, "function": {"arguments": json.dumps(item[2])}}]}]
                for d in deltas: self.wfile.write(f"data: {json.dumps({'choices': [{'delta': d}]})}\n\n".encode())
                if item[0] == "cut": return   # the stream ends without a finish reason or [DONE]
                end = {"choices": [{"delta": {}, "finish_reason": "tool_calls" if item[0] == "tool" else "stop"}]}
                self.wfile.write(f"data: {json.dumps(end)}\n\ndata: [DONE]\n\n".encode())

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
