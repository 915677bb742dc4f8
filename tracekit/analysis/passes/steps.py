"""Per-step statistics: step time by mode and batch size, tokens/s, per-step breakdown.

Steps are ``kind="step"`` rows (SGLang ``step[...]``, tracekit ``tk.fwd[...]``,
``ProfilerStep#N``, unprofiled step records). GPU ops belong to a step by their
``step_id`` (set by the converter for ops launched inside the step range); when no
op carries one, by the launch time (or start) falling inside the step range on the
same rank. ``dur_ns`` is the CPU range; ``gpu_span_ns`` runs from the step's first
GPU op start to its last GPU op end; ``step_ns`` is the larger of the host range and the step's GPU part
(:func:`tracekit.analysis.steptime.step_ns_expr`, the one definition: the GPU part runs from the step's start, or
the end of the rank's earlier GPU work if later, to its last op's end). Per-category times are summed kernel
durations (not exclusive). Profiled steps with no GPU op are flagged.

**The trace's step time** is :attr:`StepStats.step_time` (JSON ``steps.step_time``): the p50 of the primary
shape's job steps and its tokens/s (:mod:`tracekit.analysis.steptime`). Every view that prints *the* step time or
tokens/s (the steps finding, next win, replay's baseline, diff) reads that one value. ``summary`` breaks the same
job steps (the steps that count, the max over ranks of each) down by (mode, batch size), with the same definitions:
``steps`` (job steps), ``p50_ns``/``p90_ns``/``max_ns`` of the host range, ``gpu_span_p50_ns``,
``step_p50_ns``/``step_p90_ns`` of ``step_ns`` and ``tokens_per_s`` = the median tokens per step / ``step_p50_ns``
(so the primary shape's row repeats ``step_time``); unprofiled step records (``profiled=false``: the program's own
clock) are left out of it and summarized in ``unprofiled``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from tracekit._errors import Quality, QualityLog
from tracekit.core import intervals as iv
from tracekit.analysis.findings import step_candidates
from tracekit.analysis.passes.gaps import gpu_ops
from tracekit.analysis.registry import Analysis, FinishContext, Finished, register
from tracekit.analysis.steptime import JOB_COLUMNS, StepTime, gpu_part_expr, job_steps, prev_gpu_end, step_ns_expr, step_time_of_job
from tracekit.analysis.unprofiled import matched_timing
from tracekit.schema import CATEGORIES

__all__ = ["StepPart", "StepStats", "comm_wait_by_step", "step_finish", "step_part", "step_stats"]


@dataclass
class StepStats:
    """``steps``: one row per (rank, step); ``summary``: profiled steps by (mode, batch_size); ``step_time``: the
    trace's step time (module doc); ``unprofiled``: the program clock's step records of the same shape; ``quality``."""

    steps: pl.DataFrame
    summary: pl.DataFrame
    quality: list[Quality] = field(default_factory=list)
    step_time: StepTime | None = None
    unprofiled: dict[str, Any] | None = None
    #: distinct (rank, step_id) pairs (computed per part by :func:`step_finish`: one hash table of all ranks' steps
    #: costs ~30-50 MB at 512 ranks); None: counted here
    count: int | None = None

    def to_json(self, max_steps: int = 200) -> dict[str, Any]:
        return {
            "count": self.count if self.count is not None else _pairs(self.steps),
            "step_time": self.step_time.to_json() if self.step_time is not None else None,
            "unprofiled": self.unprofiled,
            "summary": self.summary.to_dicts(),
            "steps": self.steps.head(max_steps).to_dicts(),
            "without_gpu": int(self.steps.lazy().filter(pl.col("no_gpu")).select(pl.col("step_id").n_unique()).collect().item())
            if self.steps.height else 0,
            "quality": [q.to_json() for q in self.quality],
        }


def _pairs(steps: pl.DataFrame) -> int:
    """Distinct (rank, step_id) pairs of a step table."""
    return int(steps.lazy().select("rank", "step_id").unique().select(pl.len()).collect().item()) if steps.height else 0


def comm_wait_by_step(instances: pl.DataFrame | None) -> pl.DataFrame | None:
    """``rank, step_id, comm_wait_ns`` from matched instances; None without instances (no such column then)."""
    if instances is None or instances.height == 0:
        return None
    return instances.filter(pl.col("step_id").is_not_null()).group_by(["rank", "step_id"]).agg(pl.col("wait_ns").sum().alias("comm_wait_ns"))


@dataclass
class StepPart:
    """One rank's (or a whole frame's) step rows. ``by_time`` is set when none of its GPU ops carries a
    ``step_id``: the rows with ops assigned by launch time, used when no rank's ops carry one."""

    by_id: pl.DataFrame
    by_time: pl.DataFrame | None
    ops: int
    ops_with_step: int


