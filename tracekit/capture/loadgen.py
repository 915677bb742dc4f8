"""Closed-loop load generator for OpenAI-compatible servers (SGLang ``/v1/completions``).

``concurrency`` workers each keep exactly one request in flight (a new one as soon as the previous
returns), so the server sees ``concurrency`` concurrent requests. Prompts are random words (about
one token each) from a seeded RNG; ``max_tokens`` with ``ignore_eos`` (an SGLang extension,
ignored elsewhere) fixes the output length. Everything runs on an asyncio loop in one background
thread with a minimal HTTP/1.1 client (keep-alive, ``Content-Length`` or chunked bodies): standard
library only, and only to the address given.

Measurement: between :meth:`LoadGenerator.mark` and :meth:`LoadGenerator.stop`, completed
requests are counted with the token counts the server reports in ``usage``; latency is per
request, end to end. :func:`parse_levels` reads ``--load 256,512,1024``.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
import urllib.parse
from dataclasses import asdict, dataclass, field
from typing import Any

from tracekit._errors import UsageError

__all__ = ["LoadSpec", "LevelResult", "LoadGenerator", "parse_levels", "summarize"]

_WORDS = (
    "the of and to in is was for on are with as his they be at one have this from or had by word but what "
    "some we can out other were all there when up use your how said an each she which do their time if will "
    "way about many then them write would like so these her long make thing see him two has look more day "
    "could go come did number sound no most people my over know water than call first who may down side been "
    "now find any new work part take get place made live where after back little only round man year came show "
    "every good me give our under name very through just form sentence great think say help low line differ "
    "turn cause much mean before move right boy old too same tell does set three want air well also play small "
    "end put home read hand port large spell add even land here must big high such follow act why ask men change"
).split()


@dataclass(frozen=True)
class LoadSpec:
    """One load level. ``endpoint`` is ``completions`` or ``chat``."""

    concurrency: int
    prompt_tokens: int = 256
    max_tokens: int = 128
    endpoint: str = "completions"
    model: str | None = None
    ignore_eos: bool = True
    temperature: float = 0.0
    seed: int = 0
    request_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise UsageError(f"--load {self.concurrency}: concurrency must be >= 1")
        if self.prompt_tokens < 1 or self.max_tokens < 1:
            raise UsageError("--prompt-tokens and --max-tokens must be >= 1")
        if self.endpoint not in ("completions", "chat"):
            raise UsageError(f"--load-endpoint {self.endpoint!r}: use completions or chat")


@dataclass
class LevelResult:
    """What one load level achieved over its measurement window (JSON-ready via ``to_json``)."""

    concurrency: int
    window_s: float
    requests_ok: int
    requests_failed: int
    prompt_tokens: int
    completion_tokens: int
    requests_per_s: float
    output_tokens_per_s: float
    total_tokens_per_s: float
    latency_ms_mean: float | None
    latency_ms_p50: float | None
    latency_ms_p90: float | None
    latency_ms_p99: float | None
    errors: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def parse_levels(text: str | int | None) -> list[int]:
    """``"256,512,1024"`` -> [256, 512, 1024]; None/"" -> []."""
    if text is None or text == "":
        return []
    if isinstance(text, int):
        return [text]
    out = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        try:
            n = int(part)
        except ValueError:
            raise UsageError(f"--load {text!r}: expected N or N1,N2,... (integers)") from None
        if n < 1:
            raise UsageError(f"--load {text!r}: concurrency must be >= 1")
        out.append(n)
    return out


def _percentile(sorted_vals: list[float], q: float) -> float | None:
    if not sorted_vals:
        return None
    i = min(len(sorted_vals) - 1, max(0, int(round(q * (len(sorted_vals) - 1)))))
    return sorted_vals[i]


def summarize(concurrency: int, window_s: float, done: list[tuple[float, int, int]], failed: int, errors: list[str]) -> LevelResult:
    """Build a :class:`LevelResult` from (latency_s, prompt_tokens, completion_tokens) per request."""
    lat = sorted(d[0] * 1e3 for d in done)
    pt = sum(d[1] for d in done)
    ct = sum(d[2] for d in done)
    w = max(window_s, 1e-9)
    return LevelResult(
        concurrency=concurrency,
        window_s=window_s,
        requests_ok=len(done),
        requests_failed=failed,
        prompt_tokens=pt,
        completion_tokens=ct,
        requests_per_s=len(done) / w,
        output_tokens_per_s=ct / w,
        total_tokens_per_s=(pt + ct) / w,
        latency_ms_mean=(sum(lat) / len(lat)) if lat else None,
        latency_ms_p50=_percentile(lat, 0.5),
        latency_ms_p90=_percentile(lat, 0.9),
        latency_ms_p99=_percentile(lat, 0.99),
        errors=errors[:5],
    )


class _Conn:
    """One keep-alive HTTP/1.1 connection (asyncio streams)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            try:
                await self.writer.wait_closed()
            except OSError:
                pass
        self.reader = self.writer = None

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: keep-alive\r\n\r\n"
        ).encode()
        self.writer.write(head + body)
        await self.writer.drain()
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionError("server closed the connection")
        status = int(status_line.split()[1])
        headers: dict[str, str] = {}
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            k, _, v = line.decode("latin-1").partition(":")
            headers[k.strip().lower()] = v.strip()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int((await self.reader.readline()).split(b";")[0], 16)
                if size == 0:
                    await self.reader.readline()
                    break
                chunks.append(await self.reader.readexactly(size))
                await self.reader.readline()
            data = b"".join(chunks)
        elif "content-length" in headers:
            data = await self.reader.readexactly(int(headers["content-length"]))
        else:
            data = await self.reader.read()
            await self.close()
        if headers.get("connection", "").lower() == "close":
            await self.close()
        return status, data


