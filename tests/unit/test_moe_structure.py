"""The launch-pattern pass (tracekit.ingest.moe_structure) on hand-built op sequences.

The real-trace checks are in tests/corpus (GLM-5 DSA indexer, eager experts, routers); these pin
each pattern and its negatives so a rule change shows which one moved.
"""

from __future__ import annotations

import polars as pl

from tracekit.ingest.moe_structure import apply_moe_structure

GEMM = ("nvjet_sm90_tst_64x8_64x16_2x4_h_bz_TNT", "dense_gemm", "gemm.dense")
F32_GEMM = ("void gemmSN_TN_kernel<float, 128, 16, 2, 4, 8, 9, false>", "dense_gemm", "gemm.dense")
GEMV = ("void gemvNSP_kernel<float, float, float, float, 1, 16, 4, 1024, false>", "dense_gemm", "gemm.dense")
ELEM = ("void at::native::vectorized_elementwise_kernel<4, at::native::AUnaryFunctor<float>>", "other_compute", "elementwise.pointwise")
TOPK = ("void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>", "other_compute", "elementwise.sort_scan")
SORT = ("void at::native::radixSortKVInPlace<2, -1, 32, 32, float, long, unsigned int>", "other_compute", "elementwise.sort_scan")
SDPA = ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1", "attention", "attention.cudnn_sdpa")
SOFTMAX = ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float>", "other_compute", "elementwise.softmax")
COMBINE = ("void at::native::indexFuncLargeIndex<c10::BFloat16, long, unsigned int, 2, 2, -2, true>", "other_compute", "elementwise.index")
NORM = ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>", "other_compute", "norm")


def _frame(ops: list[tuple[str, str, str]]) -> pl.DataFrame:
    n = len(ops)
    return pl.DataFrame({
        "rank": [0] * n,
        "kind": ["kernel"] * n,
        "ts_ns": [1_000 * (i + 1) for i in range(n)],
        "dur_ns": [500] * n,
        "launch_ts_ns": [1_000 * i + 100 for i in range(n)],
        "name": [o[0] for o in ops],
        "category": [o[1] for o in ops],
        "family": [o[2] for o in ops],
    }).with_columns(pl.col("name", "category", "family").cast(pl.Categorical))


def _cats(df: pl.DataFrame) -> list[tuple[str, str]]:
    return list(zip(df["category"].cast(pl.String).to_list(), df["family"].cast(pl.String).to_list()))


def _indexer_layer() -> list[tuple[str, str, str]]:
    """q projection, the indexer (q.k scores, head weights, weighted sum, top-k over keys, mask), SDPA, o projection."""
    return [GEMM, *[ELEM] * 6, F32_GEMM, ELEM, ELEM, GEMM, ELEM, ELEM, GEMV, ELEM, ELEM, ELEM, TOPK, SORT, *[ELEM] * 5, SDPA, GEMM]


def test_indexer_gemm_chain_before_a_key_topk_feeding_attention_is_attention() -> None:
    ops = _indexer_layer()
    out = _cats(apply_moe_structure(_frame(ops)))
    chain = [7, 10, 13]
    for i in chain:
        assert out[i] == ("attention", "attention.indexer"), (i, out[i])
    assert out[0] == ("dense_gemm", "gemm.dense")  # the q projection, 7 ops before the chain
    assert out[-1] == ("dense_gemm", "gemm.dense")  # the output projection after attention
    assert out[17] == ("other_compute", "elementwise.sort_scan")  # the top-k itself stays other_compute
    assert out[-2] == ("attention", "attention.cudnn_sdpa")
    assert sum(c == "attention" for c, _ in out) == 4


def test_topk_followed_by_a_gemm_before_attention_is_no_indexer() -> None:
    ops = _indexer_layer()
    ops.insert(20, GEMM)  # a projection between the top-k and attention: the top-k does not feed the attention
    out = _cats(apply_moe_structure(_frame(ops)))
    assert not any(f == "attention.indexer" for _, f in out)


def test_topk_far_from_attention_is_no_indexer() -> None:
    ops = [GEMM, ELEM, GEMV, ELEM, TOPK, *[ELEM] * 30, SDPA]
    out = _cats(apply_moe_structure(_frame(ops)))
    assert not any(f == "attention.indexer" for _, f in out)


