#!/usr/bin/env python3
"""What-if truth pairs on one GPU (issue 26): the same decode program with one thing changed.

Needs torch (CUDA) and transformers 5.x only (no polars, no tracekit analysis): run it on the GPU box,
convert the raw outputs anywhere with ``tests/replay/truth/make_truth.py``.

    python3 capture_scripts/whatif_pairs.py OUTDIR [--groups a,b] [--device cuda|cpu] [--tiny] [--deadline-s 300]

Every case (``CASES``) is one program: a model with random weights (bf16 on CUDA), a fixed batch of
sequences decoding one token per step. Each decode step runs inside
``record_function("forward#<i>:decode:bs=<N>")`` (the step-label grammar tracekit reads); the step ends
with ``torch.cuda.synchronize()`` (a loop checking for EOS reads the tokens back) after the range closes.
Cases run in groups (``GROUPS``: a baseline and its variants), all of a group's models resident at once:

1. a warm-up block per case (unrecorded in the results; it decodes every cache position the blocks reach, so
   per-shape kernel plans, e.g. cuDNN SDPA's, are built before any timed step);
2. ``--rounds`` unprofiled blocks ``u1``… per case on the program's own clock, interleaved across the group's
   cases (order reversed every other round) so slow host drift hits a baseline and its variant alike;
3. after the first half of the rounds (``--profile-at end``: after all of them), one profiled block per case under
   ``torch.profiler`` (CPU + CUDA, CUDA sync events; ``record_shapes`` where the case says so), exported as
   ``<case>.trace.json.gz``, then one unrecorded ``settle`` block per case (the first steps after a profiler window
   ran up to 2x slow in a first run; on one H100 every later eager step ran 35 % slower, hence ``end``).

The process is pinned to ``--cores`` and Python's garbage collector is off inside the blocks. Each block is a
fresh decode session (HF: prefill of ``--prompt`` tokens, untimed, then the steps), so every block decodes the
same cache positions. For every step the clock records ``wall_ns`` (CLOCK_REALTIME at the step start, as
Kineto), ``host_ns`` (step start → end of the labelled range: the host has launched the step) and ``step_ns``
(step start → after the synchronize). ``<case>.json`` holds them per block plus the case's config and versions.
Same-run noise: the spread of a case's unprofiled block medians (``tests/replay/truth/make_truth.py``).

Models: ``hf`` cases are transformers ``AutoModelForCausalLM.from_config`` models (DeepSeek-V3 widths with
256 experts and 3 layers, Llama-3-70B widths with 8 layers, Qwen3-235B widths with 256 experts, Qwen3-30B and
OLMoE widths) with ``experts_implementation`` eager (per-expert loop, host syncs per expert), grouped_mm or
batched_mm; ``tk`` cases are tracekit's built-in TP-MoE decoder (:mod:`tracekit.workloads.moe`, one GPU):
``loop`` (per-expert loop, one ``.tolist()`` sync per layer), ``grouped`` (``torch._grouped_mm``, no sync),
``grouped`` + ``host_sync`` (one ``.item()`` per layer) and ``grouped`` replayed from a CUDA graph.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import os
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

T0 = time.time()

QWEN3W = dict(vocab_size=32000, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_hidden_layers=4,
              num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
              decoder_sparse_step=1, max_position_embeddings=4096, mlp_only_layers=[])
#: Qwen3-235B-A22B widths (hidden 4096, expert 1536) with 256 experts: the expert GEMMs weigh as much as the host
QWEN3BIG = dict(QWEN3W, hidden_size=4096, intermediate_size=12288, moe_intermediate_size=1536, num_attention_heads=64,
                num_experts=256)
#: DeepSeek-V3 widths (hidden 7168, 256 experts of 2048, top-8, MLA), 3 layers (the first dense)
DSV3F = dict(vocab_size=32000, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048, num_hidden_layers=3,
             first_k_dense_replace=1, num_attention_heads=64, num_key_value_heads=64, n_routed_experts=256,
             num_experts_per_tok=8, n_shared_experts=1, kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64,
             qk_nope_head_dim=128, v_head_dim=128, n_group=1, topk_group=1, max_position_embeddings=4096)
#: Llama-3-70B widths (dense), 8 layers
LLAMA70W = dict(vocab_size=32000, hidden_size=8192, intermediate_size=28672, num_hidden_layers=8, num_attention_heads=64,
                num_key_value_heads=8, max_position_embeddings=4096)
OLMOEW = dict(vocab_size=32000, hidden_size=2048, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=16,
              num_key_value_heads=16, num_experts=64, num_experts_per_tok=8, max_position_embeddings=4096)
TKW = dict(hidden=2048, n_layers=4, n_heads=16, head_dim=128, n_experts=128, top_k=8, moe_intermediate=768,
           shared_intermediate=768, vocab=32000, kv_context=512)


def _hf(model: str, cfg: dict[str, Any], experts: str | None = None, **kw: Any) -> dict[str, Any]:
    return dict(kind="hf", model=model, cfg=cfg, experts=experts, **kw)


#: name -> case: a model (``kind``, ``model``, ``cfg``, ``experts`` / tk ``cfg``, ``graph``), a batch size, profiled steps,
#: whether to record shapes. Cases of one group run together: built once (cases with the same model share it), their
#: unprofiled blocks interleaved (A B A B ...), so slow drift of the host hits both members of a pair alike.
CASES: dict[str, dict[str, Any]] = {
    "dsv3f": _hf("deepseek_v3", DSV3F, "grouped_mm", bs=32, prof_steps=6),
    "dsv3f_halfw": _hf("deepseek_v3", dict(DSV3F, moe_intermediate_size=1024), "grouped_mm", bs=32, prof_steps=6),
    "dsv3f_bs64": _hf("deepseek_v3", DSV3F, "grouped_mm", bs=64, prof_steps=6),
    "llama70w": _hf("llama", LLAMA70W, bs=32, prof_steps=6),
    "llama70w_halfw": _hf("llama", dict(LLAMA70W, intermediate_size=14336), bs=32, prof_steps=6),
    "llama70w_bs128": _hf("llama", LLAMA70W, bs=128, prof_steps=6),
    "qwen3big": _hf("qwen3_moe", QWEN3BIG, "grouped_mm", bs=64, prof_steps=6),
    "qwen3big_halfw": _hf("qwen3_moe", dict(QWEN3BIG, moe_intermediate_size=768), "grouped_mm", bs=64, prof_steps=6),
    "qwen3big_bs128": _hf("qwen3_moe", QWEN3BIG, "grouped_mm", bs=128, prof_steps=6),
    # built-in decoder: loop -> grouped, host sync removed, CUDA graphs
    "tk_loop": dict(kind="tk", cfg=dict(TKW, moe_impl="loop"), bs=32, prof_steps=3, shapes=True),
    "tk_grouped": dict(kind="tk", cfg=dict(TKW, moe_impl="grouped"), bs=32, prof_steps=6),
    "tk_grouped_sync": dict(kind="tk", cfg=dict(TKW, moe_impl="grouped", host_sync=True), bs=32, prof_steps=6),
    "tk_grouped_graph": dict(kind="tk", cfg=dict(TKW, moe_impl="grouped"), bs=32, prof_steps=6, graph=True),
    # experts implementation: per-expert loop (host syncs per expert) vs grouped_mm vs batched_mm
    "qwen3w_grouped": _hf("qwen3_moe", QWEN3W, "grouped_mm", bs=16, prof_steps=6, shapes=True),
    "qwen3w_eager": _hf("qwen3_moe", QWEN3W, "eager", bs=16, prof_steps=3, shapes=True, block=8),
    "qwen3w_batched": _hf("qwen3_moe", QWEN3W, "batched_mm", bs=16, prof_steps=6),
    "olmoew_grouped": _hf("olmoe", OLMOEW, "grouped_mm", bs=16, prof_steps=6, shapes=True),
    "olmoew_eager": _hf("olmoe", OLMOEW, "eager", bs=16, prof_steps=3, shapes=True, block=8),
    # the knob pairs with each decode step replayed from one CUDA graph (static KV cache): the host is out of the
    # step, so the pair's measured ratio repeats where the eager pairs' host drift (10-50 % between blocks) hid it
    # (DeepSeek-V3's MLA attention fails over transformers' StaticCache: value and key head sizes differ)
    "qwen3big_g": _hf("qwen3_moe", QWEN3BIG, "grouped_mm", bs=64, prof_steps=6, graph=True),
    "qwen3big_halfw_g": _hf("qwen3_moe", dict(QWEN3BIG, moe_intermediate_size=768), "grouped_mm", bs=64, prof_steps=6,
                            graph=True),
    "qwen3big_bs128_g": _hf("qwen3_moe", QWEN3BIG, "grouped_mm", bs=128, prof_steps=6, graph=True),
    "llama70w_g": _hf("llama", LLAMA70W, bs=32, prof_steps=6, graph=True),
    "llama70w_halfw_g": _hf("llama", dict(LLAMA70W, intermediate_size=14336), bs=32, prof_steps=6, graph=True),
    "llama70w_bs128_g": _hf("llama", LLAMA70W, bs=128, prof_steps=6, graph=True),
    "olmoew_g": _hf("olmoe", OLMOEW, "grouped_mm", bs=16, prof_steps=6, graph=True),
    "olmoew_halfw_g": _hf("olmoe", dict(OLMOEW, intermediate_size=512), "grouped_mm", bs=16, prof_steps=6, graph=True),
}
#: run order (priority: the run starts no group after --deadline-s)
GROUPS: dict[str, list[str]] = {
    "dsv3f": ["dsv3f", "dsv3f_halfw", "dsv3f_bs64"],
    "llama70w": ["llama70w", "llama70w_halfw", "llama70w_bs128"],
    "qwen3big": ["qwen3big", "qwen3big_halfw", "qwen3big_bs128"],
    "tk": ["tk_loop", "tk_grouped", "tk_grouped_sync", "tk_grouped_graph"],
    "qwen3w": ["qwen3w_grouped", "qwen3w_eager", "qwen3w_batched"],
    "olmoew": ["olmoew_grouped", "olmoew_eager"],
    "qwen3w_pair": ["qwen3w_grouped", "qwen3w_eager"],  # without batched_mm (its gathered weights: 24 GiB more)
    "qwen3big_g": ["qwen3big_g", "qwen3big_halfw_g", "qwen3big_bs128_g"],
    "llama70w_g": ["llama70w_g", "llama70w_halfw_g", "llama70w_bs128_g"],
    "olmoew_g": ["olmoew_g", "olmoew_halfw_g"],
}

TINY_HF = dict(vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8, n_routed_experts=8,
               num_experts_per_tok=2, kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=8,
               v_head_dim=16, first_k_dense_replace=1)
TINY_TK = dict(hidden=64, n_layers=2, n_heads=4, head_dim=16, n_experts=8, top_k=2, moe_intermediate=32,
               shared_intermediate=32, vocab=512, kv_context=16, dtype="float32")


class Clock:
    """The program's own step clock: one record per decode step."""

    def __init__(self, sync: Callable[[], None]) -> None:
        self.sync = sync
        self.blocks: dict[str, list[dict[str, int]]] = {}
        self.fwd = 0  # global forward counter (step labels stay unique across blocks)

    def step(self, block: str, bs: int, fn: Callable[[], Any]) -> Any:
        from torch.profiler import record_function

        self.fwd += 1
        wall = time.time_ns()
        p0 = time.perf_counter_ns()
        with record_function(f"forward#{self.fwd}:decode:bs={bs}"):
            out = fn()
        p1 = time.perf_counter_ns()
        self.sync()
        p2 = time.perf_counter_ns()
        self.blocks.setdefault(block, []).append({"fwd": self.fwd, "wall_ns": wall, "host_ns": p1 - p0, "step_ns": p2 - p0})
        return out


