"""Every efficiency figure is physically possible: no efficiency above 100 %, no bandwidth above the
device's HBM, no FLOP/s above its peak — over synthetic GEMM shapes (hypothesis) and the real GPU fixtures."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tracekit.analysis.passes.efficiency import gemm_flops_bytes, kernel_efficiency, moe_gemm_finish, moe_gemm_findings
from tracekit.schema import frame_from_rows

H200 = {"ranks": [{"rank": 0, "device_name": "NVIDIA H200"}]}
HBM, PEAK = 4800e9, 989e12
FIX = Path(__file__).resolve().parents[1] / "fixtures" / "gpu"
SET = settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])

dims = st.integers(1, 8192)
shape_st = st.one_of(
    st.tuples(st.just("aten::mm"), dims, dims, dims, st.just(0)),
    st.tuples(st.just("aten::_grouped_mm"), dims, dims, dims, st.integers(1, 512)),
    st.tuples(st.just("aten::bmm"), dims, dims, dims, st.integers(1, 64)),
)


def _dims(op: str, m: int, k: int, n: int, e: int) -> list:
    if op == "aten::mm":
        return [[m, k], [k, n]]
    if op == "aten::bmm":
        return [[e, m, k], [e, k, n]]
    return [[m, k], [e, k, n], [e]]


@SET
@given(st.lists(st.tuples(shape_st, st.integers(1, 10_000_000)), min_size=1, max_size=6))
def test_kernel_efficiency_never_impossible(items):
    rows, t = [], 1_000_000
    for (op, m, k, n, e), dur in items:
        rows.append(dict(rank=0, kind="cpu_op", ts_ns=t, dur_ns=100_000, name=op, tid=1,
                         input_dims=json.dumps(_dims(op, m, k, n, e)), input_types=json.dumps(["c10::BFloat16"] * 3)))
        rows.append(dict(rank=0, kind="kernel", ts_ns=t + 200_000, dur_ns=dur, name="nvjet_sm90_tst_64x8_64x16_2x1_v_bz_TNN",
                         category="moe_gemm" if "grouped" in op else "dense_gemm", launch_ts_ns=t + 10, launch_tid=1, stream=7))
        t += 20_000_000
    eff = kernel_efficiency(frame_from_rows(rows), H200)
    assert int(eff["count"].sum()) == len(items)
    assert (eff["efficiency"] <= 1.0 + 1e-12).all()
    assert (eff["gb_per_s"] <= HBM / 1e9 * (1 + 1e-9)).all()
    assert (eff["tflops_per_s"] <= PEAK / 1e12 * (1 + 1e-9)).all()
    # a figure that had to be capped is marked a bound; grouped GEMM bytes always are
    g = eff.filter(pl.col("op") == "aten::_grouped_mm")
    assert g["bound"].all()


def test_grouped_gemm_bytes_count_only_experts_that_can_have_tokens():
    # 64 token rows over 256 experts: at most 64 experts' weights are read, not 256
    f, b, _ = gemm_flops_bytes("aten::_grouped_mm", json.dumps([[64, 6144], [256, 6144, 2048], [256]]), '["c10::BFloat16"]')
    assert b == 2 * (64 * 6144 + 64 * 6144 * 2048 + 64 * 2048)


@SET
@given(st.lists(st.tuples(st.integers(1, 4096), st.integers(1, 50_000_000), st.integers(1, 3000)), min_size=1, max_size=8))
def test_moe_verdict_never_impossible(steps):
    meta = {"world_size": 2, "ranks": [{"rank": 0, "device_name": "NVIDIA H200"}],
            "capture": {"workload": {"model": {"hidden": 6144, "moe_intermediate": 2048, "n_experts": 256, "top_k": 8,
                                               "n_layers": 2, "dtype": "bfloat16"}}}}
    part = pl.DataFrame({"rank": [0] * len(steps), "step_id": list(range(len(steps))), "gpu_ns": [d for _, d, _ in steps],
                         "launches": [n for _, _, n in steps], "top_kernel": ["nvjet_sm90_tst_64x8_64x16"] * len(steps),
                         "tokens": [t for t, _, _ in steps], "rank_top_kernel": ["nvjet_sm90_tst_64x8_64x16"] * len(steps)})
    v = moe_gemm_finish([part], meta)
    r = v["ranks"][0]
    assert r["weight_gb_per_s_max"] <= 4800 + 1e-6 and r["roofline_pct_max"] <= 100 and r["pct_of_peak"] <= 100
    assert r["tflops_per_s"] <= 989 + 1e-6
    (w, s), = moe_gemm_findings(v)
    assert "TFLOP/s" in s and "%" in s


@pytest.mark.parametrize("name,loop", [("loop", True), ("grouped", False), ("graphs", False), ("grouped_p2p_off", False)])
def test_real_fixtures_moe_verdict(name, loop):
    p = FIX / f"{name}.trace.parquet"
    if not p.exists():
        pytest.skip("GPU fixtures absent")
    from tracekit.api import analyze

    res = analyze(p)
    for row in res["kernel_efficiency"]:
        assert row["efficiency"] is None or row["efficiency"] <= 1.0
        assert row["gb_per_s"] <= 4800
    v = res["moe_gemm"]
    assert v["status"] == "ok"
    for r in v["ranks"]:
        assert r["weight_gb_per_s_max"] <= 4800 and r["roofline_pct_max"] <= 100 and 0 < r["pct_of_peak"] <= 100
    moe = [f for f in res["findings"] if f.startswith("MoE GEMM runs at")]
    assert len(moe) == 1
    assert ("per-expert loop" in moe[0]) == loop
    if loop:
        assert "launches of 64x8 tiles" in moe[0]
