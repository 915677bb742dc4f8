"""Capture faults on CPU: a rank dying, SIGINT/SIGTERM, disk full while writing, an SGLang server that never
writes its files. Each must leave profiling stopped (no rank process left, /stop_profile sent) and save what
was collected with a quality flag.

The built-in workload runs on tiny CPU gloo ranks (1 layer, hidden 64, 8 experts) so each test stays
well under a minute.
"""

from __future__ import annotations

import errno
import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import polars as pl
import pytest

from tracekit._errors import CaptureError, OutputError
from tracekit.schema import read_trace

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
SMALL = dict(device="cpu", layers=1, hidden=64, experts=8, warmup_steps=2, unprofiled_steps=2, profile_steps=2,
             profile_every=4, telemetry=False, timeout_s=30.0)
CLI_SMALL = ["--workload", "--device", "cpu", "--layers", "1", "--hidden", "64", "--experts", "8",
             "--unprofiled-steps", "2", "--profile-steps", "2", "--profile-every", "4", "--no-telemetry", "--no-progress"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie waiting to be reaped is not running
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _codes(quality) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for q in quality:
        out.setdefault(q["code"], []).append(q)
    return out


@pytest.fixture
def private_tmp(tmp_path, monkeypatch) -> Path:
    """Capture run directories go here (so the test can see and check them)."""
    d = tmp_path / "tmp"
    d.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(d))
    monkeypatch.setenv("TMPDIR", str(d))
    return d


def _run_builtin(out: Path, **kw):
    from tracekit.capture.options import CaptureOptions
    from tracekit.capture.orchestrate import run_builtin

    keep_raw = kw.pop("keep_raw", None)
    opts = CaptureOptions(**{**SMALL, **kw}).validate()
    said: list[str] = []
    res = run_builtin(opts, out, force=True, keep_raw=keep_raw, progress=False, say=said.append)
    return res, said


# ---- the target process dies ---------------------------------------------------------------------------


def test_rank_dies_mid_capture(tmp_path: Path, private_tmp: Path) -> None:
    import multiprocessing as mp

    out = tmp_path / "t.parquet"
    res, said = _run_builtin(out, world=2, duration_s=30.0, crash_rank=1, crash_step=9)
    q = _codes(res.quality)
    assert q["capture_rank_crashed"][0]["rank"] == 1, res.quality
    assert any("rank 1 exited with code 3" in s for s in said)
    assert mp.active_children() == []  # the surviving rank was stopped, nothing left running
    df, meta = read_trace(out)
    assert set(df["rank"].unique().to_list()) >= {0}
    assert meta["capture"]["profiler_windows"], "windows recorded before the crash are kept"
    assert "capture_rank_crashed" in {x["code"] for x in meta["quality"]}
    assert list(private_tmp.glob("tracekit-capture-*")) == []  # run dir cleaned up


def test_only_rank_dies_before_recording_anything(tmp_path: Path, private_tmp: Path) -> None:
    """Nothing collected: a one-line CaptureError, no "kept in" hint pointing at an empty run directory."""
    out = tmp_path / "t.parquet"
    with pytest.raises(CaptureError) as ei:
        _run_builtin(out, world=1, duration_s=30.0, crash_rank=0, crash_step=0)
    msg = str(ei.value)
    assert "\n" not in msg and "no rank wrote anything" in msg and "kept in" not in msg
    assert not out.exists() and list(private_tmp.glob("tracekit-capture-*")) == []


# ---- SIGINT / SIGTERM during capture (real `tracekit capture` process) ------------------------------------


