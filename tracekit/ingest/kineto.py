"""torch.profiler / Kineto Chrome-JSON reader (``.json`` / ``.json.gz``), incl. SGLang files.

Contract of :func:`read_kineto`: one file (one rank) in, a *raw* frame out —
rows follow :mod:`tracekit.schema` but are not yet finalized (no launch join,
no categories, no collective sequence numbers; see
:func:`tracekit.ingest.common.finalize_rank`).

Speed and memory: the text is inflated piece by piece (ISA-L) and cut into ~4 MB
chunks of whole events (:mod:`tracekit.ingest.kineto_stream`); a thread pool
blanks the commas between events in place and parses each chunk with Arrow's
JSON reader, then polars turns it into typed stage columns. Decoded chunks are
stacked column by column, so memory is the rank's columns plus a few chunks.
Other event layouts are split by a regex first; chunks Arrow still cannot take
(type surprises, recorded shapes, absolute-epoch float timestamps whose sub-µs
digits a float64 would round) go to an exact msgspec decoder that keeps
timestamps as decimal text.
"""

from __future__ import annotations

import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
import re
from operator import attrgetter
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson
import polars as pl

from tracekit.ingest.readers import Reader
from tracekit import _env, _interrupt
from tracekit._errors import InputError, QualityLog
from tracekit._frames import attach_rows
from tracekit.ingest import kineto_checks as kc
from tracekit.ingest import kscan
from tracekit.ingest.kineto_stream import EventStream, StreamFallback, bracketed, iter_text
from tracekit.ingest.validate import check_times
from tracekit.schema import MAX_RANK, conform

__all__ = ["read_kineto", "KINETO_KINDS"]

#: Kineto ``cat`` -> tracekit kind. Categories not here and not in _SKIP are counted as unknown.
KINETO_KINDS = {
    "kernel": "kernel",
    "Kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "Memcpy": "memcpy",
    "gpu_memset": "memset",
    "Memset": "memset",
    "cuda_runtime": "runtime",
    "cuda_driver": "runtime",
    "Runtime": "runtime",
    "hip_runtime": "runtime",
    "cuda_sync": "sync",
    "cpu_op": "cpu_op",
    "Operator": "cpu_op",
    "user_annotation": "range",
    "gpu_user_annotation": "gpu_range",
}
#: Chrome trace event phases (``ph``); events of any other phase are counted (``unknown_phases``) and skipped
KNOWN_PHASES = frozenset("B E X i I C b n e s t f P N O D M V v R c ( ) S T p F".split())
#: key prefix of unknown-phase counts in the unknown-category tally
_PH_KEY = "\x00ph:"
_SKIP = {
    "Trace",
    "overhead",
    "ac2g",
    "async_gpu",
    "fwdbwd",
    "async_cpu_to_gpu",
    "python_function",
    "cpu_instant_event",
    "cuda_profiler_range",
    "critical_path",
    "Memory",
}


#: a ``with_stack``/``with_modules`` trace's module ranges (``python_function`` events named ``nn.Module: <Class>_<n>``)
#: are kept as ``range`` rows: they are the module context (:mod:`tracekit.ingest.modules`); other Python frames are not
MODULE_PREFIX = "nn.Module: "


def _is_module(e: Any) -> bool:
    return e.cat == "python_function" and isinstance(e.name, str) and e.name.startswith(MODULE_PREFIX)


class _Args(msgspec.Struct, rename={
    "external_id": "External id",
    "registers": "registers per thread",
    "shared_memory": "shared memory",
    "graph_id": "graph id",
    "graph_node_id": "graph node id",
    "coll_name": "Collective name",
    "in_nelems": "In msg nelems",
    "out_nelems": "Out msg nelems",
    "group_size": "Group size",
    "pg_name": "Process Group Name",
    "pg_desc": "Process Group Description",
    "pg_ranks": "Process Group Ranks",
    "seq": "Seq",
    "input_dims": "Input Dims",
    "input_type": "Input type",
}):
    correlation: Any = None
    external_id: Any = None
    device: Any = None
    stream: Any = None
    grid: Any = None
    block: Any = None
    registers: Any = None
    shared_memory: Any = None
    bytes: Any = None
    graph_id: Any = None
    graph_node_id: Any = None
    coll_name: Any = None
    in_nelems: Any = None
    out_nelems: Any = None
    group_size: Any = None
    dtype: Any = None
    pg_name: Any = None
    pg_desc: Any = None
    pg_ranks: Any = None
    seq: Any = None
    input_dims: Any = None
    input_type: Any = None
    kind: Any = None


_NOARGS = _Args()


class _Ev(msgspec.Struct):
    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    args: Any = None  # _Args after typed decode; dict on the loose path


class _EvTyped(_Ev):
    args: _Args | None = None


class _Top(msgspec.Struct):
    traceEvents: msgspec.Raw = msgspec.Raw(b"")  # noqa: N815 - JSON key; empty = key absent
    baseTimeNanoseconds: Any = None  # noqa: N815
    distributedInfo: Any = None  # noqa: N815
    deviceProperties: Any = None  # noqa: N815
    displayTimeUnit: Any = None  # noqa: N815
    schemaVersion: Any = None  # noqa: N815
    record_shapes: Any = None
    traceName: Any = None  # noqa: N815


def _as_str(s: str) -> str:
    return s


_TOP = msgspec.json.Decoder(_Top)
_CHUNK_TYPED = msgspec.json.Decoder(list[_EvTyped], float_hook=_as_str)
_CHUNK_LOOSE = msgspec.json.Decoder(list[_Ev], float_hook=_as_str)
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_CHUNK_BYTES = 4 << 20
#: chunks of the streaming path (fewer polars calls per MB; memory: ``parse_threads() + 1`` chunks in flight)
_STREAM_CHUNK_BYTES = 16 << 20
#: decoded chunks stacked into one compact frame at a time (~32 MB of JSON)
_GROUP_CHUNKS = 8
_ARG_FIELDS = _Args.__struct_fields__


def _read_bytes(path: Path, tally: dict[str, int]) -> bytes:
    """The whole decompressed text (the streaming reader's gzip handling: members, trailing bytes counted)."""
    return b"".join(iter_text(path, tally=tally))


