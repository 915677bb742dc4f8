"""Kernel totals folded while the map runs (tracekit/analysis/stage/pipeline.py ``_TOTALS_FOLD``): the same totals and
the same JSON as one merge of every rank's part."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from tracekit.analysis.stage import pipeline
from tracekit.api import analyze_result

TRACE = Path(__file__).resolve().parents[1] / "fixtures" / "gpu" / "grouped.trace.parquet"


def _sorted(df: pl.DataFrame) -> pl.DataFrame:
    return df.sort(["category", "name", "other"])


def test_folding_every_part_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    once = analyze_result(TRACE)
    monkeypatch.setattr(pipeline, "_TOTALS_FOLD", 1)  # a merge after every rank's part
    folded = analyze_result(TRACE)
    assert len(once.to_json()["ranks"]) == 2
    assert _sorted(folded.kernel_totals).equals(_sorted(once.kernel_totals))
    assert folded.to_json() == once.to_json()
