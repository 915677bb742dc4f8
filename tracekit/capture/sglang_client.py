"""Attach to a running SGLang server and capture it through its profile API.

Contract (checked against sglang 0.5.23, see ``docs/sglang_integration.md``):
``GET /model_info`` identifies the server cheaply, ``GET /health`` checks it,
``GET /server_info`` is saved into the run metadata, ``POST /start_profile``
(a ``ProfileReq`` JSON body) starts the profiler on every scheduler rank and
returns *before* any trace exists, ``POST /stop_profile`` stops it; each rank
then writes ``<profile_id>-TP-<r>[...].trace.json.gz`` into ``output_dir``.

The client talks only to the address it is given and uses the standard
library (``urllib``) only.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from tracekit._errors import CaptureError, OutputError, Quality, UsageError
from tracekit.sglang_names import parse_sglang_name

__all__ = [
    "DEFAULT_URL",
    "detect_server",
    "Capabilities",
    "capabilities",
    "check_server",
    "build_profile_request",
    "rank_files",
    "expected_ranks",
    "wait_for_traces",
    "missing_ranks",
    "missing_ranks_quality",
    "graph_attribution_note",
    "capture_sglang",
    "SGLangCaptureResult",
    "LevelCapture",
]

DEFAULT_URL = "http://127.0.0.1:30000"


def _http(url: str, path: str, *, method: str = "GET", body: dict[str, Any] | None = None,
          timeout_s: float = 10.0) -> tuple[int, bytes]:
    """One HTTP request; returns (status, body). Raises OSError-family on transport failure."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url.rstrip("/") + path, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    # No proxies: capture talks only to the address it was given.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=timeout_s) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        try:
            payload = e.read()
        except OSError:
            payload = b""
        return e.code, payload


def detect_server(url: str = DEFAULT_URL, timeout_s: float = 0.5) -> bool:
    """True when an SGLang server answers at ``url`` within ``timeout_s``.

    Uses ``GET /model_info`` (``/get_model_info`` on older servers): it answers
    from the HTTP process without a scheduler round trip, unlike ``/health``,
    which in 0.5.23 runs a one-token generation and takes >= 1 s. A JSON
    object with ``model_path`` identifies SGLang. Never raises.
    """
    for path in ("/model_info", "/get_model_info"):
        try:
            status, payload = _http(url, path, timeout_s=timeout_s)
        except (OSError, ValueError):
            return False
        if status == 404:
            continue
        if status != 200:
            return False
        try:
            obj = json.loads(payload)
        except ValueError:
            return False
        return isinstance(obj, dict) and "model_path" in obj
    return False


# ============================================================== server checks and capabilities


def _vtuple(v: Any) -> tuple[int, ...] | None:
    """"0.5.23", "0.5.16.post1", "0.5.23+fake" -> (0, 5, 23); None when unparseable."""
    if not isinstance(v, str):
        return None
    out = []
    for p in v.split("+")[0].split("."):
        m = re.match(r"\d+", p)
        if m is None:
            break
        out.append(int(m.group()))
        if m.end() != len(p):
            break
    return tuple(out) or None


@dataclass(frozen=True)
class Capabilities:
    """What the server supports, from ``/server_info``'s ``version`` (docs/sglang.md §11)."""

    version: str | None
    profile_id: bool  # client-settable ProfileReq.profile_id (~0.5.16+)
    step_spans: bool | None  # step[...] record_function per forward (~0.5.12+); None = unknown
    plugins: bool | None  # sglang.srt.plugins entry points (0.5.11+)
    detailed_annotations: bool | None  # by 0.5.20

    def notes(self) -> list[Quality]:
        """Quality notes for what is unavailable on this server."""
        q: list[Quality] = []
        ver = self.version or "unknown"
        if self.version is None:
            q.append(Quality("sglang_version_unknown", "server did not report its version; assuming an old SGLang "
                             "(no client-set profile_id; files found by globbing the fresh output_dir)", "info"))
        if not self.profile_id:
            q.append(Quality("sglang_no_profile_id", f"SGLang {ver} does not accept a client profile_id "
                             "(needs ~0.5.16); trace files are found by globbing the fresh output_dir", "info"))
        if self.step_spans is False:
            q.append(Quality("sglang_no_step_spans", f"SGLang {ver} emits no step[...] span per forward (needs ~0.5.12); "
                             "run the server with `tracekit launch -- python -m sglang.launch_server ...` for tk.fwd ranges"))
        if self.plugins is False:
            q.append(Quality("sglang_no_plugins", f"SGLang {ver} has no plugin system (needs 0.5.11); tracekit's forward "
                             "hook needs `tracekit launch` (sitecustomize import hook)", "info"))
        return q


