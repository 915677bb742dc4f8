"""The analyze text report has the sections users look for (issue 30 item 7): collectives (transfer vs wait),
stalls with the late rank, idle by cause, PCIe phases, steps and the next win; each figure as the JSON holds it,
every line within the width, and no row of the top-kernels table repeated as an uncategorized one (item 11)."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

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
def straggler() -> dict:
    from tracekit.api import analyze

    return analyze(FIX / "straggler.trace.parquet")


def _text(res: dict, width: int) -> str:
    buf = io.StringIO()
    render_analysis(res, buf, width=width)
    return buf.getvalue()


@pytest.mark.parametrize("width", [80, 160])
def test_sections_are_there_and_hold_the_json_figures(straggler: dict, width: int) -> None:
    text = _text(straggler, width)
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


def test_uncategorized_rows_are_not_repeated(straggler: dict) -> None:
    text = _text(straggler, 200)
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
    from tracekit.api import analyze
    from tracekit.ingest.convert import convert

    p = tmp_path / "h200.parquet"
    convert([NSYS / "tp2_rank0.sqlite", NSYS / "tp2_rank1.sqlite"], p)
    res = analyze(p)
    assert res["pcie_phases"], "the capture plants PCIe-bound phases"
    text = _text(res, 80)
    check_width(text, 80)
    n = len(res["pcie_phases"])
    title = f"PCIe-bound phases ({n}; longest 8)" if n > 8 else f"PCIe-bound phases ({n})"
    rows = joined_rows(parse_tables(text, [title])[title])
    longest = max(res["pcie_phases"], key=lambda p: p["dur_ns"])
    assert rows[0][0] == str(longest["rank"]) and fmt_ns(longest["dur_ns"]) in rows[0]


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