def _chunks(arr: memoryview) -> Iterator[bytes]:
    """Split the bytes of a JSON array of objects into decodable ``[...]`` chunks."""
    n = len(arr)
    # strip the outer brackets
    lo = bytes(arr[: min(n, 64)]).find(b"[")
    hi = n - 1
    while hi > lo and arr[hi] != ord("]"):
        hi -= 1
    body = arr[lo + 1 : hi]
    m = len(body)
    start = 0
    while start < m:
        end = start + _CHUNK_BYTES
        if end >= m:
            yield b"[" + bytes(body[start:m]) + b"]"
            return
        window = bytes(body[end : min(m, end + (1 << 20))])
        hit = _BOUNDARY.search(window)
        while hit is None and end + len(window) < m:
            end += len(window)
            window = bytes(body[end : min(m, end + (4 << 20))])
            hit = _BOUNDARY.search(window)
        if hit is None:
            yield b"[" + bytes(body[start:m]) + b"]"
            return
        cut = end + hit.start() + 1  # just after the closing brace
        yield b"[" + bytes(body[start:cut]) + b"]"
        # skip the comma
        nxt = end + hit.end() - 1  # position of the next '{'
        start = nxt


def _decode_events(raw_events: bytes | bytearray | memoryview, path: Path, quality: QualityLog) -> Iterator[list[Any]]:
    """Yield lists of events, chunk by chunk; a bad split merges with the next chunk.

    JSON nested beyond the decoder's recursion limit: :func:`kineto_checks.too_deep` (never a RecursionError)."""
    try:
        yield from _decode_chunks(raw_events, path)
    except RecursionError:
        raise kc.too_deep(path) from None


def _decode_chunks(raw_events: bytes | bytearray | memoryview, path: Path) -> Iterator[list[Any]]:
    pending = b""
    for chunk in _chunks(memoryview(raw_events)):
        if pending:
            chunk = pending[:-1] + b"," + chunk[1:]
            pending = b""
        try:
            yield _CHUNK_TYPED.decode(chunk)
            continue
        except msgspec.ValidationError:
            try:
                yield _CHUNK_LOOSE.decode(chunk)
                continue
            except msgspec.DecodeError:
                pending = chunk
        except msgspec.DecodeError:
            pending = chunk  # split inside a nested object: retry merged with the next chunk
    if pending:
        try:
            yield _CHUNK_TYPED.decode(pending)
        except msgspec.ValidationError:
            try:
                yield _CHUNK_LOOSE.decode(pending)
            except msgspec.DecodeError as e:
                raise InputError(f"{path}: invalid JSON in traceEvents ({e}); the file is corrupt or truncated") from None
        except msgspec.DecodeError as e:
            raise InputError(f"{path}: invalid JSON in traceEvents ({e}); the file is corrupt or truncated") from None


def _loose_args(d: Any, tally: dict[str, int]) -> _Args:
    if not isinstance(d, dict):
        k = kc.tally_key("args", kc.type_name(d))  # args that is not an object: every field it should carry is unknown
        tally[k] = tally.get(k, 0) + 1
        return _NOARGS
    conv = {
        "correlation": d.get("correlation"),
        "external_id": d.get("External id"),
        "device": d.get("device"),
        "stream": d.get("stream"),
        "grid": d.get("grid"),
        "block": d.get("block"),
        "registers": d.get("registers per thread"),
        "shared_memory": d.get("shared memory"),
        "bytes": d.get("bytes"),
        "graph_id": d.get("graph id"),
        "graph_node_id": d.get("graph node id"),
        "coll_name": d.get("Collective name"),
        "in_nelems": d.get("In msg nelems"),
        "out_nelems": d.get("Out msg nelems"),
        "group_size": d.get("Group size"),
        "dtype": d.get("dtype"),
        "pg_name": d.get("Process Group Name"),
        "pg_desc": d.get("Process Group Description"),
        "pg_ranks": d.get("Process Group Ranks"),
        "seq": d.get("Seq"),
        "input_dims": d.get("Input Dims"),
        "input_type": d.get("Input type"),
        "kind": d.get("kind"),
    }
    return _Args(**conv)


def _num_to_str(v: Any) -> str | None:
    """Timestamps arrive as str (float literal), int, or junk."""
    if v is None:
        return None
    if isinstance(v, str):
        return v
    if isinstance(v, (int, float)):
        return repr(v)
    return None


def _scalar(v: Any) -> Any:
    return v if isinstance(v, (int, str)) and not isinstance(v, bool) else (int(v) if isinstance(v, float) else None)


def _json_or_none(v: Any) -> str | None:
    if v is None or v == [] or v == "":
        return None
    return msgspec.json.encode(v).decode()


class _Cols:
    """Column accumulators for one file."""

    def __init__(self) -> None:
        self.c: dict[str, list[Any]] = {k: [] for k in (
            "_kind", "cat", "name", "pid", "tid", "ts", "dur",
            *_ARG_FIELDS,
        )}

    @staticmethod
    def _select(evs: list[Any], quality_unknown: dict[str, int]) -> list[Any]:
        kinds = KINETO_KINDS
        keep = [e for e in evs if e.ph == "X" and (e.cat in kinds or _is_module(e))]
        if len(keep) != len(evs):
            unknown: dict[str, int] = {}
            keep = []  # file order, as the columnar path keeps it
            for e in evs:
                if e.ph == "X":
                    if e.cat in kinds or _is_module(e):
                        keep.append(e)
                    elif e.cat not in _SKIP:
                        unknown[str(e.cat)] = unknown.get(str(e.cat), 0) + 1
                elif e.ph in ("i", "I") and e.cat not in _SKIP and e.ts is not None:
                    keep.append(e)
                elif not isinstance(e.ph, str) or e.ph not in KNOWN_PHASES:
                    k = _PH_KEY + str(e.ph)
                    unknown[k] = unknown.get(k, 0) + 1
            for k, v in unknown.items():
                quality_unknown[k] = quality_unknown.get(k, 0) + v
        return keep

    def add(self, evs: list[Any], quality_unknown: dict[str, int]) -> None:
        kinds = KINETO_KINDS
        try:
            keep = self._select(evs, quality_unknown)
        except TypeError:  # an unhashable "cat" (list/object): treat it as its text, an unknown category
            for e in evs:
                if e.cat is not None and not isinstance(e.cat, str):
                    e.cat = str(e.cat)
            keep = self._select(evs, quality_unknown)
        if not keep:
            return
        c = self.c
        c["_kind"].extend([kinds.get(e.cat, "range" if _is_module(e) else "instant") if e.ph == "X" else "instant" for e in keep])
        for f in ("cat", "name", "pid", "tid", "ts", "dur"):
            c[f].extend(map(attrgetter(f), keep))
        args = [e.args for e in keep]
        if any(a is not None and not isinstance(a, _Args) for a in args):
            args = [_loose_args(a, quality_unknown) if not isinstance(a, _Args) and a is not None else a for a in args]
        args = [a or _NOARGS for a in args]
        for f in _ARG_FIELDS:
            c[f].extend(map(attrgetter(f), args))