def capabilities(server_info: dict[str, Any]) -> Capabilities:
    """Version gates from ``/server_info`` (``{}`` when the endpoint failed)."""
    ver = server_info.get("version") if isinstance(server_info, dict) else None
    vt = _vtuple(ver)
    if vt is None:
        return Capabilities(None, False, None, None, None)
    return Capabilities(ver, vt >= (0, 5, 16), vt >= (0, 5, 12), vt >= (0, 5, 11), vt >= (0, 5, 20))


def _get_json(url: str, path: str, timeout_s: float) -> dict[str, Any]:
    status, payload = _request(url, path, timeout_s=timeout_s)
    if status != 200:
        raise CaptureError(f"{url}{path}: HTTP {status} {_snippet(payload)}")
    try:
        obj = json.loads(payload)
    except ValueError:
        raise CaptureError(f"{url}{path}: answer is not JSON; is this an SGLang server?") from None
    return obj if isinstance(obj, dict) else {"value": obj}


def _snippet(payload: bytes, n: int = 200) -> str:
    return payload[:n].decode("utf-8", "replace").strip().replace("\n", " ")


def _request(url: str, path: str, *, method: str = "GET", body: dict[str, Any] | None = None,
             timeout_s: float = 10.0) -> tuple[int, bytes]:
    """:func:`_http` with transport failures turned into one-line CaptureErrors."""
    try:
        return _http(url, path, method=method, body=body, timeout_s=timeout_s)
    except urllib.error.URLError as e:
        reason = getattr(e, "reason", e)
        raise CaptureError(f"cannot reach SGLang at {url} ({reason}); start the server or pass --sglang URL") from None
    except (TimeoutError, socket.timeout):
        raise CaptureError(f"{url}{path}: no answer within {timeout_s:g}s; is the server overloaded or hung?") from None
    except (ConnectionError, http.client.HTTPException, OSError) as e:
        raise CaptureError(f"cannot reach SGLang at {url} ({type(e).__name__}: {e}); start the server or pass --sglang URL") from None
    except ValueError as e:
        raise CaptureError(f"{url}: not a valid server address ({e}); use http://HOST:PORT") from None


def check_server(url: str, *, health_timeout_s: float = 30.0) -> dict[str, Any]:
    """``GET /health`` (must be 200) then ``GET /server_info`` (returned; ``{}`` if it fails).

    Raises CaptureError when the server is unreachable or unhealthy.
    """
    status, payload = _request(url, "/health", timeout_s=health_timeout_s)
    if status != 200:
        raise CaptureError(f"SGLang at {url} is not healthy (GET /health: HTTP {status} {_snippet(payload)}); "
                           "wait until it has started, or check its log")
    try:
        return _get_json(url, "/server_info", timeout_s=health_timeout_s)
    except CaptureError:
        try:
            return _get_json(url, "/get_server_info", timeout_s=health_timeout_s)
        except CaptureError:
            return {}


# ============================================================== profile request and trace files


def build_profile_request(output_dir: str, *, caps: Capabilities, profile_id: str, num_steps: int | None = None,
                          start_step: int | None = None, with_stack: bool = False, record_shapes: bool = False,
                          activities: Sequence[str] = ("CPU", "GPU")) -> dict[str, Any]:
    """The ``ProfileReq`` JSON tracekit sends: explicit fields, integers as integers.

    ``with_stack``/``record_shapes`` are always sent (the server defaults are True);
    ``profile_id`` only where the server accepts it.
    """
    body: dict[str, Any] = {
        "output_dir": output_dir,
        "activities": list(activities),
        "with_stack": bool(with_stack),
        "record_shapes": bool(record_shapes),
    }
    if num_steps is not None:
        if int(num_steps) < 1:
            raise UsageError(f"--steps {num_steps}: must be >= 1")
        body["num_steps"] = int(num_steps)
    if start_step is not None:
        body["start_step"] = int(start_step)
    if caps.profile_id:
        body["profile_id"] = profile_id
    return body




