"""The README's main job on this machine (issue 30, "done when"): `tracekit capture --duration 30s -o
trace.parquet && tracekit analyze trace.parquet` in a fresh directory, with the defaults a new user gets.

It must run without a warning or traceback the user did not cause, keep a useful share of the 30 s in
profiler windows, and its report must have steps, idle by cause and collectives."""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tracekit.capture.options import default_cpu_ranks, host_cores
from tracekit.schema import read_metadata

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACEKIT_")}
    return subprocess.run([sys.executable, "-m", "tracekit.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=1100, env=env)


def _clean(stderr: str) -> list[str]:
    """stderr lines that are not tracekit's own progress notes (its `tracekit: ...` lines without 'warning')."""
    return [ln for ln in stderr.splitlines() if ln.strip() and not (ln.startswith("tracekit: ") and "warning" not in ln)]


def test_readme_main_job(tmp_path: Path):
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    cap = _cli("capture", "--duration", "30s", "-o", "trace.parquet", cwd=tmp_path)
    t_cap = time.monotonic() - t0
    assert cap.returncode == 0, cap.stderr[-3000:]
    an = _cli("analyze", "trace.parquet", cwd=tmp_path)
    wall = time.monotonic() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    assert an.returncode == 0, an.stderr[-3000:]
    print(f"main job: capture {t_cap:.1f} s, total {wall:.1f} s wall, {cpu:.1f} s CPU (children)")
    # no warning or traceback the user did not cause
    assert _clean(cap.stderr) == [], cap.stderr[-3000:]
    assert an.stderr.strip() == "", an.stderr[-3000:]
    assert "Traceback" not in cap.stdout + an.stdout
    assert "oversubscribed" not in an.stdout
    # the defaults: ranks from the cores, windows holding a useful share of the 30 s
    meta = read_metadata(tmp_path / "trace.parquet")
    assert meta["world_size"] == default_cpu_ranks(host_cores())
    wins = meta["capture"]["profiler_windows"]
    r0 = meta["ranks"][0]
    loop_s = (r0["loop_end_ns"] - r0["loop_start_ns"]) / 1e9
    share = sum(b - a for a, b in wins) / 1e9 / loop_s
    recorded = sum(b - a for a, b in wins) / 1e9
    export_s = max(r["export_s"] for r in meta["ranks"])
    print(f"windows: {len(wins)}, {recorded:.2f} s recorded = {share:.0%} of the {loop_s:.1f} s loop; export {export_s:.1f} s")
    if export_s <= 2 * recorded:  # an unloaded machine: a window's stop + export is under twice its length
        assert share >= 0.2 and len(wins) >= 3, (share, wins, export_s)
    else:  # a loaded machine: exports dominate, and the windows follow each other as exports end
        assert share >= 0.6 * recorded / (recorded + export_s), (share, recorded, export_s)
    # the report: steps, idle by cause, collectives (terminal) and the same in --json
    js = json.loads(_cli("analyze", "trace.parquet", "--json", cwd=tmp_path).stdout)
    assert js["steps"]["summary"] and any(any(v for v in c.values()) for c in js["idle_causes_ns"].values())
    assert js["collectives"]["groups"]
    text = an.stdout.lower()
    for word in ("step", "idle", "gloo"):
        assert re.search(word, text), word
