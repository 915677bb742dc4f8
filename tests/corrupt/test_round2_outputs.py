"""Reliability round two (issue 20): nothing lost, usage errors for bad option values, OS errors on outputs.

Outputs: no command writes over one of its own inputs whatever the flags, a
device, FIFO or directory named as output is refused, permission and disk-full
errors are one line (exit 3) with the previous output kept. Options: windows
outside the trace, non-finite values and negative counts are usage errors (64).
"""

from __future__ import annotations

import builtins
import errno
import hashlib
import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from corrupt._build import TF0, assert_clean_error, cli_inproc, dump, load, need

pytestmark = pytest.mark.filterwarnings("ignore")

run = cli_inproc


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    """A real trace.parquet converted from rank 0 of the shared A100 trace."""
    need(TF0)
    d = tmp_path_factory.mktemp("good")
    src = dump(load(TF0), d / "rank0.json.gz")
    out = d / "trace.parquet"
    p = run("convert", src, "-o", out, "-q")
    assert p.returncode == 0, p.stderr
    return out


@pytest.fixture()
def trace(good: Path, tmp_path: Path) -> Path:
    t = tmp_path / "b.parquet"
    shutil.copy(good, t)
    return t


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _leftovers(d: Path) -> list[str]:
    return sorted(n for n in os.listdir(d) if n.startswith(".") and (n.endswith(".tmp") or n.startswith(".tracekit-parts-")))


# ---- no command writes over its own inputs ---------------------------------------------------------


def test_replay_out_is_its_input_even_with_force(trace: Path) -> None:
    before = _sha(trace)
    p = run("replay", trace, "--out", trace, "--force")
    assert_clean_error(p, "b.parquet", "overwrite an input", code=64)
    assert _sha(trace) == before


def test_replay_out_is_the_durations_from_file(trace: Path, tmp_path: Path) -> None:
    other = tmp_path / "c.parquet"
    shutil.copy(trace, other)
    before = _sha(other)
    p = run("replay", trace, "--durations-from", other, "--out", other, "--force")
    assert_clean_error(p, "c.parquet", "overwrite an input", code=64)
    assert _sha(other) == before


def test_output_through_a_symlink_or_hard_link_to_the_input(trace: Path, tmp_path: Path) -> None:
    before = _sha(trace)
    (tmp_path / "link.parquet").symlink_to(trace)
    os.link(trace, tmp_path / "hard.parquet")
    for out in ("link.parquet", "hard.parquet"):
        for args in (("replay", trace, "--out"), ("timeline", trace, "-o"), ("export", trace, "--perfetto"),
                     ("analyze", trace, "--html")):
            p = run(*args, tmp_path / out, "--force")
            assert p.returncode in (2, 3, 64) and "Traceback" not in p.stderr, (args, p.stderr)
            assert _sha(trace) == before
    assert _leftovers(tmp_path) == []


def test_diff_html_is_an_input(trace: Path, tmp_path: Path) -> None:
    other = tmp_path / "c.parquet"
    shutil.copy(trace, other)
    before = _sha(other)
    p = run("diff", trace, other, "--html", other, "--force")
    assert_clean_error(p, "overwrite an input", code=64)
    assert _sha(other) == before


# ---- outputs that are not files ---------------------------------------------------------------------


def _convert_args(tmp_path: Path) -> list[str | Path]:
    src = tmp_path / "src" / "rank0.json.gz"
    if not src.exists():
        dump(load(TF0), src)
    return ["convert", src]