def rank_files(directory: Path, profile_id: str | None = None) -> dict[tuple[int, int, int], Path]:
    """``{(tp, dp, pp): path}`` for ``[prefix-]<id>-TP-<r>[-DP-d][-PP-p][-EP-e][-STAGE].trace.json.gz``.

    With ``profile_id`` only that id's files count (``merged-*`` files never do).
    """
    out: dict[tuple[int, int, int], Path] = {}
    for p in sorted(directory.glob("*-TP-*.trace.json.gz")):
        if p.name.startswith("merged-"):
            continue
        if profile_id is not None and f"{profile_id}-TP-" not in p.name:
            continue
        m = parse_sglang_name(p.name)  # the one file-name grammar (tracekit.sglang_names)
        if m is None:
            continue
        key = (m.tp, m.dp or 0, m.pp or 0)
        out[key] = p
    return out


def expected_ranks(server_info: dict[str, Any]) -> set[tuple[int, int]] | None:
    """``{(tp, pp)}`` every capture must contain, from ``tp_size``/``pp_size``; None if unknown."""
    try:
        tp = int(server_info["tp_size"])
    except (KeyError, TypeError, ValueError):
        return None
    try:
        pp = int(server_info.get("pp_size") or 1)
    except (TypeError, ValueError):
        pp = 1
    return {(t, p) for t in range(tp) for p in range(pp)}


def _rank_label(tp: int, pp: int) -> str:
    return f"TP-{tp}" + (f"-PP-{pp}" if pp else "")


def wait_for_traces(directory: Path, *, expected: set[tuple[int, int]] | None, profile_id: str | None,
                    timeout_s: float, stable_s: float = 1.0, poll_s: float = 0.2,
                    clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                    on_poll: Callable[[int], None] | None = None, allow_missing: bool = False) -> list[Path]:
    """Poll ``directory`` until every expected rank's trace exists with a size unchanged for ``stable_s``.

    Files appear at different times per rank and grow while they are written. Without ``expected``
    it waits until at least one file exists and no file appeared or grew for ``stable_s``.
    Raises CaptureError naming the missing ranks (or "no trace files") after ``timeout_s``; with
    ``allow_missing`` it returns the complete files that did arrive instead (the caller names the
    missing ranks, see :func:`missing_ranks`) and raises only when there are none.
    """
    t_end = clock() + timeout_s
    sizes: dict[Path, tuple[int, float]] = {}
    while True:
        now = clock()
        found = rank_files(directory, profile_id)
        stable = True
        for p in found.values():
            try:
                sz = p.stat().st_size
            except FileNotFoundError:
                stable = False
                continue
            prev = sizes.get(p)
            if prev is None or prev[0] != sz:
                sizes[p] = (sz, now)
                stable = False
            elif sz == 0 or now - prev[1] < stable_s:
                stable = False
        have = {(tp, pp) for (tp, _dp, pp) in found}
        missing = sorted(expected - have) if expected is not None else []
        if on_poll is not None:
            on_poll(len(found))
        if found and stable and not missing:
            return [found[k] for k in sorted(found)]
        if now >= t_end:
            if not found:
                raise CaptureError(f"no SGLang trace files (*-TP-*.trace.json.gz) in {directory} after {timeout_s:g}s; "
                                   "does the server write to this path (same host/filesystem)? raise --poll-timeout "
                                   "for large traces, or check the server log")
            if missing and allow_missing and stable:
                return [found[k] for k in sorted(found)]
            if missing:
                names = ", ".join(_rank_label(t, p) for t, p in missing)
                raise CaptureError(f"missing trace files for rank(s) {names} in {directory} after {timeout_s:g}s "
                                   f"({len(found)} present); check those ranks in the server log, or raise --poll-timeout")
            raise CaptureError(f"trace files in {directory} still growing after {timeout_s:g}s; raise --poll-timeout")
        sleep(poll_s)