def _start_capture(tmp_path: Path, private_tmp: Path, out: Path, new_session: bool = False) -> subprocess.Popen[str]:
    env = dict(os.environ, TMPDIR=str(private_tmp), COLUMNS="200")
    exe = Path(sys.executable).with_name("tracekit")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "tracekit.cli"]
    return subprocess.Popen([*cmd, "capture", *CLI_SMALL, "--ranks", "2", "--duration", "120s", "-o", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
                            start_new_session=new_session)


def _wait_for_window(proc: subprocess.Popen[str], private_tmp: Path, timeout_s: float = 90) -> None:
    t0 = time.monotonic()
    while not list(private_tmp.glob("tracekit-capture-*/rank1.win0.trace.json.gz")):
        if proc.poll() is not None:
            pytest.fail(f"capture ended early: {proc.communicate()}")
        if time.monotonic() - t0 > timeout_s:
            proc.kill()
            pytest.fail("no profiler window was written in time")
        time.sleep(0.1)


def _rank_pids(private_tmp: Path) -> list[int]:
    pids = []
    for log in private_tmp.glob("tracekit-capture-*/rank*.log"):
        pids.extend(int(p) for p in _proc_children_by_log(log))
    return pids


def _proc_children_by_log(log: Path) -> list[int]:
    """PIDs of processes that hold this rank log open (the rank itself)."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            for fd in (d / "fd").iterdir():
                if os.readlink(fd) == str(log):
                    found.append(int(d.name))
                    break
        except OSError:
            continue
    return found


@pytest.mark.parametrize(
    "sig,group",
    [(signal.SIGINT, False), (signal.SIGTERM, False), (signal.SIGTERM, True)],
    ids=["SIGINT", "SIGTERM", "SIGTERM-process-group"],
)
def test_signal_during_capture(tmp_path: Path, private_tmp: Path, sig: signal.Signals, group: bool) -> None:
    """The signal goes to `tracekit capture` only, or (group) to it and its ranks at once, as a service
    manager or `kill -TERM -PGID` does: the ranks must then also stop together and save their windows."""
    out = tmp_path / "t.parquet"
    proc = _start_capture(tmp_path, private_tmp, out, new_session=group)
    try:
        _wait_for_window(proc, private_tmp)
        ranks = _rank_pids(private_tmp)
        assert len(ranks) == 2, ranks
        if group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        _o, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in err, err
    time.sleep(0.5)
    assert not [p for p in ranks if _alive(p)], "rank processes still running: profiling not stopped"
    if sig == signal.SIGINT:  # interrupted (exit 130), but what was collected is written, and the last line says where
        assert proc.returncode == 130, err
        assert "Ctrl-C received; writing what was collected" in err
        assert err.rstrip().splitlines()[-1] == f"tracekit: interrupted; kept what was collected in {out} (flagged capture_interrupted)"
        by = "Ctrl-C"
    else:  # written first, then terminated as the CLI always does on SIGTERM
        assert proc.returncode == 143, err
        assert "SIGTERM received; writing what was collected" in err
        assert f"terminated; wrote what was collected to {out}" in err and err.rstrip().endswith("tracekit: terminated")
        by = "SIGTERM"
    df, meta = read_trace(out)
    assert df.height > 0 and meta["capture"]["profiler_windows"]
    assert set(df["rank"].unique().to_list()) == {0, 1}
    q = _codes(meta["quality"])
    assert f"stopped early by {by}" in q["capture_interrupted"][0]["message"], meta["quality"]
    assert "capture_rank_crashed" not in q and "capture_killed" not in q
    assert list(private_tmp.glob("tracekit-capture-*")) == []  # saved, so the run dir is cleaned up


def test_second_signal_kills_the_ranks_and_keeps_what_is_on_disk(tmp_path: Path, private_tmp: Path) -> None:
    out = tmp_path / "t.parquet"
    proc = _start_capture(tmp_path, private_tmp, out)
    try:
        _wait_for_window(proc, private_tmp)
        ranks = _rank_pids(private_tmp)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _o, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in err and proc.returncode == 130, err
    assert err.rstrip().splitlines()[-1] == f"tracekit: interrupted; kept what was collected in {out} (flagged capture_interrupted)"
    time.sleep(0.5)
    assert not [p for p in ranks if _alive(p)]
    df, meta = read_trace(out)
    assert df.height > 0  # the windows already exported (atomically) are converted
    q = _codes(meta["quality"])
    assert "capture_killed" in q and "capture_rank_crashed" not in q, meta["quality"]


# ---- disk full while writing trace.parquet ---------------------------------------------------------------


def _disk_full(monkeypatch) -> None:
    """Every Parquet row group write in this process fails with ENOSPC (the ranks' own files are unaffected)."""
    import pyarrow.parquet as pq

    def full(self, *a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(pq.ParquetWriter, "write_table", full)


@pytest.fixture(scope="module")
def disk_full_capture(tmp_path_factory):
    """One 1-rank capture whose trace.parquet write hits ENOSPC, with --keep-raw; shared by the tests below."""
    base = tmp_path_factory.mktemp("diskfull")
    out, raw, tmpd = base / "t.parquet", base / "raw", base / "tmp"
    tmpd.mkdir()
    out.write_bytes(b"previous result")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tempfile, "tempdir", str(tmpd))
        _disk_full(mp)
        with pytest.raises(OutputError) as ei:
            _run_builtin(out, world=1, duration_s=1.5, keep_raw=raw)
    return str(ei.value), out, raw


def test_disk_full_one_line_error_old_output_kept(disk_full_capture) -> None:
    msg, out, _raw = disk_full_capture
    assert "\n" not in msg and "t.parquet" in msg and "No space left" in msg and "free disk space" in msg
    assert out.read_bytes() == b"previous result"
    assert not [f for f in out.parent.iterdir() if f.name.startswith(".")]  # no temp file left


def test_disk_full_keep_raw_saves_the_collected_traces(disk_full_capture, tmp_path: Path) -> None:
    from tracekit.ingest.convert import convert

    _msg, _out, raw = disk_full_capture
    assert list(raw.glob("rank0.win*.trace.json.gz")) and (raw / "rank0.extra.json").exists()
    res = convert(sorted(raw.glob("rank0.win*.trace.json.gz")), tmp_path / "again.parquet")  # space freed
    df, _meta = read_trace(tmp_path / "again.parquet")
    assert df.height > 0 and res.ranks == [0]


def _assemble_cli(raw: Path, out: Path) -> subprocess.CompletedProcess[str]:
    """``python -m tracekit.capture.assemble RAW -o OUT`` (the remedy the error names), with a hang guard."""
    try:
        return subprocess.run([sys.executable, "-m", "tracekit.capture.assemble", str(raw), "-o", str(out)],
                              capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("assembling the kept directory did not finish within 60 s")


def test_disk_full_keep_raw_reassembles_with_step_records(disk_full_capture, tmp_path: Path) -> None:
    msg, _out, raw = disk_full_capture
    assert f"kept in {raw}" in msg and "python -m tracekit.capture.assemble" in msg
    out = tmp_path / "re.parquet"
    p = _assemble_cli(raw, out)
    assert p.returncode == 0, p.stderr[-500:]
    assert f"wrote {out}" in p.stdout
    df, meta = read_trace(out)
    assert df.filter(pl.col("kind").cast(pl.String) == "step").height > 0 and meta["capture"]["profiler_windows"]
    assert meta["world_size"] == 1 and meta["capture"]["workload"]["options"]["hidden"] == 64  # from run.json


def test_assemble_dir_without_run_json_infers_world(disk_full_capture, tmp_path: Path) -> None:
    """A directory without run.json (older tracekit, or copied by hand): world = highest rank file + 1."""
    import shutil

    from tracekit.capture.assemble import assemble_dir

    _msg, _out, raw = disk_full_capture
    d = tmp_path / "raw"
    shutil.copytree(raw, d)
    (d / "run.json").unlink()
    shutil.copy2(d / "rank0.log", d / "rank2.log")  # rank 2 left only a log: it counts, and is flagged missing
    meta = assemble_dir(d, tmp_path / "t.parquet")
    assert meta["world_size"] == 3
    missing = {q["rank"] for q in meta["quality"] if q["code"] == "capture_rank_missing"}
    assert missing == {1, 2}
    df, _ = read_trace(tmp_path / "t.parquet")
    assert df["rank"].unique().to_list() == [0]
    p = _assemble_cli(tmp_path / "nothing", tmp_path / "x.parquet")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "no such directory" in p.stderr


def test_disk_full_without_keep_raw(tmp_path: Path, private_tmp: Path, monkeypatch) -> None:
    out = tmp_path / "t.parquet"
    _disk_full(monkeypatch)
    with pytest.raises(OutputError) as ei:
        _run_builtin(out, world=1, duration_s=1.5)
    msg = str(ei.value)
    assert "\n" not in msg and "No space left" in msg and not out.exists()
    kept = list(private_tmp.glob("tracekit-capture-*/rank0.win*.trace.json.gz"))
    assert kept, "the run directory with the collected traces was deleted"
    run_dir = kept[0].parent
    assert f"kept in {run_dir}" in msg and f"python -m tracekit.capture.assemble {run_dir} -o {out}" in msg
    assert (run_dir / "rank0.extra.json").exists() and (run_dir / "run.json").exists()
    monkeypatch.undo()  # space freed: the remedy the error names works
    p = _assemble_cli(run_dir, out)
    assert p.returncode == 0, p.stderr[-500:]
    df, meta = read_trace(out)
    assert df.height > 0 and meta["capture"]["profiler_windows"]


# ---- an SGLang server that never writes its files --------------------------------------------------------


def _fake_server():
    path = REPO / "tests" / "sglang" / "fake_server.py"
    if not path.exists():
        pytest.skip("tests/sglang/fake_server.py not available")
    spec = importlib.util.spec_from_file_location("tk_faults_fake_sglang", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _stops(fake) -> int:
    return sum(1 for m, p, _b in fake.requests if p == "/stop_profile")


def test_sglang_server_never_writes_files(tmp_path: Path) -> None:
    from tracekit.capture import sglang_client as sc

    fs = _fake_server()
    with fs.FakeSGLang(fs.FakeConfig(tp_size=2, missing_ranks=(0, 1))) as f:
        t0 = time.monotonic()
        with pytest.raises(CaptureError) as ei:
            sc.capture_sglang(f.url, 0.3, tmp_path / "t.parquet", output_dir=tmp_path / "prof", telemetry=False,
                              progress=False, poll_timeout_s=2)
        assert time.monotonic() - t0 < 30
        assert _stops(f) == 1  # profiling stopped on the server
    msg = str(ei.value)
    assert "\n" not in msg and "no SGLang trace files" in msg and str((tmp_path / "prof").resolve()) in msg
    assert not (tmp_path / "t.parquet").exists()


def test_sglang_one_rank_never_writes_keeps_the_others(tmp_path: Path) -> None:
    """Partial SGLang capture: the trace is written from the ranks that arrived, the call returns normally
    (the CLI exits 0), a one-line warning says it is partial and the footer flags the missing rank by number."""
    from tracekit.capture import sglang_client as sc

    fs = _fake_server()
    out = tmp_path / "t.parquet"
    said: list[str] = []
    with fs.FakeSGLang(fs.FakeConfig(tp_size=3, missing_ranks=(1,), rank_delays_s=(0.1,))) as f:
        try:
            res = sc.capture_sglang(f.url, 0.3, out, output_dir=tmp_path / "prof", telemetry=False, progress=False,
                                    poll_timeout_s=2, log=said.append)
        finally:
            assert _stops(f) == 1
    df, meta = read_trace(out)
    assert sorted(df["rank"].unique().to_list()) == [0, 2]
    ours = [q for q in meta["quality"] if q["code"] == "missing_ranks" and "details" in q and "missing_labels" in q["details"]]
    assert len(ours) == 1 and ours[0]["details"]["missing"] == [1] and ours[0]["details"]["expected_ranks"] == 3
    assert "TP-1 of 3" in ours[0]["message"]
    assert "missing_ranks" in {q.code for q in res.quality}
    warns = [s for s in said if s.startswith("warning: partial trace")]
    assert len(warns) == 1 and "\n" not in warns[0] and "TP-1" in warns[0] and str(out) in warns[0]
