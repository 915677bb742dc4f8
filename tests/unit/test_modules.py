"""Module context from a stack trace (tracekit.ingest.modules): nn.Module ranges -> tk.mod[...] by role and module tree."""

from __future__ import annotations

import polars as pl

from tracekit.ingest.modules import module_ranges


def _ranges(spans: list[tuple[str, int, int]]) -> pl.DataFrame:
    return pl.DataFrame({
        "rank": [0] * len(spans), "kind": ["range"] * len(spans), "tid": [1] * len(spans),
        "ts_ns": [s for _, s, _ in spans], "dur_ns": [e - s for _, s, e in spans], "name": [n for n, _, _ in spans],
    }).with_columns(pl.col("kind", "name").cast(pl.Categorical))


def test_roles_by_name_and_by_the_module_tree() -> None:
    df = _ranges([
        ("nn.Module: GptOssDecoderLayer_0", 0, 100),
        ("nn.Module: GptOssAttention_0", 1, 40),
        ("nn.Module: Linear_0", 2, 5),
        ("nn.Module: GptOssMLP_0", 50, 99),  # holds the router and the experts: the MoE block whatever its name
        ("nn.Module: GptOssTopKRouter_0", 51, 55),
        ("nn.Module: GptOssExperts_0", 56, 98),
        ("nn.Module: Qwen2MoeSparseMoeBlock_0", 200, 300),
        ("nn.Module: Qwen2MoeMLP_0", 201, 220),  # a shared expert: an MLP directly inside an MoE block
        ("nn.Module: Qwen2MoeExperts_0", 230, 290),
        ("nn.Module: LlamaMLP_0", 400, 420),  # a dense MLP: no role
        ("nn.Module: HunYuanMoEV1Moe_0", 500, 600),
        ("nn.Module: HunYuanMoEV1Gate_0", 501, 510),  # a Gate child of an MoE block is its router
        ("nn.Module: HunYuanMoEV1Experts_0", 511, 590),
        ("forward#0:prefill:bs=1", 0, 1000),  # not a module range: untouched
    ])
    names = module_ranges(df)["name"].cast(pl.String).to_list()
    assert names == [
        "tk.mod[attention GptOssAttention]", "tk.mod[moe GptOssMLP]", "tk.mod[router GptOssTopKRouter]",
        "tk.mod[experts GptOssExperts]", "tk.mod[moe Qwen2MoeSparseMoeBlock]", "tk.mod[mlp Qwen2MoeMLP]",
        "tk.mod[experts Qwen2MoeExperts]", "tk.mod[moe HunYuanMoEV1Moe]", "tk.mod[router HunYuanMoEV1Gate]",
        "tk.mod[experts HunYuanMoEV1Experts]", "forward#0:prefill:bs=1",
    ]


def test_a_trace_without_module_ranges_is_returned_as_is() -> None:
    df = _ranges([("forward#0:decode:bs=1", 0, 10)])
    assert module_ranges(df) is df
