"""Validation of a ``trace.parquet`` on read: the one place every command's input passes.

:func:`tracekit.schema.read_metadata` calls :func:`check_footer`; :func:`tracekit.schema.open_trace`
(behind ``scan_trace`` and ``read_trace``, so analyze, diff, timeline, export and replay alike) calls
:func:`check_data`. A file tracekit wrote passes untouched; a file changed afterwards (by hand, by
another tool, by a bug) gets, per column, either a one-line :class:`InputError` naming the column or a
repair that is counted in a quality flag (``meta["quality"]``, so analyze prints it and ``--json`` has it):

=====================  ==========================================================  ====================
column / field         violation                                                   outcome
=====================  ==========================================================  ====================
any column             a type of another family (text for a number, ...)          error
integer columns        stored wider or unsigned, a value outside the schema type  error
``rank``               null                                                        rows dropped
``rank``               negative                                                    error
``rank``               a rank the footer's ``ranks`` does not list                 kept, flagged
``kind``               null or not one of ``KINDS``                                rows dropped
``ts_ns``              null                                                        rows dropped
``ts_ns``/``dur_ns``   beyond ±2^62 ns (their sum would overflow int64)            error
``dur_ns``             null or negative                                            set to 0
GPU ops' ``dur_ns``    none positive after that                                    error
``name``               null                                                        set to ``''``
``category``           not one of ``CATEGORIES``; null on a GPU op                 from the name (default
                                                                                   rules)
the file               no rows (or none left)                                      error
footer                 ``schema_version`` not an integer (or newer)                error
footer                 any other known field of the wrong type                     field ignored
=====================  ==========================================================  ====================

Dropped rows: flag ``invalid_rows``; repaired values: ``repaired_values``; ignored footer fields:
``bad_footer``; rows of ranks the footer does not list: ``unlisted_ranks`` (each with ``details`` per column and reason). Cost on a clean file: the Parquet
statistics settle nulls and ranges (tracekit writes them for ``rank``, ``ts_ns``, ``dur_ns``, ``kind``,
``category``; ``REQUIRED`` columns hold no nulls), and one lazy aggregate over ``kind`` and
``category`` checks their values; a column without statistics is aggregated in the same query.
Repairs are lazy expressions added only when a count says there is something to repair.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Mapping

import polars as pl
import pyarrow.parquet as pq

from tracekit._memory import release_memory
from tracekit._errors import InputError
from tracekit.enums import CATEGORIES, GPU_OP_KINDS, KINDS

__all__ = ["check_footer", "check_data", "compatible", "first_line", "MAX_TIME_NS", "READ_FLAGS"]

#: largest |ts_ns| or dur_ns: their sum stays inside int64 (146 years)
MAX_TIME_NS = 1 << 62
#: the flags this module adds (commands without a data-quality section print them as warnings)
READ_FLAGS = ("invalid_rows", "repaired_values", "bad_footer", "unlisted_ranks")
_REMEDY = "the file was changed after tracekit wrote it; re-convert the source with `tracekit convert`"


def _dtype_family(t: pl.DataType) -> str:
    if t.is_integer():
        return "int"
    if t.is_float():
        return "float"
    if isinstance(t, (pl.String, pl.Categorical, pl.Enum)) or t == pl.String:
        return "text"
    if t == pl.Boolean:
        return "bool"
    if isinstance(t, pl.Null) or t == pl.Null:
        return "null"
    return str(t.base_type())


def compatible(got: pl.DataType, want: pl.DataType) -> bool:
    """Same family (any integer width, any float width, String/Categorical/Enum; an all-null column fits all)."""
    g = _dtype_family(got)
    return g == "null" or g == _dtype_family(want)


def first_line(e: BaseException, limit: int = 300) -> str:
    """``Type: message`` of an exception, first line only (polars appends its query plan on the next lines)."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {text[:limit]}"


# ---- footer ---------------------------------------------------------------------------------------


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _num(v: Any) -> bool:
    return (_int(v) or isinstance(v, float)) and math.isfinite(v)


def _span(v: Any) -> bool:
    return isinstance(v, list) and len(v) == 2 and all(_int(x) and abs(x) < MAX_TIME_NS for x in v) and v[0] <= v[1]


def _list_of(test: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, list) and all(test(x) for x in v)


