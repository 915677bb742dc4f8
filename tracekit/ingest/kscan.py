"""The native Kineto event scanner (``_kscan.c``): one chunk of ``traceEvents`` text -> stage columns.

Contract of :func:`scan_stage`: a ``[...]`` chunk of events in, the chunk's stage frame out (the columns
and types of ``kineto._STAGE_SCHEMA``, the rows of the kinds tracekit keeps, in file order) plus the
counts of skipped events of unknown category or phase, exactly as the exact decoder
(``kineto._exact_stage``) gives them; or None when the chunk holds something only the exact decoder
models (a timestamp in exponent notation, a recorded shape, a string where a number belongs, a key
spelled with escapes, invalid JSON...): the caller then decodes that chunk exactly. Tests compare the
two on every real trace and on fuzzed documents.

Why native: on real traces the JSON text is the cost (85% of events are CPU operators and runtime
calls). The scanner validates the JSON and reads only the fields the schema needs, one pass, no
Python object per event, with the GIL released (chunks of one file run on several cores). Numbers
are read from their decimal text, so timestamps are exact to the ns at any magnitude.

Build: the C file is compiled once (``cc -O2 -shared``) into a library named by the source's hash,
next to it when the package directory is writable, else under the user cache
(:func:`tracekit._env.cache_dir`); wheels ship it prebuilt (``hatch_build.py``). Without a C compiler
the readers fall back to the slower decoders and say so in the trace's quality notes
(``slow_decoder``).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shlex
import subprocess
import sysconfig
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from tracekit import _env

__all__ = ["available", "unavailable_reason", "scan_stage", "library_path", "ModuleRange"]

_SRC = Path(__file__).with_name("_kscan.c")
#: numeric fields, in the C enum's order -> stage column (None: kept by the scanner for the checks only)
NUM_FIELDS = ("pid", "tid", "ts_rel_ns", "dur_ns", "correlation", "external_id", "device", "stream",
              "registers_per_thread", "shared_mem_bytes", "bytes", "graph_id", "graph_node_id", "coll_in_nelems",
              "coll_out_nelems", "coll_group_size", "coll_seq", "grid_x", "grid_y", "grid_z", "block_x", "block_y",
              "block_z")
#: string fields, in the C enum's order
STR_FIELDS = ("ph", "src", "name", "coll_name", "coll_dtype", "pg_name", "pg_desc", "pg_ranks")
_SYNTAX, _CAPACITY, _UNSUPPORTED, _MODULE = -1, -2, -3, -4
_UNKNOWN_CAT, _UNKNOWN_PH = -2, -3

_lock = threading.Lock()
_lib: Any = None
_why: str | None = None


class ModuleRange(Exception):
    """The chunk holds a module range (an event named ``nn.Module: ...``): decode it with a reader that keeps them."""


def _tag() -> str:
    return hashlib.sha256(_SRC.read_bytes()).hexdigest()[:16]


def library_path(directory: Path) -> Path:
    """Where the library built from this source lives in ``directory``."""
    return directory / f"_kscan-{_tag()}.so"


def _compiler() -> list[str]:
    cc = sysconfig.get_config_var("CC") or "cc"
    return shlex.split(str(cc))[:1] or ["cc"]


def build(out: Path) -> None:
    """Compile the scanner into ``out`` (atomically; raises OSError / CalledProcessError)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".kscan.", suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        subprocess.run([*_compiler(), "-O2", "-shared", "-fPIC", "-std=c99", "-o", tmp, str(_SRC)],
                       check=True, capture_output=True, timeout=300)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _locate() -> Path:
    """An existing library for this source, else a freshly built one."""
    dirs = [_SRC.parent, _env.cache_dir() / "kscan"]
    for d in dirs:
        p = library_path(d)
        if p.is_file():
            return p
    last: Exception | None = None
    for d in dirs:
        try:
            build(library_path(d))
            return library_path(d)
        except (OSError, subprocess.SubprocessError) as e:
            last = e
    raise OSError(f"no C compiler could build it ({last})")


def _load() -> Any:
    global _lib, _why
    with _lock:
        if _lib is None and _why is None:
            try:
                lib = ctypes.CDLL(str(_locate()))
                f = lib.tk_scan_events
                f.restype = ctypes.c_int64
                f.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p,
                              ctypes.c_void_p, ctypes.c_int32, ctypes.c_char_p, ctypes.c_int64]
                _lib = lib
            except OSError as e:
                _why = str(e)
    return _lib


def available() -> bool:
    """Whether the native scanner could be loaded (built on first use)."""
    return _load() is not None


def unavailable_reason() -> str | None:
    """Why the scanner is unavailable (None when it is available)."""
    _load()
    return _why


