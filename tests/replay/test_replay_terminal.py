"""The replay text report (tracekit.report.replay_terminal): the calibration lines say what was fitted."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from tracekit.replay import replay
from tracekit.report.replay_terminal import render_replay
from tracekit.schema import read_trace

TRUTH = Path(__file__).resolve().parent / "truth"


def _text(case: str, calibrate: bool = True) -> str:
    df, meta = read_trace(TRUTH / f"{case}.trace.parquet")
    buf = io.StringIO()
    render_replay(replay(df, meta, ["moe_gemm=0.5"], calibrate=calibrate), Console(file=buf, width=120))
    return buf.getvalue()


def _noise_lines(out: str) -> int:
    return sum(line.startswith("noise floor") for line in out.splitlines())


def test_graph_step_says_which_profiler_distortion_it_removed() -> None:
    out = _text("qwen3big_g")  # GPU-bound, one CUDA graph per step: both fits apply
    assert "profiler distortion removed: calls' own time ×" in out
    assert "GPU gaps between queued ops ×" in out
    assert _noise_lines(out) == 1 and "noise floor (two halves of" in out


def test_eager_host_calibrated_step_prints_no_distortion_line() -> None:
    out = _text("tk_grouped")  # host-bound: the CPU-gap scale alone fits
    assert "profiler distortion removed" not in out
    assert _noise_lines(out) == 1
