"""Find trace sources and their ranks from paths (files or directories).

Naming conventions understood (rank from the file name is a fallback; the
trace's own ``distributedInfo.rank`` wins):

- SGLang: ``[<prefix>-]<profile_id>-TP-<tp>[-DP-<dp>][-PP-<pp>][-EP-<ep>][-<STAGE>].trace.json.gz``
- HTA / torch: ``rank-3.json.gz``, ``rank_3...``, ``rank3...``, ``..._rank_1.json.gz``
- tracekit capture windows: ``rank<r>.win<k>.trace.json.gz`` (several files per rank)
- Nsight Systems: ``*.sqlite`` and ``*_pqtdir`` / parquetdir exports (``..rank0..``)
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from tracekit._errors import InputError, os_reason
from tracekit.sglang_names import SGLANG_NAME

__all__ = ["Source", "discover", "rank_from_name", "SGLANG_NAME"]

_RANK = re.compile(r"(?:^|[^a-z])rank[-_]?(\d+)", re.IGNORECASE)
_WINDOW = re.compile(r"\.win(\d+)\.", re.IGNORECASE)
_JSON_SUFFIXES = (".json", ".json.gz")


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


def discover(inputs: Sequence[str | Path]) -> list[Source]:
    """Expand files/dirs into sources. Raises InputError for missing paths or nothing found."""
    out: list[Source] = []
    for raw in inputs:
        p = Path(raw)
        st = _stat(p)
        if stat.S_ISDIR(st.st_mode) and not _is_nsys_dir(p):
            found = []
            try:
                children = sorted(p.iterdir())
            except OSError as e:
                raise InputError(f"{p}: cannot list the directory {os_reason(e, writing=False)}") from None
            for child in children:
                if child.name.startswith("."):
                    continue
                try:
                    s = _classify(child)
                except OSError as e:  # a symlink loop named like a directory entry
                    raise InputError(f"{child}: cannot read {os_reason(e, writing=False)}") from None
                if s is not None:
                    found.append(_check_source(s))
            if not found:
                raise InputError(f"{p}: no trace files (*.json, *.json.gz, *.sqlite, nsys parquetdir) in this directory")
            out.extend(found)
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
