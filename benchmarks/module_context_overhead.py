"""Overhead of tracekit.capture.module_context on CPU: time per hooked module call, with and without a profiler.

    python benchmarks/module_context_overhead.py [--layers 8] [--iters 200]

Runs a stack of MoE-like layers (attention + router + experts loop + MoE block, 4 hooked modules per
layer, all tiny so the hook cost is not hidden by compute) and prints the per-forward time without
hooks, with hooks, the difference per hooked call, and the same under an active torch.profiler.
The cost per hooked call is what matters: a real step costs (hooked calls per step) x (cost per call),
e.g. 4 per layer x 60 layers x cost, against the step time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "capture"))

import torch
from test_module_context import TinyModel

from tracekit.capture import module_context as mc


def _time(model: torch.nn.Module, x: torch.Tensor, iters: int) -> float:
    for _ in range(10):
        model(x)
    ts = []
    for _ in range(iters):
        t = time.perf_counter_ns()
        model(x)
        ts.append(time.perf_counter_ns() - t)
    return statistics.median(ts) / 1e3  # µs


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--iters", type=int, default=200)
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(*[TinyModel(d=16, e=2) for _ in range(a.layers)])
    x = torch.randn(4, 16)
    bases, hooks, bases_p, hooks_p = [], [], [], []
    n = 0
    with torch.no_grad():
        for _ in range(3):  # interleaved trials: a shared machine drifts
            bases.append(_time(model, x, a.iters))
            n = mc.install(model)
            hooks.append(_time(model, x, a.iters))
            mc.uninstall()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
                bases_p.append(_time(model, x, a.iters // 4))
            mc.install(model)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
                hooks_p.append(_time(model, x, a.iters // 4))
            mc.uninstall()
    base, hooked = statistics.median(bases), statistics.median(hooks)
    base_p, hooked_p = statistics.median(bases_p), statistics.median(hooks_p)
    per = (hooked - base) / n
    per_p = (hooked_p - base_p) / n
    print(f"hooked modules per forward: {n}")
    print(f"no profiler : {base:9.1f} us -> {hooked:9.1f} us per forward, {per:.2f} us per hooked call")
    print(f"profiler on : {base_p:9.1f} us -> {hooked_p:9.1f} us per forward, {per_p:.2f} us per hooked call "
          f"({100 * (hooked_p - base_p) / base_p:.1f}% of this profiled forward)")
    for layers, step_ms in ((3, 9.4), (60, 30.0), (78, 30.0)):
        calls = 4 * layers
        print(f"  {layers} layers x 4 hooked calls, {step_ms} ms step: {100 * calls * per_p / (step_ms * 1e3):.2f}% of the step (profiler on)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
