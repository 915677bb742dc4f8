"""Large real Kineto traces for the speed benchmarks (issue 28): a transformers MoE decode loop
(``moe_decode.build``: Qwen3-MoE widths, random weights, bf16) profiled with a plain torch.profiler
(CPU + CUDA, no stacks, as users run it) for ``--seconds`` of decode, exported with
``export_chrome_trace``. Eager experts give ~85 % cpu_op/cuda_runtime events, as real traces do.

    python3 capture_scripts/big_kineto.py OUT.json --experts-impl eager --seconds 30
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402

from moe_decode import build  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--experts-impl", default="eager", choices=["eager", "grouped_mm", "batched_mm"])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--max-steps", type=int, default=100000)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--bs", type=int, default=16)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    model = build("qwen3_moe", a.layers, 64, 1024, a.device)
    if hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation(a.experts_impl)
    else:
        model.config._experts_implementation = a.experts_impl
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    ids = torch.randint(0, 32000, (a.bs, 128), device=a.device)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if a.device == "cuda" else [])
    step_ns = []
    with torch.inference_mode():
        out = model(input_ids=ids, use_cache=True)
        cache, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
        for _ in range(5):
            out = model(input_ids=nxt, past_key_values=cache, use_cache=True)
            nxt = out.logits[:, -1:].argmax(-1)
        sync()
        t_end = time.perf_counter() + a.seconds
        with profile(activities=acts) as prof:
            i = 0
            while time.perf_counter() < t_end and i < a.max_steps:
                i += 1
                t0 = time.perf_counter_ns()
                with record_function(f"forward#{i}:decode:bs={a.bs}"):
                    out = model(input_ids=nxt, past_key_values=cache, use_cache=True)
                    nxt = out.logits[:, -1:].argmax(-1)
                sync()
                step_ns.append(time.perf_counter_ns() - t0)
    prof.export_chrome_trace(a.out)
    meta = {"experts_impl": a.experts_impl, "steps": len(step_ns), "step_ns": step_ns, "bytes": os.path.getsize(a.out),
            "torch": torch.__version__}
    with open(a.out + ".meta.json", "w") as f:
        json.dump(meta, f)
    print(f"{a.out}: {len(step_ns)} steps, {os.path.getsize(a.out) / 1e6:.1f} MB", flush=True)


if __name__ == "__main__":
    main()
