"""Planted faults → stalls with the late rank named, the cause, and the lost time."""

import polars as pl
import pytest

from tracekit.core.collectives import match_collectives
from tracekit.analysis.passes.stalls import detect_stalls, lost_by_rank, stall_summary

from .synth import build


@pytest.mark.parametrize("ranks,late", [(2, 1), (4, 2)])
def test_delay_every_kth_step(ranks, late):
    k, delay, steps = 3, 2_000_000, 9
    df, _ = build(ranks=ranks, steps=steps, delay={late: (k, delay)})
    m = match_collectives(df)
    st = detect_stalls(m, df)
    assert set(st["late_rank"]) == {late}
    assert set(st["waiting_rank"]) == set(range(ranks)) - {late}
    assert set(st["cause"]) == {"delayed_forward"}
    delayed_steps = [s for s in range(steps) if s % k == 0]
    assert sorted(st["step"].unique().to_list()) == delayed_steps
    lost = lost_by_rank(st)
    injected = delay * len(delayed_steps)
    for r in set(range(ranks)) - {late}:
        got = int(lost.filter(pl.col("rank") == r)["lost_ns"][0])
        assert abs(got - injected) <= 0.1 * injected, (r, got, injected)
    s = stall_summary(st)
    assert s.height == 1 and s["late_rank"][0] == late and s["waiting_ranks"][0].to_list() == sorted(set(range(ranks)) - {late})


def test_host_sync_on_late_rank():
    df, _ = build(ranks=2, steps=4, host_sync={0: (2, 150_000)})
    m = match_collectives(df)
    st = detect_stalls(m, df)
    assert set(st["late_rank"]) == {0}
    assert set(st["cause"]) == {"host_sync"}
    assert set(st["detail"]) == {"cudaStreamSynchronize"}
    assert st.height == 4  # one per step, at the layer after the sync


def test_launch_gap_on_late_rank():
    df, _ = build(ranks=2, steps=4, launch_gap={1: (1, 120_000)})
    st = detect_stalls(match_collectives(df), df)
    assert set(st["cause"]) == {"cpu_launch_gap"} and set(st["late_rank"]) == {1}


def test_slow_kernels_on_late_rank():
    df, _ = build(ranks=2, steps=3)
    # rank 1's MoE GEMMs take 300 µs longer; its allreduce arrives later
    slow = (pl.col("rank") == 1) & (pl.col("name") == "fused_moe_kernel")
    df = df.with_columns(pl.when(slow).then(pl.col("dur_ns") + 300_000).otherwise(pl.col("dur_ns")).alias("dur_ns"))
    # move rank 1's following collectives' starts accordingly (arrival = end of the slow kernel)
    m = match_collectives(df)
    assert m.height
    ar = (pl.col("rank") == 1) & (pl.col("category") == "communication")
    # re-derive: shift rank-1 allreduce starts that follow a MoE layer by 300 µs, keep ends
    idx = pl.int_range(pl.len()).over(["rank", "category"])
    df = df.with_columns(
        pl.when(ar & (idx % 2 == 1)).then(pl.col("ts_ns") + 300_000).otherwise(pl.col("ts_ns")).alias("ts_ns"),
        pl.when(ar & (idx % 2 == 1)).then(pl.col("dur_ns") - 300_000).otherwise(pl.col("dur_ns")).alias("dur_ns"),
    )
    st = detect_stalls(match_collectives(df), df)
    assert set(st["cause"]) == {"preceding_kernels"}
    assert set(st["detail"]) == {"fused_moe_kernel"}


def test_thresholds():
    df, _ = build(ranks=2, steps=3, delay={1: (1, 40_000)})
    m = match_collectives(df)
    assert detect_stalls(m, df).height == 0  # 40 µs < default 50 µs
    assert detect_stalls(m, df, min_wait_ns=10_000, min_rel_step=0.0).height == 3
    assert detect_stalls(m, df, min_wait_ns=10_000, min_rel_step=0.5).height == 0  # < half the step


def test_no_instances():
    df, _ = build(ranks=2, steps=1)
    assert detect_stalls(match_collectives(df.filter(pl.col("category") != "communication")), df).height == 0
