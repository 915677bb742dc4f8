"""Reliability round three (issue 31): stdout that cannot be written, and file names that would break a line.

Real processes (the console script), since what matters is the process's file descriptor 1: ``> /dev/full``
(ENOSPC), a pipe whose reader exited (EPIPE) and a closed stdout (``>&-``). Each is one line on stderr naming
stdout, exit 3, nothing printed at interpreter exit; a file published before the failure is kept and named.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from corrupt._build import TF0, small_rank, assert_clean_error, cli_inproc, dump, load, need

pytestmark = pytest.mark.filterwarnings("ignore")


def _exe() -> list[str]:
    script = Path(sys.executable).with_name("tracekit")
    return [str(script)] if script.exists() else [sys.executable, "-m", "tracekit.cli"]


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A small real rank (1500 events of the A100 rank 0 around its middle kernel), as JSON and as trace.parquet."""
    need(TF0)
    doc = small_rank(load(TF0))
    d = tmp_path_factory.mktemp("out3")
    src = dump(doc, d / "rank0.json")
    pq = d / "trace.parquet"
    assert cli_inproc("convert", src, "-o", pq, "-q").returncode == 0
    return {"json": src, "parquet": pq}


def _run(args: list[Any], stdout: Any, **kw: Any) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, COLUMNS="120", NO_COLOR="1", TERM="dumb")
    return subprocess.run([*_exe(), *map(str, args)], stdout=stdout, stderr=subprocess.PIPE, text=True, env=env,
                          timeout=300, **kw)


def _one_line(p: subprocess.CompletedProcess[str], *words: str) -> str:
    assert "Exception ignored" not in p.stderr, p.stderr
    p.stdout = p.stdout or ""
    return assert_clean_error(p, *words, code=3)


COMMANDS = {
    "analyze": lambda s, d: ["analyze", s["parquet"]],
    "analyze_json": lambda s, d: ["analyze", s["parquet"], "--json"],
    "diff": lambda s, d: ["diff", s["parquet"], s["parquet"]],
    "replay": lambda s, d: ["replay", s["parquet"], "--json"],
    "help": lambda s, d: ["analyze", "--help"],
}


@pytest.mark.parametrize("cmd", list(COMMANDS))
def test_stdout_on_a_full_device_is_one_line_exit_3(tmp_path: Path, small: dict[str, Path], cmd: str) -> None:
    with open("/dev/full", "w") as full:
        p = _run(COMMANDS[cmd](small, tmp_path), full)
    _one_line(p, "stdout: cannot write (No space left on device)")  # before: internal error, exit 70


def test_convert_with_stdout_on_a_full_device_names_the_trace_it_kept(tmp_path: Path, small: dict[str, Path]) -> None:
    out = tmp_path / "t.parquet"
    with open("/dev/full", "w") as full:
        p = _run(["convert", small["json"], "-o", out], full)
    _one_line(p, "stdout: cannot write", f"{out} was written and kept")  # before: internal error after writing
    from tracekit.schema import read_trace

    assert read_trace(out)[0].height > 0


def test_stdout_into_a_closed_pipe_is_one_line_exit_3(small: dict[str, Path]) -> None:
    r, w = os.pipe()
    os.close(r)  # the reader is gone before the first byte (`| head` that already exited)
    try:
        p = _run(["analyze", small["parquet"]], w)
    finally:
        os.close(w)
    _one_line(p, "stdout: cannot write (Broken pipe)", "exited before the end")


@pytest.mark.parametrize("cmd", ["analyze", "convert"])
def test_a_closed_stdout_is_an_error_not_an_empty_success(tmp_path: Path, small: dict[str, Path], cmd: str) -> None:
    out = tmp_path / "t.parquet"
    args = ["analyze", small["parquet"]] if cmd == "analyze" else ["convert", small["json"], "-o", out]
    p = _run(args, None, preexec_fn=lambda: os.close(1))
    msg = _one_line(p, "stdout is closed")  # before: analyze exited 0 and printed nothing
    if cmd == "convert":
        assert f"{out} was written and kept" in msg and out.stat().st_size > 0


@pytest.mark.parametrize("cmd", ["timeline", "export"])
def test_commands_that_print_nothing_on_stdout_do_not_need_it(tmp_path: Path, small: dict[str, Path], cmd: str) -> None:
    out = tmp_path / ("x.html" if cmd == "timeline" else "x.json")
    args = [cmd, small["parquet"], "-o" if cmd == "timeline" else "--perfetto", out]
    with open("/dev/full", "w") as full:
        p = _run(args, full)
    assert p.returncode == 0 and out.stat().st_size > 0, p.stderr


def test_a_file_name_with_a_newline_stays_one_line(tmp_path: Path) -> None:
    f = tmp_path / "bad\nname.json"
    f.write_text("{oops")
    msg = assert_clean_error(cli_inproc("convert", f, "-o", tmp_path / "t.parquet"), "bad\\nname.json", code=2)
    assert "\n" not in msg  # before: the message broke across two lines
    msg = assert_clean_error(cli_inproc("analyze", tmp_path / "a\x1b[31mred.parquet"), code=2)
    assert "\x1b" not in msg and "a\\x1b[31mred.parquet" in msg  # a terminal escape is shown, not run


def test_export_gzip_is_byte_identical_run_to_run(tmp_path: Path, small: dict[str, Path]) -> None:
    outs = [tmp_path / f"e{i}.json.gz" for i in (1, 2)]
    for o in outs:
        assert cli_inproc("export", small["parquet"], "--perfetto", o).returncode == 0
    assert outs[0].read_bytes() == outs[1].read_bytes()  # before: the header held the temp file's name and the time
    assert outs[0].read_bytes()[3] & 0x08 == 0  # FNAME flag clear: no file name stored


def test_convert_refuses_a_json_output_name(tmp_path: Path, small: dict[str, Path]) -> None:
    p = cli_inproc("convert", small["json"], "-o", tmp_path / "x.json")
    assert_clean_error(p, "-o", "x.json", "trace.parquet", "x.parquet", "export --perfetto", code=64)
    assert not (tmp_path / "x.json").exists()  # before: Parquet bytes under a .json name
