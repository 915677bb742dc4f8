"""Acceptance (replay_model.md §9) on the real 2 x H200 captures in tests/fixtures/gpu (CPU only, ~10 s).

Error bars are asserted at the level achieved (docs/replay.md "Acceptance"); cases whose measured noise is above
2 % are xfailed with the cause the protocol names, after checking that the noise and cause are what we claim.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tracekit.replay.acceptance import NOISE_MAX, acceptance_rows
from tracekit.schema import read_trace

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "gpu"
NAMES = ("loop", "grouped", "grouped_p2p_off", "straggler", "graphs")

pytestmark = pytest.mark.skipif(not all((FIX / f"{n}.trace.parquet").exists() for n in NAMES),
                                reason="2xH200 fixtures not present")


@pytest.fixture(scope="module")
def rows():
    rs = acceptance_rows({n: read_trace(FIX / f"{n}.trace.parquet") for n in NAMES})
    return {r["what_if"]: r for r in rs}


def _row(rows, prefix):
    hits = [r for k, r in rows.items() if k.startswith(prefix)]
    assert len(hits) == 1, (prefix, list(rows))
    return hits[0]


@pytest.mark.parametrize("name", NAMES)
def test_self_replay_within_1pct(rows, name):
    r = rows[f"self-replay {name}"]
    assert abs(r["error"]) <= 0.01
    assert r["status"] == "pass"


@pytest.mark.parametrize("name", ["loop", "grouped", "grouped_p2p_off"])
def test_calibration_reaches_unprofiled_timing(rows, name):
    # launch-bound eager traces: one CPU-gap scale in (0, 1) reproduces the unprofiled step time
    r = rows[f"self-replay {name}"]
    assert 0.3 < r["scale"] < 0.9
    assert abs(r["calibrated_error"]) <= 0.005


def test_graph_trace_calibration_floor(rows):
    # graph replay is GPU-bound: even zero CPU gaps leave the profiled kernels (+3.5 %) above the unprofiled time
    r = rows["self-replay graphs"]
    assert r["scale"] == 0.0
    assert 0 < r["calibrated_error"] < 0.06


def test_eager_to_cuda_graph_knob(rows):
    r = _row(rows, "eager → CUDA graph: cuda-graph")
    assert r["noise"] is not None and r["noise"] <= NOISE_MAX
    assert abs(r["error"]) <= 0.03  # achieved +1.9 % (launch = 1.6 % of the eager host time, docs/replay.md)
    assert r["predicted_change"] < -0.3 and r["measured_change"] < -0.3  # a real 39 % speedup, predicted 40 %
    by = {s["tokens"]: s for s in r["by_shape"]}
    assert abs(by[32]["error"]) <= 0.08  # bucket 32: no padding, +6.8 %


def test_eager_to_cuda_graph_oracle(rows):
    r = _row(rows, "eager → CUDA graph: oracle+cuda-graph")
    assert r["noise"] <= NOISE_MAX
    assert abs(r["error"]) <= 0.03  # achieved +0.3 %


@pytest.mark.parametrize("prefix", ["NCCL default → host memory: communication", "NCCL default → host memory: oracle",
                                    "host memory → NCCL default: communication", "host memory → NCCL default: oracle"])
def test_nccl_p2p_vs_host_memory(rows, prefix):
    r = _row(rows, prefix)
    if "oracle" in prefix:
        # the target's own kernel durations move the step in the measured direction (+2.3 % / −4.6 % predicted,
        # +5.6 % / −5.3 % measured): the step's GPU part counts since issue 26
        assert r["predicted_change"] * r["measured_change"] > 0
    else:
        # the transfer change (9 → 49 µs per allreduce) is hidden behind the launch-bound host: ~no change predicted
        assert abs(r["predicted_change"]) < 0.02
    assert abs(r["error"]) < 0.06  # achieved 0.8-4.9 % (docs/replay.md)
    if abs(r["error"]) > 0.03:
        assert "host time" in r["cause"]  # the captures' host time per step differs by 5-6 %
    if abs(r["error"]) > 0.05:
        assert r["noise"] > NOISE_MAX
        pytest.xfail(f"outside 5 % ({r['error']:+.1%}) with noise {r['noise']:.1%} > 2 %: {r['cause']}")


@pytest.mark.parametrize("prefix", ["loop → grouped: moe_gemm", "loop → grouped: oracle",
                                    "grouped → loop: moe_gemm", "grouped → loop: oracle"])
def test_loop_vs_grouped_is_ill_posed(rows, prefix):
    r = _row(rows, prefix)
    assert r["noise"] > NOISE_MAX  # loop's matched unprofiled steps: 6.4 %
    assert "different kernels" in r["cause"]  # 459 vs 8 moe_gemm kernels per rank-step
    assert abs(r["predicted_change"]) < 0.02  # equal GEMM time: scaling predicts no change
    pytest.xfail(f"{r['error']:+.0%}: {r['cause']}")
