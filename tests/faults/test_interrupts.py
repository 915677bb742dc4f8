"""Ctrl-C during long commands (issue 20): the first SIGINT stops convert, analyze, timeline and export
with exit 130 and one line ``tracekit: interrupted``; no partial output, the previous output unchanged,
no temp file or part directory left.

Each command runs as a real process on a synthetic 1-rank trace (about 0.5 M events, built with
benchmarks/gen_synthetic.py). Two kinds of tests:

* deterministic: ``TRACEKIT_TEST_SIGINT_AT=<label>[:<n>]`` makes the process send itself a real SIGINT
  at the n-th interrupt check of that label (tracekit._interrupt): while reading chunks, finalizing,
  writing batches (on the writer thread), waiting for it, just before publishing the output, between
  the analysis stages, inside the Perfetto writer. The signal goes through the real handler, so
  these tests prove each phase stops, and they fail if a label is never reached (the command would
  then finish with exit 0);
* timed: SIGINT from outside at several points of the measured run time. The command either stops
  (exit 130, one line, nothing changed) or, when the signal came after it published its output,
  completes (exit 0, a complete output). Never a traceback, a Rust panic or another exit code.

A capture's Ctrl-C (write what was collected, exit 130) is in test_capture_faults.py::test_signal_during_capture.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from gen_synthetic import write_synthetic_kineto  # noqa: E402

pytestmark = pytest.mark.timeout(600)

FRACTIONS = (0.1, 0.35, 0.6, 0.85)
INTERRUPTED = ["tracekit: interrupted"]


def _exe() -> list[str]:
    script = Path(sys.executable).with_name("tracekit")
    return [str(script)] if script.exists() else [sys.executable, "-m", "tracekit.cli"]


def _env(at: str | None = None) -> dict[str, str]:
    env = dict(os.environ, COLUMNS="200", NO_COLOR="1", TERM="dumb")
    env.pop("TRACEKIT_TEST_SIGINT_AT", None)
    if at is not None:
        env["TRACEKIT_TEST_SIGINT_AT"] = at
    return env


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> tuple[Path, Path, float]:
    """(source dir, its trace.parquet, seconds one convert takes)."""
    d = tmp_path_factory.mktemp("big")
    write_synthetic_kineto(d / "src", 1, 120_000, compress=False)
    out = d / "trace.parquet"
    t = time.perf_counter()
    p = subprocess.run([*_exe(), "convert", d / "src", "-o", out, "-q"], capture_output=True, text=True, env=_env())
    assert p.returncode == 0, p.stderr
    return d / "src", out, time.perf_counter() - t


def _leftovers(d: Path) -> list[str]:
    return sorted(n for n in os.listdir(d) if n.startswith(".") and (".tmp" in n or n.startswith(".tracekit-parts-")))


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.strip()]


def _run_at(cmd: list[str | Path], at: str) -> tuple[int, str]:
    """Run ``cmd`` with the fault-injection hook: it sends itself SIGINT at check ``at``; (exit code, stderr)."""
    p = subprocess.run([*_exe(), *map(str, cmd)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                       env=_env(at), timeout=300)
    return p.returncode, p.stderr


def _interrupt(cmd: list[str | Path], delay: float, *, ignore_sigint: bool = False, group: bool = False) -> tuple[int | None, str]:
    """Run ``cmd``, send SIGINT after ``delay`` s; (exit code, stderr), or (None, '') if it ended first."""
    pre = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignore_sigint else None
    p = subprocess.Popen([*_exe(), *map(str, cmd)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         env=_env(), preexec_fn=pre, start_new_session=group)
    time.sleep(delay)
    if p.poll() is not None:
        p.communicate()
        return None, ""
    if group:
        os.killpg(p.pid, signal.SIGINT)
    else:
        p.send_signal(signal.SIGINT)
    t = time.perf_counter()
    _, err = p.communicate(timeout=60)
    assert time.perf_counter() - t < 20, "the first Ctrl-C must stop the command promptly"
    return p.returncode, err


def _check_interrupted(rc: int | None, err: str) -> None:
    assert rc == 130, (rc, err[-2000:])
    assert _lines(err) == INTERRUPTED, err[-2000:]


def _check_outcome(rc: int | None, err: str, out: Path | None, previous: bytes | None) -> bool:
    """A timed SIGINT: True when it stopped the command (checked), False when the command had published first."""
    assert "Traceback" not in err and "panicked" not in err and "internal error" not in err, err[-2000:]
    if rc == 0:  # the signal came after the output was published: the command succeeded, the output is whole
        if out is not None and out.suffix == ".parquet":
            from tracekit.schema import read_metadata

            read_metadata(out)
        if out is not None:
            assert _leftovers(out.parent) == []
        return False
    _check_interrupted(rc, err)
    if out is not None:
        if previous is None:
            assert not out.exists()
        else:
            assert out.read_bytes() == previous, "the previous output was replaced"
        assert _leftovers(out.parent) == []
    return True


def _run_points(make_cmd, seconds: float, out: Path | None, previous: bytes | None, **kw) -> int:
    hit = 0
    for f in FRACTIONS:
        if out is not None and previous is not None:
            out.write_bytes(previous)
        rc, err = _interrupt(make_cmd(), max(0.3, f * seconds), **kw)
        if rc is None:
            continue
        hit += _check_outcome(rc, err, out, previous)
    return hit


# ---- deterministic: a real SIGINT at each named point ------------------------------------------------------

#: convert's interrupt points: reading (first and a later chunk: the 108 MB source is 7 chunks of 16 MB), finalizing and writing on the writer
#: thread (first and a later step / batch), the main thread's wait for the writer, the last check before publish
CONVERT_POINTS = ["read", "read:5", "finalize", "finalize:4", "write", "write:4", "wait", "publish"]


@pytest.mark.parametrize("at", CONVERT_POINTS)
def test_sigint_at_each_convert_point_keeps_the_previous_output(big, tmp_path: Path, at: str) -> None:
    src, trace, _secs = big
    out = tmp_path / "trace.parquet"
    previous = trace.read_bytes()
    out.write_bytes(previous)
    rc, err = _run_at(["convert", src, "-o", out, "--force", "-q"], at)
    _check_interrupted(rc, err)
    assert out.read_bytes() == previous and _leftovers(tmp_path) == []


@pytest.mark.parametrize("at", ["read", "write", "publish"])
def test_sigint_at_convert_points_without_previous_output(big, tmp_path: Path, at: str) -> None:
    src, _trace, _secs = big
    out = tmp_path / "new.parquet"
    rc, err = _run_at(["convert", src, "-o", out, "-q"], at)
    _check_interrupted(rc, err)
    assert not out.exists() and _leftovers(tmp_path) == []


@pytest.fixture(scope="module")
def two(big, tmp_path_factory) -> Path:
    """The synthetic rank as ranks 0 and 1 of a world of 2 (for -j 2): a complete conversion succeeds."""
    src, _trace, _secs = big
    d = tmp_path_factory.mktemp("two")
    text = next(src.iterdir()).read_bytes()
    key = b'"rank": 0, "world_size": 1'
    assert key in text[:4096]
    for r in (0, 1):
        (d / f"rank{r}.json").write_bytes(text.replace(key, f'"rank": {r}, "world_size": 2'.encode(), 1))
    return d


@pytest.mark.parametrize("at", ["rank", "rank:3"])
def test_sigint_with_jobs_stops_the_workers(two, tmp_path: Path, at: str) -> None:
    """-j 2: the parent waits for its workers in bounded steps; a Ctrl-C there kills them and removes the parts."""
    out = tmp_path / "trace.parquet"
    rc, err = _run_at(["convert", two, "-o", out, "-j", "2", "-q"], at)
    _check_interrupted(rc, err)
    assert not out.exists() and _leftovers(tmp_path) == []


@pytest.mark.parametrize("at", ["analyze", "analyze:2", "analyze:3"])
def test_sigint_at_each_analyze_point(big, at: str) -> None:
    _src, trace, _secs = big
    rc, err = _run_at(["analyze", trace], at)
    _check_interrupted(rc, err)


@pytest.mark.parametrize("cmd,at", [("timeline", "timeline"), ("timeline", "analyze"), ("timeline", "timeline:2"),
                                    ("export", "export"), ("export", "analyze:2"), ("export", "export:5")])
def test_sigint_at_each_timeline_and_export_point_keeps_the_previous_output(big, tmp_path: Path, cmd: str, at: str) -> None:
    _src, trace, _secs = big
    out = tmp_path / ("t.html" if cmd == "timeline" else "t.json.gz")
    out.write_bytes(b"previous output")
    flag = "-o" if cmd == "timeline" else "--perfetto"
    rc, err = _run_at([cmd, trace, flag, out, "--force"], at)
    _check_interrupted(rc, err)
    assert out.read_bytes() == b"previous output" and _leftovers(tmp_path) == []


def test_hook_point_never_reached_lets_the_command_finish(big, tmp_path: Path) -> None:
    """The deterministic tests above can fail: a label no check uses leaves the command to finish (exit 0)."""
    src, _trace, _secs = big
    out = tmp_path / "trace.parquet"
    rc, err = _run_at(["convert", src, "-o", out, "-q"], "no-such-point")
    assert rc == 0, err
    from tracekit.schema import read_metadata

    read_metadata(out)


# ---- timed: SIGINT from outside at several points ---------------------------------------------------------


def test_sigint_during_convert_keeps_the_previous_output(big, tmp_path: Path) -> None:
    src, trace, secs = big
    out = tmp_path / "trace.parquet"
    previous = trace.read_bytes()
    hit = _run_points(lambda: ["convert", src, "-o", out, "--force", "-q"], secs, out, previous)
    assert hit >= 1, f"convert ({secs:.1f} s) finished before every signal"


def test_sigint_during_convert_without_previous_output(big, tmp_path: Path) -> None:
    src, _trace, secs = big
    out = tmp_path / "new.parquet"
    hit = _run_points(lambda: ["convert", src, "-o", out, "-q"], secs, out, None)
    assert hit >= 1


def test_sigint_when_started_with_sigint_ignored(big, tmp_path: Path) -> None:
    """A script's background job (`tracekit convert ... &`) inherits SIGINT ignored: Ctrl-C still stops it."""
    src, trace, secs = big
    out = tmp_path / "trace.parquet"
    out.write_bytes(trace.read_bytes())
    before = _sha(out)
    rc, err = _interrupt(["convert", src, "-o", out, "--force", "-q"], 0.4 * secs, ignore_sigint=True)
    assert rc is not None
    _check_interrupted(rc, err)
    assert _sha(out) == before and _leftovers(tmp_path) == []


