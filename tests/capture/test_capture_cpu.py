"""End-to-end CPU captures: 8 gloo ranks through the CLI, and a rank crash that still yields a valid trace."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from tracekit.capture.options import CaptureOptions
from tracekit.capture.orchestrate import run_builtin
from tracekit.schema import read_trace

pytestmark = pytest.mark.timeout(400)


def test_cli_capture_8_cpu_ranks(tmp_path: Path):
    out = tmp_path / "trace.parquet"
    cmd = [sys.executable, "-m", "tracekit.cli", "capture", "--duration", "3s", "--device", "cpu", "--ranks", "8", "-o", str(out),
           "--unprofiled-steps", "4", "--profile-steps", "2", "--profile-every", "1000", "--min-steps", "8",
           "--no-progress", "--url", "http://127.0.0.1:9"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=380, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "8 CPU ranks (gloo)" in r.stderr
    df, meta = read_trace(out)
    assert sorted(df["rank"].unique().to_list()) == list(range(8))
    assert meta["world_size"] == 8 and len(meta["ranks"]) == 8
    # unprofiled steps come from tracekit's records; profiled ones from the Kineto window (the converter
    # drops the duplicate record of a step the trace itself carries)
    steps = df.filter(pl.col("kind") == "step")
    per_rank = steps.group_by("rank").len()["len"].to_list()
    assert len(per_rank) == 8 and len(set(per_rank)) == 1 and per_rank[0] >= 8  # all ranks stopped at the same step
    assert steps["profiled"].sum() == 2 * 8
    assert steps.filter(~pl.col("profiled"))["src"].cast(pl.String).unique().to_list() == ["tracekit.step"]
    names = df["name"].cast(pl.String)
    assert names.str.starts_with("tk.fwd[").sum() >= 8  # forward ranges from the profiler window
    assert names.is_in(["gloo:all_reduce", "c10d::allreduce_"]).sum() > 0  # collectives
    assert {"moe.experts", "router", "attn", "allreduce"} <= set(names.unique().to_list())
    cap = meta["capture"]
    assert len(cap["profiler_windows"]) == 1 and cap["target"] == "builtin"
    assert cap["summary"]["steps"] == per_rank[0]


def test_rank_crash_keeps_collected_data(tmp_path: Path):
    out = tmp_path / "crash.parquet"
    opts = CaptureOptions(duration_s=60, device="cpu", world=2, unprofiled_steps=2, profile_steps=2, profile_every=4,
                          crash_rank=1, crash_step=9, control_every=1, warmup_steps=2)
    res = run_builtin(opts, out, progress=False, say=lambda m: None)
    df, meta = read_trace(out)
    codes = {q["code"] for q in meta["quality"]}
    assert "capture_rank_crashed" in codes and "capture_rank_missing" in codes
    assert {q.get("rank") for q in meta["quality"] if q["code"] == "capture_rank_missing"} == {1}
    steps = df.filter(pl.col("kind") == "step")
    assert steps.filter(pl.col("rank") == 0).height >= 9  # rank 0's records survived
    assert res.out == out
    assert len(meta["capture"]["profiler_windows"]) >= 1
