"""Kernel efficiency: achieved FLOP/s and bytes/s of GEMM-like ops with known shapes.

Shapes come from ``record_shapes`` (``input_dims``/``input_types`` of ``cpu_op`` rows).
A GPU kernel is joined to the op that launched it: the innermost GEMM-like
``cpu_op`` whose CPU range contains the kernel's launch call (``launch_ts_ns``) on
the same rank and thread (``launch_tid``) — this works whether or not the source
links external ids. All kernels of one op instance
(e.g. GEMM + split-K reduce) share its FLOPs: ``achieved = flops / Σ kernel time``.

FLOPs (2 per multiply-add): ``mm``/``addmm``/``_scaled_mm`` [M,K]×[K,N] → 2MKN;
``bmm``/``baddbmm`` → 2BMKN; ``linear`` [..., K]×[N, K]ᵀ → 2·rows·K·N; grouped MoE
GEMMs (``_grouped_mm``) [T,K]×[E,K,N] → 2TKN. Bytes = operands + result at the
operand dtype's size (a lower bound of DRAM traffic). Roofline ceiling =
min(peak FLOP/s of the dtype, arithmetic intensity × HBM bandwidth) from
:mod:`tracekit.core.gpus`; ``efficiency`` = achieved / ceiling. MoE GEMMs below
``flag_below`` of their ceiling are flagged as likely untuned.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Mapping

import polars as pl

from tracekit.core import intervals as iv
from tracekit.core._num import fdiv, seq_sum
from tracekit.analysis.findings import Finding, efficiency_candidates
from tracekit.analysis.registry import Analysis, FindingsContext, FinishContext, Finished, keyword_defaults, records, register
from tracekit.core.window import cpu_device_expr, cpu_mode_ranks
from tracekit.dtypes import dtype_bytes
from tracekit.core.gpus import GpuPeaks, gpu_peaks, peak_flops_per_s, rank_gpu_info
from tracekit.schema import TraceMeta

__all__ = ["kernel_efficiency", "efficiency_finish", "gemm_flops_bytes", "GEMM_OPS", "moe_gemm_part", "moe_gemm_finish",
           "moe_gemm_findings", "workload_moe_shape"]

GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::linear", "aten::matmul",
            "aten::_scaled_mm", "aten::_grouped_mm", "aten::grouped_mm", "aten::_scaled_grouped_mm")



def _prod(xs: list[int]) -> int:
    return int(math.prod(xs)) if xs else 1


def record_shapes(dims_json: str | None, types_json: str | None) -> tuple[list[Any], list[Any]] | None:
    """(input dims, input types) of one operator from its record_shapes JSON strings; None when unreadable."""
    try:
        dims = json.loads(dims_json or "null")
        types = json.loads(types_json or "null") or []
    except ValueError:
        return None
    return (dims, types if isinstance(types, list) else []) if isinstance(dims, list) else None


def gemm_flops_bytes(op: str, dims_json: str | None, types_json: str | None) -> tuple[float, float, str] | None:
    """(flops, bytes, dtype) of one GEMM-like op from its record_shapes strings; None when unknown."""
    rs = record_shapes(dims_json, types_json)
    if rs is None:
        return None
    dims, types = rs
    shapes = [d for d in dims if isinstance(d, list)]
    dtype = next((t for t in types if isinstance(t, str) and t and t != "Scalar"), "float")
    es = dtype_bytes(dtype) or 2
    try:
        if op in ("aten::mm", "aten::_scaled_mm") or (op == "aten::matmul" and len(shapes[0]) == 2 and len(shapes[1]) == 2):
            (m, k), (_k2, n) = shapes[0], shapes[1]
            flops, elems = 2.0 * m * k * n, m * k + k * n + m * n
        elif op == "aten::addmm":
            (m, k), (_k2, n) = shapes[1], shapes[2]
            flops, elems = 2.0 * m * k * n, m * k + k * n + 2 * m * n
        elif op in ("aten::bmm", "aten::baddbmm") or (op == "aten::matmul" and len(shapes[0]) == 3 and len(shapes[1]) == 3):
            a, b = (shapes[1], shapes[2]) if op == "aten::baddbmm" else (shapes[0], shapes[1])
            bb, m, k = a
            n = b[2]
            flops, elems = 2.0 * bb * m * k * n, bb * (m * k + k * n + m * n)
        elif op in ("aten::linear", "aten::matmul"):
            x, w = shapes[0], shapes[1]
            k = x[-1]
            rows = _prod(x[:-1])
            n = w[0] if op == "aten::linear" else w[-1]
            flops, elems = 2.0 * rows * k * n, rows * k + k * n + rows * n
        elif op in ("aten::_grouped_mm", "aten::grouped_mm", "aten::_scaled_grouped_mm"):
            x, w = shapes[0], shapes[1]
            t, k = x[-2], x[-1]
            e = w[0] if len(w) == 3 else 1
            n = w[-1] if w[-2] == k else w[-2]
            # only experts that received tokens are read: at most one per token row (offsets are not recorded,
            # so this is a bound; kernel_efficiency never shows the traffic above the device's HBM bandwidth)
            flops, elems = 2.0 * t * k * n, t * k + min(e, t) * k * n + t * n
        else:
            return None
    except (IndexError, TypeError, ValueError):
        return None
    if flops <= 0:
        return None
    return float(flops), float(elems * es), dtype


def _peaks_for(meta: TraceMeta | None, rank: int, gpu_name: str | None) -> GpuPeaks | None:
    if gpu_name:
        return gpu_peaks(gpu_name)
    p: GpuPeaks | None = rank_gpu_info(meta, rank)["peaks"]
    if p is None and meta:
        p = gpu_peaks(meta.get("device_name"))
    return p


def kernel_efficiency(
    df: pl.DataFrame,
    meta: TraceMeta | None = None,
    *,
    gpu_name: str | None = None,
    flag_below: float = 0.3,
) -> pl.DataFrame:
    """Per (rank, op, shape, kernel): count, gpu_ns, achieved TFLOP/s and GB/s, roofline ceiling,
    efficiency, ``flag`` (``moe_untuned`` / ``low_efficiency`` / null). Empty frame without shapes."""
    ops = _shaped_ops(df)
    if ops is None:
        return pl.DataFrame()
    j = _kernels_of_ops(df, ops)
    if j.height == 0:
        return pl.DataFrame()
    agg = _achieved(j)
    out = _capped(agg.join(_ceilings(agg, meta, gpu_name), on=["rank", "dtype"], how="left", nulls_equal=True))
    is_moe = (pl.col("category") == "moe_gemm") | pl.col("op").str.contains("grouped_mm")
    flag = (
        pl.when(pl.col("efficiency").is_null()).then(None)
        .when(is_moe & (pl.col("efficiency") < flag_below)).then(pl.lit("moe_untuned"))
        .when(pl.col("efficiency") < flag_below).then(pl.lit("low_efficiency"))
        .otherwise(None)
    )
    return _sorted(out.with_columns(flag.alias("flag"), (pl.col("flops_per_s") / 1e12).alias("tflops_per_s"),
                                    (pl.col("bytes_per_s") / 1e9).alias("gb_per_s")).select(
        "rank", "op", "input_dims", "dtype", "kernel", "category", "count", "gpu_ns", "tflops_per_s", "gb_per_s",
        "flops_per_byte", "peak_flops_per_s", "ceiling_flops_per_s", "efficiency", "flag", "bound",
    ))


def _shaped_ops(df: pl.DataFrame) -> pl.DataFrame | None:
    """GEMM-like CPU ops with recorded shapes and their FLOPs / bytes / dtype (computed once per unique
    signature, not per event); None when there is none."""
    kind = pl.col("kind").cast(pl.String)
    ops = df.filter((kind == "cpu_op") & pl.col("input_dims").is_not_null() & pl.col("name").cast(pl.String).is_in(list(GEMM_OPS)))
    if ops.height == 0:
        return None
    ops = ops.select(
        pl.col("rank").cast(pl.Int64), "tid", pl.col("ts_ns").alias("start"), (pl.col("ts_ns") + pl.col("dur_ns")).alias("end"),
        pl.col("name").cast(pl.String).alias("op"), "input_dims", "input_types",
    ).with_row_index("op_id")
    sig = ops.select("op", "input_dims", "input_types").unique()
    vals = [gemm_flops_bytes(o, d, t) for o, d, t in sig.iter_rows()]
    sig = sig.with_columns(
        pl.Series("flops", [v[0] if v else None for v in vals], dtype=pl.Float64),
        pl.Series("bytes_", [v[1] if v else None for v in vals], dtype=pl.Float64),
        pl.Series("dtype", [v[2] if v else None for v in vals], dtype=pl.String),
    )
    return ops.join(sig, on=["op", "input_dims", "input_types"], how="left", nulls_equal=True).filter(pl.col("flops").is_not_null())


def _kernels_of_ops(df: pl.DataFrame, ops: pl.DataFrame) -> pl.DataFrame:
    """Each kernel joined to the innermost GEMM op whose CPU range contains its launch call (same rank and thread).
    CPU mode: the categorized operator is its own "kernel", issued at its start on its thread."""
    kind = pl.col("kind").cast(pl.String)
    cpu = cpu_device_expr(cpu_mode_ranks(df)) & (kind == "cpu_op")
    ker = df.filter(((kind == "kernel") & pl.col("launch_ts_ns").is_not_null()) | cpu).select(
        pl.col("rank").cast(pl.Int64),
        pl.when(cpu).then(pl.col("tid")).otherwise(pl.col("launch_tid")).alias("tid"),
        pl.when(cpu).then(pl.col("ts_ns")).otherwise(pl.col("launch_ts_ns")).alias("launch_ts_ns"), "dur_ns",
        pl.col("name").cast(pl.String).alias("kernel"), pl.col("category").cast(pl.String),
    )
    j = iv.covered_by(ker, ops.select("rank", "tid", "start", "end", "op_id"), by=["rank", "tid"], at="launch_ts_ns", payload=["op_id"])
    return j.filter(pl.col("op_id").is_not_null()).join(ops.drop(["rank", "tid", "start", "end"]), on="op_id", how="inner")


def _achieved(j: pl.DataFrame) -> pl.DataFrame:
    """Per op instance (all its kernels share its FLOPs), then per (rank, op, shape, dtype, kernel): achieved FLOP/s and bytes/s."""
    inst = j.group_by(["rank", "op_id"]).agg(
        pl.col("op").first(), pl.col("input_dims").first(), pl.col("dtype").first(), pl.col("flops").first(),
        pl.col("bytes_").first(), pl.col("dur_ns").sum().alias("gpu_ns"),
        # the longest kernel of the op (ties: by name, so the choice never depends on row order)
        pl.col("kernel").sort_by(["dur_ns", "kernel", "category"], nulls_last=False).last(),
        pl.col("category").sort_by(["dur_ns", "kernel", "category"], nulls_last=False).last(),
    ).filter(pl.col("gpu_ns") > 0)
    return inst.group_by(["rank", "op", "input_dims", "dtype", "kernel", "category"]).agg(
        pl.len().alias("count"), pl.col("gpu_ns").sum(), seq_sum(pl.col("flops")).alias("_f"), seq_sum(pl.col("bytes_")).alias("_b"),
        pl.col("flops").first().alias("flops_each"), pl.col("bytes_").first().alias("bytes_each"),
    ).with_columns(
        (pl.col("_f") / (pl.col("gpu_ns") * 1e-9)).alias("flops_per_s"),
        (pl.col("_b") / (pl.col("gpu_ns") * 1e-9)).alias("bytes_per_s"),
    )


def _ceilings(agg: pl.DataFrame, meta: TraceMeta | None, gpu_name: str | None) -> pl.DataFrame:
    """The device peaks per (rank, dtype): a tiny table."""
    ceil_rows = []
    for r, dt in agg.select("rank", "dtype").unique().iter_rows():
        p = _peaks_for(meta, int(r), gpu_name)
        ceil_rows.append({"rank": r, "dtype": dt, "peak_flops_per_s": peak_flops_per_s(p, dt) if p else None,
                          "tf32_flops_per_s": p.bf16_flops / 2 if p else None,
                          "peak_bytes_per_s": p.hbm_bytes_per_s if p else None})
    return pl.DataFrame(ceil_rows, schema={"rank": pl.Int64, "dtype": pl.String, "peak_flops_per_s": pl.Float64,
                                           "tf32_flops_per_s": pl.Float64, "peak_bytes_per_s": pl.Float64})


def _capped(out: pl.DataFrame) -> pl.DataFrame:
    """Roofline ceiling and efficiency, with physically possible figures only: bytes of grouped GEMMs are a bound
    (which experts got tokens is unknown); a figure above the device's HBM bandwidth or the ceiling means the bound
    was loose: shown capped, marked ``bound``."""
    ai = pl.col("flops_each") / pl.col("bytes_each")
    # fp32 GEMMs running on tensor cores (TF32) get the TF32 ceiling (half the 16-bit peak)
    tf32 = pl.col("dtype").str.to_lowercase().is_in(["float", "float32"]) & pl.col("kernel").str.contains(r"(?i)tensorop|tf32|xmma|wgmma|nvjet|s1688|s16816")
    out = out.with_columns(
        pl.when(tf32).then(pl.col("tf32_flops_per_s")).otherwise(pl.col("peak_flops_per_s")).alias("peak_flops_per_s")
    ).with_columns(
        pl.min_horizontal(pl.col("peak_flops_per_s"), ai * pl.col("peak_bytes_per_s")).alias("ceiling_flops_per_s"),
        ai.alias("flops_per_byte"),
    ).with_columns(fdiv(pl.col("flops_per_s"), pl.col("ceiling_flops_per_s")).alias("efficiency"))
    grouped = pl.col("op").str.contains("grouped_mm")
    over = (pl.col("bytes_per_s") > pl.col("peak_bytes_per_s")) | (pl.col("efficiency") > 1.0) | (
        pl.col("flops_per_s") > pl.col("peak_flops_per_s"))
    return out.with_columns((grouped | over.fill_null(False)).alias("bound"),
                            pl.min_horizontal(pl.col("flops_per_s"), pl.col("peak_flops_per_s")).alias("flops_per_s"),
                            pl.min_horizontal(pl.col("bytes_per_s"), pl.col("peak_bytes_per_s")).alias("bytes_per_s"),
                            pl.min_horizontal(pl.col("efficiency"), pl.lit(1.0)).alias("efficiency"))


_KEY = ["rank", "op", "input_dims", "dtype", "kernel", "category"]


def _sorted(t: pl.DataFrame) -> pl.DataFrame:
    """Largest GPU time first; ties by the row's key (ranks' tables concatenate to the same order)."""
    return t.sort(["gpu_ns", *_KEY], descending=[True] + [False] * len(_KEY), nulls_last=True, maintain_order=True)


def efficiency_finish(parts: list[pl.DataFrame]) -> pl.DataFrame:
    """Concatenate per-rank :func:`kernel_efficiency` tables (each keyed by rank) in the order one whole-frame call gives."""
    have = [p for p in parts if p.height]
    return _sorted(pl.concat(have, how="vertical_relaxed")) if have else pl.DataFrame()


# --- the MoE GEMM verdict without recorded shapes --------------------------------------------------------------------

#: launches per MoE layer and step above which the MoE GEMMs are a per-expert loop
LOOP_LAUNCHES_PER_LAYER = 16
_TILE_RE = r"_(\d+x\d+)_"


def workload_moe_shape(meta: TraceMeta | None) -> dict[str, Any] | None:
    """The routed-expert GEMM shape the workload declared (capture metadata ``capture.workload.model``):
    ``hidden, inter`` (per rank: the intermediate is split over the tensor-parallel ranks), ``experts, top_k,
    layers, dtype``. None when the capture does not say (then recorded shapes are needed)."""
    cap = (meta or {}).get("capture")
    model = ((cap or {}).get("workload") or {}).get("model") if isinstance(cap, Mapping) else None
    if not isinstance(model, Mapping):
        return None
    try:
        world = int((meta or {}).get("world_size") or 1)
        h, inter = int(model["hidden"]), int(model["moe_intermediate"])
        e, k, L = int(model["n_experts"]), int(model["top_k"]), int(model["n_layers"])
    except (KeyError, TypeError, ValueError):
        return None
    if min(h, inter, e, k, L) <= 0:
        return None
    return {"hidden": h, "inter": max(inter // max(world, 1), 1), "experts": e, "top_k": k, "layers": L,
            "dtype": str(model.get("dtype") or "bfloat16"), "impl": model.get("moe_impl")}


def moe_gemm_part(df: pl.DataFrame, meta: TraceMeta | None) -> pl.DataFrame:
    """Per (rank, step): MoE GEMM kernel time and launches, the step's tokens (null where the step carries no
    count; ``step_id`` null for kernels outside any step), and the kernel with most time. Empty without MoE GEMM
    kernels, so the verdict can tell "no MoE GEMM" from "MoE GEMM, but no token counts to rate it"."""
    kind = pl.col("kind").cast(pl.String)
    k = df.filter((kind == "kernel") & (pl.col("category").cast(pl.String) == "moe_gemm"))
    if k.height == 0:
        return pl.DataFrame()
    per = k.group_by(pl.col("rank").cast(pl.Int64), pl.col("step_id").cast(pl.Int64)).agg(
        pl.col("dur_ns").sum().alias("gpu_ns"), pl.len().alias("launches"))
    st = df.filter((kind == "step") & pl.col("tokens").is_not_null()).group_by(
        pl.col("rank").cast(pl.Int64), pl.col("step_id").cast(pl.Int64)).agg(pl.col("tokens").max())
    # the rank's kernel with most MoE GEMM time (its tile names the verdict)
    top = k.group_by(pl.col("rank").cast(pl.Int64), pl.col("name").cast(pl.String)).agg(pl.col("dur_ns").sum()).sort(
        ["dur_ns", "name"], descending=[True, False]).group_by("rank", maintain_order=True).first().select(
        "rank", pl.col("name").alias("rank_top_kernel"))
    return per.join(st, on=["rank", "step_id"], how="left").join(top, on="rank", how="left")


def moe_gemm_finish(parts: list[pl.DataFrame], meta: TraceMeta | None) -> dict[str, Any]:
    """The MoE GEMM verdict (docs/metrics.md §8b): per rank, achieved TFLOP/s from the workload's GEMM shape and
    the steps' tokens, % of the device's dense peak, weight traffic (a bound: which experts received tokens is
    not recorded, so at most min(experts, tokens × top_k) experts' weights were read — never shown above the
    device's HBM bandwidth) and the roofline fraction (≤ 100 %). ``status``: ``ok``, or why there is no figure."""
    have = [p for p in parts if p.height]
    if not have:
        return {"status": "no_moe_gemm_kernels"}
    shape = workload_moe_shape(meta)
    if shape is None:
        return {"status": "shape_unknown", "needs": "record shapes in one short window (--record-shapes) or a capture "
                                                     "whose metadata declares the model (capture.workload.model)"}
    t = pl.concat(have, how="vertical_relaxed").filter(pl.col("tokens").is_not_null()).sort(["rank", "step_id"])
    if t.height == 0:
        return {"status": "no_token_counts", "needs": "steps that carry their token count (step labels such as "
                "forward#i:decode:bs=N or ProfilerStep with --steps-from, SGLang's step[...] ranges, the built-in workload)"}
    h, inter, e, k, L = shape["hidden"], shape["inter"], shape["experts"], shape["top_k"], shape["layers"]
    es = dtype_bytes(shape["dtype"]) or 2
    # per step: routed FLOPs (gate + up + down = 3 GEMMs of H x I per token-expert pair), weight bytes bound
    t = t.with_columns(
        (pl.col("tokens").cast(pl.Float64) * k * L * 6.0 * h * inter).alias("flops"),
        (pl.min_horizontal(pl.col("tokens") * k, pl.lit(e)).cast(pl.Float64) * L * 3.0 * h * inter * es
         + pl.col("tokens").cast(pl.Float64) * k * L * (2 * h + 3 * inter) * es).alias("bytes_bound"),
    )
    rows = []
    for (r,), g in t.group_by("rank", maintain_order=True):
        p = _peaks_for(meta, int(r), None)
        gpu_ns = int(g["gpu_ns"].sum())
        if gpu_ns <= 0:
            continue
        sec = gpu_ns * 1e-9
        flops, bbound = float(g["flops"].sum()), float(g["bytes_bound"].sum())
        steps = g.height
        launches = int(g["launches"].sum())
        top = g["rank_top_kernel"][0]
        tile = re.search(_TILE_RE, top or "")
        row: dict[str, Any] = {
            "rank": int(r), "steps": steps, "tokens": int(g["tokens"].sum()), "gpu_ns": gpu_ns, "launches": launches,
            "launches_per_layer_step": launches / (steps * L), "top_kernel": top, "tile": tile.group(1) if tile else None,
            "tflops_per_s": flops / sec / 1e12, "flops": flops, "bytes_bound": bbound,
        }
        if p is not None:
            peak = peak_flops_per_s(p, shape["dtype"])
            hbm = p.hbm_bytes_per_s
            bw = min(bbound / sec, hbm)  # a bound; traffic above HBM cannot happen: fewer experts were read
            ceiling = min(peak, flops / bbound * hbm) if bbound > 0 else peak
            row["tflops_per_s"] = min(flops / sec, peak) / 1e12  # above peak only if the token count overstates the work
            row.update({"device": p.name, "peak_flops_per_s": peak, "pct_of_peak": min(100.0, 100 * flops / sec / peak),
                        "weight_gb_per_s_max": bw / 1e9, "hbm_gb_per_s": hbm / 1e9,
                        "at_memory_limit": bbound / sec >= 0.7 * hbm,
                        "roofline_pct_max": min(100.0, 100 * (flops / sec) / ceiling) if ceiling else None})
        rows.append(row)
    if not rows:
        return {"status": "no_moe_gemm_kernels"}
    return {"status": "ok", "shape": shape, "ranks": rows, "bytes_are_bound": True}


def moe_gemm_findings(v: Mapping[str, Any]) -> list[tuple[float, str]]:
    """(weight ns, sentence) of the MoE GEMM verdict: one sentence, from the rank with the most MoE GEMM time."""
    if v.get("status") != "ok":
        return []
    r = max(v["ranks"], key=lambda x: x["gpu_ns"])
    if "pct_of_peak" not in r:
        return []
    tf, pct = r["tflops_per_s"], r["pct_of_peak"]
    head = f"MoE GEMM runs at {tf:.1f} TFLOP/s ({pct:.1f}% of {r['peak_flops_per_s'] / 1e12:.0f} peak) on rank {r['rank']}"
    if r["launches_per_layer_step"] >= LOOP_LAUNCHES_PER_LAYER:
        tile = f" of {r['tile']} tiles" if r.get("tile") else ""
        s = (f"{head} in {r['launches']:,} launches{tile} ({r['launches_per_layer_step']:.0f} per layer and step): "
             "per-expert loop; a grouped GEMM or tuned kernel is the next step.")
    elif r["at_memory_limit"]:
        s = (f"{head} in {r['launches']:,} grouped launches: consistent with a memory-bound kernel near its HBM roofline "
             f"(weights of every expert that could have received tokens, read at {r['hbm_gb_per_s']:,.0f} GB/s, take "
             f"{min(r['bytes_bound'] / (r['hbm_gb_per_s'] * 1e9) / (r['gpu_ns'] * 1e-9), 9.99):.0%} of the measured time; "
             "which experts did is not recorded) — few tokens per expert, not an untuned kernel: larger batches raise TFLOP/s.")
    else:
        s = (f"{head} in {r['launches']:,} launches, at most {r['roofline_pct_max']:.0f}% of its roofline ceiling "
             "(weight bytes are a bound): likely untuned kernel configs.")
    return [(float(r["gpu_ns"]), s)]


# --- the ``kernel_efficiency`` and ``moe_gemm`` analyses (tracekit.analysis.registry) --------------------------------

def _eff_finish(parts: list[pl.DataFrame], ctx: FinishContext) -> Finished:
    eff = efficiency_finish(parts)
    return Finished({"kernel_efficiency": records(eff, ctx.options["max_rows"])}, eff)


def _eff_findings(ctx: FindingsContext) -> list[Finding]:
    if moe_gemm_findings(ctx.results["moe_gemm"].value):  # the workload-derived verdict speaks instead
        return []
    return efficiency_candidates(ctx.result.value)


def _moe_finish(parts: list[pl.DataFrame], ctx: FinishContext) -> Finished:
    v = moe_gemm_finish(parts, ctx.meta)
    return Finished({"moe_gemm": v}, v)


KERNEL_EFFICIENCY = register(Analysis(
    "kernel_efficiency", ("kernel_efficiency",),
    ("rank", "kind", "ts_ns", "dur_ns", "tid", "name", "category", "launch_ts_ns", "launch_tid", "input_dims", "input_types"),
    lambda df, ctx: kernel_efficiency(df, ctx.meta, flag_below=ctx.options["flag_below"]), _eff_finish, _eff_findings,
    options={**keyword_defaults(kernel_efficiency, exclude=("gpu_name",)), "max_rows": 50}, findings_needs=("moe_gemm",), order=60))
MOE_GEMM = register(Analysis(
    "moe_gemm", ("moe_gemm",), ("rank", "kind", "dur_ns", "name", "category", "step_id", "tokens"),
    lambda df, ctx: moe_gemm_part(df, ctx.meta), _moe_finish,
    lambda ctx: [Finding("moe_gemm", t, w) for w, t in moe_gemm_findings(ctx.result.value)], order=70, findings_first=True))