_TEXT: Callable[[Any], bool] = lambda v: isinstance(v, str)  # noqa: E731
_DICT: Callable[[Any], bool] = lambda v: isinstance(v, dict)  # noqa: E731
#: footer keys (schemas/trace_v1.md) and the test each value must pass; a null is taken as the key absent
FOOTER: dict[str, Callable[[Any], bool]] = {
    "tool_version": _TEXT, "world_size": lambda v: _int(v) and 1 <= v <= 1 << 17, "device_mode": lambda v: v in ("gpu", "cpu"),
    "ranks": lambda v: isinstance(v, list), "source_files": _list_of(_TEXT), "clock_alignment": _DICT,
    "clock_offsets_ns": lambda v: isinstance(v, dict) and all(_int(x) and abs(x) < MAX_TIME_NS for x in v.values()),
    "clock_residual_ns": _num, "rules": _TEXT, "window_ns": _span, "capture": _DICT, "quality": lambda v: isinstance(v, list),
    "steps_from": _TEXT, "serve": _DICT, "telemetry": _DICT,
    "failed_ranks": _list_of(lambda f: isinstance(f, dict) and (f.get("rank") is None or _int(f["rank"]) and f["rank"] >= 0)),
}
CAPTURE: dict[str, Callable[[Any], bool]] = {
    "profiler_windows": _list_of(_span), "window_ns": _span, "workload": _DICT, "host_cpus": _int, "duration_s": _num,
}
WORKLOAD: dict[str, Callable[[Any], bool]] = {"model": _DICT, "serve": _DICT, "options": _DICT}
RANK: dict[str, Callable[[Any], bool]] = {
    "device": lambda v: _int(v) or isinstance(v, str), "device_name": _TEXT, "device_props": _DICT, "source_files": _list_of(_TEXT), "source_file": _TEXT,
    "format": _TEXT, "backend": _TEXT, "nccl_version": _TEXT, "session_start_ns": _int, "base_time_ns": _int,
    "link_gen": _num, "link_width": _num, "link_bw_bytes_per_s": _num, "power_limit_w": _num, "nvlink": lambda v: isinstance(v, bool),
}
_QUALITY: Callable[[Any], bool] = lambda q: (isinstance(q, dict) and isinstance(q.get("code"), str)  # noqa: E731
                                             and isinstance(q.get("message", ""), str)
                                             and q.get("severity", "warning") in ("info", "warning", "error")
                                             and (q.get("rank") is None or _int(q["rank"])))


def _type(v: Any) -> str:
    if isinstance(v, bool):
        return "a boolean"
    return {str: "text", list: "a list", dict: "an object", int: "an integer", float: "a number"}.get(type(v), type(v).__name__)


def _prune(d: dict[str, Any], spec: Mapping[str, Callable[[Any], bool]], where: str, bad: dict[str, str]) -> None:
    """Remove the keys of ``d`` whose value fails its test (recording ``where.key -> its type``), and those whose
    value is null (unrecorded: a null is the field absent, as in an older file, so a reader's default applies)."""
    for k, test in spec.items():
        if k in d and d[k] is None:
            del d[k]
        elif d.get(k) is not None and not test(d[k]):
            bad[f"{where}{k}"] = _type(d.pop(k))


def check_footer(meta: dict[str, Any], path: Path | str, schema_version: int) -> dict[str, Any]:
    """Check the footer's fields against schemas/trace_v1.md: a ``schema_version`` that is not an integer
    or newer than ``schema_version`` is an error; any other known field of the wrong type is removed and
    listed in one ``bad_footer`` flag (every reader then sees it absent, as in an older file)."""
    ver = meta.get("schema_version", 0)
    if not _int(ver) or ver < 0:
        what = "null" if ver is None else f"{_type(ver)} {ver!r:.40}"
        raise InputError(f"{path}: footer field 'schema_version' is {what}, not a version number; {_REMEDY}")
    if ver > schema_version:
        raise InputError(f"{path}: schema_version {ver} is newer than this tracekit supports ({schema_version}); upgrade tracekit")
    bad: dict[str, str] = {}
    _prune(meta, FOOTER, "", bad)
    if isinstance(meta.get("capture"), dict):
        cap = meta["capture"] = dict(meta["capture"])
        _prune(cap, CAPTURE, "capture.", bad)
        if isinstance(cap.get("workload"), dict):
            cap["workload"] = dict(cap["workload"])
            _prune(cap["workload"], WORKLOAD, "capture.workload.", bad)
    if isinstance(meta.get("ranks"), list):
        meta["ranks"] = _ranks(meta["ranks"], bad)
    quality = meta.get("quality") or []
    meta["quality"] = [q for q in quality if _QUALITY(q)]
    if len(meta["quality"]) < len(quality):
        bad["quality[]"] = f"{len(quality) - len(meta['quality'])} entries without a text code/message"
    if bad:
        shown = ", ".join(f"{k} ({v})" for k, v in list(bad.items())[:6]) + (f" and {len(bad) - 6} more" if len(bad) > 6 else "")
        meta["quality"].append({"code": "bad_footer", "severity": "warning", "details": {"fields": bad}, "message":
                                f"{Path(path).name}: footer fields of the wrong type ignored: {shown}; results that "
                                "need them (GPU peaks, windows, data-quality notes) may be missing"})
    return meta


