"""Synchronization stalls: collective waits big enough to matter, and why the late rank was late.

A stall is one (collective instance, waiting rank) with ``wait_ns ≥ min_wait_ns``
and, when the waiting rank's step is known, ``wait_ns ≥ min_rel_step × step
duration``. For each stall the late rank's last moments before it arrived are
classified (first match wins):

``delayed_forward``
    the late rank's GPU was idle before it arrived and a new step range started
    (or the step id changed) in that idle stretch: its forward started late.
``host_sync``
    the late rank's GPU was idle and a blocking host call returned in that stretch.
``cpu_launch_gap``
    the late rank's GPU was idle for other reasons: its CPU launched late.
``preceding_kernels``
    the late rank's GPU was busy: its own kernels ran longer (``detail`` names the
    kernel that took most of the lost window).

"GPU idle before arrival" means idle for at least ``idle_frac`` of the arrival
skew of that instance.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from tracekit.core import intervals as iv
from tracekit.analysis.findings import Finding, clock_candidates, stall_candidates
from tracekit.analysis.passes.gaps import asof, busy_before, gpu_ops, sync_calls
from tracekit.analysis.plan import StallPlan
from tracekit.analysis.registry import Analysis, FindingsContext, FinishContext, Finished, PartContext, records, register

__all__ = ["detect_stalls", "stall_summary", "lost_by_rank", "STALL_CAUSES", "MIN_WAIT_NS", "MIN_REL_STEP",
           "StallPart", "stall_plan", "stall_part", "stall_finish", "stall_steps", "empty_stalls"]

STALL_CAUSES = ("delayed_forward", "host_sync", "cpu_launch_gap", "preceding_kernels")
MIN_WAIT_NS = 50_000
MIN_REL_STEP = 0.02

_STALL_SCHEMA: dict[Any, Any] = {
    "waiting_rank": pl.Int64, "late_rank": pl.Int64, "wait_ns": pl.Int64, "ts_ns": pl.Int64, "step": pl.Int64,
    "collective": pl.String, "pg": pl.String, "seq": pl.Int64, "coll_name": pl.String, "cause": pl.String,
    "detail": pl.String, "late_idle_before_ns": pl.Int64, "late_arrival_ns": pl.Int64,
}


def stall_steps(df: pl.DataFrame) -> pl.DataFrame:
    """Step rows as the stall analysis reads them: ``rank, step_id, st_start, st_dur``."""
    return df.filter(pl.col("kind") == "step").select(
        pl.col("rank").cast(pl.Int64), pl.col("step_id"), pl.col("ts_ns").alias("st_start"), pl.col("dur_ns").alias("st_dur")
    )


@dataclass
class StallPart:
    """What one rank (or a whole frame) supplies to a :class:`StallPlan`: busy time before the plan's
    points, the late rank's last blocking host call, and its heaviest kernel before arrival."""

    busy: pl.DataFrame  # pg, seq, k, busy
    sync: pl.DataFrame  # pg, seq, s_start, s_end, s_name
    heavy: pl.DataFrame  # pg, seq, k_name


def _per_step(steps: pl.DataFrame, keys: pl.DataFrame, agg: pl.Expr) -> pl.DataFrame:
    """``agg`` per (rank, step_id) of the ``steps`` whose key is in ``keys``: only the steps the instances name are
    grouped (a hash group-by over every rank's steps costs ~50 MB at 512 ranks x 700 steps; this, the keys')."""
    keys = keys.drop_nulls().unique().with_columns(pl.col("rank").cast(steps.schema["rank"]),
                                                   pl.col("step_id").cast(steps.schema["step_id"]))
    return steps.join(keys, on=["rank", "step_id"], how="semi").group_by(["rank", "step_id"]).agg(agg)


