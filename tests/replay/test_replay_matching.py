"""Replay's collective instances come from the one matching (core.collectives.match_collectives), or from
the analysis result's instances when the caller has them (issue 16: one owner per concept)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from tracekit.api import analyze_result
from tracekit.replay.graph import build_graph
from tracekit.schema import read_trace

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "gpu"


@pytest.mark.parametrize("name", ["straggler", "loop"])
def test_instances_from_the_analysis_equal_replays_own_matching(name: str) -> None:
    p = FIX / f"{name}.trace.parquet"
    if not p.exists():
        pytest.skip("GPU fixtures absent")
    df, _meta = read_trace(p)
    res = analyze_result(p)
    own = build_graph(df)
    given = build_graph(df, res.instances_in_input_time())
    cols = [c for c in own.instances.columns if c != "key"]
    assert own.instances.height == given.instances.height > 0
    assert own.instances.select(cols).equals(given.instances.select(cols))
    assert (own.vinst == given.vinst).all()
    # instances in the analysis window come from the analysis; the collectives outside it are matched here
    keys = given.instances["key"]
    n_rest = int(keys.str.starts_with("rest:").sum())
    n_view = res.instances.select(pl.struct("pg", "seq").n_unique()).item()
    assert keys.len() - n_rest == n_view
    if name == "straggler":  # its analysis window trims the start: those collectives are matched by replay
        assert n_rest > 0
    # the transfer is the analysis' definition (min duration over the instance's ranks)
    tr = res.instances.group_by("pg", "seq").agg(pl.col("transfer_ns").first(), pl.col("dur_ns").min())
    assert (tr["transfer_ns"] == tr["dur_ns"]).all()
