#!/usr/bin/env python3
"""A program of four phases of known length, profiled, with its own phase clock as ground truth.

Phases, repeated ``--cycles`` times, each ``--phase-s`` long on the program's clock:

``gemm``   big matmuls (bf16 8192² on a GPU, fp32 512² on CPU): the device is busy;
``sleep``  ``time.sleep``: the host is idle, the device has nothing queued;
``copy``   PCIe copies: pinned host → device and back, 256 MiB each (CPU: 64 MiB tensor copies);
``tiny``   tiny kernels (``x.add_(1)``) with a ``.item()`` every 50: launch-bound, with host syncs.

Each phase runs inside ``record_function("known_phase.<name>")`` so the trace carries its range, and
the truth file records ``time.time_ns()`` (CLOCK_REALTIME, the clock Kineto timestamps follow) at
each phase's start and end, after the device drained. What an analysis should find per phase:
``sleep`` → host idle (never launch-bound); ``tiny`` → launch-bound + host sync; ``gemm``/``copy``
→ busy. Runs on torch CPU too (no GPU: phases degrade to host operators), which is the CI test.

Writes ``<out>/known_phases_trace.json`` (torch profiler / Kineto JSON) and
``<out>/known_phases_truth.json``; ``--out`` defaults to ``$OUT`` or the current directory.
On an H200 the default run (2 cycles × 4 phases × 1 s) takes well under 3 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "."), help="output directory (default: $OUT or .)")
    p.add_argument("--phase-s", type=float, default=1.0, help="length of each phase in seconds (default 1.0)")
    p.add_argument("--cycles", type=int, default=2, help="how many times the four phases repeat (default 2)")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    p.add_argument("--tiny-max-iters", type=int, default=40_000, help="cap on tiny kernels per phase (trace size)")
    p.add_argument("--item-every", type=int, default=50, help="a .item() after every N tiny kernels (default 50)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = _args(argv)
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    dev = ("cuda" if torch.cuda.is_available() else "cpu") if a.device == "auto" else a.device
    gpu = dev == "cuda"
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)

    def drain() -> None:
        if gpu:
            torch.cuda.synchronize()

    n = 8192 if gpu else 512
    dt = torch.bfloat16 if gpu else torch.float32
    ga = torch.randn(n, n, device=dev, dtype=dt)
    gb = torch.randn(n, n, device=dev, dtype=dt)
    copy_elems = (256 if gpu else 64) * 2**20 // 4
    host = torch.empty(copy_elems, dtype=torch.float32, pin_memory=gpu)
    host2 = torch.empty_like(host, pin_memory=gpu)
    devbuf = torch.empty(copy_elems, dtype=torch.float32, device=dev)
    tiny = torch.zeros(1024, device=dev)
    # warm-up outside the profile: cuBLAS handles, allocator, first-launch costs
    for _ in range(3):
        (ga @ gb).sum()
        devbuf.copy_(host, non_blocking=True)
        tiny.add_(1.0)
    drain()

    def run_gemm(stop: float) -> dict[str, int]:
        i = 0
        while time.perf_counter() < stop:
            torch.matmul(ga, gb)
            i += 1
            if gpu and i % 8 == 0:  # keep the host at most 8 GEMMs ahead, so the phase ends on time
                torch.cuda.synchronize()
        return {"iters": i}

    def run_copy(stop: float) -> dict[str, int]:
        i = 0
        while time.perf_counter() < stop:
            devbuf.copy_(host, non_blocking=gpu)  # H2D
            host2.copy_(devbuf, non_blocking=gpu)  # D2H
            drain()
            i += 1
        return {"iters": i, "bytes": 2 * i * copy_elems * 4}

    def run_tiny(stop: float) -> dict[str, int]:
        i = items = 0
        while time.perf_counter() < stop and i < a.tiny_max_iters:
            tiny.add_(1.0)
            i += 1
            if i % a.item_every == 0:
                tiny[0].item()  # a host sync (cudaMemcpy D2H + stream sync on a GPU)
                items += 1
        return {"iters": i, "items": items}

    def run_sleep(stop: float) -> dict[str, int]:
        time.sleep(max(0.0, stop - time.perf_counter()))
        return {}

    # sleep between two device phases, so it lies inside the device-op window of the trace
    phases = [("gemm", run_gemm), ("sleep", run_sleep), ("copy", run_copy), ("tiny", run_tiny)]
    truth: list[dict[str, object]] = []
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    with profile(activities=acts) as prof:
        for c in range(a.cycles):
            for name, fn in phases:
                with record_function(f"known_phase.{name}"):
                    t0, p0 = time.time_ns(), time.perf_counter()
                    info = fn(p0 + a.phase_s)
                    drain()
                    t1 = time.time_ns()
                truth.append({"cycle": c, "name": name, "start_ns": t0, "end_ns": t1, "dur_ns": t1 - t0, **info})
    trace = out / "known_phases_trace.json"
    tmp = trace.with_suffix(".json.tmp")
    prof.export_chrome_trace(str(tmp))
    os.replace(tmp, trace)
    doc = {
        "program": "capture_scripts/known_phases.py",
        "clock": "time.time_ns (CLOCK_REALTIME), taken after the device drained",
        "device": torch.cuda.get_device_name(0) if gpu else "cpu",
        "device_mode": "gpu" if gpu else "cpu",
        "torch": torch.__version__,
        "phase_s": a.phase_s,
        "cycles": a.cycles,
        "item_every": a.item_every,
        "expect": {"sleep": "host_idle", "tiny": "launch_bound+host_sync", "gemm": "busy", "copy": "busy"},
        "phases": truth,
        "trace": trace.name,
    }
    tj = out / "known_phases_truth.json"
    tmpj = tj.with_suffix(".json.tmp")
    tmpj.write_text(json.dumps(doc, indent=1))
    os.replace(tmpj, tj)
    tot = {n: sum(int(p["dur_ns"]) for p in truth if p["name"] == n) / 1e9 for n, _ in phases}  # type: ignore[call-overload]
    print(f"known_phases: {dev} ({doc['device']}), {a.cycles} cycle(s); phase seconds: "
          + ", ".join(f"{k} {v:.3f}" for k, v in tot.items()) + f"; wrote {trace} and {tj}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
