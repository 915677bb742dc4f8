"""A CPU program with transformers-like module names (router, experts loop, attention), steps as forward#i."""

import argparse

import torch
from torch.profiler import record_function

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=40)
a = ap.parse_args()
torch.set_num_threads(1)


class TinyTopKRouter(torch.nn.Module):
    def __init__(self, d: int, e: int) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(e, d))

    def forward(self, x):
        return torch.topk(torch.softmax(x @ self.w.t(), -1), 2, -1)


class TinyMoeExperts(torch.nn.Module):
    def __init__(self, d: int, e: int) -> None:
        super().__init__()
        self.up = torch.nn.Parameter(torch.randn(e, d, 2 * d))
        self.down = torch.nn.Parameter(torch.randn(e, 2 * d, d))

    def forward(self, x, idx, w):
        out = torch.zeros_like(x)
        for e in range(self.up.shape[0]):
            tok, k = torch.where(idx == e)
            if tok.numel():
                out.index_add_(0, tok, (torch.relu(x[tok] @ self.up[e]) @ self.down[e]) * w[tok, k, None])
        return out


class TinyAttention(torch.nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(d, 3 * d)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, -1)
        return torch.nn.functional.scaled_dot_product_attention(q[None], k[None], v[None])[0]


class TinyModel(torch.nn.Module):
    def __init__(self, d: int = 16, e: int = 4) -> None:
        super().__init__()
        self.attn, self.gate, self.experts = TinyAttention(d), TinyTopKRouter(d, e), TinyMoeExperts(d, e)

    def forward(self, x):
        h = self.attn(x)
        w, idx = self.gate(h)
        return self.experts(h, idx, w)


m = TinyModel().eval()
x = torch.randn(8, 16)
with torch.no_grad():
    for i in range(a.steps):
        with record_function(f"forward#{i}:decode:bs=8"):
            x = m(x).tanh()
print("done", flush=True)