def missing_ranks(files: Sequence[Path], expected: set[tuple[int, int]] | None) -> list[tuple[int, int]]:
    """The expected ``(tp, pp)`` ranks without a file among ``files`` (sorted; empty when unknown)."""
    if expected is None:
        return []
    have = set()
    for f in files:
        m = parse_sglang_name(f.name)
        if m is not None:
            have.add((m.tp, m.pp or 0))
    return sorted(expected - have)


def missing_ranks_quality(missing: Sequence[tuple[int, int]], expected: int, directory: Path,
                          waited_s: float) -> Quality:
    """The ``missing_ranks`` flag of a partial SGLang capture: ranks by number, where, how long."""
    labels = [_rank_label(t, p) for t, p in missing]
    return Quality(
        "missing_ranks",
        f"SGLang rank(s) {', '.join(labels)} of {expected} wrote no trace file in {directory} within {waited_s:g}s "
        f"after the profile stopped; the trace holds the other {expected - len(missing)} rank(s) only (check those "
        "ranks in the server log, or raise --poll-timeout)",
        details={"missing": [t for t, _p in missing], "missing_labels": labels, "expected_ranks": expected},
    )


# ============================================================== CUDA-graph attribution


def graph_attribution_note(df: Any) -> Quality | None:
    """A quality note when GPU ops ran from CUDA-graph replays (``graph_id`` set), else None.

    Graph-replayed kernels share their ``cudaGraphLaunch``'s correlation id, so they are attributed
    to the forward step that launched them, but nothing per layer or module exists at replay
    (record_function, NVTX and forward hooks run only at graph capture). The note gives the share
    of GPU time concerned and how to get layer-level attribution: a mapping capture with graphs off.
    """
    import polars as pl

    need = {"kind", "graph_id", "dur_ns"}
    if not need <= set(df.columns):
        return None
    gpu = df.filter(pl.col("kind").cast(pl.String).is_in(["kernel", "memcpy", "memset"]))
    if gpu.height == 0:
        return None
    g = gpu.filter(pl.col("graph_id").is_not_null())
    if g.height == 0:
        return None
    total = int(gpu["dur_ns"].sum() or 0)
    gdur = int(g["dur_ns"].sum() or 0)
    frac = gdur / total if total else 0.0
    no_step = int(g["step_id"].is_null().sum()) if "step_id" in g.columns else g.height
    msg = (f"{frac:.0%} of GPU time ({g.height} kernels) ran from CUDA-graph replays: attributed to the forward step "
           "that launched them, but layer/module attribution is impossible (nothing per layer exists at replay). "
           "For it, take a mapping capture with graphs off: relaunch SGLang with --cuda-graph-backend-decode=disabled "
           "(or --disable-decode-cuda-graph; prefill: --cuda-graph-backend-prefill=disabled) and "
           "--enable-layerwise-nvtx-marker, then capture again")
    if no_step:
        msg += f"; {no_step} graph kernels have no step (launched outside any forward range)"
    return Quality("graph_no_layer_attribution", msg, "info",
                   details={"graph_kernels": g.height, "graph_gpu_time_frac": round(frac, 4),
                            "graph_kernels_without_step": no_step})


# ============================================================== capture


@dataclass
class LevelCapture:
    """One captured level: the trace written, the load it ran under, its profile files."""

    out: Path
    load: dict[str, Any] | None
    files: list[Path]
    profile_dir: Path
    profile_request: dict[str, Any]
    window_ns: tuple[int, int]
    convert: Any = None
    #: Ctrl-C stopped this level early (what was collected was still converted)
    interrupted: bool = False


@dataclass
class SGLangCaptureResult:
    """Result of :func:`capture_sglang`; ``levels`` has one entry per load level (one without load)."""

    url: str
    server_info: dict[str, Any]
    capabilities: Capabilities
    levels: list[LevelCapture] = field(default_factory=list)
    quality: list[Quality] = field(default_factory=list)

    @property
    def interrupted(self) -> bool:
        """Whether Ctrl-C stopped the capture (the levels captured so far were kept)."""
        return any(lv.interrupted for lv in self.levels)

    @property
    def out(self) -> Path:
        return self.levels[0].out

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "sglang_version": self.capabilities.version,
            "levels": [
                {"out": str(lv.out), "load": lv.load, "files": [str(f) for f in lv.files],
                 "profile_dir": str(lv.profile_dir), "window_ns": list(lv.window_ns)}
                for lv in self.levels
            ],
            "quality": [q.to_json() for q in self.quality],
        }


