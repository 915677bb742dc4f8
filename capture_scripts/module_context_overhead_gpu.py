"""GPU overhead of tracekit.capture.module_context on a transformers MoE model (run on the H200).

    PYTHONPATH=. python capture_scripts/module_context_overhead_gpu.py [qwen3moe|olmoe] [eager|grouped_mm]

Builds the corpus model (random weights, 3 layers, bs=32, as devrun/corpus_capture.py), then times decode
steps with CUDA events and perf_counter: without hooks, with hooks (no profiler), and both again under
torch.profiler (CPU+CUDA). Prints the median step times and the overhead in % of the step; the
acceptance for turning module context on by default in `tracekit capture` is < 1 % of step time.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from tracekit.capture import module_context as mc

sys.path.insert(0, str(Path(__file__).resolve().parent))
from transformers_corpus_capture import FAMILIES as FAM  # noqa: E402  (the corpus models: one definition)


def main() -> int:
    fam = sys.argv[1] if len(sys.argv) > 1 else "qwen3moe"
    experts = sys.argv[2] if len(sys.argv) > 2 else "grouped_mm"
    mtype, kw = FAM[fam]
    cfg = AutoConfig.for_model(mtype, **kw)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, experts_implementation=experts,
                                             attn_implementation="sdpa").cuda().eval()
    ids = torch.randint(0, 32000, (32, 128), device="cuda")

    def steps(n: int) -> list[float]:
        out = model(ids, use_cache=True)
        past = out.past_key_values
        tok = out.logits[:, -1:].argmax(-1)
        ms = []
        for _ in range(n):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            out = model(tok, past_key_values=past, use_cache=True)
            b.record()
            torch.cuda.synchronize()
            past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
            ms.append(a.elapsed_time(b))
        return ms

    res: dict[tuple[str, bool], list[float]] = {}
    with torch.no_grad():
        steps(3)  # warm-up
        for _trial in range(3):  # interleaved, so drift hits both sides
            for hooked in (False, True):
                for mode in ("plain", "profiler"):
                    if hooked:
                        mc.install(model)
                    if mode == "profiler":
                        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
                        with torch.profiler.profile(activities=acts):
                            res.setdefault((mode, hooked), []).extend(steps(10))
                    else:
                        res.setdefault((mode, hooked), []).extend(steps(10))
                    if hooked:
                        mc.uninstall()
    for mode in ("plain", "profiler"):
        b, h = statistics.median(res[(mode, False)]), statistics.median(res[(mode, True)])
        print(f"{fam} {experts} {mode:8s}: decode step {b:.3f} ms -> {h:.3f} ms with module context ({100 * (h - b) / b:+.2f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
