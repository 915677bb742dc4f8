"""Real CPU (gloo) captures of the built-in workload, made once per session through the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

#: the planted straggler (issue 3 acceptance): rank 1 sleeps 30 ms before every 3rd forward
STRAGGLER = ["--ranks", "4", "--delay-rank", "1", "--delay-ms", "30", "--delay-every", "3"]
#: a planted per-layer host sync, with the loop MoE (per-expert GEMMs)
HOST_SYNC = ["--ranks", "2", "--host-sync", "--moe-impl", "loop"]
#: small and fast: 1 layer, 2 unprofiled steps, one window of 16 profiled steps (5 delays fall inside it); at least 18
#: steps, so a loaded machine still profiles the whole window within the 1 s
COMMON = ["--device", "cpu", "--layers", "1", "--duration", "1s", "--min-steps", "18", "--unprofiled-steps", "2", "--profile-steps", "16",
          "--profile-every", "1000", "--no-progress", "--url", "http://127.0.0.1:9"]


def capture(out: Path, args: list[str]) -> Path:
    """Run ``tracekit capture`` (the CLI, in a subprocess) and return the trace path."""
    cmd = [sys.executable, "-m", "tracekit.cli", "capture", *COMMON, *args, "-o", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert r.returncode == 0, r.stderr[-3000:]
    return out


@pytest.fixture(scope="session")
def straggler_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return capture(tmp_path_factory.mktemp("cpu_straggler") / "trace.parquet", STRAGGLER)


@pytest.fixture(scope="session")
def host_sync_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return capture(tmp_path_factory.mktemp("cpu_host_sync") / "trace.parquet", HOST_SYNC)
