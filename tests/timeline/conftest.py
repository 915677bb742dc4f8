"""Fixtures for tests/timeline (helpers live in _util.py)."""

from __future__ import annotations

import pytest

from tracekit.schema import frame_from_rows

from ._util import small_rows


@pytest.fixture
def small_df():
    return frame_from_rows(small_rows())


#: a small windowed CPU (gloo) capture of the built-in workload: 4 ranks, 1 layer, 2 profiler windows of 4 steps
CPU_CAPTURE = ["--device", "cpu", "--ranks", "4", "--layers", "1", "--duration", "1s", "--min-steps", "14", "--unprofiled-steps", "2",
               "--profile-steps", "4", "--profile-every", "6", "--max-windows", "2", "--no-progress",
               "--url", "http://127.0.0.1:9"]


@pytest.fixture(scope="session")
def cpu_capture(tmp_path_factory):
    """``tracekit capture`` on CPU ranks through the CLI (a subprocess); skipped without torch."""
    import os
    import subprocess
    import sys

    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("tl_cpu") / "cpu.parquet"
    r = subprocess.run([sys.executable, "-m", "tracekit.cli", "capture", *CPU_CAPTURE, "-o", str(out)],
                       capture_output=True, text=True, timeout=400, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert r.returncode == 0, r.stderr[-3000:]
    return out