def stall_plan(
    instances: pl.DataFrame,
    steps: pl.DataFrame,
    *,
    min_wait_ns: int = MIN_WAIT_NS,
    min_rel_step: float = MIN_REL_STEP,
    idle_frac: float = 0.5,
    tol_ns: int = 20_000,
) -> StallPlan | None:
    """Candidates and per-instance roles (:class:`StallPlan`); None when there is no candidate.

    ``steps``: :func:`stall_steps` of the analyzed frame (all ranks; a few rows per step).
    """
    if instances.height == 0:
        return None
    inst = instances.filter(pl.col("quality") != "mismatched")
    cand = inst.filter((pl.col("rank") != pl.col("late_rank")) & (pl.col("wait_ns") >= min_wait_ns))
    if steps.height:
        sd = _per_step(steps, cand.select("rank", "step_id"), pl.col("st_dur").max())
        cand = cand.join(sd, on=["rank", "step_id"], how="left").filter(
            pl.col("st_dur").is_null() | (pl.col("wait_ns") >= min_rel_step * pl.col("st_dur"))
        )
    if cand.height == 0:
        return None
    # Per instance: the late rank and the first-arriving rank, and the previous sync point
    # (end of the previous instance of the group on that rank; collectives end together).
    inst = inst.sort(["pg", "rank", "seq"]).with_columns(pl.col("end_ns").shift(1).over(["pg", "rank"]).alias("prev_end"))
    role = inst.select("pg", "seq", "rank", "arrival_ns", "prev_end", "step_id")
    li = (
        inst.group_by(["pg", "seq"]).agg(
            pl.col("late_rank").first(),
            pl.col("rank").sort_by("arrival_ns", maintain_order=True).first().alias("first_rank"),
            pl.col("arrival_ns").min().alias("t_first"),
            pl.col("arrival_ns").max().alias("t_late"),
        )
        .with_columns((pl.col("t_late") - pl.col("t_first")).alias("skew"))
        .join(role.rename({"rank": "late_rank", "arrival_ns": "_a1", "prev_end": "p_late", "step_id": "late_step"}),
              on=["pg", "seq", "late_rank"], how="left")
        .join(role.rename({"rank": "first_rank", "arrival_ns": "_a2", "prev_end": "p_first", "step_id": "first_step"}),
              on=["pg", "seq", "first_rank"], how="left")
        .drop(["_a1", "_a2"])
    )
    # period since the previous sync point: busy time of the late and of the first rank
    pts = pl.concat([
        li.select("pg", "seq", pl.lit("late_a").alias("k"), pl.col("late_rank").alias("rank"), pl.col("p_late").alias("t")),
        li.select("pg", "seq", pl.lit("late_b").alias("k"), pl.col("late_rank").alias("rank"), pl.col("t_late").alias("t")),
        li.select("pg", "seq", pl.lit("first_a").alias("k"), pl.col("first_rank").alias("rank"), pl.col("p_first").alias("t")),
        li.select("pg", "seq", pl.lit("first_b").alias("k"), pl.col("first_rank").alias("rank"), pl.col("t_first").alias("t")),
    ]).filter(pl.col("t").is_not_null())
    # step start of the late rank vs the first rank for the same step
    ss = _per_step(steps, pl.concat([li.select(pl.col("late_rank").alias("rank"), pl.col("late_step").alias("step_id")),
                                     li.select(pl.col("first_rank").alias("rank"), pl.col("late_step").alias("step_id"))]),
                   pl.col("st_start").min())
    li = li.join(ss.rename({"rank": "late_rank", "step_id": "late_step", "st_start": "st_late"}), on=["late_rank", "late_step"], how="left")
    li = li.join(ss.rename({"rank": "first_rank", "step_id": "late_step", "st_start": "st_first"}), on=["first_rank", "late_step"], how="left")
    return StallPlan(cand, li, pts, idle_frac, tol_ns)


