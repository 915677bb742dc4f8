"""Windowed captures: the detail view opens on profiled steps inside a profiler window, on real traces.

* GPU: the 2×H200 fixtures in tests/fixtures/gpu (built-in workload, 2 profiler windows each; the time
  between the windows holds only unprofiled step records). Before the fix the default view picked
  unprofiled steps between the windows and drew 0 ops.
* CPU mode: a fresh ``tracekit capture`` on 4 gloo ranks (2 profiler windows); before the fix the page
  drew 0 ops (forward-thread operators and gloo collectives were not device work to the timeline).

The browser tests load the pages in headless Chromium and read what the page script drew in the
initial view (``STATUS.view``: segments that intersect the visible x range, and the ops they stand for).
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from tracekit.report.timeline_html import build_payload, render_timeline
from tracekit.schema import read_trace

from ._util import artifacts_dir, have_chromium, pre_json, run_page

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "gpu"
#: profiled steps per fixture (README: 2 windows of 5 steps, 3 for `loop`)
GPU = {"grouped": 10, "loop": 6, "graphs": 10}


def _inside_one(view: tuple[float, float], spans: list[list[float]]) -> bool:
    return any(a <= view[0] and view[1] <= b for a, b in spans)


def _check_windowed(df: pl.DataFrame, meta: dict, p: dict, n_steps: int) -> None:
    base = int(p["base_ns"])
    pw = [((a - base) / 1e6, (b - base) / 1e6) for a, b in meta["capture"]["profiler_windows"]]
    det = p["detail"]
    view = (det["v0_ms"], det["v1_ms"])
    # one span per profiler window, each starting at its window (observed_spans extends the end)
    assert len(p["spans_ms"]) == len(pw) >= 2
    assert all(sp[0] <= a + 1e-6 and sp[1] >= b - 1e-6 for sp, (a, b) in zip(p["spans_ms"], pw))
    assert _inside_one(view, p["spans_ms"]), (view, p["spans_ms"])
    assert "representative" in det["reason"] and "profiler window" in det["reason"]
    assert p["_view_ops"] >= 500
    ch = p["chooser"]
    assert [e["kind"] for e in ch].count("window") == len(pw)
    steps = [e for e in ch if e["kind"] == "step"]
    assert len(steps) == n_steps and all(e["inside"] for e in steps)
    assert all(_inside_one(((e["t0"] + e["t1"]) / 2,) * 2, p["spans_ms"]) for e in steps)


@pytest.mark.parametrize("name", sorted(GPU))
def test_gpu_windowed_fixture_opens_inside_a_profiler_window(name):
    df, meta = read_trace(FIX / f"{name}.trace.parquet")
    p = build_payload(df, meta, None)  # no analysis: the default path that used to land between windows
    _check_windowed(df, meta, p, GPU[name])
    # every profiled op is embedded, so zooming and the chooser reach both windows
    assert p["detail"]["kernels"]["n"] == df.filter(pl.col("kind").cast(pl.String).is_in(["kernel", "memcpy", "memset"])).height


def test_cpu_capture_draws_forward_thread_and_gloo(cpu_capture):
    df, meta = read_trace(cpu_capture)
    assert meta.get("device_mode") == "cpu" and len(meta["capture"]["profiler_windows"]) == 2
    p = build_payload(df, meta, None)
    _check_windowed(df, meta, p, n_steps=len(p["chooser"]) - 2)
    det = p["detail"]
    labels = [ln["label"] for ln in det["lanes"]]
    for r in range(4):
        assert any(lb.startswith(f"r{r} fwd t") for lb in labels), labels
        assert any(lb.startswith(f"r{r} gloo t") for lb in labels), labels
    cats = set(p["cats"])
    assert {"communication", "moe_gemm", "moe_routing"} <= cats
    # the gloo collectives are device work here: drawn as ops, never again as plain range rows. Embedded:
    # every categorized row of the profiled spans (a rank that started profiling a little before the
    # recorded window start keeps its first few ops outside the spans, as in the analysis)
    d = p["_data"]
    dev = df.filter(pl.col("category").is_not_null() & pl.col("kind").cast(pl.String).is_in(["cpu_op", "range"]))
    inside = dev.filter((pl.col("ts_ns") < d.end_ns) & (pl.col("ts_ns") + pl.col("dur_ns") > d.start_ns))
    assert det["kernels"]["n"] == inside.height >= 0.98 * dev.height
    assert det["ranges"] is None or det["ranges"]["n"] == df.filter(
        (pl.col("kind").cast(pl.String) == "range") & pl.col("category").is_null()
        & (pl.col("ts_ns") < d.end_ns) & (pl.col("ts_ns") + pl.col("dur_ns") > d.start_ns)).height


def test_cpu_capture_collectives_linked_with_analysis(cpu_capture):
    from tracekit.commands.timeline import _analysis

    df, meta = read_trace(cpu_capture)
    p = build_payload(df, meta, _analysis(df, meta))
    coll = p["detail"]["coll"]
    assert coll and coll["n"] > 0 and coll["link_len"]["n"] > 0  # matched gloo instances linked across ranks


# ---------------------------------------------------------------- in the browser
def _render_and_load(trace: Path, tmp_path: Path, shot: str) -> dict:
    from tracekit.commands.timeline import _analysis

    df, meta = read_trace(trace)
    out = tmp_path / f"{shot}.html"
    res = render_timeline(df, meta, _analysis(df, meta), out)
    st = pre_json(run_page(out), "tk-status")
    png = artifacts_dir(tmp_path) / f"{shot}.png"
    run_page(out, screenshot=png)
    assert png.stat().st_size > 20_000
    return {"res": res, "st": st}


@pytest.mark.browser
@pytest.mark.skipif(not have_chromium(), reason="headless Chromium (/usr/bin/chromium) not installed")
def test_browser_gpu_windowed_detail_draws_500_ops(tmp_path):
    got = _render_and_load(FIX / "grouped.trace.parquet", tmp_path, "timeline_gpu_windowed")
    st = got["st"]
    assert st["ok"] and st["errors"] == []
    assert st["view"]["segments"] >= 500 and st["view"]["ops"] >= 500, st["view"]
    assert st["view"]["ops"] == got["res"]["ops_in_view"]  # the page drew every op of the view


@pytest.mark.browser
@pytest.mark.skipif(not have_chromium(), reason="headless Chromium (/usr/bin/chromium) not installed")
def test_browser_cpu_capture_detail_draws_500_ops(cpu_capture, tmp_path):
    got = _render_and_load(cpu_capture, tmp_path, "timeline_cpu_capture")
    st = got["st"]
    assert st["ok"] and st["errors"] == []
    assert st["view"]["segments"] >= 500 and st["view"]["ops"] >= 500, st["view"]
    assert st["view"]["ops"] == got["res"]["ops_in_view"]


# ---------------------------------------------------------------- Perfetto export of the same captures
def test_perfetto_cpu_capture_flows_across_ranks(cpu_capture, tmp_path):
    """CPU mode: forward-thread operators and gloo collectives are tracks; gloo instances flow across ranks."""
    import gzip
    import json

    from tracekit.commands.timeline import _analysis
    from tracekit.report.perfetto import export_perfetto

    from ._chrome_json import check_chrome_json
    from .test_perfetto import assert_nested

    df, meta = read_trace(cpu_capture)
    an = _analysis(df, meta)
    out = tmp_path / "cpu.json.gz"
    stats = export_perfetto(df, meta, out, analysis=an)
    doc = json.load(gzip.open(out, "rt"))
    assert_nested(doc["traceEvents"])
    got = check_chrome_json(doc)
    inst = an["collective_instances"]
    n_inst = inst.select("pg", "seq").unique().height
    # one flow per consecutive pair of arrivals of every matched instance (4 ranks: 3 per instance)
    assert got["cross_pid_flows"] == stats["flows"] == inst.height - n_inst > 0
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert any("gloo collectives" in n for n in names) and any("forward ops" in n for n in names)


def test_perfetto_gpu_windowed_fixture(tmp_path):
    import gzip
    import json

    from tracekit.commands.timeline import _analysis
    from tracekit.report.perfetto import export_perfetto

    from ._chrome_json import check_chrome_json

    df, meta = read_trace(FIX / "grouped.trace.parquet")
    an = _analysis(df, meta)
    out = tmp_path / "g.json.gz"
    export_perfetto(df, meta, out, analysis=an)
    got = check_chrome_json(json.load(gzip.open(out, "rt")))
    inst = an["collective_instances"]
    assert got["cross_pid_flows"] == inst.height - inst.select("pg", "seq").unique().height > 0
    # NVML power / GPM SM activity / PCIe as counter tracks on both ranks
    assert got["counter_tracks"] >= 2 * 3 and got["counters"] > 0


CHOOSER_PROBE = """<script>
(function poll() {
  var T = window.tkTimeline;
  if (!T || !T.status.ok) { if (!T || !T.status.errors.length) { setTimeout(poll, 50); return; } }
  var res = {ok: T.status.ok, errors: T.status.errors};
  function done() {
    var pre = document.createElement('pre'); pre.id = 'tk-probe'; pre.textContent = JSON.stringify(res);
    document.body.appendChild(pre);
  }
  try {
    var sel = document.getElementById('tk-chooser'), opts = Array.prototype.slice.call(sel.options);
    function group(name) { return opts.filter(function (o) { return o.parentNode.label && o.parentNode.label.indexOf(name) === 0; }); }
    var wins = group('profiler windows'), steps = group('profiled steps');
    res.n_windows = wins.length; res.n_steps = steps.length;
    var w = wins[wins.length - 1], s = steps[0];
    res.win = [parseFloat(w.getAttribute('data-t0')), parseFloat(w.getAttribute('data-t1'))];
    sel.selectedIndex = opts.indexOf(w); sel.dispatchEvent(new Event('change'));
    setTimeout(function () {
      res.range_win = T.gd._fullLayout[T.detailKey].range.slice();
      var box = T.gd._fullLayout.shapes[T.boxShape];
      res.box = [box.x0, box.x1];
      var a = parseFloat(s.getAttribute('data-t0')), b = parseFloat(s.getAttribute('data-t1'));
      res.labels_wide = T.status.labels;
      var upd = {}; upd[T.detailKey + '.range'] = [a, a + (b - a) / 12];
      Plotly.relayout(T.gd, upd).then(function () { return T.pending; }).then(function () {
        res.labels_zoomed = T.status.labels;
        res.label_text = (T.gd.data.filter(function (t) { return t.name === 'names'; })[0] || {text: []}).text.slice(0, 5);
        done();
      });
    }, 1500);
  } catch (e) { res.error = String(e); done(); }
})();
</script>"""


@pytest.mark.browser
@pytest.mark.skipif(not have_chromium(), reason="headless Chromium (/usr/bin/chromium) not installed")
def test_browser_chooser_zooms_and_names_show_when_zoomed(tmp_path):
    import re

    df, meta = read_trace(FIX / "grouped.trace.parquet")
    out = tmp_path / "g.html"
    render_timeline(df, meta, None, out)
    html = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", out.read_text())
    probe = tmp_path / "probe.html"
    probe.write_text(html.replace("<head>", "<head>" + CHOOSER_PROBE, 1))
    res = pre_json(run_page(probe), "tk-probe")
    assert res["ok"] and not res.get("error") and res["errors"] == []
    assert res["n_windows"] == 2 and res["n_steps"] == 10
    a, b = res["win"]  # choosing the second profiler window zooms the detail lanes onto it ...
    lo, hi = res["range_win"]  # (2 % padding, clipped to the embedded range)
    assert lo <= a + 1e-6 and hi >= b - 1e-6 and hi - lo <= (b - a) * 1.05
    assert res["box"] == pytest.approx(res["range_win"])  # ... and the overview's box follows
    assert res["labels_zoomed"] > res["labels_wide"] >= 0 and res["labels_zoomed"] > 0  # names appear when zoomed in
    assert all(isinstance(t, str) and t for t in res["label_text"])


CORPUS = Path(__file__).resolve().parents[1] / "corpus" / "fixtures"


@pytest.mark.browser
@pytest.mark.skipif(not have_chromium(), reason="headless Chromium (/usr/bin/chromium) not installed")
@pytest.mark.parametrize("name", ["glm5_grouped_sdpa", "glm5_eager_sdpa"])
def test_browser_gpu_corpus_trace_draws_500_ops(name, tmp_path):
    """The transformers MoE Kineto corpus (1×H200): grouped_mm experts, and the eager per-expert loop (18k ops in view)."""
    src = CORPUS / f"{name}.json.gz"
    if not src.exists():
        pytest.skip(f"{src} not in this checkout")
    from tracekit.ingest.convert import convert

    trace = tmp_path / f"{name}.parquet"
    convert([src], trace)
    got = _render_and_load(trace, tmp_path, f"timeline_corpus_{name}")
    st = got["st"]
    assert st["ok"] and st["errors"] == []
    assert "representative" in got["res"]["window_reason"]
    assert st["view"]["segments"] >= 500 and st["view"]["ops"] == got["res"]["ops_in_view"] >= 500, st["view"]