def _ns_expr(col: str, *, unit_ns: int) -> pl.Expr:
    """String decimal (µs or ns units) -> int64 ns, exact to the ns, vectorized."""
    s = pl.col(col).str.strip_chars()
    parts = s.str.split_exact(".", 1)
    ipart = parts.struct.field("field_0")
    frac = parts.struct.field("field_1").fill_null("")
    neg = ipart.str.starts_with("-")
    iabs = ipart.str.strip_chars_start("-").cast(pl.Int64, strict=False)
    digits = 3 if unit_ns == 1000 else 0
    if digits:
        f3 = (frac + pl.lit("000")).str.slice(0, 3).cast(pl.Int64, strict=False)
        rnd = (frac.str.slice(3, 1).fill_null("").replace("", "0").cast(pl.Int64, strict=False) >= 5).cast(pl.Int64)
        val = iabs * 1000 + f3 + rnd
    else:
        rnd = (frac.str.slice(0, 1).replace("", "0").cast(pl.Int64, strict=False) >= 5).cast(pl.Int64)
        val = iabs + rnd
    # scientific notation or junk: fall back to float math
    sci = s.str.contains("[eE]")
    fallback = (s.cast(pl.Float64, strict=False) * unit_ns).round(0).cast(pl.Int64, strict=False)
    out = pl.when(sci).then(fallback).otherwise(pl.when(neg).then(-val).otherwise(val))
    return out


def _str_series(vals: list[Any]) -> pl.Series:
    """Mixed str/int/float/None -> String series (numbers as their literal text)."""
    try:
        return pl.Series(vals, dtype=pl.String, strict=False)
    except (TypeError, pl.exceptions.PolarsError):
        return pl.Series([v if isinstance(v, str) else (None if v is None else repr(v)) for v in vals], dtype=pl.String)


def _to_int(col: str) -> pl.Expr:
    """Object column of ints/strings -> Int64 (strings parsed, junk -> null)."""
    return pl.col(col).cast(pl.String, strict=False).cast(pl.Int64, strict=False)


def _rank_meta(top: _Top, path: Path) -> dict[str, Any]:
    di = top.distributedInfo if isinstance(top.distributedInfo, dict) else {}
    notes: list[dict[str, Any]] = []
    meta: dict[str, Any] = {
        "source_file": str(path),
        "format": "kineto",
        "base_time_ns": kc.base_time_ns(top.baseTimeNanoseconds, path, notes),
        "display_time_unit": top.displayTimeUnit,
        "distributed_info": {k: v for k, v in di.items() if k != "pg_config"} if di else None,
        "pg_config": di.get("pg_config") if di else None,
        "rank_from_file": None,
        "world_size": None,
        "backend": _text_or_none(di.get("backend")),
        "nccl_version": _text_or_none(di.get("nccl_version")),
        "record_shapes": bool(top.record_shapes) if top.record_shapes is not None else None,
    }
    props = kc.device_props(top.deviceProperties, path, notes)
    if props:
        meta["device_props"] = props
    if di:
        meta["rank_from_file"] = _checked_int(di.get("rank"), "rank", 0, MAX_RANK, path, notes)
        meta["world_size"] = _checked_int(di.get("world_size"), "world_size", 1, MAX_WORLD, path, notes)
        r, ws = meta["rank_from_file"], meta["world_size"]
        if r is not None and ws is not None and r >= ws:
            notes.append({"code": "bad_world_size", "severity": "warning", "message":
                          f"{path.name}: distributedInfo.world_size {ws} is not above its rank {r}; world size ignored"})
            meta["world_size"] = None
    meta["field_notes"] = notes
    return meta


