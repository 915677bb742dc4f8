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
from typing import Any

import polars as pl

from tracekit.core.intervals import in_spans, intersect
from tracekit.core.window import Window, cpu_mode_ranks, device_op_expr

__all__ = ["PRIORITY", "SPLIT_PRIORITY", "Breakdown", "compute_breakdown", "breakdown_finish", "top_kernels", "uncategorized_top",
           "kernel_totals", "merge_kernel_totals"]

PRIORITY = ("moe_gemm", "moe_routing", "attention", "dense_gemm", "other_compute", "memory", "communication")
SPLIT_PRIORITY = ("moe_gemm", "moe_routing", "attention", "dense_gemm", "other_compute", "memory", "comm_transfer", "comm_wait")


@dataclass
class Breakdown:
    """Per-rank table: rank, window_start_ns, window_ns, gpu_busy_ns, one column per bucket (ns), idle_ns."""

    table: pl.DataFrame
    buckets: tuple[str, ...]
    window: Window
    notes: list[str] = field(default_factory=list)

    def as_records(self) -> list[dict[str, Any]]:
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
        ext = intersect(ext, sp, start="lo", end="hi", span_start="s_lo", span_end="s_hi").drop(["s_lo", "s_hi"]).sort(["rank", "lo"])
    return ext


def compute_breakdown(
    df: pl.DataFrame,
    window: Window | None = None,
    *,
    comm_parts: pl.DataFrame | None = None,
    split: bool | None = None,
) -> Breakdown:
    """Exclusive per-rank split of the window (see module docstring).

    ``comm_parts``: optional intervals ``rank, start, end, part`` with part in
    {comm_transfer, comm_wait} that replace communication ops. ``split`` (default:
    whether ``comm_parts`` has rows) says whether the communication bucket is split:
    pass the whole trace's answer when ``df`` is one rank of it.
    """
    window = window or Window(None, None)
    if split is None:
        split = comm_parts is not None and comm_parts.height > 0
    ops = df.lazy().filter(device_op_expr(cpu_mode_ranks(df))).select(
        "rank", "ts_ns", "dur_ns", pl.col("category").cast(pl.String).fill_null("other_compute").alias("bucket")
    ).collect()
    if ops.height == 0:
        return Breakdown(_empty_table(PRIORITY), PRIORITY, window, ["no GPU ops"])
    bounds = _bounds(ops, window)
    iv = ops.select("rank", pl.col("ts_ns").alias("start"), (pl.col("ts_ns") + pl.col("dur_ns")).alias("end"), "bucket")
    buckets: tuple[str, ...] = PRIORITY
    if split:
        if comm_parts is None:
            comm_parts = pl.DataFrame(schema={"rank": pl.Int64, "start": pl.Int64, "end": pl.Int64, "part": pl.String})
        iv = pl.concat(
            [
                iv.filter(pl.col("bucket") != "communication"),
                comm_parts.select(
                    pl.col("rank").cast(iv.schema["rank"]), pl.col("start").cast(pl.Int64), pl.col("end").cast(pl.Int64), pl.col("part").cast(pl.String).alias("bucket")
                ),
            ]
        )
        buckets = SPLIT_PRIORITY
    iv = intersect(iv, bounds, by="rank").select("rank", "start", "end", "bucket")  # one piece per (op, span) it meets
    prio = {b: i for i, b in enumerate(buckets)}
    iv = iv.with_columns(pl.col("bucket").replace_strict(prio, default=len(buckets) - 1, return_dtype=pl.Int32).alias("_p"))
    cum = _cumulative_unions(iv, len(buckets))
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


def _cumulative_unions(iv: pl.DataFrame, n: int) -> pl.DataFrame:
    """``rank, "0" .. "n-1"``: per rank, the length of the union of the intervals of priority ≤ k.

    One sweep over the sorted interval boundaries instead of ``n`` unions: after the boundaries
    at ``t``, ``count_k`` intervals of priority ``k`` are open until the next boundary, and that
    stretch belongs to the smallest ``k`` with ``count_k > 0`` (the exclusive attribution);
    cumulative sums over ``k`` give the unions. Integer arithmetic: the same numbers as
    ``intervals.union_length`` per priority prefix.
    """
    ev = pl.concat([
        iv.select("rank", pl.col("start").alias("t"), pl.lit(1, pl.Int32).alias("d"), "_p"),
        iv.select("rank", pl.col("end").alias("t"), pl.lit(-1, pl.Int32).alias("d"), "_p"),
    ]).sort(["rank", "t"])
    one = ev.get_column("rank").n_unique() <= 1  # one rank (the per-rank map): no window partitions needed
    def per(e: pl.Expr) -> pl.Expr:
        return e if one else e.over("rank")

    ev = ev.with_columns(
        [per(pl.when(pl.col("_p") == k).then(pl.col("d")).otherwise(0).cum_sum()).alias(f"_c{k}") for k in range(n)]
        + [(per(pl.col("t").shift(-1)) - pl.col("t")).alias("_len")]
    )
    top: Any = pl.when(pl.col("_c0") > 0).then(0)
    for k in range(1, n):
        top = top.when(pl.col(f"_c{k}") > 0).then(k)
    seg = ev.select("rank", top.otherwise(None).alias("_top"), "_len").filter(pl.col("_top").is_not_null() & (pl.col("_len") > 0))
    return seg.group_by("rank").agg([pl.col("_len").filter(pl.col("_top") <= k).sum().alias(str(k)) for k in range(n)])