def _ranks(ranks: list[Any], bad: dict[str, str]) -> list[dict[str, Any]]:
    out = []
    for i, r in enumerate(ranks):
        if not isinstance(r, dict) or not (_int(r.get("rank")) and 0 <= r["rank"] < 1 << 31):
            bad[f"ranks[{i}]"] = _type(r) if not isinstance(r, dict) else "no integer rank"
            continue
        r = dict(r)
        _prune(r, RANK, f"ranks[{i}].", bad)
        out.append(r)
    return out


# ---- data -----------------------------------------------------------------------------------------


class _ColumnStats:
    """What the footers read so far say of one column (:func:`_footer_stats`)."""

    __slots__ = ("nulls", "lo", "hi", "known", "seen")

    def __init__(self) -> None:
        self.nulls: int | None = 0
        self.lo: int | None = None
        self.hi: int | None = None
        self.known, self.seen = True, False

    def add(self, md: pq.FileMetaData, i: int) -> None:
        """Column ``i`` of one file's footer ``md``."""
        self.seen = True
        required = md.schema.column(i).max_definition_level == 0
        for g in range(md.num_row_groups):
            rg = md.row_group(g)
            s = rg.column(i).statistics
            if s is None or not s.has_null_count:
                self.nulls, self.known = (self.nulls if required else None), False
                continue
            if self.nulls is not None and not required:
                self.nulls += s.null_count
            if rg.num_rows == s.null_count:
                continue
            if not s.has_min_max or not _int(s.min):
                self.known = False
                continue
            self.lo = s.min if self.lo is None else min(self.lo, s.min)
            self.hi = s.max if self.hi is None else max(self.hi, s.max)

    def result(self) -> dict[str, Any]:
        return {"nulls": self.nulls, "min": self.lo if self.known else None, "max": self.hi if self.known else None}


def _footer_stats(files: list[Path], cols: list[str]) -> tuple[int, dict[str, dict[str, Any]]]:
    """The trace's row count and what its Parquet footers (one per file) say of ``cols`` without reading data:
    ``nulls`` (0 for a REQUIRED column; None when a row group lacks statistics) and, for integer columns,
    ``min`` / ``max`` (None when unknown). A column no file holds (a dataset's hive ``rank``) is absent.
    One footer at a time: a dataset of many partitions never holds their footers together (a footer of a
    49-column file with its row groups is ~100 kB of Arrow objects)."""
    acc = {c: _ColumnStats() for c in cols}
    rows = 0
    for f in files:
        md = pq.read_metadata(f)
        rows += md.num_rows
        where = {md.schema.column(i).path: i for i in range(md.num_columns)}
        for c, st in acc.items():
            if c in where:
                st.add(md, where[c])
        del md
    if len(files) > 1:
        release_memory()  # the footers' C++ objects were freed into glibc's heap: ~50 kB a file stayed resident
    return rows, {c: st.result() for c, st in acc.items() if st.seen}


_CHECKED = ["rank", "kind", "ts_ns", "dur_ns", "name", "category"]
_INT_RANGE = {"Int32": (-(1 << 31), (1 << 31) - 1), "Int64": (-(1 << 63), (1 << 63) - 1)}


