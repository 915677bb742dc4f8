"""GPU idle gaps per rank, each attributed to one cause.

A gap is a stretch of a rank's window with no GPU op (kernel, memcpy, memset) on
any stream — in CPU mode, no categorized operator on the forward thread and no gloo
collective (docs/cpu_mode.md). Causes, first match wins:

``between_steps``
    the ops on both sides belong to different steps (``step_id``), or a step
    range starts inside the gap: scheduler / host work between forwards.
``host_sync``
    a blocking runtime call (stream/device/event synchronize, synchronous
    ``cudaMemcpy``, which is what ``.item()`` / ``.tolist()`` / ``nonzero`` lower to)
    returned inside the gap (within ``tol_ns`` of its start): the host waited for
    the GPU to drain, then had to launch again.
``launch_bound``
    the op after the gap was launched (launch call end) after the GPU drained:
    the GPU waited on the CPU.
``other``
    the next op was already queued: cross-stream or event dependencies,
    copy-engine waits, unknown launch times.
``host_idle``
    carved out of ``between_steps``, ``host_sync`` and ``launch_bound`` gaps: the part
    of the gap in which the launching thread made no traced call (no CPU operator, no runtime
    call) for at least ``host_idle_min_ns`` (default 1 ms) — ``time.sleep``,
    waiting for input or a peer's message, untraced Python. Needs host rows of
    that thread (:func:`host_activity`); without them the gap keeps its cause.
    A host that sleeps is therefore never counted as launch-bound.

Evidence per cause (``detail``): the sync call's name (``host_sync``), the launch
call's delay after the GPU drained (``launch_bound``), the stretch without any
host call on the launching thread (``host_idle``).

``waiting_on_peer`` is not GPU idle: it is the wait part of collective kernels
(the kernel spins until the last rank arrives), added from the matched instances
so the report can show it next to true idle time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import polars as pl

from tracekit.core import intervals as iv
from tracekit.core.blocking import SYNC_REGEX as _SYNC_REGEX
from tracekit.analysis.findings import Finding, idle_candidates
from tracekit.analysis.registry import (Analysis, FindingsContext, FinishContext, Finished, PartContext, concat, keyword_defaults,
                                        records, register)
from tracekit.core.window import cpu_mode_ranks, device_op_expr
from tracekit.schema import GPU_OP_KINDS

__all__ = ["IdleCauses", "idle_causes", "host_activity", "gpu_ops", "sync_calls", "busy_before", "asof", "SYNC_REGEX", "IDLE_CAUSES", "CPU_SYNC_FAMILY"]

#: blocking host calls, CUDA and HIP (the one list: :mod:`tracekit.core.blocking`)
SYNC_REGEX = _SYNC_REGEX
IDLE_CAUSES = ("between_steps", "host_sync", "launch_bound", "host_idle", "other", "waiting_on_peer")
#: a stretch of at least this long with no traced host call on the launching thread is host idle
HOST_IDLE_MIN_NS = 1_000_000
#: host rows (on the launching thread) whose time counts as the host being active
HOST_KINDS = ("cpu_op", "runtime")
#: ``tid`` of the rank-wide host activity (used when a GPU op's launching thread is unknown)
ANY_TID = -(2**62)
#: CPU mode: family of the top-level host readbacks on the forward thread (docs/cpu_mode.md)
CPU_SYNC_FAMILY = "host_sync.cpu"
#: columns of :attr:`IdleCauses.totals` and of its gaps
_TOTALS_SCHEMA = {"rank": pl.Int64, "cause": pl.String, "total_ns": pl.Int64, "count": pl.UInt32}
_GAPS_SCHEMA = {"rank": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64, "dur_ns": pl.Int64, "cause": pl.String,
                "step_id": pl.Int64, "next_name": pl.String, "detail": pl.String}


def gpu_ops(df: pl.DataFrame, columns: list[str] | None = None) -> pl.DataFrame:
    """Device op rows (GPU ops, or CPU-mode rows: :func:`tracekit.core.window.device_op_expr`)
    with ``start``/``end`` columns, rank as Int64; only ``columns`` (+ rank, start, end) when given."""
    q = df.lazy().filter(device_op_expr(cpu_mode_ranks(df)) & (pl.col("dur_ns") >= 0))
    if columns is not None:
        q = q.select(["rank", "ts_ns", "dur_ns", *[c for c in columns if c not in ("rank", "ts_ns", "dur_ns", "start", "end")]])
    return q.with_columns(
        pl.col("rank").cast(pl.Int64), pl.col("ts_ns").alias("start"), (pl.col("ts_ns") + pl.col("dur_ns")).alias("end")
    ).collect()


def asof(left: pl.DataFrame, right: pl.DataFrame, left_on: str, right_on: str, by: str, strategy: str = "backward") -> pl.DataFrame:
    """``join_asof`` by group; both sides sorted on the time key (polars needs it within each group)."""
    return left.sort(left_on).join_asof(
        right.sort(right_on), left_on=left_on, right_on=right_on, by=by, strategy=strategy, check_sortedness=False  # type: ignore[arg-type]
    )


def busy_before(ops: pl.DataFrame, points: pl.DataFrame, *, by: str = "rank", at: str = "t", out: str = "busy") -> pl.DataFrame:
    """Add column ``out``: GPU busy time (union of ``ops`` start/end) on the point's rank before ``at``.

    Busy time in ``[a, b)`` is ``busy_before(b) − busy_before(a)``; O(n log n), no per-event loop.
    """
    m = iv.merge(ops.select(by, "start", "end"), by=by)
    m = m.with_columns((pl.col("end") - pl.col("start")).cum_sum().over(by).alias("_cum")).with_columns(
        (pl.col("_cum") - (pl.col("end") - pl.col("start"))).alias("_before")
    ).select(by, pl.col("start").alias("_ms"), pl.col("end").alias("_me"), "_before")
    j = asof(points.with_row_index("_pi"), m, at, "_ms", by)
    inside = (pl.min_horizontal(pl.col(at), pl.col("_me")) - pl.col("_ms")).clip(lower_bound=0)
    return j.with_columns((pl.col("_before") + inside).fill_null(0).alias(out)).sort("_pi").drop(["_pi", "_ms", "_me", "_before"])


def sync_calls(df: pl.DataFrame) -> pl.DataFrame:
    """Blocking runtime calls: ``rank, s_start, s_end, s_name``; in CPU mode the host readbacks
    (``aten::item`` ...) the converter marked with family ``host_sync.cpu``."""
    kind = pl.col("kind")
    cpu_sync = (kind == "cpu_op") & (pl.col("family").cast(pl.String) == CPU_SYNC_FAMILY)
    # the kind test first: name strings are made for runtime rows only
    cand = df.lazy().filter(kind.is_in(["runtime", "cpu_op"])).select("rank", "kind", "ts_ns", "dur_ns", "name", "family").collect()
    return cand.filter(
        ((kind == "runtime") & pl.col("name").cast(pl.String).str.contains(SYNC_REGEX)) | cpu_sync.fill_null(False)
    ).select(
        pl.col("rank").cast(pl.Int64),
        pl.col("ts_ns").alias("s_start"),
        (pl.col("ts_ns") + pl.col("dur_ns")).alias("s_end"),
        pl.col("name").cast(pl.String).alias("s_name"),
    )


def host_activity(src: pl.DataFrame | pl.LazyFrame, *, min_idle_ns: int = HOST_IDLE_MIN_NS) -> pl.DataFrame:
    """Host activity per (rank, tid): CPU operator and runtime call intervals merged across
    stretches shorter than ``min_idle_ns``, so what remains between two intervals is a stretch
    of at least ``min_idle_ns`` with no traced call. One more set per rank with ``tid`` =
    :data:`ANY_TID` (all threads) for GPU ops whose launching thread is unknown.

    ``src``: a frame or a lazy scan (only ``rank, kind, tid, ts_ns, dur_ns`` are read, so a
    trace's launch calls need not be in memory all at once). Columns ``rank, tid, start, end``.
    """
    lf = src.lazy() if isinstance(src, pl.DataFrame) else src
    rows = lf.filter(pl.col("kind").cast(pl.String).is_in(list(HOST_KINDS)) & (pl.col("dur_ns") >= 0)).select(
        pl.col("rank").cast(pl.Int64), pl.col("tid").cast(pl.Int64).fill_null(ANY_TID), pl.col("ts_ns").alias("start"),
        (pl.col("ts_ns") + pl.col("dur_ns") + min_idle_ns).alias("end"))
    # per thread first, then all threads from the per-thread unions (a union of unions: the same set, from a few
    # merged intervals instead of a second copy of every call)
    per_tid = iv.merge(rows.collect(), by=["rank", "tid"])
    any_tid = iv.merge(per_tid.with_columns(pl.lit(ANY_TID, dtype=pl.Int64).alias("tid")), by=["rank", "tid"])
    m = pl.concat([per_tid, any_tid]).sort(["rank", "tid", "start"])
    return m.with_columns((pl.col("end") - min_idle_ns).alias("end"))


def _coverage(host: pl.DataFrame, pts: pl.DataFrame, a: str, b: str) -> pl.DataFrame:
    """Add ``host_cov``: length of ``[a, b)`` covered by ``host`` (disjoint, sorted per rank, tid) on the point's (rank, tid)."""
    keys = ["rank", "tid"]
    m = host.with_columns((pl.col("end") - pl.col("start")).cum_sum().over(keys).alias("_cum")).with_columns(
        (pl.col("_cum") - (pl.col("end") - pl.col("start"))).alias("_before")).select(
        *keys, pl.col("start").alias("_ms"), pl.col("end").alias("_me"), "_before")
    out = pts.with_row_index("_pi")
    for col, tag in ((a, "_ca"), (b, "_cb")):
        j = out.select("_pi", *keys, col).sort(col).join_asof(m.sort("_ms"), left_on=col, right_on="_ms", by=keys,
                                                              check_sortedness=False)
        inside = (pl.min_horizontal(pl.col(col), pl.col("_me")) - pl.col("_ms")).clip(lower_bound=0)
        out = out.join(j.select("_pi", (pl.col("_before") + inside).fill_null(0).alias(tag)), on="_pi", how="left")
    return out.with_columns((pl.col("_cb") - pl.col("_ca")).alias("host_cov")).sort("_pi").drop(["_pi", "_ca", "_cb"])


@dataclass
class IdleCauses:
    """``gaps``: every gap (rank, start_ns, end_ns, dur_ns, cause, step_id, next_name, detail; ``next_name``
    categorical: a string per gap of a long kernel name cost ~180 MB on a 566k-kernel rank);
    ``totals``: rank, cause, total_ns, count; ``largest``: the top gaps per rank."""

    gaps: pl.DataFrame
    totals: pl.DataFrame
    largest: pl.DataFrame

    def by_rank_ns(self) -> dict[str, dict[str, int]]:
        """``{rank: {cause: ns}}`` with every cause present (0 when none)."""
        out: dict[str, dict[str, int]] = {}
        for r in sorted(set(self.totals["rank"].to_list())):
            out[str(r)] = {c: 0 for c in IDLE_CAUSES}
        for r, c, t in zip(self.totals["rank"].to_list(), self.totals["cause"].to_list(), self.totals["total_ns"].to_list()):
            out[str(r)][c] = int(t)
        return out


def _windows(ops: pl.DataFrame, window: Any) -> pl.DataFrame:
    if window is None:
        return ops.group_by("rank").agg(pl.col("start").min().alias("lo"), pl.col("end").max().alias("hi"))
    if isinstance(window, Mapping):
        return pl.DataFrame(
            {"rank": [int(k) for k in window], "lo": [int(v[0]) for v in window.values()], "hi": [int(v[1]) for v in window.values()]},
            schema={"rank": pl.Int64, "lo": pl.Int64, "hi": pl.Int64},
        )
    lo, hi = window
    return ops.select(pl.col("rank").unique()).with_columns(pl.lit(int(lo)).alias("lo"), pl.lit(int(hi)).alias("hi"))


def idle_causes(
    df: pl.DataFrame,
    instances: pl.DataFrame | None = None,
    *,
    window: tuple[int, int] | Mapping[int, tuple[int, int]] | None = None,
    tol_ns: int = 20_000,
    min_gap_ns: int = 0,
    top_n: int = 10,
    host: pl.DataFrame | None = None,
) -> IdleCauses:
    """Idle gaps per rank with their cause (module doc). ``window`` defaults to each rank's
    first GPU op start → last GPU op end; gaps shorter than ``min_gap_ns`` are dropped.
    ``host``: :func:`host_activity` of the ranks (default: computed from ``df``'s own host rows)."""
    ops = gpu_ops(df, ["step_id", "name", "kind", "launch_ts_ns", "launch_dur_ns", "tid", "launch_tid"])
    if ops.height == 0:
        e = pl.DataFrame(schema=_GAPS_SCHEMA)
        return IdleCauses(e, pl.DataFrame(schema=_TOTALS_SCHEMA), e)
    bounds = _windows(ops, window)
    g = iv.gaps(ops.select("rank", "start", "end"), by="rank", bounds=bounds).filter(
        (pl.col("end") - pl.col("start")) >= max(min_gap_ns, 1)
    )
    gaps = _carve_host_idle(_with_causes(_neighbours(g, ops, df), tol_ns), host if host is not None else host_activity(df))
    if instances is not None and instances.height:
        gaps = pl.concat([gaps, _peer_waits(instances, bounds).select(gaps.columns)], how="vertical_relaxed")
    gaps = gaps.sort(["rank", "start_ns"], maintain_order=True)
    return IdleCauses(gaps, _totals(gaps), _largest(gaps, top_n))


def _neighbours(g: pl.DataFrame, ops: pl.DataFrame, df: pl.DataFrame) -> pl.DataFrame:
    """Each gap with what surrounds it: the previous op (ending at/before its start), the next op (starting at/after
    its end: its step, name, launch end and issuing thread), the last blocking host call returning before its end and
    the last step range starting before its end."""
    prev = ops.select("rank", pl.col("end").alias("p_end"), pl.col("step_id").alias("p_step")).sort(["rank", "p_end"])
    host_op = ~pl.col("kind").cast(pl.String).is_in(list(GPU_OP_KINDS))
    nxt = ops.select(
        "rank", pl.col("start").alias("n_start"), pl.col("step_id").alias("n_step"), pl.col("name").alias("next_name"),
        # CPU mode: an operator runs when it is issued, so its start is its "launch end"
        pl.coalesce(pl.col("launch_ts_ns") + pl.col("launch_dur_ns").fill_null(0),
                    pl.when(host_op).then(pl.col("start"))).alias("n_launch_end"),
        # the thread that issued it (CPU mode: the operator's own thread)
        pl.coalesce(pl.col("launch_tid"), pl.when(host_op).then(pl.col("tid"))).cast(pl.Int64).fill_null(ANY_TID).alias("tid"),
    ).sort(["rank", "n_start"])
    g = asof(g, prev, "start", "p_end", "rank")
    g = asof(g, nxt, "end", "n_start", "rank", "forward")
    g = asof(g, sync_calls(df).sort(["rank", "s_end"]), "end", "s_end", "rank")
    st = df.filter(pl.col("kind").cast(pl.String) == "step").select(
        pl.col("rank").cast(pl.Int64), pl.col("ts_ns").alias("st_start")
    ).sort(["rank", "st_start"])
    return asof(g, st, "end", "st_start", "rank")


def _with_causes(g: pl.DataFrame, tol_ns: int) -> pl.DataFrame:
    """The gaps' rows with their cause, first match wins: a step boundary, a host sync returning inside the gap
    (± ``tol_ns``), the next op launched after the GPU drained, else ``other``."""
    step_change = (pl.col("p_step").is_not_null() & pl.col("n_step").is_not_null() & (pl.col("p_step") != pl.col("n_step"))) | (
        pl.col("st_start").is_not_null() & (pl.col("st_start") > pl.col("start")) & (pl.col("st_start") <= pl.col("end"))
    )
    synced = pl.col("s_end").is_not_null() & (pl.col("s_end") >= pl.col("start") - tol_ns) & (pl.col("s_start") <= pl.col("start") + tol_ns)
    launch = pl.col("n_launch_end").is_not_null() & (pl.col("n_launch_end") > pl.col("start"))
    cause = (
        pl.when(step_change).then(pl.lit("between_steps"))
        .when(synced).then(pl.lit("host_sync"))
        .when(launch).then(pl.lit("launch_bound"))
        .otherwise(pl.lit("other"))
    )
    return g.with_columns(cause.alias("cause")).select(
        "rank",
        pl.col("start").alias("start_ns"),
        pl.col("end").alias("end_ns"),
        (pl.col("end") - pl.col("start")).alias("dur_ns"),
        "cause",
        pl.coalesce(pl.col("n_step"), pl.col("p_step")).cast(pl.Int64).alias("step_id"),
        "next_name",
        pl.when(pl.col("cause") == "host_sync").then(pl.col("s_name"))
        .when(pl.col("cause") == "launch_bound").then(
            pl.lit("launched ") + ((pl.col("n_launch_end") - pl.col("start")) // 1000).cast(pl.String) + pl.lit(" µs after the GPU drained"))
        .otherwise(None).alias("detail"),
        pl.col("tid").fill_null(ANY_TID),
    )


def _peer_waits(instances: pl.DataFrame, bounds: pl.DataFrame) -> pl.DataFrame:
    """``waiting_on_peer`` rows: each rank's collective wait (arrival → arrival + wait), cut to its window."""
    w = instances.filter(pl.col("wait_ns") > 0).select(
        pl.col("rank").cast(pl.Int64),
        pl.col("arrival_ns").alias("start_ns"),
        (pl.col("arrival_ns") + pl.col("wait_ns")).alias("end_ns"),
        pl.col("wait_ns").alias("dur_ns"),
        pl.lit("waiting_on_peer").alias("cause"),
        pl.col("step_id").cast(pl.Int64),
        pl.col("name").cast(pl.Categorical).alias("next_name"),
        (pl.lit("late rank ") + pl.col("late_rank").cast(pl.String)).alias("detail"),
    )
    w = iv.intersect(w, bounds, by="rank", start="start_ns", end="end_ns").drop(["lo", "hi"])
    return w.with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns"))


def _carve_host_idle(gaps: pl.DataFrame, host: pl.DataFrame) -> pl.DataFrame:
    """Split ``between_steps``/``host_sync``/``launch_bound`` gaps: the part not covered by the launching thread's
    activity becomes a ``host_idle`` row (the gap's last ``dur_ns``); the rest (its first part) keeps the cause.
    Threads (or ranks) without any host row keep the whole gap (no evidence either way)."""
    cols = [c for c in gaps.columns if c != "tid"]
    if host.height == 0 or gaps.height == 0:
        return gaps.select(cols)
    known = host.select("rank", "tid").unique().with_columns(pl.lit(True).alias("_known"))
    g = gaps.join(known, on=["rank", "tid"], how="left").with_columns(pl.col("_known").fill_null(False))
    g = _coverage(host, g.rename({"start_ns": "a", "end_ns": "b"}), "a", "b").rename({"a": "start_ns", "b": "end_ns"})
    split = pl.col("cause").is_in(["between_steps", "host_sync", "launch_bound"]) & pl.col("_known")
    idle = (pl.col("dur_ns") - pl.col("host_cov")).clip(lower_bound=0)
    g = g.with_columns(pl.when(split).then(idle).otherwise(0).alias("_idle"))
    # disjoint pieces, so clipping to profiler windows keeps the split: the inactive stretch is placed at the gap's end
    kept = g.with_columns((pl.col("dur_ns") - pl.col("_idle")).alias("dur_ns")).with_columns(
        (pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns")).filter(pl.col("dur_ns") > 0)
    carved = g.filter(pl.col("_idle") > 0).with_columns(
        (pl.col("end_ns") - pl.col("_idle")).alias("start_ns"),
        pl.col("_idle").alias("dur_ns"), pl.lit("host_idle").alias("cause"),
        (pl.lit("no host call on the launching thread for ") + (pl.col("_idle") // 1000).cast(pl.String) + pl.lit(" µs")).alias("detail"))
    return pl.concat([kept.select(cols), carved.select(cols)], how="vertical_relaxed").sort(["rank", "start_ns"], maintain_order=True)


def _totals(gaps: pl.DataFrame) -> pl.DataFrame:
    return gaps.group_by(["rank", "cause"]).agg(pl.col("dur_ns").sum().alias("total_ns"), pl.len().alias("count")).sort(["rank", "cause"])


def _largest(gaps: pl.DataFrame, top_n: int) -> pl.DataFrame:
    """The ``top_n`` longest gaps per rank, longest first (ties: earlier first)."""
    if gaps.height > top_n:  # sort only the candidates: gaps at least as long as the rank's top_n-th longest
        gaps = gaps.filter(pl.col("dur_ns") >= pl.col("dur_ns").top_k(top_n).min().over("rank"))
    return gaps.sort(["rank", "dur_ns", "start_ns"], descending=[False, True, False], maintain_order=True).group_by(
        "rank", maintain_order=True).head(top_n).with_columns(pl.col("next_name").cast(pl.String))


def restrict_to_spans(idle: IdleCauses, spans: Any, *, top_n: int = 10) -> IdleCauses:
    """Keep only the parts of gaps inside ``spans`` (profiler windows); totals recomputed.

    Time between the windows of a windowed capture was not recorded, so it is
    neither idle nor busy.
    """
    if not spans or idle.gaps.height == 0:
        return idle
    sp = pl.DataFrame({"lo": [int(a) for a, _ in spans], "hi": [int(b) for _, b in spans]})
    g = iv.intersect(idle.gaps, sp, start="start_ns", end="end_ns").drop(["lo", "hi"])
    g = g.with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns")).sort(["rank", "start_ns"], maintain_order=True)
    return IdleCauses(g, _totals(g), _largest(g, top_n))


# --- the ``idle`` analysis (tracekit.analysis.registry) -------------------------------------------------------------

def _part(df: pl.DataFrame, ctx: PartContext) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Idle totals and largest gaps of the window's rows; a windowed capture's gaps are cut to its profiler windows."""
    plan, o = ctx.plan, ctx.options
    window = (plan.lo, plan.hi) if plan.lo is not None and plan.hi is not None else None
    idle = idle_causes(df, ctx.instances, window=window, host=ctx.host, **o)
    if plan.spans:  # windowed capture: time between profiler windows was not recorded
        idle = restrict_to_spans(idle, plan.spans, top_n=o["top_n"])
    return idle.totals, idle.largest


def _finish(parts: list[tuple[pl.DataFrame, pl.DataFrame]], ctx: FinishContext) -> Finished:
    idle = IdleCauses(pl.DataFrame(), concat([p[0] for p in parts], _TOTALS_SCHEMA), concat([p[1] for p in parts], _GAPS_SCHEMA))
    return Finished({
        "idle_causes_ns": idle.by_rank_ns(),
        "idle_gaps": {str(r): records(g.drop("rank"), ctx.options["top_n"]) for (r,), g in idle.largest.group_by("rank", maintain_order=True)},
    }, idle)


def _findings(ctx: FindingsContext) -> list[Finding]:
    ext = ctx.results["extents"].value
    return idle_candidates(ctx.result.value.totals, ext.wmap, ext.cpu, ext.observed)


ANALYSIS = register(Analysis(
    "idle", ("idle_causes_ns", "idle_gaps"),
    ("rank", "kind", "ts_ns", "dur_ns", "tid", "name", "category", "family", "launch_ts_ns", "launch_dur_ns", "launch_tid", "step_id"),
    _part, _finish, _findings, options=keyword_defaults(idle_causes, exclude=("window", "host")), findings_needs=("extents",),
    rows="window", order=20))
