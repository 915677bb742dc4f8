"""Rich terminal rendering of the analyze result: reads the typed result tree
(:class:`tracekit.analysis.sections.Sections`, what ``analyze --json`` encodes); no computation here."""

from __future__ import annotations

from typing import TextIO

from rich.console import Console
from rich.text import Text

from tracekit.analysis.sections import Overall, RankBreakdown, Sections, UnsetType
from tracekit.report._fmt import Col, bullets, console_width, fit_tables
from tracekit.report.terminal_sections import sections

__all__ = ["render_analysis", "fmt_ns"]


def fmt_ns(ns: float | int | None) -> str:
    if ns is None:
        return "-"
    ns = float(ns)
    a = abs(ns)
    if a >= 1e9:
        return f"{ns / 1e9:.3f} s"
    if a >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    if a >= 1e3:
        return f"{ns / 1e3:.1f} µs"
    return f"{ns:.0f} ns"


def _pct(v: float, w: float) -> str:
    return f"{100 * v / w:.1f}%" if w else "-"


def render_analysis(s: Sections, out: TextIO | None = None, *, width: int | None = None) -> None:
    """Findings first, then the breakdown per rank, collectives (transfer vs wait), stalls, idle by cause, PCIe
    phases, steps, next win (:mod:`tracekit.report.terminal_sections`), top kernels, uncategorized kernels, quality.

    ``s``: the result tree (``AnalysisResult.sections``). ``width``: columns; default the real terminal's width (80
    in a pipe or a file, or ``$COLUMNS``). Tables never cut a number or a unit: they split into parts that fit (each
    repeating the rank / category column); only kernel names are shortened.
    """
    con = console_width(width, out)
    if s.findings:
        con.print("[bold]Findings[/bold]")
        con.print(bullets([str(f) for f in s.findings]))
        con.print()
    _breakdown(con, s)
    _notes(con, s)
    for sec in sections(s, con.width, fmt_ns):
        con.print(sec)
    _kernels(con, s)
    _quality(con, s)


def _share_row(label: str, r: RankBreakdown | Overall, buckets: tuple[str, ...]) -> list[object]:
    """label, window, busy share, then each bucket's share of the window (a bucket the split lacks: 0)."""
    w = r.window_ns
    return [label, fmt_ns(w), _pct(r.gpu_busy_ns, w), *[_pct(r.time_ns.get(b, 0), w) for b in buckets]]


def _breakdown(con: Console, s: Sections) -> None:
    """The exclusive split per rank (and ``all``: the sums, where there are several ranks)."""
    title = "Where GPU time goes (exclusive; % of each rank's window)"
    if s.device_mode == "cpu":
        title = "Where the forward threads' time goes (CPU mode: no GPU in this trace; % of each rank's window)"
    cols = [Col("rank", key=True), Col("window"), Col("busy")] + [Col(b) for b in s.buckets]
    rows = [_share_row(str(r.rank), r, s.buckets) for r in s.ranks]
    styles: list[str | None] = [None] * len(rows)
    if len(s.ranks) > 1:
        rows.append(_share_row("all", s.overall, s.buckets))
        styles.append("bold")
    for t in fit_tables(title, cols, rows, con.width, row_styles=styles):
        con.print(t)


def _notes(con: Console, s: Sections) -> None:
    """The lines under the breakdown: how far the MoE split can be trusted, the trimmed profiler-start transient."""
    moe = s.moe_detection
    if not isinstance(moe, UnsetType):
        if moe.status == "not_detected":
            con.print("MoE split: not detected (no MoE structure recognized: its 0% above is no measurement; see Data "
                      "quality)")
        elif moe.moe_gemm_range_pct:
            lo, hi = moe.moe_gemm_range_pct
            con.print(f"MoE GEMM: {lo:.1f}-{hi:.1f}% of GPU-op time ({moe.ambiguous_pct:.1f}% are GEMMs the launch "
                      "pattern cannot attribute, counted dense above; see Data quality)")
    if s.window.trimmed_transient_ns:
        con.print(f"window: trimmed the first {fmt_ns(s.window.trimmed_transient_ns)} (profiler-start transient)")


def _kernels(con: Console, s: Sections) -> None:
    """Top kernels per category, then the uncategorized ones not already in that table (at most 5) and how many were."""
    tk = s.top_kernels
    if tk:
        cols = [Col("category", "text", key=True, min_width=8), Col("kernel", "text", key=True, max_width=70), Col("count"),
                Col("total"), Col("mean")]
        rows = [[cat if i == 0 else "", k.name, str(k.count), fmt_ns(k.total_ns), fmt_ns(k.mean_ns)]
                for cat, items in tk.items() for i, k in enumerate(items)]
        for t in fit_tables("Top kernels per category (all ranks)", cols, rows, con.width):
            con.print(t)
    unc = s.uncategorized_top
    shown = {k.name for items in tk.values() for k in items}
    rest = [u for u in unc if u.name not in shown]  # a row of the table above is not repeated
    if rest:
        cols = [Col("kernel", "text", key=True, max_width=80), Col("count"), Col("total")]
        rows = [[u.name, str(u.count), fmt_ns(u.total_ns)] for u in rest[:5]]
        for t in fit_tables("Other uncategorized kernels (no rule matched; extend with --rules)", cols, rows, con.width):
            con.print(t)
    if unc and len(rest) < len(unc):
        con.print(f"{len(unc) - len(rest)} of the top kernels above matched no rule (counted other_compute; name them "
                  "with --rules)")


def _quality(con: Console, s: Sections) -> None:
    """The data-quality flags, one line each: ``[severity] code (rank r): message``."""
    if not s.quality:
        return
    con.print("[bold]Data quality[/bold]")
    lines = [Text(f"[{q.severity}] {q.code}{'' if isinstance(q.rank, UnsetType) else f' (rank {q.rank})'}: {q.message}")
             for q in s.quality]
    con.print(bullets(lines, marker="-"))
