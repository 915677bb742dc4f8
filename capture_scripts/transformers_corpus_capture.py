"""Made the GPU corpus in tests/corpus (run on 1x H200: `python3 capture_scripts/transformers_corpus_capture.py [RUN ...]`;
raw outputs land in /tmp/corpus). Corpus capture on one H200: transformers MoE models with random weights, profiled the way users do it
(torch.profiler + export_chrome_trace), plus a with_stack twin of each run (ground truth by nn.Module) and the
program's own step clock (CUDA events + host perf_counter). One run per subprocess: python3 corpus_capture.py RUN."""
import gzip
import json
import os
import shutil
import subprocess
import sys
import time

OUT = os.environ.get("OUT", "/tmp/out")
RAW = os.path.join("/tmp", "corpus")

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
}

# name: (family, experts backend, attention, mode)
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
}

BS, PREFILL_LEN, DECODE_STEPS, TWIN_STEPS = 32, 128, 6, 3


def build(fam, experts, attn):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    mtype, kw = FAMILIES[fam]
    cfg = AutoConfig.for_model(mtype, **kw)
    cfg._attn_implementation = attn
    try:
        model = AutoModelForCausalLM.from_pretrained(None, config=cfg, state_dict={}, device_map="cuda", dtype=torch.bfloat16,
                                                     experts_implementation=experts, attn_implementation=attn)
        how = "from_pretrained(None, state_dict={})"
    except Exception as e:  # fall back to from_config
        print("from_pretrained failed:", repr(e)[:300], flush=True)
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, experts_implementation=experts,
                                                 attn_implementation=attn).cuda()
        how = "from_config"
    with torch.no_grad():
        for p in model.parameters():
            if not torch.isfinite(p).all() or p.abs().max() == 0:
                p.normal_(0, 0.02)
    model.eval()
    return model, how


def one(run, with_stack):
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function
    fam, experts, attn, mode = RUNS[run]
    torch.manual_seed(0)
    model, how = build(fam, experts, attn)
    dev = "cuda"
    steps = []

    def timed(label, fn):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        h0 = time.perf_counter_ns()
        e0.record()
        with record_function(label):
            r = fn()
        e1.record()
        h1 = time.perf_counter_ns()
        steps.append([label, h0, h1, e0, e1])
        return r

    n_dec = TWIN_STEPS if with_stack else DECODE_STEPS
    if mode == "decode":
        from transformers import DynamicCache
        ids = torch.randint(0, 32000, (BS, PREFILL_LEN), device=dev)

        def session(i0, ndec, tag=True):
            cache = DynamicCache(config=model.config) if "config" in DynamicCache.__init__.__code__.co_varnames else DynamicCache()
            lab = f"forward#{i0}:prefill:bs={BS}:tokens={BS * PREFILL_LEN}"
            with torch.no_grad():
                out = timed(lab, lambda: model(input_ids=ids, past_key_values=cache, use_cache=True)) if tag else \
                    model(input_ids=ids, past_key_values=cache, use_cache=True)
                nxt = out.logits[:, -1:].argmax(-1)
                for k in range(ndec):
                    lab = f"forward#{i0 + 1 + k}:decode:bs={BS}"
                    def f(n=nxt):
                        return model(input_ids=n, past_key_values=cache, use_cache=True)
                    out = timed(lab, f) if tag else f()
                    nxt = out.logits[:, -1:].argmax(-1)
        session(0, 2, tag=False)  # warm-up, unprofiled
        torch.cuda.synchronize()
        steps.clear()
        # unprofiled timing of the same session (program clock without profiler)
        session(0, n_dec)
        torch.cuda.synchronize()
        unprof = [[s[0], s[2] - s[1], s[3].elapsed_time(s[4])] for s in steps]
        steps.clear()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=with_stack,
                     with_modules=with_stack, record_shapes=with_stack) as prof:
            session(0, n_dec)
            torch.cuda.synchronize()
    else:  # CUDA graphs via torch.compile reduce-overhead, fixed shapes, no cache
        ids = torch.randint(0, 32000, (8, 64), device=dev)
        fwd = torch.compile(lambda x: model(input_ids=x, use_cache=False).logits, mode="reduce-overhead")
        with torch.no_grad():
            for _ in range(4):
                fwd(ids)
            torch.cuda.synchronize()
            steps.clear()
            for k in range(n_dec + 2):
                timed(f"forward#{k}:prefill:bs=8:tokens=512", lambda: fwd(ids).clone())
            torch.cuda.synchronize()
            unprof = [[s[0], s[2] - s[1], s[3].elapsed_time(s[4])] for s in steps]
            steps.clear()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=with_stack,
                         with_modules=with_stack, record_shapes=with_stack) as prof:
                for k in range(n_dec + 2):
                    timed(f"forward#{k}:prefill:bs=8:tokens=512", lambda: fwd(ids).clone())
                torch.cuda.synchronize()
    prof_steps = [[s[0], s[2] - s[1], s[3].elapsed_time(s[4])] for s in steps]
    tag = "stack" if with_stack else "plain"
    os.makedirs(RAW, exist_ok=True)
    js = os.path.join(RAW, f"{run}.{tag}.json")
    prof.export_chrome_trace(js)
    with open(js, "rb") as f, gzip.open(js + ".gz", "wb", compresslevel=9) as g:
        shutil.copyfileobj(f, g)
    os.remove(js)
    meta = dict(run=run, family=fam, model_type=FAMILIES[fam][0], config=FAMILIES[fam][1], experts_implementation=experts,
                attn_implementation=attn, mode=mode, with_stack=with_stack, build=how, torch=torch.__version__,
                gpu=torch.cuda.get_device_name(), bs=BS, prefill_len=PREFILL_LEN,
                steps_profiled=[dict(label=l, host_ns=h, gpu_ms=g) for l, h, g in prof_steps],
                steps_unprofiled=[dict(label=l, host_ns=h, gpu_ms=g) for l, h, g in unprof])
    import transformers
    meta["transformers"] = transformers.__version__
    with open(os.path.join(RAW, f"{run}.{tag}.truth.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(run, tag, "ok", os.path.getsize(js + ".gz"), "bytes", flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 3:
        one(sys.argv[1], sys.argv[2] == "stack")
        sys.exit(0)
    runs = sys.argv[1:] or list(RUNS)
    t0 = time.time()
    os.makedirs(OUT, exist_ok=True)
    os.makedirs(RAW, exist_ok=True)
    log = open(os.path.join(RAW, "corpus_log.txt"), "a")
    for run in runs:
        for tag in ("plain", "stack"):
            if time.time() - t0 > 390:
                print("time budget reached; skipping", run, tag, flush=True)
                continue
            t1 = time.time()
            try:
                r = subprocess.run([sys.executable, __file__, run, tag], capture_output=True, text=True, timeout=150)
            except subprocess.TimeoutExpired:
                log.write(f"== {run} {tag} TIMEOUT\n")
                print(run, tag, "TIMEOUT", flush=True)
                continue
            msg = f"== {run} {tag} rc={r.returncode} {time.time() - t1:.1f}s\n{r.stdout[-1500:]}\n{r.stderr[-2500:]}\n"
            print(msg, flush=True)
            log.write(msg)
    log.close()
