"""An HTTP proxy on loopback that forwards to a real OpenAI-compatible server and injects faults.

Only for tests: it wraps the real server (every non-faulted call is answered by it) and injects, at a seeded rate,
timeouts, 429 with Retry-After, 500s, dropped connections and truncated JSON bodies; `auth_echo` answers 401 with
the caller's Authorization header in the error text (to check that keys are redacted)."""
import json, random, socket, threading, time, urllib.request, urllib.error
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

FAULTS = ("timeout", "429", "500", "drop", "truncated")


class FaultProxy:
    def __init__(self, upstream: str, rate: float = 0.2, faults=FAULTS, seed: int = 0, hang: float = 5.0):
        self.upstream, self.rate, self.faults, self.hang = upstream.rstrip("/"), rate, list(faults), hang
        self.rng, self.lock = random.Random(seed), threading.Lock()
        self.counts = {k: 0 for k in self.faults} | {"ok": 0}
        self.seen_auth = set()
        proxy = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            def log_message(self, *a): pass

            def _send(self, code, body: bytes, headers=(), length=None):
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body) if length is None else length))
                for k, v in headers: self.send_header(k, v)
                self.end_headers(); self.wfile.write(body); self.wfile.flush()

            def _forward(self, method, body=None):
                req = urllib.request.Request(proxy.upstream + self.path.removeprefix("/v1"), data=body, method=method,
                                             headers={"Content-Type": "application/json"})
                try:
                    with urllib.request.urlopen(req, timeout=300) as r: return r.status, r.read()
                except urllib.error.HTTPError as e: return e.code, e.read()

            def do_GET(self):
                code, body = self._forward("GET"); self._send(code, body)

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                auth = self.headers.get("Authorization", "")
                with proxy.lock:
                    proxy.seen_auth.add(auth)
                    fault = proxy.rng.choice(proxy.faults) if proxy.rng.random() < proxy.rate else None
                    proxy.counts[fault or "ok"] += 1
                if fault == "timeout":
                    time.sleep(proxy.hang); self.close_connection = True; return
                if fault == "429":
                    return self._send(429, b'{"error": {"message": "rate limited"}}', [("Retry-After", "1")])
                if fault == "500":
                    return self._send(500, b'{"error": {"message": "internal error"}}')
                if fault == "drop":
                    self.close_connection = True
                    try: self.connection.shutdown(socket.SHUT_RDWR)
                    except OSError: pass
                    return
                if fault == "auth_echo":
                    return self._send(401, json.dumps({"error": {"message": f"Incorrect API key provided: {auth.removeprefix('Bearer ')}"}}).encode())
                code, out = self._forward("POST", body)
                if fault == "truncated": out = out[: len(out) // 2]
                self._send(code, out)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self): return f"http://127.0.0.1:{self.server.server_address[1]}/v1"
    @property
    def n_faults(self): return sum(v for k, v in self.counts.items() if k != "ok")

    def __enter__(self): self.thread.start(); return self
    def __exit__(self, *exc): self.server.shutdown(); self.server.server_close()
