"""Golden tests of tracekit.compare.diff on hand-built two-rank runs with known answers."""

from __future__ import annotations

import pytest
import polars as pl

from tracekit.core.collectives import match_collectives
from tracekit.compare.diff import diff_runs, summarize_run
from tracekit.schema import frame_from_rows

MS = 1_000_000
BASE = 1_800_000_000_000_000_000
PERIOD = 10 * MS


def run(moe_ms: float, *, steps: int = 4, moe_name: str = "fused_moe_kernel", early_ms: float = 0.0,
        ar_ms: float = 0.5, tokens: int = 8, with_steps: bool = True, power: float | None = None) -> pl.DataFrame:
    """Per step on each of 2 ranks: attention 2 ms, MoE GEMM ``moe_ms``, then an all-reduce.

    Rank 1 reaches the all-reduce ``early_ms`` earlier (its MoE GEMM is shorter) and waits that long.
    """
    rows = []
    for r in (0, 1):
        for s in range(steps):
            t0 = BASE + s * PERIOD
            moe = moe_ms - (early_ms if r == 1 else 0.0)
            ar_start = 2 * MS + moe * MS
            ar_end = 2 * MS + moe_ms * MS + ar_ms * MS
            common = {"rank": r, "device": r, "stream": 7, "step_id": s}
            rows += [
                {**common, "kind": "kernel", "ts_ns": t0, "dur_ns": 2 * MS, "name": "flash_attn_decode",
                 "category": "attention", "family": "attention.x"},
                {**common, "kind": "kernel", "ts_ns": t0 + 2 * MS, "dur_ns": round(moe * MS), "name": moe_name,
                 "category": "moe_gemm", "family": "moe_gemm.triton"},
                {**common, "kind": "kernel", "ts_ns": t0 + round(ar_start), "dur_ns": round(ar_end - ar_start),
                 "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "category": "communication",
                 "family": "allreduce.nccl", "coll_name": "allreduce", "pg_name": "0", "pg_ranks": "[0, 1]",
                 "coll_group_size": 2, "coll_seq": s, "coll_in_nelems": 1024, "coll_out_nelems": 1024,
                 "coll_dtype": "BFloat16"},
            ]
            if with_steps:
                rows.append({"rank": r, "kind": "step", "ts_ns": t0, "dur_ns": round(ar_end), "name": "step[DECODE bs=8]",
                             "step_id": s, "step_mode": "DECODE", "batch_size": 8, "tokens": tokens, "profiled": True})
            if power is not None:
                rows.append({"rank": r, "kind": "counter", "ts_ns": t0 + MS, "dur_ns": 0, "name": "power_w", "value": power})
    return frame_from_rows(rows)


def test_per_step_category_times_and_step_p50() -> None:
    d = diff_runs(run(4.0), run(2.0))
    assert d.basis == "per_step"
    cat = {r["bucket"]: r for r in d.categories.to_dicts()}
    assert cat["moe_gemm"]["before_ns"] == pytest.approx(4 * MS)
    assert cat["moe_gemm"]["after_ns"] == pytest.approx(2 * MS)
    assert cat["moe_gemm"]["delta_ns"] == pytest.approx(-2 * MS)
    assert cat["moe_gemm"]["rel"] == pytest.approx(-0.5)
    assert cat["attention"]["delta_ns"] == pytest.approx(0)
    sc = {r["metric"]: r for r in d.scalars.to_dicts()}
    assert sc["step_p50"]["before"] == pytest.approx(6.5) and sc["step_p50"]["after"] == pytest.approx(4.5)
    assert sc["steps_per_rank"]["before"] == 4
    # tokens/s: the step table's definition (as `analyze`): tokens over step time, 4 steps x 8 tokens / 4 x 6.5 ms
    assert sc["tokens_per_s"]["before"] == pytest.approx(32 / (4 * 6.5e-3))
    assert sc["tokens_per_s"]["after"] == pytest.approx(32 / (4 * 4.5e-3))
    assert d.verdict[0].startswith("after is 1.44× faster per step (step -31%: p50 6.500 → 4.500 ms over 4 steps paired by step number")  # 6.5 / 4.5
    assert any("moe_gemm -2.000 ms/step (-50.0%)" in v for v in d.verdict)


