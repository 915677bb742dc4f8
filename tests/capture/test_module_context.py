"""tracekit.capture.module_context on CPU: ranges per role module, categories from them, hooks removable."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

torch = pytest.importorskip("torch")

from tracekit.capture import module_context as mc
from tracekit.ingest.convert import convert
from tracekit.schema import read_trace


class TinyTopKRouter(torch.nn.Module):
    def __init__(self, d: int, e: int) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(e, d))

    def forward(self, x):  # type: ignore[no-untyped-def]
        p = torch.softmax(x @ self.w.t(), -1)
        return torch.topk(p, 2, -1)


class TinyMoeExperts(torch.nn.Module):
    def __init__(self, d: int, e: int) -> None:
        super().__init__()
        self.up = torch.nn.Parameter(torch.randn(e, d, 4 * d))
        self.down = torch.nn.Parameter(torch.randn(e, 4 * d, d))

    def forward(self, x, idx, w):  # type: ignore[no-untyped-def]
        out = torch.zeros_like(x)
        for e in range(self.up.shape[0]):  # the transformers "eager" loop
            tok, k = torch.where(idx == e)
            if tok.numel() == 0:
                continue
            h = torch.nn.functional.silu(x[tok] @ self.up[e]) @ self.down[e]
            out.index_add_(0, tok, h * w[tok, k, None])
        return out


class TinySparseMoeBlock(torch.nn.Module):
    def __init__(self, d: int, e: int) -> None:
        super().__init__()
        self.gate = TinyTopKRouter(d, e)
        self.experts = TinyMoeExperts(d, e)

    def forward(self, x):  # type: ignore[no-untyped-def]
        w, idx = self.gate(x)
        return self.experts(x, idx, w)


class TinyAttention(torch.nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(d, 3 * d)

    def forward(self, x):  # type: ignore[no-untyped-def]
        q, k, v = self.qkv(x).chunk(3, -1)
        return torch.nn.functional.scaled_dot_product_attention(q[None], k[None], v[None])[0]


class TinyModel(torch.nn.Module):
    def __init__(self, d: int = 32, e: int = 4) -> None:
        super().__init__()
        self.attn = TinyAttention(d)
        self.moe = TinySparseMoeBlock(d, e)

    def forward(self, x):  # type: ignore[no-untyped-def]
        return self.moe(self.attn(x))


def test_roles_by_class_name() -> None:
    assert mc.role_of(TinyTopKRouter) == "router"
    assert mc.role_of(TinyMoeExperts) == "experts"
    assert mc.role_of(TinySparseMoeBlock) == "moe"
    assert mc.role_of(TinyAttention) == "attention"
    assert mc.role_of(TinyModel) is None and mc.role_of(torch.nn.Linear) is None


def _profile(model, path: Path, steps: int = 2) -> None:  # type: ignore[no-untyped-def]
    x = torch.randn(16, 32)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for i in range(steps):
            with torch.profiler.record_function(f"forward#{i}:decode:bs=16"):
                model(x)
    prof.export_chrome_trace(str(path))


def test_ranges_and_categories_on_cpu(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = TinyModel()
    mc.install()  # armed: hooks the first model that runs
    try:
        _profile(model, tmp_path / "t.json")
    finally:
        mc.uninstall()
    convert([tmp_path / "t.json"], tmp_path / "t.parquet")
    df, _ = read_trace(tmp_path / "t.parquet")
    names = set(df.filter(pl.col("kind").cast(pl.String) == "range")["name"].cast(pl.String).to_list())
    assert {"tk.mod[router TinyTopKRouter]", "tk.mod[experts TinyMoeExperts]", "tk.mod[moe TinySparseMoeBlock]",
            "tk.mod[attention TinyAttention]"} <= names
    assert df.filter(pl.col("kind").cast(pl.String) == "step").height == 2
    cat = df.filter(pl.col("category").is_not_null()).group_by(pl.col("family").cast(pl.String)).agg(
        pl.col("category").cast(pl.String).first(), pl.len())
    fam = dict(zip(cat["family"].to_list(), cat["category"].to_list()))
    # the experts' matmuls are MoE GEMMs, the router's ops routing, SDPA attention (CPU mode: operators stand in for kernels)
    assert fam.get("ctx.moe_experts") == "moe_gemm"
    assert fam.get("ctx.moe_router") == "moe_routing"
    assert fam.get("attention.cpu") == "attention"


def test_uninstall_removes_every_hook() -> None:
    model = TinyModel()
    assert mc.install(model) == 4
    assert any(m._forward_pre_hooks for m in model.modules())
    mc.uninstall()
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in model.modules())
    assert not torch.nn.modules.module._global_forward_pre_hooks
