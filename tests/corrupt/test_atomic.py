"""Atomic outputs: a crash, a kill or a full disk mid-write never leaves a half-written trace.parquet;
an existing output is untouched unless --force (then replaced whole); inputs are never modified."""

from __future__ import annotations

import errno
import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from corrupt._build import TF0, TF1, cli_inproc as run, dump, load, need
from tracekit._errors import OutputError
from tracekit.ingest.convert import convert
from tracekit.schema import TraceWriter, read_trace


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> Path:
    """The real 2-rank set copied into a tmp dir (two ranks -> two writes)."""
    need(TF0, TF1)
    d = tmp_path_factory.mktemp("pair")
    dump(load(TF0), d / "rank0.json.gz")
    dump(load(TF1), d / "rank1.json.gz")
    return d


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _leftovers(d: Path) -> list[str]:
    return sorted(f.name for f in d.iterdir() if f.name.startswith("."))


def _fail_after_first_write(monkeypatch, exc: BaseException) -> list[int]:
    calls: list[int] = []
    orig = TraceWriter.write

    def write(self, df):
        if calls:
            raise exc
        calls.append(1)
        orig(self, df)
        assert self._tmp.stat().st_size > 0  # the first row group reached the temp file

    monkeypatch.setattr(TraceWriter, "write", write)
    return calls


@pytest.mark.parametrize("existing", [False, True])
def test_crash_after_first_row_group(monkeypatch, tmp_path: Path, pair: Path, existing: bool) -> None:
    out = tmp_path / "trace.parquet"
    if existing:
        out.write_bytes(b"previous result")
    calls = _fail_after_first_write(monkeypatch, RuntimeError("boom"))
    with pytest.raises(RuntimeError, match="boom"):
        convert([pair], out, force=True)
    assert calls == [1]
    assert out.exists() == existing
    if existing:
        assert out.read_bytes() == b"previous result"
    assert _leftovers(tmp_path) == []


def test_disk_full_while_writing(monkeypatch, tmp_path: Path, pair: Path) -> None:
    """ENOSPC from the Parquet writer: one-line OutputError, exit 3, nothing half-written, old output kept."""
    out = tmp_path / "trace.parquet"
    out.write_bytes(b"previous result")
    calls: list[int] = []
    orig = pq.ParquetWriter.write_table

    def write_table(self, *a, **k):
        if calls:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        calls.append(1)
        return orig(self, *a, **k)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", write_table)
    with pytest.raises(OutputError) as ei:
        convert([pair], out, force=True)
    assert "trace.parquet" in str(ei.value) and "No space left" in str(ei.value)
    calls.clear()
    p = run("convert", pair, "-o", out, "--force")
    assert p.returncode == 3 and "Traceback" not in p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tracekit: error: ") and "free" in lines[0], p.stderr
    assert out.read_bytes() == b"previous result"
    assert _leftovers(tmp_path) == []


def test_force_overwrites_and_inputs_untouched(tmp_path: Path, pair: Path) -> None:
    ins = sorted(pair.iterdir())
    shared = [p for p in (TF0, TF1) if p.exists()]
    before = {p: _sha(p) for p in ins + shared}
    out = tmp_path / "trace.parquet"
    out.write_bytes(b"old")
    p = run("convert", pair, "-o", out)
    assert p.returncode == 3 and out.read_bytes() == b"old"
    p = run("convert", pair, "-o", out, "--force", "-q")
    assert p.returncode == 0, p.stderr
    df, meta = read_trace(out)
    assert sorted(df["rank"].unique().to_list()) == [0, 1] and meta["schema_version"] == 1
    assert run("analyze", out, "--json").returncode == 0
    assert {p: _sha(p) for p in ins + shared} == before
    assert sorted(pair.iterdir()) == ins  # nothing written next to the inputs
    assert _leftovers(tmp_path) == []


_DRIVER = textwrap.dedent(
    """
    import pathlib, sys, time
    from tracekit import schema
    marker = pathlib.Path(sys.argv[1])
    orig = schema.TraceWriter.write
    def write(self, df):
        orig(self, df)
        tmp = marker.with_suffix(".part")
        tmp.write_text(str(self._tmp))
        tmp.replace(marker)  # first row group is in the temp file: now kill me
        time.sleep(120)
    schema.TraceWriter.write = write
    sys.argv = ["tracekit", *sys.argv[2:]]
    from tracekit.cli import main
    main()
    """
)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT, signal.SIGTERM])
def test_killed_during_convert(tmp_path: Path, pair: Path, sig: signal.Signals) -> None:
    """A real `tracekit convert` process killed while writing: the final file never appears half-written."""
    out_dir = tmp_path / "o"
    out_dir.mkdir()
    out = out_dir / "trace.parquet"
    out.write_bytes(b"previous result")
    marker = tmp_path / "marker"
    drv = tmp_path / "drv.py"
    drv.write_text(_DRIVER)
    proc = subprocess.Popen(
        [sys.executable, str(drv), str(marker), "convert", str(pair), "-o", str(out), "--force", "-q"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        t0 = time.monotonic()
        while not marker.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() - t0 < 90, "convert never reached the write"
            time.sleep(0.05)
        tmp = Path(marker.read_text())
        assert out_dir in tmp.parents and tmp.stat().st_size > 0  # next to the output (staged in a hidden folder)
        proc.send_signal(sig)
        _o, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0
    assert "Traceback" not in err, err
    assert out.read_bytes() == b"previous result"  # never replaced by a partial file
    if sig == signal.SIGINT:
        assert proc.returncode == 130 and err.strip() == "tracekit: interrupted"
    if sig == signal.SIGTERM:
        assert proc.returncode == 143 and err.strip() == "tracekit: terminated"
    if sig != signal.SIGKILL:
        assert _leftovers(out_dir) == [], "temp files must be cleaned up on SIGINT/SIGTERM"
    # a SIGKILL cannot clean up: a hidden .tmp may remain, but never under the final name
