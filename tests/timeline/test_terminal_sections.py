"""The analyze text report has the sections users look for (issue 30 item 7): collectives (transfer vs wait),
stalls with the late rank, idle by cause, PCIe phases, steps and the next win; each figure as the JSON holds it
(the report renders the typed tree, ``AnalysisResult.sections``; the expectations are read from ``to_json()``),
every line within the width, and no row of the top-kernels table repeated as an uncategorized one (item 11)."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from tracekit.analysis.result import AnalysisResult
from tracekit.analysis.sections import Sections, build
from tracekit.report.terminal import fmt_ns, render_analysis

from .test_terminal_width import check_width, joined_rows, parse_tables

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "gpu"
NSYS = Path(os.environ.get("TRACEKIT_TRACES", "/work/shared/traces")) / "nsys" / "generated-h200"

COLL = "Collectives (all ranks): transfer vs wait for the last rank"
WORST = "Worst stalls"
IDLE = "Idle by cause (time, % of the rank's window)"
STEPS = "Steps (job steps: the slowest rank's; p90 from 3 steps)"
TOPK = "Top kernels per category (all ranks)"
UNC = "Other uncategorized kernels (no rule matched; extend with --rules)"


@pytest.fixture(scope="module")
def straggler_result() -> AnalysisResult:
    from tracekit.api import analyze_result

    return analyze_result(FIX / "straggler.trace.parquet")


@pytest.fixture(scope="module")
def straggler(straggler_result: AnalysisResult) -> dict:
    """The JSON object of the same result: what the text must agree with."""
    return straggler_result.to_json()


def _text(tree: Sections, width: int) -> str:
    buf = io.StringIO()
    render_analysis(tree, buf, width=width)
    return buf.getvalue()


@pytest.mark.parametrize("width", [80, 160])
def test_sections_are_there_and_hold_the_json_figures(straggler_result: AnalysisResult, straggler: dict, width: int) -> None:
    text = _text(straggler_result.sections, width)
    check_width(text, width)
    stall_title = f"Synchronization stalls ({straggler['collectives']['stall_count']}): the late rank"
    tables = parse_tables(text, [COLL, WORST, IDLE, STEPS, stall_title])
    assert set(tables) == {COLL, WORST, IDLE, STEPS, stall_title}, sorted(tables)
    # collectives: transfer and wait per group, as the JSON has them
    rows = joined_rows(tables[COLL])
    for g, row in zip(straggler["collectives"]["groups"], rows):
        assert fmt_ns(g["transfer_ns"]) in row and fmt_ns(g["wait_ns"]) in row and str(g["count"]) in row, (g, row)
    # stalls: the late rank and the time the others lost
    rows = joined_rows(tables[stall_title])
    top = straggler["collectives"]["stall_summary"][0]
    assert rows[0][0] == str(top["late_rank"]) and fmt_ns(top["lost_ns"]) in rows[0]
    worst = joined_rows(tables[WORST])[0]
    s0 = straggler["stalls"][0]
    assert worst[1:4] == [str(s0["waiting_rank"]), str(s0["late_rank"]), fmt_ns(s0["wait_ns"])]
    # idle by cause: every cause a rank has, as time
    rows = {r[0]: r for r in joined_rows(tables[IDLE])}
    for rank, causes in straggler["idle_causes_ns"].items():
        for v in causes.values():
            if v:
                assert any(c.startswith(fmt_ns(v)) for c in rows[str(rank)]), (rank, v, rows[str(rank)])
    # steps: the primary shape's row is the one step time (steps.step_time), p50 and tokens/s
    st = straggler["steps"]["step_time"]
    prim = [r for r in joined_rows(tables[STEPS]) if r[0] == st["mode"] and fmt_ns(st["step_ns_p50"]) in r]
    assert prim and f"{st['tokens_per_s']:,.0f}" in prim[0], (st, joined_rows(tables[STEPS]))
    assert "Next win" in text


def test_uncategorized_rows_are_not_repeated(straggler_result: AnalysisResult, straggler: dict) -> None:
    text = _text(straggler_result.sections, 200)
    tables = parse_tables(text, [TOPK, UNC])
    shown = {k["name"] for ks in straggler["top_kernels"].values() for k in ks}
    rest = [u for u in straggler["uncategorized_top"] if u["name"] not in shown]
    unc_rows = joined_rows(tables[UNC]) if UNC in tables else []
    assert len(unc_rows) == min(5, len(rest))
    for u, row in zip(rest, unc_rows):
        assert row[-2:] == [str(u["count"]), fmt_ns(u["total_ns"])]
    n_dup = len(straggler["uncategorized_top"]) - len(rest)
    if n_dup:
        assert f"{n_dup} of the top kernels above matched no rule" in text


@pytest.mark.skipif(not (NSYS / "tp2_rank1.sqlite").exists(), reason="generated-h200 traces not available")
def test_pcie_phases_section(tmp_path: Path) -> None:
    from tracekit.api import analyze_result
    from tracekit.ingest.convert import convert

    p = tmp_path / "h200.parquet"
    convert([NSYS / "tp2_rank0.sqlite", NSYS / "tp2_rank1.sqlite"], p)
    result = analyze_result(p)
    res = result.to_json()
    assert res["pcie_phases"], "the capture plants PCIe-bound phases"
    text = _text(result.sections, 80)
    check_width(text, 80)
    n = len(res["pcie_phases"])
    title = f"PCIe-bound phases ({n}; longest 8)" if n > 8 else f"PCIe-bound phases ({n})"
    rows = joined_rows(parse_tables(text, [title])[title])
    longest = max(res["pcie_phases"], key=lambda p: p["dur_ns"])
    assert rows[0][0] == str(longest["rank"]) and fmt_ns(longest["dur_ns"]) in rows[0]


def _tree(**sections: object) -> Sections:
    """A two-rank tree with the pipeline's sections only (every analysis' section unset), plus ``sections``."""
    ranks = [{"rank": r, "window_start_ns": 1_000 * r, "window_ns": 1_000_000, "gpu_busy_ns": 400_000,
              "time_ns": {"attention": 400_000, "idle": 600_000}} for r in (0, 1)]
    return build({"schema_version": 1, "trace_schema_version": 1, "world_size": 2, "device_mode": "gpu",
                  "window": {"start_ns": None, "end_ns": None, "reason": "extent", "trimmed_transient_ns": 0,
                             "skipped_steps": 0},
                  "buckets": ["attention", "idle"], "ranks": ranks,
                  "overall": {"window_ns": 2_000_000, "gpu_busy_ns": 800_000, "time_ns": {"attention": 800_000, "idle": 1_200_000}},
                  "top_kernels": {}, "uncategorized_top": [], "findings": [], "quality": [], **sections}, Sections)


def test_unset_sections_print_nothing_and_quality_names_its_rank() -> None:
    """A tree whose analysis sections are unset: the breakdown (with its ``all`` row) and the quality lines, no other
    section; a flag names its rank only when it has one."""
    text = _text(_tree(quality=[{"code": "clock_skew", "message": "flagged", "severity": "info"},
                                {"code": "rank_failed", "message": "unreadable", "severity": "warning", "rank": 1}]), 100)
    check_width(text, 100)
    rows = joined_rows(parse_tables(text, ["Where GPU time goes (exclusive; % of each rank's window)"])[
        "Where GPU time goes (exclusive; % of each rank's window)"])
    assert [r[:3] for r in rows] == [["0", "1.00 ms", "40.0%"], ["1", "1.00 ms", "40.0%"], ["all", "2.00 ms", "40.0%"]]
    for title in ("Findings", "Collectives", "Synchronization stalls", "Worst stalls", "idle by cause", "PCIe", "Steps",
                  "Next win", "MoE", "Top kernels", "window: trimmed"):
        assert title.lower() not in text.lower(), title
    assert "[info] clock_skew: flagged" in text and "[warning] rank_failed (rank 1): unreadable" in text


def test_idle_by_cause_shows_the_causes_a_rank_has() -> None:
    """Idle by cause reads each rank's causes from the tree: a cause no rank has is no column; shares are of the
    rank's own window."""
    zero = {"between_steps": 0, "host_sync": 0, "launch_bound": 0, "host_idle": 0, "other": 0, "waiting_on_peer": 0}
    text = _text(_tree(idle_causes_ns={"1": {**zero, "host_sync": 250_000}, "0": {**zero, "launch_bound": 100_000}}), 120)
    rows = joined_rows(parse_tables(text, [IDLE])[IDLE])
    assert rows == [["0", "100.0 µs (10%)", "0 ns (0%)"], ["1", "0 ns (0%)", "250.0 µs (25%)"]]
    assert "launch" in text and "host" in text and "between" not in text and "waiting" not in text


@pytest.mark.parametrize("width", [80, 120])
def test_replay_fits_its_width(width: int) -> None:
    """Issue 30 item 13: replay's tables split to fit (no cut numbers), and replay takes --width like analyze."""
    from typer.testing import CliRunner

    from tracekit.cli import app

    r = CliRunner().invoke(app, ["replay", str(FIX / "loop.trace.parquet"), "-w", "grouped-experts", "-w", "moe_gemm=0.5",
                                 "-w", "grouped-experts+no-host-sync+cuda-graph", "--width", str(width)])
    assert r.exit_code == 0, r.output
    check_width(r.output, width)
    rows = joined_rows(parse_tables(r.output, ["predicted step time"])["predicted step time"])
    assert [x[0] for x in rows][0] == "baseline" and len(rows) == 4
    assert all(any(c.endswith("%") for c in x) for x in rows[1:])  # every change whole
    bad = CliRunner().invoke(app, ["replay", str(FIX / "loop.trace.parquet"), "--width", "10"])
    assert bad.exit_code == 64 and "--width 10" in bad.output
