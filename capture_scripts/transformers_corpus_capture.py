"""Made the GPU corpus in tests/corpus (run on 1x H200: ``python3 capture_scripts/transformers_corpus_capture.py [RUN ...]``).

transformers models with random weights (bf16), profiled the way users do it (``torch.profiler`` +
``export_chrome_trace``, each step in ``record_function("forward#i:prefill:bs=B:tokens=T")`` /
``("forward#i:decode:bs=B")``), the program's own step clock (CUDA events + host ``perf_counter``) and, in
the same process right after, a ``with_stack=True, with_modules=True, record_shapes=True`` twin (the ground
truth by ``nn.Module``, ``tests/corpus/truth.py``).

One process per run (``os.fork`` after importing torch and transformers, before CUDA starts: each run gets a
fresh CUDA context without paying the imports again); runs go one after the other, never two on the GPU at
once (concurrent kernels would distort the kernel-time shares). While the next run profiles, a helper process
makes the previous run's outputs small (:func:`post`): the plain trace cut to its first ``keep`` steps, the
twin stripped of the ``python_function`` events that are not ``nn.Module`` ranges (truth reads only those) and
cut likewise; both gzip-compressed. Everything lands in ``$RAW`` (default /tmp/corpus) and is packed into at
most 7 ``corpus_N.tar`` archives under ``$OUT`` (the device's return limits).

``--device cpu --tiny`` runs the same program on the CPU with every width divided down (a check of the
script, not a corpus trace).
"""
import argparse
import gzip
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time

OUT = os.environ.get("OUT", "/tmp/out")
RAW = os.environ.get("RAW", os.path.join("/tmp", "corpus"))