def stall_part(plan: StallPlan, df: pl.DataFrame) -> StallPart:
    """The per-rank half of :func:`detect_stalls` for the ranks present in ``df`` (one rank's rows, or a whole frame)."""
    ops = gpu_ops(df, ["kind", "name"])
    here = [int(r) for r in df.get_column("rank").unique().to_list()]
    pts = plan.pts.filter(pl.col("rank").is_in(here))
    busy = busy_before(ops, pts).select("pg", "seq", "k", "busy") if pts.height else pl.DataFrame(
        schema={"pg": pl.String, "seq": pl.Int64, "k": pl.String, "busy": pl.Int64})
    # blocking host call of the late rank returning before it arrived
    li = plan.li.filter(pl.col("late_rank").is_in(here))
    sy = sync_calls(df).rename({"rank": "late_rank"})
    sync = asof(li.select("pg", "seq", "late_rank", "t_late"), sy, "t_late", "s_end", "late_rank").select(
        "pg", "seq", "s_start", "s_end", "s_name")
    # late rank's heaviest kernel since the previous sync point, for the stalling instances
    ok = ops.filter(~pl.col("kind").is_in(["memcpy", "memset"])).select(
        pl.col("rank").alias("late_rank"), "start", "end", pl.col("name").cast(pl.String).alias("k_name")
    )
    stalled = plan.cand.select("pg", "seq").unique()
    win = li.filter(pl.col("skew") > 0).join(stalled, on=["pg", "seq"], how="semi").select(
        "pg", "seq", "late_rank", pl.coalesce(pl.col("p_late"), pl.col("t_first") - pl.col("skew")).alias("w0"), "t_late")
    # kernels overlapping each window [w0, t_late) of their rank: the interval primitive, no rank-wide join
    pairs = iv.overlap_join(win, ok, by="late_rank", start="w0", end="t_late", right_start="start", right_end="end")
    heavy = (
        pairs.filter(pl.col("start") >= pl.col("w0") - 1_000_000_000)
        .with_columns((pl.min_horizontal("end", "t_late") - pl.max_horizontal("start", "w0")).alias("ov"))
        .group_by(["pg", "seq", "k_name"]).agg(pl.col("ov").sum())
        .sort(["ov", "k_name"], descending=[True, False]).unique(["pg", "seq"], keep="first", maintain_order=True)
        .select("pg", "seq", "k_name")
    )
    heavy_parts = [pl.DataFrame(schema={"pg": pl.String, "seq": pl.Int64, "k_name": pl.String}), heavy]
    return StallPart(busy, sync, pl.concat(heavy_parts, how="vertical_relaxed"))


