"""Kernel-name rules: known names -> (category, family), ordering, --rules extension/replacement, errors."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from tracekit._errors import InputError
from tracekit.categories import default_rules, load_rules
from tracekit.schema import CATEGORIES, frame_from_rows

KNOWN = [
    ("fused_moe_kernel", "moe_gemm", "moe_gemm.triton"),
    ("moe_align_block_size_kernel", "moe_routing", None),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "communication", "allreduce.nccl"),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "communication", "allreduce.nccl"),
    ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)", "communication", "collective.nccl_other"),
    ("void flashinfer::BatchDecodeWithPagedKVCacheKernel<true>(...)", "attention", "attention.flashinfer"),
    ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_TNN", "dense_gemm", "gemm.dense"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32", "dense_gemm", "gemm.dense"),
    ("Memcpy HtoD (Pageable -> Device)", "memory", "memory.copy"),
    ("Memset (Device)", "memory", "memory.copy"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(...)", "other_compute", "elementwise.pointwise"),
    ("multimem_all_reduce_kernel", "communication", "allreduce.torch_symm_mem"),
]


@pytest.mark.parametrize("name, cat, fam", KNOWN)
def test_known_names(name: str, cat: str, fam: str | None) -> None:
    c, f = default_rules().classify(name)
    assert c == cat
    if fam is not None:
        assert f == fam


def test_every_default_rule_has_a_valid_category_and_unique_id() -> None:
    rs = default_rules()
    assert all(r.category in CATEGORIES for r in rs.rules)
    ids = [r.id for r in rs.rules]
    assert len(ids) == len(set(ids))
    assert rs.default_category == "other_compute" and rs.default_id == "other"


def test_first_match_wins_moe_before_dense() -> None:
    # a grouped CUTLASS GEMM name also matches the dense 'cutlass' rule; MoE comes first
    name = "cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::GroupProblemShape<...>>>"
    assert default_rules().classify(name)[0] == "moe_gemm"


def test_categorize_only_gpu_ops_every_gpu_op_gets_one_category() -> None:
    df = frame_from_rows(
        [
            {"rank": 0, "kind": "kernel", "ts_ns": 0, "dur_ns": 1, "name": "fused_moe_kernel"},
            {"rank": 0, "kind": "kernel", "ts_ns": 1, "dur_ns": 1, "name": "totally_unknown"},
            {"rank": 0, "kind": "memcpy", "ts_ns": 2, "dur_ns": 1, "name": "Memcpy DtoH (Device -> Pinned)"},
            {"rank": 0, "kind": "cpu_op", "ts_ns": 3, "dur_ns": 1, "name": "fused_moe_kernel"},
        ]
    )
    out = default_rules().categorize(df)
    assert out["category"].cast(pl.String).to_list() == ["moe_gemm", "other_compute", "memory", None]
    assert out["family"].cast(pl.String).to_list() == ["moe_gemm.triton", "other", "memory.copy", None]


def _write(tmp_path: Path, doc: dict, name: str = "r.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return p


def test_rules_extension_goes_first(tmp_path: Path) -> None:
    p = _write(tmp_path, {"rules": [{"id": "mine.gemm", "category": "moe_gemm", "regex": "^nvjet_"},
                                    {"id": "mine.x", "category": "attention", "regex": "^my_attn$"}]})
    rs = load_rules(p)
    assert rs.classify("nvjet_tst_128") == ("moe_gemm", "mine.gemm")
    assert rs.classify("my_attn") == ("attention", "mine.x")
    assert rs.classify("fused_moe_kernel") == ("moe_gemm", "moe_gemm.triton")  # defaults still there
    assert default_rules().classify("nvjet_tst_128")[0] == "dense_gemm"  # defaults untouched


def test_rules_replace(tmp_path: Path) -> None:
    p = _write(tmp_path, {"replace": True, "rules": [{"id": "only", "category": "memory", "regex": "x"}],
                          "default": {"id": "nomatch", "category": "dense_gemm"}})
    rs = load_rules(p)
    assert rs.classify("xyz") == ("memory", "only")
    assert rs.classify("fused_moe_kernel") == ("dense_gemm", "nomatch")


@pytest.mark.parametrize(
    "doc, why",
    [
        ({"rules": [{"id": "a", "category": "gpu_magic", "regex": "x"}]}, "not one of"),
        ({"rules": [{"id": "a", "category": "memory", "regex": "("}]}, "invalid regex"),
        ({"rules": [{"id": "a"}]}, "needs id, category and regex"),
        ({"nope": []}, "'rules' list"),
    ],
)
def test_bad_rules_files(tmp_path: Path, doc: dict, why: str) -> None:
    p = _write(tmp_path, doc)
    with pytest.raises(InputError, match=why) as ei:
        load_rules(p)
    assert str(p) in str(ei.value)


def test_rules_file_not_json(tmp_path: Path) -> None:
    p = tmp_path / "r.json"
    p.write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        load_rules(p)
