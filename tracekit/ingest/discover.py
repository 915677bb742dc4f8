"""Find trace sources and their ranks from paths (files or directories).

Naming conventions understood (rank from the file name is a fallback; the
trace's own ``distributedInfo.rank`` wins):

- SGLang: ``[<prefix>-]<profile_id>-TP-<tp>[-DP-<dp>][-PP-<pp>][-EP-<ep>][-<STAGE>].trace.json.gz``
- HTA / torch: ``rank-3.json.gz``, ``rank_3...``, ``rank3...``, ``..._rank_1.json.gz``
- tracekit capture windows: ``rank<r>.win<k>.trace.json.gz`` (several files per rank)
- Nsight Systems: ``*.sqlite`` and ``*_pqtdir`` / parquetdir exports (``..rank0..``)
"""

from __future__ import annotations

import gzip
import os
import re
import stat
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from tracekit._errors import InputError, os_reason
from tracekit.sglang_names import SGLANG_NAME

__all__ = ["Source", "discover", "rank_from_name", "SGLANG_NAME", "not_a_trace"]

_RANK = re.compile(r"(?:^|[^a-z])rank[-_]?(\d+)", re.IGNORECASE)
_WINDOW = re.compile(r"\.win(\d+)\.", re.IGNORECASE)
_JSON_SUFFIXES = (".json", ".json.gz")
#: bytes of a JSON file read to tell whether it can be a Kineto trace
_SNIFF_BYTES = 1 << 20


@dataclass(frozen=True)
class Source:
    path: Path
    fmt: str  # "kineto" | "nsys"
    rank_hint: int | None
    capture_id: str | None  # SGLang profile id, when the name carries one
    window: int | None  # tracekit capture window index
    stage: str | None


def rank_from_name(name: str) -> tuple[int | None, str | None, str | None]:
    """(rank, capture id, stage) parsed from a file name; rank None when absent.

    For SGLang names with DP/PP parts, the TP index is returned; the caller
    prefers ``distributedInfo.rank`` which is the global rank.
    """
    m = SGLANG_NAME.match(name)
    if m:
        return int(m["tp"]), m["pid"], m["stage"]
    m = _RANK.search(name)
    if m:
        return int(m[1]), None, None
    return None, None, None


def _is_nsys_dir(p: Path) -> bool:
    try:
        return p.is_dir() and (p / "TARGET_INFO_SESSION_START_TIME.parquet").exists()
    except OSError:  # a symlink loop (Python < 3.12 raises from is_dir)
        return False


def _classify(p: Path) -> Source | None:
    """The source at ``p``: its format from the reader registry (:mod:`tracekit.ingest.readers`), rank, capture
    id, window and stage from the file name."""
    from tracekit.ingest.readers import reader_for

    reader = reader_for(p)
    if reader is None:
        return None
    name = p.name
    r, cid, st = rank_from_name(name)
    if reader.split is not None:  # a report that may hold several ranks: no SGLang id, no capture window
        return Source(p, reader.fmt, r, None, None, None)
    w = _WINDOW.search(name)
    return Source(p, reader.fmt, r, cid, int(w[1]) if w else None, st)


def _stat(p: Path) -> os.stat_result:
    """``os.stat`` with one-line errors: missing, a symlink loop, no permission."""
    try:
        return os.stat(p)
    except FileNotFoundError:
        if os.path.islink(p):
            raise InputError(f"{p}: a symbolic link to a missing file; fix the link or pass the file itself") from None
        raise InputError(f"{p}: no such file or directory; check the path") from None
    except OSError as e:
        raise InputError(f"{p}: cannot read {os_reason(e, writing=False)}") from None