@pytest.mark.parametrize("kind", ["char_device", "fifo", "directory"])
def test_output_that_is_not_a_regular_file_is_refused(kind: str, trace: Path, tmp_path: Path) -> None:
    target = tmp_path / "target"
    if kind == "char_device":
        target.symlink_to("/dev/null")  # -o through a link: the device itself would be replaced by a bug
    elif kind == "fifo":
        os.mkfifo(target)
    else:
        target.mkdir()
    cmds = [
        [*_convert_args(tmp_path), "-o", target, "--force"],
        ["timeline", trace, "-o", target, "--force"],
        ["export", trace, "--perfetto", target, "--force"],
        ["replay", trace, "--out", target, "--force"],
        ["analyze", trace, "--html", target, "--force"],
    ]
    word = {"char_device": "character device", "fifo": "FIFO", "directory": "directory"}[kind]
    for c in cmds:
        msg = assert_clean_error(run(*c), str(target), word, code=3)
        assert "free disk space" not in msg
    assert os.path.islink(target) if kind == "char_device" else True
    assert Path("/dev/null").is_char_device()
    if kind == "fifo":
        import stat

        assert stat.S_ISFIFO(os.stat(target).st_mode)
    if kind == "directory":
        assert target.is_dir() and not list(target.iterdir())
    assert _leftovers(tmp_path) == []


# ---- permission and disk-full errors ---------------------------------------------------------------


def _deny(monkeypatch, path: Path) -> None:
    """A file this process may not read: chmod 0 (root reads anyway, so then os.access says no, as it would)."""
    os.chmod(path, 0)
    if os.geteuid() == 0:
        real = os.access

        def access(p, mode, *a, **k):  # type: ignore[no-untyped-def]
            if os.path.realpath(p) == os.path.realpath(path) and mode & os.R_OK:
                return False
            return real(p, mode, *a, **k)

        monkeypatch.setattr(os, "access", access)


def test_permission_denied_on_inputs(monkeypatch, trace: Path, tmp_path: Path) -> None:
    src = dump(load(TF0), tmp_path / "rank0.json.gz")
    _deny(monkeypatch, src)
    _deny(monkeypatch, trace)
    try:
        assert_clean_error(run("convert", src, "-o", tmp_path / "t.parquet"), "rank0.json.gz", "permission", code=2)
        for args in (("analyze", trace), ("timeline", trace, "-o", tmp_path / "x.html"), ("replay", trace)):
            assert_clean_error(run(*args), "b.parquet", "permission", code=2)
    finally:
        os.chmod(src, 0o644)
        os.chmod(trace, 0o644)


def _no_create(monkeypatch, d: Path) -> None:
    """A directory this process may not create files in (chmod 555; simulated for root)."""
    os.chmod(d, 0o555)
    if os.geteuid() == 0:
        import tempfile

        real_mkstemp, real_mkdtemp = tempfile.mkstemp, tempfile.mkdtemp

        def guard(real):  # type: ignore[no-untyped-def]
            def f(*a, **k):  # type: ignore[no-untyped-def]
                if os.path.realpath(str(k.get("dir") or "")) == os.path.realpath(d):
                    raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
                return real(*a, **k)
            return f

        monkeypatch.setattr(tempfile, "mkstemp", guard(real_mkstemp))
        monkeypatch.setattr(tempfile, "mkdtemp", guard(real_mkdtemp))


