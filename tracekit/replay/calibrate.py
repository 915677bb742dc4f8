"""The calibration (replay_model.md §5): one scale on the host's program-order gaps, fitted so the baseline replay
reproduces the program's unprofiled step time (:func:`tracekit.analysis.unprofiled.matched_timing`); and, where a
step is GPU-bound, one scale on the GPU's gaps between queued ops, fitted to the program's unprofiled step period
(:func:`tracekit.analysis.unprofiled.matched_period`): under the profiler, CUPTI widens the gap before every kernel
(seen on one H100: ~1.2 µs per kernel of a CUDA-graph replay). Where even zero CPU gaps leave the replayed host range
above the unprofiled one, the calls' own time is what the profiler inflated: a scale on it is fitted next
(:func:`with_host_call_scale`)."""

from __future__ import annotations

from typing import Callable

import numpy as np

from tracekit.analysis.unprofiled import (
    MATCH_K,
    MATCH_RADIUS,
    UnprofiledTiming,
    job_step_series,
    matched_period,
    matched_timing,
    unprofiled_timing,
)
from tracekit.replay.graph import ET_FIFO, ET_LAUNCH, VK_CPU, ReplayGraph
from tracekit.replay.simulate import SimInputs

__all__ = ["UnprofiledTiming", "unprofiled_timing", "matched_timing", "matched_period", "job_step_series",
           "fit_gap_scale", "with_gpu_gap_scale", "with_host_call_scale", "MATCH_K", "MATCH_RADIUS"]


def with_host_call_scale(g: ReplayGraph, inp: SimInputs, scale: float) -> SimInputs:
    """A copy of ``inp`` with the launching thread's calls' own time multiplied by ``scale``: each CPU call's
    duration, and the part of each launch edge that is the launch point's offset inside its call (a
    ``cudaGraphLaunch`` of a few hundred nodes holds its kernels until it returns: ~1 ms under the profiler, a
    third of that without it, seen on one H100). The launch latency after that point is kept."""
    out = inp.copy()
    cpu = g.vkind == VK_CPU
    out.vdur[cpu] = np.rint(inp.vdur[cpu] * scale).astype(np.int64)
    launch = (g.etype == ET_LAUNCH) & cpu[g.esrc]
    off = np.minimum(np.maximum(inp.efix[launch], 0), inp.vdur[g.esrc[launch]])
    out.efix[launch] = inp.efix[launch] - off + np.rint(off * scale).astype(np.int64)
    return out


def with_gpu_gap_scale(g: ReplayGraph, inp: SimInputs, scale: float) -> SimInputs:
    """A copy of ``inp`` with the positive stream-FIFO gaps (previous op end → next op start on one stream: the GPU's
    own gap between queued ops, CUPTI's overhead included) multiplied by ``scale``."""
    out = inp.copy()
    fifo = (g.etype == ET_FIFO) & (out.efix > 0)
    out.efix[fifo] = np.rint(out.efix[fifo] * scale).astype(np.int64)
    return out


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
