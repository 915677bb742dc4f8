"""Terminal rendering of a :class:`tracekit.compare.diff.DiffResult` (rich tables, no computation)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.text import Text

from tracekit.report._fmt import Col, bullets, console_width, fit_tables, ms, num

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


def render_terminal(res: Any, console: Console | None = None, *, width: int | None = None) -> None:
    """Print verdict, scalars, categories, collectives and kernels. Lower is green (time); read tokens/s inversely.

    ``width``: columns when no ``console`` is given; default the real terminal's width (80 in a
    pipe or a file). Tables never cut a number: they split into parts that fit, each repeating
    the row's name; only kernel names are shortened.
    """
    con = console or console_width(width)
    w = con.width
    b, a = res.before.label, res.after.label
    unit = "ms/step" if res.basis == "per_step" else "ms"
    con.print(Text(f"tracekit diff: {b} → {a}  (times {unit}, mean over ranks)", style="bold"))
    if res.verdict:
        con.print(bullets(list(res.verdict)))
    rows: list[list[object]] = [[r["metric"], r["unit"], _f(r["before"]), _f(r["after"]), _f(r["delta"]), _rel(r["rel"])]
                                for r in res.scalars.to_dicts()]
    cols = [Col("metric", "text", key=True, min_width=10), Col("unit", "text", key=True, min_width=4), Col(b, wrap_header=True),
            Col(a, wrap_header=True), Col("Δ"), Col("Δ%")]
    for t in fit_tables("summary", cols, rows, w):
        con.print(t)
    rows = []
    for r in res.categories.to_dicts():
        if not (r["before_ns"] or r["after_ns"]):
            continue
        rows.append([r["bucket"], _ms(r["before_ns"]), _ms(r["after_ns"]), _ms(r["delta_ns"]), _rel(r["rel"]),
                     _f(None if r["before_share"] is None else r["before_share"] * 100, 1),
                     _f(None if r["after_share"] is None else r["after_share"] * 100, 1)])
    cols = [Col("bucket", "text", key=True, min_width=13), Col(b, wrap_header=True, group="t"),
            Col(a, wrap_header=True, group="t"), Col("Δ", group="t"), Col("Δ%", group="t"),
            Col(f"share {b}", wrap_header=True, group="s"), Col(f"share {a}", wrap_header=True, group="s")]
    for t in fit_tables(f"time per category ({unit}, exclusive)", cols, rows, w):
        con.print(t)
    if res.collectives.height:
        rows = [[str(r["coll_name"]), _f(r["count_before"], 1), _f(r["count_after"], 1), _ms(r["transfer_ns_before"]),
                 _ms(r["transfer_ns_after"]), _ms(r["wait_ns_before"]), _ms(r["wait_ns_after"])]
                for r in res.collectives.to_dicts()]
        cols = [Col("collective", "text", key=True, min_width=10)] + [
            Col(c, wrap_header=True, group=c.split()[0])
            for c in (f"calls {b}", f"calls {a}", f"transfer {b}", f"transfer {a}", f"wait {b}", f"wait {a}")]
        for t in fit_tables(f"collectives ({unit}): transfer vs wait", cols, rows, w):
            con.print(t)
    if res.kernels.height:
        rows = [[r["name"], _ms(r["before_ns"]), _ms(r["after_ns"]), _ms(r["delta_ns"]), _rel(r["rel"]), r["match"],
                 str(r["category"])] for r in res.kernels.to_dicts()]
        cols = [Col("kernel", "text", key=True, min_width=14, max_width=70), Col(b, wrap_header=True, group="t"),
                Col(a, wrap_header=True, group="t"), Col("Δ", group="t"), Col("Δ%", group="t"),
                Col("match", "text", min_width=8, group="m"), Col("category", "text", min_width=13, group="m")]
        for t in fit_tables(f"kernels whose time changed most ({unit})", cols, rows, w):
            con.print(t)
    qs = res.notes()
    if qs:
        con.print(bullets([Text(f"note [{q.code}]" + (f" ({who})" if who else "") + f": {q.message}",
                                style="yellow" if q.severity == "warning" else "dim") for q, who in qs], marker="-"))
