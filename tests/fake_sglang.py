"""A loopback stand-in for an SGLang 0.5.23 server (which needs CUDA): the same native endpoints, answered by a real tiny
transformers model, as strictly as the real server answers them, with injectable faults. Used to test
scope_nb.scale.sglang_client's request/response handling and the Ray backend's engine path.

What it copies from SGLang 0.5.23's source (sglang/srt/entrypoints/http_server.py, sglang/api/v1/api_types.py,
managers/io_struct.py, managers/tokenizer_manager.py, scheduler weight/memory code):
- /generate: a list of results for a batch of `input_ids`, a dict for one flat list; each result's `meta_info` has
  `output_token_logprobs` as [logprob, token_id, null] (the stop token included, as in `output_ids`), finish_reason
  {"type": "stop", "matched": id} | {"type": "length", "length": max_new_tokens} | {"type": "abort", ...} (HTTP 200);
  `input_token_logprobs` [] for logprob_start_len -1; an unknown `sampling_params` key or a wrongly typed value is
  HTTP 400 {"error": "<text>"} (the contract gate); an unknown top-level key is ignored; `sampling_params` may be a
  list (one per prompt); `sampling_seed` is honoured only when started `deterministic=True`
  (--enable-deterministic-inference), where an unseeded request draws with seed 42.
- /health: HTTP 503 with an empty body while starting (the first `starting` probes), then 200 with an empty body
  after a one-token generation probe.
- /update_weights_from_disk: 200 {"success": true, "message": "Succeeded to update model weights.",
  "num_paused_requests": 0}; a folder that does not load is HTTP 400 {"success": false, "message": "Failed to get
  weights iterator: ..."} and the old weights stay; a relative path is read relative to the server's working
  directory (else SGLang takes it for a hub id).
- /release_memory_occupation, /resume_memory_occupation: 200 with body `null`. With the memory saver on (the
  launcher's --enable-memory-saver) and no --enable-weights-cpu-backup (`cpu_backup=False`), resume maps new memory
  and the weights are garbage until new ones are loaded: here they are overwritten with noise.
- /flush_cache: 200 with plain text.
- /model_info: {"model_path": <last loaded path>, "weight_version": "default", ...}.
"""
import json, os, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
import torch
from transformers import AutoModelForCausalLM
from scope_nb.core.policy import sample_batch

SAMPLING_FIELDS = ("max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
                   "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n", "json_schema",
                   "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens",
                   "spaces_between_special_tokens", "no_stop_trim", "stream_interval", "logit_bias", "sampling_seed",
                   "custom_params", "beam_width", "watermark", "choice")
INTS, BOOLS = ("max_new_tokens", "min_new_tokens", "n", "top_k", "sampling_seed", "stream_interval", "beam_width"), \
    ("ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim")


class BadRequest(Exception):
    def __init__(self, body, code: int = 400): self.body, self.code = body, code


def contract_error(sp: dict) -> str | None:
    "What SGLang's /generate contract gate says of one sampling_params dict (None: accepted)."
    for k, v in sp.items():
        if k not in SAMPLING_FIELDS:
            return f"unknown field `{k}`, expected one of " + ", ".join(f"`{f}`" for f in SAMPLING_FIELDS)
        if v is None: continue
        if k in INTS and (isinstance(v, bool) or not isinstance(v, int)):
            return f"invalid type: {type(v).__name__} `{v}`, expected i64"
        if k in BOOLS and not isinstance(v, bool):
            return f"invalid type: {type(v).__name__} `{v}`, expected a boolean"
    return None