def test_kernels_matched_by_name_then_category() -> None:
    d = diff_runs(run(4.0), run(2.0, moe_name="fused_moe_kernel_v2"))
    k = {r["name"]: r for r in d.kernels.to_dicts()}
    assert "flash_attn_decode" not in k  # unchanged kernels are left out
    cat_rows = [r for r in d.kernels.to_dicts() if r["match"] == "category"]
    assert len(cat_rows) == 1
    c = cat_rows[0]
    assert c["category"] == "moe_gemm" and c["before_ns"] == pytest.approx(4 * MS) and c["after_ns"] == pytest.approx(2 * MS)
    assert "1 name(s) only before, 1 only after" in c["name"]
    assert d.kernels.row(0, named=True)["match"] == "category"  # largest |delta| first


def test_same_name_kernel_delta() -> None:
    d = diff_runs(run(4.0), run(3.0))
    top = d.kernels.row(0, named=True)
    assert (top["match"], top["name"]) == ("name", "fused_moe_kernel")
    assert top["delta_ns"] == pytest.approx(-1 * MS) and top["count_before"] == 4 and top["count_after"] == 4


def test_allreduce_wait_vs_transfer() -> None:
    s = summarize_run(run(4.0, early_ms=0.3))
    c = s.collectives.row(0, named=True)
    # per rank: 4 all-reduces; rank 1 waits 0.3 ms each, transfer 0.5 ms on both ranks
    assert c["count"] == 4
    assert c["wait_ns"] == pytest.approx(4 * 0.3 * MS / 2)
    assert c["transfer_ns"] == pytest.approx(4 * 0.5 * MS)
    d = diff_runs(run(4.0, early_ms=0.3), run(4.0))
    row = d.collectives.row(0, named=True)
    assert row["wait_ns_delta"] == pytest.approx(-0.15 * MS)
    assert row["transfer_ns_delta"] == pytest.approx(0)


def test_diff_waits_are_the_matchings_waits() -> None:
    """One definition of wait/transfer: the diff's per-rank means are collectives.match_collectives' sums."""
    df = run(4.0, early_ms=0.3)
    inst = match_collectives(df)
    per_rank = inst.group_by("rank").agg(pl.col("wait_ns").sum(), pl.col("transfer_ns").first()).sort("rank")
    assert per_rank["wait_ns"].to_list() == [0, int(4 * 0.3 * MS)]
    assert per_rank["transfer_ns"].to_list() == [int(0.5 * MS)] * 2
    c = summarize_run(df).collectives.row(0, named=True)
    assert c["wait_ns"] == pytest.approx(float(inst["wait_ns"].sum()) / 2)
    assert c["transfer_ns"] == pytest.approx(float(inst["transfer_ns"].sum()) / 2)


def test_no_change_verdict_and_power() -> None:
    d = diff_runs(run(4.0, power=300.0), run(4.0, power=360.0))
    assert d.verdict[0].startswith("no significant change in step time")
    sc = {r["metric"]: r for r in d.scalars.to_dicts()}
    assert sc["power_w"]["before"] == pytest.approx(300.0) and sc["power_w"]["after"] == pytest.approx(360.0)
    assert any("mean power 300 → 360 W (+20.0%)" in v for v in d.verdict)


def test_per_window_basis_without_steps_flags_quality() -> None:
    d = diff_runs(run(4.0, with_steps=False), run(2.0, with_steps=False, steps=2))
    assert d.basis == "per_window"
    assert "diff_windows_differ" in {q.code for q in d.quality}
    assert d.verdict[0].startswith("GPU busy time down")
    d2 = diff_runs(run(4.0), run(2.0, with_steps=False))
    assert d2.basis == "per_window" and "diff_steps_one_side" in {q.code for q in d2.quality}


def test_json_is_serializable() -> None:
    import json

    d = diff_runs(run(4.0), run(2.0))
    blob = json.loads(json.dumps(d.to_json(), default=str))
    assert blob["basis"] == "per_step" and blob["verdict"] == d.verdict
    assert {r["bucket"] for r in blob["categories"]} >= {"moe_gemm", "attention", "idle"}


def test_speedups_are_factors_and_slowdowns_too() -> None:
    from tracekit.compare.diff import _times

    assert _times(3.06, 1.0) == "3.06× faster" and _times(1.0, 1.25) == "1.25× slower" and _times(2.0, 2.0) == "1.00× slower"
    d = diff_runs(run(2.0), run(4.0))  # the MoE GEMM got slower
    assert " slower per step (step +" in d.verdict[0] and "×" in d.verdict[0]
