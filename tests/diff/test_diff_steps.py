"""diff compares like with like (issue 30 item 16): the steps both runs hold, paired by step number or order, a
noise band, and "no significant change" on identical steps."""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl
import pytest

from tracekit.analysis.steptime import job_steps
from tracekit.compare.diff import diff_runs, match_steps, summarize_result

TRACES = Path(os.environ.get("TRACEKIT_TRACES", "/work/shared/traces"))
MS = 1_000_000


def jobs(times_ms: list[float], ids: list[int] | None = None, rank: int = 0) -> pl.DataFrame:
    n = len(times_ms)
    return job_steps(pl.DataFrame({
        "rank": [rank] * n, "start_ns": [i * 200 * MS for i in range(n)], "step_ns": [int(t * MS) for t in times_ms],
        "step_id": ids if ids is not None else [None] * n, "mode": ["DECODE"] * n, "tokens": [8] * n,
    }, schema_overrides={"step_id": pl.Int64}))


def test_pairs_by_step_number_and_leaves_out_the_unshared() -> None:
    m = match_steps(jobs([10, 12, 11, 50], [5, 6, 7, 8]), jobs([10, 12, 11], [5, 6, 7]))
    assert (m.by, m.n, m.unpaired_before, m.unpaired_after) == ("label", 3, 1, 0)
    assert m.before_p50_ns == m.after_p50_ns == 11 * MS and m.rel == 0.0


def test_pairs_by_order_when_step_numbers_differ() -> None:
    m = match_steps(jobs([10, 10, 10], [1, 2, 3]), jobs([5, 5, 5, 5], [101, 102, 103, 104]))
    assert (m.by, m.n, m.unpaired_after) == ("ordinal", 3, 1)
    assert m.rel == pytest.approx(-0.5) and m.noise_frac == 0.02  # no spread: the floor


def test_noise_band_grows_with_the_spread_and_shrinks_with_steps() -> None:
    noisy = match_steps(jobs([8, 12, 9, 11, 10]), jobs([8, 12, 9, 11, 10]))
    many = match_steps(jobs([8, 12, 9, 11, 10] * 20), jobs([8, 12, 9, 11, 10] * 20))
    assert noisy.noise_frac > many.noise_frac > 0.02
    # a 5 % change inside a ±20 % band is no change; outside a tight band it is one
    d = match_steps(jobs([10.0] * 50), jobs([10.5] * 50))
    assert d.noise_frac == 0.02 and d.rel == pytest.approx(0.05)


@pytest.mark.skipif(not (TRACES / "hta/trace_compare").exists(), reason="shared traces not available")
def test_trace_compare_pair_reads_no_change(tmp_path: Path) -> None:
    """HTA's trace_compare pair holds the same two steps (100.3 and 122.1 ms); in the second, one step's GPU op
    lies outside it. It was '1.22x faster per step' (that step dropped from one side, a p50 of 2 vs 1 steps)."""
    from tracekit.api import analyze_result
    from tracekit.ingest.convert import convert

    paths = []
    for side in ("base", "test"):
        p = tmp_path / f"{side}.parquet"
        convert([TRACES / "hta/trace_compare" / side], p)
        paths.append(p)
    runs = [summarize_result(analyze_result(p), label=p.stem) for p in paths]
    d = diff_runs(runs[0], runs[1], labels=("base", "test"))
    assert d.verdict[0].startswith("no significant change in step time"), d.verdict
    assert d.steps is not None and d.steps.by == "label" and d.steps.n >= 1 and d.steps.rel == 0.0
    sc = {r["metric"]: r for r in d.scalars.to_dicts()}
    assert sc["steps_per_rank"]["before"] == sc["steps_per_rank"]["after"] == 2  # a step without GPU op still counts
    assert sc["step_p50"]["delta"] == 0.0
    mem = d.categories.filter(pl.col("bucket") == "memory").row(0, named=True)
    assert abs(mem["rel"] or 0.0) < 0.02  # per step: the same copies over the same two steps (was +100 %)
    assert {q.code for q in d.quality} >= {"diff_steps_unpaired"}
    # each note once: the same flag from both analyses is one line "(both runs)" (issue 30 item 11)
    notes = d.notes()
    assert [q.code for q, _ in notes].count("moe_not_detected") == 1
    assert ("moe_not_detected", "both runs") in {(q.code, who) for q, who in notes}
