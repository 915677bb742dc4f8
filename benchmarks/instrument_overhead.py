#!/usr/bin/env python3
"""Overhead of tracekit's forward instrumentation with the profiler off.

Runs the built-in workload (one process, world 1) and times decode steps bare
and instrumented, alternating every step (so drift hits both), plus the wrapper
cost per call on an empty function. Prints JSON; target: < 1 % of step time.

    python benchmarks/instrument_overhead.py [--device cpu|cuda] [--steps 200] [--layers 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from tracekit.capture.instrument import StepRecorder, instrument_forward  # noqa: E402
from tracekit.workloads.moe import CPU_SMALL, GLM5_GPU, TPMoEModel  # noqa: E402
from tracekit.workloads.serving import ServeConfig, ServingLoop  # noqa: E402


def _label(a, k):  # noqa: ANN001, ANN202
    return a[1], a[2], int(a[0].numel())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--moe-impl", default="grouped")
    a = ap.parse_args()
    dev = torch.device(a.device)
    torch.set_num_threads(1 if dev.type == "cpu" else torch.get_num_threads())
    base = GLM5_GPU if dev.type == "cuda" else CPU_SMALL
    cfg = replace(base, n_layers=a.layers, moe_impl=a.moe_impl)
    model = TPMoEModel(cfg, 0, 1, dev)
    scfg = ServeConfig(max_batch=64 if dev.type == "cuda" else 8, prompt_len=64, prefill_every=1)
    loop = ServingLoop(model, scfg)
    bare = loop.forward
    rec = StepRecorder()
    wrapped = instrument_forward(bare, rec, _label)
    # fill the batch, then decode only (equal work per step)
    while len(loop.running) < scfg.max_batch:
        loop.step()
    loop.running = [1 << 30] * scfg.max_batch
    scfg.prefill_every = 1 << 30
    for _ in range(10):
        loop.step()
    times = {"bare": [], "instrumented": []}
    for i in range(2 * a.steps):  # alternate every step: drift (clocks, power) hits both equally
        kind = "bare" if i % 2 == 0 else "instrumented"
        loop.forward = bare if kind == "bare" else wrapped
        t = time.perf_counter_ns()
        loop.step()
        times[kind].append(time.perf_counter_ns() - t)
    mb, mi = statistics.median(times["bare"]), statistics.median(times["instrumented"])
    # wrapper cost per call on an empty function
    noop = instrument_forward(lambda t, m, n: None, StepRecorder(), _label)
    x = torch.zeros(4)
    n = 20000
    for _ in range(n):  # warm up (first calls pay lazy initialisation)
        noop(x, "DECODE", 4)
    t = time.perf_counter_ns()
    for _ in range(n):
        noop(x, "DECODE", 4)
    wrap_ns = (time.perf_counter_ns() - t) / n
    t = time.perf_counter_ns()
    for _ in range(n):
        (lambda t_, m_, n_: None)(x, "DECODE", 4)
    wrap_ns -= (time.perf_counter_ns() - t) / n
    print(json.dumps({
        "device": str(dev), "moe_impl": a.moe_impl, "layers": a.layers, "batch": scfg.max_batch,
        "median_step_bare_ms": mb / 1e6, "median_step_instrumented_ms": mi / 1e6,
        "overhead_pct_median": 100 * (mi / mb - 1),
        "wrapper_cost_us_per_call": wrap_ns / 1e3,
        "wrapper_cost_pct_of_step": 100 * wrap_ns / mb,
        "steps_each": len(times["bare"]),
    }, indent=1))


if __name__ == "__main__":
    main()
