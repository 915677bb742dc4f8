"""Clock alignment from collective end times."""

import polars as pl

from tracekit.core.align import align_clocks
from tracekit.core.collectives import match_collectives

from .synth import build


def test_skewed_clocks_recovered_four_ranks():
    skew = {1: 2_500_000, 2: -7_000, 3: 150_000}
    df, meta = build(ranks=4, steps=3, skew=skew)
    res = align_clocks(df, meta)
    assert res.applied
    for r, s in skew.items():
        assert abs(res.offsets_ns[r] + s) <= 1_000, (r, res.offsets_ns)
    assert res.offsets_ns[0] == 0
    assert res.residual_ns is not None and res.residual_ns <= 1_000
    m = match_collectives(res.df)
    assert int(m["end_spread_ns"].max()) <= 1_000
    # unpacks like the suggested API
    d, offs, resid = res
    assert d.height == df.height and offs == res.offsets_ns and resid == res.residual_ns


def test_aligned_trace_not_shifted():
    df, meta = build(ranks=2, steps=3)
    res = align_clocks(df, meta)
    assert not res.applied
    assert res.offsets_ns == {0: 0, 1: 0}
    assert res.df.equals(df)


def test_too_few_instances_skipped_with_flag():
    df, meta = build(ranks=2, steps=1, layers=1)
    res = align_clocks(df, meta)
    assert not res.applied
    assert any(q.code == "clock_alignment_skipped" for q in res.quality)


def test_residual_warning_when_ends_disagree():
    df, meta = build(ranks=2, steps=4)
    # jitter rank 1's collective ends by ±200 µs: no consistent offset exists
    k = (pl.col("rank") == 1) & (pl.col("category") == "communication")
    jitter = pl.int_range(pl.len()).over(["rank", "category"]) % 2 * 400_000 - 200_000
    df = df.with_columns(pl.when(k).then(pl.col("dur_ns") + jitter + 300_000).otherwise(pl.col("dur_ns")).alias("dur_ns"))
    res = align_clocks(df, meta)
    assert any(q.code == "clock_residual_high" for q in res.quality)
