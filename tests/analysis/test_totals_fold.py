"""The map's parts reduced as they arrive (tracekit/analysis/stage/pipeline.py ``_Reduce``, ``_FOLD``): kernel
totals merged, and each analysis with a ``fold`` (the steps) folded over runs of consecutive ranks, give the same
totals, step table and JSON as one reduce of every rank's part, whatever order the parts arrive in."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import polars as pl
import pytest

from tracekit.analysis.passes.steps import step_finish, step_fold, step_part
from tracekit.analysis.stage import pipeline
from tracekit.analysis.stage.pipeline import LocalRunner, RankPart
from tracekit.api import analyze_result
from tracekit.schema import scan_trace

TRACE = Path(__file__).resolve().parents[1] / "fixtures" / "gpu" / "grouped.trace.parquet"


def _sorted(df: pl.DataFrame) -> pl.DataFrame:
    return df.sort(["category", "name", "other"])


class _Reversed(LocalRunner):
    """The local map, its parts handed over in reverse rank order (as a cluster's may end)."""

    def map(self, *a: Any, **k: Any) -> Iterator[RankPart]:
        yield from reversed(list(super().map(*a, **k)))


@pytest.mark.parametrize("fold", [1, 2])
def test_folding_changes_nothing(monkeypatch: pytest.MonkeyPatch, fold: int) -> None:
    once = analyze_result(TRACE)
    monkeypatch.setattr(pipeline, "_FOLD", fold)
    folded = analyze_result(TRACE, runner=_Reversed())
    assert len(once.to_json()["ranks"]) == 2
    assert _sorted(folded.kernel_totals).equals(_sorted(once.kernel_totals))
    assert folded.step_table.equals(once.step_table)
    assert folded.to_json() == once.to_json()


@pytest.mark.parametrize("by_time", [False, True])
def test_step_fold_is_the_parts_finish(by_time: bool) -> None:
    """step_fold of consecutive ranks' parts finishes as the parts do, with step ids on the ops and without (steps
    then by launch time: step_fold keeps each part's choice), and with a rank that has no step rows (None)."""
    df = scan_trace(TRACE).collect()
    if by_time:
        df = df.with_columns(pl.when(pl.col("kind") == "step").then(pl.col("step_id")).alias("step_id"))
    parts = [step_part(df.filter(pl.col("rank") == r)) for r in (0, 1)]
    assert all(p is not None for p in parts)
    assert (parts[0].by_time is not None) == by_time  # type: ignore[union-attr]
    whole = step_finish(parts)  # type: ignore[arg-type]
    one = step_fold([parts[0], None, parts[1]])
    assert one is not None
    got = step_finish([one])
    assert got.steps.equals(whole.steps)
    assert got.to_json(max_steps=50) == whole.to_json(max_steps=50)
    assert step_fold([None, None]) is None
