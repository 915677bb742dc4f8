"""Capture defaults that give a useful report (issue 30, items 2-6): CPU ranks from the cores, a window
schedule from the step time, an existing output refused before any work, a concise --help, and a clean
stderr when a program capture stops the program."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tracekit.capture import options as capture_options
from tracekit.capture.options import CaptureOptions, default_cpu_ranks
from tracekit.capture.profiler import CLOSE, KINETO_CHATTER, OPEN, AutoWindows, WindowSchedule, auto_prelude
from tracekit.cli import app

PROGRAMS = Path(__file__).with_name("programs")


# --- item 2: ranks adapt to the cores -------------------------------------------------------------------------

@pytest.mark.parametrize("cores,ranks", [(1, 2), (2, 2), (3, 2), (4, 2), (6, 3), (16, 8), (128, 8)])
def test_default_cpu_ranks_one_per_two_cores(cores: int, ranks: int):
    assert default_cpu_ranks(cores) == ranks


def test_resolve_device_cpu_default_follows_the_cores(monkeypatch: pytest.MonkeyPatch):
    from tracekit.capture import orchestrate

    monkeypatch.setattr(orchestrate, "host_cores", lambda: 2)
    assert orchestrate.resolve_device("cpu", None) == ("cpu", 2)  # was 8 ranks on 2 cores
    monkeypatch.setattr(orchestrate, "host_cores", lambda: 12)
    assert orchestrate.resolve_device("cpu", None) == ("cpu", 6)
    assert orchestrate.resolve_device("cpu", 5) == ("cpu", 5)  # an explicit --ranks wins


# --- item 3: the default schedule follows the step time ---------------------------------------------------------

def _simulate(auto: AutoWindows, *, step_s: float, slowdown: float, export_per_s: float, capture_s: float = 30.0,
              control_every: int = 4) -> tuple[float, int]:
    """Run the leader's decisions over a capture: steps of ``step_s`` (``slowdown`` x while profiled), a window's
    stop + export taking ``export_per_s`` s per recorded second, decisions every ``control_every`` steps.
    Returns (share of the wall time inside windows, windows)."""
    t = prof = 0.0
    step, rec, opened = 0, False, 0.0
    while t < capture_s:
        if step % control_every == 0:
            cmd = auto.decide(step, t, rec)
            if cmd == OPEN:
                rec, opened = True, t
                auto.opened(t)
            elif cmd == CLOSE:
                rec = False
                prof += t - opened
                stop = t
                t += export_per_s * (t - opened)
                auto.closed(stop, t)
        t += step_s * (slowdown if rec else 1.0)
        step += 1
    if rec:
        prof += t - opened
    return prof / capture_s, auto.n


@pytest.mark.parametrize("step_s,slowdown,export_per_s", [
    (0.010, 1.2, 0.2),   # GPU: fast steps, cheap exports
    (0.030, 3.0, 1.8),   # CPU mode on a quiet 2-core machine (stop + export ~35 µs per operator)
    (0.200, 1.5, 0.5),   # slow steps
    (0.002, 1.1, 0.1),
])
def test_auto_windows_profile_a_fifth_of_30s(step_s: float, slowdown: float, export_per_s: float):
    first = auto_prelude(step_s)
    assert 8 <= first <= 80
    share, n = _simulate(AutoWindows(first), step_s=step_s, slowdown=slowdown, export_per_s=export_per_s)
    assert share >= 0.2 and n >= 5, (share, n)
    # the old fixed default (5 steps every 200, after 80) profiled a few percent
    old = WindowSchedule(80, 5, 200)
    steps_30s = int(30 / step_s)
    assert sum(1 for i in range(steps_30s) if old.window_of(i) is not None) * step_s * slowdown / 30 < 0.2


def test_auto_windows_back_to_back_when_exports_dominate():
    share, n = _simulate(AutoWindows(10), step_s=0.03, slowdown=3.0, export_per_s=6.0)
    assert 0.12 < share < 1 / 7 + 0.02  # 1 s recorded per 1 + 6 s: the next window opens as the export ends
    auto = AutoWindows(0, max_windows=2)
    _simulate(auto, step_s=0.01, slowdown=1.0, export_per_s=0.1)
    assert auto.n == 2


def test_capture_options_default_is_the_auto_schedule():
    o = CaptureOptions()
    assert o.profile_steps is None and o.profile_every is None and o.profiling
    assert not CaptureOptions(profile_steps=0).profiling
    with pytest.raises(Exception, match="--profile-every needs --profile-steps"):
        CaptureOptions(profile_every=100).validate()


# --- item 4: an existing output is refused before the work starts -----------------------------------------------

def test_existing_output_refused_before_any_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from tracekit.capture import orchestrate
    from tracekit.commands import capture as cmd

    def no_work(*a: object, **k: object) -> None:
        raise AssertionError("work started before the output was checked")

    monkeypatch.setattr(cmd, "_sglang_detected", no_work)
    monkeypatch.setattr(orchestrate, "resolve_device", no_work)
    out = tmp_path / "trace.parquet"
    out.write_bytes(b"old")
    r = CliRunner().invoke(app, ["capture", "--duration", "1s", "-o", str(out)])
    assert r.exit_code == 3, r.output
    assert "exists; pass --force" in r.output and "nothing was captured" in r.output
    assert out.read_bytes() == b"old"
    r = CliRunner().invoke(app, ["capture", "-o", str(tmp_path / "no" / "t.parquet")])
    assert r.exit_code == 3 and "does not exist" in r.output
    (tmp_path / "t-load2.parquet").write_bytes(b"x")
    r = CliRunner().invoke(app, ["capture", "--load", "1,2", "-o", str(tmp_path / "t.parquet")])
    assert r.exit_code == 3 and "t-load2.parquet: exists" in r.output


def test_existing_output_refused_before_the_program_runs(tmp_path: Path):
    out = tmp_path / "trace.parquet"
    out.write_bytes(b"old")
    marker = tmp_path / "ran"
    r = CliRunner().invoke(app, ["capture", "-o", str(out), "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"])
    assert r.exit_code == 3 and "exists" in r.output
    assert not marker.exists()


# --- item 6: a concise --help ----------------------------------------------------------------------------------

def test_capture_help_is_concise_at_80_columns():
    r = CliRunner().invoke(app, ["capture", "--help"], env={"COLUMNS": "80", "TERM": "dumb"})
    assert r.exit_code == 0
    lines = r.output.rstrip("\n").splitlines()
    assert len(lines) <= 75, len(lines)  # was 143
    assert all(len(ln) <= 80 for ln in lines)
    assert "…" not in r.output  # no help text cut
    for flag in ("--duration", "--output", "--force", "--ranks", "--device", "--sglang", "--delay", "--profile-steps"):
        assert flag in r.output


# --- item 5: a clean stderr ------------------------------------------------------------------------------------

def test_kineto_chatter_pattern():
    assert KINETO_CHATTER.match(b"USDT:2026-12-03 12:05:23 13886:13886 SyncActivityProfilerHandler.cpp:52] profiler_start\n")
    assert KINETO_CHATTER.match(b"STAGE:2026-12-03 12:06:00 14640:14640 SyncActivityProfilerHandler.cpp:51] Completed Stage: Warm Up\n")
    assert KINETO_CHATTER.match(b"ERROR:2026-12-03 12:33:38 26465:26465 DeviceProperties.cpp:50] gpuGetDeviceCount failed with code 35\n")
    assert not KINETO_CHATTER.match(b"ERROR:2026-12-03 12:33:38 26465:26465 CuptiActivityApi.cpp:50] CUPTI_ERROR_INSUFFICIENT_PRIVILEGES\n")
    assert not KINETO_CHATTER.match(b"my program: USDT:2026 is a stock ticker\n")


def test_quiet_profiler_log_drops_kineto_lines_only():
    code = ("import os, sys\nfrom tracekit.capture.profiler import quiet_profiler_log\n"
            "with quiet_profiler_log():\n"
            "    os.write(2, b'USDT:2026-12-03 12:05:23 1:1 SyncActivityProfilerHandler.cpp:52] profiler_start\\n')\n"
            "    print('kept line', file=sys.stderr)\n"
            "    import torch\n"
            "    with torch.profiler.profile():\n"
            "        torch.ones(2) + 1\n"
            "print('after', file=sys.stderr)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == ["kept line", "after"], r.stderr


def _unexpected_stderr(stderr: str) -> list[str]:
    """Lines neither tracekit's own nor torchrun's start-up banner (which torchrun prints without tracekit too)."""
    banner = re.compile(r"^(W\d{4} [\d:.]+ \d+ torch/distributed/run\.py:\d+\] )?(\*+|Setting OMP_NUM_THREADS .*|)\s*$")
    return [ln for ln in stderr.splitlines() if ln.strip() and not ln.startswith("tracekit: ") and not banner.match(ln)]


@pytest.mark.timeout(300)
def test_torchrun_capture_stops_quietly(tmp_path: Path):
    out = tmp_path / "t.parquet"
    cmd = [sys.executable, "-m", "tracekit.cli", "capture", "--duration", "1s", "-o", str(out), "--",
           sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(PROGRAMS / "ddp_steps.py"),
           "--steps", "100000"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=280, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert out.exists()
    bad = _unexpected_stderr(r.stderr)
    assert not bad, "\n".join(bad[:40])  # no USDT lines, KeyboardInterrupt or SignalException traceback
    assert "warning:" not in r.stderr  # the notes (no telemetry on a CPU machine, the intended stop) stay in the trace


@pytest.mark.timeout(200)
def test_program_capture_stderr_clean(tmp_path: Path):
    out = tmp_path / "t.parquet"
    cmd = [sys.executable, "-m", "tracekit.cli", "capture", "--duration", "1s", "-o", str(out), "--",
           sys.executable, str(PROGRAMS / "tiny_moe.py"), "--steps", "100000"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    assert not _unexpected_stderr(r.stderr), r.stderr[-3000:]


def test_host_cores_is_the_affinity():
    assert capture_options.host_cores() == len(os.sched_getaffinity(0))