def test_sigint_to_the_process_group_with_jobs(two, big, tmp_path: Path) -> None:
    """Ctrl-C in a terminal reaches the whole group: -j workers ignore it, the parent stops them, one line."""
    _src, _trace, secs = big
    out = tmp_path / "trace.parquet"
    hit = 0
    for frac in (0.3, 0.7):
        rc, err = _interrupt(["convert", two, "-o", out, "-j", "2", "-q"], max(1.0, frac * secs * 1.5), group=True)
        if rc is None:
            continue
        if _check_outcome(rc, err, out, None):
            hit += 1
        elif out.exists():
            out.unlink()
    assert hit >= 1


def test_sigint_during_analyze(big) -> None:
    _src, trace, _secs = big
    t = time.perf_counter()
    p = subprocess.run([*_exe(), "analyze", trace, "--json"], capture_output=True, text=True, env=_env())
    assert p.returncode == 0, p.stderr
    secs = time.perf_counter() - t
    assert _run_points(lambda: ["analyze", trace], secs, None, None) >= 1


def test_sigint_during_timeline_keeps_the_previous_page(big, tmp_path: Path) -> None:
    _src, trace, _secs = big
    out = tmp_path / "t.html"
    t = time.perf_counter()
    p = subprocess.run([*_exe(), "timeline", trace, "-o", out], capture_output=True, text=True, env=_env())
    assert p.returncode == 0, p.stderr
    secs = time.perf_counter() - t
    previous = out.read_bytes()
    assert _run_points(lambda: ["timeline", trace, "-o", out, "--force"], secs, out, previous) >= 1


