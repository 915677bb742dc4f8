"""The one step time: what ``analyze``, ``replay``, ``diff`` and next win call a step's time, and tokens/s.

Every view that prints a step time or tokens/s reads it from here (analyze: ``steps.step_time`` in the JSON,
:attr:`tracekit.analysis.passes.steps.StepStats.step_time`; replay: ``baseline.profiled_step_ns_p50`` and every
simulated step; diff: ``step_p50``; next win: its baseline). Definitions:

* **A step's time** (:func:`step_ns_expr`): the larger of its host range (the ``kind="step"`` row's ``dur_ns``: the
  step's start marker to its end marker) and its GPU part: from the step's start — or, when the GPU was still
  running earlier steps' work then, from when that work ended — to the end of its last GPU op
  (:func:`gpu_part_expr`). A host range that only launches work is shorter than the work; the GPU part counts the
  step's own lead-in (launch latency, a graph launch) but not a backlog of earlier work (a prefill still running
  when the decode steps are issued is the prefill's time, not theirs; a step with no earlier GPU work in the trace
  counts from its first op, since work from before the trace is invisible). Replay computes the same from its simulated marker and op times.
* **Which steps**: profiled steps with GPU work (``profiled`` not false, at least one GPU op). Unprofiled step
  records (the program's own clock, ``profiled=false``) are a different condition and never mix in.
* **A job step** (:func:`job_steps`): the n-th such step of every rank, in time order; its time is the max over
  ranks (the ranks of a TP group finish a step together; the slowest is what a client sees).
* **The primary shape** (:func:`primary_shape`): the mode with most job steps (ties: alphabetical, so DECODE before
  EXTEND/PREFILL), then its token count with most job steps (ties: more tokens). A serving batch grows, so steps
  are compared per shape; the headline is the primary shape's.
* **Step time** = the p50 (nearest rank, :func:`p50`) of the primary shape's job step times; **tokens/s** = the
  shape's tokens per step / that p50 (none when steps carry no token count).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

__all__ = ["StepTime", "gpu_part_expr", "job_steps", "p50", "prev_gpu_end", "primary_shape", "quantile", "step_ns_expr", "step_time",
           "step_time_of_job", "JOB_COLUMNS"]


def step_ns_expr(host_ns: pl.Expr, gpu_part_ns: pl.Expr) -> pl.Expr:
    """A step's time from its host range and its GPU part (:func:`gpu_part_expr`; null: no GPU op)."""
    return pl.max_horizontal(host_ns, gpu_part_ns.fill_null(0))


def gpu_part_expr(start_ns: pl.Expr, gpu_start_ns: pl.Expr, gpu_end_ns: pl.Expr, prev_gpu_end_ns: pl.Expr) -> pl.Expr:
    """The GPU part of a step: its last GPU op's end minus the later of its start and the end of the rank's GPU work
    that started before it (``prev_gpu_end_ns``: :func:`prev_gpu_end`). Without earlier GPU work in the trace (null)
    it counts from its first op's start: what ran on the GPU before the trace began is unknown, so no lead-in is
    charged to it. Null without GPU ops."""
    begin = pl.when(prev_gpu_end_ns.is_null()).then(gpu_start_ns).otherwise(pl.max_horizontal(start_ns, prev_gpu_end_ns))
    return gpu_end_ns - begin


def prev_gpu_end(steps: pl.DataFrame, ops: pl.DataFrame) -> pl.Series:
    """Per step row (``rank``, ``start``, ``gpu_end``: its own ops' last end, null without), the end of the rank's
    GPU work from before the step: the latest end over its earlier steps' ops (wherever they ran, a backlog included)
    and over ops not in any step that started before it. ``ops``: ``rank, start, end`` of the ops outside steps.
    Null when there is none. Returned in the order of ``steps``."""
    if steps.height == 0:
        return pl.Series("prev_gpu_end", [], dtype=pl.Int64)
    st = steps.select(pl.col("rank").cast(pl.Int64), pl.col("start").cast(pl.Int64),
                      pl.col("gpu_end").cast(pl.Int64)).with_row_index("_i").sort(["rank", "start"])
    st = st.with_columns(pl.col("gpu_end").shift(1).cum_max().over("rank").alias("_steps"))
    o = (ops.select(pl.col("rank").cast(pl.Int64), pl.col("start").cast(pl.Int64), pl.col("end").cast(pl.Int64))
         .sort(["rank", "start"]).with_columns(pl.col("end").cum_max().over("rank").alias("_other")))
    j = st.join_asof(o.select("rank", "start", "_other"), on="start", by="rank", strategy="backward",
                     allow_exact_matches=False, check_sortedness=False)
    return j.sort("_i").select(pl.max_horizontal("_steps", "_other").alias("prev_gpu_end")).to_series()


def quantile(x: np.ndarray | pl.Series | list[float], q: float) -> float:
    """The q-quantile by nearest rank (polars ``"nearest"``), the one used for step times; nan when empty."""
    s = x if isinstance(x, pl.Series) else pl.Series(np.asarray(x, dtype=np.float64))
    v = s.cast(pl.Float64).quantile(q, "nearest") if s.len() else None
    return float(v) if v is not None else float("nan")