class FakeSGLang:
    def __init__(self, model, pad_id: int, seed: int = 0, dtype=None, starting: int = 0, deterministic: bool = False,
                 memory_saver: bool = True, cpu_backup: bool = False, model_path: str = "initial"):
        self.model, self.pad_id, self.gen = model if dtype is None else model.to(dtype), pad_id, torch.Generator().manual_seed(seed)
        self.dtype, self.starting, self.deterministic = dtype, starting, deterministic
        self.memory_saver, self.cpu_backup, self.model_path = memory_saver, cpu_backup, model_path
        self.requests, self.faults, self.released, self.lock = [], [], False, threading.Lock()
        fake = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a): pass

            def _send(self, code, obj, ctype="application/json"):
                body = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
                self.send_response(code); self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)

            def do_GET(self):
                if self.path == "/health": return self._send(fake.health(), b"", "text/plain")
                if self.path in ("/model_info", "/get_model_info"): return self._send(200, fake.model_info())
                self._send(404, {"detail": "Not Found"})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"null")
                with fake.lock:
                    fake.requests.append((self.path, body))
                    fault = fake.faults.pop(0) if fake.faults else None
                if fault == "drop": self.connection.close(); return   # connection dropped before any answer
                if isinstance(fault, int): return self._send(fault, {"object": "error", "message": f"injected {fault}",
                                                                     "type": str(fault), "param": None, "code": fault})
                try: out = fake.handle(self.path, body or {}, fault)
                except BadRequest as e: return self._send(e.code, e.body)
                except LookupError: return self._send(404, {"detail": "Not Found"})
                if isinstance(out, str): return self._send(200, out.encode(), "text/plain")
                self._send(200, out)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def health(self) -> int:
        if self.starting > 0:
            self.starting -= 1
            return 503
        with self.lock:   # the one-token probe
            sample_batch(self.model, [[0]], 1, 0.0, [], self.pad_id, torch.Generator().manual_seed(0))
        return 200

    def model_info(self) -> dict:
        return {"model_path": self.model_path, "served_model_name": self.model_path, "tokenizer_path": self.model_path,
                "is_generation": True, "weight_version": "default", "load_format": "auto"}

    def _generate(self, body, fault):
        if self.released:   # the real server has no guard: its forward pass meets unmapped memory and the scheduler dies
            raise BadRequest({"object": "error", "message": "CUDA error: an illegal memory access was encountered",
                              "type": "500", "param": None, "code": 500}, 500)
        ids = body["input_ids"] if "input_ids" in body else None
        if not ids: raise BadRequest({"error": {"message": "Either text, input_ids or input_embeds should be provided."}})
        single = isinstance(ids[0], int)
        prompts = [ids] if single else ids
        sps = body.get("sampling_params") or {}
        sps = sps if isinstance(sps, list) else [sps] * len(prompts)
        for sp in sps:
            err = contract_error(sp)
            if err: raise BadRequest({"error": err})
        start = body.get("logprob_start_len", -1)
        if start is not None and start > 0 and any(start >= len(p) for p in prompts):
            raise BadRequest({"error": {"message": f"logprob_start_len ({start}) is superior or equal to the input length"}})
        def draw(ps, sp, gen):
            eos = [t for t in (sp.get("stop_token_ids") or []) if t is not None]
            with self.lock:
                return sample_batch(self.model, ps, sp.get("max_new_tokens", 128), sp.get("temperature", 1.0), eos, self.pad_id, gen)
        if not self.deterministic and all(sp == sps[0] for sp in sps):
            samples = draw(prompts, sps[0], self.gen)          # one batch, one generator (the engine's own RNG)
        else:                                                  # a seeded draw is a function of (seed, prompt)
            samples = [draw([p], sp, torch.Generator().manual_seed(42 if sp.get("sampling_seed") is None else sp["sampling_seed"]) if self.deterministic else self.gen)[0]
                       for p, sp in zip(prompts, sps)]
        out = []
        for k, (p, sp, s) in enumerate(zip(prompts, sps, samples)):
            fr = {"type": "stop", "matched": s.ids[-1]} if s.eos else {"type": "length", "length": sp.get("max_new_tokens", 128)}
            if fault == "abort" or (fault == "abort-one" and k == 0):
                fr = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
            meta = {"id": f"rid{k}", "finish_reason": fr, "prompt_tokens": len(p), "weight_version": "default",
                    "completion_tokens": len(s.ids), "cached_tokens": 0}
            if body.get("return_logprob"):
                meta.update(input_token_logprobs=[], output_token_logprobs=[[float(lp), t, None] for lp, t in zip(s.logprobs, s.ids)],
                            output_token_logprobs_length=len(s.ids))
            out.append({"text": "", "output_ids": s.ids, "meta_info": meta})
        return out[0] if single else out

    def handle(self, path, body, fault=None):
        if path == "/generate": return self._generate(body, fault)
        if path == "/update_weights_from_disk":
            if "model_path" not in body:
                raise BadRequest({"object": "error", "message": "Field required: model_path", "type": "Bad Request", "param": None, "code": 400})
            try: new = AutoModelForCausalLM.from_pretrained(body["model_path"], local_files_only=True)
            except (OSError, ValueError) as e:
                raise BadRequest({"success": False, "message": f"Failed to get weights iterator: {type(e).__name__}: {e}.",
                                  "num_paused_requests": 0})
            with self.lock:
                self.model.load_state_dict({k: v.to(self.dtype) if self.dtype else v for k, v in new.state_dict().items()})
                self.model_path = body["model_path"]
            return {"success": True, "message": "Succeeded to update model weights.", "num_paused_requests": 0}
        if path == "/release_memory_occupation":
            self.released = True
            return None
        if path == "/resume_memory_occupation":
            if self.released and self.memory_saver and not self.cpu_backup:   # new physical memory: the weights are gone
                with self.lock, torch.no_grad():
                    g = torch.Generator().manual_seed(1234)
                    for p in self.model.parameters(): p.copy_(torch.randn(p.shape, generator=g).to(p.dtype))
            self.released = False
            return None
        if path == "/flush_cache":
            return "Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting requests, the operation will not be performed.)\n"
        raise LookupError(path)

    def close(self): self.server.shutdown(); self.server.server_close()
