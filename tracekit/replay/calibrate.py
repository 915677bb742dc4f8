"""The CPU-gap calibration (replay_model.md §5): one scale on the host's program-order gaps, fitted so the baseline
replay reproduces the program's unprofiled step time (:func:`tracekit.analysis.unprofiled.matched_timing`)."""

from __future__ import annotations

from typing import Callable

from tracekit.analysis.unprofiled import (
    MATCH_K,
    MATCH_RADIUS,
    UnprofiledTiming,
    job_step_series,
    matched_timing,
    unprofiled_timing,
)

__all__ = ["UnprofiledTiming", "unprofiled_timing", "matched_timing", "job_step_series", "fit_gap_scale",
           "MATCH_K", "MATCH_RADIUS"]


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