def _is_local(url: str) -> bool:
    host = urllib.parse.urlsplit(url).hostname or ""
    return host in ("127.0.0.1", "localhost", "::1") or host.startswith("127.")


def level_outputs(out: Path, levels: Sequence[int]) -> list[Path]:
    """The files a capture with these load levels writes: ``out`` itself, or ``<stem>-load<N>.parquet`` per level
    when there are several."""
    return [_level_out(Path(out), lv, len(levels) > 1) for lv in (list(levels) or [0])]


def _level_out(out: Path, level: int, many: bool) -> Path:
    if not many:
        return out
    suffix = out.suffix or ".parquet"
    return out.with_name(f"{out.stem}-load{level}{suffix}")


class _Telemetry:
    """Local GPU telemetry for the server's GPUs, if a driver (NVML) exists."""

    def __init__(self, server_info: dict[str, Any], notes: list[Quality], log: Callable[[str], None]) -> None:
        from tracekit.capture.telemetry import TelemetrySampler

        self.samplers: list[Any] = []
        try:
            tp = int(server_info.get("tp_size") or 1)
            base = int(server_info.get("base_gpu_id") or 0)
            step = int(server_info.get("gpu_id_step") or 1)
        except (TypeError, ValueError):
            tp, base, step = 1, 0, 1
        said: list[str] = []
        for r in range(tp):
            s = TelemetrySampler(rank=r, device=base + r * step, log=said.append)
            if not s.open():
                break
            self.samplers.append(s)
        if not self.samplers:
            notes.append(Quality("telemetry_unavailable", "no GPU telemetry" + (f" ({said[0]})" if said else ""), "info"))

    def start(self) -> None:
        for s in self.samplers:
            s.start()

    def stop(self) -> Any:
        import polars as pl

        from tracekit.schema import conform

        frames = []
        for s in self.samplers:
            s.stop()
            rows = s.to_rows()
            if rows["ts_ns"]:
                frames.append(conform(pl.DataFrame(rows)))
        return pl.concat(frames) if frames else None


def _start_profile(url: str, body: dict[str, Any], timeout_s: float) -> None:
    status, payload = _request(url, "/start_profile", method="POST", body=body, timeout_s=timeout_s)
    if status == 200:
        return
    text = _snippet(payload)
    if status == 500:
        raise CaptureError(
            f"SGLang refused /start_profile (HTTP 500 {text or 'Internal Server Error'}): most likely a profile is "
            "already running (SGLang: 'Profiling is already in progress. Call /stop_profile first.'); wait for it to "
            f"finish or POST {url.rstrip('/')}/stop_profile, then retry")
    if status in (401, 403):
        raise CaptureError(f"SGLang refused /start_profile (HTTP {status} {text}): the server needs an admin API key")
    raise CaptureError(f"SGLang rejected /start_profile (HTTP {status} {text})")


def _stop_profile(url: str, timeout_s: float) -> tuple[bool, str]:
    """POST /stop_profile; (True, "") when it stopped a profile, (False, why) otherwise. Never raises CaptureError."""
    try:
        status, payload = _request(url, "/stop_profile", method="POST", timeout_s=timeout_s)
    except CaptureError as e:
        return False, str(e)
    if status == 200:
        return True, ""
    return False, f"HTTP {status} {_snippet(payload)}"


