"""Streaming ``analyze(path)`` (lazy scans, one rank at a time) == ``analyze_frame`` on the whole frame.

Every case compares the two complete JSON objects (canonical JSON text: only key order is
ignored) on real captures, converted shared traces, a CPU-mode capture and hand-built traces
with planted stalls, PCIe counters, windows and profiler windows, under every option that
changes the numbers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from tracekit.analysis.stage.pipeline import ANALYSIS_COLUMNS, ScanSource, analysis_rows_expr
from tracekit.api import analyze, analyze_frame
from tracekit.schema import read_trace, scan_trace, write_trace

sys.path.insert(0, str(Path(__file__).resolve().parent))
from synth import build, counter_rows  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
GPU_FIXTURES = sorted((ROOT / "tests" / "fixtures" / "gpu").glob("*.trace.parquet"))
EXAMPLES = sorted((ROOT / "examples").glob("*/*.parquet"))
TRACES = Path(os.environ.get("TRACEKIT_TRACES", "/work/shared/traces"))


def _canon(res: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in res.items() if k != "trace"}, sort_keys=True, default=str)


def _first_diffs(a: Any, b: Any, path: str = "", out: list[str] | None = None) -> list[str]:
    out = [] if out is None else out
    if len(out) >= 8:
        return out
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            if k not in a or k not in b:
                out.append(f"{path}/{k}: missing on one side")
            else:
                _first_diffs(a[k], b[k], f"{path}/{k}", out)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            out.append(f"{path}: {len(a)} vs {len(b)} items")
        for i, (x, y) in enumerate(zip(a, b)):
            _first_diffs(x, y, f"{path}[{i}]", out)
    elif json.dumps(a, default=str) != json.dumps(b, default=str):
        out.append(f"{path}: {str(a)[:120]!r} != {str(b)[:120]!r}")
    return out


def assert_same(path: Path, **opts: Any) -> dict[str, Any]:
    """Streaming analyze == analyze_frame on the whole (unfiltered) frame; returns the result."""
    ranks = opts.pop("ranks", None)
    got = analyze(path, ranks=ranks, **opts)
    df, meta = read_trace(path, ranks=ranks)
    want = analyze_frame(df, meta, **opts)
    a, b = _canon(got), _canon(want)
    assert a == b, f"{path.name} {opts}: " + "; ".join(_first_diffs(json.loads(a), json.loads(b)))
    assert got["trace"] == str(path)
    return got


# ---------------------------------------------------------------------------------------------- real captures
@pytest.mark.parametrize("path", GPU_FIXTURES + EXAMPLES, ids=lambda p: p.name)
def test_checked_in_traces(path: Path) -> None:
    res = assert_same(path)
    assert res["ranks"] and sum(res["ranks"][0]["time_ns"].values()) == res["ranks"][0]["window_ns"]


@pytest.mark.parametrize("opts", [
    {"trim_transient": False},
    {"cross_rank": False},
    {"skip_steps": 2},
    {"window": "0.05s:0.9s"},
    {"ranks": [1]},
    {"top": 2},
])
def test_checked_in_options(opts: dict[str, Any]) -> None:
    assert_same(ROOT / "tests" / "fixtures" / "gpu" / "straggler.trace.parquet", **opts)


def test_profiler_windows_and_counters_are_exercised() -> None:
    """The GPU fixtures are windowed captures with NVML telemetry: spans, power and PCIe paths run."""
    res = assert_same(ROOT / "tests" / "fixtures" / "gpu" / "loop.trace.parquet")
    assert any(q["code"] == "profiler_windows" for q in res["quality"])
    assert res["power"]["has_counters"] and res["stalls"] is not None


# ---------------------------------------------------------------------------------------------- shared traces
def _convert(inputs: list[Path], out: Path) -> Path:
    from tracekit.ingest.convert import convert

    convert(inputs, out, force=True, jobs=1)
    return out


SHARED = {
    "hta_trace_filter": ["hta/trace_filter/sampled_rank-0.json.gz", "hta/trace_filter/sampled_rank-1.json.gz"],
    "nsys_tp2": ["nsys/generated-h200/tp2_rank0.sqlite", "nsys/generated-h200/tp2_rank1.sqlite"],
    "nsys_h200_1gpu": ["nsys/generated-h200/h200_1gpu.sqlite"],
    "nsys_ai_mfu_before": ["nsys/nsys-ai/mfu_2gpu_before.sqlite"],
    "nsys_ai_h100_2gpu": ["nsys/nsys-ai/h100_2gpu_1s.sqlite"],
}


@pytest.fixture(scope="module")
def shared_traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if not (TRACES / "hta").exists():
        pytest.skip("shared traces not available")
    d = tmp_path_factory.mktemp("shared")
    return {k: _convert([TRACES / p for p in v], d / f"{k}.parquet") for k, v in SHARED.items()}


@pytest.mark.parametrize("case", sorted(SHARED))
def test_shared_traces(case: str, shared_traces: dict[str, Path]) -> None:
    assert_same(shared_traces[case])
    assert_same(shared_traces[case], trim_transient=False, cross_rank=False)


def test_shared_trace_options(shared_traces: dict[str, Path]) -> None:
    p = shared_traces["nsys_tp2"]
    assert_same(p, window="0.1s:0.4s")
    assert_same(p, ranks=[0])
    assert_same(shared_traces["hta_trace_filter"], ranks=[1], cross_rank=False)


# ---------------------------------------------------------------------------------------------- CPU mode
@pytest.fixture(scope="module")
def cpu_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cpu") / "trace.parquet"
    cmd = [sys.executable, "-m", "tracekit.cli", "capture", "--device", "cpu", "--layers", "1", "--duration", "1s",
           "--unprofiled-steps", "2", "--profile-steps", "8", "--profile-every", "1000", "--no-progress",
           "--url", "http://127.0.0.1:9", "--ranks", "2", "--delay-rank", "1", "--delay-ms", "10", "--delay-every", "2",
           "--host-sync", "-o", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def test_cpu_mode_capture(cpu_trace: Path) -> None:
    res = assert_same(cpu_trace)
    assert res["device_mode"] == "cpu" and res["collectives"]["instances"] > 0
    assert_same(cpu_trace, trim_transient=False, skip_steps=1)


# ---------------------------------------------------------------------------------------------- hand-built
def _write(df: pl.DataFrame, meta: dict[str, Any], path: Path) -> Path:
    write_trace(df.sort(["rank", "ts_ns"]), path, meta, force=True)
    return path


def _stalls_trace(tmp_path: Path, **kw: Any) -> Path:
    df, meta = build(ranks=4, steps=8, layers=4, delay={1: (3, 400_000)}, host_sync={2: (2, 150_000)},
                     launch_gap={3: (1, 90_000)}, skew={3: 2_500_000}, **kw)
    t0, t1 = int(df["ts_ns"].min()), int((df["ts_ns"] + df["dur_ns"]).max())
    rows = []
    for r in range(4):  # PCIe RX near the link on ranks 0 and 2 for a while; power samples on every rank
        rows += counter_rows(r, "pcie_rx_bytes_per_s", t0, t1, 200_000, lambda t, r=r: 60e9 if r % 2 == 0 and (t - t0) % 3_000_000 < 1_200_000 else 2e9)
        rows += counter_rows(r, "power_w", t0, t1, 100_000, lambda t, r=r: 180.0 + 40 * r)
        rows += counter_rows(r, "sm_active_pct", t0, t1, 100_000, lambda t: 55.0)
    from tracekit.schema import frame_from_rows

    return _write(pl.concat([df, frame_from_rows(rows)]), meta, tmp_path / "stalls.parquet")


def test_hand_built_stalls_pcie_power(tmp_path: Path) -> None:
    p = _stalls_trace(tmp_path)
    res = assert_same(p)
    assert res["collectives"]["stall_count"] > 0 and res["pcie_phases"] and res["power"]["has_counters"]
    assert res["window"]["reason"] == "transient_trimmed"  # rank 3 started 2.5 ms late
    causes = {s["cause"] for s in res["stalls"]}
    assert {"delayed_forward", "host_sync"} <= causes
    for opts in ({"trim_transient": False}, {"skip_steps": 3}, {"window": "1ms:9ms"}, {"ranks": [0, 2]},
                 {"ranks": [1, 2, 3]}, {"cross_rank": False}):
        assert_same(p, **opts)


def test_hand_built_profiler_windows_and_memcpy_pcie(tmp_path: Path) -> None:
    df, meta = build(ranks=3, steps=10, layers=2, delay={0: (4, 300_000)}, custom_allreduce=True)
    from tracekit.schema import frame_from_rows

    t0 = int(df["ts_ns"].min())
    # big host-to-device copies on rank 1 (PCIe from memcpy: no counters), one runtime sync per step
    extra = [dict(rank=1, kind="memcpy", ts_ns=t0 + 1_000_000 + i * 2_000_000, dur_ns=600_000, name="Memcpy HtoD (Pinned -> Device)",
                  category="memory", family="memcpy", memcpy_kind="HtoD", bytes=36_000_000, stream=9) for i in range(5)]
    steps = df.filter(pl.col("kind") == "step").sort("ts_ns")
    s = steps["ts_ns"].to_list()
    windows = [[s[1], s[4]], [s[7], s[9] + 10_000]]
    meta = dict(meta, capture={"profiler_windows": windows})
    p = _write(pl.concat([df, frame_from_rows(extra)]), meta, tmp_path / "windows.parquet")
    res = assert_same(p)
    assert any(q["code"] == "profiler_windows" for q in res["quality"])
    assert any(ph["source"] == "memcpy" for ph in res["pcie_phases"])
    assert_same(p, skip_steps=2)
    assert_same(p, trim_transient=False, ranks=[1, 2])


def test_hand_built_steps_without_step_ids_and_empty_ranks(tmp_path: Path) -> None:
    """No op carries a step_id (steps by launch time, a global decision); a rank with CPU rows only."""
    df, meta = build(ranks=2, steps=4, layers=2)
    df = df.with_columns(pl.when(pl.col("kind") == "step").then(pl.col("step_id")).otherwise(None).alias("step_id"))
    from tracekit.schema import frame_from_rows

    lonely = frame_from_rows([dict(rank=2, kind="runtime", ts_ns=int(df["ts_ns"].min()) + 5, dur_ns=10, name="cudaGetDevice"),
                              dict(rank=2, kind="cpu_op", ts_ns=int(df["ts_ns"].min()) + 50, dur_ns=10, name="aten::empty")])
    p = _write(pl.concat([df, lonely]), dict(meta, world_size=3), tmp_path / "nostep.parquet")
    res = assert_same(p)
    assert any(q["code"] == "step_by_time" for q in res["steps"]["quality"])
    assert [r["rank"] for r in res["ranks"]] == [0, 1]


def test_empty_and_gpu_free_traces(tmp_path: Path) -> None:
    from tracekit.schema import frame_from_rows

    df = frame_from_rows([dict(rank=0, kind="cpu_op", ts_ns=1_000, dur_ns=10, name="aten::add"),
                          dict(rank=1, kind="runtime", ts_ns=2_000, dur_ns=10, name="cudaStreamSynchronize")])
    p = _write(df, {"world_size": 2}, tmp_path / "nogpu.parquet")
    res = assert_same(p)
    assert res["window"]["reason"] == "empty" and res["ranks"] == []
    assert_same(p, window="0s:1s")


# ---------------------------------------------------------------------------------------------- the projection
def test_rank_read_is_projected_and_filtered() -> None:
    """One rank's read holds only the analysis columns and drops launch calls and plain CPU operators."""
    path = ROOT / "tests" / "fixtures" / "gpu" / "grouped.trace.parquet"
    lf = scan_trace(path)
    [(ranks, df)] = list(ScanSource(path, lf).parts([1]))
    assert ranks == [1] and df.columns == ANALYSIS_COLUMNS and set(df["rank"].unique().to_list()) == {1}
    full = lf.filter(pl.col("rank") == 1).collect()
    assert df.height < full.height / 2
    kept = full.filter(analysis_rows_expr())
    assert df.height == kept.height
    launches = df.filter((pl.col("kind") == "runtime") & (pl.col("name").cast(pl.String) == "cudaLaunchKernel"))
    assert launches.height == 0
