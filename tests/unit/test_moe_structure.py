"""MoE launch-pattern pass on hand-built sequences (the real-trace check is tests/corpus)."""

from __future__ import annotations

import polars as pl

from tracekit.ingest.common import finalize_rank
from tracekit.schema import frame_from_rows

GEMM = "nvjet_sm90_tst_64x8_64x16_1x4_h_bz_TNT"
SOFTMAX = "void (anonymous namespace)::softmax_warp_forward<float, float, float, 6, false, false>(...)"
TOPK = "void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>(...)"
NONZERO = "void at_cuda_detail::cub::detail::select::DeviceSelectSweepKernel<...>(...)"
SILU = "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::silu_kernel(...)>>(...)"
MUL = "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::BinaryFunctor<MulFunctor>>>(...)"
INDEX_ADD = "void at::native::indexFuncSmallIndex<c10::BFloat16, long, unsigned int, 2, 2, -2>(...)"
NORM = "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float, float, float>>>(...)"


def _frame(names: list[str]) -> pl.DataFrame:
    rows = []
    for i, n in enumerate(names):
        kind = "memcpy" if n.startswith("Memcpy") else "kernel"
        rows.append({"rank": 0, "kind": kind, "ts_ns": 1000 * i, "dur_ns": 100, "name": n, "stream": 7})
    return finalize_rank(frame_from_rows(rows))


def _cats(df: pl.DataFrame) -> list[str]:
    return df.filter(pl.col("kind").cast(pl.String).is_in(["kernel", "memcpy"])).sort("ts_ns")["category"].cast(pl.String).to_list()


def test_expert_loop_after_router() -> None:
    loop = [NONZERO, "Memcpy DtoH (Device -> Pinned)", GEMM, SILU, MUL, GEMM, MUL, INDEX_ADD]
    seq = [NORM, GEMM, SOFTMAX, TOPK, *loop, *loop, NORM, GEMM]
    cats = _cats(_frame(seq))
    assert cats[1:4] == ["moe_routing"] * 3  # gate GEMM, softmax, top-k
    block = cats[4:20]
    assert block.count("moe_gemm") == 4
    assert block[3] == "other_compute"  # the activation stays elementwise
    assert block[1] == "memory" and block[7] == "moe_routing"  # host sync copy, index_add combine
    assert cats[-1] == "dense_gemm"  # the next layer's GEMM is dense again


def test_sampler_softmax_topk_is_not_moe() -> None:
    cats = _cats(_frame([GEMM, SOFTMAX, TOPK, GEMM]))
    assert cats == ["dense_gemm", "other_compute", "other_compute", "dense_gemm"]


def test_eager_attention_gemm_softmax_gemm() -> None:
    cats = _cats(_frame([NORM, GEMM, MUL, SOFTMAX, GEMM, NORM]))
    assert cats[1:5] == ["attention", "other_compute", "attention", "attention"]