FAMILIES = {
    "glm5": ("glm_moe_dsa", dict(vocab_size=32000, hidden_size=1024, intermediate_size=2048, moe_intermediate_size=128,
                                 num_hidden_layers=3, first_k_dense_replace=1, num_attention_heads=16, num_key_value_heads=16,
                                 n_routed_experts=256, num_experts_per_tok=8, n_shared_experts=1, kv_lora_rank=128,
                                 q_lora_rank=256, qk_rope_head_dim=32, qk_nope_head_dim=64, v_head_dim=64, index_topk=256,
                                 index_head_dim=64, index_n_heads=8, max_position_embeddings=4096)),
    "qwen3moe": ("qwen3_moe", dict(vocab_size=32000, hidden_size=1024, intermediate_size=2048, moe_intermediate_size=256,
                                   num_hidden_layers=3, num_attention_heads=16, num_key_value_heads=4, head_dim=64,
                                   num_experts=64, num_experts_per_tok=8, decoder_sparse_step=1, max_position_embeddings=4096)),
    "olmoe": ("olmoe", dict(vocab_size=32000, hidden_size=1024, intermediate_size=256, num_hidden_layers=3,
                            num_attention_heads=16, num_key_value_heads=16, num_experts=64, num_experts_per_tok=8,
                            max_position_embeddings=4096)),
    "mixtral": ("mixtral", dict(vocab_size=32000, hidden_size=1024, intermediate_size=1024, num_hidden_layers=3,
                                num_attention_heads=16, num_key_value_heads=4, num_local_experts=8, num_experts_per_tok=2,
                                max_position_embeddings=4096)),
    # --- families added for issue 25 (real widths of the released models; 3 layers; vocab 32000) ---
    # gpt-oss-120b: 128 experts top-4, experts with biases, interleaved gate_up, clamped SwiGLU; attention with sinks,
    # sliding window on alternate layers (window 64 here so that the 128-token prefill is windowed)
    "gptoss": ("gpt_oss", dict(vocab_size=32000, hidden_size=2880, intermediate_size=2880, num_hidden_layers=3,
                               num_attention_heads=64, num_key_value_heads=8, head_dim=64, num_local_experts=128,
                               num_experts_per_tok=4, sliding_window=64, max_position_embeddings=4096,
                               layer_types=["sliding_attention", "full_attention", "sliding_attention"])),
    # DeepSeek-V3: MLA, 256 routed experts top-8 with grouped top-k (8 groups, 4 kept), 1 shared expert, first layer dense
    "dsv3": ("deepseek_v3", dict(vocab_size=32000, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
                                 num_hidden_layers=3, first_k_dense_replace=1, num_attention_heads=128, num_key_value_heads=128,
                                 n_routed_experts=256, num_experts_per_tok=8, n_group=8, topk_group=4, n_shared_experts=1,
                                 kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
                                 max_position_embeddings=4096)),
    # Qwen1.5-MoE-A2.7B: 60 experts top-4, a shared expert run *before* the router, with a sigmoid gate
    "qwen2moe": ("qwen2_moe", dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, moe_intermediate_size=1408,
                                   shared_expert_intermediate_size=5632, num_hidden_layers=3, num_attention_heads=16,
                                   num_key_value_heads=16, num_experts=60, num_experts_per_tok=4, max_position_embeddings=4096)),
    # granite-3.0-3b-a800m widths with a shared expert: router = linear -> top-k -> softmax (top-k first)
    "granitemoe": ("granitemoeshared", dict(vocab_size=32000, hidden_size=1536, intermediate_size=512, shared_intermediate_size=1024,
                                            num_hidden_layers=3, num_attention_heads=24, num_key_value_heads=8,
                                            num_local_experts=40, num_experts_per_tok=8, max_position_embeddings=4096)),
    # DBRX: 16 experts top-4, its own expert loop (x.matmul(w.T), no experts_implementation), LayerNorm, clip_qkv
    "dbrx": ("dbrx", dict(vocab_size=32000, d_model=6144, n_heads=48, n_layers=3, max_seq_len=4096,
                          attn_config=dict(kv_n_heads=8, clip_qkv=8, rope_theta=500000),
                          ffn_config=dict(ffn_hidden_size=10752, moe_num_experts=16, moe_top_k=4, hidden_size=6144))),
    # Llama 4 Scout text: 16 experts top-1 as one bmm over all experts (no dispatch), shared expert inside the MoE
    # block before the combine, router = linear -> top-k -> scatter -> sigmoid; chunked attention (chunk 64 here)
    "llama4": ("llama4_text", dict(vocab_size=32000, hidden_size=5120, intermediate_size=8192, intermediate_size_mlp=16384,
                                   num_hidden_layers=3, num_attention_heads=40, num_key_value_heads=8, head_dim=128,
                                   num_local_experts=16, num_experts_per_tok=1, interleave_moe_layer_step=1,
                                   attention_chunk_size=64, max_position_embeddings=4096)),
    # Hunyuan-A13B widths: 64 experts top-8, shared MLP before the router, fp32 gate
    "hunyuan": ("hunyuan_v1_moe", dict(vocab_size=32000, hidden_size=4096, intermediate_size=3072, num_hidden_layers=3,
                                       num_attention_heads=32, num_key_value_heads=8, head_dim=128, num_experts=64, moe_topk=8,
                                       max_position_embeddings=4096)),
    # dense controls: Llama-3-8B widths; Mistral-7B widths with a 64-token sliding window (shorter than the prefill)
    "llama": ("llama", dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=3,
                            num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=4096)),
    "mistral": ("mistral", dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=3,
                                num_attention_heads=32, num_key_value_heads=8, head_dim=128, sliding_window=64,
                                max_position_embeddings=4096)),
}

