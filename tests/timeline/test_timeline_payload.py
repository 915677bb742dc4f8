"""Golden tests of the timeline payload (no browser): windows, overview bins, lanes, folding,
collectives, escaping, self-containedness, summary tables, atomic writes."""

from __future__ import annotations

import base64
import json
import re

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracekit._errors import OutputError, UsageError
from tracekit.report.timeline_data import _binned_union, esc, parse_window
from tracekit.report.timeline_html import build_html, build_payload, render_timeline
from tracekit.schema import frame_from_rows

from ._util import BASE, MS, US, XSS, analysis_for, k, sha256_csp


def arr(a: dict) -> np.ndarray:
    dt = {"f4": "<f4", "f8": "<f8", "u1": "u1", "u2": "<u2", "u4": "<u4", "i4": "<i4"}[a["t"]]
    return np.frombuffer(base64.b64decode(a["b"]), dtype=dt)


# ---------------------------------------------------------------- window parsing / choice
@pytest.mark.parametrize("text,expect", [
    ("12.30s:12.45s", (12_300_000_000, 12_450_000_000)),
    ("12.3:12.45", (12_300_000_000, 12_450_000_000)),
    ("100ms:250ms", (100_000_000, 250_000_000)),
    ("5us:7.5us", (5_000, 7_500)),
    ("10ns:20ns", (10, 20)),
])
def test_parse_window(text, expect):
    assert parse_window(text) == expect


@pytest.mark.parametrize("bad", ["12s", "2s:1s", "a:b", "1s:2s:3s", "1h:2h"])
def test_parse_window_rejects(bad):
    with pytest.raises(UsageError):
        parse_window(bad)


def test_default_window_is_representative_steps(small_df):
    p = build_payload(small_df, {}, None)
    w = p["_window"]
    # steps 0-2 (all median length), clipped to the profiled stretch (first op 20 µs, last op ends 8.6 ms)
    assert (w.start_ns - BASE, w.end_ns - BASE) == (20 * US, 8_600 * US)
    assert "steps 0–2" in w.reason


def test_step_window(small_df):
    w = build_payload(small_df, {}, None, step=1)["_window"]
    assert (w.start_ns - BASE, w.end_ns - BASE) == (3_000 * US, 5_900 * US)
    with pytest.raises(UsageError, match="--step 9"):
        build_payload(small_df, {}, None, step=9)


def test_explicit_window_and_out_of_range(small_df):
    w = build_payload(small_df, {}, None, window="3ms:4ms")["_window"]
    assert (w.start_ns - BASE, w.end_ns - BASE) == (3 * MS, 4 * MS)
    with pytest.raises(UsageError, match="outside the capture"):
        build_payload(small_df, {}, None, window="20s:21s")


def test_worst_stall_is_in_the_chooser_not_the_default(small_df):
    p = build_payload(small_df, {}, analysis_for(small_df))
    assert "representative" in p["_window"].reason  # the view opens on profiled steps, stalls are one click away
    stalls = [e for e in p["chooser"] if e["kind"] == "stall"]
    # stall at 4.1 ms lasting 200 µs, padded by max(200 µs, 1 ms) on each side
    assert len(stalls) == 1 and (stalls[0]["t0"], stalls[0]["t1"]) == pytest.approx((3.1, 5.3))
    assert stalls[0]["inside"] and stalls[0]["flag"] == "--window 0.003100s:0.005300s"
    assert [e["label"] for e in p["chooser"] if e["kind"] == "step"][:1] == ["step 0 · DECODE · bs=8 · 2.90 ms"]


# ---------------------------------------------------------------- overview bins
def test_binned_union_known():
    # intervals [0,10) [20,25) over edges 0,5,10,...,30
    got = _binned_union(np.array([0.0, 20.0]), np.array([10.0, 25.0]), np.arange(0.0, 35.0, 5.0))
    assert got.tolist() == [5, 5, 0, 0, 5, 0]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1000), st.integers(1, 200)), min_size=1, max_size=30),
       st.integers(1, 40))
def test_binned_union_matches_bruteforce(ivs, nb):
    # disjoint sorted intervals from a union of random ones
    cover = np.zeros(1300, bool)
    for s, d in ivs:
        cover[s:s + d] = True
    edges_i = np.flatnonzero(np.diff(np.concatenate([[0], cover.astype(int), [0]])))
    starts, ends = edges_i[0::2].astype(float), edges_i[1::2].astype(float)
    edges = np.linspace(0, 1300, nb + 1)
    got = _binned_union(starts, ends, edges)
    fine = np.cumsum(np.concatenate([[0], cover.astype(float)]))  # covered length up to integer t
    want = np.diff(np.interp(edges, np.arange(1301), fine))
    assert np.allclose(got, want)