def _table(entries: dict[str, int]) -> np.ndarray:
    """Packed lookup table: (len, utf-8 bytes, int8 code) per entry, then 0."""
    out = bytearray()
    for k, code in entries.items():
        b = k.encode()
        if 0 < len(b) < 256:
            out += bytes([len(b)]) + b + int(code).to_bytes(1, "little", signed=True)
    return np.frombuffer(bytes(out + b"\0"), dtype=np.uint8)


class Tables:
    """The classification the scanner applies, built from the reader's own tables (one owner)."""

    def __init__(self, kinds: dict[str, str], skip: set[str] | frozenset[str], phases: frozenset[str], module_prefix: str = "") -> None:
        """``module_prefix``: names of module ranges (the scanner raises :class:`ModuleRange` on one; "": none)."""
        self.module = module_prefix.encode()
        self.kind_names = sorted(set(kinds.values())) + ["instant"]
        code = {k: i for i, k in enumerate(self.kind_names)}
        cats = {c: -1 for c in skip}
        cats.update({c: code[k] for c, k in kinds.items()})
        self.cats = _table(cats)
        self.phases = _table({p: 1 for p in phases})
        self.instant = code["instant"]
        self.kind_values = pa.array(self.kind_names, pa.string())


class _Out(ctypes.Structure):
    """The C ``Out`` struct (layout in ``_kscan.c``)."""

    _fields_ = [("cap", ctypes.c_int64), ("hcap", ctypes.c_int64), ("tsize", ctypes.c_int64),
                *[(k, ctypes.c_void_p) for k in ("num", "nst", "code", "doff", "ndict", "heap", "table", "kind", "shapes")],
                ("rows", ctypes.c_int64), ("stop", ctypes.c_int64), ("why", ctypes.c_int64)]


