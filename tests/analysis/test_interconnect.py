"""Interconnect verdict (tracekit/analysis/passes/interconnect.py) on the 2xH200 fixtures and the nsys TP2 capture."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tracekit.analysis.passes.interconnect import path_models

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "gpu"
NSYS = Path(os.environ.get("TRACEKIT_TRACES", "/work/shared/traces")) / "nsys" / "generated-h200"
H200 = {"ranks": [{"rank": 0, "device_name": "NVIDIA H200", "link_gen": 5, "link_width": 16}]}


def _ic(res):
    return [f for f in res["findings"] if "interconnect" in f and f.startswith("allreduce")]


def test_models_order_and_size_dependence():
    small, big = path_models(4096, H200), path_models(256e6, H200)
    assert small["NVLink"] > small["PCIe P2P"] > small["host memory"]
    assert big["NVLink"] > 400e9 and 50e9 < big["PCIe P2P"] < 56e9  # large messages approach the links' payload rates
    assert small["NVLink"] < 1e9  # latency-bound: no path is fast for 4 KB


@pytest.mark.parametrize("name", ["grouped", "grouped_p2p_off"])
def test_fixture_nvlink_vs_p2p_off(name):
    p = FIX / f"{name}.trace.parquet"
    if not p.exists():
        pytest.skip("GPU fixtures absent")
    from tracekit.api import analyze

    res = analyze(p)
    ar = [r for r in res["interconnect"] if r["coll_name"] == "allreduce"][0]
    f = _ic(res)
    assert len(f) == 1
    if name == "grouped":
        assert ar["path"] == "NVLink" and ar["saving_ns"] == 0
        assert "interconnect is not the limit" in f[0] and "NVLink" in f[0]
        # the generic wait sentence is replaced, not repeated
        assert not any(s.startswith("allreduce (pg:0): 97%") for s in res["findings"])
    else:
        assert ar["path"] == "host memory" and ar["bus_bw_p50_bytes_per_s"] < 0.3 * ar["model_bus_bw_bytes_per_s"]["NVLink"]
        assert "slow interconnect path" in f[0] and "through host memory" in f[0] and "GB/s bus bandwidth" in f[0]
        assert "would save" in f[0] and ar["saving_ns"] > 0.5 * ar["transfer_ns"] / 1  # most of the transfer is the slow path's


def test_nsys_tp2_nvlink_is_not_the_limit():
    if not (NSYS / "tp2_rank1.sqlite").exists():
        pytest.skip("generated-h200 traces not available")
    import polars as pl

    from tracekit.api import analyze_frame
    from tracekit.categories import default_rules
    from tracekit.ingest.common import finalize_rank
    from tracekit.ingest.nsys import read_nsys

    df = pl.concat([finalize_rank(read_nsys(NSYS / f"tp2_rank{r}.sqlite", rank=r)[0], default_rules()) for r in range(2)],
                   how="vertical_relaxed")
    meta = {"world_size": 2, "ranks": [{"rank": r, "device_name": "NVIDIA H200"} for r in range(2)]}
    res = analyze_frame(df, meta)
    f = _ic(res)
    assert len(f) == 1 and "interconnect is not the limit" in f[0], res["findings"]
    ar = res["interconnect"][0]
    # nsys rows carry no message sizes: no bus bandwidth, so no path is named; the share bounds any saving
    assert ar["path"] is None and ar["needs"] and ar["transfer_share"] < 0.05
    assert "the trace has no message sizes" in f[0]
    # the planted PCIe phases are copies, reported as PCIe-bound phases, not as a slow collective path
    assert any("PCIe-bound phase" in s for s in res["findings"])
