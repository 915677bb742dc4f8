"""Self-replay on real Kineto traces (HTA critical_path set) and the CLI."""

from __future__ import annotations

import os

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tracekit.cli import app
from tracekit._errors import UsageError
from tracekit.replay import replay
from tracekit.schema import read_trace

HTA = Path(os.environ.get("TRACEKIT_TRACES", "/work/shared/traces") + "/hta/critical_path")
CASES = ["cuda_event_sync/event_sync_trace.json.gz", "cuda_event_sync_multi_stream/event_sync_trace.json.gz",
         "alexnet/benchmark_result_2869224_1695835535_trace.json.gz",
         "simple_add/benchmark_result_493459_1694039959_trace.json.gz"]

pytestmark = pytest.mark.skipif(not HTA.exists(), reason="shared HTA traces not available")


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    from tracekit.ingest.convert import convert

    out = {}
    d = tmp_path_factory.mktemp("hta")
    for c in CASES:
        p = d / (c.replace("/", "_") + ".parquet")
        convert([HTA / c], p)
        out[c] = p
    return out


@pytest.mark.parametrize("case", CASES)
def test_self_replay_within_1pct(converted, case):
    df, meta = read_trace(converted[case])
    specs = ["re:.=0.5", "cuda-graph"]
    try:  # traces whose only syncs are each step's result have no sync to remove (a one-line usage error)
        replay(df, meta, ["no-host-sync"])
        specs.insert(1, "no-host-sync")
    except UsageError as e:
        assert "no sync to remove" in str(e) or "no host syncs" in str(e)
    r = replay(df, meta, specs)
    assert abs(r.baseline.self_replay_error) <= 0.01
    assert r.graph.gpu_ops > 0
    # speeding kernels up or removing syncs never makes the step slower
    assert r.what_if[0].step_ns_p50 <= r.baseline.step_ns_p50
    assert all(w.step_ns_p50 <= r.baseline.step_ns_p50 for w in r.what_if[1:])


def test_event_sync_trace_is_sync_bound(converted):
    # ProfilerStep#100: a spin kernel waited on by cudaEventSynchronize; doubling other kernels adds their time
    df, meta = read_trace(converted[CASES[0]])
    r = replay(df, meta, ["other_compute=2"])
    assert r.what_if[0].step_ns_p50 > r.baseline.step_ns_p50
    assert r.baseline.critical_path_ns["sync"] > 0


def test_cli_json(converted, tmp_path):
    res = CliRunner().invoke(app, ["replay", str(converted[CASES[0]]), "--what-if", "other_compute=0.5", "--json"])
    assert res.exit_code == 0, res.output
    j = json.loads(res.output)
    for k in ("step_ns_p50", "measured_step_ns_p50", "self_replay_error"):
        assert k in j["baseline"]
    assert "calibration_scale" in j
    w = j["what_if"][0]
    assert w["spec"] == "other_compute=0.5" and "tokens_per_s" in w and "critical_path_ns" in w
    out = tmp_path / "r.json"
    assert CliRunner().invoke(app, ["replay", str(converted[CASES[0]]), "--out", str(out)]).exit_code == 0
    res = CliRunner().invoke(app, ["replay", str(converted[CASES[0]]), "--out", str(out)])
    assert res.exit_code == 3  # refuses to overwrite without --force
    res = CliRunner().invoke(app, ["replay", str(converted[CASES[0]]), "-w", "nonsense"])
    assert res.exit_code == 64 and "Traceback" not in res.output
