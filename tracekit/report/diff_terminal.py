"""Terminal rendering of a :class:`tracekit.analysis.diff.DiffResult` (rich tables, no computation)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from tracekit.report._fmt import ms, num

__all__ = ["render_terminal"]


_f = num


def _rel(v: float | None) -> Text:
    if v is None:
        return Text("—")
    style = "green" if v < 0 else "red" if v > 0 else ""
    return Text(f"{v * 100:+.1f}%", style=style)


def _short(name: str, n: int = 70) -> str:
    return name if len(name) <= n else name[: n - 1] + "…"


_ms = ms


def render_terminal(res: Any, console: Console | None = None) -> None:
    """Print verdict, scalars, categories, collectives and kernels. Lower is green (time); read tokens/s inversely."""
    con = console or Console()
    b, a = res.before.label, res.after.label
    unit = "ms/step" if res.basis == "per_step" else "ms"
    con.print(Text(f"tracekit diff: {b} → {a}  (times {unit}, mean over ranks)", style="bold"))
    for line in res.verdict:
        con.print(Text("• " + line))
    t = Table(title="summary", title_justify="left")
    for c in ("metric", "unit", b, a, "Δ", "Δ%"):
        t.add_column(Text(c), justify="left" if c in ("metric", "unit") else "right")
    for r in res.scalars.to_dicts():
        t.add_row(r["metric"], r["unit"], _f(r["before"]), _f(r["after"]), _f(r["delta"]), _rel(r["rel"]))
    con.print(t)
    t = Table(title=f"time per category ({unit}, exclusive)", title_justify="left")
    for c in ("bucket", b, a, "Δ", "Δ%", f"share {b}", f"share {a}"):
        t.add_column(Text(c), justify="left" if c == "bucket" else "right")
    for r in res.categories.to_dicts():
        if not (r["before_ns"] or r["after_ns"]):
            continue
        t.add_row(r["bucket"], _ms(r["before_ns"]), _ms(r["after_ns"]), _ms(r["delta_ns"]), _rel(r["rel"]),
                  _f(None if r["before_share"] is None else r["before_share"] * 100, 1),
                  _f(None if r["after_share"] is None else r["after_share"] * 100, 1))
    con.print(t)
    if res.collectives.height:
        t = Table(title=f"collectives ({unit}): transfer vs wait", title_justify="left")
        for c in ("collective", f"calls {b}", f"calls {a}", f"transfer {b}", f"transfer {a}", f"wait {b}", f"wait {a}"):
            t.add_column(Text(c), justify="left" if c == "collective" else "right")
        for r in res.collectives.to_dicts():
            t.add_row(Text(str(r["coll_name"])), _f(r["count_before"], 1), _f(r["count_after"], 1),
                      _ms(r["transfer_ns_before"]), _ms(r["transfer_ns_after"]), _ms(r["wait_ns_before"]),
                      _ms(r["wait_ns_after"]))
        con.print(t)
    if res.kernels.height:
        t = Table(title=f"kernels whose time changed most ({unit})", title_justify="left")
        for c in ("match", "kernel", "category", b, a, "Δ", "Δ%"):
            t.add_column(Text(c), justify="right" if c in (b, a, "Δ", "Δ%") else "left",
                         overflow="ellipsis" if c == "kernel" else "fold", no_wrap=c == "kernel",
                         max_width=70 if c == "kernel" else None)
        for r in res.kernels.to_dicts():
            t.add_row(r["match"], Text(_short(r["name"])), Text(str(r["category"])), _ms(r["before_ns"]), _ms(r["after_ns"]),
                      _ms(r["delta_ns"]), _rel(r["rel"]))
        con.print(t)
    qs = list(res.quality) + list(res.before.quality) + list(res.after.quality)
    for q in qs:
        con.print(Text(f"note [{q.code}]: {q.message}", style="yellow" if q.severity == "warning" else "dim"))
