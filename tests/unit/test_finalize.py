"""finalize_rank on hand-built Kineto documents: launch join, graph launch, steps, context rules, collectives."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "golden"))
from kineto_doc import annotation, cpu_op, doc, kernel, memcpy, runtime, write_doc  # noqa: E402

from tracekit.categories import load_rules  # noqa: E402
from tracekit.ingest.common import finalize_rank  # noqa: E402
from tracekit.ingest.convert import convert  # noqa: E402
from tracekit.ingest.kineto import read_kineto  # noqa: E402
from tracekit.schema import POLARS_SCHEMA, read_trace  # noqa: E402

BASE = 1_700_000_000_000_000_000


def _fin(tmp_path: Path, evs: list, rules=None, name: str = "t.json") -> pl.DataFrame:
    raw, _ = read_kineto(write_doc(tmp_path / name, doc(evs, rank=0, base_ns=BASE)))
    df = finalize_rank(raw, rules)
    assert df.schema == pl.Schema(POLARS_SCHEMA)
    return df


def _k(df: pl.DataFrame, kind: str = "kernel") -> pl.DataFrame:
    return df.filter(pl.col("kind").cast(pl.String) == kind).sort("ts_ns")


def test_launch_join(tmp_path: Path) -> None:
    df = _fin(tmp_path, [runtime("cudaLaunchKernel", 10, 4, corr=5, tid=9), kernel("k", 20, 3, corr=5),
                         kernel("orphan", 30, 1, corr=None)])
    k = _k(df)
    a, b = k.row(0, named=True), k.row(1, named=True)
    assert (a["launch_ts_ns"], a["launch_dur_ns"], a["launch_tid"], a["launch_name"]) == (BASE + 10_000, 4_000, 9, "cudaLaunchKernel")
    assert (b["launch_ts_ns"], b["launch_name"]) == (None, None)
    assert df["ts_ns"].is_sorted()


def test_graph_launch_all_kernels_share_it_and_the_step(tmp_path: Path) -> None:
    evs = [
        annotation("step[DECODE bs=8]", 0, 100, tid=1),
        runtime("cudaGraphLaunch", 10, 5, corr=77, tid=1),
        kernel("fused_moe_kernel", 20, 5, corr=77, **{"graph id": 3}),
        kernel("nvjet_tst_64", 26, 5, corr=77, **{"graph id": 3}),
        kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 32, 5, corr=77, **{"graph id": 3}),
    ]
    k = _k(_fin(tmp_path, evs))
    assert k.height == 3
    assert k["launch_ts_ns"].to_list() == [BASE + 10_000] * 3
    assert k["launch_name"].cast(pl.String).to_list() == ["cudaGraphLaunch"] * 3
    assert k["step_id"].to_list() == [0, 0, 0]
    assert k["graph_id"].to_list() == [3, 3, 3]
    assert k["category"].cast(pl.String).to_list() == ["moe_gemm", "dense_gemm", "communication"]


@pytest.mark.parametrize(
    "names, want",
    [
        # SGLang step ranges: mode, batch size, tokens (DECODE: tokens = bs), ids numbered in time order
        (["step[DECODE bs=8]", "step[EXTEND bs=2 toks=300]"], [(0, "DECODE", 8, 8), (1, "EXTEND", 2, 300)]),
        # tracekit forward ranges win over SGLang's and ProfilerStep
        (["tk.fwd[DECODE bs=16]", "step[DECODE bs=16]", "ProfilerStep#3"], [(0, "DECODE", 16, 16)]),
        # ProfilerStep#N keeps its number
        (["ProfilerStep#3", "ProfilerStep#4"], [(3, None, None, None), (4, None, None, None)]),
    ],
)
def test_step_rows(tmp_path: Path, names: list[str], want: list[tuple]) -> None:
    evs = []
    for i, n in enumerate(names):
        if n.startswith("ProfilerStep") and len(names) == 3:
            evs.append(annotation(n, 0, 1000))  # encloses everything
        else:
            evs.append(annotation(n, 100 * i + 1, 50))
    evs += [runtime("cudaLaunchKernel", 10, 1, corr=1), kernel("k", 12, 1, corr=1)]
    df = _fin(tmp_path, evs)
    st = _k(df, "step")
    got = [(r["step_id"], r["step_mode"], r["batch_size"], r["tokens"]) for r in st.iter_rows(named=True)]
    assert got == want
    assert st["profiled"].to_list() == [True] * len(want)
    # the other step families stay plain ranges
    assert _k(df, "range").height == len(names) - len(want)
    assert _k(df)["step_id"].to_list() == [want[0][0]]


def test_nested_annotations_context_rule_and_steps(tmp_path: Path) -> None:
    # step > layer > moe.experts > (expert_0 nested, ended) ; a GEMM launched later inside moe.experts
    evs = [
        annotation("step[DECODE bs=4]", 0, 1000),
        annotation("layers.3", 10, 900),
        annotation("moe.experts", 100, 500),
        annotation("expert_0", 110, 20),
        runtime("cudaLaunchKernel", 115, 2, corr=1),  # inside expert_0 inside moe.experts
        kernel("nvjet_tst_128x64", 200, 10, corr=1),
        runtime("cudaLaunchKernel", 300, 2, corr=2),  # after expert_0 ended, still inside moe.experts
        kernel("nvjet_tst_128x64", 310, 10, corr=2),
        runtime("cudaLaunchKernel", 700, 2, corr=3),  # outside moe.experts, inside the layer
        kernel("nvjet_tst_128x64", 710, 10, corr=3),
        runtime("cudaLaunchKernel", 2000, 2, corr=4),  # outside the step
        kernel("nvjet_tst_128x64", 2010, 10, corr=4),
    ]
    k = _k(_fin(tmp_path, evs))
    assert k["category"].cast(pl.String).to_list() == ["moe_gemm", "moe_gemm", "dense_gemm", "dense_gemm"]
    assert k["family"].cast(pl.String).to_list() == ["ctx.moe_experts", "ctx.moe_experts", "gemm.dense", "gemm.dense"]
    assert k["step_id"].to_list() == [0, 0, 0, None]


def test_context_rule_does_not_touch_other_categories(tmp_path: Path) -> None:
    evs = [annotation("moe.experts", 0, 100), runtime("cudaLaunchKernel", 10, 1, corr=1),
           kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 20, 5, corr=1)]
    assert _k(_fin(tmp_path, evs))["category"].cast(pl.String).to_list() == ["communication"]


def test_rules_extension_in_finalize(tmp_path: Path) -> None:
    rp = tmp_path / "rules.json"
    rp.write_text(json.dumps({"rules": [{"id": "mine", "category": "attention", "regex": "^weird_kernel$"}]}))
    evs = [runtime("cudaLaunchKernel", 1, 1, corr=1), kernel("weird_kernel", 2, 1, corr=1)]
    assert _k(_fin(tmp_path, evs))["category"].cast(pl.String).to_list() == ["other_compute"]
    k = _k(_fin(tmp_path, evs, load_rules(rp), name="t2.json"))
    assert (k["category"][0], k["family"][0]) == ("attention", "mine")


def _rank_doc(rank: int, skew_us: int) -> dict:
    """Two all-reduces and a broadcast, launched from record_param_comms, as torch.profiler records them."""
    evs = []
    meta = {"In msg nelems": 4096, "Out msg nelems": 4096, "Group size": 2, "dtype": "BFloat16",
            "Process Group Name": "0", "Process Group Description": "default_pg", "Process Group Ranks": "[0, 1]"}
    for i, coll in enumerate(["allreduce", "allreduce", "broadcast"]):
        t = 100 * i + skew_us
        evs.append(cpu_op("record_param_comms", t, 20, tid=1, **{"Collective name": coll, **meta}))
        evs.append(runtime("cudaLaunchKernel", t + 5, 5, corr=10 + i, tid=1))
        kname = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL" if coll == "allreduce" else "ncclDevKernel_Broadcast_RING_LL"
        evs.append(kernel(kname, t + 30, 20 - skew_us // 10, corr=10 + i))
    # a NCCL kernel with no record_param_comms (e.g. launched by a custom op) on another process group
    evs.append(runtime("cudaLaunchKernel", 500, 5, corr=99, tid=2))
    evs.append(kernel("ncclDevKernel_AllGather_RING_LL", 510, 10, corr=99))
    return doc(evs, rank=rank, world_size=2, base_ns=BASE)


def test_collective_on_two_ranks(tmp_path: Path) -> None:
    d = tmp_path / "in"
    d.mkdir()
    for r in (0, 1):
        write_doc(d / f"rank{r}.json.gz", _rank_doc(r, skew_us=10 * r))
    out = tmp_path / "trace.parquet"
    res = convert([d], out)
    assert res.ranks == [0, 1]
    df, meta = read_trace(out)
    assert meta["world_size"] == 2 and [r["rank"] for r in meta["ranks"]] == [0, 1]
    comm = df.filter((pl.col("kind") == "kernel") & (pl.col("category") == "communication")).sort("rank", "ts_ns")
    for r in (0, 1):
        c = comm.filter(pl.col("rank") == r)
        rows = [(x["coll_name"], x["coll_seq"], x["pg_name"], x["pg_ranks"], x["coll_in_nelems"], x["coll_dtype"],
                 x["coll_group_size"]) for x in c.iter_rows(named=True)]
        assert rows == [
            ("allreduce", 0, "0", "[0, 1]", 4096, "BFloat16", 2),
            ("allreduce", 1, "0", "[0, 1]", 4096, "BFloat16", 2),
            ("broadcast", 2, "0", "[0, 1]", 4096, "BFloat16", 2),
            ("allgather", 0, None, None, None, None, None),  # inferred from the name, numbered in its own family
        ]
    # the same collective instance lines up across ranks by (pg_name, coll_seq)
    key = comm.filter(pl.col("pg_name").is_not_null()).group_by("pg_name", "coll_seq").agg(pl.col("rank").n_unique())
    assert key["rank"].to_list() == [2, 2, 2]


def _rich_events(n: int) -> list:
    """n steps, each: a step range, a context range with a grouped GEMM, a graph launch, a collective
    from record_param_comms, a memcpy; enough text for several stream chunks."""
    meta = {"In msg nelems": 4096, "Out msg nelems": 4096, "Group size": 2, "dtype": "BFloat16",
            "Process Group Name": "0", "Process Group Description": "default_pg", "Process Group Ranks": "[0, 1]"}
    evs = []
    for s in range(n):
        t = 1000 * s
        c = 100 * s
        evs += [
            annotation(f"step[DECODE bs={8 + s % 3}]", t, 900, tid=1),
            annotation("moe.experts", t + 10, 100, tid=1),
            runtime("cudaLaunchKernel", t + 20, 5, corr=c + 1, tid=1),
            kernel("nvjet_tst_128x64", t + 30, 20, corr=c + 1),
            runtime("cudaGraphLaunch", t + 200, 5, corr=c + 2, tid=1),
            kernel("fused_moe_kernel", t + 210, 5, corr=c + 2, **{"graph id": 3}),
            kernel("rmsnorm_kernel", t + 216, 5, corr=c + 2, **{"graph id": 3}),
            cpu_op("record_param_comms", t + 300, 20, tid=1, **{"Collective name": "allreduce", **meta}),
            runtime("cudaLaunchKernel", t + 305, 5, corr=c + 3, tid=1),
            kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", t + 330, 20, corr=c + 3),
            runtime("cudaMemcpyAsync", t + 400, 5, corr=c + 4, tid=1),
            memcpy("Memcpy DtoH (Device -> Pinned)", t + 410, 3, corr=c + 4),
            cpu_op("aten::mm", t + 500, 30, tid=1),
        ]
    return evs


def test_a_rank_read_in_chunks_is_finalized_without_rechunking(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the reader keeps a large rank as one aligned chunk per group of text chunks (gluing them would copy the
    # rank); finalizing must keep every column cut at the same boundaries, or polars rechunks the whole frame
    import tracekit.ingest.kineto as kineto

    N = 2000  # ~6 MB of text: the stream cuts chunks only about 1 MB ahead of the decoder
    rules = load_rules(None)
    p = write_doc(tmp_path / "t.json.gz", doc(_rich_events(N), rank=0, base_ns=BASE))
    monkeypatch.setattr(kineto, "_STREAM_CHUNK_BYTES", 32 << 10)
    monkeypatch.setattr(kineto, "_GROUP_CHUNKS", 2)
    monkeypatch.setenv("TRACEKIT_PARSE_THREADS", "1")
    raw, _ = read_kineto(p)
    chunks = raw.get_column("ts_ns").n_chunks()
    assert chunks > 3
    one = finalize_rank(raw.rechunk(), rules)
    df = finalize_rank([raw], rules, sort=False)
    for name in ("kind", "ts_ns", "name", "category", "family", "launch_ts_ns", "launch_name", "step_id", "coll_seq",
                 "coll_name", "memcpy_kind", "step_mode"):
        assert df.get_column(name).n_chunks() == chunks, name
    assert_frame_equal(df.sort("ts_ns", maintain_order=True), one)
    # and the result is what the rows say
    k = one.filter(pl.col("kind") == "kernel")
    # the GEMM launched inside moe.experts is an expert GEMM (context rule); the norm is other compute
    assert k.group_by("category").len().sort("category").rows() == sorted(
        [("moe_gemm", 2 * N), ("other_compute", N), ("communication", N)])
    assert one.filter(pl.col("kind") == "step").height == N
    assert k.get_column("step_id").null_count() == 0
    assert one.filter(pl.col("kind") == "memcpy").get_column("memcpy_kind").cast(pl.String).unique().to_list() == ["DtoH"]
    assert k.filter(pl.col("category") == "communication").get_column("coll_seq").to_list() == list(range(N))