def test_permission_denied_on_the_output_directory(monkeypatch, trace: Path, tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    args = _convert_args(tmp_path)
    _no_create(monkeypatch, ro)
    try:
        for c in ([*args, "-o", ro / "t.parquet"], ["timeline", trace, "-o", ro / "x.html"],
                  ["export", trace, "--perfetto", ro / "x.json"], ["replay", trace, "--out", ro / "x.json"]):
            msg = assert_clean_error(run(*c), str(ro), "permission", code=3)
            assert "free disk space" not in msg
    finally:
        os.chmod(ro, 0o755)
    assert list(ro.iterdir()) == []


def _disk_full(monkeypatch, d: Path) -> None:
    """Writes to temp files under ``d`` fail with ENOSPC after the first KB (a full disk)."""
    real_open = builtins.open

    class Full(io.RawIOBase):
        def __init__(self, f):  # type: ignore[no-untyped-def]
            self.f, self.n = f, 0

        def writable(self) -> bool:
            return True

        def write(self, b):  # type: ignore[no-untyped-def]
            self.n += len(b)
            if self.n > 1024:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return self.f.write(b)

        def close(self) -> None:
            self.f.close()
            super().close()

    def fake_open(file, mode="r", *a, **k):  # type: ignore[no-untyped-def]
        f = real_open(file, mode, *a, **k)
        p = str(file)
        if ("w" in mode or "a" in mode) and os.path.dirname(os.path.realpath(p)) == os.path.realpath(d) and p.endswith(".tmp"):
            raw = Full(f)
            return raw if "b" in mode else io.TextIOWrapper(io.BufferedWriter(raw), encoding=k.get("encoding") or "utf-8")
        return f

    monkeypatch.setattr(builtins, "open", fake_open)
    monkeypatch.setattr(io, "open", fake_open)


@pytest.mark.parametrize("cmd", ["timeline", "export", "replay"])
def test_disk_full_in_timeline_export_replay(monkeypatch, cmd: str, trace: Path, tmp_path: Path) -> None:
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / ("x.html" if cmd == "timeline" else "x.json")
    out.write_bytes(b"previous")
    args = {"timeline": ["timeline", trace, "-o", out, "--force"], "export": ["export", trace, "--perfetto", out, "--force"],
            "replay": ["replay", trace, "--out", out, "--force"]}[cmd]
    _disk_full(monkeypatch, out_dir)
    p = run(*args)
    assert_clean_error(p, str(out), "No space left", "free disk space", code=3)
    assert out.read_bytes() == b"previous"
    assert _leftovers(out_dir) == []


def test_stale_part_directories_of_dead_conversions_are_removed(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".tracekit-parts-{dead.pid}-abc"
    stale.mkdir()
    (stale / "part.0.parquet").write_bytes(b"x" * 100)
    live = tmp_path / f".tracekit-parts-{os.getppid()}-def"  # a running process (the test runner's parent)
    live.mkdir()
    p = run(*_convert_args(tmp_path), "-o", tmp_path / "t.parquet")
    assert p.returncode == 0, p.stderr
    assert not stale.exists() and live.exists()


# ---- option values ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, words",
    [
        (["analyze", "{t}", "--window", "-1s:0.5s"], ["-1s:0.5s", "before the capture"]),
        (["analyze", "{t}", "--window", "100s:200s"], ["100s:200s", "after the capture ends"]),
        (["analyze", "{t}", "--window", "0.1s:inf"], ["0.1s:inf", "finite"]),
        (["analyze", "{t}", "--window", "nan:1s"], ["nan:1s", "finite"]),
        (["analyze", "{t}", "--window", "0.1s:1e400s"], ["finite"]),
        (["analyze", "{t}", "--skip-steps", "-1"], ["--skip-steps -1", "at least 0"]),
        (["analyze", "{t}", "--top", "-1"], ["--top -1", "at least 1"]),  # issue 31: --top 0 refused as by diff
        (["timeline", "{t}", "-o", "{o}", "--window", "0.1s:inf"], ["inf"]),
        (["timeline", "{t}", "-o", "{o}", "--window", "100s:200s"], ["outside the capture"]),
        (["timeline", "{t}", "-o", "{o}", "--max-segments", "-1"], ["--max-segments -1"]),
        (["replay", "{t}", "-w", "dense_gemm=inf"], ["dense_gemm=inf", "finite"]),
        (["replay", "{t}", "-w", "dense_gemm=nan"], ["finite"]),
        (["replay", "{t}", "-w", "allreduce=bw:1e999GB/s"], ["finite"]),
        (["diff", "{t}", "{t}", "--top", "-1"], ["--top"]),
        (["convert", "{src}", "-o", "{o}", "-j", "0"], ["--jobs 0"]),
    ],
)
def test_bad_option_values_are_usage_errors(args: list[str], words: list[str], trace: Path, tmp_path: Path) -> None:
    src = _convert_args(tmp_path)[1]
    o = tmp_path / "o.html"
    a = [x.format(t=trace, o=o, src=src) for x in args]
    assert_clean_error(run(*a), *words, code=64)
    assert not o.exists()


def test_window_past_the_end_is_clipped_and_said(trace: Path) -> None:
    import json

    p = run("analyze", trace, "--json", "--window", "0.5s:100s")
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    assert "window_clipped" in {q["code"] for q in res["quality"]}
    r0 = res["ranks"][0]
    assert r0["gpu_busy_ns"] <= r0["window_ns"] < 1.0e9
