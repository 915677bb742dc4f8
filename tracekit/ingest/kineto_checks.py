"""Type and range checks of the Kineto fields the reader keeps (docs/reliability.md, round three).

Contract: every field the Kineto reader turns into a column or into rank metadata
goes through one of these functions where it is read, so that

- a number no ``int64`` nanosecond column can hold (``ts``, ``dur``,
  ``baseTimeNanoseconds`` beyond :data:`MAX_TIME_NS`, an integer ``args`` field
  beyond int64) is an :class:`InputError` naming the field and the event;
- a value of the wrong type (a boolean stream, a list where a number belongs,
  ``args`` that is not an object) is left empty and *counted per field*; the
  counts become one ``bad_field_types`` quality flag (:func:`quality_of`);
  a decimal or ``0x`` hexadecimal integer written as text (ROCm writes
  ``"stream": "0x0"``, vLLM ``"bytes": "256"``) is read as its number;
- JSON nested deeper than the decoder's recursion limit is an error that says
  where (:func:`deep_offset`), never a ``RecursionError``;
- lone UTF-16 surrogate escapes (valid JSON, not valid text) are replaced by
  U+FFFD (:func:`fix_lone_surrogates`) and counted.

Counts travel in the reader's per-chunk tally (a ``dict[str, int]`` that is
summed over chunks and threads) under keys made by :func:`tally_key`, so a
parser rewrite keeps them by passing the tally along. All checks of clean input
cost a type scan per column (``set(map(type, values))``) or one vectorized
aggregate; the per-value work runs only on the values that fail it.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from tracekit._errors import InputError

__all__ = [
    "MAX_TIME_NS", "INT64_MIN", "INT64_MAX", "tally_key", "is_check_key", "quality_of", "checked_ints", "check_time_text",
    "base_time_ns", "device_props", "text_field", "dims_field", "deep_offset", "fix_lone_surrogates", "count_surrogates",
    "count_trailing", "type_name", "SURROGATES_KEY", "MAX_JSON_DEPTH", "too_deep",
]

#: largest |timestamp| or duration in ns a trace may hold: the sum of two stays inside int64 (146 years)
MAX_TIME_NS = 1 << 62
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
#: tally key prefixes (the reader's per-chunk count dict also holds unknown categories and phases)
_FIELD = "\x00field:"
_SURROGATES = SURROGATES_KEY = "\x00surrogates"
_TRAILING = "\x00trailing:"
_NONE = type(None)
_HEX = re.compile(r"\s*[-+]?(0[xX][0-9a-fA-F]+|\d+)\s*")


def type_name(v: Any) -> str:
    """The JSON name of a decoded value's type, for messages."""
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, float):
        return "fractional number" if math.isfinite(v) else "non-finite number"
    if isinstance(v, str) and _float_text(v) is not None:
        return "fractional number"
    return {str: "text", list: "list", dict: "object", int: "integer", _NONE: "null"}.get(type(v), type(v).__name__)


def tally_key(field: str, kind: str) -> str:
    """Key of a wrong-type count (``field`` as in the file, e.g. ``args.stream``; ``kind`` its type name)."""
    return f"{_FIELD}{field}\x00{kind}"


def is_check_key(key: str) -> bool:
    """Whether ``key`` of a reader tally is one of this module's (not an unknown category)."""
    return key.startswith((_FIELD, _SURROGATES, _TRAILING))


def _shown(v: Any) -> str:
    numeric_text = isinstance(v, str) and _float_text(v) is not None
    r = v.strip() if numeric_text else repr(v) if not isinstance(v, float) else f"{v:g}"
    return r if len(r) <= 40 else r[:37] + "..."


def _event(name: Any) -> str:
    return f"event {str(name)[:60]!r}" if name is not None else "an event"


def _range_error(path: Path | str, field: str, value: Any, name: Any, limit: str) -> InputError:
    return InputError(f"{path}: {field} {_shown(value)} of {_event(name)} is outside {limit}; the file is corrupt; "
                      "fix or remove that event, or re-export the trace")


