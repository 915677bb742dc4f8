"""Public library surface used by the CLI and notebooks.

``analyze(path)`` returns the documented, stable ``--json`` object
(``docs/analyze_json.md``); reporters render it, they never compute.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import polars as pl

from tracekit._errors import QualityLog
from tracekit.analysis.breakdown import compute_breakdown, top_kernels, uncategorized_top
from tracekit.analysis.window import Window, parse_time_range, select_window
from tracekit.ingest.convert import ConvertResult, convert
from tracekit._errors import InputError
from tracekit.schema import read_metadata, scan_trace

__all__ = ["analyze", "analyze_frame", "convert", "ConvertResult", "ANALYSIS_VERSION"]

#: Version of the analyze JSON object (bumped on incompatible changes).
ANALYSIS_VERSION = 1


def analyze(
    path: str | Path,
    *,
    window: str | None = None,
    skip_steps: int = 0,
    trim_transient: bool = True,
    top: int = 5,
    ranks: Sequence[int] | None = None,
    cross_rank: bool = True,
) -> dict[str, Any]:
    """Analyze a ``trace.parquet``; returns the ``--json`` object (see docs/analyze_json.md)."""
    meta = read_metadata(path)
    lf = scan_trace(path)
    if ranks is not None:
        lf = lf.filter(pl.col("rank").is_in(list(ranks)))
    # CPU operator rows are half of a typical trace; analyses need only those carrying shapes
    # (kernel efficiency) or a category (CPU mode)
    kind = pl.col("kind").cast(pl.String)
    lf = lf.filter((kind != "cpu_op") | pl.col("input_dims").is_not_null() | pl.col("category").is_not_null()
                   | pl.col("family").is_not_null()  # CPU mode: host readbacks (family host_sync.cpu, no category)
                   | (pl.col("name").cast(pl.String) == "record_param_comms"))
    try:
        df = lf.collect()
    except Exception as e:  # noqa: BLE001
        raise InputError(f"{path}: unreadable trace data ({type(e).__name__}: {e}); re-convert the source") from None
    res = analyze_frame(df, meta, window=window, skip_steps=skip_steps, trim_transient=trim_transient, top=top, cross_rank=cross_rank)
    res["trace"] = str(path)
    return res


def analyze_frame(
    df: pl.DataFrame,
    meta: dict[str, Any],
    *,
    window: str | None = None,
    skip_steps: int = 0,
    trim_transient: bool = True,
    top: int = 5,
    cross_rank: bool = True,
) -> dict[str, Any]:
    """Same as :func:`analyze` on an in-memory frame."""
    quality = QualityLog()
    for q in meta.get("quality") or []:
        quality.add(q.get("code", "note"), q.get("message", ""), severity=q.get("severity", "warning"), rank=q.get("rank"))
    tr = None
    if window:
        origin = (meta.get("window_ns") or [None])[0]
        if origin is None:
            origin = int(df["ts_ns"].min()) if df.height else 0
        tr = parse_time_range(window, origin)
    pw = (meta.get("capture") or {}).get("profiler_windows") if isinstance(meta.get("capture"), dict) else None
    win = select_window(
        df, time_range=tr, skip_steps=skip_steps, trim_transient=trim_transient and tr is None, quality=quality, profiler_windows=pw
    )
    extra: dict[str, Any] = {}
    comm_parts = None
    if cross_rank:
        # CROSS-RANK HOOK: collectives, stalls, idle causes, PCIe, power, steps (tracekit.analysis.crossrank)
        try:
            from tracekit.analysis import crossrank  # type: ignore[attr-defined]
        except ImportError:
            crossrank = None  # type: ignore[assignment]
        if crossrank is not None:
            extra = crossrank.cross_rank_sections(df, meta, {"window": win, "quality": quality})
            comm_parts = extra.pop("_comm_parts", None)
    bd = compute_breakdown(df, win, comm_parts=comm_parts)
    ranks = bd.as_records()
    overall_t: dict[str, int] = {}
    for r in ranks:
        for k, v in r["time_ns"].items():
            overall_t[k] = overall_t.get(k, 0) + int(v)
    tk = top_kernels(df, win, n=top)
    top_by_cat: dict[str, list[dict[str, Any]]] = {}
    for row in tk.iter_rows(named=True):
        top_by_cat.setdefault(row["category"], []).append(
            {"name": row["name"], "count": row["count"], "total_ns": row["total_ns"], "mean_ns": row["mean_ns"]}
        )
    unc = uncategorized_top(df, win, n=10)
    res: dict[str, Any] = {
        "schema_version": ANALYSIS_VERSION,
        "trace_schema_version": meta.get("schema_version"),
        "world_size": meta.get("world_size"),
        "device_mode": meta.get("device_mode", "gpu"),
        "window": {
            "start_ns": win.start_ns,
            "end_ns": win.end_ns,
            "reason": win.reason,
            "trimmed_transient_ns": win.trimmed_transient_ns,
            "skipped_steps": win.skipped_steps,
        },
        "buckets": list(bd.buckets) + ["idle"],
        "ranks": ranks,
        "overall": {
            "window_ns": sum(r["window_ns"] for r in ranks),
            "gpu_busy_ns": sum(r["gpu_busy_ns"] for r in ranks),
            "time_ns": overall_t,
        },
        "top_kernels": top_by_cat,
        "uncategorized_top": [dict(r) for r in unc.iter_rows(named=True)],
    }
    res.update(extra)
    res.setdefault("findings", _basic_findings(res))
    res["quality"] = [q.to_json() for q in quality]
    return res


def _basic_findings(res: dict[str, Any]) -> list[str]:
    """Plain-words headline from the breakdown alone (cross-rank analysis adds more)."""
    o = res["overall"]
    w = o["window_ns"] or 1
    t = o["time_ns"]
    parts = sorted(((k, v) for k, v in t.items()), key=lambda kv: -kv[1])
    out = []
    if parts:
        k, v = parts[0]
        out.append(f"Largest share of GPU time: {k} at {100 * v / w:.1f}% of the window (all ranks).")
    idle = t.get("idle", 0)
    if idle / w > 0.2:
        out.append(f"GPUs are idle {100 * idle / w:.1f}% of the window.")
    return out


def _window_of(res: dict[str, Any]) -> Window:
    w = res["window"]
    return Window(w["start_ns"], w["end_ns"], w["trimmed_transient_ns"], w["skipped_steps"], w["reason"])
