"""Every command agrees on the same trace (issue 16's acceptance): analyze, diff, timeline, export and replay
report the same windows, step counts, tokens/s and collective waits, because each takes them from the one
analysis result (tracekit.analysis.result.AnalysisResult).

Real traces only: the 2xH200 nsys capture (NCCL all-reduces, rank 1 waiting ~3 ms per step for rank 0),
the same capture tiled into 3 profiler windows (a windowed capture: the time between windows was not
recorded, so whole-capture figures would differ from analyze's), and TraceLens' SGLang prefill+decode
trace (steps with token counts: tokens/s).
"""

from __future__ import annotations

import gzip
import json
import os
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tracekit.cli import app

TRACES = Path(os.environ.get("TRACEKIT_TRACES", "/work/shared/traces"))
H200 = TRACES / "nsys" / "generated-h200"
SGLANG_PD = TRACES / "tracelens" / "inference" / "sglang_prefilldecode"
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


def _cli(*args: str) -> str:
    r = CliRunner().invoke(app, list(args))
    assert r.exit_code == 0, r.output
    return r.stdout


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if not (H200 / "tp2_rank0.sqlite").exists():
        pytest.skip("shared H200 traces not available")
    d = tmp_path_factory.mktemp("agree")
    out = {"h200_tp2": d / "h200_tp2.parquet"}
    _cli("convert", str(H200 / "tp2_rank0.sqlite"), str(H200 / "tp2_rank1.sqlite"), "-o", str(out["h200_tp2"]), "-q")
    from tile_real import tile_trace

    out["h200_tp2_3windows"] = d / "h200_windows.parquet"
    # 3 copies 1 s apart, like a capture that profiles a short window every second
    info = tile_trace(out["h200_tp2"], out["h200_tp2_3windows"], ranks=2, kernels=3 * 2 * 5520, gap_ns=1_000_000_000)
    assert info.profiler_windows == 3
    if SGLANG_PD.exists():
        out["sglang_prefilldecode"] = d / "sglang_pd.parquet"
        _cli("convert", str(SGLANG_PD), "-o", str(out["sglang_prefilldecode"]), "-q")
    return out


def _analyze(t: Path) -> dict:
    return json.loads(_cli("analyze", "--json", str(t)))


def _tokens_per_s(a: dict) -> float | None:
    """analyze's tokens/s over all its step groups: tokens over step time (the step summary's definition)."""
    steps = [s for s in a["steps"]["steps"] if not s["no_gpu"]]
    tok = [s["tokens"] for s in steps if s["tokens"] is not None]
    if not tok:
        return None
    return sum(tok) / (sum(s["step_ns"] for s in steps) * 1e-9)


@pytest.mark.parametrize("name", ["h200_tp2", "h200_tp2_3windows", "sglang_prefilldecode"])
def test_analyze_diff_timeline_export_replay_agree(traces: dict[str, Path], name: str, tmp_path: Path) -> None:
    if name not in traces:
        pytest.skip(f"{name}: trace not available")
    t = traces[name]
    a = _analyze(t)
    ranks = a["ranks"]
    n_ranks = len(ranks)
    window_mean = sum(r["window_ns"] for r in ranks) / n_ranks
    steps_total = a["steps"]["count"]
    waits = {int(r["rank"]): int(r["wait_ns"]) for r in a["collectives"].get("per_rank", [])} if a.get("collectives") else {}
    n_inst = (a.get("collectives") or {}).get("instances", 0)
    if name.startswith("h200"):
        assert n_inst > 0 and waits.get(1, 0) > 10 * max(waits.get(0, 0), 1)  # rank 1 waits for rank 0 (README facts)
    from tracekit.schema import read_metadata

    meta = read_metadata(t)
    pw = [tuple(s) for s in (meta.get("capture") or {}).get("profiler_windows") or []]
    if name == "h200_tp2_3windows":
        assert len(pw) == 3 and any(q["code"] == "profiler_windows" for q in a["quality"])
        # analyzed time = the profiler windows (extended to the ops launched in them), not the 2 unrecorded gaps
        assert window_mean <= sum(hi - lo for lo, hi in pw) + 3 * 5_000_000
        assert window_mean < (meta["window_ns"][1] - meta["window_ns"][0]) - 1_500_000_000

    # ---- diff (the trace against itself): the same windows, steps, tokens/s and waits as analyze
    d = json.loads(_cli("diff", str(t), str(t), "--json"))
    b = d["before"]
    assert b["window_ns"] == pytest.approx(window_mean, rel=1e-9)
    assert b["steps_per_rank"] * n_ranks == pytest.approx(steps_total, abs=0.5)
    tps = _tokens_per_s(a)
    if tps is None:
        assert b["tokens_per_s"] is None
    else:
        assert b["tokens_per_s"] == pytest.approx(tps, rel=1e-9)
        for s in a["steps"]["summary"]:  # one step group: the summary's own figure
            if len(a["steps"]["summary"]) == 1:
                assert b["tokens_per_s"] == pytest.approx(s["tokens_per_s"], rel=1e-9)
    d_wait = sum(c["wait_ns"] for c in b["collectives"]) * n_ranks
    assert d_wait == pytest.approx(sum(waits.values()), rel=1e-9, abs=1)
    assert {q["code"] for q in d["quality"]}.isdisjoint({"diff_windows_differ"})

    # ---- timeline: the page's analysis, windows and collective matching are the same result
    from tracekit.commands.timeline import _analysis
    from tracekit.report.timeline_html import build_payload
    from tracekit.schema import read_trace

    df, meta = read_trace(t)
    ta = _analysis(df, meta)
    assert ta is not None
    assert ta["window"] == a["window"] and ta["steps"]["count"] == steps_total
    assert [r["window_ns"] for r in ta["ranks"]] == [r["window_ns"] for r in ranks]
    inst = ta["collective_instances"]
    assert inst.height == sum(int(r["n_ranks"]) for r in inst.unique(["pg", "seq"]).iter_rows(named=True)) or not n_inst
    assert int(inst["wait_ns"].sum() or 0) == sum(waits.values())
    p = build_payload(df, meta, ta)
    w = p["_window"]
    if pw:  # the detail view opens inside a profiler window
        assert any(lo <= w.start_ns and w.end_ns <= hi + 50_000_000 for lo, hi in pw), (w, pw)
    out_html = tmp_path / "t.html"
    _cli("timeline", str(t), "-o", str(out_html))
    assert out_html.stat().st_size > 10_000

    # ---- export: collective flows chain the analysis' instances (n_ranks - 1 links each)
    pf = tmp_path / "t.json.gz"
    _cli("export", str(t), "--perfetto", str(pf))
    ev = json.loads(gzip.open(pf).read())["traceEvents"]
    flows = sum(1 for e in ev if e.get("ph") == "s")
    if n_inst:
        per = inst.group_by(["pg", "seq"]).len()
        assert flows == int((per["len"] - 1).sum())
    else:
        assert flows == 0

    # ---- replay: the same steps (job steps = steps per rank) and the same collective instances
    if steps_total:
        rj = json.loads(_cli("replay", str(t), "--json", "--no-calibrate"))
        assert rj["graph"]["collective_instances"] == n_inst
        per_rank = {}
        for s in a["steps"]["steps"]:
            per_rank[s["rank"]] = per_rank.get(s["rank"], 0) + 1
        modes = {s["mode"] for s in a["steps"]["steps"]}
        if len(modes) == 1 and len(a["steps"]["steps"]) < 200:
            assert rj["baseline"]["n_steps"] == max(per_rank.values())
