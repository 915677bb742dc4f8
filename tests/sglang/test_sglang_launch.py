"""``tracekit launch``: the child runs with the hook in every spawned rank; capture after ready."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import polars as pl
import pytest

from tracekit._errors import CaptureError
from tracekit.capture import launcher
from tracekit.capture.sglang_plugin import load_step_records

FAKE = Path(__file__).parent / "fake_pkgs"


def test_server_url_from_args():
    assert launcher.server_url_from_args(["python", "-m", "sglang.launch_server", "--model-path", "m"]) == "http://127.0.0.1:30000"
    assert launcher.server_url_from_args(["--host", "0.0.0.0", "--port=31000"]) == "http://127.0.0.1:31000"
    assert launcher.server_url_from_args(["--host=10.1.2.3", "--port", "8000"]) == "http://10.1.2.3:8000"


def test_hook_env_prepends_bootstrap(tmp_path):
    env = launcher.hook_env(tmp_path / "s", tmp_path / "b", base={"PYTHONPATH": "/x", "A": "1"})
    assert env["PYTHONPATH"] == f"{tmp_path / 'b'}{os.pathsep}/x"
    assert env["TRACEKIT_SGLANG_HOOK"] == "1" and env["TRACEKIT_STEP_DIR"] == str(tmp_path / "s") and env["A"] == "1"


def test_launch_runs_program_with_hook_in_spawned_ranks(tmp_path, monkeypatch):
    prog = tmp_path / "server.py"
    prog.write_text(textwrap.dedent(
        """
        import multiprocessing as mp

        def rank_main(rank):
            from sglang.srt.model_executor.model_runner import ModelRunner
            from sglang.srt.model_executor.forward_batch_info import ForwardMode, make_batch
            r = ModelRunner(tp_rank=rank)
            r.forward(make_batch(ForwardMode.EXTEND, 2, extend_num_tokens=50))
            r.forward(make_batch(ForwardMode.DECODE, 2))

        if __name__ == "__main__":
            ps = [mp.get_context("spawn").Process(target=rank_main, args=(r,)) for r in range(2)]
            [p.start() for p in ps]
            [p.join() for p in ps]
            raise SystemExit(max(p.exitcode for p in ps))
        """))
    monkeypatch.setenv("PYTHONPATH", str(FAKE))
    res = launcher.launch([sys.executable, str(prog)], step_dir=tmp_path / "steps", say=lambda m: None)
    assert res.returncode == 0
    df = load_step_records(tmp_path / "steps")
    assert df.group_by("rank").len().sort("rank").rows() == [(0, 2), (1, 2)]
    assert sorted(set(df["name"].cast(pl.String))) == ["tk.fwd[DECODE bs=2 tok=2]", "tk.fwd[EXTEND bs=2 tok=50]"]


def test_launch_reports_server_that_dies_before_ready(tmp_path):
    with pytest.raises(CaptureError, match="exited with code 3 before answering"):
        launcher.launch([sys.executable, "-c", "raise SystemExit(3)", "--port", "1"], step_dir=tmp_path,
                        capture_duration_s=1.0, out=tmp_path / "t.parquet", ready_timeout_s=60, say=lambda m: None)


def test_launch_cli_usage_error():
    from typer.testing import CliRunner

    from tracekit.cli import app

    r = CliRunner().invoke(app, ["launch"])
    assert r.exit_code == 64 and "give the server command after --" in (r.output + (r.stderr if r.stderr_bytes else ""))