def _empty_table(buckets: tuple[str, ...]) -> pl.DataFrame:
    return pl.DataFrame(schema={"rank": pl.Int32, "window_start_ns": pl.Int64, "window_ns": pl.Int64, "gpu_busy_ns": pl.Int64,
                                **{b: pl.Int64 for b in buckets}, "idle": pl.Int64})


def breakdown_finish(parts: list[Breakdown], window: Window, *, split: bool) -> Breakdown:
    """Per-rank breakdowns (each from :func:`compute_breakdown` on one rank's rows) → one table sorted by rank."""
    tables = [p.table for p in parts if p.table.height]
    if not tables:
        return Breakdown(_empty_table(PRIORITY), PRIORITY, window, ["no GPU ops"])
    buckets = SPLIT_PRIORITY if split else PRIORITY
    return Breakdown(pl.concat(tables, how="vertical_relaxed").sort("rank", maintain_order=True), buckets, window)


def _windowed(df: pl.DataFrame, window: Window, columns: list[str] | None = None) -> pl.DataFrame:
    """Device ops overlapping the window (only ``columns`` when given)."""
    e = device_op_expr(cpu_mode_ranks(df))
    if window.start_ns is not None:
        e = e & (pl.col("ts_ns") + pl.col("dur_ns") > window.start_ns)
    if window.end_ns is not None:
        e = e & (pl.col("ts_ns") < window.end_ns)
    if window.spans:
        e = e & in_spans(window.spans, pl.col("ts_ns"), pl.col("ts_ns") + pl.col("dur_ns"))
    q = df.lazy().filter(e)
    return (q.select(columns) if columns is not None else q).collect()


def kernel_totals(df: pl.DataFrame, window: Window | None = None) -> pl.DataFrame:
    """Partial aggregate of :func:`top_kernels` / :func:`uncategorized_top`: per (category, name,
    ``other`` = no rule matched): ``count, total_ns`` of the ops overlapping the window. Sums of
    several ranks' totals (:func:`merge_kernel_totals`) equal the totals of the ranks together."""
    ops = _windowed(df, window or Window(None, None), ["category", "name", "family", "dur_ns"])
    # group on the (categorical) columns, make strings for the groups only
    g = ops.group_by("category", "name", "family").agg(pl.len().cast(pl.Int64).alias("count"), pl.col("dur_ns").sum().alias("total_ns"))
    g = g.select(
        pl.col("category").cast(pl.String), pl.col("name").cast(pl.String),
        (pl.col("family").cast(pl.String) == "other").fill_null(False).alias("other"), "count", "total_ns",
    )
    return g.group_by("category", "name", "other").agg(pl.col("count").sum(), pl.col("total_ns").sum())


def merge_kernel_totals(parts: list[pl.DataFrame]) -> pl.DataFrame:
    """Sum :func:`kernel_totals` of disjoint row sets (e.g. one per rank)."""
    if len(parts) == 1:
        return parts[0]
    return pl.concat(parts, how="vertical_relaxed").group_by("category", "name", "other").agg(pl.col("count").sum(), pl.col("total_ns").sum())


def top_kernels(df: pl.DataFrame | None, window: Window | None = None, *, n: int = 5, totals: pl.DataFrame | None = None) -> pl.DataFrame:
    """Top ``n`` names per category over all ranks: category, name, count, total_ns, mean_ns.

    ``totals``: precomputed :func:`kernel_totals` (then ``df`` is not read)."""
    t = totals if totals is not None else kernel_totals(df, window)  # type: ignore[arg-type]
    g = t.group_by("category", "name").agg(pl.col("count").sum(), pl.col("total_ns").sum())
    g = g.with_columns((pl.col("total_ns") // pl.col("count")).alias("mean_ns"))
    return g.sort(["category", "total_ns", "name"], descending=[False, True, False]).group_by("category", maintain_order=True).head(n)


def uncategorized_top(df: pl.DataFrame | None, window: Window | None = None, *, n: int = 10, totals: pl.DataFrame | None = None) -> pl.DataFrame:
    """Names no rule matched (family ``other``), by total time."""
    t = totals if totals is not None else kernel_totals(df, window)  # type: ignore[arg-type]
    g = t.filter(pl.col("other")).group_by("name").agg(pl.col("count").sum(), pl.col("total_ns").sum())
    return g.sort(["total_ns", "name"], descending=[True, False]).head(n)