def test_overview_is_union_per_category():
    rows = [k(0, 7, 0, 100, "a", "moe_gemm"), k(0, 9, 50, 100, "b", "moe_gemm"),  # union [0,150) µs
            k(0, 7, 500, 100, "c", "attention"), k(0, 7, 999, 1, "d", "attention")]
    p = build_payload(frame_from_rows(rows), {}, None, overview_bins=10)
    ov = p["overview"]
    assert ov["nbins"] == 10 and ov["bin_ms"] == pytest.approx(0.1)
    z = arr(ov["z"]).reshape(len(ov["rows"]), 10)
    cats = p["cats"]
    rows_named = {(r, cats[c]): z[i] for i, (r, c) in enumerate(ov["rows"])}
    moe = rows_named[(0, "moe_gemm")].astype(int)
    assert moe[0] == 255 and abs(moe[1] - 127.5) <= 1 and moe[2:].sum() == 0  # 100% then 50% (streams merged)
    att = rows_named[(0, "attention")]
    assert att[5] == 255 and att[9] == 3 and att.sum() == 258  # 1 µs of a 100 µs bin → 1%


def test_counters_scaled_and_grouped(small_df):
    p = build_payload(small_df, {}, None)
    groups = {g["group"]: g for g in p["counters"]}
    assert set(groups) == {"power W", "PCIe / link GB/s"}
    pw = groups["power W"]
    assert [r for r in pw["rows"]] == [[0, "power_w"], [1, "power_w"]]
    z = arr(pw["z"]).reshape(2, pw["nbins"])
    assert np.nanmax(z[1]) == pytest.approx(391.0) and np.nanmin(z[0]) == pytest.approx(300.0)
    assert not np.isnan(z[0][-1])  # forward-filled between samples
    pc = groups["PCIe / link GB/s"]
    assert np.nanmax(arr(pc["z"])) == pytest.approx(4.0)  # 4e9 B/s → 4 GB/s


# ---------------------------------------------------------------- detail lanes / kernels
def test_lanes(small_df):
    d = build_payload(small_df, {}, None)["detail"]
    assert [ln["label"] for ln in d["lanes"]] == [
        "r0 steps", "r0 ranges", "r0 ranges d1", "r0 dev0 s7", "r0 dev0 s20",
        "r1 steps", "r1 ranges", "r1 ranges d1", "r1 dev1 s7", "r1 dev1 s20"]
    assert d["lanes"][3]["first"] == 0 and d["lanes"][3]["last"] == 4


def test_kernel_segments_and_hover_fields(small_df):
    d = build_payload(small_df, {}, None, window="0ms:3ms")["detail"]
    kk = d["kernels"]
    assert kk["n"] == 10  # 5 ops per rank in step 0
    start, dur, lane = arr(kk["start"]), arr(kk["dur"]), arr(kk["lane"])
    names = [d["names"][i] for i in arr(kk["name"])]
    i = names.index("fused_moe_kernel")
    assert start[i] == pytest.approx(20.0) and dur[i] == pytest.approx(400.0) and lane[i] == 3
    assert d["cfgs"][arr(kk["cfg"])[i]] == "grid (132,1,1) block (256,1,1) · regs 128"
    m = names.index("Memcpy HtoD (Pageable -&gt; Device)")
    assert d["cfgs"][arr(kk["cfg"])[m]] == "1048576 B · HtoD" and arr(kk["kind"])[m] == 1
    assert set(arr(kk["step"]).tolist()) == {0}


def test_folding_caps_segments():
    rows = [k(0, 7, i * 10, 1 + (i % 7), f"k{i % 5}", "other_compute") for i in range(1000)]
    rows += [k(1, 7, i * 10, 2, "x", "dense_gemm") for i in range(200)]
    d = build_payload(frame_from_rows(rows), {}, None, window="0ms:10ms", max_segments=120)["detail"]
    kept, folded = d["kernels"]["n"], d["folded"]
    assert kept <= 120 + 2 and kept + folded["n_ops"] == 1200
    assert int(arr(folded["count"]).sum()) == folded["n_ops"]
    lanes = arr(d["kernels"]["lane"])
    assert (lanes == 0).sum() == 100 and (lanes == 1).sum() == 20  # lane quotas proportional (1000:200)
    # the longest ops are the ones kept (durations 1..7 µs, 1/7 of them are 7 µs)
    assert arr(d["kernels"]["dur"])[lanes == 0].min() >= 6.0


def test_collective_wait_and_links(small_df):
    d = build_payload(small_df, {}, None)["detail"]
    c = d["coll"]
    assert c["n"] == 6  # 3 instances × 2 ranks
    kidx = arr(c["idx"])
    lanes = arr(d["kernels"]["lane"])[kidx]
    waits = dict(zip(zip(lanes.tolist(), arr(c["seq"]).tolist()), arr(c["wait"]).tolist()))
    assert waits[(3, 1)] == pytest.approx(200.0) and waits[(8, 1)] == 0.0  # rank 0 waits 200 µs for rank 1
    assert set(arr(c["late"]).tolist()) == {1}
    assert arr(c["link_len"]).tolist() == [2, 2, 2]
    # release = last arrival, in µs from the embedded range's start (the first op, at 20 µs)
    assert d["x0_ms"] == pytest.approx(0.020)
    assert arr(c["link_x"]).tolist() == pytest.approx([1280.0, 4280.0, 7280.0])


