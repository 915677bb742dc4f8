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

import polars as pl

from tracekit.analysis.gaps import asof, busy_before, gpu_ops, sync_calls

__all__ = ["detect_stalls", "stall_summary", "lost_by_rank", "STALL_CAUSES", "MIN_WAIT_NS", "MIN_REL_STEP"]

STALL_CAUSES = ("delayed_forward", "host_sync", "cpu_launch_gap", "preceding_kernels")
MIN_WAIT_NS = 50_000
MIN_REL_STEP = 0.02

_STALL_SCHEMA = {
    "waiting_rank": pl.Int64, "late_rank": pl.Int64, "wait_ns": pl.Int64, "ts_ns": pl.Int64, "step": pl.Int64,
    "collective": pl.String, "pg": pl.String, "seq": pl.Int64, "coll_name": pl.String, "cause": pl.String,
    "detail": pl.String, "late_idle_before_ns": pl.Int64, "late_arrival_ns": pl.Int64,
}


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
    coll_name, cause, detail, late_idle_before_ns, late_arrival_ns), sorted by time."""
    if instances.height == 0:
        return pl.DataFrame(schema=_STALL_SCHEMA)
    inst = instances.filter(pl.col("quality") != "mismatched")
    steps = df.filter(pl.col("kind").cast(pl.String) == "step").select(
        pl.col("rank").cast(pl.Int64), pl.col("step_id"), pl.col("ts_ns").alias("st_start"), pl.col("dur_ns").alias("st_dur")
    )
    cand = inst.filter((pl.col("rank") != pl.col("late_rank")) & (pl.col("wait_ns") >= min_wait_ns))
    if steps.height:
        sd = steps.group_by(["rank", "step_id"]).agg(pl.col("st_dur").max())
        cand = cand.join(sd, on=["rank", "step_id"], how="left").filter(
            pl.col("st_dur").is_null() | (pl.col("wait_ns") >= min_rel_step * pl.col("st_dur"))
        )
    if cand.height == 0:
        return pl.DataFrame(schema=_STALL_SCHEMA)
    # Per instance: the late rank and the first-arriving rank, and the previous sync point
    # (end of the previous instance of the group on that rank; collectives end together).
    inst = inst.sort(["pg", "rank", "seq"]).with_columns(pl.col("end_ns").shift(1).over(["pg", "rank"]).alias("prev_end"))
    role = inst.select("pg", "seq", "rank", "arrival_ns", "prev_end", "step_id")
    li = (
        inst.group_by(["pg", "seq"]).agg(
            pl.col("late_rank").first(),
            pl.col("rank").sort_by("arrival_ns").first().alias("first_rank"),
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
    ops = gpu_ops(df)
    # period since the previous sync point: busy time of the late and of the first rank
    pts = pl.concat([
        li.select("pg", "seq", pl.lit("late_a").alias("k"), pl.col("late_rank").alias("rank"), pl.col("p_late").alias("t")),
        li.select("pg", "seq", pl.lit("late_b").alias("k"), pl.col("late_rank").alias("rank"), pl.col("t_late").alias("t")),
        li.select("pg", "seq", pl.lit("first_a").alias("k"), pl.col("first_rank").alias("rank"), pl.col("p_first").alias("t")),
        li.select("pg", "seq", pl.lit("first_b").alias("k"), pl.col("first_rank").alias("rank"), pl.col("t_first").alias("t")),
    ]).filter(pl.col("t").is_not_null())
    b = busy_before(ops, pts).pivot(on="k", index=["pg", "seq"], values="busy")
    for k in ("late_a", "late_b", "first_a", "first_b"):
        if k not in b.columns:
            b = b.with_columns(pl.lit(None, pl.Int64).alias(k))
    li = li.join(b, on=["pg", "seq"], how="left").with_columns(
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
    # step start of the late rank vs the first rank for the same step
    ss = steps.group_by(["rank", "step_id"]).agg(pl.col("st_start").min())
    li = li.join(ss.rename({"rank": "late_rank", "step_id": "late_step", "st_start": "st_late"}), on=["late_rank", "late_step"], how="left")
    li = li.join(ss.rename({"rank": "first_rank", "step_id": "late_step", "st_start": "st_first"}), on=["first_rank", "late_step"], how="left")
    # blocking host call of the late rank returning since the previous sync point
    sy = sync_calls(df).rename({"rank": "late_rank"})
    li = asof(li, sy, "t_late", "s_end", "late_rank")
    # late rank's heaviest kernel since the previous sync point
    ok = ops.filter(~pl.col("kind").cast(pl.String).is_in(["memcpy", "memset"])).select(
        pl.col("rank").alias("late_rank"), "start", "end", pl.col("name").cast(pl.String).alias("k_name")
    )
    win = li.filter(pl.col("skew") > 0).select("pg", "seq", "late_rank", pl.col("idle_from").alias("w0"), "t_late")
    heavy = (
        win.join(ok, on="late_rank", how="inner")
        .filter((pl.col("start") < pl.col("t_late")) & (pl.col("end") > pl.col("w0")) & (pl.col("start") >= pl.col("w0") - 1_000_000_000))
        .with_columns((pl.min_horizontal("end", "t_late") - pl.max_horizontal("start", "w0")).alias("ov"))
        .group_by(["pg", "seq", "k_name"]).agg(pl.col("ov").sum())
        .sort(["ov", "k_name"], descending=[True, False]).unique(["pg", "seq"], keep="first")
        .select("pg", "seq", "k_name")
    ) if win.height * max(1, ok.height // max(1, ok.get_column("late_rank").n_unique())) < 50_000_000 else pl.DataFrame(
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
    out = cand.join(li.select("pg", "seq", "cause", "detail", "late_idle_before_ns", pl.col("t_late").alias("late_arrival_ns")),
                    on=["pg", "seq"], how="left")
    return out.select(
        pl.col("rank").alias("waiting_rank"),
        "late_rank",
        "wait_ns",
        pl.col("arrival_ns").alias("ts_ns"),
        pl.col("step_id").alias("step"),
        (pl.col("coll_name") + pl.lit(" ") + pl.col("pg") + pl.lit(" #") + pl.col("seq").cast(pl.String)).alias("collective"),
        "pg", "seq", "coll_name", "cause", "detail", "late_idle_before_ns", "late_arrival_ns",
    ).cast(_STALL_SCHEMA).sort(["ts_ns", "waiting_rank"])


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
            pl.col("detail").drop_nulls().mode().first().alias("top_detail"),
        )
        .sort("lost_ns", descending=True)
    )


def lost_by_rank(stalls: pl.DataFrame) -> pl.DataFrame:
    """Total time lost waiting, per waiting rank: ``rank, lost_ns, stalls``."""
    return (
        stalls.group_by("waiting_rank")
        .agg(pl.col("wait_ns").sum().alias("lost_ns"), pl.len().alias("stalls"))
        .rename({"waiting_rank": "rank"})
        .sort("rank")
    )
