"""Tiny Kineto (torch.profiler Chrome JSON) documents for the golden unit tests.

Helpers build events the way torch.profiler writes them; ``write_doc`` puts a
document on disk (``.json`` or ``.json.gz``) so tests exercise the real reader.
Times are given in µs as Kineto does (``ts``/``dur``), optionally as decimal
strings written verbatim so ns digits survive (``_raw`` floats).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

__all__ = ["kernel", "runtime", "cpu_op", "annotation", "gpu_annotation", "memcpy", "doc", "write_doc", "RawNum"]


class RawNum(str):
    """A number written verbatim into the JSON text (e.g. ``RawNum("1712195495505543.217")``)."""


def _ev(cat: str, name: str, ts: Any, dur: Any, pid: int, tid: int, args: dict[str, Any] | None = None) -> dict[str, Any]:
    e: dict[str, Any] = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur}
    if args:
        e["args"] = args
    return e


def kernel(name: str, ts: Any, dur: Any, *, corr: int | None, stream: int = 7, device: int = 0, **args: Any) -> dict[str, Any]:
    a = {"device": device, "stream": stream, "grid": [4, 2, 1], "block": [128, 1, 1], "registers per thread": 32,
         "shared memory": 1024}
    if corr is not None:
        a["correlation"] = corr
    a.update(args)
    return _ev("kernel", name, ts, dur, device, stream, a)


def memcpy(name: str, ts: Any, dur: Any, *, corr: int | None, stream: int = 7, nbytes: int = 4096) -> dict[str, Any]:
    return _ev("gpu_memcpy", name, ts, dur, 0, stream, {"device": 0, "stream": stream, "correlation": corr, "bytes": nbytes})


def runtime(name: str, ts: Any, dur: Any, *, corr: int, tid: int = 1, ext: int | None = None) -> dict[str, Any]:
    a: dict[str, Any] = {"correlation": corr}
    if ext is not None:
        a["External id"] = ext
    return _ev("cuda_runtime", name, ts, dur, 100, tid, a)


def cpu_op(name: str, ts: Any, dur: Any, *, tid: int = 1, **args: Any) -> dict[str, Any]:
    return _ev("cpu_op", name, ts, dur, 100, tid, dict(args) or None)


def annotation(name: str, ts: Any, dur: Any, *, tid: int = 1) -> dict[str, Any]:
    return _ev("user_annotation", name, ts, dur, 100, tid)


def gpu_annotation(name: str, ts: Any, dur: Any, *, stream: int = 7) -> dict[str, Any]:
    return _ev("gpu_user_annotation", name, ts, dur, 0, stream, {"device": 0, "stream": stream})


def doc(events: list[dict[str, Any]], *, rank: int | None = None, world_size: int = 2, base_ns: int | None = None,
        **top: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"schemaVersion": 1, "traceEvents": events}
    if rank is not None:
        d["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": world_size}
    if base_ns is not None:
        d["baseTimeNanoseconds"] = base_ns
    d.update(top)
    return d


def _dumps(obj: Any) -> str:
    """json.dumps that writes RawNum values verbatim (keeps every decimal digit)."""
    marks: dict[str, str] = {}

    def walk(o: Any) -> Any:
        if isinstance(o, RawNum):
            key = f"@@RAW{len(marks)}@@"
            marks[key] = str(o)
            return key
        if isinstance(o, dict):
            return {k: walk(v) for k, v in o.items()}
        if isinstance(o, list):
            return [walk(v) for v in o]
        return o

    text = json.dumps(walk(obj))
    for key, raw in marks.items():
        text = text.replace(f'"{key}"', raw)
    return text


def write_doc(path: Path, d: dict[str, Any]) -> Path:
    text = _dumps(d).encode()
    if path.name.endswith(".gz"):
        path.write_bytes(gzip.compress(text))
    else:
        path.write_bytes(text)
    return path
