"""PCIe-bound phases and power/utilization verdicts on planted counters."""

import polars as pl
import pytest

from tracekit.core.gpus import gpu_peaks, pcie_link_bw_bytes_per_s, rank_gpu_info
from tracekit.analysis.passes.pcie import pcie_phases
from tracekit.analysis.passes.power import power_verdicts
from tracekit.schema import frame_from_rows

from .synth import build, counter_rows

GEN5 = 32e9 * 16 * (128 / 130) / 8


def test_link_bandwidth_table():
    assert pcie_link_bw_bytes_per_s(5, 16) == pytest.approx(63.0e9, rel=0.01)
    assert pcie_link_bw_bytes_per_s(4, 16) == pytest.approx(31.5e9, rel=0.01)
    assert pcie_link_bw_bytes_per_s(6, 16) is None
    assert gpu_peaks("NVIDIA H200").name == "H200"
    assert gpu_peaks("NVIDIA H100 80GB HBM3").name == "H100"
    assert gpu_peaks("NVIDIA RTX PRO 6000 Blackwell Server Edition").has_nvlink is False
    assert rank_gpu_info({"ranks": [{"rank": 0, "link_gen": 4, "link_width": 8}]}, 0)["pcie_bw_bytes_per_s"] == pytest.approx(GEN5 / 4)


def _with(df, rows):
    return pl.concat([df, frame_from_rows(rows)])


def test_counter_phase_above_80_percent():
    df, meta = build(ranks=2, steps=3)
    t0, t1 = int(df["ts_ns"].min()), int(df["ts_ns"].max())
    hi0, hi1 = t0 + 1_000_000, t0 + 2_000_000
    rows = counter_rows(0, "pcie_rx_bytes_per_s", t0, t1, 100_000, lambda t: 0.9 * GEN5 if hi0 <= t < hi1 else 0.05 * GEN5)
    rows += counter_rows(1, "pcie_tx_pct", t0, t1, 100_000, lambda t: 79.0)  # just below: no phase
    ph = pcie_phases(_with(df, rows), meta)
    assert ph.height == 1
    p = ph.row(0, named=True)
    assert (p["rank"], p["direction"], p["source"]) == (0, "rx", "counter")
    assert p["start_ns"] == hi0 and p["dur_ns"] == hi1 - hi0
    assert p["pct_of_link"] == pytest.approx(90.0)
    assert p["during"]  # kernels ran meanwhile


def test_single_sample_is_not_a_phase():
    df, meta = build(ranks=1, steps=2)
    t0 = int(df["ts_ns"].min())
    rows = counter_rows(0, "pcie_rx_pct", t0, t0 + 1_000_000, 100_000, lambda t: 95.0 if t == t0 + 500_000 else 1.0)
    assert pcie_phases(_with(df, rows), meta).height == 0


def test_memcpy_fallback():
    df, meta = build(ranks=1, steps=2)
    t0 = int(df["ts_ns"].min())
    mib64 = 64 << 20
    dur = int(mib64 / (0.88 * GEN5) * 1e9)  # 88% of the link
    rows = [dict(rank=0, kind="memcpy", ts_ns=t0 + i * dur, dur_ns=dur, bytes=mib64, memcpy_kind="HtoD",
                 name="Memcpy HtoD (Pinned -> Device)", category="memory") for i in range(3)]
    rows.append(dict(rank=0, kind="memcpy", ts_ns=t0 + 10 * dur, dur_ns=dur * 4, bytes=mib64, memcpy_kind="DtoH",
                     name="Memcpy DtoH (Device -> Pinned)", category="memory"))  # 22%: not a phase
    ph = pcie_phases(_with(df, rows), meta)
    assert ph.height == 1
    p = ph.row(0, named=True)
    assert (p["direction"], p["source"], p["dur_ns"]) == ("rx", "memcpy", 3 * dur)
    assert p["pct_of_link"] == pytest.approx(88.0, abs=0.5)


def test_phase_never_above_the_link():
    """Copies measured above the link model (overlapping engines, a wrong link generation) and counters above 100%
    are reported at the link: no phase says more than 100% or more bytes/s than the link carries."""
    df, meta = build(ranks=1, steps=2)
    t0, t1 = int(df["ts_ns"].min()), int(df["ts_ns"].max())
    mib64 = 64 << 20
    dur = int(mib64 / (1.5 * GEN5) * 1e9)  # 150% of the link
    rows = [dict(rank=0, kind="memcpy", ts_ns=t0 + i * dur, dur_ns=dur, bytes=mib64, memcpy_kind="HtoD",
                 name="Memcpy HtoD (Pinned -> Device)", category="memory") for i in range(3)]
    p = pcie_phases(_with(df, rows), meta).row(0, named=True)
    assert p["pct_of_link"] == pytest.approx(100.0) and p["achieved_bytes_per_s"] == pytest.approx(GEN5, rel=1e-6)
    for name, v in (("pcie_rx_pct", 130.0), ("pcie_rx_bytes_per_s", 1.3 * GEN5)):
        ph = pcie_phases(_with(df, counter_rows(0, name, t0, t1, 100_000, lambda t, v=v: v)), meta)
        assert ph.height >= 1 and ph["pct_of_link"].max() <= 100.0
        assert ph["achieved_bytes_per_s"].max() <= GEN5 * (1 + 1e-9)


def test_collective_phase_only_without_nvlink():
    df, _ = build(ranks=2, steps=2, nelems=64 << 20, transfer_ns=2_000_000)
    from tracekit.core.collectives import match_collectives

    m = match_collectives(df)
    nv = {"ranks": [{"rank": r, "device_name": "NVIDIA H200"} for r in range(2)]}
    pc = {"ranks": [{"rank": r, "device_name": "NVIDIA RTX PRO 6000"} for r in range(2)]}
    assert pcie_phases(df, nv, instances=m).height == 0
    ph = pcie_phases(df, pc, instances=m)
    assert ph.height == m.height and set(ph["source"]) == {"collective"}


def test_power_low_while_busy_verdict_and_spin_waits():
    df, meta = build(ranks=2, steps=4, delay={1: (2, 3_000_000)})
    t0, t1 = int(df["ts_ns"].min()), int(df["ts_ns"].max())
    rows = counter_rows(0, "power_w", t0, t1, 50_000, lambda t: 100.0)
    rows += counter_rows(1, "power_w", t0, t1, 50_000, lambda t: 650.0)
    rows += counter_rows(0, "sm_active_pct", t0, t1, 50_000, lambda t: 95.0)
    res = power_verdicts(_with(df, rows), meta)
    pr = {r["rank"]: r for r in res.per_rank.to_dicts()}
    assert pr[0]["verdict_code"] == "latency_or_spin"
    assert pr[0]["power_frac"] == pytest.approx(100 / 700)
    assert pr[0]["busy_frac"] > 0.5
    assert pr[0]["sm_active_pct"] == pytest.approx(95.0)
    assert "14% of its power limit" in pr[0]["verdict"]
    assert pr[1]["verdict_code"] in ("power_bound", "mostly_idle", "busy_moderate_power")
    # rank 0's 3 ms allreduce waits for the delayed rank 1 ran at low power: spin-waits
    assert res.spin_waits.height == 2 and set(res.spin_waits["rank"]) == {0}
    assert any("spin-waiting" in v for v in res.verdicts)


def test_no_power_counters():
    df, meta = build(ranks=1, steps=1)
    res = power_verdicts(df, meta)
    assert not res.has_counters and res.verdicts == []
