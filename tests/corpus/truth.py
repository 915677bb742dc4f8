"""Ground truth for the real-trace corpus: each GPU op's category from the nn.Module that launched it.

Reads a Kineto JSON captured with ``with_stack=True`` (``python_function`` events, among them
``nn.Module: <Class>_<n>`` ranges) and assigns every kernel/memcpy/memset the category a kernel
engineer would give it, from the launching module chain and the launching ``aten::`` op. It is an
independent reference: it never calls tracekit's name rules, only the small, fixed classification
below (documented in tests/corpus/README.md), so the corpus test compares two different methods.

Per GPU op: correlation -> launching runtime call (``cudaLaunchKernel``, ``hipExtModuleLaunchKernel``,
``cuLaunchKernel``, ``cudaMemcpyAsync`` ...) -> the stack of CPU ranges enclosing it on its thread
(``python_function`` modules and ``cpu_op`` aten ops), innermost first. Then, walking the module
classes innermost to outermost, the first that decides:

* ``…Router`` / ``…Gate`` / ``…TopK…`` (``Glm4MoeTopkRouter``, ``Qwen3MoeTopKRouter``, SGLang ``TopK``) -> moe_routing
* ``…Experts`` / ``FusedMoE`` -> moe_gemm for GEMM ops (mm, bmm, addmm, linear, grouped_mm), other_compute for the
  activation (an activation module such as ``SiLUActivation``, or aten silu/gelu/relu/sigmoid), moe_routing for the rest:
  dispatch and combine (index, nonzero/where, index_add_, gather/scatter, sort, histc, masked_fill, the routing-weight mul,
  sum over top-k, copies)
* ``…SparseMoeBlock`` / ``…MoE`` and any module that directly holds a router or an experts module in this trace
  (``GptOssMLP``, ``Llama4TextMoe``, ``HunYuanMoEV1Moe``, ``DbrxFFN``: the MoE block whatever its name), outside
  experts, router, shared-expert MLP -> moe_routing (dispatch and combine)
* ``…Linear`` -> dense_gemm (inside Experts: moe_gemm, inside a router: moe_routing)
* ``…Norm`` (RMSNorm, LayerNorm) and ``…Embedding`` (incl. RotaryEmbedding) -> other_compute
* ``…Attention`` / ``…Indexer`` -> attention for the attention math (SDPA/flash/cudnn ops, matmul/bmm outside
  a Linear, softmax, KV-cache writes), other_compute for the rest (rope, reshapes, casts)
* no deciding module -> by the launching op: GEMM ops dense_gemm, else other_compute

Memcpy/memset are memory; kernels of the collective libraries (NCCL, RCCL, custom allreduce) are
communication whatever launched them. Kernels replayed from a CUDA graph have no stack: they are
returned as ``unknown`` (the caller decides; the corpus labels those traces by hand-checked family).

Usage: ``python tests/corpus/truth.py TRACE.json.gz [-o truth.json]`` prints the shares and writes
``{"shares_pct": {...}, "busy_ns": N, "ops": N, "by_name": [...]}``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

CATEGORIES = ("moe_gemm", "moe_routing", "attention", "communication", "dense_gemm", "other_compute", "memory")

_MOD = re.compile(r"^nn\.Module: (?P<cls>[A-Za-z0-9_]+?)(_\d+)?$")
ROUTER = re.compile(r"(Router|TopK|Topk|Gate)$")
EXPERTS = re.compile(r"(Experts?|FusedMoE|MoeExperts)$")
MOE_BLOCK = re.compile(r"(SparseMoeBlock|MoeBlock|MoE|MoELayer|MoeLayer)$")
LINEAR = re.compile(r"Linear$|LMHead$")
NORM = re.compile(r"(Norm|RMSNorm|LayerNorm)$")
EMBED = re.compile(r"Embedding$")
ATTENTION = re.compile(r"(Attention|Attn|Indexer)$")
MLP = re.compile(r"(MLP|SiluAndMul|Act|Activation)$")

GEMM_OPS = re.compile(r"^aten::(mm|bmm|addmm|baddbmm|matmul|linear|_grouped_mm|grouped_mm|addmv|mv|_scaled_mm|_scaled_grouped_mm|einsum)$")
ATTN_OPS = re.compile(
    r"^aten::(scaled_dot_product_attention|_scaled_dot_product\w*|_flash_attention\w*|_efficient_attention\w*|_cudnn_attention\w*"
    r"|softmax|_softmax|index_copy_?|index_put_?)$|(?i:attention|attn|mha|flash|sdpa|paged|kv_cache|store_cache|set_kv)"
)
DISPATCH_OPS = re.compile(
    r"^aten::(index|index_select|index_add_?|index_put_?|nonzero|nonzero_static|where|argwhere|gather|scatter|scatter_add_?"
    r"|scatter_reduce_?|one_hot|sort|argsort|histc|bincount|cumsum|topk|repeat_interleave|searchsorted|masked_select|unique\w*)$"
)
ACT_OPS = re.compile(r"^aten::(silu|gelu|relu|sigmoid|tanh|silu_|gelu_|relu_|mish|hardswish|glu)$")
COMM_NAME = re.compile(r"(?i)^nccl|^rccl|ncclDevKernel|ncclKernel|cross_device_reduce|all_reduce|allreduce|multimem_|one_shot|two_shot|mscclpp|quickreduce|deep_ep|nvshmem")

LAUNCH = re.compile(r"(?i)launch|memcpy|memset|graphlaunch")


def _load(path: Path) -> dict[str, Any]:
    op = gzip.open if path.suffix == ".gz" else open
    with op(path, "rt") as f:  # type: ignore[operator]
        return json.load(f)


def _module_class(name: str) -> str | None:
    m = _MOD.match(name)
    return m.group("cls") if m else None


def moe_blocks(stacks: Iterable[tuple[list[str], list[str]]]) -> frozenset[str]:
    """Module classes that directly hold a router or an experts module in some stack: the MoE blocks of this model."""
    out = set()
    for mods, _ in stacks:
        for i, cls in enumerate(mods[:-1]):
            if (ROUTER.search(cls) and not MLP.search(cls)) or EXPERTS.search(cls):
                out.add(mods[i + 1])
    return frozenset(c for c in out if not EXPERTS.search(c) and not ROUTER.search(c))


def classify(chain_mods: list[str], chain_ops: list[str], kind: str, name: str, blocks: frozenset[str] = frozenset()) -> str:
    """Truth category of one GPU op from its module classes and aten ops (both innermost first); ``blocks``: the
    model's MoE block classes (:func:`moe_blocks`)."""
    if kind != "kernel":
        return "memory"
    if COMM_NAME.search(name):
        return "communication"
    op = chain_ops[0] if chain_ops else ""
    is_gemm = any(GEMM_OPS.match(o) for o in chain_ops[:2])
    for i, cls in enumerate(chain_mods):
        outer = chain_mods[i + 1:]
        if MLP.search(cls) and any(EXPERTS.search(c) for c in outer):  # the experts' activation module
            return "other_compute"
        if ROUTER.search(cls) and not MLP.search(cls):
            return "moe_routing"
        if EXPERTS.search(cls):
            if is_gemm:
                return "moe_gemm"
            if any(ACT_OPS.match(o) for o in chain_ops[:2]):
                return "other_compute"
            return "moe_routing"
        if LINEAR.search(cls):
            if any(EXPERTS.search(c) for c in outer):
                return "moe_gemm"
            if any(ROUTER.search(c) for c in outer):
                return "moe_routing"
            return "dense_gemm"
        if cls in blocks:
            return "moe_routing"
        if NORM.search(cls) or EMBED.search(cls):
            return "other_compute"
        if MLP.search(cls):
            return "dense_gemm" if is_gemm else "other_compute"
        if ATTENTION.search(cls):
            return "attention" if (is_gemm or any(ATTN_OPS.search(o) for o in chain_ops[:3])) else "other_compute"
        if MOE_BLOCK.search(cls):
            return "moe_routing"
    if is_gemm:
        return "dense_gemm"
    del op
    return "other_compute"