def _profiler(cuda: bool, shapes: bool) -> Any:
    import torch
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    kw: dict[str, Any] = {}
    if cuda:
        try:
            kw["experimental_config"] = torch.profiler._ExperimentalConfig(enable_cuda_sync_events=True)
        except (AttributeError, TypeError):
            pass
    return profile(activities=acts, record_shapes=shapes, **kw)


def _hf_model(case: dict[str, Any], dev: str, tiny: bool) -> Any:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    kw = dict(case["cfg"])
    if tiny:
        kw.update({k: v for k, v in TINY_HF.items() if k in kw})
    cfg = AutoConfig.for_model(case["model"], **kw)
    extra = {"experts_implementation": case["experts"]} if case.get("experts") else {}
    dtype = torch.float32 if dev == "cpu" else torch.bfloat16
    torch.manual_seed(0)
    with torch.device(dev):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation="sdpa", **extra)
    with torch.no_grad():
        for p in model.parameters():
            if not torch.isfinite(p).all() or p.abs().max() == 0:
                p.normal_(0, 0.02)
    return model.eval()


Session = Callable[[Clock, str, int, Any], None]


def prepare_hf(case: dict[str, Any], models: dict[str, Any], dev: str, a: argparse.Namespace) -> Session:
    """A decode-session runner for an ``hf`` case (the model is shared by cases with the same model)."""
    import torch
    from transformers import DynamicCache

    key = json.dumps([case["model"], case["cfg"], case.get("experts")], sort_keys=True)
    if key not in models:
        models[key] = _hf_model(case, dev, a.tiny)
    model = models[key]
    bs = case["bs"]
    ids = torch.randint(0, model.config.vocab_size, (bs, a.prompt), device=dev)
    if case.get("graph"):
        return _hf_graph_session(model, ids, dev, a)

    def session(clock: Clock, block: str, n: int, prof: Any = None) -> None:
        cache = DynamicCache(config=model.config)
        with torch.inference_mode():
            out = model(input_ids=ids, past_key_values=cache, use_cache=True)  # prefill: untimed, unprofiled
            nxt = out.logits[:, -1:].argmax(-1)
            clock.sync()
            if prof is not None:
                prof.__enter__()
            for _ in range(n):
                def f(x: Any = nxt) -> Any:
                    o = model(input_ids=x, past_key_values=cache, use_cache=True)
                    return o.logits[:, -1:].argmax(-1)
                nxt = clock.step(block, bs, f)
            if prof is not None:
                prof.__exit__(None, None, None)

    return session


