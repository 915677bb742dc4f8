"""`tracekit timeline` / `tracekit export` through the CLI, on a hand-built trace and on the
real 2×H200 nsys capture from ../shared/traces (converted on the fly)."""

from __future__ import annotations

import os

import gzip
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tracekit.cli import app
from tracekit.schema import frame_from_rows, write_trace

from ._util import XSS, have_chromium, pre_json, run_page, small_rows
from ._chrome_json import check_chrome_json
from .test_perfetto import assert_nested

NSYS = Path(os.environ.get("TRACEKIT_TRACES", "/work/shared/traces") + "/nsys/generated-h200")


@pytest.fixture
def trace(tmp_path) -> Path:
    p = tmp_path / "trace.parquet"
    write_trace(frame_from_rows(small_rows()), p, {"world_size": 2})
    return p


def cli(*args: str):
    return CliRunner().invoke(app, list(args))


def test_timeline_cli(trace, tmp_path):
    out = tmp_path / "t.html"
    r = cli("timeline", str(trace), "-o", str(out), "--window", "3ms:6ms")
    assert r.exit_code == 0, r.output
    html = out.read_text()
    assert XSS not in html and "detail window 0.003000–0.006000 s" in html
    r = cli("timeline", str(trace), "-o", str(out))
    assert r.exit_code == 3 and "--force" in r.output  # OutputError, no traceback
    assert "Traceback" not in r.output
    assert cli("timeline", str(trace), "-o", str(out), "--force", "--step", "2").exit_code == 0
    assert "(step 2;" in out.read_text()


@pytest.mark.parametrize("args,code,msg", [
    (["--window", "9s:10s"], 64, "outside the capture"),
    (["--window", "nonsense"], 64, "START:END"),
    (["--step", "42"], 64, "--step 42"),
    (["--window", "1ms:2ms", "--step", "1"], 64, "pass one"),
])
def test_timeline_cli_usage_errors(trace, tmp_path, args, code, msg):
    r = cli("timeline", str(trace), "-o", str(tmp_path / "x.html"), *args)
    assert r.exit_code == code and msg in r.output, r.output
    assert not (tmp_path / "x.html").exists()


def test_timeline_cli_missing_input(tmp_path):
    r = cli("timeline", str(tmp_path / "nope.parquet"), "-o", str(tmp_path / "x.html"))
    assert r.exit_code == 2 and "no such file" in r.output


def test_export_cli(trace, tmp_path):
    out = tmp_path / "t.json.gz"
    r = cli("export", str(trace), "--perfetto", str(out))
    assert r.exit_code == 0, r.output
    d = json.load(gzip.open(out, "rt"))
    assert {e["pid"] for e in d["traceEvents"]} == {1, 2}
    assert cli("export", str(trace), "--perfetto", str(out)).exit_code == 3
    assert cli("export", str(trace)).exit_code == 64
    assert cli("export", str(trace), "--perfetto", str(trace), "--force").exit_code in (3, 64)
    assert trace.stat().st_size > 0


# ---------------------------------------------------------------- real 2×H200 nsys capture
@pytest.fixture(scope="module")
def h200(tmp_path_factory) -> Path:
    if not (NSYS / "tp2_rank1.sqlite").exists():
        pytest.skip("generated-h200 traces not available")
    from tracekit.ingest.convert import convert

    out = tmp_path_factory.mktemp("h200") / "h200.parquet"
    convert([NSYS / "tp2_rank0.sqlite", NSYS / "tp2_rank1.sqlite"], out)
    return out


def test_real_h200_timeline(h200, tmp_path):
    out = tmp_path / "h200.html"
    r = cli("timeline", str(h200), "-o", str(out))
    assert r.exit_code == 0, r.output
    html = out.read_text()
    data = json.loads(re.search(r'id="tk-data">(.*?)</script>', html, re.S).group(1))
    det = data["detail"]
    labels = [ln["label"] for ln in det["lanes"]]
    assert {"r0 dev0 s7", "r0 dev0 s14", "r1 dev1 s7", "r1 dev1 s14"} <= set(labels)
    assert "representative" in det["reason"] and det["x0_ms"] <= det["v0_ms"] < det["v1_ms"] <= det["x1_ms"]
    assert det["kernels"]["n"] == 2 * (5520 + 612)  # every profiled op is embedded for zooming (README counts)
    assert det["coll"] and det["coll"]["link_len"]["n"] == 60  # the 60 matched allreduces linked across ranks
    # README: rank 1 waits inside NCCL for rank 0; the worst stalls are marked and listed in the window chooser
    assert det["stalls"] and {s["rank"] for s in det["stalls"]} == {1}
    assert [e for e in data["chooser"] if e["kind"] == "stall"][0]["label"].startswith("stall: rank 1 waits")
    assert len([e for e in data["chooser"] if e["kind"] == "step"]) == 60
    assert {g["group"] for g in data["counters"]} >= {"activity %", "PCIe % of link"}
    assert "<h2>Worst stalls</h2>" in html and "<h2>Top kernels</h2>" in html
    if have_chromium():
        st = pre_json(run_page(out), "tk-status")
        assert st["ok"] and st["errors"] == [] and st["lanes"] == labels


def test_real_h200_perfetto(h200, tmp_path):
    out = tmp_path / "h200.json.gz"
    r = cli("export", str(h200), "--perfetto", str(out), "--cpu")
    assert r.exit_code == 0, r.output
    doc = json.load(gzip.open(out, "rt"))
    ev = doc["traceEvents"]
    assert_nested(ev)
    got = check_chrome_json(doc)  # the documented Chrome JSON format (trace_processor cannot run offline)
    assert got["cross_pid_flows"] == 60 and got["flows"] > 5000  # allreduce flows across ranks + launch flows
    # GPU_METRICS as counter tracks: SM / tensor activity and PCIe per rank (README: 30 metrics x 1140 samples)
    assert got["counter_tracks"] >= 2 * 4 and got["counters"] >= 2 * 4 * 1000
    coll = [e for e in ev if e["ph"] == "s" and e["cat"] == "collective"]
    assert len(coll) == 60  # 60 all-reduce instances, one rank-to-rank flow each
    assert len([e for e in ev if e["ph"] == "s" and e["cat"] == "launch"]) > 5000  # launch → kernel flows
    assert any(e["ph"] == "i" and e["cat"] == "stall" for e in ev)
    kernels = [e for e in ev if e["ph"] == "X" and 1000 <= e["tid"] < 2000]
    assert len(kernels) == 2 * (5520 + 612)  # every kernel and memcpy of both ranks (README counts)
