"""Perfetto / Chrome-JSON export: structure, clock alignment, tracks, counters, flows, stalls,
perfect nesting per track, atomic writes."""

from __future__ import annotations

import gzip
import json
from collections import defaultdict

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracekit._errors import OutputError
from tracekit.report.perfetto import export_perfetto, nest_fix, sequential_fix
from tracekit.schema import CATEGORIES, frame_from_rows

from ._util import BASE, US, XSS, analysis_for, k


def load(path) -> dict:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def assert_nested(events: list[dict]) -> None:
    """X slices on each (pid, tid) nest perfectly (no partial overlap), in integer ns."""
    tracks: dict[tuple, list[tuple[int, int]]] = defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            s = round(e["ts"] * 1000)
            tracks[(e["pid"], e["tid"])].append((s, s + round(e["dur"] * 1000)))
    for key, ivs in tracks.items():
        ivs.sort(key=lambda iv: (iv[0], -iv[1]))
        stack: list[int] = []
        for s, e in ivs:
            while stack and stack[-1] <= s:
                stack.pop()
            assert not stack or e <= stack[-1], f"partial overlap on {key} at {s}"
            stack.append(e)


@pytest.fixture
def exported(small_df, tmp_path):
    out = tmp_path / "trace.json.gz"
    stats = export_perfetto(small_df, {"ranks": [{"rank": 0, "device_name": "NVIDIA H200"}]}, out,
                            analysis=analysis_for(small_df))
    return load(out), stats


def names_of(ev, ph, name):
    return {(e["pid"], e.get("tid")): e["args"]["name"] for e in ev if e["ph"] == ph and e["name"] == name}


def test_processes_and_stream_tracks(exported):
    d, _ = exported
    ev = d["traceEvents"]
    procs = names_of(ev, "M", "process_name")
    assert procs == {(1, None): "rank 0 (NVIDIA H200)", (2, None): "rank 1"}
    threads = names_of(ev, "M", "thread_name")
    assert threads[(1, 1000)] == "GPU 0 stream 7" and threads[(1, 1001)] == "GPU 0 stream 20"
    assert threads[(2, 1000)] == "GPU 1 stream 7" and threads[(1, 1)] == "steps"
    gpu = [e for e in ev if e["ph"] == "X" and e["tid"] >= 1000]
    assert len(gpu) == 30 and {e["cat"] for e in gpu} <= set(CATEGORIES)
    assert {e["tid"] for e in gpu if e["cat"] == "memory"} == {1001}
    assert d["otherData"]["tracekit_base_ns"] == str(BASE) and d["displayTimeUnit"] == "ns"


def test_clock_aligned_times_and_args(exported):
    ev = exported[0]["traceEvents"]
    moe = sorted((e for e in ev if e["ph"] == "X" and e["name"] == "fused_moe_kernel"), key=lambda e: (e["pid"], e["ts"]))
    assert [(e["pid"], e["ts"], e["dur"]) for e in moe[:2]] == [(1, 20.0, 400.0), (1, 3020.0, 400.0)]
    assert moe[0]["args"]["grid_x"] == 132 and moe[0]["args"]["registers_per_thread"] == 128
    assert "bytes" not in moe[0]["args"]  # null args dropped
    assert any(e["name"] == XSS for e in ev if e["ph"] == "X")  # JSON carries names verbatim


def test_no_partial_overlap_per_track(exported):
    assert_nested(exported[0]["traceEvents"])


def test_steps_and_nested_ranges(exported):
    ev = exported[0]["traceEvents"]
    steps = [e for e in ev if e["ph"] == "X" and e["tid"] == 1 and e["pid"] == 1]
    assert [(e["ts"], e["args"]["step_id"]) for e in steps] == [(0.0, 0), (3000.0, 1), (6000.0, 2)]
    rng = sorted(((e["ts"], e["name"]) for e in ev if e["ph"] == "X" and e["tid"] == 2 and e["pid"] == 2))
    assert rng[:2] == [(10.0, "forward"), (20.0, "moe_layer")]


def test_documented_chrome_json_format(exported):
    from ._chrome_json import check_chrome_json

    got = check_chrome_json(exported[0])
    assert got["cross_pid_flows"] == 3 and got["counter_tracks"] == 4  # 3 allreduces; power + PCIe on 2 ranks


def test_counters(exported):
    ev = exported[0]["traceEvents"]
    pw = [e for e in ev if e["ph"] == "C" and e["name"] == "power_w" and e["pid"] == 2]
    assert len(pw) == 10 and pw[0]["args"] == {"W": 301.0} and pw[0]["ts"] == 0.0
    pc = [e for e in ev if e["ph"] == "C" and e["name"] == "pcie_rx_bytes_per_s" and e["pid"] == 1]
    assert sorted({e["args"]["GB/s"] for e in pc}) == [0.0, 2.0, 4.0]


def test_collective_flows_across_ranks(exported):
    ev = exported[0]["traceEvents"]
    s = {e["id"]: e for e in ev if e["ph"] == "s" and e["cat"] == "collective"}
    f = {e["id"]: e for e in ev if e["ph"] == "f" and e["cat"] == "collective"}
    assert len(s) == 3 and s.keys() == f.keys()
    coll = [e for e in ev if e["ph"] == "X" and e["cat"] == "communication"]
    for i in s:
        a, b = s[i], f[i]
        assert (a["pid"], b["pid"]) == (1, 2) and b["bp"] == "e"  # rank 0 arrived first → rank 1
        for p in (a, b):  # each flow end lies inside a collective slice on its track
            assert any(c["pid"] == p["pid"] and c["tid"] == p["tid"] and c["ts"] <= p["ts"] <= c["ts"] + c["dur"]
                       for c in coll)