def _step_table(st: pl.DataFrame, ops: pl.DataFrame, comm_wait: pl.DataFrame | None) -> pl.DataFrame:
    # per-category durations as columns first (categorical comparisons, no per-row strings), then one group-by;
    # ops without a category count as other_compute
    cat = pl.col("category")
    is_c = {c: (cat == c) | cat.is_null() if c == "other_compute" else (cat == c) for c in CATEGORIES}
    lops = ops.lazy().filter(pl.col("step_id").is_not_null()).select(
        "rank", "step_id", "start", "end",
        *[pl.when(is_c[c].fill_null(False)).then(pl.col("dur_ns")).otherwise(0).alias(f"{c}_ns") for c in CATEGORIES],
    )
    per_cat = lops.group_by(["rank", "step_id"]).agg(
        [pl.col(f"{c}_ns").sum() for c in CATEGORIES]
        + [pl.len().alias("gpu_ops"), pl.col("start").min().alias("_g0"), pl.col("end").max().alias("_g1")]
    ).collect()
    out = st.join(per_cat, on=["rank", "step_id"], how="left").with_columns(
        pl.col("gpu_ops").fill_null(0),
        (pl.col("_g1") - pl.col("_g0")).alias("gpu_span_ns"),
    )
    outside = ops.filter(pl.col("step_id").is_null()).select("rank", "start", "end")
    out = out.with_columns(prev_gpu_end(out.select("rank", pl.col("start_ns").alias("start"), pl.col("_g1").alias("gpu_end")),
                                        outside).alias("_prev")).with_columns(
        # the step's time: the host range, or its GPU part when the GPU runs past it (tracekit.analysis.steptime)
        step_ns_expr(pl.col("dur_ns"), gpu_part_expr(pl.col("start_ns"), pl.col("_g0"), pl.col("_g1"), pl.col("_prev"))).alias("step_ns"),
    ).drop(["_g0", "_g1", "_prev"])
    if comm_wait is not None:
        out = out.join(comm_wait, on=["rank", "step_id"], how="left").with_columns(pl.col("comm_wait_ns").fill_null(0))
    return out.with_columns(((pl.col("gpu_ops") == 0) & pl.col("profiled").fill_null(True)).alias("no_gpu")).sort(
        ["rank", "start_ns"], maintain_order=True)


def step_part(df: pl.DataFrame, comm_wait: pl.DataFrame | None = None) -> StepPart | None:
    """Per-rank half of :func:`step_stats` (``comm_wait`` from :func:`comm_wait_by_step`); None without step rows."""
    st = df.filter(pl.col("kind") == "step").select(
        pl.col("rank").cast(pl.Int64), "step_id", pl.col("step_mode").cast(pl.String).alias("mode"), "batch_size", "tokens",
        pl.col("ts_ns").alias("start_ns"), "dur_ns", "profiled",
    )
    ops = gpu_ops(df, ["step_id", "category", "launch_ts_ns"])
    n_ops, n_with = ops.height, ops.height - ops["step_id"].null_count()
    if st.height == 0:
        return StepPart(pl.DataFrame(), None, n_ops, n_with)
    st = st.with_columns(pl.coalesce(pl.col("step_id"), pl.int_range(pl.len()).over("rank").cast(pl.Int64)).alias("step_id"))
    by_time = None
    if n_ops and n_with == 0:
        pts = ops.with_columns(pl.coalesce("launch_ts_ns", "start").alias("_t")).drop("step_id")
        ivs = st.select("rank", pl.col("start_ns").alias("start"), (pl.col("start_ns") + pl.col("dur_ns")).alias("end"), "step_id")
        by_time = _step_table(st, iv.covered_by(pts, ivs, by="rank", at="_t", payload=["step_id"]), comm_wait)
    return StepPart(_step_table(st, ops, comm_wait), by_time, n_ops, n_with)