def _as_int(v: Any) -> int | None:
    """``v`` as an integer when it is one (also integral floats and decimal/hex text); None otherwise."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return int(v) if math.isfinite(v) and v.is_integer() else None
    if isinstance(v, str):
        if _HEX.fullmatch(v):
            return int(v.strip(), 0) if "x" in v.lower() else int(v.strip())
        f = _float_text(v)  # the exact decoder hands numbers with a fraction or exponent over as their text
        return int(f) if f is not None and math.isfinite(f) and f.is_integer() else None
    return None


def _float_text(v: str) -> float | None:
    try:
        return float(v)
    except ValueError:
        return None


def checked_ints(field: str, vals: list[Any], names: list[Any], path: Path | str, tally: dict[str, int],
                 *, only: list[bool] | None = None, labels: bool = False) -> pl.Series:
    """``vals`` (decoded JSON values of one field, one per event) as an Int64 series.

    Integers outside int64: :class:`InputError` naming ``field`` and the event. Values that are
    not integers (booleans, fractions, lists, objects, other text) become null and are counted in
    ``tally``; ``only`` (per event) limits the counting to the events where the field matters; ``labels``: text
    that is not a number is a label, left empty uncounted (the profiler's own lanes have ``"pid": "Spans"``).
    """
    if set(map(type, vals)) <= {int, _NONE}:
        try:
            return pl.Series(field, vals, dtype=pl.Int64)
        except (TypeError, OverflowError, pl.exceptions.PolarsError):
            pass  # an integer beyond int64: found below
    out: list[int | None] = []
    for i, v in enumerate(vals):
        n = _as_int(v) if v is not None else None
        if n is not None and not INT64_MIN <= n <= INT64_MAX:
            raise _range_error(path, field, v, names[i] if i < len(names) else None, "the 64-bit integer range")
        if n is None and v is not None and (only is None or only[i]) and not (labels and isinstance(v, str)):
            k = tally_key(field, type_name(v))
            tally[k] = tally.get(k, 0) + 1
        out.append(n)
    return pl.Series(field, out, dtype=pl.Int64)


def dims_field(field: str, vals: list[Any], kernel: list[bool], tally: dict[str, int]) -> None:
    """Count the kernel events whose ``grid`` / ``block`` is not a list of up to three int32 integers."""
    if set(map(type, vals)) <= {list, _NONE} and all(
            len(v) <= 3 and all(type(x) is int and 0 <= x < 1 << 31 for x in v) for v in vals if v is not None):
        return
    for v, k in zip(vals, kernel):
        if not k or v is None:
            continue
        if not isinstance(v, list):
            kind = type_name(v)
        elif not all(type(x) is int and 0 <= x < 1 << 31 for x in v[:3]):
            kind = "list of non-integers"
        else:
            continue
        key = tally_key(field, kind)
        tally[key] = tally.get(key, 0) + 1


def text_field(field: str, vals: list[Any], tally: dict[str, int]) -> None:
    """Count the values of a text field (``name``, ``cat``, a collective's name) that are not text.

    The reader keeps a number's literal text; lists, objects and booleans are counted here."""
    if set(map(type, vals)) <= {str, _NONE}:
        return
    for v in vals:
        if isinstance(v, (bool, list, dict)):
            k = tally_key(field, type_name(v))
            tally[k] = tally.get(k, 0) + 1


def check_time_text(st: pl.DataFrame, cols: dict[str, str], path: Path | str) -> None:
    """Refuse a ``ts`` / ``dur`` (µs, as decimal text or a float) whose ns value lies beyond :data:`MAX_TIME_NS`.

    ``cols``: stage column -> field name as in the file. One vectorized aggregate; the
    offending event is looked up only when there is one."""
    lim = MAX_TIME_NS / 1000
    exprs = [(pl.col(c).cast(pl.Float64, strict=False).abs() >= lim).any().alias(c) for c in cols]
    hit = st.select(exprs).row(0, named=True)
    for c, field in cols.items():
        if hit[c]:
            row = st.filter(pl.col(c).cast(pl.Float64, strict=False).abs() >= lim).row(0, named=True)
            raise _range_error(path, field, row[c], row.get("name"), "what an int64 ns timestamp holds (±146 years)")


def base_time_ns(v: Any, path: Path, notes: list[dict[str, Any]]) -> int | None:
    """``baseTimeNanoseconds`` (the epoch ns of ts 0) checked: a number beyond :data:`MAX_TIME_NS` or negative is an
    error; another type is ignored with a note (timestamps then stay relative to the trace's start)."""
    if v is None:
        return None
    n = _as_int(v) if not isinstance(v, float) else (int(v) if math.isfinite(v) else None)
    if n is None:
        notes.append({"code": "bad_field_types", "severity": "warning", "message":
                      f"{path.name}: baseTimeNanoseconds is {type_name(v)} {_shown(v)}, not a number; ignored (timestamps "
                      "stay relative to the trace; cross-rank alignment still uses collectives)",
                      "details": {"fields": {"baseTimeNanoseconds": {type_name(v): 1}}}})
        return None
    if not 0 <= n < MAX_TIME_NS:
        raise InputError(f"{path}: baseTimeNanoseconds {_shown(v)} is outside 0..2^62 ns (what an int64 ns timestamp "
                         "holds); the file is corrupt; fix the field or re-export the trace")
    return n


#: deviceProperties keys and the type each must have (others: kept when they are plain scalars)
_PROP_TYPES: dict[str, type] = {"name": str, "id": int, "totalGlobalMem": int, "computeMajor": int, "computeMinor": int,
                                "numSms": int, "warpSize": int, "maxThreadsPerBlock": int}


def device_props(v: Any, path: Path, notes: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """``deviceProperties``: a list of objects whose known keys have their types (name text, ids and sizes
    integers in int64). Anything else is dropped with one note listing what (never a number where the
    analysis expects a GPU name)."""
    if v is None or v == []:
        return None
    bad: dict[str, dict[str, int]] = {}

    def count(key: str, val: Any) -> None:
        bad.setdefault(key, {})[type_name(val)] = bad.setdefault(key, {}).get(type_name(val), 0) + 1

    out: list[dict[str, Any]] = []
    for p in v if isinstance(v, list) else [v]:
        if not isinstance(p, dict):
            count("deviceProperties[]", p)
            continue
        keep: dict[str, Any] = {}
        for key, val in p.items():
            want = _PROP_TYPES.get(key)
            ok = (isinstance(val, str) if want is str else
                  isinstance(val, int) and not isinstance(val, bool) and INT64_MIN <= val <= INT64_MAX if want is int else
                  isinstance(val, (str, int, float, bool, _NONE)) and (not isinstance(val, float) or math.isfinite(val)))
            if ok:
                keep[key] = val
            else:
                count(f"deviceProperties.{key}", val)
        out.append(keep)
    if bad:
        shown = ", ".join(f"{k} ({', '.join(bad[k])})" for k in list(bad)[:6])
        notes.append({"code": "bad_field_types", "severity": "warning", "message":
                      f"{path.name}: deviceProperties fields of the wrong type ignored: {shown}; the GPU may be unknown "
                      "to the analysis", "details": {"fields": bad}})
    return [p for p in out if p] or None


def quality_of(tally: dict[str, int], name: str) -> list[dict[str, Any]]:
    """The quality flags of the counts :func:`checked_ints` and friends left in a reader's tally."""
    fields: dict[str, dict[str, int]] = {}
    out: list[dict[str, Any]] = []
    for k, n in tally.items():
        if k.startswith(_FIELD):
            field, kind = k[len(_FIELD):].split("\x00", 1)
            fields.setdefault(field, {})[kind] = n
    if fields:
        shown = "; ".join(f"{f}: {sum(c.values())} event(s) ({', '.join(f'{k} {n}' for k, n in c.items())})"
                          for f, c in sorted(fields.items())[:6])
        out.append({"code": "bad_field_types", "severity": "warning", "message":
                    f"{name}: fields of the wrong type left empty: {shown}; the values they carry (stream, device, "
                    "correlation, ...) are unknown for those events", "details": {"fields": fields}})
    if tally.get(_SURROGATES):
        out.append({"code": "lone_surrogates", "severity": "info", "message":
                    f"{name}: {tally[_SURROGATES]} lone UTF-16 surrogate escape(s) (\\udXXX, valid JSON but not text) "
                    "replaced by U+FFFD", "details": {"count": tally[_SURROGATES]}})
    for k, n in tally.items():
        if k.startswith(_TRAILING):
            zeros = k.endswith("zeros")
            out.append({"code": "trailing_data", "severity": "info" if zeros else "warning", "message":
                        f"{name}: {n} byte(s) after the end of the gzip data ignored ("
                        + ("zero padding" if zeros else "not gzip; the file may have been appended to") + ")",
                        "details": {"bytes": n}})
    return out


def count_trailing(tally: dict[str, int], n: int, *, zeros: bool) -> None:
    """Record ``n`` bytes found after the last complete gzip member (``zeros``: all zero padding)."""
    if n:
        k = _TRAILING + ("zeros" if zeros else "data")
        tally[k] = tally.get(k, 0) + n


# ---- nesting and surrogates (error paths only) ---------------------------------------------------


#: nesting reported as too deep (msgspec stops at the interpreter's recursion limit; Kineto events nest a few levels)
MAX_JSON_DEPTH = 256


def too_deep(path: Path | str, where: str | None = None) -> InputError:
    """The error for JSON the decoder refused as too deeply nested; ``where``: its place (line, column, text)."""
    at = f" at {where}" if where else ""
    return InputError(f"{path}: JSON nested more than {MAX_JSON_DEPTH} levels deep{at}; not a profiler trace "
                      "(Kineto events nest a few levels); remove that value or re-export the trace")


def deep_offset(data: bytes | bytearray | memoryview, limit: int) -> int | None:
    """Byte offset where JSON brackets outside strings first nest deeper than ``limit``, or None (vectorized)."""
    a = np.frombuffer(data, dtype=np.uint8)
    if not a.size:
        return None
    idx = np.arange(a.size)
    bs = a == 0x5C
    last_plain = np.maximum.accumulate(np.where(bs, -1, idx))  # last index <= i that is not a backslash
    run_before = idx - 1 - np.concatenate(([-1], last_plain[:-1]))  # backslashes just before i
    quote = (a == 0x22) & (run_before % 2 == 0)
    in_str = (np.cumsum(quote) - quote) % 2 == 1
    step = np.where(in_str, 0, np.where((a == 0x5B) | (a == 0x7B), 1, np.where((a == 0x5D) | (a == 0x7D), -1, 0)))
    hit = np.flatnonzero(np.cumsum(step) > limit)
    return int(hit[0]) if hit.size else None


_SURR = re.compile(rb"(\\+)u([dD][89a-fA-F][0-9a-fA-F]{2})")


def fix_lone_surrogates(buf: bytes | bytearray) -> tuple[bytes | bytearray, int]:
    """``buf`` with every lone ``\\udXXX`` escape replaced by ``\\ufffd`` (same length: byte offsets stay), and the count.

    A high surrogate escape directly followed by a low one is a valid pair and stays."""
    if b"\\u" not in buf and b"\\U" not in buf:
        return buf, 0
    out = bytearray(buf)
    n = 0
    skip = -1
    for m in _SURR.finditer(buf):
        if len(m.group(1)) % 2 == 0 or m.start(2) <= skip:  # an escaped backslash before 'u', or the low half of a pair
            continue
        high = int(m.group(2), 16) < 0xDC00
        nxt = _SURR.match(buf, m.end())
        if high and nxt is not None and len(nxt.group(1)) == 1 and int(nxt.group(2), 16) >= 0xDC00:
            skip = nxt.start(2)
            continue
        out[m.start(2) - 1: m.end()] = b"ufffd"
        n += 1
    return (out if n else buf), n


def count_surrogates(tally: dict[str, int], n: int) -> None:
    if n:
        tally[_SURROGATES] = tally.get(_SURROGATES, 0) + n