def _hf_graph_session(model: Any, ids: Any, dev: str, a: argparse.Namespace) -> Session:
    """A decode-session runner whose steps replay one CUDA graph of a decode step over a static KV cache.

    Each session resets the cache and prefills it eagerly (untimed); a step then copies the last token and its cache
    position into the graph's static inputs and replays the graph (on the CPU, ``--tiny``: the same step, eager)."""
    import torch
    from transformers import StaticCache

    bs, prompt = ids.shape
    steps_max = max(a.unprof, *(int(c.get("block", 0)) for c in CASES.values())) + 8
    cache = StaticCache(config=model.config, max_cache_len=prompt + steps_max)
    static_ids = torch.zeros((bs, 1), dtype=torch.long, device=dev)
    static_pos = torch.zeros((1,), dtype=torch.long, device=dev)
    positions = torch.arange(prompt, prompt + steps_max, device=dev)
    prefill_pos = torch.arange(prompt, device=dev)

    def step_eager() -> Any:
        o = model(input_ids=static_ids, past_key_values=cache, cache_position=static_pos, use_cache=True)
        return o.logits[:, -1:].argmax(-1)

    def prefill() -> None:
        cache.reset()
        out = model(input_ids=ids, past_key_values=cache, cache_position=prefill_pos, use_cache=True)
        static_ids.copy_(out.logits[:, -1:].argmax(-1))

    graph = None
    with torch.inference_mode():
        prefill()
        static_pos.copy_(positions[:1])
        if dev == "cuda":
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3):
                    step_eager()
            torch.cuda.current_stream().wait_stream(s)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_out = step_eager()
            torch.cuda.synchronize()

    def f(i: int) -> Any:
        static_pos.copy_(positions[i:i + 1])
        if graph is None:
            out = step_eager()
        else:
            graph.replay()
            out = static_out
        static_ids.copy_(out)
        return out

    def session(clock: Clock, block: str, n: int, prof: Any = None) -> None:
        with torch.inference_mode():
            prefill()  # untimed, unprofiled
            clock.sync()
            if prof is not None:
                prof.__enter__()
            for i in range(n):
                clock.step(block, bs, lambda i=i: f(i))
            if prof is not None:
                prof.__exit__(None, None, None)

    return session


