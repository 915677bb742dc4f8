"""A GLM-5-shaped tensor-parallel MoE decoder in plain PyTorch.

Knows nothing of tracekit: capture instruments it from outside, exactly as it
instruments SGLang. Ranges use neutral ``record_function`` names like real
models do (``embed``, ``attn``, ``router``, ``moe.experts``, ``shared_expert``,
``allreduce``, ``lm_head``).

Per layer (all layers are MoE; GLM-5's three leading dense layers are left out):

* attention proxy: fused QKV projection of ``heads/N`` heads on this rank, SDPA
  over a fixed-length KV context (decode) or causal over the prompt (prefill),
  o_proj, **allreduce**;
* MoE block: fp32 router GEMM, sigmoid scores, ``+ e_score_correction_bias`` for
  selection only, top-k of E experts, normalised weights x routed scaling
  factor; a shared expert; the routed experts with their intermediate size split
  over the N ranks (TP-MoE, no EP); **allreduce** of the partial sums.

Expert implementations (``moe_impl``):

* ``loop``: the naive MoE of many reference implementations: one host sync
  (``.tolist()`` of per-expert counts) per layer, then per-expert small GEMMs;
* ``grouped``: one grouped GEMM for all experts (``torch._grouped_mm`` with
  device-side offsets where it runs, else ``bmm`` over capacity-padded experts);
  no host sync, so it can be captured in a CUDA graph.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.profiler import record_function

__all__ = ["MoEConfig", "GLM5_GPU", "CPU_SMALL", "TPMoEModel", "grouped_mm_available"]


@dataclass
class MoEConfig:
    """Model shape. Widths are global (before the TP split)."""

    hidden: int = 6144
    n_layers: int = 4
    n_heads: int = 64
    head_dim: int = 128
    n_experts: int = 256
    top_k: int = 8
    moe_intermediate: int = 2048
    shared_intermediate: int = 2048
    vocab: int = 154880
    routed_scaling: float = 2.5
    kv_context: int = 1024  # decode attends to this many cached positions
    dtype: str = "bfloat16"
    moe_impl: str = "grouped"  # loop | grouped
    host_sync: bool = False  # an extra .item() per layer
    capacity_factor: float = 2.0  # bmm fallback of the grouped impl only
    seed: int = 1234

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


GLM5_GPU = MoEConfig()
CPU_SMALL = MoEConfig(
    hidden=256,
    n_layers=2,
    n_heads=8,
    head_dim=32,
    n_experts=64,
    top_k=8,
    moe_intermediate=128,
    shared_intermediate=128,
    vocab=4096,
    kv_context=64,
    dtype="float32",
)

@functools.cache
def grouped_mm_available(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether ``torch._grouped_mm`` runs on this device/dtype (probed once per pair)."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    try:
        a = torch.randn(8, 16, device=device, dtype=dtype)
        b = torch.randn(2, 16, 16, device=device, dtype=dtype)
        offs = torch.tensor([3, 8], device=device, dtype=torch.int32)
        return tuple(torch._grouped_mm(a, b, offs=offs).shape) == (8, 16)
    except Exception:  # noqa: BLE001 - unsupported arch/dtype
        return False
    dt = getattr(torch, dtype)
    try:
        a = torch.randn(8, 16, device=device, dtype=dt)
        b = torch.randn(2, 16, 16, device=device, dtype=dt)
        offs = torch.tensor([3, 8], device=device, dtype=torch.int32)
        return tuple(torch._grouped_mm(a, b, offs=offs).shape) == (8, 16)
    except Exception:  # noqa: BLE001 - unsupported arch/dtype
        return False


def _expert_counts(flat: torch.Tensor, n_experts: int) -> torch.Tensor:
    """Tokens per expert without a host sync (CUDA bincount reads its max back to the host)."""
    return torch.zeros(n_experts, dtype=torch.int64, device=flat.device).index_add_(0, flat, torch.ones_like(flat))


@dataclass
class _Shard:
    heads: int
    inter: int
    shared_inter: int
    vocab: int


class TPMoEModel(torch.nn.Module):
    """Tensor-parallel MoE decoder; call ``forward(tokens, mode, n_seqs)``.

    ``tokens``: int64 ``[T]`` (decode: one per sequence; prefill: ``n_seqs``
    prompts concatenated, equal length). Returns the greedy next token of each
    sequence (``[n_seqs]``, on the device). Every rank must call it with the same
    shapes; collectives go to ``group`` (default world).
    """

    def __init__(self, cfg: MoEConfig, rank: int, world: int, device: torch.device, group: Any = None) -> None:
        super().__init__()
        if cfg.n_heads % world or cfg.moe_intermediate % world or cfg.shared_intermediate % world or cfg.vocab % world:
            raise ValueError(f"heads/intermediate/vocab of {cfg} must divide by world size {world}")
        self.cfg, self.rank, self.world, self.device, self.group = cfg, rank, world, device, group
        self.dtype = getattr(torch, cfg.dtype)
        self.shard = _Shard(
            cfg.n_heads // world, cfg.moe_intermediate // world, cfg.shared_intermediate // world, cfg.vocab // world
        )
        g = torch.Generator(device="cpu").manual_seed(cfg.seed + 7919 * rank)
        H, s = cfg.hidden, self.shard
        qkv = s.heads * cfg.head_dim * 3
        self.embed = self._p((s.vocab, H), g, 1.0)
        self.lm_head = self._p((H, s.vocab), g, 1 / math.sqrt(H))
        self.layers = []
        for _ in range(cfg.n_layers):
            L = {
                "ln1": torch.ones(H, device=device, dtype=self.dtype),
                "ln2": torch.ones(H, device=device, dtype=self.dtype),
                "qkv": self._p((H, qkv), g, 1 / math.sqrt(H)),
                "o": self._p((s.heads * cfg.head_dim, H), g, 1 / math.sqrt(s.heads * cfg.head_dim)),
                "gate": self._p((H, cfg.n_experts), g, 1 / math.sqrt(H), dtype=torch.float32),
                "bias": self._p((cfg.n_experts,), g, 0.1, dtype=torch.float32),
                "w13": self._p((cfg.n_experts, H, 2 * s.inter), g, 1 / math.sqrt(H)),
                "w2": self._p((cfg.n_experts, s.inter, H), g, 1 / math.sqrt(max(1, s.inter))),
                "sw13": self._p((H, 2 * s.shared_inter), g, 1 / math.sqrt(H)),
                "sw2": self._p((s.shared_inter, H), g, 1 / math.sqrt(max(1, s.shared_inter))),
                "k": self._p((1, s.heads, cfg.kv_context, cfg.head_dim), g, 1.0),
                "v": self._p((1, s.heads, cfg.kv_context, cfg.head_dim), g, 1.0),
            }
            self.layers.append(L)
        self.use_grouped_mm = cfg.moe_impl == "grouped" and grouped_mm_available(device, self.dtype)

    # -- helpers ---------------------------------------------------------
    def _p(self, shape: tuple[int, ...], g: torch.Generator, scale: float, dtype: torch.dtype | None = None) -> torch.Tensor:
        dt = dtype or self.dtype
        numel = math.prod(shape)
        if numel > (1 << 24) or self.device.type != "cpu":
            # big weights: generate on the device (values do not matter, shapes do)
            t = torch.empty(shape, device=self.device, dtype=dt)
            return t.normal_(0.0, scale) if numel < (1 << 31) else t.uniform_(-scale, scale)
        return (torch.randn(shape, generator=g, dtype=torch.float32) * scale).to(self.device, dt)

    def _allreduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            with record_function("allreduce"):
                dist.all_reduce(x, group=self.group)
        return x

    @staticmethod
    def _rmsnorm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), w, 1e-6)

    # -- blocks ----------------------------------------------------------
    def _attention(self, x: torch.Tensor, L: dict[str, torch.Tensor], mode: str, n_seqs: int) -> torch.Tensor:
        cfg, h = self.cfg, self.shard.heads
        with record_function("attn"):
            qkv = x @ L["qkv"]
            q, k, v = qkv.view(x.shape[0], 3, h, cfg.head_dim).unbind(1)
            if mode == "DECODE":
                qd = q.unsqueeze(2)  # [T, h, 1, d]
                kc = L["k"].expand(x.shape[0], -1, -1, -1)
                vc = L["v"].expand(x.shape[0], -1, -1, -1)
                o = F.scaled_dot_product_attention(qd, kc, vc).squeeze(2)
            else:
                plen = x.shape[0] // n_seqs
                qp, kp, vp = (t.view(n_seqs, plen, h, cfg.head_dim).transpose(1, 2) for t in (q, k, v))
                o = F.scaled_dot_product_attention(qp, kp, vp, is_causal=True).transpose(1, 2)
            out = o.reshape(x.shape[0], h * cfg.head_dim) @ L["o"]
        return self._allreduce(out)

    def _route(self, x: torch.Tensor, L: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        with record_function("router"):
            logits = x.float() @ L["gate"]
            scores = logits.sigmoid()
            _, idx = torch.topk(scores + L["bias"], cfg.top_k, dim=-1)
            w = scores.gather(1, idx)
            w = w / w.sum(-1, keepdim=True) * cfg.routed_scaling
        return idx, w.to(self.dtype)

    def _experts_loop(self, x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor, L: dict[str, torch.Tensor]) -> torch.Tensor:
        E, k, inter = self.cfg.n_experts, self.cfg.top_k, self.shard.inter
        with record_function("moe.experts"):
            flat = idx.reshape(-1)
            order = torch.argsort(flat, stable=True)
            counts = _expert_counts(flat, E).tolist()  # host sync, as naive MoE does
            tok = order // k
            wts = w.reshape(-1)[order]
            out = torch.zeros_like(x)
            start = 0
            for e, c in enumerate(counts):
                if c == 0:
                    continue
                t = tok[start : start + c]
                h = x.index_select(0, t) @ L["w13"][e]
                h = F.silu(h[:, :inter]) * h[:, inter:]
                y = (h @ L["w2"][e]) * wts[start : start + c, None]
                out.index_add_(0, t, y)
                start += c
        return out

    def _experts_grouped(self, x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor, L: dict[str, torch.Tensor]) -> torch.Tensor:
        cfg, inter = self.cfg, self.shard.inter
        E, k, T = cfg.n_experts, cfg.top_k, x.shape[0]
        with record_function("moe.dispatch"):
            flat = idx.reshape(-1)
            order = torch.argsort(flat, stable=True)
            tok = order // k
            wts = w.reshape(-1)[order]
            xs = x.index_select(0, tok)
            counts = _expert_counts(flat, E)
        with record_function("moe.experts"):
            if self.use_grouped_mm:
                offs = torch.cumsum(counts, 0).to(torch.int32)
                h = torch._grouped_mm(xs, L["w13"], offs=offs)
                h = F.silu(h[:, :inter]) * h[:, inter:]
                y = torch._grouped_mm(h.contiguous(), L["w2"], offs=offs)
            else:
                cap = max(1, int(math.ceil(T * k / E * cfg.capacity_factor)))
                starts = torch.cumsum(counts, 0) - counts
                pos = torch.arange(T * k, device=x.device) - starts[flat[order]]
                keep = pos < cap
                slot = flat[order] * cap + pos.clamp(max=cap - 1)
                buf = torch.zeros(E * cap + 1, x.shape[1], device=x.device, dtype=x.dtype)  # last row: overflow
                buf.index_copy_(0, torch.where(keep, slot, E * cap), xs)
                h = torch.bmm(buf[: E * cap].view(E, cap, -1), L["w13"])
                h = F.silu(h[..., :inter]) * h[..., inter:]
                yb = torch.bmm(h, L["w2"]).view(E * cap, -1)
                y = yb.index_select(0, slot) * keep[:, None].to(x.dtype)
        with record_function("moe.combine"):
            out = torch.zeros_like(x)
            out.index_add_(0, tok, y * wts[:, None])
        return out

    def _moe(self, x: torch.Tensor, L: dict[str, torch.Tensor]) -> torch.Tensor:
        idx, w = self._route(x, L)
        if self.cfg.host_sync:
            with record_function("router.sync"):
                _ = int(idx[0, 0].item())  # a per-layer host sync, as some schedulers do
        with record_function("shared_expert"):
            s = x @ L["sw13"]
            si = self.shard.shared_inter
            shared = (F.silu(s[:, :si]) * s[:, si:]) @ L["sw2"]
        if self.cfg.moe_impl == "loop":
            routed = self._experts_loop(x, idx, w, L)
        else:
            routed = self._experts_grouped(x, idx, w, L)
        return self._allreduce(routed + shared)

    # -- forward ---------------------------------------------------------
    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, mode: str, n_seqs: int) -> torch.Tensor:
        V0 = self.rank * self.shard.vocab
        with record_function("embed"):
            local = tokens - V0
            inside = (local >= 0) & (local < self.shard.vocab)
            x = F.embedding(local.clamp(0, self.shard.vocab - 1), self.embed) * inside[:, None].to(self.dtype)
        x = self._allreduce(x)
        for L in self.layers:
            x = x + self._attention(self._rmsnorm(x, L["ln1"]), L, mode, n_seqs)
            x = x + self._moe(self._rmsnorm(x, L["ln2"]), L)
        with record_function("lm_head"):
            last = x if mode == "DECODE" else x.view(n_seqs, -1, x.shape[1])[:, -1]
            logits = last @ self.lm_head
            val, arg = logits.float().max(-1)
            arg = arg + V0
            if self.world > 1:
                both = torch.stack([val, arg.to(torch.float32)])  # exact for vocab < 2**24
                gathered = [torch.empty_like(both) for _ in range(self.world)]
                dist.all_gather(gathered, both, group=self.group)
                g = torch.stack(gathered)  # [world, 2, n]
                best = g[:, 0].argmax(0)
                arg = g[:, 1].gather(0, best[None])[0].to(torch.int64)
        return arg
