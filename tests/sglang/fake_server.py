"""A fake SGLang HTTP server implementing the documented profile contract (sglang 0.5.23).

Bound to 127.0.0.1 on an ephemeral port. Endpoints: ``GET /model_info`` (``/get_model_info``),
``GET /health``, ``GET /server_info``, ``GET|POST /start_profile``, ``GET|POST /stop_profile``,
``POST /v1/completions``, ``POST /v1/chat/completions``.

Profile semantics follow ``SchedulerProfilerManager`` (see tracekit's docs/sglang_integration.md):
the ``ProfileReq`` body is validated leniently (unknown fields ignored, numeric strings accepted as
ints, wrong types -> HTTP 400); a start while a profile runs, or a stop while none runs, raises in
the server and FastAPI answers ``500 Internal Server Error``; ``/start_profile`` returns before
anything is written; profiling starts at once unless ``start_step`` is set, and stops by itself
after ``num_steps`` forwards. A "scheduler" thread runs forwards (only while requests are in
flight when ``idle_steps=False``) under a real ``torch.profiler`` (CPU activity), each forward
wrapped in SGLang's ``step[<MODE> bs=<bs>]`` span (and tracekit's hook when ``hook=True``). At stop
the trace is exported and every rank's ``[<prefix>-]<profile_id>-TP-<r>.trace.json.gz`` appears
*later*, at a different time per rank, written in chunks so its size grows. Servers older than
0.5.16 ignore ``profile_id`` (file names use ``time.time()``), and older than 0.5.11 servers answer
404 on ``/model_info`` only when ``legacy_model_info=True``.
"""

from __future__ import annotations

import gzip
import json
import os
import tempfile
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

_FIELDS = {
    "output_dir": "str", "start_step": "int", "num_steps": "int", "activities": "list", "profile_by_stage": "bool",
    "with_stack": "bool", "record_shapes": "bool", "profile_id": "str", "merge_profiles": "bool",
    "profile_prefix": "str", "profile_stages": "list", "detailed_annotations": "bool", "rid": "str",
    "http_worker_ipc": "str",
}


def _vtuple(v: str) -> tuple[int, ...]:
    out = []
    for p in v.split("+")[0].split("."):
        try:
            out.append(int(p))
        except ValueError:
            break
    return tuple(out)


def _coerce(name: str, kind: str, v: Any) -> Any:
    if v is None:
        return None
    if kind == "int":
        if isinstance(v, bool):
            raise ValueError(name)
        if isinstance(v, str):
            return int(v)  # pydantic lax mode accepts "5"
        if isinstance(v, int):
            return v
        if isinstance(v, float) and v.is_integer():
            return int(v)
        raise ValueError(name)
    if kind == "bool":
        if isinstance(v, bool):
            return v
        if isinstance(v, str) and v.lower() in ("true", "false", "1", "0"):
            return v.lower() in ("true", "1")
        raise ValueError(name)
    if kind == "str":
        if not isinstance(v, str):
            raise ValueError(name)
        return v
    if kind == "list":
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise ValueError(name)
        return v
    raise ValueError(name)


@dataclass
class FakeConfig:
    version: str = "0.5.23"
    tp_size: int = 2
    step_s: float = 0.004  # time per fake forward
    idle_steps: bool = True  # forwards also without requests (False: steps only advance under load)
    hook: bool = False  # wrap forwards with tracekit's forward hook (as if the plugin were loaded)
    rank_delays_s: tuple[float, ...] = (0.3, 0.9)  # per rank: time from stop to first bytes
    chunks: int = 4
    chunk_gap_s: float = 0.15
    missing_ranks: tuple[int, ...] = ()  # ranks that never write a file
    legacy_model_info: bool = False
    completion_s: float = 0.02
    extra_server_info: dict[str, Any] = field(default_factory=dict)


