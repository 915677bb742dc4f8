"""The timeline page as a user first sees it (issue 30, item 17), in the real headless Chromium CI installs,
at 1366x768: the timeline above the fold (tables below), a legend on every line chart, labels that fit (none
cut at the page's edges, none overlapping another), name labels that pass WCAG AA on their segment, and time
axes whose unit scales (s for a long capture, never "17.5k ms"). Screenshots go to the artifacts folder."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from tracekit.report.palette import CATEGORY_COLORS, EXTRA_COLORS, contrast_ratio, text_color_on
from tracekit.report.timeline_html import build_payload, render_timeline
from tracekit.schema import frame_from_rows, read_trace

from ._util import BASE, chromium, MS, analysis_for, artifacts_dir, have_chromium, k, small_rows

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "tests/fixtures/gpu"
TRACES = Path(os.environ.get("TRACEKIT_TRACES", "/work/shared/traces"))
W, H = 1366, 768

browser = pytest.mark.skipif(not have_chromium(), reason="headless Chromium (/usr/bin/chromium) not installed")

# Injected into a copy of the page (CSP removed): once the figure is drawn, every text the figure shows
# (tick labels, legend entries, titles, annotations) and plotly's tool bar, as boxes in page pixels.
PROBE = """<script>
(function poll() {
  var T = window.tkTimeline;
  if (!T || !T.status.ok) { if (!T || !T.status.errors.length) { setTimeout(poll, 50); return; } }
  setTimeout(function () {
    var gd = T.gd, fl = gd._fullLayout, g = gd.getBoundingClientRect(), res = {status: T.status, texts: []};
    res.plot = {top: g.top, left: g.left, right: g.right, bottom: g.bottom};
    var det = T.detailAxis ? fl[T.detailAxis.y.replace('y', 'yaxis')] : null;
    res.detail_top = det ? g.top + det._offset : null;
    var lgs = Array.prototype.filter.call(document.querySelectorAll('.infolayer > g'), function (l) {
      return /^legend\\d*$/.test(l.getAttribute('class') || '');
    });
    res.legends = lgs.map(function (l) {
      return Array.prototype.map.call(l.querySelectorAll('text'), function (t) { return t.textContent; });
    });
    // every axis' ticks: plotly's classes are xtick, x2tick, y3tick, ... (one per axis id)
    var sel = 'g[class$="tick"] text, .infolayer text';
    document.querySelectorAll(sel).forEach(function (e) {
      var r = e.getBoundingClientRect(), t = e.textContent.trim();
      if (!t || r.width === 0) return;
      var tk = e.closest('g[class$="tick"]'), tc = tk ? tk.getAttribute('class') || '' : '';
      var kind = /^x\\d*tick$/.test(tc) ? 'xtick' : /^y\\d*tick$/.test(tc) ? 'ytick' : /^legend\\d*text$/.test(e.getAttribute('class') || '') ? 'legend' : 'title';
      res.texts.push({t: t, kind: kind, l: r.left, r: r.right, top: r.top, b: r.bottom});
    });
    var mb = document.querySelector('.modebar');
    if (mb) { var m = mb.getBoundingClientRect(); if (m.width) res.texts.push({t: '(tool bar)', kind: 'modebar', l: m.left, r: m.right, top: m.top, b: m.bottom}); }
    res.xticks = {};
    Object.keys(fl).forEach(function (key) {
      if (/^xaxis\\d*$/.test(key) && fl[key].showticklabels !== false) res.xticks[key] = (fl[key].ticktext || []).slice();
    });
    // zoom the overview to 2 ms late in the capture: the ticks follow (unit and decimals for the new range)
    var end = T.payload.span_ms;
    Plotly.relayout(gd, {'xaxis.range': [end - 2.5, end - 0.5]}).then(function () { return T.pending; }).then(function () {
      res.zoomed = (gd._fullLayout.xaxis.ticktext || []).slice();
    }).catch(function (e) { res.zoom_error = String(e); }).then(function () {
      var pre = document.createElement('pre'); pre.id = 'tk-layout'; pre.textContent = JSON.stringify(res);
      document.body.appendChild(pre);
    });
  }, 300);
})();
</script>"""


def _chromium(url: str, *args: str) -> str:
    return chromium(["--virtual-time-budget=30000", f"--window-size={W},{H}", *args], url)


def _layout(html: Path, shot: Path) -> dict[str, Any]:
    """The probe's result for ``html`` at 1366x768, and a screenshot of the first screen."""
    text = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", html.read_text())
    probe = html.with_name(html.stem + ".probe.html")
    probe.write_text(text.replace("</body>", PROBE + "</body>"))
    dom = _chromium(probe.resolve().as_uri(), "--dump-dom")
    m = re.search(r'<pre id="tk-layout">(.*?)</pre>', dom, re.S)
    assert m, "the probe did not report (page script failed?)"
    import html as _h

    _chromium(html.resolve().as_uri(), f"--screenshot={shot}")
    assert shot.exists() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return json.loads(_h.unescape(m.group(1)))