def step_fold(parts: list[StepPart | None]) -> StepPart | None:
    """The parts of consecutive ranks as one (the registry's ``fold``): :func:`step_finish` of the folded part
    equals that of the parts (rows in the same order, the same choice between ``by_id`` and ``by_time``)."""
    got = [p for p in parts if p is not None]
    if not got:
        return None
    rows = [p for p in got if p.by_id.height]
    by_id = pl.concat([p.by_id for p in rows], how="vertical_relaxed") if rows else pl.DataFrame()
    by_time = None
    if any(p.by_time is not None for p in rows):  # what step_finish takes per part when no op carries a step_id
        by_time = pl.concat([p.by_time if p.by_time is not None else p.by_id for p in rows], how="vertical_relaxed")
    return StepPart(by_id, by_time, sum(p.ops for p in got), sum(p.ops_with_step for p in got))


def step_finish(parts: list[StepPart]) -> StepStats:
    """All parts → :class:`StepStats` (summary percentiles over every rank's steps, exact)."""
    q = QualityLog()
    ops = sum(p.ops for p in parts)
    by_time = ops > 0 and sum(p.ops_with_step for p in parts) == 0
    tables = [(p.by_time if by_time and p.by_time is not None else p.by_id) for p in parts if p.by_id.height]
    if not tables:
        return StepStats(pl.DataFrame(), pl.DataFrame(), list(q))
    if by_time:
        q.add("step_by_time", "GPU ops carry no step_id; assigned to steps by launch time", severity="info")
    out = pl.concat(tables, how="vertical_relaxed")
    if not _rank_time_ordered(out):  # parts come in rank order, each sorted: no copy of an ordered table
        out = out.sort(["rank", "start_ns"], maintain_order=True)
    n_no = int(out.get_column("no_gpu").sum())
    if n_no:
        q.add("steps_without_gpu", f"{n_no} profiled step(s) have no GPU op attributed (graph replay without attribution, "
              "or the profiler window cut them)", count=n_no)
    # the columns the job steps read (narrow first: the step table of many ranks is not copied whole)
    job = job_steps(counted_steps(out.select([c for c in _JOB_COLUMNS if c in out.columns])))
    st = step_time_of_job(job)
    # the parts hold disjoint ranks (one rank each, or one whole frame)
    return StepStats(out, _summary(job), list(q), st, _unprofiled(out, st, job), sum(_pairs(t) for t in tables))


#: the step-table columns :func:`counted_steps` and :func:`~tracekit.analysis.steptime.job_steps` read
_JOB_COLUMNS = (*JOB_COLUMNS, "profiled", "gpu_ops")


def _rank_time_ordered(df: pl.DataFrame) -> bool:
    """Whether ``df`` is already ordered by ``rank``, then ``start_ns`` (nulls first, as the sort puts them)."""
    if df.height < 2:
        return True
    r, t = pl.col("rank"), pl.col("start_ns")
    dr, dt = r.diff().slice(1), t.diff().slice(1)
    ok = df.select(
        r.null_count().eq(0) & t.null_count().eq(0) & ((dr > 0) | ((dr == 0) & (dt >= 0))).all()
    ).item()
    return bool(ok)


