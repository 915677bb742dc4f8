"""Terminal reports fit their console and never cut a number: ``analyze`` and ``diff`` rendered into
80- and 200-column consoles on real captures (the 2×H200 fixtures, the 2×H200 nsys capture).

Each table is parsed back from the text (its parts, when it was split to fit, are joined row by row)
and every numeric cell the report formats must appear whole in its row.
"""

from __future__ import annotations

import io
import os
import re
from pathlib import Path

import pytest
from rich.cells import cell_len
from rich.console import Console
from typer.testing import CliRunner

from tracekit.analysis.sections import Sections
from tracekit.report._fmt import ms, num
from tracekit.report.terminal import _pct, fmt_ns, render_analysis

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "gpu"
NSYS = Path(os.environ.get("TRACEKIT_TRACES", "/work/shared/traces")) / "nsys" / "generated-h200"
WIDTHS = (80, 200)


def parse_tables(text: str, titles: list[str]) -> dict[str, list[list[list[str]]]]:
    """{title: [part rows]}: the data rows (cells, stripped) of each titled table, per part."""
    out: dict[str, list[list[list[str]]]] = {}
    cur: list[list[str]] | None = None
    for line in text.splitlines():
        base = re.sub(r" \(\d+/\d+\)$", "", line.strip())
        if base in titles:
            cur = []
            out.setdefault(base, []).append(cur)
        elif cur is not None and line.startswith("│"):
            cur.append([c.strip() for c in line.strip("│").split("│")])
        elif cur is not None and line.startswith("└"):
            cur = None
    return out


def joined_rows(parts: list[list[list[str]]]) -> list[list[str]]:
    """Row j of every part, concatenated (a split table repeats its key columns in each part)."""
    assert parts, "table not found"
    n = len(parts[0])
    assert all(len(p) == n for p in parts), "parts of one table have different row counts"
    return [sum((p[j] for p in parts), []) for j in range(n)]


def check_width(text: str, width: int) -> None:
    too_wide = [ln for ln in text.splitlines() if cell_len(ln) > width]
    assert not too_wide, f"{len(too_wide)} line(s) wider than {width}: {too_wide[0]!r}"


# ---------------------------------------------------------------- analyze
@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, Sections]:
    """The result trees (what ``render_analysis`` reads) of the fixtures and, where present, the nsys capture."""
    from tracekit.api import analyze_result

    def analyze(p: Path) -> Sections:
        return analyze_result(p).sections

    out = {name: analyze(FIX / f"{name}.trace.parquet") for name in ("grouped", "loop")}
    if (NSYS / "tp2_rank1.sqlite").exists():
        from tracekit.ingest.convert import convert

        p = tmp_path_factory.mktemp("tw") / "h200.parquet"
        convert([NSYS / "tp2_rank0.sqlite", NSYS / "tp2_rank1.sqlite"], p)
        out["nsys_tp2"] = analyze(p)
    return out


BREAKDOWN = "Where GPU time goes (exclusive; % of each rank's window)"
TOPK = "Top kernels per category (all ranks)"


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("name", ["grouped", "loop", "nsys_tp2"])
def test_analyze_fits_and_keeps_every_number(results, name, width):
    if name not in results:
        pytest.skip("generated-h200 traces not available")
    res = results[name]
    buf = io.StringIO()
    render_analysis(res, buf, width=width)
    text = buf.getvalue()
    check_width(text, width)
    tables = parse_tables(text, [BREAKDOWN, TOPK])
    rows = joined_rows(tables[BREAKDOWN])
    buckets = res.buckets
    by_rank = {r[0]: r for r in rows}
    for r in res.ranks:
        w = r.window_ns
        want = [fmt_ns(w), _pct(r.gpu_busy_ns, w)] + [_pct(r.time_ns.get(b, 0), w) for b in buckets]
        got = by_rank[str(r.rank)]
        assert all(v in got for v in want), (want, got)
        # the cells keep their column order across the parts: window, busy, then the buckets
        nums = [c for c in got if c != str(r.rank)]
        assert nums == want
    if width >= 200:
        assert len(tables[BREAKDOWN]) == 1  # a wide console shows the breakdown in one table
    trows = joined_rows(tables[TOPK])
    want_k = [(str(k.count), fmt_ns(k.total_ns), fmt_ns(k.mean_ns)) for ks in res.top_kernels.values() for k in ks]
    assert len(trows) == len(want_k)
    for got, want in zip(trows, want_k):
        assert got[-3:] == list(want), (got, want)  # count, total, mean whole (names may be shortened)


