"""Exclusive breakdown, window selection, top kernels, analyze JSON: hand-built frames with known tables."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from tracekit._errors import QualityLog, UsageError
from tracekit.analysis.passes.breakdown import PRIORITY, compute_breakdown, top_kernels, uncategorized_top
from tracekit.core.window import Window, select_window
from tracekit.api import analyze, analyze_frame
from tracekit.cli import app
from tracekit.schema import frame_from_rows, write_trace


def _op(rank: int, ts: int, dur: int, cat: str, name: str | None = None, stream: int = 7, kind: str = "kernel", **kw) -> dict:
    return {"rank": rank, "kind": kind, "ts_ns": ts, "dur_ns": dur, "name": name or f"{cat}_k", "category": cat,
            "family": kw.pop("family", cat), "stream": stream, **kw}


def _table(bd) -> dict[int, dict]:
    return {r["rank"]: r for r in bd.table.iter_rows(named=True)}


def test_overlapping_streams_exclusive_by_priority() -> None:
    # rank 0, window [0, 100):
    #   stream 7: communication [0, 60)
    #   stream 8: dense_gemm [10, 30), memory [20, 50)
    #   stream 9: moe_gemm [25, 35)
    #   idle [60, 80); attention [80, 100)
    df = frame_from_rows([
        _op(0, 0, 60, "communication"),
        _op(0, 10, 20, "dense_gemm", stream=8),
        _op(0, 20, 30, "memory", stream=8, kind="memcpy"),
        _op(0, 25, 10, "moe_gemm", stream=9),
        _op(0, 80, 20, "attention"),
    ])
    t = _table(compute_breakdown(df))[0]
    assert (t["window_start_ns"], t["window_ns"], t["gpu_busy_ns"]) == (0, 100, 80)
    # moe_gemm 25-35 (10); dense 10-25 (15); memory 35-50 (15); comm 0-10 + 50-60 (20); attention 20; idle 20
    want = {"moe_gemm": 10, "moe_routing": 0, "attention": 20, "dense_gemm": 15, "other_compute": 0, "memory": 15,
            "communication": 20, "idle": 20}
    assert {k: t[k] for k in want} == want
    assert sum(t[k] for k in want) == t["window_ns"]


def test_priority_order_is_compute_memory_communication() -> None:
    assert PRIORITY[-2:] == ("memory", "communication")
    assert set(PRIORITY) == {"moe_gemm", "moe_routing", "attention", "dense_gemm", "other_compute", "memory", "communication"}


def test_two_ranks_own_windows_and_null_category() -> None:
    df = frame_from_rows([
        _op(0, 1000, 100, "dense_gemm"),
        _op(0, 1300, 100, "communication"),
        _op(1, 5000, 50, "communication"),
        {"rank": 1, "kind": "kernel", "ts_ns": 5100, "dur_ns": 50, "name": "nocat", "stream": 7},  # null -> other_compute
        {"rank": 1, "kind": "cpu_op", "ts_ns": 0, "dur_ns": 99999, "name": "aten::mm"},  # not a GPU op
    ])
    t = _table(compute_breakdown(df))
    assert (t[0]["window_start_ns"], t[0]["window_ns"], t[0]["gpu_busy_ns"], t[0]["idle"]) == (1000, 400, 200, 200)
    assert (t[1]["window_start_ns"], t[1]["window_ns"], t[1]["communication"], t[1]["other_compute"], t[1]["idle"]) == (5000, 150, 50, 50, 50)


def test_explicit_window_clips_ops() -> None:
    df = frame_from_rows([_op(0, 0, 100, "dense_gemm"), _op(0, 150, 100, "communication")])
    t = _table(compute_breakdown(df, Window(50, 200)))[0]
    assert (t["window_ns"], t["dense_gemm"], t["communication"], t["idle"]) == (150, 50, 50, 50)


def test_empty_trace() -> None:
    bd = compute_breakdown(frame_from_rows([{"rank": 0, "kind": "cpu_op", "ts_ns": 0, "dur_ns": 5, "name": "x"}]))
    assert bd.table.height == 0


def _transient_frame() -> pl.DataFrame:
    # rank 0 starts profiling 5 ms before rank 1 and spins in all-reduce #1 until rank 1 arrives
    ms = 1_000_000
    return frame_from_rows([
        _op(0, 0, 6 * ms, "communication", "ncclDevKernel_AllReduce"),  # all-reduce #1 (spin)
        _op(1, 5 * ms, 1 * ms, "communication", "ncclDevKernel_AllReduce"),
        _op(0, 6 * ms, 2 * ms, "dense_gemm"),
        _op(1, 6 * ms, 2 * ms, "dense_gemm"),
        _op(0, 8 * ms, 1 * ms, "communication", "ncclDevKernel_AllReduce"),  # all-reduce #2
        _op(1, 8 * ms, 1 * ms, "communication", "ncclDevKernel_AllReduce"),
        _op(0, 9 * ms, 1 * ms, "dense_gemm"),
        _op(1, 9 * ms, 1 * ms, "dense_gemm"),
    ])


def test_transient_trimmed_with_quality_note() -> None:
    # the window starts at the end of the first all-reduce every rank *entered* after rank 1's first op (#2)
    q = QualityLog()
    w = select_window(_transient_frame(), quality=q)
    assert (w.start_ns, w.end_ns, w.reason, w.trimmed_transient_ns) == (9_000_000, 10_000_000, "transient_trimmed", 9_000_000)
    assert [x.code for x in q] == ["profiler_start_transient_trimmed"]
    t = _table(compute_breakdown(_transient_frame(), w))
    assert t[0]["window_ns"] == t[1]["window_ns"] == 1_000_000 and t[0]["communication"] == 0 and t[0]["dense_gemm"] == 1_000_000
    assert select_window(_transient_frame(), trim_transient=False).reason == "extent"


def test_small_skew_not_trimmed() -> None:
    df = _transient_frame().with_columns(
        pl.when(pl.col("rank") == 1).then(pl.col("ts_ns") - 4_500_000).otherwise(pl.col("ts_ns")).alias("ts_ns"))
    assert select_window(df).reason == "extent"  # first ops 0.5 ms apart: below min_skew_ns


def test_skip_steps() -> None:
    rows = []
    for i in range(3):
        rows.append({"rank": 0, "kind": "step", "ts_ns": 1000 * i, "dur_ns": 900, "name": f"ProfilerStep#{i}", "step_id": i})
        rows.append(_op(0, 1000 * i + 100, 500, "dense_gemm", launch_ts_ns=1000 * i + 50))
    df = frame_from_rows(rows)
    q = QualityLog()
    w = select_window(df, skip_steps=1, quality=q)
    assert (w.start_ns, w.end_ns, w.skipped_steps) == (1100, 2600, 1)
    assert "steps_skipped" in [x.code for x in q]
    with pytest.raises(UsageError, match="only 3 profiled steps"):
        select_window(df, skip_steps=3)


def test_top_kernels_and_uncategorized() -> None:
    df = frame_from_rows([
        _op(0, 0, 10, "dense_gemm", "a"), _op(0, 10, 30, "dense_gemm", "b"), _op(0, 40, 10, "dense_gemm", "a"),
        _op(1, 0, 5, "other_compute", "mystery", family="other"), _op(1, 5, 7, "other_compute", "mystery", family="other"),
    ])
    tk = top_kernels(df, n=1)
    assert tk.rows() == [("dense_gemm", "b", 1, 30, 30), ("other_compute", "mystery", 2, 12, 6)]
    tk2 = top_kernels(df, n=5).filter(pl.col("category") == "dense_gemm")
    assert tk2.select("name", "count", "total_ns", "mean_ns").rows() == [("b", 1, 30, 30), ("a", 2, 20, 10)]
    assert uncategorized_top(df).rows() == [("mystery", 2, 12)]


def test_analyze_json_object(tmp_path: Path) -> None:
    df = frame_from_rows([
        _op(0, 0, 60, "communication", "ncclDevKernel_AllReduce"), _op(0, 10, 20, "dense_gemm", "nvjet"),
        _op(0, 80, 20, "attention", "fa3"), _op(1, 0, 50, "other_compute", "mystery", family="other"),
    ])
    p = tmp_path / "t.parquet"
    write_trace(df, p, {"world_size": 2})
    res = analyze(p, trim_transient=False, cross_rank=False)
    assert res["schema_version"] == 1 and res["world_size"] == 2 and res["trace"] == str(p)
    assert res["buckets"] == list(PRIORITY) + ["idle"]
    r0 = res["ranks"][0]
    assert r0["rank"] == 0 and r0["window_ns"] == 100 and r0["gpu_busy_ns"] == 80
    assert r0["time_ns"] == {"moe_gemm": 0, "moe_routing": 0, "attention": 20, "dense_gemm": 20, "other_compute": 0,
                             "memory": 0, "communication": 40, "idle": 20}
    assert res["overall"]["window_ns"] == 150 and res["overall"]["time_ns"]["other_compute"] == 50
    assert sum(res["overall"]["time_ns"].values()) == res["overall"]["window_ns"]
    assert res["top_kernels"]["dense_gemm"] == [{"name": "nvjet", "count": 1, "total_ns": 20, "mean_ns": 20}]
    assert res["uncategorized_top"] == [{"name": "mystery", "count": 1, "total_ns": 50}]
    assert isinstance(res["quality"], list)
    json.dumps(res)  # serialisable as is
    # CLI --json prints the same object
    out = CliRunner().invoke(app, ["analyze", str(p), "--json", "--no-trim"])
    assert out.exit_code == 0, out.output
    cli = json.loads(out.stdout)
    for a, b in zip(cli["ranks"], res["ranks"]):  # the CLI also splits communication into wait/transfer
        assert (a["window_ns"], a["gpu_busy_ns"], a["time_ns"]["idle"]) == (b["window_ns"], b["gpu_busy_ns"], b["time_ns"]["idle"])
        comm = a["time_ns"].get("communication", a["time_ns"].get("comm_wait", 0) + a["time_ns"].get("comm_transfer", 0))
        assert comm == b["time_ns"]["communication"]


def test_analyze_window_option_relative_to_capture_start() -> None:
    df = frame_from_rows([_op(0, 1_000_000_000, 2_000_000_000, "dense_gemm")])
    res = analyze_frame(df, {"window_ns": [1_000_000_000, 3_000_000_000]}, window="0.5s:1.5s")
    assert res["window"]["reason"] == "explicit"
    assert res["ranks"][0]["window_ns"] == 1_000_000_000 and res["ranks"][0]["time_ns"]["idle"] == 0


def test_analyze_cross_rank_splits_communication_exclusively(tmp_path: Path) -> None:
    ms = 1_000_000
    rows = []
    for r, late in ((0, 0), (1, 2 * ms)):  # rank 1 arrives 2 ms late at each all-reduce: rank 0 waits
        for i in range(4):
            t0 = 10 * ms * i
            rows.append(_op(r, t0, 3 * ms + late, "dense_gemm", "nvjet"))
            rows.append(_op(r, t0 + 3 * ms + late, 3 * ms - late, "communication", "ncclDevKernel_AllReduce_Sum_bf16",
                            coll_name="allreduce", pg_name="0", coll_seq=i, pg_ranks="[0, 1]", coll_group_size=2))
    p = tmp_path / "t.parquet"
    write_trace(frame_from_rows(rows), p, {"world_size": 2})
    plain = analyze(p, trim_transient=False, cross_rank=False)
    split = analyze(p, trim_transient=False)
    for a, b in zip(plain["ranks"], split["ranks"]):
        assert a["window_ns"] == b["window_ns"] and sum(b["time_ns"].values()) == b["window_ns"]
        assert b["time_ns"]["comm_wait"] + b["time_ns"]["comm_transfer"] == a["time_ns"]["communication"]
    assert split["ranks"][0]["time_ns"]["comm_wait"] > 0 and split["ranks"][1]["time_ns"]["comm_wait"] == 0
