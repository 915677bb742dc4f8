"""step_finish over per-rank parts: the reduce keeps the step table's order and count whatever order the parts come in,
without copying an already-ordered table (tracekit/analysis/passes/steps.py)."""

from __future__ import annotations

import polars as pl

from tracekit.analysis.passes.steps import _pairs, _rank_time_ordered, step_finish, step_part


def _rank_frame(rank: int, n: int, t0: int) -> pl.DataFrame:
    rows = []
    for i in range(n):
        s = t0 + i * 1_000_000
        rows.append({"rank": rank, "kind": "step", "ts_ns": s, "dur_ns": 900_000, "step_id": i, "category": None,
                     "launch_ts_ns": None, "step_mode": "decode", "batch_size": 4, "tokens": 4, "profiled": True, "stream": None,
                     "name": f"ProfilerStep#{i}"})
        rows.append({"rank": rank, "kind": "kernel", "ts_ns": s + 100_000, "dur_ns": 500_000, "step_id": i, "category": "attention",
                     "launch_ts_ns": s + 50_000, "step_mode": None, "batch_size": None, "tokens": None, "profiled": None,
                     "stream": 7, "name": "k"})
    return pl.DataFrame(rows, schema_overrides={"rank": pl.Int32, "step_mode": pl.Categorical, "category": pl.Categorical,
                                                "batch_size": pl.Int64, "tokens": pl.Int64, "launch_ts_ns": pl.Int64, "stream": pl.Int64})


def test_parts_in_any_order_reduce_to_one_ordered_table() -> None:
    frames = {r: _rank_frame(r, 5 + r, 10_000_000 * (3 - r)) for r in range(3)}
    whole = step_finish([step_part(pl.concat([frames[r] for r in range(3)], how="vertical_relaxed"))])
    shuffled = step_finish([step_part(frames[r]) for r in (2, 0, 1)])
    ordered = step_finish([step_part(frames[r]) for r in range(3)])
    for got in (shuffled, ordered):
        assert got.steps.equals(whole.steps)
        assert got.to_json() == whole.to_json()
    assert whole.to_json()["count"] == 5 + 6 + 7 == _pairs(whole.steps)
    assert _rank_time_ordered(ordered.steps)
    assert not _rank_time_ordered(pl.concat([step_part(frames[r]).by_id for r in (2, 0, 1)], how="vertical_relaxed"))  # type: ignore[union-attr]