def test_router_topk_is_routing_and_not_an_indexer() -> None:
    # gate GEMM -> softmax -> top-k -> per-expert GEMM pairs -> index_add combine -> norm, then attention of the next layer
    ops = [GEMM, SOFTMAX, TOPK, SORT, ELEM, GEMM, ELEM, GEMM, COMBINE, GEMM, ELEM, GEMM, COMBINE, NORM, SDPA]
    out = _cats(apply_moe_structure(_frame(ops)))
    assert out[0][0] == "moe_routing" and out[2][0] == "moe_routing"
    assert [out[i][0] for i in (5, 7, 9, 11)] == ["moe_gemm"] * 4
    assert not any(f == "attention.indexer" for _, f in out)


def test_sampler_topk_is_left_alone() -> None:
    # lm_head GEMM -> softmax -> top-k at the end of a step, then the next step's projections
    ops = [GEMM, SOFTMAX, TOPK, ELEM, ELEM, NORM, GEMM, ELEM, SDPA]
    out = _cats(apply_moe_structure(_frame(ops)))
    assert out[0] == ("dense_gemm", "gemm.dense")
    assert not any(f == "attention.indexer" for _, f in out)


# --- issue 25: launching ops (External id -> aten op), top-k-first routers, loops, sinks, unsure cases
DTOH = ("Memcpy DtoH (Device -> Pinned)", "memory", "memory.copy")
SIGMOID = ("void at::native::vectorized_elementwise_kernel<4, at::native::sigmoid_kernel_cuda>", "other_compute", "elementwise.activation")


def _framed(ops: list[tuple[tuple[str, str, str], str | None]]) -> pl.DataFrame:
    """GPU ops with the aten op that launched each (a cpu_op row sharing its External id), as a plain Kineto trace has."""
    base = _frame([o for o, _ in ops])
    kind = ["memcpy" if o[0].startswith("Memcpy") else "kernel" for o, _ in ops]
    gpu = base.with_columns(pl.Series("kind", kind).cast(pl.Categorical), pl.Series("external_id", list(range(100, 100 + len(ops)))),
                            pl.Series("memcpy_kind", ["DtoH" if k == "memcpy" else None for k in kind]).cast(pl.Categorical))
    cpu = pl.DataFrame({"rank": [0] * len(ops), "kind": ["cpu_op"] * len(ops), "ts_ns": [1_000 * i + 50 for i in range(len(ops))],
                        "dur_ns": [100] * len(ops), "name": [op or "aten::unknown" for _, op in ops],
                        "external_id": list(range(100, 100 + len(ops)))}).with_columns(pl.col("kind", "name").cast(pl.Categorical))
    keep = [i for i, (_, op) in enumerate(ops) if op is not None]
    return pl.concat([gpu, cpu[keep]], how="diagonal_relaxed")


def _gpu_cats(df: pl.DataFrame) -> list[tuple[str, str]]:
    return _cats(df.filter(pl.col("kind").cast(pl.String) != "cpu_op"))


def test_topk_first_router_and_an_eager_loop_with_bias_and_clamp() -> None:
    # GPT-OSS eager: gate GEMM -> top-k -> softmax; per expert: host sync, gather, GEMM, bias add, clamp, sigmoid, GEMM, combine
    it = [(DTOH, "aten::nonzero"), (ELEM, "aten::index"), (GEMM, "aten::mm"), (ELEM, "aten::add"), (ELEM, "aten::clamp"),
          (SIGMOID, "aten::sigmoid"), (GEMM, "aten::mm"), (ELEM, "aten::mul"), (COMBINE, "aten::index_add_")]
    ops = [(NORM, None), (GEMM, "aten::addmm"), (TOPK, "aten::topk"), (SOFTMAX, "aten::_softmax"), *it, *it, (NORM, None)]
    out = _gpu_cats(apply_moe_structure(_framed(ops)))
    assert out[1] == ("moe_routing", "moe_routing.gate") and out[2][0] == "moe_routing"
    gemms = [i for i, (o, _) in enumerate(ops) if o is GEMM][1:]
    assert all(out[i] == ("moe_gemm", "moe_gemm.structure") for i in gemms)
    assert out[4 + 3] == ("moe_routing", "moe_routing.dispatch")  # the separate bias add
    assert out[4 + 5] == ("other_compute", "elementwise.activation")  # the clamped SwiGLU's sigmoid
    assert out[4] == ("memory", "memory.copy")