def check_data(path: Path | str, meta: dict[str, Any], raw: pl.LazyFrame, files: list[Path],
               schema: Mapping[str, pl.DataType], required: tuple[str, ...]) -> pl.LazyFrame:
    """The trace's rows as a lazy scan in exactly ``schema`` (:data:`tracekit.schema.POLARS_SCHEMA`: columns
    an older file lacks are null), checked and repaired as the module docstring's table says; flags are
    appended to ``meta["quality"]``. ``raw``: the scan of the trace's ``files`` (one ``trace.parquet``, or a
    dataset's partitions); ``path``: what the messages name; ``required``: the columns a trace must have."""
    POLARS_SCHEMA, COLUMN_NAMES = schema, list(schema)  # noqa: N806 - the schema module's names
    try:
        have = raw.collect_schema()
        casts = [n for n in have.names() if n in POLARS_SCHEMA and have[n] != POLARS_SCHEMA[n]]
        ints = [n for n in casts if str(POLARS_SCHEMA[n]) in _INT_RANGE and have[n].is_integer()]
        n_rows, stats = _footer_stats(files, list(dict.fromkeys(_CHECKED + ints)))
    except Exception as e:  # noqa: BLE001 - partitions that disagree, a footer that is not Parquet
        raise InputError(f"{path}: unreadable trace data ({first_line(e)}); re-convert the source") from None
    _check_columns(path, have, schema, required)
    if n_rows == 0:
        raise InputError(_no_rows_message(path, meta))
    facts = _facts(stats, path, raw, have, ints)
    _refuse(path, raw, facts, {c: POLARS_SCHEMA[c] for c in ints}, meta)
    lf = raw.with_columns([pl.col(n).cast(POLARS_SCHEMA[n]) for n in casts]) if casts else raw
    missing = [n for n in COLUMN_NAMES if n not in have]
    if missing:
        lf = lf.with_columns([pl.lit(None, dtype=POLARS_SCHEMA[n]).alias(n) for n in missing])
    lf = lf.select(COLUMN_NAMES)
    return _repair(path, lf, facts, meta)


def _no_rows_message(path: Path | str, meta: Mapping[str, Any]) -> str:
    """Why a trace is empty: a capture's own reason (its ``capture_no_*`` flags) where it left one."""
    quality = meta.get("quality")
    why = [str(q.get("message")) for q in quality if isinstance(q, dict)
           and str(q.get("code", "")).startswith("capture_no_")] if isinstance(quality, list) else []
    if why:
        return f"{path}: the capture collected no rows ({'; '.join(why)}); capture again with a window the program reaches"
    return f"{path}: the trace has no rows; re-convert the source (an empty capture is refused at convert)"


def _check_columns(path: Path | str, have: pl.Schema, schema: Mapping[str, pl.DataType], required: tuple[str, ...]) -> None:
    absent = [n for n in required if n not in have]
    if absent:
        raise InputError(f"{path}: not a tracekit trace (missing column(s) {', '.join(absent)}); "
                         "convert the source with `tracekit convert`")
    bad = [(n, have[n]) for n in have.names() if n in schema and not compatible(have[n], schema[n])]
    if bad:
        n, got = bad[0]
        raise InputError(f"{path}: column {n!r} has type {got}, expected {schema[n]}"
                         + (f" (and {len(bad) - 1} more column(s))" if len(bad) > 1 else "") + f"; {_REMEDY}")


def _bad_kind() -> pl.Expr:
    return pl.col("kind").is_null() | ~pl.col("kind").is_in(list(KINDS))  # on the categorical itself: no text column


def _bad_category() -> pl.Expr:
    cat = pl.col("category")
    gpu = pl.col("kind").is_in(list(GPU_OP_KINDS))
    return (gpu & cat.is_null()) | (cat.is_not_null() & ~cat.is_in(list(CATEGORIES)))


def _facts(stats: dict[str, dict[str, Any]], path: Path | str, raw: pl.LazyFrame, have: pl.Schema, ints: list[str]) -> dict[str, Any]:
    """Null counts, integer ranges and bad-value counts: the footers' statistics (:func:`_footer_stats`) where they
    settle a question, one lazy aggregate for the rest (kind and category values always)."""
    exprs: list[pl.Expr] = [_bad_kind().sum().alias("kind.bad")]
    if "category" in have:
        exprs.append(_bad_category().sum().alias("category.bad"))
    for c in ["rank", "ts_ns", "dur_ns", "name"]:
        if stats.get(c, {}).get("nulls") is None:
            exprs.append(pl.col(c).null_count().alias(f"{c}.nulls"))
    for c in list(dict.fromkeys(["rank", "ts_ns", "dur_ns", *ints])):
        if stats.get(c, {}).get("min") is None:
            exprs += [pl.col(c).min().alias(f"{c}.min"), pl.col(c).max().alias(f"{c}.max")]
    d = stats.get("dur_ns", {})
    if d.get("min") is None or d["min"] < 0:  # negative durations: does any GPU op keep a positive one?
        gpu = pl.col("kind").is_in(list(GPU_OP_KINDS))
        exprs += [gpu.sum().alias("gpu.n"), (gpu & (pl.col("dur_ns") > 0)).sum().alias("gpu.positive")]
    try:
        row = raw.select(exprs).collect().row(0, named=True)
    except Exception as e:  # noqa: BLE001 - corrupt pages fail here, in the first read
        raise InputError(f"{path}: unreadable trace data ({first_line(e)}); re-convert the source") from None
    facts: dict[str, Any] = {f"{c}.{k}": v for c, st in stats.items() for k, v in st.items() if v is not None}
    facts.update({k: v for k, v in row.items() if v is not None})
    return facts


