"""Rich terminal rendering of the analyze result (no computation here)."""

from __future__ import annotations

from typing import Any, TextIO

from tracekit.report._fmt import Col, bullets, console_width, fit_tables
from tracekit.report.terminal_sections import sections
from rich.text import Text

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


def render_analysis(res: dict[str, Any], out: TextIO | None = None, *, width: int | None = None) -> None:
    """Findings first, then the breakdown per rank, collectives (transfer vs wait), stalls, idle by cause, PCIe
    phases, steps, next win (:mod:`tracekit.report.terminal_sections`), top kernels, uncategorized kernels, quality.

    ``width``: columns; default the real terminal's width (80 in a pipe or a file, or ``$COLUMNS``).
    Tables never cut a number or a unit: they split into parts that fit (each repeating the
    rank / category column); only kernel names are shortened.
    """
    con = console_width(width, out)
    w_con = con.width
    findings = res.get("findings") or []
    if findings:
        con.print("[bold]Findings[/bold]")
        con.print(bullets([str(f) for f in findings]))
        con.print()
    buckets = res.get("buckets") or []
    title = "Where GPU time goes (exclusive; % of each rank's window)"
    if res.get("device_mode") == "cpu":
        title = "Where the forward threads' time goes (CPU mode: no GPU in this trace; % of each rank's window)"
    cols = [Col("rank", key=True), Col("window"), Col("busy")] + [Col(b) for b in buckets]
    rows: list[list[object]] = []
    styles: list[str | None] = []
    for r in res.get("ranks", []):
        w = r["window_ns"]
        rows.append([str(r["rank"]), fmt_ns(w), _pct(r["gpu_busy_ns"], w), *[_pct(r["time_ns"].get(b, 0), w) for b in buckets]])
        styles.append(None)
    o = res.get("overall") or {}
    if o and len(res.get("ranks", [])) > 1:
        w = o["window_ns"]
        rows.append(["all", fmt_ns(w), _pct(o["gpu_busy_ns"], w), *[_pct(o["time_ns"].get(b, 0), w) for b in buckets]])
        styles.append("bold")
    for t in fit_tables(title, cols, rows, w_con, row_styles=styles):
        con.print(t)
    moe = res.get("moe_detection") or {}
    if moe.get("status") == "not_detected":
        con.print("MoE split: not detected (no MoE structure recognized: its 0% above is no measurement; see Data quality)")
    elif moe.get("moe_gemm_range_pct"):
        lo, hi = moe["moe_gemm_range_pct"]
        con.print(f"MoE GEMM: {lo:.1f}-{hi:.1f}% of GPU-op time ({moe['ambiguous_pct']:.1f}% are GEMMs the launch pattern "
                  "cannot attribute, counted dense above; see Data quality)")
    win = res.get("window") or {}
    if win.get("trimmed_transient_ns"):
        con.print(f"window: trimmed the first {fmt_ns(win['trimmed_transient_ns'])} (profiler-start transient)")
    for sec in sections(res, w_con, fmt_ns):
        con.print(sec)
    tk = res.get("top_kernels") or {}
    if tk:
        cols = [Col("category", "text", key=True, min_width=8), Col("kernel", "text", key=True, max_width=70), Col("count"),
                Col("total"), Col("mean")]
        rows = [[cat if i == 0 else "", row["name"], str(row["count"]), fmt_ns(row["total_ns"]), fmt_ns(row["mean_ns"])]
                for cat, items in tk.items() for i, row in enumerate(items)]
        for t in fit_tables("Top kernels per category (all ranks)", cols, rows, w_con):
            con.print(t)
    unc = res.get("uncategorized_top") or []
    shown = {row["name"] for items in tk.values() for row in items}
    rest = [row for row in unc if row["name"] not in shown]  # a row of the table above is not repeated
    if rest:
        cols = [Col("kernel", "text", key=True, max_width=80), Col("count"), Col("total")]
        rows = [[row["name"], str(row["count"]), fmt_ns(row["total_ns"])] for row in rest[:5]]
        for t in fit_tables("Other uncategorized kernels (no rule matched; extend with --rules)", cols, rows, w_con):
            con.print(t)
    if unc and len(rest) < len(unc):
        con.print(f"{len(unc) - len(rest)} of the top kernels above matched no rule (counted other_compute; name them "
                  "with --rules)")
    q = res.get("quality") or []
    if q:
        con.print("[bold]Data quality[/bold]")
        lines = []
        for item in q:
            tag = item.get("severity", "warning")
            rk = f" (rank {item['rank']})" if item.get("rank") is not None else ""
            lines.append(Text(f"[{tag}] {item['code']}{rk}: {item['message']}"))
        con.print(bullets(lines, marker="-"))