def capture_sglang(
    url: str,
    duration_s: float,
    out: str | Path,
    *,
    num_steps: int | None = None,
    start_step: int | None = None,
    with_stack: bool = False,
    record_shapes: bool = False,
    output_dir: str | Path | None = None,
    poll_timeout_s: float = 300.0,
    load: int | str | Sequence[int] | None = None,
    load_spec: Any = None,
    load_warmup_s: float = 5.0,
    step_dir: str | Path | None = None,
    telemetry: bool = True,
    force: bool = False,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
) -> SGLangCaptureResult:
    """Capture a running SGLang server into ``trace.parquet`` (one file per load level).

    Steps: ``GET /health`` and ``/server_info`` (saved as ``sglang_server_info``), version gates;
    optional load at each level of ``load`` (``--load 256,512,1024`` writes ``<stem>-load<N>.parquet``
    per level); ``POST /start_profile`` with a fresh unique ``output_dir`` and explicit fields;
    local GPU telemetry meanwhile; ``/stop_profile`` after ``duration_s`` — always, also on Ctrl-C
    or an error, unless ``num_steps`` made the server stop by itself; wait until every rank's file
    exists with a stable size; convert all ranks with the step records of ``step_dir`` (``tracekit
    launch``) and telemetry merged in. A rank whose file never appears within ``poll_timeout_s`` does
    not lose the others: they are converted, the trace is flagged ``missing_ranks`` (rank numbers in
    ``details["missing"]``) and a ``warning: partial trace`` line is logged; the call returns
    normally (the CLI exits 0). No file at all raises CaptureError. ``output_dir`` is where the
    *server* writes (a unique subdirectory is made in it; default: the system temp dir), so it must
    be a path both see.
    """
    warn = log or (lambda m: print(f"tracekit: {m}", file=sys.stderr, flush=True))  # also without progress
    say = log or (warn if progress else (lambda m: None))
    levels, outs = _level_outputs_checked(Path(out), load, force)
    if duration_s <= 0 and num_steps is None:
        raise UsageError("give a positive --duration or --steps")

    info = check_server(url)
    caps = capabilities(info)
    result = SGLangCaptureResult(url=url, server_info=info, capabilities=caps)
    result.quality.extend(caps.notes())
    if not info:
        result.quality.append(Quality("sglang_no_server_info", "GET /server_info failed; rank count unknown, "
                                      "waiting for the files to settle instead"))
    model = _served_model(url)
    say(f"SGLang {caps.version or '(version unknown)'} at {url}, tp_size={info.get('tp_size', '?')}")
    plan = _LevelPlan(url=url, info=info, caps=caps, duration_s=duration_s, num_steps=num_steps, start_step=start_step,
                      with_stack=with_stack, record_shapes=record_shapes,
                      base_dir=Path(output_dir) if output_dir is not None else Path(tempfile.gettempdir()),
                      poll_timeout_s=poll_timeout_s, warmup_s=load_warmup_s, step_dir=step_dir,
                      telemetry=telemetry and _is_local(url), force=force, say=say, warn=warn)
    for lv, o in zip(levels or [0], outs):
        result.levels.append(_capture_level(plan, o, _level_spec(lv, load_spec, model), result.quality))
        if result.levels[-1].interrupted:
            break  # Ctrl-C: the levels not started yet are not run
    if telemetry and not _is_local(url):
        result.quality.append(Quality("telemetry_remote", f"no GPU telemetry: {url} is not this machine", "info"))
    return result


def _level_outputs_checked(out: Path, load: int | str | Sequence[int] | None, force: bool) -> tuple[list[int], list[Path]]:
    """The load levels and the file each writes; OutputError before any work when one cannot be written."""
    from tracekit.capture.loadgen import parse_levels

    levels = parse_levels(load) if load is None or isinstance(load, (str, int)) else [int(x) for x in load]
    outs = level_outputs(out, levels)
    for o in outs:
        if o.exists() and not force:
            raise OutputError(f"{o}: exists; pass --force to overwrite")
        if not o.parent.exists():
            raise OutputError(f"{o}: directory {o.parent} does not exist; create it first")
    return levels, outs


def _served_model(url: str) -> Any:
    try:
        return _get_json(url, "/model_info", 5.0).get("served_model_name")
    except CaptureError:
        return None


def _level_spec(level: int, load_spec: Any, model: Any) -> Any:
    """The load of one level (None: no load): ``load_spec`` at this level's concurrency, the served model by default."""
    from tracekit.capture.loadgen import LoadSpec

    if not level:
        return None
    spec = load_spec if isinstance(load_spec, LoadSpec) else LoadSpec(concurrency=level)
    if spec.concurrency != level or (model and not spec.model):
        spec = replace(spec, concurrency=level, model=spec.model or model)
    return spec