#: name: (family, experts backend, attention, mode[, options]); options: bs, prefill, decode (decode steps profiled),
#: keep (steps kept in the plain fixture), keep_stack (in the twin), twin_only (the plain fixture exists already)
RUNS = {
    "glm5_eager_sdpa": ("glm5", "eager", "sdpa", "decode"),
    "glm5_grouped_sdpa": ("glm5", "grouped_mm", "sdpa", "decode"),
    "glm5_batched_eagerattn": ("glm5", "batched_mm", "eager", "decode"),
    "qwen3moe_eager_sdpa": ("qwen3moe", "eager", "sdpa", "decode"),
    "qwen3moe_grouped_eagerattn": ("qwen3moe", "grouped_mm", "eager", "decode"),
    "olmoe_eager_sdpa": ("olmoe", "eager", "sdpa", "decode"),
    "olmoe_grouped_sdpa": ("olmoe", "grouped_mm", "sdpa", "decode"),
    "mixtral_batched_sdpa": ("mixtral", "batched_mm", "sdpa", "decode"),
    "qwen3moe_grouped_cudagraph": ("qwen3moe", "grouped_mm", "sdpa", "graph"),
    # issue 25, in the order they are captured (most needed first: the device time is short)
    "gptoss_eager_eagerattn": ("gptoss", "eager", "eager", "decode", dict(keep=2, keep_stack=2)),
    "gptoss_grouped_eagerattn": ("gptoss", "grouped_mm", "eager", "decode", {}),
    "dsv3_eager_sdpa": ("dsv3", "eager", "sdpa", "decode", dict(keep=2, keep_stack=2)),
    "dsv3_grouped_sdpa": ("dsv3", "grouped_mm", "sdpa", "decode", {}),
    "qwen2moe_eager_sdpa": ("qwen2moe", "eager", "sdpa", "decode", dict(keep=2, keep_stack=2)),
    "qwen2moe_grouped_sdpa": ("qwen2moe", "grouped_mm", "sdpa", "decode", {}),
    "granitemoe_eager_sdpa": ("granitemoe", "eager", "sdpa", "decode", dict(keep=2, keep_stack=2)),
    "granitemoe_grouped_sdpa": ("granitemoe", "grouped_mm", "sdpa", "decode", {}),
    "dbrx_eager_sdpa": ("dbrx", "eager", "sdpa", "decode", dict(keep=3, keep_stack=2)),
    "llama4_bmm_sdpa": ("llama4", "eager", "sdpa", "decode", {}),
    "llama_dense_sdpa": ("llama", "eager", "sdpa", "decode", {}),
    "mistral_swa_eagerattn": ("mistral", "eager", "eager", "decode", {}),
    # batched_mm gathers one weight matrix per (token, expert) pair: a small batch keeps that within memory
    "gptoss_batched_eagerattn": ("gptoss", "batched_mm", "eager", "decode", dict(bs=4, prefill=16)),
    "hunyuan_eager_sdpa": ("hunyuan", "eager", "sdpa", "decode", dict(keep=2, keep_stack=2)),
    "hunyuan_grouped_sdpa": ("hunyuan", "grouped_mm", "sdpa", "decode", {}),
    # with_stack twins of the families the corpus already held (their plain fixtures stay as they are)
    "qwen3moe_grouped_eagerattn_twin": ("qwen3moe", "grouped_mm", "eager", "decode", dict(twin_only=True)),
    "olmoe_grouped_sdpa_twin": ("olmoe", "grouped_mm", "sdpa", "decode", dict(twin_only=True)),
    "mixtral_batched_sdpa_twin": ("mixtral", "batched_mm", "sdpa", "decode", dict(twin_only=True)),
    "glm5_grouped_sdpa_twin": ("glm5", "grouped_mm", "sdpa", "decode", dict(twin_only=True)),
    "qwen3moe_eager_sdpa_twin": ("qwen3moe", "eager", "sdpa", "decode", dict(twin_only=True, keep_stack=2)),
    "olmoe_eager_sdpa_twin": ("olmoe", "eager", "sdpa", "decode", dict(twin_only=True, keep_stack=2)),
    "glm5_eager_sdpa_twin": ("glm5", "eager", "sdpa", "decode", dict(twin_only=True, keep_stack=2)),
}