def p50(x: np.ndarray | pl.Series | list[float]) -> float:
    """The step-time median: :func:`quantile` at 0.5."""
    return quantile(x, 0.5)


#: the step-table columns :func:`job_steps` reads (the others of a step table are never copied here) and the type
#: each optional one is read as (null where a table lacks it); ``rank``, ``start_ns``, ``step_ns`` are required
_OPTIONAL_JOB_COLUMNS = {"mode": pl.String, "tokens": pl.Int64, "step_id": pl.Int64, "batch_size": pl.Int64,
                         "dur_ns": pl.Int64, "gpu_span_ns": pl.Int64}
JOB_COLUMNS = ("rank", "start_ns", "step_ns", *_OPTIONAL_JOB_COLUMNS)


def job_steps(steps: pl.DataFrame) -> pl.DataFrame:
    """One row per job step: ``job`` (ordinal), ``mode``, ``tokens``, ``step_ns`` (max over ranks), ``start_ns``
    (min over ranks), ``ranks``, ``step_id`` (the program's own step number, the smallest over ranks; null without),
    ``batch_size``, ``dur_ns`` (host range) and ``gpu_span_ns`` (max over ranks; null where the rows lack them).

    ``steps``: one row per (rank, step) that counts (see module doc: the caller filters), with ``rank``,
    ``start_ns``, ``step_ns`` and, where known, ``mode`` and ``tokens``. The n-th row of each rank in ``start_ns``
    order is job step n."""
    if steps.height == 0:
        return pl.DataFrame(schema={"job": pl.Int64, "mode": pl.String, "tokens": pl.Int64, "step_ns": pl.Int64,
                                    "start_ns": pl.Int64, "ranks": pl.UInt32, "step_id": pl.Int64, "batch_size": pl.Int64,
                                    "dur_ns": pl.Int64, "gpu_span_ns": pl.Int64})

    def col(name: str, dtype: type[pl.DataType]) -> pl.Expr:
        return (pl.col(name).cast(dtype) if name in steps.columns else pl.lit(None, dtype)).alias(name)

    # only the columns read here: a step table of many ranks is not copied whole
    st = steps.select(*[col(c, _OPTIONAL_JOB_COLUMNS[c]) if c in _OPTIONAL_JOB_COLUMNS else c for c in JOB_COLUMNS]
                      ).sort(["rank", "start_ns"]).with_columns(pl.int_range(pl.len()).over("rank").cast(pl.Int64).alias("job"))
    return (st.group_by("job").agg(pl.col("mode").drop_nulls().first(), pl.col("tokens").max(),
                                   pl.col("step_ns").max(), pl.col("start_ns").min(), pl.col("rank").n_unique().alias("ranks"),
                                   pl.col("step_id").min(), pl.col("batch_size").max(), pl.col("dur_ns").max(),
                                   pl.col("gpu_span_ns").max())
            .sort("job"))


def primary_shape(job: pl.DataFrame) -> tuple[str | None, int | None]:
    """(mode, tokens) of the primary shape of a :func:`job_steps` table (module doc); (None, None) when empty."""
    if job.height == 0:
        return None, None
    modes = job.group_by("mode").len().sort(["len", "mode"], descending=[True, False], nulls_last=True)
    mode = modes.item(0, "mode")
    of_mode = job.filter(pl.col("mode").eq_missing(mode))
    toks = of_mode.group_by("tokens").len().sort(["len", "tokens"], descending=True, nulls_last=True)
    tokens = toks.item(0, "tokens")
    return mode, (int(tokens) if tokens is not None else None)


def of_shape(job: pl.DataFrame, mode: str | None, tokens: int | None) -> pl.DataFrame:
    """The job steps of one shape."""
    return job.filter(pl.col("mode").eq_missing(mode) & pl.col("tokens").eq_missing(tokens))


@dataclass(frozen=True)
class StepTime:
    """The headline step time of a trace (module doc): the primary shape's job steps."""

    mode: str | None
    tokens: int | None
    n_steps: int  # job steps of the primary shape
    p50_ns: float
    p90_ns: float
    tokens_per_s: float | None
    n_job_steps: int  # job steps of every shape

    def to_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "tokens": self.tokens, "n_steps": self.n_steps, "step_ns_p50": self.p50_ns,
                "step_ns_p90": self.p90_ns, "tokens_per_s": self.tokens_per_s, "n_job_steps": self.n_job_steps}


def step_time(steps: pl.DataFrame) -> StepTime | None:
    """The headline of the counted steps (``rank, start_ns, step_ns, mode, tokens``: see :func:`job_steps`)."""
    return step_time_of_job(job_steps(steps))


def step_time_of_job(job: pl.DataFrame) -> StepTime | None:
    """:func:`step_time` from the job steps themselves (:func:`job_steps` of the counted steps)."""
    if job.height == 0:
        return None
    mode, tokens = primary_shape(job)
    x = of_shape(job, mode, tokens).get_column("step_ns")
    med = p50(x)
    tps = tokens / med * 1e9 if tokens and med > 0 else None
    return StepTime(mode, tokens, int(x.len()), med, quantile(x, 0.9), tps, int(job.height))