class _Buffers:
    """Scratch arrays of the scanner: ``cap`` rows of an ``n``-byte chunk, string dictionaries of up to
    ``tsize // 2`` entries. One set per thread is reused (new arrays cost a page fault per 4 kB)."""

    def __init__(self, n: int, cap: int, tsize: int) -> None:
        ns, nn = len(STR_FIELDS), len(NUM_FIELDS)
        self.n, self.cap, self.tsize = n, cap, tsize
        self.num = np.empty((nn, cap), dtype=np.int64)
        self.nst = np.empty((cap, nn), dtype=np.uint8)
        self.code = np.empty((ns, cap), dtype=np.int32)
        self.doff = np.empty((ns, tsize // 2 + 1), dtype=np.int32)
        self.ndict = np.zeros(ns, dtype=np.int64)
        self.heap = np.empty((ns, max(n, 1)), dtype=np.uint8)
        self.table = np.empty((ns, tsize), dtype=np.int32)
        self.kind = np.empty(cap, dtype=np.int8)
        self.shapes = np.empty(cap, dtype=np.uint8)
        self.out = _Out(cap, self.heap.shape[1], tsize, *[getattr(self, k).ctypes.data for k in
                        ("num", "nst", "code", "doff", "ndict", "heap", "table", "kind", "shapes")], 0, 0, 0)

    def fits(self, n: int, cap: int, tsize: int) -> bool:
        return self.n >= n and self.cap >= cap and self.tsize >= tsize


_scratch = threading.local()


def _buffers(n: int, cap: int, tsize: int) -> _Buffers:
    """This thread's scratch arrays, grown when the chunk needs more."""
    b: _Buffers | None = getattr(_scratch, "b", None)
    if b is None or not b.fits(n, cap, tsize):
        b = _Buffers(max(n, b.n if b else 0), max(cap, b.cap if b else 0), max(tsize, b.tsize if b else 0))
        _scratch.b = b
    return b


def release_scratch() -> None:
    """Drop this thread's scratch arrays (after the last chunk of a file)."""
    _scratch.b = None


def scan(chunk: bytes | bytearray | memoryview, tables: Tables, *, bare: bool = False) -> tuple[int, _Buffers] | None:
    """Run the scanner over a ``[...]`` chunk (``bare``: the events without brackets); None when it
    declines the chunk (invalid JSON or a value it does not model); raises :class:`ModuleRange` for a chunk
    holding a module range. The arrays returned are this thread's scratch: read them before the thread's
    next call."""
    lib = _load()
    if lib is None:
        return None
    src = np.frombuffer(chunk, dtype=np.uint8)
    n = src.size
    cap, tsize = n // 48 + 64, 4096
    for _ in range(4):
        b = _buffers(n, cap, tsize)
        rc = lib.tk_scan_events(src.ctypes.data, n, int(bare), ctypes.byref(b.out), tables.cats.ctypes.data,
                                tables.phases.ctypes.data, tables.instant, tables.module, len(tables.module))
        if rc == _MODULE:
            raise ModuleRange()
        if rc != _CAPACITY:
            return (int(b.out.rows), b) if rc == 0 else None
        if b.out.why == 1:
            cap = n // 2 + 64
        else:
            tsize *= 16
    return None


def _bitmap(ok: np.ndarray) -> pa.Buffer | None:
    """Arrow validity bitmap of a boolean mask (None: all valid)."""
    return None if ok.all() else pa.py_buffer(np.packbits(ok, bitorder="little"))


def _dictionary(codes: np.ndarray, values: pa.Array) -> pa.Array:
    """An Arrow dictionary array (a polars Categorical) from int32 codes (negative: null) and values.

    Arrow arrays are built from buffers: ``pa.array()`` on numpy input would import pandas (~0.4 s).
    """
    codes = np.array(codes, dtype=np.int32)  # a copy: the scratch is reused
    indices = pa.Array.from_buffers(pa.int32(), codes.size, [_bitmap(codes >= 0), pa.py_buffer(codes)])
    return pa.DictionaryArray.from_arrays(indices, values)


def _strings(b: _Buffers, i: int, rows: int) -> pa.Array:
    """String column ``i``: its codes with the chunk's distinct values as the dictionary."""
    nd = int(b.ndict[i])
    off = np.array(b.doff[i, : nd + 1])
    heap = np.array(b.heap[i, : max(int(off[-1]), 1)])
    values = pa.Array.from_buffers(pa.string(), nd, [None, pa.py_buffer(off), pa.py_buffer(heap)])
    return _dictionary(b.code[i, :rows], values)


def _ints(b: _Buffers, i: int, rows: int, dtype: Any) -> pa.Array | None:
    """Numeric column ``i`` (null where its status is not ok); None when no row has a value."""
    ok = b.nst[:rows, i] == 1
    if not ok.any():
        return None
    vals = b.num[i, :rows].astype(dtype)  # a copy: the scratch is reused
    return pa.Array.from_buffers(pa.from_numpy_dtype(dtype), rows, [_bitmap(ok), pa.py_buffer(vals)])


_INT32 = frozenset({"grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z"})


def scan_stage(chunk: bytes | bytearray | memoryview, tables: Tables, stage_schema: dict[str, Any],
               unknown: dict[str, int], unknown_ph_key: str, *, bare: bool = False) -> pl.DataFrame | None:
    """The chunk's stage frame (module doc), or None: decode it exactly. Adds to ``unknown``.

    Columns that are null in every row are left out (as ``kineto._sparse`` would drop them).
    """
    res = scan(chunk, tables, bare=bare)
    if res is None:
        return None
    rows, b = res
    kind = b.kind[:rows]
    odd = bool((kind < 0).any())
    if odd:
        _count_unknown(b, rows, unknown, unknown_ph_key)
    arrays: dict[str, pa.Array] = {}
    for name in stage_schema:
        if name == "kind":
            arrays[name] = _dictionary(kind, tables.kind_values)
        elif name in _STR_INDEX:
            i = _STR_INDEX[name]
            if name in ("src", "name") or (b.code[i, :rows] >= 0).any():
                arrays[name] = _strings(b, i, rows)
        elif name in _NUM_INDEX:
            a = _ints(b, _NUM_INDEX[name], rows, np.int32 if name in _INT32 else np.int64)
            if a is not None:
                arrays[name] = a
    batch = pa.RecordBatch.from_arrays(list(arrays.values()), names=list(arrays))
    if odd:
        batch = batch.filter(pa.Array.from_buffers(pa.bool_(), rows, [None, pa.py_buffer(np.packbits(kind >= 0, bitorder="little"))]))
    df: pl.DataFrame = pl.from_arrow(batch)  # type: ignore[assignment]
    return df


_STR_INDEX = {k: i for i, k in enumerate(STR_FIELDS)}
_NUM_INDEX = {k: i for i, k in enumerate(NUM_FIELDS)}


def _count_unknown(b: _Buffers, rows: int, unknown: dict[str, int], ph_key: str) -> None:
    """Counts of X events of unknown category (by ``cat``) and of events of unknown phase (by ``ph``)."""
    kind = b.kind[:rows]
    for code, col, prefix in ((_UNKNOWN_CAT, "src", ""), (_UNKNOWN_PH, "ph", ph_key)):
        sel = kind == code
        if not sel.any():
            continue
        s: pl.Series = pl.from_arrow(_strings(b, _STR_INDEX[col], rows))  # type: ignore[assignment]
        for k, v in s.filter(pl.Series(sel)).cast(pl.String).fill_null("None").value_counts().iter_rows():
            key = prefix + str(k)
            unknown[key] = unknown.get(key, 0) + int(v)
