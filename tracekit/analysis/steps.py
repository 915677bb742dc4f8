"""Per-step statistics: step time by mode and batch size, tokens/s, per-step breakdown.

Steps are ``kind="step"`` rows (SGLang ``step[...]``, tracekit ``tk.fwd[...]``,
``ProfilerStep#N``, unprofiled step records). GPU ops belong to a step by their
``step_id`` (set by the converter for ops launched inside the step range); when no
op carries one, by the launch time (or start) falling inside the step range on the
same rank. ``dur_ns`` is the CPU range; ``gpu_span_ns`` runs from the step's first
GPU op start to its last GPU op end. Per-category times are summed kernel
durations (not exclusive). Profiled steps with no GPU op are flagged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from tracekit._errors import Quality, QualityLog
from tracekit.analysis import intervals as iv
from tracekit.analysis.gaps import gpu_ops
from tracekit.schema import CATEGORIES

__all__ = ["StepStats", "step_stats"]


@dataclass
class StepStats:
    """``steps``: one row per (rank, step); ``summary``: by (mode, batch_size); ``quality`` flags."""

    steps: pl.DataFrame
    summary: pl.DataFrame
    quality: list[Quality] = field(default_factory=list)

    def to_json(self, max_steps: int = 200) -> dict:
        return {
            "count": self.steps.select(pl.struct("rank", "step_id").n_unique()).item() if self.steps.height else 0,
            "summary": self.summary.to_dicts(),
            "steps": self.steps.head(max_steps).to_dicts(),
            "without_gpu": int(self.steps.filter(pl.col("no_gpu"))["step_id"].n_unique()) if self.steps.height else 0,
            "quality": [q.to_json() for q in self.quality],
        }


def step_stats(df: pl.DataFrame, instances: pl.DataFrame | None = None) -> StepStats:
    """Step table and summary (module doc). ``instances`` adds ``comm_wait_ns`` per step."""
    q = QualityLog()
    st = df.filter(pl.col("kind").cast(pl.String) == "step").select(
        pl.col("rank").cast(pl.Int64), "step_id", pl.col("step_mode").cast(pl.String).alias("mode"), "batch_size", "tokens",
        pl.col("ts_ns").alias("start_ns"), "dur_ns", "profiled",
    )
    if st.height == 0:
        return StepStats(pl.DataFrame(), pl.DataFrame(), list(q))
    st = st.with_columns(pl.coalesce(pl.col("step_id"), pl.int_range(pl.len()).over("rank").cast(pl.Int64)).alias("step_id"))
    ops = gpu_ops(df)
    if ops.height and ops["step_id"].null_count() == ops.height:
        pts = ops.with_columns(pl.coalesce("launch_ts_ns", "start").alias("_t")).drop("step_id")
        ivs = st.select("rank", pl.col("start_ns").alias("start"), (pl.col("start_ns") + pl.col("dur_ns")).alias("end"), "step_id")
        ops = iv.covered_by(pts, ivs, by="rank", at="_t", payload=["step_id"])
        q.add("step_by_time", "GPU ops carry no step_id; assigned to steps by launch time", severity="info")
    ops = ops.filter(pl.col("step_id").is_not_null())
    cat = pl.col("category").cast(pl.String).fill_null("other_compute")
    per_cat = ops.group_by(["rank", "step_id"]).agg(
        [pl.col("dur_ns").filter(cat == c).sum().alias(f"{c}_ns") for c in CATEGORIES]
        + [pl.len().alias("gpu_ops"), pl.col("start").min().alias("_g0"), pl.col("end").max().alias("_g1")]
    )
    out = st.join(per_cat, on=["rank", "step_id"], how="left").with_columns(
        pl.col("gpu_ops").fill_null(0),
        (pl.col("_g1") - pl.col("_g0")).alias("gpu_span_ns"),
    ).drop(["_g0", "_g1"])
    if instances is not None and instances.height:
        w = instances.filter(pl.col("step_id").is_not_null()).group_by(["rank", "step_id"]).agg(pl.col("wait_ns").sum().alias("comm_wait_ns"))
        out = out.join(w, on=["rank", "step_id"], how="left").with_columns(pl.col("comm_wait_ns").fill_null(0))
    out = out.with_columns(((pl.col("gpu_ops") == 0) & pl.col("profiled").fill_null(True)).alias("no_gpu")).sort(["rank", "start_ns"])
    n_no = out.filter(pl.col("no_gpu")).height
    if n_no:
        q.add("steps_without_gpu", f"{n_no} profiled step(s) have no GPU op attributed (graph replay without attribution, "
              "or the profiler window cut them)", count=n_no)
    prof = out.filter(~pl.col("no_gpu"))
    summary = (
        prof.group_by(["mode", "batch_size"])
        .agg(
            pl.col("step_id").n_unique().alias("steps"),
            pl.col("dur_ns").quantile(0.5, "nearest").alias("p50_ns"),
            pl.col("dur_ns").quantile(0.9, "nearest").alias("p90_ns"),
            pl.col("dur_ns").max().alias("max_ns"),
            pl.col("gpu_span_ns").quantile(0.5, "nearest").alias("gpu_span_p50_ns"),
            (pl.col("tokens").sum() / (pl.col("dur_ns").sum() * 1e-9)).alias("tokens_per_s"),
        )
        .sort(["mode", "batch_size"], nulls_last=True)
    )
    return StepStats(out, summary, list(q))
