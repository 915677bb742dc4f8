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