def _stacks(cpu: list[dict[str, Any]], launches: list[dict[str, Any]]) -> dict[int, tuple[list[str], list[str]]]:
    """For each launch (by correlation): enclosing module classes and aten ops, innermost first (sweep per thread)."""
    by_tid: dict[Any, list[tuple[float, float, int, Any]]] = defaultdict(list)
    for e in cpu:
        by_tid[e["tid"]].append((float(e["ts"]), -float(e.get("dur", 0)), 0, e))
    for e in launches:
        by_tid[e["tid"]].append((float(e["ts"]), 0.0, 1, e))
    out: dict[int, tuple[list[str], list[str]]] = {}
    for items in by_tid.values():
        items.sort(key=lambda t: (t[0], t[1], t[2]))
        stack: list[tuple[float, str, str]] = []  # (end, kind, label)
        for ts, negdur, is_launch, e in items:
            while stack and stack[-1][0] <= ts:
                stack.pop()
            if is_launch:
                mods = [lab for _, k, lab in reversed(stack) if k == "m"]
                ops = [lab for _, k, lab in reversed(stack) if k == "o"]
                out[int(e["args"]["correlation"])] = (mods, ops)
                continue
            end = ts - negdur
            cls = _module_class(e["name"]) if e.get("cat") == "python_function" else None
            if cls is not None:
                stack.append((end, "m", cls))
            elif e.get("cat") in ("cpu_op", "user_annotation"):
                stack.append((end, "o", e["name"]))
            else:
                stack.append((end, "f", e["name"]))
    return out