@dataclass(frozen=True)
class _LevelPlan:
    """What every level of one :func:`capture_sglang` call shares."""

    url: str
    info: dict[str, Any]
    caps: Capabilities
    duration_s: float
    num_steps: int | None
    start_step: int | None
    with_stack: bool
    record_shapes: bool
    base_dir: Path
    poll_timeout_s: float
    warmup_s: float
    step_dir: Any
    telemetry: bool
    force: bool
    say: Callable[[str], None]
    warn: Callable[[str], None]


@dataclass
class _Profiled:
    """What one profile window gave: its bounds, the files (when the server stopped by itself), the side data."""

    t0_ns: int
    t1_ns: int = 0
    files: list[Path] | None = None
    interrupted: bool = False
    load: dict[str, Any] | None = None
    telemetry: Any = None


def _new_profile_dir(base_dir: Path) -> tuple[str, Path]:
    profile_id = f"tracekit-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
    run_dir = (base_dir / profile_id).resolve()
    try:
        run_dir.mkdir(parents=True, exist_ok=False)
    except OSError as e:
        raise OutputError(f"{run_dir}: cannot create the profile directory ({e}); pass --output-dir") from None
    return profile_id, run_dir


def _capture_level(plan: _LevelPlan, out: Path, spec: Any, quality: list[Quality]) -> LevelCapture:
    """Profile one level (under ``spec``'s load, if any), collect every rank's file and convert them to ``out``."""
    profile_id, run_dir = _new_profile_dir(plan.base_dir)
    body = build_profile_request(str(run_dir), caps=plan.caps, profile_id=profile_id, num_steps=plan.num_steps,
                                 start_step=plan.start_step, with_stack=plan.with_stack,
                                 record_shapes=plan.record_shapes)
    expected = expected_ranks(plan.info)
    notes: list[Quality] = []
    got = _profile_window(plan, body, run_dir, spec, expected, notes)
    plan.say("waiting for the trace files of every rank")
    files = got.files
    if files is None:
        files = wait_for_traces(run_dir, expected=expected, profile_id=None, timeout_s=plan.poll_timeout_s,
                                allow_missing=True)
    missing = missing_ranks(files, expected)
    if missing:
        notes.append(missing_ranks_quality(missing, len(expected or ()), run_dir, plan.poll_timeout_s))
    # the profile id is only checked in the names: the dir is fresh, all of it is globbed
    if plan.caps.profile_id and not all(f.name.startswith(profile_id) or f"-{profile_id}-" in f.name for f in files):
        notes.append(Quality("sglang_profile_id_ignored", "the server ignored the client profile_id", "info"))
    extra = [f for f in [got.telemetry] if f is not None]
    if plan.step_dir is not None:
        extra.extend(_step_records(plan.step_dir, got, notes))
    if got.interrupted:
        notes.append(Quality("capture_interrupted", "capture stopped early by Ctrl-C; kept what was collected", "info"))
    quality.extend(notes)
    meta = {
        "sglang_server_info": plan.info,
        "capture": {"target": plan.url, "mode": "sglang", "duration_s": (got.t1_ns - got.t0_ns) / 1e9,
                    "window_ns": [got.t0_ns, got.t1_ns], "profile_request": body, "profile_dir": str(run_dir),
                    "load": got.load, "sglang_version": plan.caps.version},
        "quality": [q.to_json() for q in notes],
    }
    plan.say(f"converting {len(files)} rank file(s) -> {out}")
    conv = _convert(files, out, extra_frames=extra, metadata=meta, force=plan.force)
    if missing:
        labels = ", ".join(_rank_label(t, p) for t, p in missing)
        plan.warn(f"warning: partial trace: SGLang rank(s) {labels} wrote no trace file within "
                  f"{plan.poll_timeout_s:g}s; wrote {out} with the other {len(files)} rank(s), flagged missing_ranks")
    return LevelCapture(out=out, load=got.load, files=files, profile_dir=run_dir, profile_request=body,
                        window_ns=(got.t0_ns, got.t1_ns), convert=conv, interrupted=got.interrupted)