def stall_finish(plan: StallPlan, parts: list[StallPart]) -> pl.DataFrame:
    """Stalls (see :func:`detect_stalls`) from the plan and every rank's :class:`StallPart`."""
    idle_frac, tol_ns = plan.idle_frac, plan.tol_ns
    busy = pl.concat([p.busy for p in parts], how="vertical_relaxed") if parts else pl.DataFrame(
        schema={"pg": pl.String, "seq": pl.Int64, "k": pl.String, "busy": pl.Int64})
    # points of ranks without any op: no busy time (as busy_before gives)
    b = plan.pts.select("pg", "seq", "k").join(busy, on=["pg", "seq", "k"], how="left").with_columns(pl.col("busy").fill_null(0))
    b = b.pivot(on="k", index=["pg", "seq"], values="busy") if b.height else b.select("pg", "seq")
    for k in ("late_a", "late_b", "first_a", "first_b"):
        if k not in b.columns:
            b = b.with_columns(pl.lit(None, pl.Int64).alias(k))
    li = plan.li.join(b, on=["pg", "seq"], how="left").with_columns(
        (pl.col("late_b") - pl.col("late_a")).alias("busy_late"),
        (pl.col("first_b") - pl.col("first_a")).alias("busy_first"),
    ).with_columns(
        ((pl.col("t_late") - pl.col("p_late")) - pl.col("busy_late")).alias("idle_late"),
        ((pl.col("t_first") - pl.col("p_first")) - pl.col("busy_first")).alias("idle_first"),
    ).with_columns(
        pl.when(pl.col("idle_late").is_not_null())
        .then((pl.col("idle_late") - pl.col("idle_first").fill_null(0)).clip(lower_bound=0))
        .otherwise(pl.col("skew"))  # first collective seen: no previous sync point, assume idle
        .alias("late_idle_before_ns"),
        pl.coalesce(pl.col("p_late"), pl.col("t_first") - pl.col("skew")).alias("idle_from"),
    )
    sync = pl.concat([p.sync for p in parts], how="vertical_relaxed") if parts else None
    if sync is not None and sync.height:
        li = li.join(sync, on=["pg", "seq"], how="left")
    else:
        li = li.with_columns(pl.lit(None, pl.Int64).alias("s_start"), pl.lit(None, pl.Int64).alias("s_end"),
                             pl.lit(None, pl.String).alias("s_name"))
    heavy = pl.concat([p.heavy for p in parts], how="vertical_relaxed") if parts else pl.DataFrame(
        schema={"pg": pl.String, "seq": pl.Int64, "k_name": pl.String})
    li = li.join(heavy, on=["pg", "seq"], how="left")
    idle = pl.col("late_idle_before_ns") >= idle_frac * pl.col("skew")
    fwd_late = pl.col("st_late").is_not_null() & pl.col("st_first").is_not_null() & (
        (pl.col("st_late") - pl.col("st_first")) >= idle_frac * pl.col("skew"))
    sync_in = pl.col("s_end").is_not_null() & (pl.col("s_end") >= pl.col("idle_from") - tol_ns)
    cause = (
        pl.when(fwd_late).then(pl.lit("delayed_forward"))
        .when(idle & sync_in).then(pl.lit("host_sync"))
        .when(idle).then(pl.lit("cpu_launch_gap"))
        .otherwise(pl.lit("preceding_kernels"))
    )
    detail = (
        pl.when(pl.col("cause") == "host_sync").then(pl.col("s_name"))
        .when(pl.col("cause") == "preceding_kernels").then(pl.col("k_name"))
        .when(pl.col("cause") == "delayed_forward").then(
            pl.lit("step started ") + ((pl.col("st_late") - pl.col("st_first")) // 1000).cast(pl.String) + pl.lit(" µs late"))
        .otherwise(None)
    )
    li = li.with_columns(cause.alias("cause")).with_columns(detail.alias("detail"))
    out = plan.cand.join(li.select("pg", "seq", "cause", "detail", "late_idle_before_ns", pl.col("t_late").alias("late_arrival_ns")),
                         on=["pg", "seq"], how="left")
    return out.select(
        pl.col("rank").alias("waiting_rank"),
        "late_rank",
        "wait_ns",
        pl.col("arrival_ns").alias("ts_ns"),
        pl.col("step_id").alias("step"),
        (pl.col("coll_name") + pl.lit(" ") + pl.col("pg") + pl.lit(" #") + pl.col("seq").cast(pl.String)).alias("collective"),
        "pg", "seq", "coll_name", "cause", "detail", "late_idle_before_ns", "late_arrival_ns",
    ).cast(_STALL_SCHEMA).sort(["ts_ns", "waiting_rank"], maintain_order=True)


def empty_stalls() -> pl.DataFrame:
    return pl.DataFrame(schema=_STALL_SCHEMA)


def detect_stalls(
    instances: pl.DataFrame,
    df: pl.DataFrame,
    *,
    min_wait_ns: int = MIN_WAIT_NS,
    min_rel_step: float = MIN_REL_STEP,
    idle_frac: float = 0.5,
    tol_ns: int = 20_000,
) -> pl.DataFrame:
    """One row per stall (columns: waiting_rank, late_rank, wait_ns, ts_ns, step, collective, pg, seq,
    coll_name, cause, detail, late_idle_before_ns, late_arrival_ns), sorted by time.

    Runs as :func:`stall_plan` (cross-rank, small) → :func:`stall_part` (per rank; here on the
    whole frame) → :func:`stall_finish`; ``tracekit.api.analyze`` calls ``stall_part`` once per rank.
    """
    plan = stall_plan(instances, stall_steps(df), min_wait_ns=min_wait_ns, min_rel_step=min_rel_step,
                      idle_frac=idle_frac, tol_ns=tol_ns)
    if plan is None:
        return empty_stalls()
    return stall_finish(plan, [stall_part(plan, df)])


def stall_summary(stalls: pl.DataFrame) -> pl.DataFrame:
    """Stalls grouped by late rank and cause: count, lost time (sum of waits), waiting ranks, top detail."""
    if stalls.height == 0:
        return pl.DataFrame(schema={"late_rank": pl.Int64, "cause": pl.String, "count": pl.UInt32, "lost_ns": pl.Int64,
                                    "waiting_ranks": pl.List(pl.Int64), "top_detail": pl.String})
    return (
        stalls.group_by(["late_rank", "cause"])
        .agg(
            pl.len().alias("count"),
            pl.col("wait_ns").sum().alias("lost_ns"),
            pl.col("waiting_rank").unique().sort().alias("waiting_ranks"),
            # most frequent detail; ties: the alphabetically first (never row order)
            pl.col("detail").drop_nulls().mode().sort().first().alias("top_detail"),
        )
        .sort(["lost_ns", "late_rank", "cause"], descending=[True, False, False])
    )


def lost_by_rank(stalls: pl.DataFrame) -> pl.DataFrame:
    """Total time lost waiting, per waiting rank: ``rank, lost_ns, stalls``."""
    return (
        stalls.group_by("waiting_rank")
        .agg(pl.col("wait_ns").sum().alias("lost_ns"), pl.len().alias("stalls"))
        .rename({"waiting_rank": "rank"})
        .sort("rank")
    )


# --- the ``collectives`` analysis (tracekit.analysis.registry): stalls + the collective summary --------------------

def _part(df: pl.DataFrame, ctx: PartContext) -> StallPart | None:
    return stall_part(ctx.plan.stalls, df) if ctx.plan.stalls is not None else None


def _finish(parts: list[StallPart | None], ctx: FinishContext) -> Finished:
    plan = ctx.plan
    stalls = stall_finish(plan.stalls, [p for p in parts if p is not None]) if plan.stalls is not None else empty_stalls()
    lost = lost_by_rank(stalls)
    return Finished({
        "stalls": records(stalls.sort("wait_ns", descending=True, maintain_order=True).select(
            "waiting_rank", "late_rank", "wait_ns", "ts_ns", "step", "collective", "cause", "detail"), plan.max_items),
        "collectives": {
            "clock_alignment": plan.align.to_json(),
            "instances": plan.instances,
            "groups": records(plan.groups),
            "per_rank": records(plan.per_rank),
            "stall_count": stalls.height,
            "stall_summary": records(stall_summary(stalls)),
            "lost_by_rank": {str(r): int(v) for r, v in zip(lost["rank"].to_list(), lost["lost_ns"].to_list())},
            "thresholds": {"min_wait_ns": plan.min_wait, "min_rel_step": plan.min_rel},
        },
    }, stalls)


def _findings(ctx: FindingsContext) -> list[Finding]:
    verdicts = [subj for subj, _w, _t in ctx.results["interconnect"].value]
    return (stall_candidates(ctx.result.sections["collectives"], ctx.results["extents"].value.cpu, verdicts)
            + clock_candidates(ctx.plan.align.residual_ns))


ANALYSIS = register(Analysis(
    "collectives", ("stalls", "collectives"), ("rank", "kind", "ts_ns", "dur_ns", "name", "category", "family"),
    _part, _finish, _findings, findings_needs=("interconnect", "extents"), rows="window", order=10))
