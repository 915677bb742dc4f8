"""Exclusive time breakdown of each rank's window into GPU categories and idle.

Attribution of overlapping streams: at every instant the window is assigned
to exactly one bucket — the highest-priority category with an op running on
any stream of the rank, or ``idle`` when none runs. Priority follows
:data:`PRIORITY` (compute first, then memory, then communication), so
communication overlapped by compute is not counted ("exposed"
communication). Buckets therefore sum exactly to the window:
``excl_k = |U_1..k| - |U_1..k-1|`` over the cumulative unions, idle =
window - |U_all|.

When collective wait/transfer parts are supplied (cross-rank analysis), the
``communication`` bucket is split into ``comm_transfer`` and ``comm_wait``
with the same exclusive rule.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from tracekit.analysis.intervals import clip, union_length
from tracekit.analysis.window import Window, gpu_ops

__all__ = ["PRIORITY", "Breakdown", "compute_breakdown", "top_kernels", "uncategorized_top"]

PRIORITY = ("moe_gemm", "moe_routing", "attention", "dense_gemm", "other_compute", "memory", "communication")
SPLIT_PRIORITY = ("moe_gemm", "moe_routing", "attention", "dense_gemm", "other_compute", "memory", "comm_transfer", "comm_wait")


@dataclass
class Breakdown:
    """Per-rank table: rank, window_start_ns, window_ns, gpu_busy_ns, one column per bucket (ns), idle_ns."""

    table: pl.DataFrame
    buckets: tuple[str, ...]
    window: Window
    notes: list[str] = field(default_factory=list)

    def as_records(self) -> list[dict]:
        out = []
        for row in self.table.iter_rows(named=True):
            out.append(
                {
                    "rank": row["rank"],
                    "window_start_ns": row["window_start_ns"],
                    "window_ns": row["window_ns"],
                    "gpu_busy_ns": row["gpu_busy_ns"],
                    "time_ns": {b: row[b] for b in self.buckets} | {"idle": row["idle"]},
                }
            )
        return out


def _bounds(ops: pl.DataFrame, window: Window) -> pl.DataFrame:
    ext = ops.group_by("rank").agg(
        pl.col("ts_ns").min().alias("lo"), (pl.col("ts_ns") + pl.col("dur_ns")).max().alias("hi")
    )
    if window.start_ns is not None:
        ext = ext.with_columns(pl.lit(window.start_ns).alias("lo"))
    if window.end_ns is not None:
        ext = ext.with_columns(pl.lit(window.end_ns).alias("hi"))
    ext = ext.sort("rank")
    if window.spans:
        sp = pl.DataFrame({"s_lo": [a for a, _ in window.spans], "s_hi": [b for _, b in window.spans]}, schema={"s_lo": pl.Int64, "s_hi": pl.Int64})
        ext = ext.join(sp, how="cross").with_columns(
            pl.max_horizontal("lo", "s_lo").alias("lo"), pl.min_horizontal("hi", "s_hi").alias("hi")
        ).filter(pl.col("hi") > pl.col("lo")).drop(["s_lo", "s_hi"]).sort(["rank", "lo"])
    return ext


def compute_breakdown(
    df: pl.DataFrame,
    window: Window | None = None,
    *,
    comm_parts: pl.DataFrame | None = None,
) -> Breakdown:
    """Exclusive per-rank split of the window (see module docstring).

    ``comm_parts``: optional intervals ``rank, start, end, part`` with part in
    {comm_transfer, comm_wait} that replace communication ops.
    """
    window = window or Window(None, None)
    ops = gpu_ops(df).select(
        "rank", "ts_ns", "dur_ns", pl.col("category").cast(pl.String).fill_null("other_compute").alias("bucket")
    )
    if ops.height == 0:
        empty = pl.DataFrame(schema={"rank": pl.Int32, "window_start_ns": pl.Int64, "window_ns": pl.Int64, "gpu_busy_ns": pl.Int64, **{b: pl.Int64 for b in PRIORITY}, "idle": pl.Int64})
        return Breakdown(empty, PRIORITY, window, ["no GPU ops"])
    bounds = _bounds(ops, window)
    iv = ops.select("rank", pl.col("ts_ns").alias("start"), (pl.col("ts_ns") + pl.col("dur_ns")).alias("end"), "bucket")
    buckets = PRIORITY
    if comm_parts is not None and comm_parts.height:
        iv = pl.concat(
            [
                iv.filter(pl.col("bucket") != "communication"),
                comm_parts.select(
                    pl.col("rank").cast(iv.schema["rank"]), pl.col("start").cast(pl.Int64), pl.col("end").cast(pl.Int64), pl.col("part").cast(pl.String).alias("bucket")
                ),
            ]
        )
        buckets = SPLIT_PRIORITY
    iv = iv.join(bounds, on="rank", how="inner")  # one row per (op, span) with several spans
    iv = clip(iv, pl.col("lo"), pl.col("hi")).select("rank", "start", "end", "bucket")
    prio = {b: i for i, b in enumerate(buckets)}
    iv = iv.with_columns(pl.col("bucket").replace_strict(prio, default=len(buckets) - 1, return_dtype=pl.Int32).alias("_p"))
    cum_rows = []
    for k in range(len(buckets)):
        u = union_length(iv.filter(pl.col("_p") <= k), by="rank").with_columns(pl.lit(k).alias("_k"))
        cum_rows.append(u)
    cum = pl.concat(cum_rows).pivot(on="_k", index="rank", values="length") if cum_rows else None
    table = bounds.group_by("rank").agg(pl.col("lo").min().alias("window_start_ns"), (pl.col("hi") - pl.col("lo")).sum().alias("window_ns"))
    if cum is not None:
        table = table.join(cum, on="rank", how="left")
    cols = []
    for k, b in enumerate(buckets):
        cur = pl.col(str(k)).fill_null(0) if str(k) in table.columns else pl.lit(0)
        prev = (pl.col(str(k - 1)).fill_null(0) if str(k - 1) in table.columns else pl.lit(0)) if k else pl.lit(0)
        cols.append((cur - prev).cast(pl.Int64).alias(b))
    last = str(len(buckets) - 1)
    busy = (pl.col(last).fill_null(0) if last in table.columns else pl.lit(0)).cast(pl.Int64)
    table = table.with_columns(*cols, busy.alias("gpu_busy_ns"))
    table = table.with_columns((pl.col("window_ns") - pl.col("gpu_busy_ns")).alias("idle"))
    table = table.select("rank", "window_start_ns", "window_ns", "gpu_busy_ns", *buckets, "idle").sort("rank")
    return Breakdown(table, buckets, window)


def _windowed(df: pl.DataFrame, window: Window) -> pl.DataFrame:
    ops = gpu_ops(df)
    if window.start_ns is not None:
        ops = ops.filter(pl.col("ts_ns") + pl.col("dur_ns") > window.start_ns)
    if window.end_ns is not None:
        ops = ops.filter(pl.col("ts_ns") < window.end_ns)
    if window.spans:
        inside = pl.lit(False)
        for a, b in window.spans:
            inside = inside | ((pl.col("ts_ns") + pl.col("dur_ns") > a) & (pl.col("ts_ns") < b))
        ops = ops.filter(inside)
    return ops


def top_kernels(df: pl.DataFrame, window: Window | None = None, *, n: int = 5) -> pl.DataFrame:
    """Top ``n`` names per category over all ranks: category, name, count, total_ns, mean_ns."""
    ops = _windowed(df, window or Window(None, None))
    g = ops.group_by(pl.col("category").cast(pl.String), pl.col("name").cast(pl.String)).agg(
        pl.len().alias("count"), pl.col("dur_ns").sum().alias("total_ns")
    )
    g = g.with_columns((pl.col("total_ns") // pl.col("count")).alias("mean_ns"))
    return g.sort(["category", "total_ns", "name"], descending=[False, True, False]).group_by("category", maintain_order=True).head(n)


def uncategorized_top(df: pl.DataFrame, window: Window | None = None, *, n: int = 10) -> pl.DataFrame:
    """Names no rule matched (family ``other``), by total time."""
    ops = _windowed(df, window or Window(None, None)).filter(pl.col("family").cast(pl.String) == "other")
    g = ops.group_by(pl.col("name").cast(pl.String)).agg(pl.len().alias("count"), pl.col("dur_ns").sum().alias("total_ns"))
    return g.sort(["total_ns", "name"], descending=[True, False]).head(n)
