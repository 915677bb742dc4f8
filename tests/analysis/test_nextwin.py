"""Next win: the analysis' candidate changes, replayed and ranked (tracekit/analysis/nextwin.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracekit.analysis.nextwin import candidates, next_win_finding

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "gpu"


def test_candidates_follow_the_verdicts():
    res = {"moe_gemm": {"status": "ok", "ranks": [{"gpu_ns": 5, "roofline_pct_max": 20.0}]},
           "idle_causes_ns": {"0": {"host_sync": 1000}}, "collectives": {"stall_summary": []},
           "interconnect": [{"coll_name": "allreduce", "path": "host memory", "model_bus_bw_bytes_per_s": {"NVLink": 5e10},
                             "fusion_saving_ns_per_step": 60_000, "calls_per_step": 5}]}
    meta = {"ranks": [{"rank": 0, "device_name": "NVIDIA H200"}], "capture": {"workload": {"serve": {"cuda_graphs": False}}}}
    specs, skipped = candidates(res, meta)
    assert [s for s, _ in specs] == ["moe_gemm=0.200", "no-host-sync", "cuda-graph", "allreduce=bw:450GB/s,lat:8us"]
    assert any(x["what"].startswith("allreduce fusion") for x in skipped)
    meta["capture"]["workload"]["serve"]["cuda_graphs"] = True
    res["moe_gemm"]["ranks"][0]["roofline_pct_max"] = 100.0
    specs, skipped = candidates(res, meta)
    assert "cuda-graph" not in [s for s, _ in specs] and not any(s.startswith("moe_gemm") for s, _ in specs)
    assert {x["what"] for x in skipped} >= {"CUDA graphs", "MoE GEMM at its roofline"}


def test_cpu_mode_says_why_not():
    s = next_win_finding({"status": "cpu_mode", "why": "replay models GPU streams", "rows": []})
    assert s and s.startswith("Next win: not replayed — replay models GPU streams")


@pytest.mark.parametrize("name", ["loop", "grouped_p2p_off"])
def test_fixtures_rank_replayed_gains(name):
    p = FIX / f"{name}.trace.parquet"
    if not p.exists():
        pytest.skip("GPU fixtures absent")
    from tracekit.api import analyze

    res = analyze(p)
    nw = res["next_win"]
    assert nw["status"] == "ok" and nw["rows"]
    ch = [r["change"] for r in nw["rows"]]
    assert ch == sorted(ch) and all(c < 0 for c in ch)  # ranked by predicted gain, gains only
    top = nw["rows"][0]
    assert top["step_ns_p50"] < nw["baseline"]["step_ns_p50"] and top["tokens_per_s"] > nw["baseline"]["tokens_per_s"]
    f = [x for x in res["findings"] if x.startswith("Next win")]
    assert len(f) == 1 and f"1. {top['what']}: step" in f[0] and "tokens/s" in f[0]
    if name == "loop":  # launch-bound per-expert loop: CUDA graphs first
        assert top["what"] == "CUDA graphs"
