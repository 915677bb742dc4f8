"""The built-in workload: expert implementations agree, routing shape, schedule determinism, straggler injector."""

from __future__ import annotations

from dataclasses import replace

import torch

from tracekit.workloads.moe import CPU_SMALL, TPMoEModel
from tracekit.workloads.serving import DelayInjector, ServeConfig, ServingLoop


def _pair(**kw):  # noqa: ANN003, ANN202
    a = TPMoEModel(replace(CPU_SMALL, moe_impl="loop", **kw), 0, 1, torch.device("cpu"))
    b = TPMoEModel(replace(CPU_SMALL, moe_impl="grouped", **kw), 0, 1, torch.device("cpu"))
    b.layers, b.embed, b.lm_head = a.layers, a.embed, a.lm_head
    return a, b


def test_loop_and_grouped_experts_agree():
    a, b = _pair()
    x = torch.randn(7, CPU_SMALL.hidden)
    L = a.layers[0]
    idx, w = a._route(x, L)
    assert idx.shape == (7, CPU_SMALL.top_k) and int(idx.max()) < CPU_SMALL.n_experts
    ref = a._experts_loop(x, idx, w, L)
    assert torch.allclose(ref, b._experts_grouped(x, idx, w, L), atol=1e-4)
    b.use_grouped_mm = False  # bmm over capacity-padded experts; no drops with a large capacity
    b.cfg = replace(b.cfg, capacity_factor=100.0)
    assert torch.allclose(ref, b._experts_grouped(x, idx, w, L), atol=1e-4)
    assert torch.equal(a(torch.arange(5), "DECODE", 5), b(torch.arange(5), "DECODE", 5))


def test_router_weights_sum_to_scaling_factor():
    a, _ = _pair()
    x = torch.randn(4, CPU_SMALL.hidden)
    _idx, w = a._route(x, a.layers[0])
    assert torch.allclose(w.sum(-1), torch.full((4,), CPU_SMALL.routed_scaling), atol=1e-5)


def test_schedule_is_deterministic_and_mixes_prefill_and_decode():
    cfg = ServeConfig(max_batch=4, prompt_len=8, out_len_min=3, out_len_max=6, prefill_every=4, prefill_max_seqs=2)
    runs = []
    for _ in range(2):
        m = TPMoEModel(replace(CPU_SMALL, n_layers=1), 0, 1, torch.device("cpu"))
        loop = ServingLoop(m, cfg)
        runs.append([loop.step() for _ in range(30)])
    assert runs[0] == runs[1]
    modes = {r[0] for r in runs[0]}
    assert modes == {"EXTEND", "DECODE"}
    assert all(t == n * 8 for mode, n, t in runs[0] if mode == "EXTEND")
    assert max(n for mode, n, _t in runs[0] if mode == "DECODE") <= 4


def test_delay_injector_records_ground_truth():
    d = DelayInjector(rank=1, delay_rank=1, delay_ms=2.0, every=3)
    for s in range(7):
        d(s)
    assert [e[0] for e in d.events] == [0, 3, 6]
    assert all(e[2] >= 2_000_000 for e in d.events)
    other = DelayInjector(rank=0, delay_rank=1, delay_ms=2.0, every=3)
    other(0)
    assert other.events == []