@pytest.mark.parametrize("delay", [0.5, 3.0, 6.0], ids=["starting", "ranks-starting", "running"])
def test_sigint_during_capture_at_several_points(tmp_path: Path, delay: float) -> None:
    """Ctrl-C while `tracekit capture` starts, while its ranks start, while they run: never a traceback or
    exit 70, always exit 130. Before anything was collected: one line, no output; afterwards the capture
    writes what it collected (`capture_interrupted`) and its last line says where; no rank process outlives
    it, no run directory is left."""
    pytest.importorskip("torch")
    from faults.test_capture_faults import CLI_SMALL

    private = tmp_path / "tmp"
    private.mkdir()
    out = tmp_path / "t.parquet"
    env = dict(_env(), TMPDIR=str(private))
    p = subprocess.Popen([*_exe(), "capture", *CLI_SMALL, "--ranks", "2", "--duration", "120s", "-o", out],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    time.sleep(delay)
    p.send_signal(signal.SIGINT)
    try:
        _o, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert "Traceback" not in err and "internal error" not in err, err[-2000:]
    assert p.returncode == 130, (p.returncode, err[-2000:])
    if not out.exists():
        _check_interrupted(p.returncode, err)
    else:
        from tracekit.schema import read_metadata

        assert "capture_interrupted" in {q["code"] for q in read_metadata(out)["quality"]}
        assert err.rstrip().splitlines()[-1] == f"tracekit: interrupted; kept what was collected in {out} (flagged capture_interrupted)"
    assert list(private.glob("tracekit-capture-*")) == []
    time.sleep(0.5)
    left = [d.name for d in Path("/proc").iterdir() if d.name.isdigit() and _cmdline_has(d, str(private))]
    assert left == [], f"rank processes still alive: {left}"


def _cmdline_has(d: Path, text: str) -> bool:
    try:
        return text in (d / "environ").read_bytes().decode("utf-8", "replace")
    except OSError:
        return False
