"""A stand-in OpenAI-compatible /chat/completions server on loopback that misbehaves on purpose, for the call-limit
tests (tests/integration/test_call_limits.py).

The fault is the first part of the path: `http://127.0.0.1:PORT/<fault>/v1` is an endpoint that

- `ok`: answers a normal chat.completion (streamed when the request says `stream`);
- `drip`: sends a normal reply, with its Content-Length, one byte every `gap` seconds;
- `hang`: reads the request and never answers;
- `pad`: sends 200 and its headers, then a space every `gap` seconds and nothing else (a keep-alive that never ends);
- `huge`: answers 10 MB of valid JSON with its Content-Length; `huge_chunked`: the same chunked, with no length;
- `echo_key`: answers 200 with the caller's Authorization header in the reply text (whole, and its last 8 characters);
- `echo_key_401`: answers 401 with the key's last 8 characters in the error message, as some providers do;
- `sse_drip`: streams a content delta every `gap` seconds and never finishes.

Replies follow the OpenAI schema (id, object, created, model, choices with message/finish_reason, usage); requests
must be POSTs of a JSON object with `model` and `messages`, or they get the 400 the real servers give."""
import json, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BIG = 10 * 2**20


def completion(text: str, model: str) -> dict:
    return {"id": "chatcmpl-fault", "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}


def chunk(text: str, model: str, finish=None) -> bytes:
    d = {"id": "chatcmpl-fault", "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
         "choices": [{"index": 0, "delta": {"content": text} if text else {}, "finish_reason": finish}]}
    return f"data: {json.dumps(d)}\n\n".encode()


class FaultServer:
    def __init__(self, gap: float = 0.5):
        self.gap, self.stop, self.requests = gap, threading.Event(), []
        me = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _json(self, code: int, body: dict):
                raw = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def _trickle(self, pieces, gap):
                "Write `pieces` one by one, `gap` s apart, until done, the client leaves or the server stops."
                try:
                    for p in pieces:
                        if me.stop.wait(gap):
                            return
                        self.wfile.write(p)
                        self.wfile.flush()
                except OSError:
                    pass
                self.close_connection = True

            def do_POST(self):
                fault = self.path.strip("/").split("/")[0]
                try:
                    req = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                    assert isinstance(req, dict) and req.get("model") and isinstance(req.get("messages"), list)
                except (ValueError, AssertionError):
                    return self._json(400, {"error": {"message": "expected a JSON object with model and messages"}})
                model, auth = req["model"], self.headers.get("Authorization", "")
                me.requests.append((fault, req, auth))
                if fault == "ok" and req.get("stream"):
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.end_headers()
                    self.wfile.write(chunk("fine", model) + chunk("", model, "stop") + b"data: [DONE]\n\n")
                    self.close_connection = True
                elif fault == "ok":
                    self._json(200, completion("fine", model))
                elif fault == "drip":
                    raw = json.dumps(completion("fine", model)).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(raw)))
                    self.end_headers()
                    self._trickle([raw[i : i + 1] for i in range(len(raw))], me.gap)
                elif fault == "hang":
                    me.stop.wait(600)
                    self.close_connection = True
                elif fault == "pad":
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    self._trickle((b"1\r\n \r\n" for _ in iter(int, 1)), me.gap)
                elif fault in ("huge", "huge_chunked"):
                    self._huge(model, chunked=fault == "huge_chunked")
                elif fault == "echo_key":
                    self._json(200, completion(f"you sent {auth}; it ends in {auth[-8:]}", model))
                elif fault == "echo_key_401":
                    self._json(401, {"error": {"message": f"Incorrect API key provided: ****{auth[-8:]}"}})
                elif fault == "sse_drip":
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.end_headers()
                    self._trickle((chunk("word ", model) for _ in iter(int, 1)), me.gap)
                else:
                    self._json(404, {"error": {"message": f"unknown fault {fault!r}"}})

            def _huge(self, model, chunked):
                head, tail = json.dumps(completion("@", model)).encode().split(b"@")
                body_len = len(head) + BIG + len(tail)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                if chunked:
                    self.send_header("Transfer-Encoding", "chunked")
                else:
                    self.send_header("Content-Length", str(body_len))
                self.end_headers()
                block = b"x" * 2**16
                parts = [head] + [block] * (BIG // len(block)) + [tail]
                try:
                    for p in parts:
                        self.wfile.write(f"{len(p):x}\r\n".encode() + p + b"\r\n" if chunked else p)
                    if chunked:
                        self.wfile.write(b"0\r\n\r\n")
                except OSError:
                    pass
                self.close_connection = True

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.port = self.server.server_address[1]

    def url(self, fault: str) -> str:
        return f"http://127.0.0.1:{self.port}/{fault}/v1"

    def close(self):
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()
