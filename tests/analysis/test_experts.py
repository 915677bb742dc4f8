"""Expert load imbalance from the per-expert loop's GEMM sizes (tracekit/analysis/passes/experts.py)."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from tracekit.analysis.passes.experts import expert_load_finding, expert_load_finish, expert_load_part
from tracekit.schema import frame_from_rows

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "gpu"
RAW = Path("/work/corpus_raw/olmoe_eager_sdpa.stack.json.gz")
H, I = 64, 32


def _loop(loads: list[list[list[int]]], tokens: list[int]) -> pl.DataFrame:
    """Steps x layers x experts' token counts: per expert an input projection [m,H]x[H,2I] and a down [m,I]x[I,H];
    attention (a 2 ms pause) between layers."""
    rows, t = [], 1_000_000
    for s, (layers, tok) in enumerate(zip(loads, tokens)):
        rows.append(dict(rank=0, kind="step", ts_ns=t, dur_ns=10**9, name=f"forward#{s}:decode:bs={tok}", step_id=s, tokens=tok, tid=1))
        for layer in layers:
            t += 2_000_000  # attention
            for m in layer:
                for dims in ([[m, H], [H, 2 * I]], [[m, I], [I, H]]):
                    rows.append(dict(rank=0, kind="cpu_op", ts_ns=t, dur_ns=20_000, name="aten::mm", tid=1, input_dims=json.dumps(dims),
                                     input_types='["c10::BFloat16","c10::BFloat16"]', step_id=s))
                    rows.append(dict(rank=0, kind="kernel", ts_ns=t + 30_000, dur_ns=10_000, name="nvjet_sm90_tst_64x8_64x16_2x1",
                                     category="moe_gemm", launch_ts_ns=t + 5_000, launch_tid=1, stream=7, step_id=s))
                    t += 50_000
        t += 5_000_000
    return frame_from_rows(rows)


def test_hand_built_loop_tokens_per_expert():
    # 2 tokens x top-2 = 4 pairs per layer; 2 layers; experts get [3,1] then [1,1,1,1]
    df = _loop([[[3, 1], [1, 1, 1, 1]], [[2, 2], [4]]], [2, 2])
    meta = {"capture": {"workload": {"model": {"n_experts": 8, "top_k": 2}}}}
    v = expert_load_finish([expert_load_part(df)], meta)
    assert v["status"] == "ok" and v["mean_basis"] == "all experts"
    lay = {r["layer"]: r for r in v["layers"]}
    assert lay[0]["max_tokens"] == 3 and lay[1]["max_tokens"] == 4
    assert lay[1]["max_over_mean"] == pytest.approx(4 / (4 / 8))  # 4 tokens vs 0.5 mean over 8 experts
    assert v["worst"]["step_id"] == 1 and v["worst"]["layer"] == 1
    # without metadata: k inferred from the pauses between layers, mean over experts that got tokens
    v2 = expert_load_finish([expert_load_part(df)], None)
    assert v2["top_k"] == 2 and v2["mean_basis"] == "experts that received tokens"
    assert {r["layer"]: r["max_tokens"] for r in v2["layers"]} == {0: 3, 1: 4}
    assert "busiest expert gets" in expert_load_finding(v2)


def test_says_what_is_needed():
    for name, status in (("grouped", "grouped_no_offsets"), ("loop", "no_shapes")):
        p = FIX / f"{name}.trace.parquet"
        if not p.exists():
            pytest.skip("GPU fixtures absent")
        from tracekit.api import analyze

        res = analyze(p)
        assert res["expert_load"]["status"] == status
        assert any(f.startswith("Expert load imbalance is not in this trace") for f in res["findings"])


def test_corpus_olmoe_loop_with_shapes():
    if not RAW.exists():
        pytest.skip("corpus raw captures absent")
    from tracekit.categories import default_rules
    from tracekit.ingest.common import finalize_rank
    from tracekit.ingest.kineto import read_kineto

    df = finalize_rank(read_kineto(RAW, rank=0)[0], default_rules())
    truth = json.loads(RAW.with_name("olmoe_eager_sdpa.stack.truth.json").read_text())["config"]
    v = expert_load_finish([expert_load_part(df)], None)
    assert v["status"] == "ok" and v["top_k"] == truth["num_experts_per_tok"]  # k inferred = the model's 8
    assert len({r["layer"] for r in v["layers"]}) == truth["num_hidden_layers"]
    assert all(r["active_experts_mean"] <= truth["num_experts"] for r in v["layers"])
    assert all(1.0 <= r["max_over_mean"] for r in v["layers"])