class LoadGenerator:
    """Drive ``spec.concurrency`` concurrent requests against ``url`` from a background thread.

    ``start()`` → (warm-up) → ``mark()`` → ... → ``stop()`` → :class:`LevelResult`. ``stop`` stops
    issuing requests at once and waits at most ``drain_s`` for in-flight ones (they are cancelled
    after that), so a capture is bounded in time.
    """

    def __init__(self, url: str, spec: LoadSpec, *, drain_s: float = 5.0) -> None:
        u = urllib.parse.urlsplit(url)
        if u.scheme != "http" or not u.hostname:
            raise UsageError(f"{url}: load generation needs an http://HOST:PORT address")
        self.host, self.port = u.hostname, u.port or 80
        self.base_path = u.path.rstrip("/")
        self.spec = spec
        self.drain_s = drain_s
        self._rng = random.Random(spec.seed)
        self._lock = threading.Lock()
        self._done: list[tuple[float, int, int]] = []
        self._failed = 0
        self._errors: list[str] = []
        self._mark_t: float | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.in_flight = 0
        self.completed_total = 0

    # -- request body
    def _prompt(self) -> str:
        return " ".join(self._rng.choice(_WORDS) for _ in range(self.spec.prompt_tokens))

    def _body(self) -> tuple[str, bytes]:
        s = self.spec
        obj: dict[str, Any] = {"max_tokens": s.max_tokens, "temperature": s.temperature, "stream": False}
        if s.ignore_eos:
            obj["ignore_eos"] = True
        if s.model:
            obj["model"] = s.model
        if s.endpoint == "chat":
            obj["messages"] = [{"role": "user", "content": self._prompt()}]
            path = "/v1/chat/completions"
        else:
            obj["prompt"] = self._prompt()
            path = "/v1/completions"
        return self.base_path + path, json.dumps(obj).encode()

    # -- lifecycle
    def start(self) -> "LoadGenerator":
        self._thread = threading.Thread(target=self._run, name="tracekit-loadgen", daemon=True)
        self._thread.start()
        return self

    def mark(self) -> None:
        """Start the measurement window (discard what completed before)."""
        with self._lock:
            self._done.clear()
            self._failed = 0
            self._errors.clear()
            self._mark_t = time.monotonic()

    def stop(self) -> LevelResult:
        with self._lock:
            t_end = time.monotonic()
            done, failed, errors = list(self._done), self._failed, list(self._errors)
            t0 = self._mark_t if self._mark_t is not None else t_end
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(self.drain_s + 5.0)
        return summarize(self.spec.concurrency, t_end - t0, done, failed, errors)

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main())
        finally:
            loop.close()

    async def _main(self) -> None:
        workers = [asyncio.ensure_future(self._worker()) for _ in range(self.spec.concurrency)]
        while not self._stopping.is_set():
            await asyncio.sleep(0.05)
        _done, pending = await asyncio.wait(workers, timeout=self.drain_s)
        for w in pending:
            w.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    async def _worker(self) -> None:
        conn = _Conn(self.host, self.port)
        try:
            while not self._stopping.is_set():
                path, body = self._body()
                t0 = time.monotonic()
                self.in_flight += 1
                try:
                    status, data = await asyncio.wait_for(conn.post(path, body), self.spec.request_timeout_s)
                except (OSError, ConnectionError, asyncio.TimeoutError, ValueError, IndexError,
                        asyncio.IncompleteReadError) as e:
                    await conn.close()
                    self._fail(f"{type(e).__name__}: {e}")
                    await asyncio.sleep(0.2)  # do not spin on a dead server
                    continue
                finally:
                    self.in_flight -= 1
                lat = time.monotonic() - t0
                if status != 200:
                    self._fail(f"HTTP {status}: {data[:200].decode('utf-8', 'replace')}")
                    continue
                try:
                    usage = json.loads(data).get("usage") or {}
                    pt = int(usage.get("prompt_tokens") or 0)
                    ct = int(usage.get("completion_tokens") or 0)
                except (ValueError, AttributeError, TypeError):
                    self._fail("response without JSON usage")
                    continue
                with self._lock:
                    self._done.append((lat, pt, ct))
                    self.completed_total += 1
        finally:
            await conn.close()

    def _fail(self, msg: str) -> None:
        with self._lock:
            self._failed += 1
            if len(self._errors) < 20:
                self._errors.append(msg)
