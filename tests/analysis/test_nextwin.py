"""Next win: the analysis' candidate changes, replayed and ranked (tracekit/advice/nextwin.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracekit.advice.nextwin import candidates, next_win_finding, structural_changes
from tracekit.replay.structural import Structure

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "gpu"


def test_candidates_follow_the_verdicts():
    res = {"moe_gemm": {"status": "ok", "ranks": [{"gpu_ns": 5, "roofline_pct_max": 20.0}]},
           "idle_causes_ns": {"0": {"host_sync": 1000}}, "collectives": {"stall_summary": []},
           "interconnect": [{"coll_name": "allreduce", "path": "host memory", "model_bus_bw_bytes_per_s": {"NVLink": 5e10},
                             "fusion_saving_ns_per_step": 60_000, "calls_per_step": 5}]}
    meta = {"ranks": [{"rank": 0, "device_name": "NVIDIA H200"}], "capture": {"workload": {"serve": {"cuda_graphs": False}}}}
    specs, skipped = candidates(res, meta)
    assert [s for s, _ in specs] == ["moe_gemm=0.200", "allreduce=bw:450GB/s,lat:8us"]
    assert any(x["what"].startswith("allreduce fusion") for x in skipped)
    res["moe_gemm"]["ranks"][0]["roofline_pct_max"] = 100.0
    specs, skipped = candidates(res, meta)
    assert not any(s.startswith("moe_gemm") for s, _ in specs)
    assert "MoE GEMM at its roofline" in {x["what"] for x in skipped}


def test_structural_changes_state_what_they_need():
    # a host-synced per-expert loop: grouped experts; its syncs go with it; graphs need the loop grouped first
    ch, skipped = structural_changes(Structure(loop_blocks=4, loop_syncs=480, other_syncs=0, graph_launches=0), None)
    assert [(c.spec, c.needs) for c in ch] == [("grouped-experts", ()), ("grouped-experts+cuda-graph", ("grouped experts",))]
    assert any(x["what"] == "host syncs removed" and "per-expert loop" in x["why"] for x in skipped)
    # syncs outside any loop: removable; graphs need them gone
    ch, _ = structural_changes(Structure(0, 0, 12, 0), None)
    assert [(c.spec, c.needs) for c in ch] == [("no-host-sync", ()), ("no-host-sync+cuda-graph", ("host syncs removed",))]
    # a graph capture: no graph what-if
    ch, skipped = structural_changes(Structure(0, 0, 0, 400), None)
    assert ch == [] and any(x["what"] == "CUDA graphs" for x in skipped)


def test_cpu_mode_says_why_not_in_its_section_not_as_a_finding():
    """CPU mode (issue 30 item 12): no finding (it took a top-3 place above what the trace shows); the report's
    next-win section says why nothing was replayed."""
    import io

    from tracekit.analysis.sections import Sections, build
    from tracekit.report.terminal import render_analysis

    nw = {"status": "cpu_mode", "why": "replay models GPU streams", "rows": [], "skipped": []}
    assert next_win_finding(nw) is None
    tree = build({"schema_version": 1, "trace_schema_version": None, "world_size": None, "device_mode": "cpu",
                  "window": {"start_ns": None, "end_ns": None, "reason": "extent", "trimmed_transient_ns": 0,
                             "skipped_steps": 0},
                  "buckets": [], "ranks": [], "overall": {"window_ns": 0, "gpu_busy_ns": 0, "time_ns": {}},
                  "top_kernels": {}, "uncategorized_top": [], "findings": ["Communication dominates"], "next_win": nw,
                  "quality": []}, Sections)
    buf = io.StringIO()
    render_analysis(tree, buf, width=100)
    assert "Next win: not replayed — replay models GPU streams" in buf.getvalue()


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
    assert len(f) == 1 and f"1. {top['what']}" in f[0] and "tokens/s" in f[0]
    assert " as profiled" not in f[0]  # one step time: never the profiled and the program's side by side
    if name == "loop":  # a host-synced per-expert loop: grouped experts first; graphs only after it (they need it)
        assert top["what"] == "grouped experts" and not top["needs"]
        assert all(not r["what"].startswith("CUDA graphs") for r in nw["rows"])
        then = top.get("then") or []
        assert [t["what"] for t in then] == ["CUDA graphs"] and "grouped experts" in then[0]["needs"]
        assert "1. grouped experts: step" in f[0] and "then CUDA graphs (needs grouped experts" in f[0]
        assert top["confidence"]["kind"] == "grouped-experts" and "replay was within" in f[0]





@pytest.fixture(scope="module")
def tiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real 2xH200 capture tiled into 12 profiler windows (720 job steps, ~1.36 M rows)."""
    import os
    import sys

    src = Path(os.environ.get("TRACEKIT_TRACES", "/work/shared/traces")) / "nsys" / "generated-h200"
    if not (src / "tp2_rank0.sqlite").exists():
        pytest.skip("shared H200 traces not available")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from tile_real import tile_trace

    from tracekit.ingest.convert import convert

    d = tmp_path_factory.mktemp("nw")
    one = d / "h200.parquet"
    convert([src / "tp2_rank0.sqlite", src / "tp2_rank1.sqlite"], one)
    out = d / "tiled.parquet"
    info = tile_trace(one, out, ranks=2, kernels=12 * 2 * 5520)
    assert info.profiler_windows == 12
    return out


