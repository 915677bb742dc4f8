"""The one findings ranker (tracekit/analysis/findings.py): gating, headline, wording, once."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tracekit.analysis.findings import Finding, is_collective_name, rank_findings, stall_candidates

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _stall(lost_ms: float, count: int, late: int = 1) -> Finding:
    return Finding("stall", f"Rank(s) 0 lost {lost_ms} ms in {count} collective wait(s) for rank {late}: x.", lost_ms * 1e6,
                   subject=f"{late}:x", cross_rank=True, per_event_ns=lost_ms * 1e6 / count)


def test_waits_below_the_clock_residual_are_withheld_and_the_residual_comes_first():
    resid = Finding("clock_residual", "Clock alignment residual is 11039 µs: cross-rank waits below that are not reliable.", 11_039_000)
    cands = [_stall(7.0, 1), _stall(7.2, 1, late=2), _stall(100.0, 4, late=3), resid]
    out = rank_findings(cands, residual_ns=11_039_000)
    assert out[0].startswith("Clock alignment residual is 11039 µs") and "2 cross-rank wait finding(s)" in out[0]
    assert not any("7.0 ms" in s or "7.2 ms" in s for s in out)  # no stall finding the residual contradicts
    assert any(s.startswith("Tentative") and "100.0 ms" in s for s in out)  # 25 ms waits: within 3x of the residual
    # a small residual gates nothing
    out = rank_findings(cands[:3], residual_ns=10_000)
    assert len(out) == 3 and out[0].startswith("Rank(s) 0 lost 100.0 ms")


def test_identical_findings_are_stated_once():
    f = Finding("power", "rank 0: GPU 52% busy.", 1.0)
    assert rank_findings([f, f, Finding("power", "rank 0: GPU 52% busy.", 2.0)]) == ["rank 0: GPU 52% busy."]


def test_a_collective_is_never_a_ranks_own_kernels():
    assert is_collective_name("gloo:all_gather") and is_collective_name("ncclDevKernel_AllReduce_Sum_bf16_RING_LL")
    assert not is_collective_name("aten::_grouped_mm") and not is_collective_name("nvjet_sm90_tst_128x216")
    out = {"collectives": {"stall_summary": [
        {"late_rank": 2, "cause": "preceding_kernels", "count": 3, "lost_ns": 9_000_000, "waiting_ranks": [0, 1], "top_detail": "gloo:all_gather"},
        {"late_rank": 3, "cause": "preceding_kernels", "count": 3, "lost_ns": 8_000_000, "waiting_ranks": [0], "top_detail": "aten::_grouped_mm"},
    ], "groups": [], "per_rank": [], "instances": 3}}

    c = stall_candidates(out["collectives"], True)
    texts = [f.text for f in c]
    assert "for rank 2: it was still in an earlier collective (gloo:all_gather)." in texts[0]
    assert "own kernels" not in texts[0] and "its own kernels ran longer (aten::_grouped_mm)" in texts[1]


def test_cpu_oversubscription_is_the_headline(tmp_path):
    from cpu_mode._cpu_doc import write_cpu_docs

    from tracekit.api import analyze_frame
    from tracekit.ingest.convert import convert
    from tracekit.schema import read_trace

    paths = write_cpu_docs(tmp_path / "raw", n_steps=3, delays={1: {1: 500}})
    convert(paths, tmp_path / "t.parquet")
    df, meta = read_trace(tmp_path / "t.parquet")
    assert not any(f.startswith("CPU oversubscribed") for f in analyze_frame(df, meta)["findings"])  # cores unknown: no claim
    meta["capture"] = {"host": {"cpus": 1}}
    res = analyze_frame(df, meta)
    assert res["findings"][0].startswith("CPU oversubscribed: 2 ranks share 1 CPU core(s)")
    meta["capture"] = {"host": {"cpus": 4}}
    assert not any(f.startswith("CPU oversubscribed") for f in analyze_frame(df, meta)["findings"])


def test_quality_flags_once():
    from tracekit.analysis.stage.pipeline import _once

    a = {"code": "clock_residual_high", "message": "m", "severity": "warning"}
    b = dict(a, details={"residual_ns": 1})
    assert _once([a, {"code": "x", "message": "y"}, b]) == [b, {"code": "x", "message": "y"}]


@pytest.mark.parametrize("name", ["loop", "grouped", "grouped_p2p_off", "straggler"])
def test_real_gpu_fixtures_findings_consistent(name):
    p = Path(__file__).resolve().parents[1] / "fixtures" / "gpu" / f"{name}.trace.parquet"
    if not p.exists():
        pytest.skip("GPU fixtures absent")
    from tracekit.api import analyze

    res = analyze(p)
    f = res["findings"]
    assert len(f) == len(set(f)) and f
    codes = [(q["code"], q.get("rank"), q["message"]) for q in res["quality"]]
    assert len(codes) == len(set(codes))