def _refuse(path: Path | str, raw: pl.LazyFrame, facts: dict[str, Any], ints: Mapping[str, pl.DataType], meta: dict[str, Any]) -> None:
    """The violations that are errors: values beyond the schema types or ±2^62 ns, negative ranks, no GPU time.
    ``ints``: the integer columns stored in another type, and the schema's type for each."""
    for c, want in ints.items():  # stored wider or unsigned: every value must fit the schema's type
        lo, hi = _INT_RANGE[str(want)]
        for v in (facts.get(f"{c}.min"), facts.get(f"{c}.max")):
            if v is not None and not lo <= v <= hi:
                raise InputError(f"{path}: column {c!r} holds {v}, outside {want}; {_REMEDY}")
    for c in ("ts_ns", "dur_ns"):
        for v in (facts.get(f"{c}.min"), facts.get(f"{c}.max")):
            if v is not None and abs(v) >= MAX_TIME_NS:
                raise InputError(f"{path}: column {c!r} holds {v}, beyond ±2^62 ns (146 years; a start plus a duration "
                                 f"would overflow int64); {_REMEDY}")
    if facts.get("rank.min") is not None and facts["rank.min"] < 0:
        raise InputError(f"{path}: column 'rank' holds {facts['rank.min']}; ranks are >= 0; {_REMEDY}")
    if facts.get("gpu.n") and not facts.get("gpu.positive"):
        raise InputError(f"{path}: no GPU kernel, copy or memset has a positive 'dur_ns' ({facts['gpu.n']} GPU ops); "
                         f"GPU time would be 0 everywhere; {_REMEDY}")
    _footer_ranks(path, raw, facts, meta)


def _footer_ranks(path: Path | str, raw: pl.LazyFrame, facts: dict[str, Any], meta: dict[str, Any]) -> None:
    """Rows of a rank the footer's ``ranks`` does not describe (its device, files, clock): kept, flagged
    ``unlisted_ranks`` with their row count (the rows may come from another capture or be relabelled)."""
    listed = sorted({r["rank"] for r in meta.get("ranks") or []})
    lo, hi = facts.get("rank.min"), facts.get("rank.max")
    if not listed or lo is None or hi is None:
        return
    if hi - lo < 4096 and set(range(lo, hi + 1)) <= set(listed):
        return
    tbl = (raw.filter(~pl.col("rank").is_in(listed) & pl.col("rank").is_not_null())
           .group_by("rank").len().sort("rank").collect())
    if not tbl.height:
        return
    extra = dict(tbl.iter_rows())
    shown = ", ".join(map(str, listed[:8])) + (", ..." if len(listed) > 8 else "")
    meta.setdefault("quality", []).append({
        "code": "unlisted_ranks", "severity": "warning", "details": {"ranks": list(extra)[:64], "rows": sum(extra.values())},
        "message": f"{Path(path).name}: {sum(extra.values())} rows of rank(s) "
                   + ", ".join(map(str, list(extra)[:8])) + (" ..." if len(extra) > 8 else "")
                   + f" that the footer's ranks ({shown}) do not list: their device and clock are unknown and "
                   f"cross-rank results mix them in; {_REMEDY}"})


def _counts(lf: pl.LazyFrame, cond: pl.Expr, col: str) -> dict[str, int]:
    """``value -> rows`` of ``col`` where ``cond`` holds (the offending values, for the message)."""
    tbl = lf.filter(cond).group_by(pl.col(col).cast(pl.String).fill_null("null")).len().sort("len", descending=True).collect()
    return {str(v): int(n) for v, n in tbl.iter_rows()}