def prepare_tk(case: dict[str, Any], models: dict[str, Any], dev: str, a: argparse.Namespace) -> Session:
    """A decode-step runner for a ``tk`` case (tracekit's built-in decoder, one GPU; eager or one CUDA graph)."""
    import torch

    from tracekit.workloads.moe import MoEConfig, TPMoEModel

    kw = dict(case["cfg"])
    if a.tiny:
        kw.update(TINY_TK)
    cfg = MoEConfig(**kw)
    model = TPMoEModel(cfg, rank=0, world=1, device=torch.device(dev))
    bs = case["bs"]
    state = {"tokens": torch.randint(0, cfg.vocab, (bs,), device=dev)}
    graph = None
    if case.get("graph"):
        static_in = state["tokens"].clone()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                model(static_in, "DECODE", bs)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = model(static_in, "DECODE", bs)
        torch.cuda.synchronize()

    def f() -> Any:
        if graph is None:
            return model(state["tokens"], "DECODE", bs)
        static_in.copy_(state["tokens"])
        graph.replay()
        return static_out

    def session(clock: Clock, block: str, n: int, prof: Any = None) -> None:
        if prof is not None:
            prof.__enter__()
        for _ in range(n):
            out = clock.step(block, bs, f)
            state["tokens"] = out.clone() if graph is not None else out
        if prof is not None:
            prof.__exit__(None, None, None)

    session.use_grouped_mm = bool(model.use_grouped_mm)  # type: ignore[attr-defined]
    return session


