"""Idle gaps by cause."""

import polars as pl

from tracekit.core.collectives import match_collectives
from tracekit.analysis.passes.gaps import idle_causes

from .synth import build


def _tot(ic, rank, cause):
    return ic.by_rank_ns()[str(rank)][cause]


def test_host_sync_idle():
    df, _ = build(ranks=2, steps=4, host_sync={0: (2, 150_000)})
    ic = idle_causes(df, match_collectives(df))
    # per step: GPU drains 3 µs after the allreduce, sync returns 2 µs later, +150 µs CPU, +8 µs launch → start
    expected = 4 * (3_000 + 2_000 + 150_000 + 8_000)
    assert _tot(ic, 0, "host_sync") == expected
    assert _tot(ic, 1, "host_sync") == 0
    g = ic.gaps.filter((pl.col("rank") == 0) & (pl.col("cause") == "host_sync"))
    assert set(g["detail"]) == {"cudaStreamSynchronize"}


def test_launch_bound_idle():
    df, _ = build(ranks=2, steps=3, launch_gap={1: (1, 80_000)})
    ic = idle_causes(df)
    assert _tot(ic, 1, "launch_bound") == 3 * (3_000 + 80_000 + 8_000)
    assert _tot(ic, 0, "launch_bound") == 0


def test_between_steps_and_peer_wait():
    df, _ = build(ranks=2, steps=3, step_gap_ns=500_000, delay={1: (2, 1_000_000)})
    m = match_collectives(df)
    ic = idle_causes(df, m)
    # 2 inter-step gaps of 3 µs tail + 500 µs + 30 µs launch lead
    assert _tot(ic, 0, "between_steps") == 2 * (3_000 + 500_000 + 30_000)
    # rank 1 idles the injected 1 ms more before step 2; its host slept (no call for > 1 ms): host idle, not scheduler work
    assert _tot(ic, 1, "between_steps") + _tot(ic, 1, "host_idle") == _tot(ic, 0, "between_steps") + 1_000_000
    assert _tot(ic, 1, "host_idle") >= 1_000_000 and _tot(ic, 0, "host_idle") == 0
    assert _tot(ic, 1, "launch_bound") == 0
    # rank 0 waits in the collective for rank 1 in steps 0 and 2
    assert _tot(ic, 0, "waiting_on_peer") == 2 * 1_000_000
    top = ic.largest.filter(pl.col("rank") == 0).row(0, named=True)
    assert top["cause"] == "waiting_on_peer" and top["dur_ns"] == 1_000_000


def test_window_clips():
    df, _ = build(ranks=2, steps=3)
    lo = int(df["ts_ns"].min())
    ic = idle_causes(df, window=(lo, lo + 100))
    assert int(ic.gaps["dur_ns"].sum()) <= 2 * 100
