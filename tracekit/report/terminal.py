"""Rich terminal rendering of the analyze result (no computation here)."""

from __future__ import annotations

from typing import Any, TextIO

from rich.console import Console
from rich.table import Table

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
    """Findings first, then the breakdown per rank, top kernels, sections from cross-rank analysis, quality."""
    con = Console(file=out, width=width or 120, highlight=False, soft_wrap=False)
    findings = res.get("findings") or []
    if findings:
        con.print("[bold]Findings[/bold]")
        for f in findings:
            con.print(f"  • {f}", markup=False)
        con.print()
    buckets = res.get("buckets") or []
    title = "Where GPU time goes (exclusive; % of each rank's window)"
    if res.get("device_mode") == "cpu":
        title = "Where the forward threads' time goes (CPU mode: no GPU in this trace; % of each rank's window)"
    t = Table(title=title, show_lines=False)
    t.add_column("rank", justify="right")
    t.add_column("window", justify="right")
    t.add_column("busy", justify="right")
    for b in buckets:
        t.add_column(b, justify="right")
    for r in res.get("ranks", []):
        w = r["window_ns"]
        t.add_row(str(r["rank"]), fmt_ns(w), _pct(r["gpu_busy_ns"], w), *[_pct(r["time_ns"].get(b, 0), w) for b in buckets])
    o = res.get("overall") or {}
    if o and len(res.get("ranks", [])) > 1:
        w = o["window_ns"]
        t.add_row("all", fmt_ns(w), _pct(o["gpu_busy_ns"], w), *[_pct(o["time_ns"].get(b, 0), w) for b in buckets], style="bold")
    con.print(t)
    win = res.get("window") or {}
    if win.get("trimmed_transient_ns"):
        con.print(f"window: trimmed the first {fmt_ns(win['trimmed_transient_ns'])} (profiler-start transient)")
    tk = res.get("top_kernels") or {}
    if tk:
        kt = Table(title="Top kernels per category (all ranks)")
        for c in ("category", "kernel", "count", "total", "mean"):
            kt.add_column(c, justify="right" if c in ("count", "total", "mean") else "left", overflow="ellipsis", no_wrap=True, max_width=70 if c == "kernel" else None)
        for cat, rows in tk.items():
            for i, row in enumerate(rows):
                kt.add_row(cat if i == 0 else "", row["name"], str(row["count"]), fmt_ns(row["total_ns"]), fmt_ns(row["mean_ns"]))
        con.print(kt)
    unc = res.get("uncategorized_top") or []
    if unc:
        ut = Table(title="Top uncategorized kernels (no rule matched; extend with --rules)")
        ut.add_column("kernel", overflow="ellipsis", no_wrap=True, max_width=80)
        ut.add_column("count", justify="right")
        ut.add_column("total", justify="right")
        for row in unc[:5]:
            ut.add_row(row["name"], str(row["count"]), fmt_ns(row["total_ns"]))
        con.print(ut)
    for sec in res.get("_terminal_sections", []) or []:
        con.print(sec, markup=False)
    q = res.get("quality") or []
    if q:
        con.print("[bold]Data quality[/bold]")
        for item in q:
            tag = item.get("severity", "warning")
            rk = f" (rank {item['rank']})" if item.get("rank") is not None else ""
            con.print(f"  [{tag}] {item['code']}{rk}: {item['message']}", markup=False)