def _overlaps(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return min(a["r"], b["r"]) - max(a["l"], b["l"]) > 1 and min(a["b"], b["b"]) - max(a["top"], b["top"]) > 1


def _check_layout(res: dict[str, Any]) -> None:
    st = res["status"]
    assert st["ok"] and st["errors"] == [], st["errors"]
    # above the fold: the figure starts near the top and at least 150 px of detail lanes show on the first screen
    assert res["plot"]["top"] < 200, res["plot"]
    assert res["detail_top"] is not None and res["detail_top"] < H - 150, res["detail_top"]
    texts = res["texts"]
    assert texts
    for t in texts:  # nothing cut at the figure's or the screen's edges
        assert t["l"] >= res["plot"]["left"] - 1 and t["r"] <= min(res["plot"]["right"], W) + 1, t
    bad = [(a["t"], b["t"]) for i, a in enumerate(texts) for b in texts[i + 1:] if _overlaps(a, b)]
    assert not bad, bad[:10]
    # units that scale: never "k ms", one unit per axis
    for key, ticks in res["xticks"].items():
        assert ticks and not any(re.search(r"\dk\b|e[+-]\d", t) for t in ticks), (key, ticks)
        assert len({t.rsplit(" ", 1)[-1] for t in ticks}) == 1, (key, ticks)


def _shot(tmp_path: Path, name: str) -> Path:
    p = artifacts_dir(tmp_path) / f"timeline_{name}_1366x768.png"
    p.unlink(missing_ok=True)
    return p


@browser
@pytest.mark.browser
def test_small_page_layout_legends_and_fold(small_df: pl.DataFrame, tmp_path: Path):
    out = tmp_path / "small.html"
    render_timeline(small_df, {}, analysis_for(small_df), out, window="0ms:9ms")
    res = _layout(out, _shot(tmp_path, "small"))
    _check_layout(res)
    # the main legend (categories, steps, ranges) and one legend per counter chart under the lanes
    payload = build_payload(small_df, {}, analysis_for(small_df), window="0ms:9ms")
    groups = {c["group"] for c in payload["counters_window"]}
    assert groups and len(res["legends"]) == 1 + len(groups), res["legends"]
    assert all(lg and all(re.match(r"r[01] \w+", t) for t in lg) for lg in res["legends"][1:]), res["legends"]
    # the tables come after the timeline in the page
    html = out.read_text()
    assert html.index("id=tk-plot") < html.index("<h2>Breakdown</h2>") < html.index("<h2>Top kernels</h2>")


@browser
@pytest.mark.browser
def test_long_capture_axis_reads_seconds(tmp_path: Path):
    rows = small_rows() + [k(r, 7, 20_000_000 + i * 1000.0, 400, "late_kernel", "moe_gemm") for r in (0, 1) for i in range(5)]
    df = frame_from_rows(rows)
    out = tmp_path / "long.html"
    render_timeline(df, {}, None, out)
    res = _layout(out, _shot(tmp_path, "long"))
    _check_layout(res)
    over = res["xticks"]["xaxis"]
    assert over[-1].endswith(" s") and "20 s" in over, over  # was "17.5k ms"-style labels
    zoomed = res["zoomed"]  # 2 ms at ~20 s: seconds with the decimals a sub-millisecond step needs
    assert zoomed and all(re.fullmatch(r"20\.\d{4,6} s", t) for t in zoomed), zoomed


@browser
@pytest.mark.browser
@pytest.mark.parametrize("name", ["straggler", "grouped"])
def test_real_gpu_capture_layout(tmp_path: Path, name: str):
    df, meta = read_trace(GPU / f"{name}.trace.parquet")
    from tracekit import api

    out = tmp_path / f"{name}.html"
    render_timeline(df, meta, api.analyze(GPU / f"{name}.trace.parquet"), out)
    _check_layout(_layout(out, _shot(tmp_path, name)))


@browser
@pytest.mark.browser
def test_cpu_capture_layout(cpu_capture: Path, tmp_path: Path):
    """gloo lanes of a CPU-mode capture: every lane label whole (they were cut at 140 px)."""
    df, meta = read_trace(cpu_capture)
    from tracekit import api

    out = tmp_path / "cpu.html"
    render_timeline(df, meta, api.analyze(cpu_capture), out)
    res = _layout(out, _shot(tmp_path, "cpu"))
    _check_layout(res)
    lanes = [t["t"] for t in res["texts"] if t["kind"] == "ytick"]
    assert any("gloo" in t for t in lanes), lanes


@browser
@pytest.mark.browser
@pytest.mark.skipif(not (TRACES / "nsys/nsys-ai/h100_2gpu_1s.sqlite").exists(), reason="shared traces not available")
def test_nsys_copy_bound_layout(tmp_path: Path):
    from tracekit import api
    from tracekit.ingest.convert import convert

    t = tmp_path / "h100.parquet"
    convert([TRACES / "nsys/nsys-ai/h100_2gpu_1s.sqlite"], t)
    df, meta = read_trace(t)
    out = tmp_path / "h100.html"
    render_timeline(df, meta, api.analyze(t), out)
    res = _layout(out, _shot(tmp_path, "nsys_h100"))
    _check_layout(res)
    assert res["status"].get("labels", 0) > 0  # the copies' names are drawn on their segments
    assert set(res["status"]["label_colors"]) <= {"#000000", "#ffffff"}


def test_label_colours_pass_wcag_aa():
    """Every category colour gets the text colour with the higher contrast, which reaches AA (4.5:1)."""
    for bg in [*CATEGORY_COLORS.values(), *EXTRA_COLORS, "#bbbbbb"]:
        fg = text_color_on(bg)
        assert contrast_ratio(fg, bg) >= 4.5, (bg, fg, contrast_ratio(fg, bg))
    assert contrast_ratio("#ffffff", CATEGORY_COLORS["memory"]) < 4.5  # white on the copies' orange failed AA
    assert text_color_on(CATEGORY_COLORS["memory"]) == "#000000"
    assert contrast_ratio("#616161", "#ffffff") >= 4.5 and contrast_ratio("#777777", "#ffffff") < 4.5  # the notes' grey


def test_payload_carries_label_colours(small_df: pl.DataFrame):
    p = build_payload(small_df, {}, None, window="0ms:9ms")
    assert p["label_colors"] == [text_color_on(c) for c in p["colors"]]


_ = (BASE, MS)
