"""Real-browser tests: headless Chromium (Debian ``chromium``) loads the page, no JS errors, the
expected lanes are drawn, a screenshot is kept, and a hostile kernel name shows as text only."""

from __future__ import annotations

import re

import pytest

from tracekit.report.timeline_data import esc
from tracekit.report.timeline_html import render_timeline

from ._util import XSS, analysis_for, artifacts_dir, have_chromium, pre_json, run_page

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not have_chromium(), reason="headless Chromium (/usr/bin/chromium) not installed")]

LANES = ["r0 steps", "r0 ranges", "r0 ranges d1", "r0 dev0 s7", "r0 dev0 s20",
         "r1 steps", "r1 ranges", "r1 ranges d1", "r1 dev1 s7", "r1 dev1 s20"]

# Injected into a copy of the page (with the CSP removed, so only escaping protects it): records
# alert() calls, hovers the hostile kernel, and reports what the hover label and the DOM contain.
PROBE = """<script>
window.__tk_alerted = 0;
window.alert = function () { window.__tk_alerted += 1; };
(function poll() {
  var T = window.tkTimeline;
  if (!T || !T.status.ok) { if (!T || !T.status.errors.length) { setTimeout(poll, 50); return; } }
  var res = {status_ok: T.status.ok, hits: 0, hover: '', imgs: 0, alerted: 0, body_has_text: false};
  try {
    var hits = T.opsNamed(%(esc)s);
    res.hits = hits.length;
    if (hits.length) {
      Plotly.Fx.hover(T.gd, {xval: hits[0].x, yval: hits[0].y}, T.detailAxis.x + T.detailAxis.y);
      var hl = document.querySelector('.hoverlayer');
      res.hover = hl ? hl.textContent : '';
    }
  } catch (e) { res.error = String(e); }
  setTimeout(function () {
    res.imgs = document.querySelectorAll('img').length;
    res.alerted = window.__tk_alerted;
    res.body_has_text = document.body.textContent.indexOf(%(raw)s) >= 0;
    var pre = document.createElement('pre'); pre.id = 'tk-xss'; pre.textContent = JSON.stringify(res);
    document.body.appendChild(pre);
  }, 500);
})();
</script>"""


@pytest.fixture
def page(small_df, tmp_path):
    out = tmp_path / "timeline.html"
    render_timeline(small_df, {}, analysis_for(small_df), out, window="0ms:9ms")
    return out


def test_page_renders_lanes_without_js_errors(page, tmp_path):
    st = pre_json(run_page(page), "tk-status")
    assert st["errors"] == [] and st["ok"] is True
    assert st["lanes"] == LANES
    assert st["segments"] >= 30 + 6 + 12  # 30 GPU ops, 6 steps, 12 ranges
    assert st["traces"] > 10


def test_screenshot_artifact(page, tmp_path):
    shot = artifacts_dir(tmp_path) / "timeline_small.png"
    if shot.exists():
        shot.unlink()
    run_page(page, screenshot=shot)
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000  # a real picture, not a blank page


def test_hostile_kernel_name_is_text_and_runs_nothing(page, tmp_path):
    html = page.read_text()
    assert XSS not in html
    html = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", html)
    import json

    probe = PROBE % {"esc": json.dumps(esc(XSS)), "raw": json.dumps(XSS)}
    html = html.replace("<head>", "<head>" + probe, 1)
    probe_page = tmp_path / "probe.html"
    probe_page.write_text(html)
    res = pre_json(run_page(probe_page), "tk-xss")
    assert res["status_ok"] is True
    assert res["hits"] == 1  # the hostile kernel is drawn in the window
    assert XSS in res["hover"]  # shown verbatim in the hover label
    assert res["body_has_text"]  # and as text in the summary tables
    assert res["imgs"] == 0 and res["alerted"] == 0  # no element was created, no handler ran


def test_programmatic_zoom_steps(page):
    st = pre_json(run_page(page, hash_="bench"), "tk-status")
    assert st.get("bench_done") and len(st["zoom_ms"]) == 6 and st["errors"] == []


def test_sub_pixel_ops_are_merged_per_pixel(tmp_path):
    from tracekit.schema import frame_from_rows

    from ._util import k

    # 25000 ops of 1 µs every 2 µs on one stream (> 20000: level of detail on): far below a pixel at 53 ms
    rows = [k(0, 7, 2 * i, 1, f"tiny{i % 3}", ("moe_gemm", "attention")[i % 2]) for i in range(25000)]
    rows.append(k(0, 7, 50_500, 2_000, "long_one", "dense_gemm"))
    out = tmp_path / "lod.html"
    render_timeline(frame_from_rows(rows), {}, None, out, window="0ms:53ms")
    st = pre_json(run_page(out), "tk-status")
    assert st["ok"] and st["errors"] == []
    assert st["segments"] == 25001  # all ops are in the payload ...
    lod = st["lod"]
    assert lod["merged"] >= 24900 and lod["drawn"] < 1500  # ... but drawn as ≤ 1 segment per pixel column