def test_stall_instants_and_pcie_phases(exported):
    ev = exported[0]["traceEvents"]
    inst = [e for e in ev if e["ph"] == "i"]
    assert len(inst) == 1 and inst[0]["pid"] == 1 and inst[0]["tid"] == 3 and inst[0]["ts"] == 4100.0
    assert inst[0]["name"] == "stall: host_sync" and inst[0]["args"]["wait_ns"] == 200 * US
    pcie = [e for e in ev if e["ph"] == "X" and e["cat"] == "pcie"]
    assert [(e["pid"], e["tid"], e["ts"], e["dur"]) for e in pcie] == [(2, 4, 6000.0, 500.0)]


def test_overwrite_and_names(small_df, tmp_path):
    out = tmp_path / "t.json"
    export_perfetto(small_df, {}, out)
    assert load(out)["traceEvents"]
    with pytest.raises(OutputError, match="--force"):
        export_perfetto(small_df, {}, out)
    export_perfetto(small_df, {}, out, force=True)
    with pytest.raises(OutputError, match="json"):
        export_perfetto(small_df, {}, tmp_path / "t.html")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]


def test_overlapping_stream_ops_are_clipped(tmp_path):
    rows = [k(0, 7, 0, 100, "a", "moe_gemm"), k(0, 7, 90, 50, "b", "moe_gemm"), k(0, 7, 90, 10, "c", "attention")]
    out = tmp_path / "o.json"
    st_ = export_perfetto(frame_from_rows(rows), {}, out)
    ev = load(out)["traceEvents"]
    assert_nested(ev)
    assert st_["clipped"] >= 1
    assert {e["name"]: e["dur"] for e in ev if e["ph"] == "X"}["a"] == 90.0


def test_cpu_rows_and_launch_flows(tmp_path):
    rows = [{"rank": 0, "kind": "runtime", "ts_ns": BASE, "dur_ns": 5 * US, "name": "cudaLaunchKernel", "tid": 11,
             "correlation": 42},
            {"rank": 0, "kind": "cpu_op", "ts_ns": BASE - US, "dur_ns": 10 * US, "name": "aten::mm", "tid": 11},
            {**k(0, 7, 20, 10, "gemm", "dense_gemm"), "correlation": 42, "tid": 7}]
    out = tmp_path / "c.json"
    st_ = export_perfetto(frame_from_rows(rows), {}, out, include_cpu=True)
    ev = load(out)["traceEvents"]
    assert_nested(ev)
    cpu = [e for e in ev if e["ph"] == "X" and e["tid"] >= 100_000]
    assert sorted(e["name"] for e in cpu) == ["aten::mm", "cudaLaunchKernel"]
    s = [e for e in ev if e["ph"] == "s" and e["cat"] == "launch"]
    f = [e for e in ev if e["ph"] == "f" and e["cat"] == "launch"]
    assert len(s) == len(f) == 1 == st_["flows"] and s[0]["id"] == f[0]["id"] and f[0]["tid"] == 1000


# ---------------------------------------------------------------- nest_fix / sequential_fix
def frame(ivs, tid=2):
    return pl.DataFrame({"name": [f"e{i}" for i in range(len(ivs))], "pid": [1] * len(ivs), "tid": [tid] * len(ivs),
                         "start": [a for a, _ in ivs], "end": [b for _, b in ivs]})


def test_nest_fix_crossing_ranges():
    out = nest_fix(frame([(0, 10), (5, 15), (12, 20)])).sort("start")
    assert out.select("start", "end", "tid").rows() == [(0, 10, 2), (5, 10, 2), (12, 20, 500_002)]
    assert out.get_column("_clipped").to_list() == [False, True, False]


def test_nest_fix_keeps_proper_nesting():
    ivs = [(0, 100), (10, 50), (20, 30), (30, 40), (60, 90), (100, 120), (100, 110)]
    out = nest_fix(frame(ivs))
    assert out.select("start", "end").rows() == ivs and not out.get_column("_clipped").any()


def test_sequential_fix():
    out = sequential_fix(frame([(0, 10), (5, 8), (8, 20)], tid=1000))
    assert out.select("start", "end").rows() == [(0, 5), (5, 8), (8, 20)]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 200), st.integers(0, 80)), min_size=1, max_size=40))
def test_nest_fix_property(raw):
    f = pl.DataFrame({"name": ["x"] * len(raw), "pid": [1] * len(raw), "tid": [t for t, _, _ in raw],
                      "start": [s for _, s, _ in raw], "end": [s + d for _, s, d in raw]}).with_row_index("i")
    out = nest_fix(f)
    assert out.height == f.height
    j = out.join(f, on="i", suffix="_o")
    assert (j["start"] == j["start_o"]).all() and (j["end"] <= j["end_o"]).all() and (j["end"] >= j["start"]).all()
    ev = [{"ph": "X", "pid": 1, "tid": r["tid"], "ts": r["start"] / 1000, "dur": (r["end"] - r["start"]) / 1000}
          for r in out.iter_rows(named=True)]
    assert_nested(ev)