def _check_source(s: Source) -> Source:
    """A source must be a regular file (or an nsys parquetdir) that can be read.

    A FIFO or a device named ``*.json`` would block or never end; a symlink
    loop cannot be opened.
    """
    st = _stat(s.path)
    if stat.S_ISDIR(st.st_mode):
        if not os.access(s.path, os.R_OK | os.X_OK):
            raise InputError(f"{s.path}: cannot read (Permission denied); check the directory's permissions")
        return s
    if not stat.S_ISREG(st.st_mode):
        kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else ("a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "not a regular file")
        raise InputError(f"{s.path}: is {kind}, not a trace file; pass the trace file itself")
    if not os.access(s.path, os.R_OK):
        raise InputError(f"{s.path}: cannot read (Permission denied); check the file's permissions")
    return s


def not_a_trace(p: Path, fmt: str) -> str | None:
    """Why a file of format ``fmt`` found in a directory is clearly no trace, or None when it may be one.

    Kineto JSON (``.json`` / ``.json.gz``): empty, not a JSON object (a list of settings, other data), or an
    object without ``traceEvents`` in a file read to its end (a PyTorch execution trace, a config). Other
    formats, unreadable or corrupt files: None (the reader gives its own one-line error for them)."""
    if fmt != "kineto":
        return None
    try:
        with (gzip.open(p, "rb") if p.name.endswith(".gz") else open(p, "rb")) as f:
            head = f.read(_SNIFF_BYTES)
            whole = not f.read(1)
    except (OSError, EOFError, zlib.error):
        return None
    body = head.lstrip()
    if not body and whole:
        return "an empty file"
    if body[:1] not in (b"{", b""):
        return "JSON that is not an object (a Kineto trace is {\"traceEvents\": [...]})"
    if whole and b'"traceEvents"' not in head:
        return "no 'traceEvents' key (not a Kineto/Chrome trace, e.g. an execution trace or a config)"
    return None


def _dir_sources(p: Path, skipped: list[tuple[Path, str]]) -> list[Source]:
    """The trace files in directory ``p``; every other (non-hidden) file is appended to ``skipped`` with why."""
    try:
        children = sorted(p.iterdir())
    except OSError as e:
        raise InputError(f"{p}: cannot list the directory {os_reason(e, writing=False)}") from None
    found: list[Source] = []
    mine: list[tuple[Path, str]] = []
    for child in children:
        if child.name.startswith("."):
            continue
        try:
            s = _classify(child)
        except OSError as e:  # a symlink loop named like a directory entry
            raise InputError(f"{child}: cannot read {os_reason(e, writing=False)}") from None
        if s is None:
            if child.is_file():
                mine.append((child, "not a trace format tracekit reads"))
            continue
        why = not_a_trace(child, s.fmt) if child.is_file() else None
        if why:
            mine.append((child, why))
        else:
            found.append(_check_source(s))
    if not found:
        if mine:
            listed = "; ".join(f"{c.name}: {w}" for c, w in mine[:3]) + (f"; and {len(mine) - 3} more" if len(mine) > 3 else "")
            raise InputError(f"{p}: no trace files in this directory, only unsupported ones ({listed}); "
                             "pass a directory of Kineto JSON (.json, .json.gz), nsys .sqlite or nsys parquetdir exports")
        raise InputError(f"{p}: no trace files in this directory (it holds no files); expected Kineto JSON (.json, .json.gz), "
                         "nsys .sqlite or an nsys parquetdir")
    skipped.extend(mine)
    return found


def discover(inputs: Sequence[str | Path], skipped: list[tuple[Path, str]] | None = None) -> list[Source]:
    """Expand files/dirs into sources. Raises InputError for missing paths or nothing found.

    In a directory, files that are no trace (other formats; JSON that is clearly not a Kineto trace,
    :func:`not_a_trace`) are skipped and appended to ``skipped`` as ``(path, why)``, unless the directory
    holds nothing else (then an InputError lists them). A file given by name is read or refused, never skipped."""
    out: list[Source] = []
    skip: list[tuple[Path, str]] = skipped if skipped is not None else []
    for raw in inputs:
        p = Path(raw)
        st = _stat(p)
        if stat.S_ISDIR(st.st_mode) and not _is_nsys_dir(p):
            out.extend(_dir_sources(p, skip))
        else:
            s = _classify(p)
            if s is None:
                raise InputError(f"{p}: unsupported input; expected Kineto JSON (.json/.json.gz), nsys .sqlite or an nsys parquetdir")
            out.append(_check_source(s))
    # drop merged SGLang files when per-rank files are present (merged ones duplicate events)
    if any(s.path.name.startswith("merged-") for s in out) and any(not s.path.name.startswith("merged-") for s in out):
        out = [s for s in out if not s.path.name.startswith("merged-")]
    ids = {s.capture_id for s in out if s.capture_id}
    if len(ids) > 1:
        raise InputError(
            "files from different captures are mixed (SGLang profile ids " + ", ".join(sorted(ids)) + "); convert one capture at a time"
        )
    return out