STEP_RX = re.compile(r"^(forward|step|ProfilerStep)[#\[ _]")


def truth(path: Path, steps: int | None = None) -> dict[str, Any]:
    """Per-category shares (% of summed GPU-op time) and per-name truth for one with_stack trace.

    ``steps``: only GPU ops launched inside the first ``steps`` step ranges (``forward#i…``,
    ``step[…]``, ``ProfilerStep#i``), so the truth covers the same steps as a cut fixture."""
    doc = _load(path)
    ev: list[dict[str, Any]] = doc["traceEvents"] if isinstance(doc, dict) else doc
    window = None
    if steps is not None:
        rs = sorted((e for e in ev if e.get("ph") == "X" and e.get("cat") == "user_annotation" and STEP_RX.search(e.get("name", ""))),
                    key=lambda e: e["ts"])[:steps]
        window = (rs[0]["ts"], rs[-1]["ts"] + rs[-1]["dur"])
    gpu = [e for e in ev if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    cpu = [e for e in ev if e.get("ph") == "X" and e.get("cat") in ("python_function", "cpu_op", "user_annotation")]
    launches = [e for e in ev if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver")
                and "correlation" in (e.get("args") or {}) and LAUNCH.search(e.get("name", ""))]
    if not any(e.get("cat") == "python_function" for e in cpu):
        raise SystemExit(f"{path}: no python_function events; capture the twin with with_stack=True")
    stacks = _stacks(cpu, launches)
    blocks = moe_blocks(stacks.values())
    if window is not None:
        lts = {int(e["args"]["correlation"]): float(e["ts"]) for e in launches}
        gpu = [e for e in gpu if window[0] <= lts.get(int((e.get("args") or {}).get("correlation", -1)), -1.0) <= window[1]]
    busy = 0.0
    per_cat: dict[str, float] = defaultdict(float)
    per_name: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0])
    unknown = 0.0
    for e in gpu:
        kind = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}[e["cat"]]
        corr = (e.get("args") or {}).get("correlation")
        mods, ops = stacks.get(int(corr), ([], [])) if corr is not None else ([], [])
        graph = (e.get("args") or {}).get("graph id") is not None
        if kind == "kernel" and graph and not mods and not ops:
            cat = "unknown"
        else:
            cat = classify(mods, ops, kind, e["name"], blocks)
        d = float(e.get("dur", 0)) * 1000.0
        busy += d
        if cat == "unknown":
            unknown += d
        else:
            per_cat[cat] += d
        key = (cat, canonical(e["name"]))
        per_name[key][0] += 1
        per_name[key][1] += d
    known = busy - unknown
    shares = {c: round(100.0 * per_cat.get(c, 0.0) / known, 3) if known else 0.0 for c in CATEGORIES}
    by_name = sorted(({"category": c, "name": n, "count": int(v[0]), "total_ns": int(v[1])} for (c, n), v in per_name.items()),
                     key=lambda r: -r["total_ns"])
    return {"source": path.name, "method": "with_stack module chain (tests/corpus/truth.py)", "shares_pct": shares,
            "busy_ns": int(busy), "unknown_ns": int(unknown), "ops": len(gpu), "by_name": by_name[:60]}


def canonical(name: str) -> str:
    """Template/argument-free short form of a kernel name (for listings only)."""
    n = re.sub(r"^void ", "", name)
    depth, out = 0, []
    for ch in n:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out)[:120] or name[:120]


def main(argv: Iterable[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("-o", "--out", type=Path)
    ap.add_argument("--steps", type=int, help="only the first N step ranges (match a cut fixture)")
    a = ap.parse_args(list(argv) if argv is not None else None)
    t = truth(a.trace, a.steps)
    t["steps"] = a.steps
    for c, v in t["shares_pct"].items():
        print(f"{c:14s} {v:6.2f}%")
    for r in t["by_name"][:25]:
        print(f"  {r['category']:13s} {r['total_ns'] / 1e6:9.3f} ms {r['count']:6d}  {r['name'][:90]}")
    if a.out:
        tmp = a.out.with_suffix(a.out.suffix + ".tmp")
        tmp.write_text(json.dumps(t, indent=1) + "\n")
        tmp.replace(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