def test_analyze_follows_the_terminal_width(results, monkeypatch):
    """No ``width``: the console's width (rich reads the terminal; ``$COLUMNS`` in a pipe), not a fixed 120."""
    monkeypatch.setenv("COLUMNS", "190")
    buf = io.StringIO()
    render_analysis(results["grouped"], buf)
    lines = buf.getvalue().splitlines()
    assert max(cell_len(ln) for ln in lines) <= 190
    assert max(cell_len(ln) for ln in lines if ln.startswith("┏")) > 80  # uses the room it has
    assert len(parse_tables(buf.getvalue(), [BREAKDOWN])[BREAKDOWN]) == 1  # one table (split at 80)


def test_analyze_cli_width_option(tmp_path):
    from tracekit.cli import app

    r = CliRunner().invoke(app, ["analyze", str(FIX / "grouped.trace.parquet"), "--width", "100"])
    assert r.exit_code == 0, r.output
    check_width(r.output, 100)
    assert max(cell_len(ln) for ln in r.output.splitlines()) > 80
    r = CliRunner().invoke(app, ["analyze", str(FIX / "grouped.trace.parquet"), "--width", "10"])
    assert r.exit_code == 64 and "--width 10" in r.output


# ---------------------------------------------------------------- diff
@pytest.fixture(scope="module")
def diff_res():
    import polars as pl

    from tracekit.compare.diff import diff_runs, summarize_result
    from tracekit.api import analyze_result
    from tracekit.schema import scan_trace

    runs = []
    for name in ("grouped", "loop"):
        p = FIX / f"{name}.trace.parquet"
        counters = scan_trace(p).filter(pl.col("kind") == "counter").select("rank", "kind", "ts_ns", "name", "value").collect()
        runs.append(summarize_result(analyze_result(p), label=f"{name}.trace", counters=counters))
    return diff_runs(runs[0], runs[1], labels=("grouped.trace", "loop.trace"), top=15)


def _rel(v):
    return "—" if v is None else f"{v * 100:+.1f}%"


@pytest.mark.parametrize("width", WIDTHS)
def test_diff_fits_and_keeps_every_number(diff_res, width):
    from tracekit.report.diff_terminal import render_terminal

    res = diff_res
    buf = io.StringIO()
    render_terminal(res, Console(file=buf, width=width, highlight=False, soft_wrap=False))
    text = buf.getvalue()
    check_width(text, width)
    unit = "ms/step" if res.basis == "per_step" else "ms"
    tk, tc = f"kernels whose time changed most ({unit})", f"time per category ({unit}, exclusive)"
    tables = parse_tables(text, ["summary", tc, tk])
    rows = joined_rows(tables["summary"])
    for got, r in zip(rows, res.scalars.to_dicts()):
        want = [num(r["before"]), num(r["after"]), num(r["delta"]), _rel(r["rel"])]
        assert got[0] == r["metric"] and got[2:] == want, (got, want)
    cats = [r for r in res.categories.to_dicts() if r["before_ns"] or r["after_ns"]]
    rows = joined_rows(tables[tc])
    assert len(rows) == len(cats)
    for got, r in zip(rows, cats):
        want = [ms(r["before_ns"]), ms(r["after_ns"]), ms(r["delta_ns"]), _rel(r["rel"])]
        assert [c for c in got if c != r["bucket"]][:4] == want
    # the table that lost every numeric column in an 80-column pipe: all four numbers, whole, on every row
    rows = joined_rows(tables[tk])
    ks = res.kernels.to_dicts()
    assert len(rows) == len(ks) > 5
    for got, r in zip(rows, ks):
        want = [ms(r["before_ns"]), ms(r["after_ns"]), ms(r["delta_ns"]), _rel(r["rel"])]
        assert got[1:5] == want, (got, want)
    if width >= 200:
        assert all(len(p) == 1 for p in tables.values())


def test_diff_cli_in_a_pipe_is_80_columns(tmp_path):
    from tracekit.cli import app

    r = CliRunner().invoke(app, ["diff", str(FIX / "grouped.trace.parquet"), str(FIX / "loop.trace.parquet")],
                           env={"COLUMNS": ""})
    assert r.exit_code == 0, r.output
    check_width(r.output, 80)
    assert "kernels whose time changed most" in r.output