def _summary(job: pl.DataFrame) -> pl.DataFrame:
    """The job steps by (mode, batch size): the module doc's ``summary`` (the definitions of ``step_time``)."""
    if job.height == 0:
        return pl.DataFrame()
    return (
        job.group_by(["mode", "batch_size"])
        .agg(
            pl.len().cast(pl.UInt32).alias("steps"),
            pl.col("dur_ns").quantile(0.5, "nearest").alias("p50_ns"),
            pl.col("dur_ns").quantile(0.9, "nearest").alias("p90_ns"),
            pl.col("dur_ns").max().alias("max_ns"),
            pl.col("gpu_span_ns").quantile(0.5, "nearest").alias("gpu_span_p50_ns"),
            pl.col("step_ns").quantile(0.5, "nearest").alias("step_p50_ns"),
            pl.col("step_ns").quantile(0.9, "nearest").alias("step_p90_ns"),
            # tokens per step / the step time (as step_time); null (not 0) when no step carries a token count
            (pl.col("tokens").quantile(0.5, "nearest") / (pl.col("step_ns").quantile(0.5, "nearest") * 1e-9))
            .alias("tokens_per_s"),
        )
        .sort(["mode", "batch_size"], nulls_last=True)
    )


def counted_steps(steps: pl.DataFrame) -> pl.DataFrame:
    """The rows that count for the step time (:mod:`tracekit.analysis.steptime`): profiled steps with GPU work; on
    a trace without any GPU op (CPU mode), every profiled step."""
    prof = pl.col("profiled").fill_null(True)
    if steps.get_column("gpu_ops").sum() > 0:
        return steps.filter(prof & (pl.col("gpu_ops") > 0))
    return steps.filter(prof)


def _unprofiled(steps: pl.DataFrame, st: StepTime | None, job: pl.DataFrame) -> dict[str, Any] | None:
    """The program clock's unprofiled step time of the primary shape (:func:`tracekit.analysis.unprofiled.matched_timing`,
    the number replay calibrates to): p50, noise, count, tokens/s; None without unprofiled records of that mode."""
    if st is None or not steps.select(pl.col("profiled").eq(False).any()).item():
        return None
    frame = steps.select(pl.lit("step").alias("kind"), "rank", pl.col("start_ns").alias("ts_ns"), "dur_ns",
                         pl.col("mode").alias("step_mode"), "tokens", "profiled", "step_id")
    t = matched_timing(frame, job.filter(pl.col("mode").eq_missing(st.mode)).select("mode", "tokens"))
    if t is None:
        return None
    return {"mode": st.mode, "tokens": st.tokens, "n_steps": int(t.step_ns.size), "step_ns_p50": t.p50,
            "noise": t.noise, "tokens_per_s": st.tokens / t.p50 * 1e9 if st.tokens and t.p50 else None}


def step_stats(df: pl.DataFrame, instances: pl.DataFrame | None = None) -> StepStats:
    """Step table and summary (module doc). ``instances`` adds ``comm_wait_ns`` per step.

    :func:`step_part` (per rank) → :func:`step_finish`; here both on the whole frame.
    """
    part = step_part(df, comm_wait_by_step(instances))
    return step_finish([part] if part is not None else [])


# --- the ``steps`` analysis (tracekit.analysis.registry) ------------------------------------------------------------

def _finish(parts: list[StepPart | None], ctx: FinishContext) -> Finished:
    st = step_finish([p for p in parts if p is not None])
    ctx.quality.extend(st.quality)
    ctx.tables["steps"] = st.steps
    return Finished({"steps": st.to_json(max_steps=ctx.plan.max_items)}, st)


ANALYSIS = register(Analysis(
    "steps", ("steps",),
    ("rank", "kind", "ts_ns", "dur_ns", "category", "launch_ts_ns", "step_id", "step_mode", "batch_size", "tokens", "profiled"),
    lambda df, ctx: step_part(df, ctx.plan.comm_wait), _finish,
    lambda ctx: step_candidates(ctx.result.value.summary, ctx.result.value.steps, ctx.result.value.step_time), order=50,
    fold=step_fold))
