"""The per-rank work as separate tasks (:class:`tracekit.analysis.stage.pipeline.RankRunner`) == the local run.

A runner that treats every task as a distributed engine would: the overview one task per rank, the map's
inputs (window, plan) and outputs (:class:`~tracekit.analysis.stage.pipeline.RankPart`) through pickle, the
ranks run in reverse order and their parts handed back in that order. The analyze JSON must be the local
one, field for field — on real 2-GPU captures (NCCL collectives matched across ranks, a planted straggler,
steps, the next win). Without Dask, so the runner contract is checked on every run of the suite (the
cluster tests need a local cluster).
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any, Iterator, TypeVar

import polars as pl
import pytest

from tracekit.analysis.plan import CrossRankPlan
from tracekit.analysis.stage.pipeline import AfterFinish, FinishedRun, RankPart, StageOutput, analyze_rank
from tracekit.api import analyze, analyze_result
from tracekit.core.window import Overview, Window, combine_bounds, overview_of, rank_overview, span_bounds

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "tests" / "fixtures" / "gpu"
T = TypeVar("T")


def _wire(x: T) -> T:
    """``x`` as another process would receive it."""
    out: T = pickle.loads(pickle.dumps(x))
    return out


class _TaskRunner:
    """Each rank's work a task of its own, inputs and outputs through pickle, ranks in reverse order."""

    def __init__(self) -> None:
        self.order: list[int] = []

    def overview(self, source: Any, profiler_windows: list[list[int]] | None) -> tuple[Overview, pl.DataFrame | None]:
        lf = source.lazy()
        present = sorted(int(r) for r in lf.select(pl.col("rank").unique()).collect()["rank"].to_list())
        got = {r: _wire(rank_overview(lf, r)) for r in reversed(present)}
        ov = overview_of(pl.concat([got[r][0] for r in present]), pl.concat([got[r][1] for r in present]),
                         pl.concat([got[r][2] for r in present]))
        if not profiler_windows or len(profiler_windows) < 2:
            return ov, None
        rows = [_wire(span_bounds(lf.filter(pl.col("rank") == r), profiler_windows, cpu_ranks=[r] if r in ov.cpu_ranks else []))
                for r in reversed(present)]
        return ov, combine_bounds(rows)

    def map(self, source: Any, ranks: list[int], win: Window, plan: CrossRankPlan | None, split: bool) -> Iterator[RankPart]:
        for r in reversed(ranks):
            self.order.append(r)
            (rs, df), = source.parts([r])
            yield _wire(analyze_rank(df, rs, _wire(win), _wire(plan), split, source.host(rs) if plan is not None else None))

    def after(self, stage: AfterFinish, run: FinishedRun) -> StageOutput:
        return _wire(stage(run))


def _canon(res: dict[str, Any]) -> str:
    return json.dumps(res, sort_keys=True, default=str)


@pytest.mark.parametrize("name", ["straggler", "grouped", "loop"])
def test_tasks_in_any_order_give_the_local_json(name: str) -> None:
    path = GPU / f"{name}.trace.parquet"
    runner = _TaskRunner()
    got = analyze_result(path, runner=runner).to_json()
    assert runner.order == sorted(runner.order, reverse=True) and len(runner.order) == 2  # really out of order
    assert _canon(got) == _canon(analyze(path))


def test_tasks_take_the_options() -> None:
    path = GPU / "straggler.trace.parquet"
    opts: dict[str, Any] = {"skip_steps": 2, "trim_transient": False, "top": 3}
    got = analyze_result(path, runner=_TaskRunner(), **opts).to_json()
    assert got["window"]["skipped_steps"] == 2
    assert _canon(got) == _canon(analyze(path, **opts))


def test_a_rank_part_is_small() -> None:
    # what a map task sends back is kilobytes, not the rank's rows
    path = GPU / "loop.trace.parquet"
    parts: list[RankPart] = []

    class Keep(_TaskRunner):
        def map(self, *a: Any, **k: Any) -> Iterator[RankPart]:
            for p in super().map(*a, **k):
                parts.append(p)
                yield p

    analyze_result(path, runner=Keep())
    assert parts and all(p.ranks is not None and len(p.ranks) == 1 for p in parts)
    assert max(len(pickle.dumps(p)) for p in parts) < 200_000 < path.stat().st_size