def test_plain_gemm_in_a_block_that_does_not_loop_stays_dense() -> None:
    # Llama 4: gate -> top-k -> sigmoid, experts as bmm over all experts, the shared expert's mm, then the combine (sum)
    SUM = ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::sum_functor>>>",
           "other_compute", "elementwise.reduce")
    ops = [(NORM, None), (GEMM, "aten::mm"), (TOPK, "aten::topk"), (SIGMOID, "aten::sigmoid"), (ELEM, "aten::mul"),
           (GEMM, "aten::bmm"), (ELEM, "aten::silu"), (GEMM, "aten::bmm"), (GEMM, "aten::mm"), (GEMM, "aten::mm"), (SUM, "aten::sum"),
           (NORM, None)]
    out = _gpu_cats(apply_moe_structure(_framed(ops)))
    assert out[5] == ("moe_gemm", "moe_gemm.structure") and out[7] == ("moe_gemm", "moe_gemm.structure")
    assert out[8] == ("dense_gemm", "gemm.moe_block") and out[9] == ("dense_gemm", "gemm.moe_block")
    # without launching ops (an nsys trace) the block's GEMMs are all expert GEMMs, as before
    bare = _cats(apply_moe_structure(_frame([o for o, _ in ops])))
    assert bare[8][0] == "moe_gemm"


def test_shared_expert_right_before_the_gate_stays_dense() -> None:
    # Qwen2-MoE: the shared expert's down projection, then the gate GEMM (another aten op) -> softmax -> top-k
    ops = [(NORM, None), (GEMM, "aten::mm"), (GEMM, "aten::mm"), (SOFTMAX, "aten::_softmax"), (TOPK, "aten::topk"),
           (ELEM, "aten::sort"), (GEMM, "aten::bmm"), (COMBINE, "aten::index_add_"), (NORM, None)]
    out = _gpu_cats(apply_moe_structure(_framed(ops)))
    assert out[1] == ("dense_gemm", "gemm.dense")
    assert out[2] == ("moe_routing", "moe_routing.gate")


def test_eager_attention_with_sinks_between_batched_matmuls() -> None:
    # QK^T bmm, scale, mask, cat(sinks), max, sub, softmax, slice copy, PV bmm
    ops = [(NORM, None), (GEMM, "aten::mm"), (GEMM, "aten::bmm"), *[(ELEM, "aten::mul")] * 5, (SOFTMAX, "aten::_softmax"),
           (ELEM, "aten::copy_"), (GEMM, "aten::bmm"), (GEMM, "aten::mm"), (NORM, None)]
    out = _gpu_cats(apply_moe_structure(_framed(ops)))
    assert [out[i][0] for i in (2, 8, 10)] == ["attention"] * 3
    assert out[1][0] == "dense_gemm" and out[11][0] == "dense_gemm"  # the projections
    # the same order without launching ops: more than MAX_ATTN_GAP ops between, not claimed
    bare = _cats(apply_moe_structure(_frame([o for o, _ in ops])))
    assert not any(c == "attention" for c, _ in bare)


def test_loop_without_a_router_is_flagged_not_claimed() -> None:
    # per-expert loop shape (host sync, GEMMs, combine) but no gate -> top-k before it: dense, flagged for the MoE range
    it = [(DTOH, "aten::nonzero"), (ELEM, "aten::index"), (GEMM, "aten::mm"), (GEMM, "aten::mm"), (COMBINE, "aten::index_add_")]
    ops = [(NORM, None), *it, *it, *it, (NORM, None), (GEMM, "aten::mm")]
    out = _gpu_cats(apply_moe_structure(_framed(ops)))
    loop_gemms = [i for i, (o, _) in enumerate(ops[:-1]) if o is GEMM]
    assert all(out[i] == ("dense_gemm", "gemm.moe_loop") for i in loop_gemms)
    assert out[-1] == ("dense_gemm", "gemm.dense")
