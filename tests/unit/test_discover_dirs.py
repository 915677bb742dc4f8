"""Directories (issue 30, item 15): files that are no trace are skipped with a warning naming each, unless
nothing else is there; an empty directory or one with only unsupported files ends in one clear line."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tracekit._errors import InputError
from tracekit.cli import app
from tracekit.ingest.convert import convert
from tracekit.ingest.discover import discover, not_a_trace
from tracekit.schema import read_metadata

TRACES = Path(os.environ.get("TRACEKIT_TRACES", "/work/shared/traces"))
needs_traces = pytest.mark.skipif(not (TRACES / "hta").exists(), reason="shared traces not available")


@needs_traces
@pytest.mark.parametrize("rel,skipped", [
    ("hta/execution_trace", "benchmark_simple_add_et.json.gz"),  # a PyTorch execution trace beside its Kineto trace
    ("tracelens/inference/sglang_decode/capture_traces", "execution_details.json"),  # a JSON list of settings
])
def test_real_directory_with_a_non_trace_converts(tmp_path: Path, rel: str, skipped: str):
    out = tmp_path / "t.parquet"
    res = convert([TRACES / rel], out)  # failed as a whole before
    assert res.rows > 0 and len(res.ranks) == 1
    q = [x for x in read_metadata(out)["quality"] if x["code"] == "input_skipped"]
    assert len(q) == 1 and skipped in q[0]["message"] and q[0]["severity"] == "warning"
    assert [s.path.name for s in discover([TRACES / rel])] != [] and skipped not in [s.path.name for s in discover([TRACES / rel])]


@needs_traces
def test_each_unsupported_file_is_named(tmp_path: Path):
    d = tmp_path / "run"
    d.mkdir()
    shutil.copy(TRACES / "hta/mixed_files/rank_non_gpu.json.gz", d / "rank0.json.gz")
    (d / "notes.txt").write_text("hello")
    (d / "settings.json").write_text('[{"bs": 1}]')
    (d / "config.json").write_text('{"model": "x"}')
    (d / "empty.json").write_text("")
    (d / ".hidden.json").write_text("[]")
    skipped: list[tuple[Path, str]] = []
    srcs = discover([d], skipped)
    assert [s.path.name for s in srcs] == ["rank0.json.gz"]
    assert sorted(p.name for p, _ in skipped) == ["config.json", "empty.json", "notes.txt", "settings.json"]
    r = CliRunner().invoke(app, ["convert", str(d), "-o", str(tmp_path / "t.parquet")])
    assert r.exit_code == 0, r.output
    for name in ("notes.txt", "settings.json", "config.json", "empty.json"):
        assert f"input_skipped: {d / name}: skipped" in r.output


def test_a_named_file_is_never_skipped(tmp_path: Path):
    f = tmp_path / "settings.json"
    f.write_text('[{"bs": 1}]')
    with pytest.raises(InputError):
        convert([f], tmp_path / "t.parquet")


@pytest.mark.parametrize("files,expect", [
    ({}, "no trace files in this directory (it holds no files)"),
    ({"a.txt": "x", "b.json": "[1, 2]"}, "only unsupported ones (a.txt: not a trace format tracekit reads; b.json: JSON that is not an object"),
])
def test_nothing_left_is_one_clear_error(tmp_path: Path, files: dict[str, str], expect: str):
    d = tmp_path / "d"
    d.mkdir()
    for n, t in files.items():
        (d / n).write_text(t)
    r = CliRunner().invoke(app, ["convert", str(d), "-o", str(tmp_path / "t.parquet")])
    assert r.exit_code == 2
    assert expect in r.output and r.output.count("\n") == 1 and "Traceback" not in r.output
    assert not (tmp_path / "t.parquet").exists()


def test_not_a_trace_keeps_what_may_be_a_trace(tmp_path: Path):
    big = tmp_path / "big.json"
    big.write_text('{"meta": "' + "x" * (2 << 20) + '", "traceEvents": []}')  # traceEvents past the sniffed head
    assert not_a_trace(big, "kineto") is None
    ok = tmp_path / "ok.json"
    ok.write_text('{"schemaVersion": 1, "traceEvents": []}')
    assert not_a_trace(ok, "kineto") is None
    bad_gz = tmp_path / "bad.json.gz"
    bad_gz.write_bytes(b"not gzip")
    assert not_a_trace(bad_gz, "kineto") is None  # corrupt: the reader's own error names it
