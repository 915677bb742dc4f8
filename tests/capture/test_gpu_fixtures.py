"""The 2 x H200 fixtures captured with capture_scripts/gpu_suite.sh tell the intended story (read on CPU)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from tracekit.schema import read_trace

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "gpu"
VARIANTS = ("loop", "grouped", "grouped_p2p_off", "straggler", "graphs")


def _load(v: str) -> tuple[pl.DataFrame, dict]:
    return read_trace(FIX / f"{v}.trace.parquet")


@pytest.mark.parametrize("v", VARIANTS)
def test_fixture_shape(v: str):
    df, meta = _load(v)
    assert sorted(df["rank"].unique().to_list()) == [0, 1]
    names = set(df.filter(pl.col("kind") == "counter")["name"].cast(pl.String).unique().to_list())
    assert {"power_w", "sm_clock_mhz", "gpu_util_pct", "nvml_call_latency_us", "power_limit_w"} <= names
    steps = df.filter((pl.col("kind") == "step") & ~pl.col("profiled"))
    assert steps.group_by("rank").len()["len"].min() >= 80  # 2 x 40 unprofiled steps for replay calibration
    assert len(meta["capture"]["summary"]["blocks_median_ns"]) >= 2
    assert df.filter(pl.col("category") == "communication").height > 0
    r0 = meta["ranks"][0]
    assert r0["link_gen"] >= 1 and r0["power_limit_w"] > 0


def test_loop_vs_grouped_story():
    loop, lm = _load("loop")
    grp, gm = _load("grouped")

    def moe_kernels_per_step(df: pl.DataFrame) -> float:
        k = df.filter((pl.col("kind") == "kernel") & (pl.col("category") == "moe_gemm")).height
        return k / df.filter((pl.col("kind") == "step") & pl.col("profiled")).height

    assert moe_kernels_per_step(loop) > 20 * moe_kernels_per_step(grp)  # many small expert GEMMs
    assert gm["capture"]["summary"]["tokens_per_s"] > 2 * lm["capture"]["summary"]["tokens_per_s"]

    def mean_power(df: pl.DataFrame) -> float:
        return df.filter((pl.col("kind") == "counter") & (pl.col("name") == "power_w"))["value"].mean()

    assert mean_power(loop) < mean_power(grp)


def test_straggler_ground_truth():
    df, meta = _load("straggler")
    gt = meta["capture"]["ground_truth"]["straggler"]
    assert gt["rank"] == 0 and gt["delay_ms"] == 5.0 and gt["every"] == 4
    marks = df.filter(pl.col("src") == "tracekit.ground_truth")
    assert marks.height == gt["injected"] and set(marks["rank"].unique().to_list()) == {0}
    assert (marks["value"] >= 5.0).all()