def _profile_window(plan: _LevelPlan, body: dict[str, Any], run_dir: Path, spec: Any,
                    expected: set[tuple[int, int]] | None, notes: list[Quality]) -> _Profiled:
    """Load and telemetry on, ``/start_profile``, the duration (or the steps), then ``/stop_profile``: always, also
    on Ctrl-C or an error, unless the server stopped by itself; the load and telemetry stopped after."""
    from tracekit.capture.loadgen import LoadGenerator

    say = plan.say
    tel = _Telemetry(plan.info, notes, say) if plan.telemetry else None
    gen = LoadGenerator(plan.url, spec) if spec is not None else None
    got = _Profiled(t0_ns=time.time_ns())
    started = False
    try:
        if gen is not None:
            say(f"load: {spec.concurrency} concurrent requests ({spec.endpoint}, prompt~{spec.prompt_tokens}, "
                f"max_tokens={spec.max_tokens}); warming up {plan.warmup_s:g}s")
            gen.start()
            time.sleep(plan.warmup_s)
            gen.mark()
        if tel is not None:
            tel.start()
        got.t0_ns = time.time_ns()
        _start_profile(plan.url, body, timeout_s=60.0)
        started = True
        say(f"profiling into {run_dir} " + (f"for {plan.num_steps} steps" if plan.num_steps
                                             else f"for {plan.duration_s:g}s"))
        _profile_runs(plan, run_dir, gen, expected, got, notes)
    finally:
        if started and got.files is None:
            ok, why = _stop_profile(plan.url, timeout_s=plan.poll_timeout_s)
            if not ok:
                notes.append(Quality("sglang_stop_failed", f"/stop_profile: {why}" + (
                    " (the server had stopped by itself)" if plan.num_steps else ""),
                    "info" if plan.num_steps else "warning"))
        got.t1_ns = time.time_ns()
        got.telemetry = tel.stop() if tel is not None else None
        if gen is not None:
            got.load = gen.stop().to_json()
    return got


def _profile_runs(plan: _LevelPlan, run_dir: Path, gen: Any, expected: set[tuple[int, int]] | None,
                  got: _Profiled, notes: list[Quality]) -> None:
    """While the profile records: the server's own ``num_steps`` (its files end it), or the duration (Ctrl-C ends
    it early: kept, ``got.interrupted``)."""
    if plan.num_steps is not None:
        try:
            got.files = wait_for_traces(run_dir, expected=expected, profile_id=None,
                                        timeout_s=max(plan.duration_s, 0) + plan.poll_timeout_s, allow_missing=True)
        except CaptureError:
            notes.append(Quality("sglang_steps_incomplete", f"{plan.num_steps} steps did not complete in time "
                                 "(steps advance only while requests are served); stopped the profile by hand"))
        return
    try:
        _sleep_with_progress(plan.duration_s, plan.say, gen)
    except KeyboardInterrupt:  # Ctrl-C while profiling: stop the profile, keep what it recorded
        got.interrupted = True
        plan.warn("Ctrl-C received; stopping the profile and writing what was collected")


def _step_records(step_dir: Any, got: _Profiled, notes: list[Quality]) -> list[Any]:
    """The step records ``tracekit launch`` wrote during the window (a note when there are none)."""
    import polars as pl

    from tracekit.capture.sglang_plugin import load_step_records

    lag_s = 1.5 - (time.time_ns() - got.t1_ns) / 1e9  # ranks flush step records every <= 1 s
    if lag_s > 0:
        time.sleep(lag_s)
    steps = load_step_records(step_dir)
    steps = steps.filter((pl.col("ts_ns") >= got.t0_ns) & (pl.col("ts_ns") <= got.t1_ns))
    if steps.height:
        return [steps]
    notes.append(Quality("sglang_no_step_records", f"no tracekit step records in {step_dir} during the capture; "
                         "was the server started with `tracekit launch`?"))
    return []


def _sleep_with_progress(duration_s: float, say: Callable[[str], None], gen: Any) -> None:
    end = time.monotonic() + duration_s
    next_say = time.monotonic() + 10.0
    while True:
        left = end - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(left, 0.25))
        if time.monotonic() >= next_say:
            extra = f", {gen.completed_total} requests done" if gen is not None else ""
            say(f"{max(0.0, end - time.monotonic()):.0f}s left{extra}")
            next_say += 10.0


def _convert(files: list[Path], out: Path, *, extra_frames: list[Any], metadata: dict[str, Any], force: bool) -> Any:
    from tracekit.ingest.convert import convert

    return convert(list(files), out, force=force, extra_frames=extra_frames, metadata=metadata)
