"""Unprofiled step timings, the noise floor, and the CPU-gap calibration (replay_model.md §5).

Unprofiled timings are ``kind="step"`` rows with ``profiled=False`` (written by
capture, ``src="tracekit.step"``), one per rank and step. The job's step time is
the max over ranks of the same step index (ranks of a TP group finish a step
together; the slowest rank is what a client sees).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import polars as pl

__all__ = ["UnprofiledTiming", "unprofiled_timing", "job_step_series", "fit_gap_scale"]


@dataclass(frozen=True)
class UnprofiledTiming:
    """Job-level unprofiled step times (ns) and their run-to-run spread."""

    step_ns: np.ndarray
    p50: float
    mean: float
    noise: float | None  # |median(first half) − median(second half)| / median; None with < 4 steps
    halves_ns: tuple[float, float] | None
    tokens_p50: float | None


def job_step_series(steps: pl.DataFrame, key: str = "step_ord", dur: str = "dur_ns") -> np.ndarray:
    """Per step index: max over ranks of the duration, in step order."""
    if steps.height == 0:
        return np.zeros(0)
    s = steps.group_by(key).agg(pl.col(dur).max()).sort(key)
    return s.get_column(dur).to_numpy().astype(float)


def unprofiled_timing(df: pl.DataFrame, meta: dict | None = None, mode: str | None = None) -> UnprofiledTiming | None:
    """The unprofiled step timings recorded at capture (only ``step_mode == mode`` when given), or None."""
    st = df.filter((pl.col("kind").cast(pl.String) == "step") & (pl.col("profiled") == False))  # noqa: E712
    if mode is not None:
        st = st.filter(pl.col("step_mode").cast(pl.String) == mode)
    if st.height == 0:
        return None
    if "src" in st.columns:
        own = st.filter(pl.col("src").cast(pl.String) == "tracekit.step")
        if own.height:
            st = own
    st = st.sort(["rank", "ts_ns"]).with_columns(pl.int_range(pl.len()).over("rank").alias("_i"))
    x = job_step_series(st, key="_i")
    if x.size == 0:
        return None
    tok = st.get_column("tokens").drop_nulls()
    noise = halves = None
    if x.size >= 4:
        h = x.size // 2
        a, b = float(np.median(x[:h])), float(np.median(x[h:]))
        halves = (a, b)
        noise = abs(a - b) / float(np.median(x))
    return UnprofiledTiming(x, float(np.median(x)), float(x.mean()), noise, halves,
                            float(tok.median()) if tok.len() else None)


def fit_gap_scale(p50_of_scale: Callable[[float], float], target_ns: float, *, hi: float = 1.5,
                  iters: int = 18) -> tuple[float, float]:
    """Bisection for the CPU-gap scale s in [0, hi] with replay p50(s) ≈ target (p50 is non-decreasing in s).

    Returns (scale, p50 at that scale). If even s=0 overshoots the target the
    scale is 0 (GPU-bound or kernel-profiling distortion); if s=hi undershoots it is hi.
    """
    lo_v = p50_of_scale(0.0)
    if lo_v >= target_ns:
        return 0.0, lo_v
    hi_v = p50_of_scale(hi)
    if hi_v <= target_ns:
        return hi, hi_v
    lo, h = 0.0, hi
    best = (hi, hi_v)
    for _ in range(iters):
        mid = (lo + h) / 2
        v = p50_of_scale(mid)
        if abs(v - target_ns) < abs(best[1] - target_ns):
            best = (mid, v)
        if v < target_ns:
            lo = mid
        else:
            h = mid
        if abs(v - target_ns) <= 1e-4 * target_ns:
            break
    return best
