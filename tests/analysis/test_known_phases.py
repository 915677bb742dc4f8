"""Idle causes against the known-phase program's own clock (capture_scripts/known_phases.py).

The CPU version runs here (torch CPU); the GPU version is an H200 capture's first cycle checked in under
tests/fixtures/gpu/known_phases (or any capture's directory in ``TRACEKIT_KNOWN_PHASES``), checked by the same function.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from tracekit.core import intervals as iv
from tracekit.analysis.passes.gaps import idle_causes

ROOT = Path(__file__).resolve().parents[2]


def _convert(trace: Path, out: Path) -> pl.DataFrame:
    from tracekit.categories import default_rules
    from tracekit.ingest.common import finalize_rank
    from tracekit.ingest.kineto import read_kineto

    return finalize_rank(read_kineto(trace, rank=0)[0], default_rules())


def idle_by_phase(df: pl.DataFrame, truth: dict) -> dict[str, dict[str, int]]:
    """Σ idle ns per (phase, cause): every gap clipped to each phase's range in the trace."""
    ic = idle_causes(df)
    ph = df.filter((pl.col("kind") == "range") & pl.col("name").cast(pl.String).str.starts_with("known_phase.")).select(
        pl.col("name").cast(pl.String).str.strip_prefix("known_phase.").alias("phase"), pl.col("ts_ns").alias("lo"),
        (pl.col("ts_ns") + pl.col("dur_ns")).alias("hi"))
    assert ph.height == len(truth["phases"])
    g = ic.gaps.filter(pl.col("cause") != "waiting_on_peer")
    assert (g["end_ns"] - g["start_ns"] == g["dur_ns"]).all()  # split gaps are disjoint pieces
    g = iv.clip(g.join(ph, how="cross"), pl.col("lo"), pl.col("hi"), start="start_ns", end="end_ns")
    t = g.group_by("phase", "cause").agg((pl.col("end_ns") - pl.col("start_ns")).sum().alias("ns"))
    out: dict[str, dict[str, int]] = {p: {} for p in ph["phase"].to_list()}
    for p, c, ns in t.iter_rows():
        out[p][c] = out[p].get(c, 0) + int(ns)
    return out


def check_truth(df: pl.DataFrame, truth: dict) -> dict[str, dict[str, int]]:
    by = idle_by_phase(df, truth)
    dur = {}
    for p in truth["phases"]:
        dur[p["name"]] = dur.get(p["name"], 0) + int(p["dur_ns"])
    sleep = by["sleep"]
    # host asleep: idle, never launch-bound (nor host sync / scheduler work); only the sync's return and the next
    # launch call at the sleep's edges (µs on a GPU) keep their causes
    busy_causes = sleep.get("launch_bound", 0) + sleep.get("host_sync", 0) + sleep.get("between_steps", 0)
    assert busy_causes <= 0.002 * dur["sleep"], sleep
    assert sleep.get("host_idle", 0) >= 0.9 * dur["sleep"]
    tiny = by["tiny"]
    assert tiny.get("launch_bound", 0) > 0 and tiny.get("host_sync", 0) > 0  # the .item() every 50
    assert tiny.get("launch_bound", 0) + tiny.get("host_sync", 0) <= dur["tiny"]
    # all launch-bound time of the run lies in phases where the host issues work: never more than those phases last
    lb = sum(v.get("launch_bound", 0) for v in by.values())
    assert lb <= dur["tiny"] + dur["gemm"] + dur["copy"]
    assert lb < 0.5 * dur["sleep"] + dur["tiny"]
    return by


def test_known_phases_cpu(tmp_path):
    pytest.importorskip("torch")
    r = subprocess.run([sys.executable, str(ROOT / "capture_scripts" / "known_phases.py"), "--out", str(tmp_path), "--phase-s", "0.3",
                        "--cycles", "1", "--tiny-max-iters", "3000", "--device", "cpu"], capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    truth = json.loads((tmp_path / "known_phases_truth.json").read_text())
    assert [p["name"] for p in truth["phases"]] == ["gemm", "sleep", "copy", "tiny"]
    df = _convert(tmp_path / "known_phases_trace.json", tmp_path)
    check_truth(df, truth)


def test_known_phases_gpu_capture():
    """The H200 capture's cycle 0 (tests/fixtures/gpu/known_phases, cut.py); TRACEKIT_KNOWN_PHASES (a directory holding
    a capture's trace + truth) overrides it."""
    d = Path(os.environ.get("TRACEKIT_KNOWN_PHASES") or ROOT / "tests" / "fixtures" / "gpu" / "known_phases")
    if not (d / "known_phases_truth.json").exists():
        pytest.fail(f"{d}: no known_phases_truth.json")
    truth = json.loads((d / "known_phases_truth.json").read_text())
    assert truth["device_mode"] == "gpu"
    tr = d / truth["trace"]
    if not tr.exists():  # gzipped after the run
        tr = tr.with_name(tr.name + ".gz")
    by = check_truth(_convert(tr, d), truth)
    dur: dict[str, int] = {}
    for p in truth["phases"]:
        dur[p["name"]] = dur.get(p["name"], 0) + int(p["dur_ns"])
    for ph, causes in by.items():
        print(f"{ph}: truth {dur[ph] / 1e6:.1f} ms;", ", ".join(f"{c} {ns / 1e6:.3f} ms" for c, ns in sorted(causes.items())))


def test_nsys_planted_host_stall_is_host_idle_not_launch_bound():
    """generated-h200/h200_1gpu: two planted host_stall gaps (cudaDeviceSynchronize + 4 ms sleep; nsys gpu_gaps: 4.26,
    4.22 ms) are host idle; the GPU's other gaps keep their causes."""
    p = Path(os.environ.get("TRACEKIT_TRACES", "/work/shared/traces")) / "nsys" / "generated-h200" / "h200_1gpu.sqlite"
    if not p.exists():
        pytest.skip("generated-h200 traces not available")
    from tracekit.categories import default_rules
    from tracekit.ingest.common import finalize_rank
    from tracekit.ingest.nsys import read_nsys

    ic = idle_causes(finalize_rank(read_nsys(p, rank=0)[0], default_rules()))
    top = ic.largest.head(2)
    assert top["cause"].to_list() == ["host_idle", "host_idle"]
    assert all(3_900_000 < d < 4_300_000 for d in top["dur_ns"].to_list())  # the 4 ms sleeps (minus the sync's return)
    tot = ic.by_rank_ns()["0"]
    assert 8_000_000 < tot["host_idle"] < 8_600_000 and tot["launch_bound"] > 0 and tot["host_sync"] > 0
