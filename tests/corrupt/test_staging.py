"""Part directories left by killed conversions (issue 20): named after their process and host, removed
by the next conversion into that directory when the owner is gone, never while it runs
(tracekit.ingest.staging)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from corrupt._build import TF0, cli, need
from tracekit.ingest import staging
from tracekit.ingest.staging import LEGACY_STALE_S, PARTS_PREFIX, host_tag, make_part_dir, remove_stale_parts


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _part(d: Path, name: str, age_s: float = 0.0) -> Path:
    p = d / f"{PARTS_PREFIX}{name}"
    p.mkdir()
    (p / "part.0.parquet").write_bytes(b"x" * 100)
    if age_s:
        t = time.time() - age_s
        for f in (p / "part.0.parquet", p):
            os.utime(f, (t, t))
    return p


def test_part_directory_names_carry_pid_and_host(tmp_path: Path) -> None:
    d = Path(make_part_dir(str(tmp_path)))
    assert re.fullmatch(rf"\.tracekit-parts-{os.getpid()}-{re.escape(host_tag())}-[a-z0-9_]+", d.name), d.name
    assert remove_stale_parts(str(tmp_path)) == [] and d.exists()  # our own: kept


def test_dead_owner_on_this_host_is_removed_live_one_kept(tmp_path: Path) -> None:
    dead = _part(tmp_path, f"{_dead_pid()}-{host_tag()}-abc")
    old_style = _part(tmp_path, f"{_dead_pid()}-def")  # tracekit that named pid only
    live = _part(tmp_path, f"{os.getppid()}-{host_tag()}-ghi")  # the test runner's parent: started long before
    assert sorted(remove_stale_parts(str(tmp_path))) == sorted([dead.name, old_style.name])
    assert not dead.exists() and not old_style.exists() and live.exists()


def test_another_hosts_directory_is_never_removed(tmp_path: Path) -> None:
    """On a shared filesystem a pid of another host means nothing here: keep its directory."""
    other = _part(tmp_path, f"{_dead_pid()}-{host_tag()}x-other-abc", age_s=10 * LEGACY_STALE_S)
    assert remove_stale_parts(str(tmp_path)) == [] and other.exists()


def test_reused_pid_is_recognized_by_its_start_time(tmp_path: Path) -> None:
    """The pid runs, but that process started after the directory last changed: not its owner."""
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        time.sleep(0.2)
        reused = _part(tmp_path, f"{sleeper.pid}-{host_tag()}-old", age_s=120)  # made 2 min before the process started
        owned = _part(tmp_path, f"{sleeper.pid}-{host_tag()}-new")  # changed after it started: may be its own
        assert remove_stale_parts(str(tmp_path)) == [reused.name]
        assert not reused.exists() and owned.exists()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_legacy_name_without_pid_by_age_and_open_files(tmp_path: Path) -> None:
    fresh = _part(tmp_path, "k2j4h5g6")  # tracekit before the pid was in the name
    old = _part(tmp_path, "a1b2c3d4", age_s=2 * LEGACY_STALE_S)
    held = _part(tmp_path, "zz9y8x7w", age_s=2 * LEGACY_STALE_S)
    with open(held / "part.0.parquet", "rb"):  # a live process (this one) has a file in it open
        t = time.time() - 2 * LEGACY_STALE_S
        os.utime(held, (t, t))
        assert remove_stale_parts(str(tmp_path)) == [old.name]
    assert fresh.exists() and not old.exists() and held.exists()


def test_legacy_directory_kept_when_open_files_cannot_be_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old = _part(tmp_path, "a1b2c3d4", age_s=2 * LEGACY_STALE_S)
    monkeypatch.setattr(staging, "_held_open", lambda path: None)
    assert remove_stale_parts(str(tmp_path)) == [] and old.exists()


def test_sigkilled_convert_leaves_a_named_directory_the_next_convert_removes(tmp_path: Path) -> None:
    """End to end: a real `tracekit convert` killed by SIGKILL (as by the OOM killer) while it works."""
    need(TF0)
    exe = Path(sys.executable).with_name("tracekit")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "tracekit.cli"]
    out = tmp_path / "trace.parquet"
    p = subprocess.Popen([*cmd, "convert", str(TF0), "-o", str(out), "-q"], stderr=subprocess.DEVNULL)
    try:
        t0 = time.monotonic()
        while not list(tmp_path.glob(f"{PARTS_PREFIX}*")):
            assert p.poll() is None, "convert ended before its part directory was seen"
            assert time.monotonic() - t0 < 60
            time.sleep(0.01)
        p.send_signal(signal.SIGKILL)
        p.wait()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    left = [d.name for d in tmp_path.glob(f"{PARTS_PREFIX}*")]
    assert left and all(n.startswith(f"{PARTS_PREFIX}{p.pid}-{host_tag()}-") for n in left), left
    assert not out.exists()
    q = cli("convert", TF0, "-o", out, "-q")
    assert q.returncode == 0, q.stderr
    assert list(tmp_path.glob(f"{PARTS_PREFIX}*")) == [] and out.exists()