def _reasons(col: str, counts: dict[str, int], what: str = "") -> dict[str, int]:
    """``"<col> '<value>'<what>" -> rows`` for the (at most 4 most frequent) offending values."""
    return {(f"{col} null" if v == "null" else f"{col} {v[:40]!r}") + what: n for v, n in list(counts.items())[:4]}


def _repair(path: Path | str, lf: pl.LazyFrame, facts: dict[str, Any], meta: dict[str, Any]) -> pl.LazyFrame:
    """Drop the rows no analysis can place, repair the values that have a safe default; flag both."""
    name = Path(path).name
    drop: list[pl.Expr] = []
    why: dict[str, int] = {}
    for c in ("rank", "ts_ns"):
        if facts.get(f"{c}.nulls"):
            drop.append(pl.col(c).is_null())
            why[f"{c} null"] = facts[f"{c}.nulls"]
    if facts.get("kind.bad"):
        drop.append(_bad_kind())
        why.update(_reasons("kind", _counts(lf, _bad_kind(), "kind")))
    if drop:
        cond = pl.any_horizontal(drop)
        n_drop, n_all = lf.select(cond.sum(), pl.len()).collect().row(0)
        if n_drop == n_all:
            raise InputError(f"{path}: none of its {n_all} rows has a rank, a known kind and a ts_ns; {_REMEDY}")
        lf = lf.filter(~cond)
        meta.setdefault("quality", []).append({
            "code": "invalid_rows", "severity": "warning", "details": {"count": n_drop, "reasons": why},
            "message": f"{name}: dropped {n_drop} of {n_all} rows no analysis can place: "
                       + ", ".join(f"{k} ({n})" for k, n in why.items())[:300] + f"; {_REMEDY}"})
    return _repair_values(path, lf, facts, meta)


def _repair_values(path: Path | str, lf: pl.LazyFrame, facts: dict[str, Any], meta: dict[str, Any]) -> pl.LazyFrame:
    fixed: dict[str, int] = {}
    dur = pl.col("dur_ns")
    if facts.get("dur_ns.nulls") or (facts.get("dur_ns.min") or 0) < 0 or "dur_ns.min" not in facts:
        n_neg = lf.select((dur < 0).sum()).collect().item()
        if facts.get("dur_ns.nulls"):
            fixed["dur_ns null -> 0"] = facts["dur_ns.nulls"]
        if n_neg:
            fixed["dur_ns negative -> 0"] = n_neg
        if fixed:
            lf = lf.with_columns(pl.when(dur.is_null() | (dur < 0)).then(0).otherwise(dur).alias("dur_ns"))
    if facts.get("name.nulls"):
        fixed["name null -> ''"] = facts["name.nulls"]
        lf = lf.with_columns(pl.col("name").cast(pl.String).fill_null("").cast(pl.Categorical))
    if facts.get("category.bad"):
        counts = _counts(lf, _bad_category(), "category")
        lf = _recategorize(lf)
        fixed.update(_reasons("category", counts, " -> from the name"))
    if fixed:
        meta.setdefault("quality", []).append({
            "code": "repaired_values", "severity": "warning", "details": {"fixes": fixed},
            "message": f"{Path(path).name}: repaired values: " + ", ".join(f"{k} ({n})" for k, n in fixed.items())[:300]
                       + f"; {_REMEDY}"})
    return lf


def _recategorize(lf: pl.LazyFrame) -> pl.LazyFrame:
    """Category and family of the rows whose category is unknown (or missing on a GPU op) from their name, by the
    default rules (a convert with ``--rules`` may have chosen otherwise: the flag says "from the name")."""
    from tracekit.categories import default_rules

    bad = _bad_category()
    names = lf.filter(bad).select(pl.col("name").cast(pl.String).unique()).collect().get_column("name").to_list()
    table = default_rules().classify_names(names)
    n = pl.col("name").cast(pl.String)
    cat = n.replace_strict(table["name"], table["category"], default=None)
    fam = n.replace_strict(table["name"], table["family"], default=None)
    return lf.with_columns(
        pl.when(bad).then(cat).otherwise(pl.col("category").cast(pl.String)).cast(pl.Categorical).alias("category"),
        pl.when(bad).then(fam).otherwise(pl.col("family").cast(pl.String)).cast(pl.Categorical).alias("family"),
    )
