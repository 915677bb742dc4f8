"""CPU mode on hand-built gloo traces with known answers: converter categories, one collective op per rank,
breakdown, stalls, idle causes; GPU traces untouched."""

from __future__ import annotations

import sys
from pathlib import Path

import polars as pl
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "golden"))
from kineto_doc import annotation, cpu_op, doc, kernel, runtime, write_doc  # noqa: E402

from cpu_mode._cpu_doc import BASE_NS, EXPECT, TRANSFER_US, write_cpu_docs  # noqa: E402
from tracekit.analysis.passes.breakdown import compute_breakdown  # noqa: E402
from tracekit.core.collectives import match_collectives  # noqa: E402
from tracekit.core.window import device_op_expr, device_ops  # noqa: E402
from tracekit.api import analyze  # noqa: E402
from tracekit.ingest.common import finalize_rank, forward_tids  # noqa: E402
from tracekit.ingest.convert import convert  # noqa: E402
from tracekit.ingest.kineto import read_kineto  # noqa: E402
from tracekit.schema import frame_from_rows, read_trace  # noqa: E402

N_STEPS = 3
DELAY_US = 500  # rank 1, step 1


@pytest.fixture(scope="module")
def straggler(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("cpu")
    paths = write_cpu_docs(d / "raw", n_steps=N_STEPS, delays={1: {1: DELAY_US}})
    out = d / "trace.parquet"
    convert(paths, out)
    return out


def _cat(df: pl.DataFrame) -> pl.Expr:
    return pl.col("category").cast(pl.String)


def test_converter_categorizes_top_level_ops_and_gloo_ranges(straggler: Path) -> None:
    df, meta = read_trace(straggler)
    assert meta["device_mode"] == "cpu"
    assert {q["code"]: q["severity"] for q in meta["quality"]}["no_gpu_events"] == "info"
    r0 = df.filter(pl.col("rank") == 0)
    got = r0.filter(pl.col("category").is_not_null()).group_by(_cat(r0).alias("c")).agg(
        pl.col("name").cast(pl.String).unique().sort(), pl.col("dur_ns").sum())
    names = dict(zip(got["c"].to_list(), got["name"].to_list()))
    assert names == {
        "attention": ["aten::scaled_dot_product_attention"],
        "dense_gemm": ["aten::matmul"],  # in attn: a GEMM stays a GEMM (as on GPU)
        "moe_routing": ["aten::linear", "aten::matmul", "aten::topk"],  # router range
        "moe_gemm": ["aten::_grouped_mm"],  # moe.experts range, by family gemm.cpu
        "other_compute": ["aten::add"],
        "communication": ["gloo:all_reduce"],
    }
    durs = dict(zip(got["c"].to_list(), got["dur_ns"].to_list()))
    for c, us in EXPECT.items():
        assert durs[c] == us * 1000 * N_STEPS, c
    # nested children, c10d ops, record_param_comms stay uncategorized; the top-level readback is marked
    nested = r0.filter(pl.col("name").cast(pl.String).is_in(["aten::mm", "aten::_softmax", "aten::_local_scalar_dense", "c10d::allreduce_"]))
    assert nested.height > 0 and nested["category"].null_count() == nested.height
    items = r0.filter(pl.col("name").cast(pl.String) == "aten::item").sort("ts_ns")
    assert items["family"].cast(pl.String).to_list() == ["host_sync.cpu", None] * N_STEPS  # top-level, nested in _grouped_mm
    assert items["category"].null_count() == items.height


def test_gloo_range_is_launched_by_its_c10d_op(straggler: Path) -> None:
    df, _ = read_trace(straggler)
    g = df.filter((pl.col("rank") == 1) & (pl.col("name").cast(pl.String) == "gloo:all_reduce")).sort("ts_ns")
    c = df.filter((pl.col("rank") == 1) & (pl.col("name").cast(pl.String) == "c10d::allreduce_")).sort("ts_ns")
    assert g.height == c.height == 2 * N_STEPS
    assert g["launch_ts_ns"].to_list() == c["ts_ns"].to_list()
    assert g["launch_tid"].to_list() == [1] * g.height and set(g["tid"].to_list()) == {50}
    assert g["launch_name"].cast(pl.String).unique().to_list() == ["c10d::allreduce_"]
    assert g["coll_name"].cast(pl.String).unique().to_list() == ["allreduce"]
    assert g["family"].cast(pl.String).unique().to_list() == ["allreduce.gloo"]
    assert g["coll_seq"].to_list() == list(range(2 * N_STEPS))
    steps = df.filter((pl.col("rank") == 1) & (pl.col("kind") == "step")).sort("ts_ns")["step_id"].to_list()
    assert g["step_id"].to_list() == [s for s in steps for _ in range(2)]  # placed by the issuing op (forward thread)


def test_one_collective_op_per_rank_and_exact_waits(straggler: Path) -> None:
    df, _ = read_trace(straggler)
    inst = match_collectives(df)
    assert inst.height == 2 * 2 * N_STEPS
    assert inst.group_by(["pg", "seq", "rank"]).len()["len"].max() == 1
    assert (inst["n_ranks"] == 2).all() and (inst["quality"] == "ok").all()
    assert (inst["transfer_ns"] == TRANSFER_US * 1000).all()
    late = inst.filter(pl.col("wait_ns") > 0)
    assert late.select("rank", "late_rank", "wait_ns", "seq").rows() == [(0, 1, DELAY_US * 1000, 2)]


def test_analyze_stalls_breakdown_idle(straggler: Path) -> None:
    res = analyze(straggler)
    st = res["stalls"]
    assert [(s["waiting_rank"], s["late_rank"], s["wait_ns"]) for s in st] == [(0, 1, DELAY_US * 1000)]
    assert res["collectives"]["lost_by_rank"] == {"0": DELAY_US * 1000}
    for r in res["ranks"]:
        t = r["time_ns"]
        assert sum(t.values()) == r["window_ns"]  # buckets + idle = window
        for c, us in EXPECT.items():
            assert t[c] == us * 1000 * N_STEPS, (r["rank"], c)
        assert t["comm_transfer"] == TRANSFER_US * 1000 * 2 * N_STEPS
        assert t["comm_wait"] == (DELAY_US * 1000 if r["rank"] == 0 else 0)
    idle = res["idle_causes_ns"]
    assert idle["0"]["waiting_on_peer"] == DELAY_US * 1000
    # the top-level readback (aten::item) sits in a 44 µs gap per step (router end → grouped GEMM start)
    assert idle["0"]["host_sync"] == idle["1"]["host_sync"] == 44_000 * N_STEPS
    # rank 1's sleep at the start of step 1 is idle between the steps, with no operator on its thread: host idle
    assert idle["1"]["host_idle"] - idle["0"]["host_idle"] == DELAY_US * 1000
    assert idle["1"]["between_steps"] == idle["0"]["between_steps"]
    assert idle["1"]["launch_bound"] == idle["0"]["launch_bound"]
    assert res["steps"]["without_gpu"] == 0
    assert any("for rank 1" in f for f in res["findings"])


@pytest.mark.parametrize("rpc", ["inner", "outer"])
def test_record_param_comms_metadata_reaches_the_gloo_range(tmp_path: Path, rpc: str) -> None:
    paths = write_cpu_docs(tmp_path / "raw", n_steps=2, rpc=rpc)
    out = tmp_path / "t.parquet"
    convert(paths, out)
    df, _ = read_trace(out)
    g = df.filter(pl.col("name").cast(pl.String) == "gloo:all_reduce")
    assert g["pg_name"].cast(pl.String).unique().to_list() == ["0"]
    assert g["coll_in_nelems"].unique().to_list() == [1024]
    inst = match_collectives(df)
    assert inst["pg"].unique().to_list() == ["pg:0"] and (inst["bytes"] == 4096).all()
    assert inst.group_by(["pg", "seq", "rank"]).len()["len"].max() == 1


def test_gpu_rank_keeps_cpu_rows_uncategorized(tmp_path: Path) -> None:
    evs = [annotation("tk.fwd[DECODE bs=1 tok=1]", 0, 100, tid=1), cpu_op("aten::mm", 5, 20),
           runtime("cudaLaunchKernel", 10, 4, corr=5, tid=1), kernel("nvjet_tst_64", 20, 3, corr=5),
           annotation("gloo:all_reduce", 30, 10, tid=50)]
    raw, _ = read_kineto(write_doc(tmp_path / "g.json", doc(evs, rank=0, base_ns=BASE_NS)))
    df = finalize_rank(raw)
    cpu = df.filter(pl.col("kind").cast(pl.String).is_in(["cpu_op", "range"]))
    assert cpu["category"].null_count() == cpu.height and cpu["family"].null_count() == cpu.height
    assert device_ops(df)["name"].cast(pl.String).to_list() == ["nvjet_tst_64"]


def test_device_predicate_is_per_rank() -> None:
    rows = [
        {"rank": 0, "kind": "kernel", "ts_ns": 0, "dur_ns": 10, "name": "k", "category": "dense_gemm"},
        {"rank": 0, "kind": "cpu_op", "ts_ns": 0, "dur_ns": 10, "name": "aten::mm", "category": "dense_gemm"},  # GPU rank: ignored
        {"rank": 1, "kind": "cpu_op", "ts_ns": 0, "dur_ns": 10, "name": "aten::mm", "category": "dense_gemm"},
        {"rank": 1, "kind": "range", "ts_ns": 0, "dur_ns": 10, "name": "gloo:all_reduce", "category": "communication"},
        {"rank": 1, "kind": "cpu_op", "ts_ns": 0, "dur_ns": 10, "name": "aten::view"},  # no category: not device work
    ]
    df = frame_from_rows(rows)
    sel = df.filter(device_op_expr()).select("rank", pl.col("kind").cast(pl.String), pl.col("name").cast(pl.String)).rows()
    assert sel == [(0, "kernel", "k"), (1, "cpu_op", "aten::mm"), (1, "range", "gloo:all_reduce")]
    bd = compute_breakdown(df)
    assert bd.table.filter(pl.col("rank") == 1)["dense_gemm"].item() == 10


def test_forward_thread_without_steps_is_the_busiest_thread(tmp_path: Path) -> None:
    evs = [cpu_op("aten::mm", 0, 10, tid=7), cpu_op("aten::add", 20, 10, tid=7), cpu_op("aten::add", 0, 50, tid=8)]
    raw, _ = read_kineto(write_doc(tmp_path / "n.json", doc(evs, rank=0, base_ns=BASE_NS)))
    df = finalize_rank(raw)
    assert forward_tids(df) == [7]
    got = df.filter(pl.col("category").is_not_null()).select("tid", pl.col("category").cast(pl.String)).sort("tid", "category").rows()
    assert got == [(7, "dense_gemm"), (7, "other_compute")]