def _text_or_none(v: Any) -> str | None:
    """A metadata field that is text (a version as a number is kept as its text; lists, objects: None)."""
    return v if isinstance(v, str) else (str(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None)


#: largest rank / world size a trace's ``distributedInfo`` may claim (ranks are int32; larger claims are refused
#: before they size anything: a missing-rank list or per-rank tables)
MAX_WORLD = 1 << 17


def _checked_int(v: Any, name: str, lo: int, hi: int, path: Path, notes: list[dict[str, Any]]) -> int | None:
    """``distributedInfo.<name>`` as an int in ``[lo, hi]``, else None with a quality note (never silently 0)."""
    if v is None:
        return None
    code = "bad_rank_field" if name == "rank" else "bad_world_size"
    if isinstance(v, str) and v.strip().isdigit():
        n = int(v.strip())
        if lo <= n <= hi:
            notes.append({"code": code, "severity": "info", "message":
                          f"{path.name}: distributedInfo.{name} is the text {v!r}; read as {n}"})
            return n
    elif isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi:
        return v
    shown = repr(v) if len(repr(v)) <= 40 else repr(v)[:37] + "..."
    what = "the rank from the file name is used" if name == "rank" else "world size taken from the files given"
    notes.append({"code": code, "severity": "warning", "message":
                  f"{path.name}: distributedInfo.{name} {shown} is not an integer in {lo}..{hi}; ignored ({what})"})
    return None


def read_kineto(path: str | Path, rank: int | None = None, *, exact: bool | None = None) -> tuple[pl.DataFrame, dict[str, Any]]:
    """Read one Kineto JSON(.gz) file into a raw event frame and rank metadata.

    ``rank``: taken from ``distributedInfo.rank`` when absent; the caller
    (``discover``) passes the file-name rank as a fallback. Raises
    :class:`InputError` for unreadable or non-trace input; unknown event
    categories become a ``quality`` note in the returned metadata.

    Two decoders give identical rows: a fast columnar one (Arrow's JSON reader
    over each chunk) and an exact one (msgspec structs, timestamps as decimal text).
    The exact one runs when ``exact`` is true, when shapes were recorded, or
    when a chunk holds absolute-epoch float timestamps whose sub-µs digits a
    float64 would round.
    """
    p = Path(path)
    try:
        return _read_streaming(p, rank, exact)
    except StreamFallback:
        pass
    return _read_whole(p, rank, exact)


def _stage_chunk(chunk: bytes | bytearray | memoryview, p: Path, exact: bool | None,
                 bare: bool = False) -> tuple[pl.DataFrame, dict[str, int]]:
    """One chunk of events -> stage frame + its unknown-category counts (thread-safe: no shared state).

    ``bare``: the events without the array's brackets (a view from :class:`EventStream`), else ``[...]``.
    """
    unknown: dict[str, int] = {}
    try:
        st = _decode_chunk(chunk, p, exact, unknown, bare)
    except InputError:
        raise StreamFallback("undecodable chunk") from None
    return _sparse(st), unknown


def _decode_chunk(chunk: bytes | bytearray | memoryview, p: Path, exact: bool | None, unknown: dict[str, int],
                  bare: bool = False) -> pl.DataFrame:
    """Fast decoder, else the exact one; a chunk neither takes is retried once with its lone surrogate
    escapes replaced (:func:`kineto_checks.fix_lone_surrogates`, counted), else the exact decoder's error.
    ``bare``: the chunk's events come without the array's brackets."""
    st = None if exact else _fast_stage(chunk, unknown, bare)
    if st is not None:
        return st
    arr = bracketed(chunk) if bare else chunk
    try:
        return _exact_stage(arr, p, unknown)
    except InputError:
        if isinstance(arr, memoryview):  # only bytes are fixed (a view from EventStream comes bare: arr is a copy)
            raise
        fixed, n = kc.fix_lone_surrogates(arr)
        if not n:
            raise
    kc.count_surrogates(unknown, n)
    st = None if exact else _fast_stage(fixed, unknown)
    return st if st is not None else _exact_stage(fixed, p, unknown)


def parse_threads() -> int:
    """Threads decoding one file's chunks (Arrow's JSON parser and polars release the GIL)."""
    n_env = _env.positive_int(_env.PARSE_THREADS)
    if n_env is not None:
        return n_env
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        n = os.cpu_count() or 1
    return max(1, min(n, 8))


_T = TypeVar("_T")


def _result(f: Future[_T]) -> _T:
    """``f.result()`` in bounded waits with an interrupt check between them (Ctrl-C stops at once). Labelled apart
    from the per-chunk ``read`` checks: how often a wait checks depends on the machine's load, a chunk count not."""
    res: _T = _interrupt.wait_future(f, "read.wait")
    return res


def _decode_stream(es: EventStream, p: Path, exact: bool | None,
                   take: Callable[[tuple[pl.DataFrame, dict[str, int]]], None]) -> None:
    """Decode the stream's chunks in order, on :func:`parse_threads` threads, ``threads + 1`` in flight;
    each chunk goes back to the stream once decoded."""
    chunks = es.chunks()
    nthreads = parse_threads()
    pending: deque[tuple[Future[tuple[pl.DataFrame, dict[str, int]]], memoryview]] = deque()
    ex = ThreadPoolExecutor(nthreads, thread_name_prefix="tk-parse") if nthreads > 1 else None
    try:
        for chunk in _interrupt.checked(chunks, "read"):
            if ex is None:
                take(_stage_chunk(chunk, p, exact, True))
                es.release(chunk)
                continue
            pending.append((ex.submit(_stage_chunk, chunk, p, exact, True), chunk))
            del chunk
            while len(pending) > nthreads:
                f, c = pending.popleft()
                take(_result(f))
                es.release(c)
        while pending:
            f, c = pending.popleft()
            take(_result(f))
            es.release(c)
    finally:
        # Ctrl-C or an error: queued chunks are dropped, only the ones being parsed are waited for
        if ex is not None:
            ex.shutdown(wait=True, cancel_futures=True)
        pending.clear()
        chunks.close()  # the file (and the inflater's thread) is closed now, not at exit


def _read_streaming(p: Path, rank: int | None, exact: bool | None) -> tuple[pl.DataFrame, dict[str, Any]]:
    """Bounded-memory path: decompress and decode chunk by chunk (see kineto_stream).

    Chunks are decoded by a small thread pool, in order, with at most
    ``threads + 1`` chunks in flight, so memory stays a few chunks above the
    decoded columns.
    """
    es = EventStream(p, _STREAM_CHUNK_BYTES, _TOP)
    unknown: dict[str, int] = {}
    frames: list[pl.DataFrame] = []  # stacked groups of chunks
    group: list[pl.DataFrame] = []

    def take(res: tuple[pl.DataFrame, dict[str, int]]) -> None:
        st, unk = res
        for k, v in unk.items():
            unknown[k] = unknown.get(k, 0) + v
        if st.height:
            group.append(st)
        if len(group) >= _GROUP_CHUNKS:
            frames.append(_stack(group))  # compact copies; the parser's buffers go back now, not at the end

    _decode_stream(es, p, exact, take)
    if group:
        frames.append(_stack(group))
    for k, v in es.tally.items():
        unknown[k] = unknown.get(k, 0) + v
    try:
        top = _TOP.decode(es.top_document())
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        raise StreamFallback("top-level keys") from None
    meta = _rank_meta(top, p)
    if exact is None and meta.get("record_shapes") and frames:
        # shapes recorded: every chunk must come from the exact decoder (it keeps Input Dims)
        raise StreamFallback("record_shapes")
    return _assemble(frames, meta, unknown, rank, p)


_BOM = b"\xef\xbb\xbf"
_BYTE_AT = re.compile(r"\(byte (\d+)\)")


def _where(data: bytes | bytearray, off: int) -> str:
    """``line L, column C (byte N) near '...'`` for a byte offset into the decompressed text."""
    off = max(0, min(off, len(data)))
    line = data.count(b"\n", 0, off) + 1
    col = off - (data.rfind(b"\n", 0, off) + 1) + 1
    near = data[max(0, off - 24): off + 24].decode("utf-8", "replace").replace("\n", " ")
    return f"line {line}, column {col} (byte {off}) near {near!r}"


def _json_error(p: Path, data: bytes | bytearray, e: Exception) -> InputError:
    """A decode error that says where: line, column and the text there; NaN/Infinity and bad UTF-8 by name."""
    m = _BYTE_AT.search(str(e))
    if m:
        off = int(m.group(1))
        tok = data[off: off + 9]
        if tok.startswith((b"NaN", b"Infinity", b"-Infinity")):
            return InputError(f"{p}: {tok.split(b',')[0].split(b'}')[0].decode()} is not a JSON number, at {_where(data, off)}; "
                              "the writer emitted a non-finite value; replace it with null or re-export the trace")
        return InputError(f"{p}: invalid JSON at {_where(data, off)}; the file is corrupt or truncated")
    if "UTF-8" in str(e):
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as u:
            return InputError(f"{p}: invalid UTF-8 byte 0x{data[u.start]:02x} at {_where(data, u.start)}; "
                              "the file is corrupt; re-copy it or fix that byte")
    return InputError(f"{p}: invalid JSON ({e}); the file is corrupt or truncated")


def _read_whole(p: Path, rank: int | None, exact: bool | None) -> tuple[pl.DataFrame, dict[str, Any]]:
    tally: dict[str, int] = {}
    data: bytes | bytearray = _read_bytes(p, tally)  # bytearray once lone surrogates are fixed
    if data.startswith(_BOM):  # a UTF-8 byte-order mark (some editors and Windows tools write one): not part of the JSON
        data = data[len(_BOM):]
    if not data.strip():
        raise InputError(f"{p}: empty file; re-export the trace")
    top = _decode_top(p, data, tally)
    if tally.get(kc.SURROGATES_KEY):  # the top level held lone surrogates: the events too, probably
        data = kc.fix_lone_surrogates(data)[0]
        top = _TOP.decode(data)
    try:
        return _read_events(p, data, top, rank, exact, tally)
    except InputError as e:
        if "UTF-8" in str(e) or "malformed" in str(e):
            raise _json_error(p, data, e) from None
        if "levels deep" in str(e):
            off = kc.deep_offset(data, kc.MAX_JSON_DEPTH)
            raise kc.too_deep(p, _where(data, off) if off is not None else None) from None
        raise


def _decode_top(p: Path, data: bytes | bytearray, tally: dict[str, int]) -> _Top:
    """The top-level keys (``traceEvents`` kept raw): one-line errors for what is not a Kineto trace."""
    try:
        return _TOP.decode(data)
    except msgspec.ValidationError as e:
        raise InputError(f"{p}: JSON is not a Chrome/Kineto trace ({e}); expected an object with 'traceEvents'") from None
    except RecursionError:
        off = kc.deep_offset(data, kc.MAX_JSON_DEPTH)
        raise kc.too_deep(p, _where(data, off) if off is not None else None) from None
    except msgspec.DecodeError as e:
        if data.lstrip()[:1] == b"[":
            raise InputError(f"{p}: a bare JSON array is not supported; wrap it as {{\"traceEvents\": [...]}}") from None
        fixed, n = kc.fix_lone_surrogates(data)
        if n:
            try:
                top = _TOP.decode(fixed)
            except (msgspec.DecodeError, msgspec.ValidationError):
                raise _json_error(p, data, e) from None
            kc.count_surrogates(tally, n)
            return top
        raise _json_error(p, data, e) from None


def _read_events(p: Path, data: bytes | bytearray, top: _Top, rank: int | None, exact: bool | None,
                 tally: dict[str, int]) -> tuple[pl.DataFrame, dict[str, Any]]:
    meta = _rank_meta(top, p)
    raw_events = memoryview(top.traceEvents)  # zero-copy view into the decompressed text
    del top
    if not len(raw_events):
        raise InputError(f"{p}: no 'traceEvents' key; not a Kineto/Chrome trace (e.g. a PyTorch execution trace)")
    if bytes(raw_events[:64]).strip()[:1] != b"[":
        raise InputError(f"{p}: 'traceEvents' is not a list; not a Kineto trace")
    if exact is None:
        exact = bool(meta.get("record_shapes"))
    unknown: dict[str, int] = dict(tally)
    frames: list[pl.DataFrame] = []
    for chunk in _interrupt.checked(_chunks(raw_events), "read"):
        st = _decode_chunk(chunk, p, exact, unknown)
        if st.height:
            frames.append(_sparse(st))
    frames = [_stack(frames[i:i + _GROUP_CHUNKS]) for i in range(0, len(frames), _GROUP_CHUNKS)]
    raw_events.release()
    del raw_events, data
    return _assemble(frames, meta, unknown, rank, p)


def _stack(frames: list[pl.DataFrame]) -> pl.DataFrame:
    """Concatenate stage frames into one single-chunk frame, column by column; empties ``frames``.

    A plain concat keeps every chunk, and the first expression over columns of
    different chunk counts copies the whole frame while the chunks are still
    alive (2x the rank). Here only one column is ever held twice. Frames may
    lack columns (:func:`_sparse`): a column some frames have is filled with
    nulls for the others; one no frame has stays absent.
    """
    heights = [f.height for f in frames]
    cols = {}
    for name, dtype in _union_schema(frames).items():
        cols[name] = pl.concat(
            [f.drop_in_place(name) if name in f.schema else pl.repeat(None, h, dtype=dtype, eager=True).alias(name)
             for f, h in zip(frames, heights)],
            rechunk=True,
        )
    frames.clear()
    return pl.DataFrame(cols)


def _union_schema(frames: list[pl.DataFrame]) -> dict[str, pl.DataType]:
    """Every column any of ``frames`` has (:func:`_sparse` drops some per chunk), in first-seen order."""
    types: dict[str, pl.DataType] = {}
    for f in frames:
        for name, dtype in f.schema.items():
            types.setdefault(name, dtype)
    return types


def _glue(groups: list[pl.DataFrame]) -> pl.DataFrame:
    """The stacked groups as one frame of ``len(groups)`` aligned chunks (no copy); empties ``groups``.

    Gluing them into one chunk would hold the rank twice and leave the
    allocator with a rank's worth of freed pieces too small to reuse (about
    +300 MB on a 450 MB rank). Finalizing keeps the chunks aligned
    (:func:`tracekit._frames.aligned`), so polars never rechunks the frame.
    A column some groups lack is filled with nulls for them.
    """
    if len(groups) == 1:
        return groups.pop()
    types = _union_schema(groups)
    filled = []
    while groups:
        g = groups.pop(0)
        missing = [pl.repeat(None, g.height, dtype=t, eager=True).alias(n) for n, t in types.items() if n not in g.schema]
        filled.append((g.hstack(missing) if missing else g).select(list(types)))
    return pl.concat(filled, rechunk=False)


#: stage columns every chunk keeps; any other that is null in every row of a chunk is dropped (:func:`_sparse`)
_STAGE_KEEP = frozenset({"kind", "src", "name", "pid", "tid", "ts_rel_ns", "dur_ns"})


def _sparse(st: pl.DataFrame) -> pl.DataFrame:
    """Drop the stage columns that are null in every row of a chunk (most ``args`` fields in most chunks).

    Such a column then takes no memory while the rank is read: :func:`_stack`
    leaves it out when no chunk has it, and :func:`_finish` adds it back as a
    null literal, which polars keeps as one scalar (not materialized) through
    filters, joins by :func:`tracekit._frames.attach` and the batch gathers of
    the write. On the 8-rank benchmark this is 17 of the 49 trace columns of
    the raw rank, about a third of its bytes.
    """
    h = st.height
    drop = [c for c, n in zip(st.columns, st.null_count().row(0)) if n == h and c not in _STAGE_KEEP]
    return st.drop(drop) if drop else st


def _assemble(frames: list[pl.DataFrame], meta: dict[str, Any], unknown: dict[str, int], rank: int | None, p: Path) -> tuple[pl.DataFrame, dict[str, Any]]:
    if rank is None:
        rank = meta["rank_from_file"]
    quality = QualityLog()
    checks = kc.quality_of(unknown, p.name)
    phases = {k[len(_PH_KEY):]: v for k, v in unknown.items() if k.startswith(_PH_KEY)}
    unknown = {k: v for k, v in unknown.items() if not k.startswith(_PH_KEY) and not kc.is_check_key(k)}
    if unknown:
        quality.add("unknown_event_kinds", f"{p.name}: skipped events of unknown categories: "
                    + ", ".join(f"{k} ({v})" for k, v in sorted(unknown.items())), unknown=unknown)
    if phases:
        quality.add("unknown_phases", f"{p.name}: skipped {sum(phases.values())} events of unknown phase (ph) "
                    + ", ".join(f"{k!r} ({v})" for k, v in sorted(phases.items())[:8])
                    + "; only X (complete) and i (instant) events become rows", phases=phases)
    meta["quality"] = [*meta.pop("field_notes", []), *(q.to_json() for q in quality), *checks]
    stage = _glue(frames) if frames else _empty_stage()
    _interrupt.check("read")
    df = _finish(stage, meta)
    del stage
    if rank is not None:
        df = df.with_columns(pl.lit(rank, dtype=pl.Int32).alias("rank"))
    meta["rank"] = rank
    return df, meta


# ---- stage frames: one row per kept event, strings for times, typed args ----------------------

_EPOCH_FRAC = re.compile(rb'"ts"\s*:\s*-?\d{13,}\.\d')
#: float µs timestamps at or above this magnitude (13+ integer digits) may carry sub-µs digits a float64 rounds
_EPOCH_US = 1e12


class _ShapesRecorded(Exception):
    """A chunk holds ``Input Dims`` / ``Input type`` args (shapes recorded; older traces lack the
    record_shapes key): only the exact decoder keeps them."""
_ND_SCHEMA = {
    "ph": pl.String, "cat": pl.String, "name": pl.String, "pid": pl.String, "tid": pl.String,
    "ts": pl.String, "dur": pl.String,
    "args": pl.Struct({
        "correlation": pl.Int64, "External id": pl.Int64, "device": pl.Int64, "stream": pl.Int64,
        "grid": pl.List(pl.Int64), "block": pl.List(pl.Int64), "registers per thread": pl.Int64,
        "shared memory": pl.Int64, "bytes": pl.Int64, "graph id": pl.Int64, "graph node id": pl.Int64,
        "Collective name": pl.String, "In msg nelems": pl.Int64, "Out msg nelems": pl.Int64,
        "Group size": pl.Int64, "dtype": pl.String, "Process Group Name": pl.String,
        "Process Group Description": pl.String, "Process Group Ranks": pl.String, "Seq": pl.Int64,
    }),
}
_STAGE_SCHEMA = {
    "kind": pl.Categorical, "src": pl.Categorical, "name": pl.Categorical, "pid": pl.Int64, "tid": pl.Int64,
    "ts_rel_ns": pl.Int64, "dur_ns": pl.Int64, "correlation": pl.Int64, "external_id": pl.Int64,
    "device": pl.Int64, "stream": pl.Int64, "registers_per_thread": pl.Int64, "shared_mem_bytes": pl.Int64,
    "bytes": pl.Int64, "graph_id": pl.Int64, "graph_node_id": pl.Int64, "coll_name": pl.Categorical,
    "coll_in_nelems": pl.Int64, "coll_out_nelems": pl.Int64, "coll_group_size": pl.Int64, "coll_dtype": pl.Categorical,
    "pg_name": pl.Categorical, "pg_desc": pl.Categorical, "pg_ranks": pl.Categorical, "coll_seq": pl.Int64, "input_dims": pl.String,
    "input_types": pl.String, "grid_x": pl.Int32, "grid_y": pl.Int32, "grid_z": pl.Int32,
    "block_x": pl.Int32, "block_y": pl.Int32, "block_z": pl.Int32,
}
#: the scanner's classification, from the reader's own tables
_TABLES = kscan.Tables(KINETO_KINDS, _SKIP, KNOWN_PHASES, MODULE_PREFIX)
_ARG_RENAME = {
    "External id": "external_id", "registers per thread": "registers_per_thread", "shared memory": "shared_mem_bytes",
    "graph id": "graph_id", "graph node id": "graph_node_id", "Collective name": "coll_name",
    "In msg nelems": "coll_in_nelems", "Out msg nelems": "coll_out_nelems", "Group size": "coll_group_size",
    "dtype": "coll_dtype", "Process Group Name": "pg_name", "Process Group Description": "pg_desc",
    "Process Group Ranks": "pg_ranks", "Seq": "coll_seq",
}


def _empty_stage() -> pl.DataFrame:
    return pl.DataFrame(schema=_STAGE_SCHEMA)


_PA_ARGS = pa.struct([
    ("correlation", pa.int64()), ("External id", pa.int64()), ("device", pa.int64()), ("stream", pa.int64()),
    ("grid", pa.list_(pa.int64())), ("block", pa.list_(pa.int64())), ("registers per thread", pa.int64()),
    ("shared memory", pa.int64()), ("bytes", pa.int64()), ("graph id", pa.int64()), ("graph node id", pa.int64()),
    ("Collective name", pa.string()), ("In msg nelems", pa.int64()), ("Out msg nelems", pa.int64()),
    ("Group size", pa.int64()), ("dtype", pa.string()), ("Process Group Name", pa.string()),
    ("Process Group Description", pa.string()), ("Process Group Ranks", pa.string()), ("Seq", pa.int64()),
    # typed null: any value fails the parse with a message naming the field (-> _ShapesRecorded); free otherwise
    ("Input Dims", pa.null()), ("Input type", pa.null()),
])
_PA_SCHEMA = pa.schema([
    ("ph", pa.string()), ("cat", pa.string()), ("name", pa.string()), ("pid", pa.int64()), ("tid", pa.int64()),
    ("ts", pa.float64()), ("dur", pa.float64()), ("args", _PA_ARGS),
])
try:  # jemalloc hands freed chunk buffers back; mimalloc (the default) kept ~40 MB per 16 MB chunk resident
    pa.set_memory_pool(pa.jemalloc_memory_pool())
except (NotImplementedError, pa.ArrowNotImplementedError):  # pragma: no cover - wheels without jemalloc
    pass
_PA_PARSE = pajson.ParseOptions(explicit_schema=_PA_SCHEMA, unexpected_field_behavior="ignore", newlines_in_values=True)
#: chunks run in our own thread pool; one block per chunk (a block boundary costs a JSON-aware search: ~11% of the parse)
_PA_READ = pajson.ReadOptions(use_threads=False, block_size=4 * _CHUNK_BYTES)


def _pa_read(nd: bytes | bytearray) -> pa.Table | None:
    """Arrow's JSON reader over newline-delimited objects, reading ``nd`` in place (no copy, no GIL)."""
    try:
        return pajson.read_json(pa.BufferReader(pa.py_buffer(nd)), parse_options=_PA_PARSE, read_options=_PA_READ)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
        if "/args/Input " in str(e):
            raise _ShapesRecorded from None
        return None


_WS = np.zeros(256, dtype=bool)
_WS[[0x09, 0x0A, 0x0D, 0x20]] = True
#: whitespace characters looked at between an event's ``},`` and the next ``{``
_MAX_SEP_WS = 8


def _separator_commas(a: np.ndarray) -> np.ndarray:
    """Positions of the commas between the events of a ``[...]`` chunk.

    A separator is ``}`` ``,`` then whitespace that holds a newline, then ``{``
    (torch's ``},\n  {``, one event per line ``},\n{``). A JSON string never holds
    a raw newline, so such a comma is structural; a comma between nested objects
    would make the parse fail and the caller fall back.
    """
    n = a.size
    idx = np.flatnonzero(a[:-2] == 0x7D)
    idx = idx[a[idx + 1] == 0x2C]
    pos = idx + 2
    alive = np.ones(idx.size, dtype=bool)
    newline = np.zeros(idx.size, dtype=bool)
    found = np.zeros(idx.size, dtype=bool)
    for _ in range(_MAX_SEP_WS + 1):
        alive &= pos < n
        c = a[np.minimum(pos, n - 1)]
        found |= alive & newline & (c == 0x7B)
        newline |= alive & (c == 0x0A)
        alive &= _WS[c]
        if not alive.any():
            break
        pos += 1
    seps: np.ndarray = idx[found] + 1
    return seps


def _parse_events(chunk: bytearray) -> pa.Table | None:
    """Parse a ``[...]`` chunk of events as newline-delimited JSON; ``chunk`` is restored before returning.

    The brackets and the separator commas are blanked in place (vectorized), so
    Arrow reads the text where it lies; other layouts go through a regex split.
    """
    a = np.frombuffer(chunk, dtype=np.uint8)
    commas = _separator_commas(a)
    first, last = chunk[0], chunk[-1]
    a[0] = a[-1] = 0x20
    a[commas] = 0x0A
    try:
        tbl = _pa_read(chunk)
    finally:
        a[commas] = 0x2C
        a[0], a[-1] = first, last
    if tbl is None:
        del a
        tbl = _pa_read(_BOUNDARY.sub(b"}\n{", memoryview(chunk)[1:-1]))
    return tbl


def _float_us_to_ns(col: str) -> pl.Expr:
    """float64 µs -> int64 ns without losing the integer part (exact for relative or integral timestamps)."""
    f = pl.col(col)
    ip = f.floor()
    return ip.cast(pl.Int64) * 1000 + ((f - ip) * 1000).round(0).cast(pl.Int64)


def _fast_stage(chunk: bytes | bytearray | memoryview, unknown: dict[str, int], bare: bool = False) -> pl.DataFrame | None:
    """Columnar decode of one chunk (``bare``: without its brackets); None -> use the exact path.

    The native scanner (:mod:`tracekit.ingest.kscan`) when it could be built and the chunk holds no module range
    (``nn.Module: ...`` of a stack trace), else Arrow's JSON reader.
    """
    # the scanner classifies by category only: a chunk with a module range goes through Arrow, which keeps them
    # (the scanner says so: a search of the chunk's text for one cost ~8% of a convert, holding the GIL)
    if kscan.available():
        try:
            return kscan.scan_stage(chunk, _TABLES, _STAGE_SCHEMA, unknown, _PH_KEY, bare=bare)
        except kscan.ModuleRange:
            pass
    return _arrow_stage(bracketed(chunk) if bare else (chunk if isinstance(chunk, bytearray) else bytearray(chunk)), unknown)


def _arrow_stage(chunk: bytearray, unknown: dict[str, int]) -> pl.DataFrame | None:
    """Columnar decode of one ``[...]`` chunk (Arrow's C++ JSON reader); None -> use the exact path.

    Any type surprise (a string pid, a list where a number should be) returns
    None, and so do absolute-epoch float timestamps with sub-µs digits (a
    float64 would round them). ``chunk`` is left as it was given.
    """
    if _EPOCH_FRAC.search(chunk, 0, 1 << 16):  # absolute-epoch float µs: a float64 rounds them (decided before parsing)
        return None
    try:
        tbl = _parse_events(chunk)
    except _ShapesRecorded:
        return None
    if tbl is None:
        return None
    ts = tbl.column("ts")
    lo_hi = pc.min_max(ts)
    big = max(abs(lo_hi["min"].as_py() or 0.0), abs(lo_hi["max"].as_py() or 0.0))
    if big >= _EPOCH_US and _EPOCH_FRAC.search(chunk) or big >= kc.MAX_TIME_NS / 1000:
        return None
    d = pc.min_max(tbl.column("dur"))
    if max(abs(d["min"].as_py() or 0.0), abs(d["max"].as_py() or 0.0)) >= kc.MAX_TIME_NS / 1000:
        return None  # the exact decoder names the event
    # struct fields as top-level columns: polars then holds each kept column's buffers, not the whole
    # args struct (a zero-copy field of an imported struct kept all ~20 fields of every chunk alive)
    ev: pl.DataFrame = pl.from_arrow(tbl.flatten())  # type: ignore[assignment]
    del tbl
    known = list(KINETO_KINDS)
    is_x = pl.col("ph") == "X"
    lf = ev.lazy()
    unk = lf.filter(is_x & ~pl.col("cat").is_in(known) & ~pl.col("cat").is_in(list(_SKIP))).group_by(
        pl.col("cat").fill_null("None")).len().collect()
    for cat, n in unk.iter_rows():
        unknown[str(cat)] = unknown.get(str(cat), 0) + int(n)
    unk_ph = lf.filter(~pl.col("ph").is_in(list(KNOWN_PHASES)) | pl.col("ph").is_null()).group_by(
        pl.col("ph").fill_null("None")).len().collect()
    for ph, n in unk_ph.iter_rows():
        unknown[_PH_KEY + str(ph)] = unknown.get(_PH_KEY + str(ph), 0) + int(n)
    inst = pl.col("ph").is_in(["i", "I"]) & (pl.col("cat").is_null() | ~pl.col("cat").is_in(list(_SKIP))) & pl.col("ts").is_not_null()
    def a(k: str) -> pl.Expr:
        return pl.col(f"args.{k}")

    module = is_x & (pl.col("cat") == "python_function") & pl.col("name").str.starts_with(MODULE_PREFIX)
    out = lf.filter((is_x & pl.col("cat").is_in(known)) | inst | module).select(
        pl.when(module).then(pl.lit("range"))
        .when(pl.col("ph") == "X").then(pl.col("cat").replace_strict(KINETO_KINDS, default=None)).otherwise(pl.lit("instant")).alias("kind"),
        pl.col("cat").alias("src"),
        pl.col("name").fill_null(""),
        pl.col("pid"),
        pl.col("tid"),
        _float_us_to_ns("ts").alias("ts_rel_ns"),
        _float_us_to_ns("dur").alias("dur_ns"),  # null: missing or not a number (counted, then 0, in _finish)
        *[a(k).alias(_ARG_RENAME.get(k, k)) for k in ("correlation", "External id", "device", "stream",
          "registers per thread", "shared memory", "bytes", "graph id", "graph node id", "Collective name",
          "In msg nelems", "Out msg nelems", "Group size", "dtype", "Process Group Name",
          "Process Group Description", "Process Group Ranks", "Seq")],
        pl.lit(None, dtype=pl.String).alias("input_dims"),
        pl.lit(None, dtype=pl.String).alias("input_types"),
        *[a(g).list.get(i, null_on_oob=True).cast(pl.Int32).alias(f"{g}_{x}") for g in ("grid", "block") for i, x in enumerate("xyz")],
    )
    return out.select([pl.col(k).cast(t) for k, t in _STAGE_SCHEMA.items()]).collect()


def _exact_stage(chunk: bytes | bytearray | memoryview, path: Path, unknown: dict[str, int]) -> pl.DataFrame:
    """msgspec decode of one chunk with exact decimal timestamps; field types and ranges checked
    (:mod:`tracekit.ingest.kineto_checks`; wrong types counted in ``unknown``)."""
    cols = _Cols()
    for evs in _decode_events(chunk, path, QualityLog()):
        cols.add(evs, unknown)
    return _stage_from_cols(cols, path, unknown)


#: exact-decoder field -> its name in the file (messages and wrong-type counts)
_FILE_NAMES = {"pid": "pid", "tid": "tid", **{f: f"args.{_Args.__struct_encode_fields__[i]}" for i, f in enumerate(_ARG_FIELDS)}}


def _stage_from_cols(cols: _Cols, path: Path | str = "trace", tally: dict[str, int] | None = None) -> pl.DataFrame:
    c = cols.c
    n = len(c["_kind"])
    if not n:
        return _empty_stage()
    tally = {} if tally is None else tally
    names = c["name"]

    def ints(field: str) -> pl.Series:
        return kc.checked_ints(_FILE_NAMES[field], c[field], names, path, tally, labels=field in ("pid", "tid")).alias(field)

    def strs(field: str) -> pl.Series:  # any JSON value keeps its text (a list as its repr): nothing is lost
        return _str_series(c[field]).alias(field)

    kernel = [k == "kernel" for k in c["_kind"]]
    for g in ("grid", "block"):
        kc.dims_field(_FILE_NAMES[g], c[g], kernel, tally)
    kc.text_field("name", names, tally)

    def dim3(field: str, i: int) -> pl.Series:
        vals = c[field]
        out = [v[i] if v.__class__ is list and len(v) > i else None for v in vals]
        return pl.Series(out, dtype=pl.Int32, strict=False)

    st = pl.DataFrame(
        [
            pl.Series("kind", c["_kind"], dtype=pl.String),
            _str_series(c["cat"]).alias("src"),
            _str_series(c["name"]).alias("name").fill_null(""),
            ints("pid"),
            ints("tid"),
            _str_series(c["ts"]).alias("ts_s"),
            _str_series(c["dur"]).alias("dur_s"),
            ints("correlation"), ints("external_id"), ints("device"), ints("stream"),
            ints("registers").alias("registers_per_thread"), ints("shared_memory").alias("shared_mem_bytes"),
            ints("bytes"), ints("graph_id"), ints("graph_node_id"), strs("coll_name"),
            ints("in_nelems").alias("coll_in_nelems"), ints("out_nelems").alias("coll_out_nelems"),
            ints("group_size").alias("coll_group_size"), strs("dtype").alias("coll_dtype"), strs("pg_name"),
            strs("pg_desc"), strs("pg_ranks"), ints("seq").alias("coll_seq"),
            pl.Series("input_dims", [_json_or_none(v) for v in c["input_dims"]], dtype=pl.String),
            pl.Series("input_types", [_json_or_none(v) for v in c["input_type"]], dtype=pl.String),
            dim3("grid", 0).alias("grid_x"), dim3("grid", 1).alias("grid_y"), dim3("grid", 2).alias("grid_z"),
            dim3("block", 0).alias("block_x"), dim3("block", 1).alias("block_y"), dim3("block", 2).alias("block_z"),
        ]
    )
    kc.check_time_text(st, {"ts_s": "ts", "dur_s": "dur"}, path)
    st = st.with_columns(
        _ns_expr("ts_s", unit_ns=1000).alias("ts_rel_ns"),
        _ns_expr("dur_s", unit_ns=1000).alias("dur_ns"),
    )
    return st.select([pl.col(k).cast(t) for k, t in _STAGE_SCHEMA.items()])


def _finish(st: pl.DataFrame, meta: dict[str, Any]) -> pl.DataFrame:
    """Stage frame -> schema frame: ns times, ints, memcpy kinds."""
    base = meta.get("base_time_ns") or 0
    absent = [pl.lit(None, dtype=t).alias(k) for k, t in _STAGE_SCHEMA.items() if k not in st.schema]
    if absent:  # dropped by _sparse: a null literal takes no memory
        st = st.with_columns(absent)
    df = st.with_columns((pl.col("ts_rel_ns") + pl.lit(base, dtype=pl.Int64)).alias("ts_ns"))
    df = check_times(df, meta, Path(meta.get("source_file") or "trace").name)
    # memcpy kind and memory kinds from the memcpy rows only, attached by row number as categoricals
    # (no text column the length of the rank, no hash join over every row)
    is_mc = pl.col("kind") == "memcpy"
    mc = df.select(pl.arg_where(is_mc).alias("_row"), pl.col("name").filter(is_mc).cast(pl.String).alias("_n"))
    if mc.height:
        n = pl.col("_n")
        df = attach_rows(df, mc.select(
            "_row",
            n.str.extract(r"^Memcpy (\w+)", 1).cast(pl.Categorical).alias("memcpy_kind"),
            n.str.extract(r"\((\w+) ->", 1).cast(pl.Categorical).alias("src_mem"),
            n.str.extract(r"-> (\w+)\)", 1).cast(pl.Categorical).alias("dst_mem"),
        ), "_row")
    df = df.with_columns(
        pl.when(pl.col("kind").is_in(["kernel", "memcpy", "memset", "gpu_range", "sync"])).then(pl.col("device")).otherwise(None).cast(pl.Int32).alias("device"),
        pl.lit(0, dtype=pl.Int32).alias("rank"),
    )
    return conform(df)


def _detect(p: Path) -> bool:
    return p.name.endswith((".json", ".json.gz"))


READER = Reader("kineto", _detect, lambda p, rank: read_kineto(p, rank=rank))