def test_sampled_replay_matches_whole_trace(tiled: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Above REPLAY_ROWS, next-win replays stretches of steps read rank by rank. Each sampled step replays as it
    does in the whole-trace replay (self-replay: exactly the observed step; CUDA-graph what-if: within 1% on >= 80%
    of the steps and in p50, the lead-in step absorbs most of the cut); the scan and the in-memory frame give the same section."""
    import numpy as np

    import tracekit.advice.nextwin as nw
    from tracekit.api import analyze, analyze_frame
    from tracekit.replay.api import Replayer
    from tracekit.replay.simulate import inputs_from_graph
    from tracekit.replay.whatif import parse_whatif
    from tracekit.analysis.steptime import p50
    from tracekit.schema import read_trace

    monkeypatch.setattr(nw, "REPLAY_ROWS", 100_000)
    part = analyze(tiled)["next_win"]
    rep = part["baseline"]["replayed"]
    assert part["status"] == "ok" and not rep["whole"] and rep["of_steps"] == 720 and len(rep["stretches"]) == nw.REPLAY_SEGMENTS
    assert 20 <= rep["steps"] <= nw.REPLAY_STEPS and rep["rows"] <= 1.2 * nw.REPLAY_ROWS
    # the built-in per-expert loop: grouped experts (graphs need it first), as the whole-trace replay ranks them
    assert [r["spec"] for r in part["rows"]] == ["grouped-experts"]
    df, meta = read_trace(tiled)
    sel = np.concatenate([np.arange(a + (1 if a else 0), b) for a, b in rep["stretches"]])  # the measured job steps
    assert sel.size == rep["steps"]
    rw = Replayer(df)
    assert part["baseline"]["step_ns_p50"] == pytest.approx(p50(rw.observed_series()[sel]), rel=1e-3)
    sample, info = nw.replay_rows(df.lazy(), [0, 1], df.height)
    assert info == rep

    def series(rp: Replayer) -> np.ndarray:
        x, _st, _r = rp.step_series(parse_whatif("grouped-experts").apply(rp.g, inputs_from_graph(rp.g, 1.0))[0])
        return x

    whole, got = series(rw), series(Replayer(sample))
    assert got.size == sel.size
    assert np.mean(np.abs(got / whole[sel] - 1) < 0.01) >= 0.8
    assert p50(got) == pytest.approx(p50(whole[sel]), rel=0.01)
    assert analyze_frame(df, meta)["next_win"] == part


def test_coupled_ranks_join_through_process_groups() -> None:
    import polars as pl

    from tracekit.advice.nextwin import coupled_ranks

    inst = pl.DataFrame({"pg": ["tp0", "tp0", "tp1", "tp1", "dp", "dp"], "rank": [0, 1, 2, 3, 1, 5]})
    assert coupled_ranks([0, 1, 2, 3, 4, 5], inst) == [[0, 1, 5], [2, 3], [4]]
    assert coupled_ranks([3, 1, 2], None) == [[1], [2], [3]]


def test_sample_bounded_in_ranks_keeps_whole_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    """One job step of every rank over the budget: whole coupled groups replay, in order, up to it."""
    import polars as pl

    import tracekit.advice.nextwin as nw
    from tests.replay.frames import TraceBuilder

    b = TraceBuilder()
    for r in range(6):
        t = 0.0
        for s in range(4):
            b.step(r, t, 100.0, step_id=s)
            for i in range(20):
                b.launch(r, t + 1 + 4 * i, 2.0, t + 3 + 4 * i, 3.0, step_id=s)
            t += 200.0
    df = b.frame()
    rank_rows = {int(r): int(n) for r, n in df.group_by("rank").len().iter_rows()}  # 164 per rank, 41 per step
    monkeypatch.setattr(nw, "REPLAY_ROWS", 100)  # one step of all six ranks (246 rows) is over it
    groups = [[0, 1], [2, 3], [4, 5]]
    sample, info = nw.replay_rows(df.lazy(), list(range(6)), df.height, rank_rows=rank_rows, groups=groups)
    assert info["ranks"] == [0, 1] and info["of_ranks"] == 6 and info["steps"] >= 1  # 2 ranks: 82 rows a step
    assert sample is not None and set(sample.get_column("rank").unique().to_list()) == {0, 1}
    # without the groups (or within budget) every rank replays, as before
    _s, whole = nw.replay_rows(df.lazy(), list(range(6)), df.height)
    assert "ranks" not in whole
    monkeypatch.setattr(nw, "REPLAY_ROWS", 10_000)
    _s, small = nw.replay_rows(df.lazy(), list(range(6)), df.height, rank_rows=rank_rows, groups=groups)
    assert small["whole"] and "ranks" not in small
    assert isinstance(sample, pl.DataFrame)