#: the first nine runs were made by the older protocol (plain and twin in separate processes, 6 / 3 decode steps)
LEGACY = {"bs": 32, "prefill": 128, "decode": 6, "decode_stack": 3, "keep": 4, "keep_stack": 4}
DEFAULTS = {"bs": 32, "prefill": 128, "decode": 3, "decode_stack": 3, "keep": 4, "keep_stack": 4, "twin_only": False}
STEP_RX = re.compile(r"^forward#\d+:")
TINY = {"hidden_size": 64, "d_model": 64, "intermediate_size": 64, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64,
        "shared_intermediate_size": 64, "intermediate_size_mlp": 128, "ffn_hidden_size": 64, "num_attention_heads": 4, "n_heads": 4,
        "num_key_value_heads": 2, "kv_n_heads": 2, "head_dim": 16, "kv_lora_rank": 32, "q_lora_rank": 48, "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 16, "v_head_dim": 16, "index_head_dim": 16, "index_n_heads": 2, "index_topk": 16}


def options(run):
    spec = RUNS[run]
    return {**DEFAULTS, **spec[4]} if len(spec) > 4 else dict(LEGACY, twin_only=False)


def config_kwargs(fam, tiny):
    kw = json.loads(json.dumps(FAMILIES[fam][1]))
    if tiny:
        for d in [kw] + [v for v in kw.values() if isinstance(v, dict)]:
            mha = d.get("num_key_value_heads") is not None and d.get("num_key_value_heads") == d.get("num_attention_heads")
            for k in list(d):
                if k in TINY:
                    d[k] = TINY[k]
            if mha:  # MLA needs as many key/value heads as query heads
                d["num_key_value_heads"] = d["num_attention_heads"]
            if "hidden_size" in d and "d_model" in kw:
                d["hidden_size"] = TINY["d_model"]
    return kw


def build(fam, experts, attn, device, tiny):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    mtype = FAMILIES[fam][0]
    cfg = AutoConfig.for_model(mtype, **config_kwargs(fam, tiny))
    # the experts backend always named: transformers 5.17's default is grouped_mm, not the per-expert loop
    kw = dict(dtype=torch.bfloat16, attn_implementation=attn, experts_implementation=experts)
    with torch.device(device):  # parameters made (and randomly initialised) on the GPU itself
        model = AutoModelForCausalLM.from_config(cfg, **kw)
    with torch.no_grad():
        for p in model.parameters():
            if not torch.isfinite(p).all() or p.abs().max() == 0:
                p.normal_(0, 0.02)
    return model.eval(), type(model).__name__


def session(model, dev, o, ndec, timed, ids, tag=True):
    import torch
    from transformers import DynamicCache
    bs, plen = o["bs"], o["prefill"]
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        def pre():
            return model(input_ids=ids, past_key_values=cache, use_cache=True)
        out = timed(f"forward#0:prefill:bs={bs}:tokens={bs * plen}", pre) if tag else pre()
        nxt = out.logits[:, -1:].argmax(-1)
        for k in range(ndec):
            def f(n=nxt):
                return model(input_ids=n, past_key_values=cache, use_cache=True)
            out = timed(f"forward#{k + 1}:decode:bs={bs}", f) if tag else f()
            nxt = out.logits[:, -1:].argmax(-1)


def one(run, device, tiny):
    """Profile one run: warm-up, the program's clock without profiler, the plain trace, the with_stack twin."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function
    fam, experts, attn, mode = RUNS[run][:4]
    o = options(run)
    if tiny:
        o.update(bs=2, prefill=16)
    assert mode == "decode", "graph mode: use the older revision of this script"
    torch.manual_seed(0)
    t0 = time.time()
    model, cls = build(fam, experts, attn, device, tiny)
    t_build = time.time() - t0
    steps = []

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    def timed(label, fn):
        e0 = e1 = None
        if device == "cuda":
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
        h0 = time.perf_counter_ns()
        with record_function(label):
            r = fn()
        if e1 is not None:
            e1.record()
        h1 = time.perf_counter_ns()
        steps.append([label, h0, h1, e0, e1])
        return r

    def clock():
        sync()
        out = [dict(label=s[0], host_ns=s[2] - s[1], gpu_ms=s[3].elapsed_time(s[4]) if s[3] is not None else 0.0) for s in steps]
        steps.clear()
        return out

    ids = torch.randint(0, 32000 if not tiny else 1000, (o["bs"], o["prefill"]), device=device)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    session(model, device, o, 1, timed, ids, tag=False)  # warm-up, unprofiled
    sync()
    meta = dict(run=run, family=fam, model_type=FAMILIES[fam][0], config=config_kwargs(fam, tiny), model_class=cls,
                experts_implementation=experts, attn_implementation=attn, mode=mode, options=o, build="from_config on device",
                torch=torch.__version__, gpu=torch.cuda.get_device_name() if device == "cuda" else "cpu",
                bs=o["bs"], prefill_len=o["prefill"], build_s=round(t_build, 2))
    import transformers
    meta["transformers"] = transformers.__version__
    os.makedirs(RAW, exist_ok=True)
    tags = ["stack"] if o["twin_only"] else ["plain", "stack"]
    if not o["twin_only"]:
        session(model, device, o, o["decode"], timed, ids)
        meta["steps_unprofiled"] = clock()
    for tag in tags:
        ws = tag == "stack"
        ndec = o["decode_stack"] if ws else o["decode"]
        with profile(activities=acts, with_stack=ws, with_modules=ws, record_shapes=ws) as prof:
            session(model, device, o, ndec, timed, ids)
            sync()
        meta[f"steps_profiled{'_stack' if ws else ''}"] = clock()
        t1 = time.time()
        prof.export_chrome_trace(os.path.join(RAW, f"{run}.{tag}.json"))
        meta[f"export_{tag}_s"] = round(time.time() - t1, 2)
    meta["steps_profiled"] = meta.get("steps_profiled", meta.get("steps_profiled_stack"))
    with open(os.path.join(RAW, f"{run}.plain.truth.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(run, "ok", f"build {t_build:.1f}s total {time.time() - t0:.1f}s", flush=True)


def cut_events(doc, steps, strip_stack):
    """Keep the first ``steps`` step ranges (CPU events starting inside them, GPU ops they launched), the metadata,
    and (``strip_stack``) only the ``nn.Module`` python_function ranges (all that truth.py reads of the stack)."""
    ev = doc["traceEvents"]
    ranges = sorted((e for e in ev if e.get("ph") == "X" and e.get("cat") == "user_annotation" and STEP_RX.search(e.get("name", ""))),
                    key=lambda e: e["ts"])
    n = min(steps, len(ranges))
    t0, t1 = ranges[0]["ts"], ranges[n - 1]["ts"] + ranges[n - 1]["dur"]
    gpu = ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation")
    keep, corr = [], set()
    for e in ev:
        c = e.get("cat")
        if e.get("ph") == "M" or c in gpu:
            continue
        if strip_stack and c == "python_function" and not str(e.get("name", "")).startswith("nn.Module: "):
            continue
        if e.get("ph") in ("X", "i", "I") and t0 <= float(e.get("ts", -1)) <= t1:
            keep.append(e)
            k = (e.get("args") or {}).get("correlation")
            if k is not None:
                corr.add(k)
    for e in ev:
        if e.get("cat") in gpu:
            k = (e.get("args") or {}).get("correlation")
            if (k is not None and k in corr) or (k is None and t0 <= float(e.get("ts", -1)) <= t1):
                keep.append(e)
    doc = dict(doc)
    doc["traceEvents"] = [e for e in ev if e.get("ph") == "M"] + keep
    return doc, [r["name"] for r in ranges[:n]]


SHAPE_ARGS = ("Input Dims", "Input Strides", "Input type", "Concrete Inputs")
HARD_LIMIT = 2_900_000


def _write(doc, dst):
    with gzip.open(dst + ".tmp", "wt", compresslevel=9) as g:
        json.dump(doc, g, separators=(",", ":"))
    return os.path.getsize(dst + ".tmp")


def _strip_shapes(doc):
    for e in doc["traceEvents"]:
        a = e.get("args")
        if e.get("cat") == "cpu_op" and a:
            for k in SHAPE_ARGS:
                a.pop(k, None)
    return doc


def post(run, limit_bytes):
    """Cut, strip and gzip one run's traces (the fixture sizes): fewer steps (down to 2) while a file is over
    ``limit_bytes``; a twin still over :data:`HARD_LIMIT` loses its record_shapes arguments, then its decode steps."""
    o = options(run)
    info = {}
    for tag in ("plain", "stack"):
        src = os.path.join(RAW, f"{run}.{tag}.json")
        if not os.path.exists(src):
            continue
        with open(src) as f:
            doc = json.load(f)
        stack = tag == "stack"
        dst = os.path.join(RAW, f"{run}.{tag}.json.gz")
        steps, how = o["keep_stack" if stack else "keep"], []
        while True:
            small, labels = cut_events(doc, steps, strip_stack=stack)
            size = _write(small, dst)
            if size <= limit_bytes or steps <= 2:
                break
            steps -= 1
        if stack and size > HARD_LIMIT:
            small, labels = cut_events(_strip_shapes(doc), steps, strip_stack=True)
            size, how = _write(small, dst), ["shapes stripped"]
            if size > HARD_LIMIT:
                small, labels = cut_events(doc, 1, strip_stack=True)
                size, how = _write(small, dst), how + ["prefill only"]
        os.replace(dst + ".tmp", dst)
        os.remove(src)
        info[tag] = dict(steps=labels, bytes=size, how=how)
    with open(os.path.join(RAW, f"{run}.post.json"), "w") as f:
        json.dump(info, f)
    print(run, "post", json.dumps(info), flush=True)


def pack(runs, max_files=7, max_bytes=15 * 2**20, max_total=58 * 2**20):
    """Pack the outputs of $RAW into at most ``max_files`` tar archives of at most ``max_bytes`` each under $OUT,
    at most ``max_total`` in all (the device's return limits): runs in priority order, a run that no longer fits is left out."""
    names = os.listdir(RAW)
    groups = [[os.path.join(RAW, n) for n in names if n.startswith(r + ".")] for r in runs]
    groups.append([os.path.join(RAW, n) for n in names if n.endswith(".txt")])
    bins, total = [], 0
    for ps in [groups[-1]] + groups[:-1]:  # the log first, then the runs in priority order
        s = sum(os.path.getsize(p) for p in ps)
        if total + s > max_total:
            print("LEFT OUT (return limit):", [os.path.basename(p) for p in ps], s, flush=True)
            continue
        for p in ps:
            sz = os.path.getsize(p)
            b = next((b for b in bins if b[0] + sz <= max_bytes), None)
            if b is None:
                b = [0, []]
                bins.append(b)
            b[0] += sz
            b[1].append(p)
        total += s
    assert len(bins) <= max_files, len(bins)
    os.makedirs(OUT, exist_ok=True)
    for i, (_, ps) in enumerate(bins):
        with tarfile.open(os.path.join(OUT, f"corpus_{i}.tar"), "w") as t:
            for p in ps:
                t.add(p, arcname=os.path.basename(p))
    print("packed", [(i, round(b[0] / 2**20, 2), len(b[1])) for i, b in enumerate(bins)], f"total {total / 2**20:.1f} MiB", flush=True)


def child(run, device, tiny):
    try:
        one(run, device, tiny)
        code = 0
    except BaseException as e:  # the parent reads the log; the next run goes on
        import traceback
        traceback.print_exc()
        print(run, "FAILED", repr(e)[:300], flush=True)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="*")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="divide the widths down (a CPU check of this script)")
    ap.add_argument("--budget", type=float, default=300.0, help="start no run after this many seconds")
    ap.add_argument("--run-timeout", type=float, default=75.0)
    ap.add_argument("--limit-bytes", type=int, default=1_700_000, help="fewer steps while a cut trace is larger")
    ap.add_argument("--post", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.post:
        post(a.post, a.limit_bytes)
        return 0
    import torch  # noqa: F401  (imported once here; each forked run starts CUDA itself)
    import transformers  # noqa: F401
    from transformers import AutoModelForCausalLM, DynamicCache  # noqa: F401
    runs = a.runs or [r for r in RUNS if len(RUNS[r]) > 4]
    t0 = time.time()
    os.makedirs(RAW, exist_ok=True)
    log = open(os.path.join(RAW, "corpus_log.txt"), "a")
    posts = []
    for run in runs:
        if time.time() - t0 > a.budget:
            print("budget reached; not run:", run, flush=True)
            log.write(f"== {run} SKIPPED (budget)\n")
            continue
        t1 = time.time()
        pid = os.fork()
        if pid == 0:
            child(run, a.device, a.tiny)
        status = None
        while time.time() - t1 < a.run_timeout:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.05)
        else:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            status = "timeout"
        msg = f"== {run} status={status} {time.time() - t1:.1f}s (elapsed {time.time() - t0:.0f}s)"
        print(msg, flush=True)
        log.write(msg + "\n")
        log.flush()
        posts = [p for p in posts if p.poll() is None]
        while len(posts) >= 3:
            time.sleep(0.2)
            posts = [p for p in posts if p.poll() is None]
        posts.append(subprocess.Popen([sys.executable, __file__, "--post", run, "--limit-bytes", str(a.limit_bytes)]))
    for p in posts:
        p.wait()
    log.close()
    pack(runs)
    print(f"all done in {time.time() - t0:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
