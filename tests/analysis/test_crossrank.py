"""cross_rank_sections: the analyze JSON sections and plain-words findings."""

import json

import polars as pl

from tracekit.analysis.stage.crossrank import SECTION_KEYS, cross_rank_sections

from .synth import build, counter_rows


def test_sections_and_findings_name_the_late_rank():
    df, meta = build(ranks=4, steps=6, delay={3: (2, 2_000_000)}, skew={2: 40_000})
    out = cross_rank_sections(df, meta, {})
    parts = out.pop("_comm_parts")
    assert set(out) == set(SECTION_KEYS)
    json.dumps(out)  # JSON-ready
    assert out["collectives"]["clock_alignment"]["offsets_ns"]["2"] == -40_000
    assert out["stalls"] and {s["late_rank"] for s in out["stalls"]} == {3}
    assert {"waiting_rank", "late_rank", "wait_ns", "ts_ns", "step", "collective"} <= set(out["stalls"][0])
    assert out["findings"][0].startswith("Rank(s) 0, 1, 2 lost") and "for rank 3" in out["findings"][0]
    assert "forward step started late" in out["findings"][0]
    assert set(out["idle_causes_ns"]) == {"0", "1", "2", "3"}
    assert out["steps"]["summary"][0]["mode"] == "DECODE"
    # comm parts are in the caller's time base: rank 2's kernels keep their skewed starts
    k2 = df.filter((pl.col("rank") == 2) & (pl.col("category") == "communication"))
    p2 = parts.filter(pl.col("rank") == 2)
    assert int(p2["start"].min()) == int(k2["ts_ns"].min())
    assert int((p2["end"] - p2["start"]).sum()) == int(k2["dur_ns"].sum())


def test_window_and_quality_log():
    from tracekit._errors import QualityLog

    df, meta = build(ranks=2, steps=6, delay={1: (1, 1_000_000)})
    steps = df.filter(pl.col("kind") == "step").sort("ts_ns")
    lo = int(steps.filter(pl.col("step_id") == 3)["ts_ns"].min())

    class W:
        start_ns, end_ns = lo, int(df["ts_ns"].max()) + 10_000_000

    q = QualityLog()
    out = cross_rank_sections(df, meta, {"window": W(), "quality": q})
    assert {s["step"] for s in out["stalls"]} == {3, 4, 5}


def test_power_and_pcie_sections():
    df, meta = build(ranks=2, steps=3)
    t0, t1 = int(df["ts_ns"].min()), int(df["ts_ns"].max())
    rows = counter_rows(0, "power_w", t0, t1, 50_000, lambda t: 90.0) + counter_rows(0, "pcie_rx_pct", t0, t1, 50_000, lambda t: 90.0)
    from tracekit.schema import frame_from_rows

    out = cross_rank_sections(pl.concat([df, frame_from_rows(rows)]), meta, {})
    out.pop("_comm_parts")
    assert out["power"]["has_counters"] and out["pcie_phases"]
    assert any("power limit" in f for f in out["findings"]) and any("PCIe-bound" in f for f in out["findings"])
