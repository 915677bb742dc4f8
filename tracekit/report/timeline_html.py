"""Self-contained, offline timeline HTML: analysis summary, whole-capture overview, detail lanes.

``render_timeline(df, meta, analysis, out)`` writes ONE HTML file (plotly.js
inlined, no CDN, a Content-Security-Policy that forbids network access) with

* the analysis summary (breakdown per rank, findings, stalls, quality flags)
  taken from the ``tracekit.api.analyze`` dict — every key optional;
* an overview of the whole capture: per rank × category busy share in ~3000
  time bins (heat map) and counter rows (power, SM activity, PCIe GB/s);
* detail lanes for a window: per rank a step row, NVTX/record_function range
  rows and one lane per (device, stream); kernels as WebGL segments in their
  category's colour with hover (name, category, duration, launch config, step,
  collective wait/transfer); collective instances linked across ranks at their
  release time; stall markers; PCIe-bound phases shaded. At most
  ``max_segments`` ops are drawn exactly; the rest are folded into per-lane bins.

Every trace string is HTML-escaped in Python (:func:`~tracekit.report.timeline_data.esc`);
the payload JSON is embedded with ``<``, ``>``, ``&`` escaped so it cannot close
its script element.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Mapping

import polars as pl

from tracekit import __version__
from tracekit._errors import OutputError
from tracekit.report.timeline_data import (
    analysis_events,
    capture_bounds,
    category_list,
    choose_window,
    chooser_entries,
    data_window,
    colors_for,
    counter_overview,
    counter_payload,
    esc,
    gpu_ops,
    key_counter_expr,
    overview_payload,
    profiled_spans,
    profiler_windows,
)
from tracekit.report.palette import text_color_on
from tracekit.report.timeline_detail import MAX_SEGMENTS, detail_payload
from tracekit.report.timeline_js import TIMELINE_CSS, TIMELINE_JS
from tracekit.schema import atomic_path

__all__ = ["render_timeline", "build_payload", "build_html", "plotly_js"]

_NEEDED = {
    "rank": pl.Int32, "kind": pl.String, "ts_ns": pl.Int64, "dur_ns": pl.Int64, "device": pl.Int32,
    "stream": pl.Int64, "name": pl.String, "category": pl.String, "grid_x": pl.Int32, "grid_y": pl.Int32,
    "grid_z": pl.Int32, "block_x": pl.Int32, "block_y": pl.Int32, "block_z": pl.Int32,
    "registers_per_thread": pl.Int32, "shared_mem_bytes": pl.Int64, "bytes": pl.Int64, "memcpy_kind": pl.String,
    "pg_name": pl.String, "coll_seq": pl.Int64, "step_id": pl.Int64, "step_mode": pl.String,
    "batch_size": pl.Int32, "tokens": pl.Int64, "profiled": pl.Boolean, "value": pl.Float64, "tid": pl.Int64,
    "launch_ts_ns": pl.Int64, "family": pl.String,
}

#: columns the timeline reads (pass to ``scan_trace(...).select`` to save memory)
COLUMNS = list(_NEEDED)


def plotly_js() -> str:
    """The plotly.js bundle shipped inside the plotly Python package (no network)."""
    from plotly.offline import get_plotlyjs

    js: str = get_plotlyjs()
    return js


def _prep(df: pl.DataFrame) -> pl.DataFrame:
    have = set(df.columns)
    return df.select([pl.col(c) if c in have else pl.lit(None, dtype=t).alias(c) for c, t in _NEEDED.items()])


def build_payload(
    df: pl.DataFrame,
    meta: Mapping[str, Any] | None,
    analysis: Mapping[str, Any] | None = None,
    *,
    window: tuple[int, int] | str | None = None,
    step: int | None = None,
    max_segments: int = MAX_SEGMENTS,
    overview_bins: int = 3000,
    all_counters: bool = False,
) -> dict[str, Any]:
    """Everything the page draws, as a JSON-able dict (pure; no IO).

    Counter rows show power, SM / tensor activity and PCIe throughput unless ``all_counters``.
    """
    df = _prep(df)
    cdf = df if all_counters else df.filter((pl.col("kind") != "counter") | key_counter_expr())
    analysis = analysis or {}
    base, end = capture_bounds(df, meta)
    ops = gpu_ops(df)
    cats = category_list(ops)
    ranks = sorted(set(df.get_column("rank").unique().to_list()))
    stalls = analysis_events(analysis.get("stalls"))
    pcie = analysis_events(analysis.get("pcie_phases"))
    given = analysis.get("profiled_spans")
    spans = [(int(a), int(b)) for a, b in given] if given else profiled_spans(df, meta)
    windowed = len(profiler_windows(meta)) >= 2
    w = choose_window(df, ops, base, end, window=window, step=step, spans=spans, windowed=windowed)
    data = w if (window is not None or step is not None) else data_window(ops, spans, w, max_segments)
    stalls_all = sorted(stalls, key=lambda s: -s["dur_ns"])[:2000]
    overview = overview_payload(ops, cats, ranks, base, end, bins=overview_bins)
    detail = detail_payload(df, ops, cats, base, data, analysis=analysis, stalls=stalls, pcie=pcie,
                            max_segments=max_segments)
    detail["reason"] = esc(w.reason)
    detail["v0_ms"], detail["v1_ms"] = (w.start_ns - base) / 1e6, (w.end_ns - base) / 1e6
    return {
        "version": 1,
        "base_ns": str(base),
        "span_ms": (end - base) / 1e6,
        "cats": [esc(c) for c in cats],
        "colors": colors_for(cats),
        "label_colors": [text_color_on(c) for c in colors_for(cats)],
        "ranks": ranks,
        "overview": overview,
        "counters": counter_overview(cdf, base, end, overview["nbins"]),
        "counters_window": counter_payload(cdf, base, data.start_ns, data.end_ns, points=4000),
        "detail": detail,
        "spans_ms": [[(a - base) / 1e6, (b - base) / 1e6] for a, b in spans],
        "chooser": chooser_entries(df, spans, base, data, windowed=windowed, stalls=stalls),
        "stalls_all": [{"rank": s["rank"], "t_ms": (s["start_ns"] - base) / 1e6, "d_ms": s["dur_ns"] / 1e6,
                        "label": s["label"], "detail": s["detail"]} for s in stalls_all],
        "_stalls": stalls_all,
        "_window": w,
        "_data": data,
        "_view_ops": int(ops.filter((pl.col("ts_ns") < w.end_ns) & ((pl.col("ts_ns") + pl.col("dur_ns")) > w.start_ns)).height),
        "_base": base,
        "_end": end,
    }


# ------------------------------------------------------------------ summary HTML
def _fmt_ms(ns: float) -> str:
    return f"{ns / 1e6:,.3f}"


def _window_len(v: Any) -> float | None:
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, (list, tuple)) and len(v) == 2 and all(isinstance(x, (int, float)) for x in v):
        return float(v[1] - v[0])
    return None


def _breakdown_html(analysis: Mapping[str, Any], cats: list[str], colors: list[str]) -> str:
    ranks = analysis.get("ranks")
    if not isinstance(ranks, list) or not ranks:
        return "<p class=note>No breakdown (run with an analysis to see per-rank category shares).</p>"
    keys: list[str] = []
    for r in ranks:
        t0 = r.get("time_ns") if isinstance(r, Mapping) else None
        if isinstance(t0, Mapping):
            for k in t0:
                if k not in keys:
                    keys.append(str(k))
    order = [c for c in cats if c in keys] + [k for k in keys if k not in cats and k != "idle"]
    if "idle" in keys:
        order.append("idle")
    color = dict(zip(cats, colors))
    head = "".join(
        f"<th><span class=chip style='background:{color.get(k, '#fff' if k == 'idle' else '#999')}'></span>{esc(k)}</th>"
        for k in order)
    rows = []
    for r in ranks:
        if not isinstance(r, Mapping):
            continue
        tn = r.get("time_ns")
        t: Mapping[str, Any] = tn if isinstance(tn, Mapping) else {}
        win = _window_len(r.get("window_ns")) or float(sum(v for v in t.values() if isinstance(v, (int, float)))) or 1.0
        cells = []
        for k in order:
            v = t.get(k)
            cells.append(f"<td title='{_fmt_ms(v)} ms'>{100 * v / win:.1f}%<br><small>{_fmt_ms(v)} ms</small></td>"
                         if isinstance(v, (int, float)) else "<td></td>")
        rows.append(f"<tr><td>{esc(r.get('rank', ''))}</td><td>{_fmt_ms(win)}</td>{''.join(cells)}</tr>")
    return (f"<table><tr><th>rank</th><th>window ms</th>{head}</tr>{''.join(rows)}</table>"
            "<p class=note>share of each rank's analysis window and its time (exclusive time per category)</p>")


def _findings_html(analysis: Mapping[str, Any]) -> str:
    f = analysis.get("findings")
    if not isinstance(f, list) or not f:
        return ""
    items = []
    for x in f[:10]:
        text = x.get("message", x.get("text", json.dumps(x, default=str))) if isinstance(x, Mapping) else x
        items.append(f"<li>{esc(text)}</li>")
    return f"<h2>Top findings</h2><ol>{''.join(items)}</ol>"


def _short_name(name: str, n: int = 160) -> str:
    """A long template-heavy kernel name shortened for the table (the full name is the cell's tooltip)."""
    return name if len(name) <= n else name[: n - 1] + "…"


def _top_kernels_html(analysis: Mapping[str, Any]) -> str:
    tk = analysis.get("top_kernels")
    if not isinstance(tk, Mapping) or not tk:
        return ""
    rows = []
    for cat, items in tk.items():
        for it in (items or [])[:3] if isinstance(items, list) else []:
            if isinstance(it, Mapping) and isinstance(it.get("total_ns"), (int, float)):
                rows.append((float(it["total_ns"]), str(cat), it))
    rows.sort(key=lambda r: -r[0])
    body = "".join(
        f"<tr><td class=name title='{esc(it.get('name', ''))}'>{esc(_short_name(str(it.get('name', ''))))}</td>"
        f"<td class=l>{esc(cat)}</td><td>{esc(it.get('count', ''))}</td>"
        f"<td>{_fmt_ms(tot)}</td><td>{(it.get('mean_ns') or 0) / 1e3:,.1f}</td></tr>"
        for tot, cat, it in rows[:10])
    return ("<h2>Top kernels</h2><table><tr><th class=l>kernel</th><th class=l>category</th><th>count</th>"
            f"<th>total ms</th><th>mean µs</th></tr>{body}</table>")


def _stalls_html(stalls: list[dict[str, Any]], base: int) -> str:
    if not stalls:
        return ""
    rows = []
    for s in stalls[:10]:
        t0, t1 = (s["start_ns"] - base) / 1e6, (s["end_ns"] - base) / 1e6
        pad = max(s["dur_ns"], 1_000_000)
        wtxt = f"{max(s['start_ns'] - pad - base, 0) / 1e9:.6f}s:{(s['end_ns'] + pad - base) / 1e9:.6f}s"
        rows.append(
            f"<tr class=jump data-t0='{t0:.6f}' data-t1='{t1:.6f}'><td>{t0 / 1e3:.6f}</td>"
            f"<td>{'' if s['rank'] is None else s['rank']}</td><td>{s['dur_ns'] / 1e6:.3f}</td>"
            f"<td class=l>{s['label']}</td><td class=l>{s['detail']}</td><td class=l><code>--window {wtxt}</code></td></tr>")
    return ("<h2>Worst stalls</h2><p class=note>click a row to zoom the detail lanes to it <span id=tk-jump-note></span></p>"
            "<table><tr><th>t (s)</th><th>rank</th><th>wait ms</th><th class=l>cause</th><th class=l>detail</th>"
            f"<th class=l>detail window</th></tr>{''.join(rows)}</table>")


def _quality_html(analysis: Mapping[str, Any], meta: Mapping[str, Any]) -> str:
    q = analysis.get("quality") or meta.get("quality") or []
    if not isinstance(q, list) or not q:
        return ""
    items = []
    for x in q[:30]:
        if isinstance(x, Mapping):
            items.append(f"<li><code>{esc(x.get('code', ''))}</code> {esc(x.get('message', ''))}</li>")
        else:
            items.append(f"<li>{esc(x)}</li>")
    return f"<h2>Data quality</h2><ul>{''.join(items)}</ul>"


def _header_html(meta: Mapping[str, Any], payload: Mapping[str, Any], title: str) -> str:
    ranks = payload["ranks"]
    gpus = []
    for r in meta.get("ranks") or []:
        if isinstance(r, Mapping) and r.get("device_name"):
            gpus.append(str(r["device_name"]))
    gpu = f" · {esc(sorted(set(gpus))[0])}" if len(set(gpus)) == 1 else (f" · {len(set(gpus))} GPU types" if gpus else "")
    det = payload["detail"]
    k = det["kernels"]
    fold = f", {det['folded']['n_ops']:,} short ops folded" if det.get("folded") else ""
    v0, v1 = det.get("v0_ms", det["x0_ms"]), det.get("v1_ms", det["x1_ms"])
    emb = (f"; zoom and the window chooser reach {det['x0_ms'] / 1e3:.3f}–{det['x1_ms'] / 1e3:.3f} s"
           if (det["x0_ms"], det["x1_ms"]) != (v0, v1) else "")
    legend = "".join(f"<span><span class=chip style='background:{c}'></span>{n}</span>"
                     for n, c in zip(payload["cats"], payload["colors"]))
    return (
        f"<h1>tracekit timeline — {esc(title)}</h1>"
        f"<div class=meta>{len(ranks)} rank(s){gpu} · capture {payload['span_ms'] / 1e3:.3f} s · "
        f"detail window {v0 / 1e3:.6f}–{v1 / 1e3:.6f} s ({det['reason']}; "
        f"{payload.get('_view_ops', k['n']):,} ops in view, {k['n']:,} ops embedded{fold}{emb}) · tracekit {esc(__version__)}</div>"
        f"<div class='legend meta'>{legend}</div>"
    )


def _chooser_html(payload: Mapping[str, Any]) -> str:
    """The window chooser: profiler windows, profiled steps and worst stalls (labels already escaped)."""
    entries = payload.get("chooser") or []
    if not entries:
        return ""
    det = payload["detail"]
    v0, v1 = det.get("v0_ms", det["x0_ms"]), det.get("v1_ms", det["x1_ms"])
    groups = {"window": "profiler windows", "step": "profiled steps", "stall": "worst stalls"}
    parts = ["<option value='' data-t0='%.6f' data-t1='%.6f' data-inside=1 data-flag=''>the representative view "
             "(%.3f–%.3f s)</option>" % (v0, v1, v0 / 1e3, v1 / 1e3)]
    for kind, title in groups.items():
        items = [e for e in entries if e["kind"] == kind]
        if not items:
            continue
        opts = "".join(
            f"<option data-t0='{e['t0']:.6f}' data-t1='{e['t1']:.6f}' data-inside={1 if e['inside'] else 0} "
            f"data-flag='{esc(e['flag'])}'>{e['label']}{'' if e['inside'] else ' (re-run with --window)'}</option>"
            for e in items)
        parts.append(f"<optgroup label='{esc(title)} ({len(items)})'>{opts}</optgroup>")
    n_win = sum(1 for e in entries if e["kind"] == "window")
    n_st = sum(1 for e in entries if e["kind"] == "step")
    return (f"<div class=chooser><label>Detail view: <select id=tk-chooser>{''.join(parts)}</select></label> "
            f"<span class=note>{n_win} profiled span(s), {n_st} profiled step(s)</span> "
            "<span id=tk-chooser-note class=note></span></div>")


def _json_for_script(obj: Any) -> str:
    s = json.dumps(obj, separators=(",", ":"), allow_nan=False, default=str)
    return (s.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def _sha(script: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode() + "'"


def build_html(payload: Mapping[str, Any], meta: Mapping[str, Any] | None, analysis: Mapping[str, Any] | None,
               *, title: str = "trace") -> str:
    """The page as one string: CSP, inline plotly.js, summary tables, payload, page script."""
    meta = meta or {}
    analysis = analysis or {}
    pub = {k: v for k, v in payload.items() if not k.startswith("_")}
    pjs = plotly_js().replace("</script", "<\\/script")
    data = _json_for_script(pub)
    csp = ("default-src 'none'; script-src " + _sha(pjs) + " " + _sha(TIMELINE_JS)
           + " 'unsafe-eval'; style-src 'unsafe-inline'; img-src data: blob:; font-src data:; connect-src 'none'")
    # the timeline first (above the fold), the tables below it
    below = [
        "<div class=cols><div>",
        "<h2>Breakdown</h2>",
        _breakdown_html(analysis, [*payload["cats"]], payload["colors"]),
        "</div><div>", _findings_html(analysis), "</div></div>",
        _top_kernels_html(analysis),
        _stalls_html(payload.get("_stalls") or [], int(payload.get("_base") or 0)),
        _quality_html(analysis, meta),
    ]
    return "".join([
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">',
        "<meta name=viewport content='width=device-width'>",
        f"<title>tracekit timeline — {esc(title)}</title><style>{TIMELINE_CSS}</style></head><body>",
        _header_html(meta, payload, title),
        _chooser_html(payload),
        "<div id=tk-plot></div><pre id=tk-status></pre>",
        "<p class=note>Drag to zoom (x only), double-click to reset; hover a segment for details. "
        "Overview: shade = share of the bin in which the category ran. Detail: light red = collective wait "
        "(before the last rank arrived), dark links = the same collective instance on every rank at its release.</p>",
        *below,
        f'<script type="application/json" id="tk-data">{data}</script>',
        f"<script>{pjs}</script>",
        f"<script>{TIMELINE_JS}</script>",
        "</body></html>",
    ])


def render_timeline(
    df: pl.DataFrame,
    meta: Mapping[str, Any] | None,
    analysis: Mapping[str, Any] | None,
    out: str | os.PathLike[str],
    window: tuple[int, int] | str | None = None,
    step: int | None = None,
    *,
    force: bool = False,
    max_segments: int = MAX_SEGMENTS,
    title: str | None = None,
    all_counters: bool = False,
) -> dict[str, Any]:
    """Write the timeline HTML atomically; returns a small summary (path, bytes, window, ops drawn/folded).

    ``window``: (start, end) ns relative to the capture start, or text like
    ``"12.30s:12.45s"``; ``step``: a step id. Refuses to overwrite ``out``
    unless ``force``.
    """
    out = Path(out)
    if out.suffix.lower() not in (".html", ".htm"):
        raise OutputError(f"{out}: the timeline is HTML; name the output *.html")
    payload = build_payload(df, meta, analysis, window=window, step=step, max_segments=max_segments,
                            all_counters=all_counters)
    html = build_html(payload, meta, analysis, title=title or out.stem)
    with atomic_path(out, force=force) as tmp:
        tmp.write_text(html, encoding="utf-8")
    det = payload["detail"]
    w = payload["_window"]
    return {"path": str(out), "bytes": len(html.encode("utf-8")), "window_ns": [w.start_ns, w.end_ns],
            "window_reason": w.reason, "ops_in_view": payload["_view_ops"], "ops_embedded": det["kernels"]["n"],
            "ops_folded": det["folded"]["n_ops"] if det.get("folded") else 0, "lanes": len(det["lanes"])}