def _export(prof: Any, trace: Path) -> float:
    t = time.time()
    raw = trace.with_suffix("")  # .json
    prof.export_chrome_trace(str(raw))
    with open(raw, "rb") as f, gzip.open(trace, "wb", compresslevel=6) as g:
        shutil.copyfileobj(f, g)
    os.remove(raw)
    return time.time() - t


def run_group(names: list[str], out: Path, a: argparse.Namespace) -> None:
    """Build the group's models, warm every case up, then ``--rounds`` unprofiled blocks per case, interleaved
    (the order reversed every other round), with each case's profiled block after the first half of the rounds."""
    import torch

    dev = a.device
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    models: dict[str, Any] = {}
    t0 = time.time()
    prep = {n: (prepare_hf if CASES[n]["kind"] == "hf" else prepare_tk)(CASES[n], models, dev, a) for n in names}
    build_s = time.time() - t0
    clocks = {n: Clock(sync) for n in names}
    info: dict[str, dict[str, Any]] = {n: {"build_s": build_s} for n in names}

    def steps(n: str) -> int:
        return int(CASES[n].get("block", a.unprof)) if not a.tiny else 2

    gc.collect()
    gc.disable()  # no collector pauses inside the timed blocks
    try:
        for n in names:  # the warm-up decodes every cache position the blocks reach (kernel plans per shape)
            prep[n](clocks[n], "warmup", steps(n), None)
        def profiled() -> None:
            for n in names:
                prof = _profiler(dev == "cuda", bool(CASES[n].get("shapes")))
                k = min(int(CASES[n]["prof_steps"]), steps(n))
                prep[n](clocks[n], "profiled", k, prof)
                gc.enable()
                info[n]["export_s"] = _export(prof, out / f"{n}.trace.json.gz")
                gc.collect()
                gc.disable()

        for r in range(a.rounds):
            if a.profile_at == "middle" and r == a.rounds // 2:
                profiled()
                for n in names:  # steps right after a profiler window run slow (seen: 2x for ~6 steps): settle first
                    prep[n](clocks[n], "settle", steps(n), None)
            for n in (names if r % 2 == 0 else names[::-1]):
                prep[n](clocks[n], f"u{r + 1}", steps(n), None)
        if a.profile_at == "end":
            profiled()
    finally:
        gc.enable()
    import transformers

    for n in names:
        trace = out / f"{n}.trace.json.gz"
        rec = {"case": n, "group": names, **CASES[n], "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
               "torch": torch.__version__, "transformers": transformers.__version__, "prompt": a.prompt, "tiny": a.tiny,
               "rounds": a.rounds, "affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
               "use_grouped_mm": getattr(prep[n], "use_grouped_mm", None), "blocks": clocks[n].blocks,
               "trace_bytes": trace.stat().st_size, **info[n]}
        tmp = out / f"{n}.json.tmp"
        tmp.write_text(json.dumps(rec, indent=1, default=str))
        tmp.replace(out / f"{n}.json")
        med = {b: sorted(x["step_ns"] for x in v)[len(v) // 2] / 1e6 for b, v in clocks[n].blocks.items()}
        print(f"[{time.time() - T0:6.1f}s] {n}: " + ", ".join(f"{b} {m:.3f}" for b, m in med.items())
              + f" ms (trace {rec['trace_bytes'] / 1e6:.2f} MB)", flush=True)
    models.clear()
    prep.clear()


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--groups", default=",".join(GROUPS))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (a CPU smoke test of this script)")
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--unprof", type=int, default=16, help="decode steps per unprofiled block")
    ap.add_argument("--rounds", type=int, default=4, help="unprofiled blocks per case")
    ap.add_argument("--profile-at", choices=("middle", "end"), default="middle",
                    help="the profiled blocks after the first half of the rounds, or after all of them (a process can "
                         "run slower after a profiler window: one H100 ran eager steps 35%% slower for the rest of the run)")
    ap.add_argument("--cores", default="2-5", help="pin the process to these cores ('' = no pinning)")
    ap.add_argument("--deadline-s", type=float, default=300.0, help="start no group after this many seconds")
    a = ap.parse_args()
    a.outdir.mkdir(parents=True, exist_ok=True)
    if a.cores and hasattr(os, "sched_setaffinity"):
        lo, _, hi = a.cores.partition("-")
        want = set(range(int(lo), int(hi or lo) + 1)) & os.sched_getaffinity(0)
        if want:
            os.sched_setaffinity(0, want)
    for g in [x for x in a.groups.split(",") if x]:
        names = [n for n in GROUPS[g] if not (a.outdir / f"{n}.json").exists()]
        if not names:
            continue  # done by an earlier (crashed) run
        if time.time() - T0 > a.deadline_s:
            print(f"deadline: skipping group {g}", flush=True)
            continue
        try:
            run_group(names, a.outdir, a)
        except Exception as e:  # noqa: BLE001 - one failed group must not lose the others
            print(f"[{time.time() - T0:6.1f}s] {g}: FAILED {type(e).__name__}: {e}", flush=True)
            (a.outdir / f"{g}.failed.txt").write_text(traceback.format_exc())
        gc.collect()
        if a.device == "cuda":
            import torch

            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