class FakeSGLang:
    """Start with :meth:`start`, stop with :meth:`close`; ``url`` is ``http://127.0.0.1:<port>``."""

    def __init__(self, config: FakeConfig | None = None) -> None:
        self.cfg = config or FakeConfig()
        self.lock = threading.Lock()
        self.requests: list[tuple[str, str, Any]] = []  # (method, path, parsed body)
        self.forward_ct = 0
        self.in_progress = False
        self.pending_start: dict[str, Any] | None = None
        self.start_at: int | None = None
        self.target_ct: int | None = None
        self.stop_requested = False
        self.req: dict[str, Any] = {}
        self.active_requests = 0
        self.written: list[Path] = []
        self.writers: list[threading.Thread] = []
        self._quit = threading.Event()
        self._ready = threading.Event()  # the scheduler has imported torch and entered its loop
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:  # quiet
                pass

            def _send(self, code: int, body: bytes | str | dict, ctype: str = "text/plain") -> None:
                if isinstance(body, dict):
                    body, ctype = json.dumps(body).encode(), "application/json"
                elif isinstance(body, str):
                    body = body.encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _body(self) -> Any:
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                return json.loads(raw) if raw else None

            def do_GET(self) -> None:
                fake._dispatch(self, "GET", None)

            def do_POST(self) -> None:
                try:
                    body = self._body()
                except ValueError:
                    self._send(400, {"object": "error", "message": "invalid JSON", "code": 400})
                    return
                fake._dispatch(self, "POST", body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    # ------------------------------------------------------------------ HTTP
    def _dispatch(self, h: Any, method: str, body: Any) -> None:
        path = h.path.split("?")[0]
        with self.lock:
            self.requests.append((method, path, body))
        c = self.cfg
        info = {"model_path": "fake/GLM-5", "served_model_name": "fake-glm5", "is_generation": True}
        if path == "/model_info":
            if c.legacy_model_info:
                return h._send(404, {"detail": "Not Found"})
            return h._send(200, info)
        if path == "/get_model_info":
            return h._send(200, info)
        if path == "/health":
            return h._send(200, b"")
        if path == "/server_info":
            si = {"tp_size": c.tp_size, "pp_size": 1, "dp_size": 1, "ep_size": 1, "version": c.version,
                  "cuda_graph_max_bs": 256, "max_running_requests": 1024, "internal_states": [{}]}
            si.update(c.extra_server_info)
            return h._send(200, si)
        if path == "/start_profile" and method in ("GET", "POST"):
            return self._start_profile(h, body)
        if path == "/stop_profile" and method in ("GET", "POST"):
            with self.lock:
                if not self.in_progress and self.pending_start is None:
                    return h._send(500, "Internal Server Error")  # RuntimeError("Profiling is not in progress...")
                self.stop_requested = True
            return h._send(200, "Stop profiling. This will take some time.\n")
        if path in ("/v1/completions", "/v1/chat/completions") and method == "POST":
            return self._completion(h, path, body)
        return h._send(404, {"detail": "Not Found"})

    def _start_profile(self, h: Any, body: Any) -> None:
        body = body or {}
        if not isinstance(body, dict):
            return h._send(400, {"object": "error", "message": "body must be an object", "code": 400})
        req: dict[str, Any] = {}
        try:
            for k, v in body.items():
                if k in _FIELDS:  # unknown fields are ignored (extra_behavior="ignore")
                    req[k] = _coerce(k, _FIELDS[k], v)
        except ValueError as e:
            return h._send(400, {"object": "error", "message": f"invalid field {e}", "code": 400})
        with self.lock:
            if self.in_progress or self.pending_start is not None:
                return h._send(500, "Internal Server Error")  # RuntimeError("Profiling is already in progress...")
            # tokenizer side (TokenizerControlMixin.start_profile): effective defaults
            req["with_stack"] = req.get("with_stack") is not False
            req["record_shapes"] = req.get("record_shapes") is not False
            if _vtuple(self.cfg.version) < (0, 5, 16):
                req["profile_id"] = None  # ProfileReqInput had no profile_id
            req["profile_id"] = req.get("profile_id") or str(time.time())
            req.setdefault("activities", None)
            req["activities"] = req["activities"] or ["CPU", "GPU"]
            req["output_dir"] = req.get("output_dir") or "/tmp"
            self.req = req
            start_step, num = req.get("start_step"), req.get("num_steps")
            if start_step:
                self.start_at = max(start_step, self.forward_ct + 1)
                self.target_ct = self.start_at + num if num else None
                self.pending_start = req
            else:
                self.target_ct = self.forward_ct + num + 1 if num else None
                self.pending_start = req  # the scheduler thread starts the profiler on its next iteration
                self.start_at = None
            self.stop_requested = False
        h._send(200, "Start profiling.\n")

    def _completion(self, h: Any, path: str, body: Any) -> None:
        if not isinstance(body, dict):
            return h._send(400, {"object": "error", "message": "bad body", "code": 400})
        text = body.get("prompt") if path.endswith("/completions") and "prompt" in body else \
            " ".join(m.get("content", "") for m in body.get("messages", []))
        pt = len(str(text).split())
        ct = int(body.get("max_tokens") or 16)
        with self.lock:
            self.active_requests += 1
        try:
            time.sleep(self.cfg.completion_s)
        finally:
            with self.lock:
                self.active_requests -= 1
        h._send(200, {"id": "cmpl-fake", "object": "text_completion", "choices": [{"index": 0, "text": "x " * ct}],
                      "usage": {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct}})

    # ------------------------------------------------------------------ scheduler
    def _scheduler(self) -> None:
        import torch

        from tracekit.capture import sglang_plugin

        prof = None
        runner = _Runner()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):  # first start is slow
            torch.randn(2, 2) @ torch.randn(2, 2)
        self._ready.set()
        while not self._quit.is_set():
            with self.lock:
                busy = self.cfg.idle_steps or self.active_requests > 0
                pending, stop_now = self.pending_start, self.stop_requested
            if pending is not None and self.start_at is None and prof is None:
                prof = self._prof_start(pending)
            if prof is not None and stop_now:
                self._prof_stop(prof)
                prof = None
                continue
            if not busy:
                time.sleep(0.01)
                continue
            self.forward_ct += 1
            ct = self.forward_ct
            with self.lock:
                if prof is not None and self.target_ct is not None and self.target_ct <= ct:
                    do_stop = True
                else:
                    do_stop = False
                do_start = self.pending_start is not None and self.start_at is not None and self.start_at == ct
            if do_stop:
                self._prof_stop(prof)
                prof = None
            if do_start and prof is None:
                prof = self._prof_start(self.pending_start)
            bs = 8 + (ct % 4)
            fb = _Batch("DECODE" if ct % 5 else "EXTEND", bs, None if ct % 5 else bs * 64)
            if self.cfg.hook:
                sglang_plugin.forward_hook(_Runner.forward, runner, fb)
            else:
                runner.forward(fb)
            time.sleep(self.cfg.step_s)
        if prof is not None:
            prof.stop()
        del torch

    def _prof_start(self, req: dict[str, Any]) -> Any:
        import torch

        prof = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU],
            with_stack=bool(req["with_stack"]), record_shapes=bool(req["record_shapes"]),
        )
        prof.start()
        with self.lock:
            self.in_progress = True
            self.pending_start = None
        return prof

    def _prof_stop(self, prof: Any) -> None:
        prof.stop()
        fd, tmp = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        prof.export_chrome_trace(tmp)
        trace = json.loads(Path(tmp).read_text())
        os.unlink(tmp)
        req = self.req
        out = Path(req["output_dir"]).expanduser()
        out.mkdir(parents=True, exist_ok=True)
        prefix = (req.get("profile_prefix") + "-") if req.get("profile_prefix") else ""
        for r in range(self.cfg.tp_size):
            if r in self.cfg.missing_ranks:
                continue
            t = dict(trace)
            t["distributedInfo"] = {"backend": "nccl", "rank": r, "world_size": self.cfg.tp_size}
            data = gzip.compress(json.dumps(t).encode())
            path = out / f"{prefix}{req['profile_id']}-TP-{r}.trace.json.gz"
            delay = self.cfg.rank_delays_s[r % len(self.cfg.rank_delays_s)]
            th = threading.Thread(target=self._write_slowly, args=(path, data, delay), daemon=True)
            th.start()
            self.writers.append(th)
        with self.lock:
            self.in_progress = False
            self.stop_requested = False
            self.target_ct = None

    def _write_slowly(self, path: Path, data: bytes, delay: float) -> None:
        time.sleep(delay)
        n = max(1, self.cfg.chunks)
        step = -(-len(data) // n)
        with open(path, "wb") as f:
            for i in range(0, len(data), step):
                f.write(data[i:i + step])
                f.flush()
                time.sleep(self.cfg.chunk_gap_s)
        self.written.append(path)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "FakeSGLang":
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self._sched = threading.Thread(target=self._scheduler, daemon=True)
        self._sched.start()
        if not self._ready.wait(120):
            raise RuntimeError("fake SGLang scheduler did not start")
        return self

    def close(self) -> None:
        self._quit.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self._sched.join(10)
        for th in self.writers:
            th.join(10)

    def __enter__(self) -> "FakeSGLang":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _Mode:
    def __init__(self, name: str) -> None:
        self.name = name


class _Batch:
    """CPU fields of a ForwardBatch (names as in SGLang)."""

    def __init__(self, mode: str, bs: int, extend_num_tokens: int | None) -> None:
        self.forward_mode = _Mode(mode)
        self.batch_size = bs
        self.extend_num_tokens = extend_num_tokens


class _Runner:
    is_draft_worker = False
    tp_rank = 0

    def __init__(self) -> None:
        self.forward_pass_id = 0
        self.w = None

    def forward(self, fb: _Batch, *a: Any, **k: Any) -> Any:
        import torch

        self.forward_pass_id += 1
        name = f"step[{fb.forward_mode.name} bs={fb.batch_size}" + (
            f" toks={fb.extend_num_tokens}]" if fb.forward_mode.name == "EXTEND" else "]")
        with torch.profiler.record_function(name):
            if self.w is None:
                self.w = torch.randn(32, 32)
            x = torch.randn(fb.batch_size, 32)
            for _ in range(2):
                x = torch.relu(x @ self.w)
        return type("Out", (), {"can_run_graph": fb.forward_mode.name == "DECODE"})()
