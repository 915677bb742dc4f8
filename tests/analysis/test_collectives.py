"""Collective matching, wait vs transfer, bus bandwidth, quality flags, communication split."""

import polars as pl
import pytest

from tracekit.core.collectives import (
    collective_quality,
    collective_summary,
    match_collectives,
    split_communication,
    start_transient_end_ns,
)
from tracekit.schema import frame_from_rows

from .synth import build

AR = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def _ar(rank, start, end, seq=None, nel=1024, name=AR, fam="allreduce.nccl", pg="0", n=2):
    d = dict(rank=rank, kind="kernel", ts_ns=start, dur_ns=end - start, name=name, category="communication", family=fam)
    if pg is not None:
        d.update(pg_name=pg, coll_seq=seq, coll_name="allreduce", coll_in_nelems=nel, coll_out_nelems=nel,
                 coll_dtype="BFloat16", coll_group_size=n)
    return d


def test_wait_transfer_late_rank_and_busbw():
    # rank 1 arrives 300 µs late; both end together; transfer 20 µs
    df = frame_from_rows([_ar(0, 1_000_000, 1_320_000, 0, nel=1 << 20), _ar(1, 1_300_000, 1_320_000, 0, nel=1 << 20)])
    m = match_collectives(df).sort("rank")
    assert m["late_rank"].to_list() == [1, 1]
    assert m["wait_ns"].to_list() == [300_000, 0]
    assert m["transfer_ns"].to_list() == [20_000, 20_000]
    assert m["bytes"][0] == 2 << 20
    # allreduce busbw = bytes / t * 2(n-1)/n = 2 MiB / 20 µs * 1
    assert m["bus_bw_bytes_per_s"][0] == pytest.approx((2 << 20) / 20e-6)
    assert m["algo"][0] == "RING_LL"
    assert set(m["quality"]) == {"ok"}


def test_wait_never_exceeds_kernel_minus_transfer():
    # ends disagree (inconsistent data): wait + transfer must stay within the kernel
    df = frame_from_rows([_ar(0, 0, 100_000, 0), _ar(1, 50_000, 300_000, 0)])
    m = match_collectives(df)
    assert (m["wait_ns"] + m["transfer_ns"] <= m["dur_ns"]).all()


def test_custom_allreduce_matched_by_stream_order():
    name = "void sglang::cross_device_reduce_1stage<__nv_bfloat16, 2>(...)"
    rows = []
    for i in range(5):
        for r in range(2):
            a = i * 1_000_000 + (40_000 if r == 1 else 0)
            rows.append(_ar(r, a, i * 1_000_000 + 50_000, name=name, fam="allreduce.custom_v1", pg=None))
    m = match_collectives(frame_from_rows(rows))
    assert m["pg"].unique().to_list() == ["fam:allreduce.custom_v1"]
    assert m.filter(pl.col("rank") == 0)["wait_ns"].to_list() == [40_000] * 5
    assert m["coll_name"].unique().to_list() == ["allreduce"]
    assert m["algo"][0] == "custom_v1_1stage"


def test_count_mismatch_shifts_index_and_flags():
    # rank 1 started recording one collective later (missed #0): its numbering starts at 0 again
    rows = [_ar(0, i * 1_000_000, i * 1_000_000 + 50_000, i) for i in range(6)]
    rows += [_ar(1, i * 1_000_000 + 30_000, i * 1_000_000 + 50_000, i - 1) for i in range(1, 6)]
    m = match_collectives(frame_from_rows(rows))
    full = m.filter(pl.col("n_ranks") == 2)
    assert full.height == 10  # instances 1..5 matched on both ranks
    assert (full["end_spread_ns"] == 0).all()
    assert m.filter(pl.col("seq") == 0)["quality"].to_list() == ["incomplete"]
    codes = {q.code for q in collective_quality(m)}
    assert {"collective_count_mismatch", "collective_index_shifted", "collective_unmatched"} <= codes


def test_mismatched_sizes_flagged_not_crash():
    df = frame_from_rows([_ar(0, 0, 100_000, 0, nel=10), _ar(1, 0, 100_000, 0, nel=20)])
    m = match_collectives(df)
    assert set(m["quality"]) == {"mismatched"}
    assert any(q.code == "collective_mismatched" for q in collective_quality(m))


def test_no_collectives_is_empty():
    df = frame_from_rows([dict(rank=0, kind="kernel", ts_ns=0, dur_ns=10, name="k", category="other_compute")])
    m = match_collectives(df)
    assert m.height == 0
    assert collective_summary(m).height == 0
    assert split_communication(df, m).height == 0


def test_summary_wait_share_and_split_intervals():
    df, _ = build(ranks=2, steps=3, delay={1: (1, 1_000_000)})
    m = match_collectives(df)
    s = collective_summary(m)
    assert s["count"][0] == 3 * 4
    assert s["wait_ns"][0] + s["transfer_ns"][0] == s["kernel_ns"][0]
    parts = split_communication(df, m)
    # per rank, wait parts sum to the instances' wait
    w = parts.filter(pl.col("part") == "comm_wait").group_by("rank").agg((pl.col("end") - pl.col("start")).sum())
    w = dict(zip(w["rank"].to_list(), w["end"].to_list()))
    assert w[0] == int(m.filter(pl.col("rank") == 0)["wait_ns"].sum())
    total = (parts["end"] - parts["start"]).sum()
    assert total == int(m["dur_ns"].sum())


def test_start_transient_end():
    df, _ = build(ranks=2, steps=2)
    m = match_collectives(df)
    first = m.filter(pl.col("seq") == 0)
    assert start_transient_end_ns(df, m) == int(first["end_ns"].max())
    assert start_transient_end_ns(df.filter(pl.col("rank") == 0)) is None
