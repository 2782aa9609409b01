"""A loopback stand-in for an SGLang server (which needs CUDA): the same native endpoints, answered by a real tiny
transformers model, with injectable faults. Used only to test scope_nb.sglang_client's request/response handling."""
import json, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
import torch
from transformers import AutoModelForCausalLM
from scope_nb.training import sample_batch


class FakeSGLang:
    def __init__(self, model, pad_id: int, seed: int = 0):
        self.model, self.pad_id, self.gen = model, pad_id, torch.Generator().manual_seed(seed)
        self.requests, self.faults, self.released, self.lock = [], [], False, threading.Lock()
        fake = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a): pass

            def _send(self, code, obj):
                body = json.dumps(obj).encode() if not isinstance(obj, bytes) else obj
                self.send_response(code); self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)

            def do_GET(self):
                self._send(200, {"status": "ok"}) if self.path == "/health" else self._send(404, {"error": "not found"})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                with fake.lock:
                    fake.requests.append((self.path, body))
                    fault = fake.faults.pop(0) if fake.faults else None
                if fault == "drop": self.connection.close(); return   # connection dropped before any answer
                if isinstance(fault, int): return self._send(fault, {"error": f"injected {fault}"})
                try: self._send(200, fake.handle(self.path, body))
                except KeyError as e: self._send(400, {"error": f"missing field {e}"})
                except LookupError as e: self._send(404, {"error": str(e)})
                except RuntimeError as e: self._send(503, {"error": str(e)})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def handle(self, path, body):
        if path == "/generate":
            if self.released: raise RuntimeError("engine memory is released; call /resume_memory_occupation")
            ids = body["input_ids"]; single = ids and isinstance(ids[0], int)
            sp = body["sampling_params"]
            with self.lock:
                samples = sample_batch(self.model, [ids] if single else ids, sp["max_new_tokens"], sp["temperature"], sp["stop_token_ids"], self.pad_id, self.gen)
            out = [{"text": "", "output_ids": s.ids,
                    "meta_info": {"output_token_logprobs": [[lp, t, None] for lp, t in zip(s.logprobs, s.ids)] if body.get("return_logprob") else None,
                                  "finish_reason": {"type": "stop", "matched": s.ids[-1]} if s.eos else {"type": "length", "length": len(s.ids)},
                                  "completion_tokens": len(s.ids)}} for s in samples]
            return out[0] if single else out
        if path == "/update_weights_from_disk":
            try: new = AutoModelForCausalLM.from_pretrained(body["model_path"])
            except OSError as e: return {"success": False, "message": f"failed to load {body['model_path']}: {type(e).__name__}"}
            with self.lock: self.model.load_state_dict(new.state_dict())
            return {"success": True, "message": "Succeeded to update model weights."}
        if path == "/release_memory_occupation": self.released = True; return {}
        if path == "/resume_memory_occupation": self.released = False; return {}
        if path == "/flush_cache": return b"Cache flushed."
        raise LookupError(path)

    def close(self): self.server.shutdown(); self.server.server_close()
