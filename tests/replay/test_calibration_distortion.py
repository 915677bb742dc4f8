"""The calibration past the CPU-gap floor, on a hand-built GPU-bound trace with known answers.

Each step: one ``cudaGraphLaunch`` (its kernels start 5 µs after it returns), 20 kernels of 50 µs back to back on one
stream, the step's range closing 2 µs after the launch returns, a ``cudaStreamSynchronize`` to 5 µs after the last
kernel, the next step 10 µs later. Profiled: the launch takes 80 µs and the kernels are 3 µs apart (CUPTI). On the
program's clock (unprofiled step records): the launch 20 µs (range 22 µs) and the kernels 1 µs apart, so its period is
20 + 5 + 1000 + 19 + 5 + 10 = 1059 µs.

Replay fits, in order: CPU gaps (at 0 the range is still the 80 µs call: floor; the 2 µs after it, a CPU gap, is
gone), the calls' own time (80 h = 22 µs: h = 0.275), the GPU's gaps between queued ops to the period (the CPU gaps,
the 10 µs between steps too, now 0: 22 + 5 + 1000 + 19·3·g + 5 = 1059 → g = 27/57). The calibrated step runs from
its start to its last kernel's end: 1059 − 5 = 1054 µs.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from tracekit.analysis.unprofiled import matched_period
from tracekit.replay import replay
from tracekit.replay.api import Replayer
from tracekit.replay.calibrate import with_gpu_gap_scale, with_host_call_scale
from tracekit.replay.graph import ET_FIFO, ET_LAUNCH, VK_CPU
from tracekit.replay.simulate import inputs_from_graph

from frames import TraceBuilder

N_K, K_US, GAP_PROF, CALL_PROF, LAM, TAIL, BETWEEN = 20, 50.0, 3.0, 80.0, 5.0, 5.0, 10.0
PERIOD_UNPROF = 20 + LAM + N_K * K_US + (N_K - 1) * 1 + TAIL + BETWEEN  # 1059 µs


def _trace(n_unprof: int = 40, n_prof: int = 10) -> pl.DataFrame:
    b = TraceBuilder()
    t = 0.0
    for i in range(n_unprof):  # the program's clock: ranges only
        b.step(0, t, 22.0, step_id=i + 1, profiled=False, src="tracekit.step")
        t += PERIOD_UNPROF
    t += 5000.0
    for j in range(n_prof):
        sid = n_unprof + 1 + j
        b.step(0, t, CALL_PROF + 2, step_id=sid)
        c = b.call(0, t, CALL_PROF, name="cudaGraphLaunch", step_id=sid)
        k = t + CALL_PROF + LAM
        for _ in range(N_K):
            b.op(0, k, K_US, c, category="dense_gemm", family="gemm", step_id=sid)
            k += K_US + GAP_PROF
        end = k - GAP_PROF
        b.sync(0, t + CALL_PROF + 2, end + TAIL - (t + CALL_PROF + 2), step_id=sid)
        t = end + TAIL + BETWEEN
    return b.frame()


def test_matched_period_is_the_program_clocks_start_to_start() -> None:
    df = _trace()
    assert matched_period(df, "DECODE", 8) == pytest.approx(PERIOD_UNPROF * 1000)
    assert matched_period(df, "DECODE", 16) is None  # no unprofiled step of that shape
    assert matched_period(_trace(n_unprof=4), "DECODE", 8) is None  # 3 consecutive pairs: too few


def test_scales_touch_only_what_they_name() -> None:
    rp = Replayer(_trace())
    g = rp.g
    base = inputs_from_graph(g, 0.0)
    gpu = with_gpu_gap_scale(g, base, 0.0)
    fifo = (g.etype == ET_FIFO) & (base.efix > 0)
    assert fifo.any() and (gpu.efix[fifo] == 0).all()
    assert (gpu.efix[~fifo] == base.efix[~fifo]).all() and (gpu.vdur == base.vdur).all()
    host = with_host_call_scale(g, base, 0.25)
    cpu = g.vkind == VK_CPU
    assert np.array_equal(host.vdur[cpu], np.rint(base.vdur[cpu] * 0.25).astype(np.int64))
    assert (host.vdur[~cpu] == base.vdur[~cpu]).all()
    launch = (g.etype == ET_LAUNCH) & cpu[g.esrc]
    graph_first = launch & (base.efix == (CALL_PROF + LAM) * 1000)  # the first kernel: 80 µs in the call + 5 µs after
    assert graph_first.any() and (host.efix[graph_first] == (CALL_PROF * 0.25 + LAM) * 1000).all()


def test_gpu_bound_replay_fits_the_calls_then_the_gpu_gaps() -> None:
    r = replay(_trace(), None, ["dense_gemm=0.5"])
    b = r.baseline
    assert r.calibrated and r.calibration_scale == 0.0  # CPU gaps alone cannot reach the 22 µs range
    assert b.host_call_scale == pytest.approx(22 / 80, abs=0.005)
    assert b.gpu_gap_scale == pytest.approx(27 / 57, abs=0.01)
    # the calibrated step: start to its last kernel's end, the period less the sync's 5 µs tail
    assert b.step_ns_p50 == pytest.approx((PERIOD_UNPROF - TAIL) * 1000, rel=0.002)
    codes = {q.code for q in r.quality}
    assert {"replay_host_call_calibration", "replay_gpu_gap_calibration"} <= codes
    # halving the kernels saves their time, not the calibrated gaps
    assert r.what_if[0].step_ns_p50 == pytest.approx(b.step_ns_p50 - N_K * K_US / 2 * 1000, rel=0.01)


def test_host_bound_trace_keeps_the_gap_calibration_alone() -> None:
    from test_replay_golden import calibration_trace  # a host-bound trace with unprofiled steps

    r = replay(calibration_trace().frame(), what_ifs=[])
    assert r.baseline.host_call_scale is None and r.baseline.gpu_gap_scale is None
