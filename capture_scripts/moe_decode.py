"""A transformers MoE decode loop with random weights (Qwen3-MoE or OLMoE small config) on one GPU, bf16.

Each decode step is ``record_function("forward#i:decode:bs=N")``; the prefill is
``forward#0:prefill:bs=N:tokens=T``. The program keeps its own clock: it writes ``--report`` (JSON)
with the time from process start to the end of the warm-up, every decode step's duration
(``torch.cuda.synchronize`` at each step end, as a loop checking for EOS does) and the decode loop's
wall time. It runs the same work with or without ``tracekit capture``, so two runs compare.
"""

from __future__ import annotations

import argparse
import json
import os
import time

T_START = time.time()

import torch  # noqa: E402
from torch.profiler import record_function  # noqa: E402


def build(arch: str, layers: int, experts: int, hidden: int, device: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    if arch == "qwen3_moe":
        from transformers import Qwen3MoeConfig

        cfg = Qwen3MoeConfig(vocab_size=32000, hidden_size=hidden, intermediate_size=4 * hidden,
                             moe_intermediate_size=hidden // 2, num_hidden_layers=layers, num_attention_heads=16,
                             num_key_value_heads=4, head_dim=hidden // 16, num_experts=experts, num_experts_per_tok=8,
                             max_position_embeddings=8192, decoder_sparse_step=1, mlp_only_layers=[])
    else:
        from transformers import OlmoeConfig

        cfg = OlmoeConfig(vocab_size=32000, hidden_size=hidden, intermediate_size=hidden // 2, num_hidden_layers=layers,
                          num_attention_heads=16, num_key_value_heads=16, num_experts=experts, num_experts_per_tok=8,
                          max_position_embeddings=8192)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    return model.to(device=device, dtype=torch.bfloat16).eval()


def _stack_profiler(device: str) -> "torch.profiler.profile":
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    return profile(activities=acts, with_stack=True, with_modules=True, record_shapes=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", choices=["qwen3_moe", "olmoe"], default="qwen3_moe")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--bs", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--steps", type=int, default=600, help="decode steps after the warm-up")
    ap.add_argument("--report", default="moe_decode.json")
    ap.add_argument("--device", default="cuda", help="cuda (the acceptance run) or cpu (a smoke test)")
    ap.add_argument("--stack-trace", default=None,
                    help="write a with_stack=True twin (Kineto JSON, .gz ok) of --stack-steps decode steps right after the warm-up: "
                         "the ground truth of tests/corpus (tests/corpus/truth.py) for a capture of the same program")
    ap.add_argument("--stack-steps", type=int, default=5)
    a = ap.parse_args()
    model = build(a.arch, a.layers, a.experts, a.hidden, a.device)
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    ids = torch.randint(0, 32000, (a.bs, a.prompt), device=a.device)
    durs: list[int] = []
    with torch.inference_mode():
        with record_function(f"forward#0:prefill:bs={a.bs}:tokens={a.bs * a.prompt}"):
            out = model(input_ids=ids, use_cache=True)
        cache = out.past_key_values
        nxt = out.logits[:, -1:].argmax(-1)
        sync()
        t_warm = None
        t_loop = None
        prof = None
        for i in range(1, a.warmup + a.steps + 1):
            if i == a.warmup + 1:
                t_warm = time.time() - T_START
                t_loop = time.perf_counter()
                if a.stack_trace:
                    prof = _stack_profiler(a.device)
                    prof.__enter__()
            if prof is not None and i == a.warmup + 1 + a.stack_steps:
                prof.__exit__(None, None, None)
                prof.export_chrome_trace(a.stack_trace)
                prof = None
            t0 = time.perf_counter_ns()
            with record_function(f"forward#{i}:decode:bs={a.bs}"):
                out = model(input_ids=nxt, past_key_values=cache, use_cache=True)
                cache = out.past_key_values
                nxt = out.logits[:, -1:].argmax(-1)
            sync()
            if i > a.warmup:
                durs.append(time.perf_counter_ns() - t0)
        loop_s = time.perf_counter() - (t_loop or time.perf_counter())
    rep = {"arch": a.arch, "layers": a.layers, "experts": a.experts, "hidden": a.hidden, "bs": a.bs,
           "warmup_steps": a.warmup, "warmup_end_s": t_warm, "decode_steps": len(durs), "decode_loop_s": loop_s,
           "step_ns": durs, "device": torch.cuda.get_device_name() if a.device == "cuda" else "cpu", "torch": torch.__version__,
           "traced": bool(os.environ.get("TRACEKIT_CAPTURE_DIR")),
           "stack_trace": {"path": a.stack_trace, "first_step": a.warmup + 1, "steps": a.stack_steps} if a.stack_trace else None}
    with open(a.report, "w") as f:
        json.dump(rep, f)
    durs_sorted = sorted(durs)
    print(f"moe_decode: warm-up ended at {t_warm:.1f} s; {len(durs)} decode steps in {loop_s:.2f} s "
          f"(median {durs_sorted[len(durs) // 2] / 1e6:.2f} ms)", flush=True)


if __name__ == "__main__":
    main()