def test_collective_instances_from_analysis(small_df):
    inst = [{"rank": 0, "arrival_ns": BASE + 1100 * US, "pg": "g", "seq": 0, "wait_ns": 123 * US, "late_rank": 1,
             "n_ranks": 2}]
    d = build_payload(small_df, {}, {"collective_instances": inst}, window="0ms:3ms")["detail"]
    assert d["coll"]["n"] == 1 and arr(d["coll"]["wait"]).tolist() == [123.0] and d["coll"]["pgs"][1] == "g"


def test_ranges_depth(small_df):
    d = build_payload(small_df, {}, None)["detail"]
    rg = d["ranges"]
    names = [rg["names"][i] for i in arr(rg["name"])]
    lanes = arr(rg["lane"])
    assert {n: int(lane) for n, lane in zip(names, lanes) if lane < 5} == {"forward": 1, "moe_layer": 2}


# ---------------------------------------------------------------- escaping / self-contained page
def test_esc():
    assert esc(XSS) == "&lt;img src=x onerror=alert(1)&gt;"
    assert esc("a&b\"c'd") == "a&amp;b&#34;c&#39;d"


def page(df, analysis=None, **kw) -> str:
    return build_html(build_payload(df, {}, analysis, **kw), {}, analysis, title=XSS)


def test_html_never_contains_raw_trace_strings(small_df):
    html = page(small_df, analysis_for(small_df))
    assert XSS not in html
    assert "<b>phase</b>" not in html and "a <quality> note" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html  # in the summary tables (text)
    data = re.search(r'<script type="application/json" id="tk-data">(.*?)</script>', html, re.S).group(1)
    assert "<" not in data and ">" not in data
    assert "&lt;img src=x onerror=alert(1)&gt;" in json.loads(data)["detail"]["names"]


def test_html_is_self_contained_and_offline(small_df):
    html = page(small_df)
    assert not re.search(r"<script[^>]+src=", html) and "<link" not in html
    assert "cdn.plot.ly/plotly" not in html.split("<script>")[0]
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', html).group(1)
    assert "connect-src 'none'" in csp and "default-src 'none'" in csp
    scripts = re.findall(r"<script>(.*?)</script>", html, re.S)
    assert len(scripts) == 2 and all(sha256_csp(s) in csp for s in scripts)
    assert len(scripts[0]) > 1_000_000  # plotly.js inlined


def test_summary_tables(small_df):
    html = page(small_df, analysis_for(small_df))
    # rank 0: window 10 ms → moe 12.0%, comm 45.0%, idle 43.0%; rank 1 window given as [start, end]
    assert "<td>0</td><td>10.000</td>" in html and "12.0%" in html and "45.0%" in html and "43.0%" in html
    assert "88.0%" in html
    assert "<h2>Top findings</h2>" in html and "PCIe-bound &lt;b&gt;phase&lt;/b&gt;" in html
    assert "class=jump data-t0='4.100000' data-t1='4.300000'" in html
    assert "--window 0.003100s:0.005300s" in html
    assert "<code>test_flag</code>" in html


def test_render_atomic_and_refuses_overwrite(small_df, tmp_path):
    out = tmp_path / "t.html"
    res = render_timeline(small_df, {}, None, out)
    assert out.exists() and res["bytes"] == out.stat().st_size and res["ops_embedded"] == 30
    with pytest.raises(OutputError, match="--force"):
        render_timeline(small_df, {}, None, out)
    render_timeline(small_df, {}, None, out, force=True)
    assert [p.name for p in tmp_path.iterdir()] == ["t.html"]  # no temp files left
    with pytest.raises(OutputError, match="html"):
        render_timeline(small_df, {}, None, tmp_path / "t.json")


def test_empty_and_gpu_less_frames(tmp_path):
    render_timeline(frame_from_rows([]), {}, None, tmp_path / "a.html")
    cpu_only = frame_from_rows([{"rank": 0, "kind": "cpu_op", "ts_ns": BASE, "dur_ns": 10, "name": "aten::mm"}])
    res = render_timeline(cpu_only, {}, None, tmp_path / "b.html")
    assert res["ops_embedded"] == 0


def test_stalls_rank_without_lanes_and_odd_analysis(small_df):
    weird = {"ranks": "nope", "findings": [1, None], "stalls": [{"rank": 7, "start_ns": BASE, "dur_ns": 5},
                                                                {"no": "times"}],
             "pcie_phases": pl.DataFrame({"rank": [0], "ts_ns": [BASE], "end_ns": [BASE + MS]})}
    p = build_payload(small_df, {}, weird, window="0ms:3ms")
    assert len(p["detail"]["stalls"]) == 1 and len(p["detail"]["pcie"]) == 1
    build_html(p, {}, weird)
