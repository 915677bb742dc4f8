"""Self-contained HTML page of a :class:`tracekit.compare.diff.DiffResult`.

No scripts, no external resources: inline CSS and inline SVG bars, so it opens
offline and cannot execute anything from a trace. Every string that comes from
a trace or a file name (labels, kernel names, collective names, quality
messages, verdict lines) goes through :func:`html.escape`.
"""

from __future__ import annotations

import html
from typing import Any

from tracekit.report._fmt import ms, num
from tracekit.report.palette import color_of

__all__ = ["render_html"]

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#1d1d1f;max-width:1200px}
h1{font-size:20px}h2{font-size:16px;margin-top:28px}
table{border-collapse:collapse;font-size:13px;margin:8px 0}
th,td{border-bottom:1px solid #e3e3e3;padding:4px 8px;text-align:right;vertical-align:top}
th{background:#f6f6f6}td.l,th.l{text-align:left}
td.k{text-align:left;font-family:ui-monospace,Menlo,monospace;font-size:12px;max-width:560px;word-break:break-all}
.up{color:#b3261e}.down{color:#1b7f3b}.note{color:#8a6d00}
ul.v li{margin:3px 0}.muted{color:#777;font-size:12px}
"""



def _e(v: Any) -> str:
    return html.escape(str(v), quote=True)


def _num(v: Any, digits: int = 3) -> str:
    return _e(num(v, digits))


_ms = ms


def _rel(v: float | None) -> str:
    if v is None:
        return "<td>—</td>"
    cls = "down" if v < 0 else "up" if v > 0 else ""
    return f'<td class="{cls}">{v * 100:+.1f}%</td>'


def _table(headers: list[str], rows: list[str], left: int = 1) -> str:
    th = "".join(f'<th class="l">{_e(h)}</th>' if i < left else f"<th>{_e(h)}</th>" for i, h in enumerate(headers))
    return f"<table><thead><tr>{th}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _bars(res: Any) -> str:
    """Two stacked horizontal bars (before, after) of exclusive time per bucket, same scale."""
    cats = res.categories.to_dicts()
    tot_b = sum(c["before_ns"] for c in cats)
    tot_a = sum(c["after_ns"] for c in cats)
    scale = max(tot_b, tot_a) or 1.0
    width, h = 900.0, 22
    parts = []
    for row_i, (label, key) in enumerate(((res.before.label, "before_ns"), (res.after.label, "after_ns"))):
        x = 0.0
        y = row_i * (h + 10)
        parts.append(f'<text x="0" y="{y + 15}" font-size="12">{_e(label)}</text>')
        for c in cats:
            w = c[key] / scale * width
            if w <= 0:
                continue
            color = color_of(c["bucket"])
            parts.append(
                f'<rect x="{160 + x:.1f}" y="{y}" width="{w:.1f}" height="{h}" fill="{color}">'
                f"<title>{_e(c['bucket'])}: {_ms(c[key])} ms</title></rect>"
            )
            x += w
    legend = " ".join(
        f'<span style="display:inline-block;width:10px;height:10px;background:{color_of(c["bucket"])}"></span>'
        f" {_e(c['bucket'])}"
        for c in cats if c["before_ns"] or c["after_ns"]
    )
    return (f'<svg width="{160 + width:.0f}" height="{2 * (h + 10)}" role="img" aria-label="time per category">'
            + "".join(parts) + f'</svg><div class="muted">{legend}</div>')


def render_html(res: Any) -> str:
    """The page as one string (caller writes it atomically)."""
    b, a = res.before.label, res.after.label
    unit = "ms/step" if res.basis == "per_step" else "ms"
    out = [
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">",
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">",
        f"<title>tracekit diff: {_e(b)} vs {_e(a)}</title><style>{_CSS}</style></head><body>",
        f"<h1>tracekit diff: {_e(b)} → {_e(a)}</h1>",
        f'<p class="muted">times in {_e(unit)}, mean over ranks; basis: {_e(res.basis)}</p>',
        '<h2>Verdict</h2><ul class="v">' + "".join(f"<li>{_e(v)}</li>" for v in res.verdict) + "</ul>",
        "<h2>Summary</h2>",
        _table(["metric", "unit", b, a, "Δ", "Δ%"], [
            f'<tr><td class="l">{_e(r["metric"])}</td><td class="l">{_e(r["unit"])}</td><td>{_num(r["before"])}</td>'
            f'<td>{_num(r["after"])}</td><td>{_num(r["delta"])}</td>{_rel(r["rel"])}</tr>'
            for r in res.scalars.to_dicts()
        ], left=2),
        f"<h2>Time per category ({_e(unit)}, exclusive)</h2>",
        _bars(res),
        _table(["bucket", b, a, "Δ", "Δ%", f"share {b} %", f"share {a} %"], [
            f'<tr><td class="l">{_e(r["bucket"])}</td><td>{_ms(r["before_ns"])}</td><td>{_ms(r["after_ns"])}</td>'
            f'<td>{_ms(r["delta_ns"])}</td>{_rel(r["rel"])}'
            f'<td>{_num(None if r["before_share"] is None else r["before_share"] * 100, 1)}</td>'
            f'<td>{_num(None if r["after_share"] is None else r["after_share"] * 100, 1)}</td></tr>'
            for r in res.categories.to_dicts() if r["before_ns"] or r["after_ns"]
        ]),
    ]
    if res.collectives.height:
        out.append(f"<h2>Collectives: transfer vs wait ({_e(unit)})</h2>")
        out.append(_table(["collective", f"calls {b}", f"calls {a}", f"transfer {b}", f"transfer {a}", f"wait {b}", f"wait {a}"], [
            f'<tr><td class="l">{_e(r["coll_name"])}</td><td>{_num(r["count_before"], 1)}</td><td>{_num(r["count_after"], 1)}</td>'
            f'<td>{_ms(r["transfer_ns_before"])}</td><td>{_ms(r["transfer_ns_after"])}</td>'
            f'<td>{_ms(r["wait_ns_before"])}</td><td>{_ms(r["wait_ns_after"])}</td></tr>'
            for r in res.collectives.to_dicts()
        ]))
    if res.kernels.height:
        out.append(f"<h2>Kernels whose time changed most ({_e(unit)})</h2>")
        out.append(_table(["match", "kernel", "category", b, a, "Δ", "Δ%"], [
            f'<tr><td class="l">{_e(r["match"])}</td><td class="k">{_e(r["name"])}</td><td class="l">{_e(r["category"])}</td>'
            f'<td>{_ms(r["before_ns"])}</td><td>{_ms(r["after_ns"])}</td><td>{_ms(r["delta_ns"])}</td>{_rel(r["rel"])}</tr>'
            for r in res.kernels.to_dicts()
        ], left=3))
    qs = res.notes()
    if qs:
        out.append("<h2>Data quality</h2><ul>" + "".join(
            f'<li class="note">[{_e(q.code)}]' + (f" ({_e(who)})" if who else "") + f' {_e(q.message)}</li>'
            for q, who in qs) + "</ul>")
    out.append("</body></html>\n")
    return "".join(out)
