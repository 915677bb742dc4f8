"""`tracekit diff` CLI, HTML escaping, and the real nsys before/after pair."""

from __future__ import annotations

import os

import json
import re
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from tracekit.compare.diff import diff_runs
from tracekit.cli import app
from tracekit.report.diff_html import render_html
from tracekit.schema import write_trace

from .test_diff_golden import run

AI = Path(os.environ.get("TRACEKIT_TRACES", "/work/shared/traces") + "/nsys/nsys-ai")
EVIL = '<script>alert("x")</script>&<img src=x onerror=1>'


@pytest.fixture()
def pair(tmp_path: Path) -> tuple[Path, Path]:
    b, a = tmp_path / "untuned.parquet", tmp_path / "tuned.parquet"
    write_trace(run(4.0), b)
    write_trace(run(2.0), a)
    return b, a


def test_cli_terminal_json_html(pair: tuple[Path, Path], tmp_path: Path) -> None:
    b, a = pair
    r = CliRunner().invoke(app, ["diff", str(b), str(a)])
    assert r.exit_code == 0, r.output
    assert "untuned → tuned" in r.output and "tuned is 1.44× faster per step" in r.output
    r = CliRunner().invoke(app, ["diff", str(b), str(a), "--json", "--labels", "A,B"])
    assert r.exit_code == 0, r.output
    blob = json.loads(r.output)
    assert blob["before"]["label"] == "A" and blob["basis"] == "per_step"
    out = tmp_path / "d.html"
    r = CliRunner().invoke(app, ["diff", str(b), str(a), "--html", str(out)])
    assert r.exit_code == 0 and out.exists()
    r = CliRunner().invoke(app, ["diff", str(b), str(a), "--html", str(out)])
    assert r.exit_code == 3 and "exists; pass --force" in r.output
    r = CliRunner().invoke(app, ["diff", str(b), str(a), "--html", str(out), "--force"])
    assert r.exit_code == 0


def test_cli_errors(pair: tuple[Path, Path], tmp_path: Path) -> None:
    b, _ = pair
    r = CliRunner().invoke(app, ["diff", str(b), str(tmp_path / "nope.parquet")])
    assert r.exit_code == 2 and "no such file" in r.output and "Traceback" not in r.output
    junk = tmp_path / "junk.parquet"
    junk.write_text("not parquet")
    r = CliRunner().invoke(app, ["diff", str(b), str(junk)])
    assert r.exit_code == 2 and "junk.parquet" in r.output
    r = CliRunner().invoke(app, ["diff", str(b), str(b), "--labels", "onlyone"])
    assert r.exit_code == 64
    r = CliRunner().invoke(app, ["diff", str(b), str(b), "--html", str(b), "--force"])
    assert r.exit_code == 64 and b.stat().st_size > 0


def test_html_escapes_every_trace_string() -> None:
    d = diff_runs(run(4.0), run(2.0, moe_name=EVIL), labels=(EVIL, "after<b>"))
    page = render_html(d)
    assert "<script" not in page.lower().replace("&lt;script", "")
    assert "onerror=1>" not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
    assert "after&lt;b&gt;" in page
    # self-contained: no scripts, no external resources
    assert not re.search(r"<script|\bsrc\s*=\s*[\"']?(https?:)?//|<link\b", page, re.IGNORECASE)
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")


@pytest.mark.skipif(not (AI / "mfu_2gpu_before.sqlite").exists(), reason="nsys-ai fixtures missing")
def test_real_nsys_before_after_pair() -> None:
    from tracekit.ingest.common import finalize_rank
    from tracekit.ingest.nsys import read_nsys, split_ranks

    def load(p: Path) -> pl.DataFrame:
        df, meta = read_nsys(p)
        return pl.concat([finalize_rank(x) for x, _m in split_ranks(df, meta)])

    d = diff_runs(load(AI / "mfu_2gpu_before.sqlite"), load(AI / "mfu_2gpu_after.sqlite"))
    assert d.basis == "per_window"  # 300 ms windows, no step annotations
    coll = d.collectives.row(0, named=True)
    assert (coll["count_before"], coll["count_after"]) == (33, 31)  # 66 / 62 NCCL kernels over 2 ranks
    busy = {r["metric"]: r for r in d.scalars.to_dicts()}["gpu_busy"]
    assert busy["after"] < busy["before"]
    assert d.verdict[0].startswith("GPU busy time down")
    page = render_html(d)
    assert "flash_fwd_kernel" in page
