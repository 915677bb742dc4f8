"""Expert load imbalance: tokens per expert, max/mean per rank and per layer.

Source: the per-expert loop's GEMM sizes with recorded shapes (``input_dims``). Every MoE GEMM kernel (category
``moe_gemm``) is joined to the GEMM operator that launched it (same rank and thread, launch inside the op's CPU range,
as :mod:`tracekit.analysis.passes.efficiency` does); the loop's *input projection* — the MoE GEMM signature with the largest
K (= hidden size) — has one instance per expert that received tokens, with M = that expert's token count. A step with
T tokens routes T·k token-expert pairs per layer, so walking the step's input projections in launch order, the op
whose running sum of M starts at ``j·T·k`` opens layer j (exact when every layer routes T·k pairs; a step whose total
is not a whole number of layers is dropped). k comes from the capture metadata, else from the largest k for which the
pauses between input projections say how many layers a step has (attention runs between them).

Per (rank, layer): ``max_tokens``, ``mean_tokens`` (over all E experts when the metadata gives E, else over the
experts that received tokens: ``mean_basis``), ``max_over_mean`` (worst step), active experts. Grouped GEMMs do not
record their offsets, so their load is not in the trace: ``status`` says what is needed.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

import polars as pl

from tracekit.core import intervals as iv
from tracekit.analysis.passes.efficiency import GEMM_OPS
from tracekit.analysis.findings import Finding
from tracekit.analysis.registry import Analysis, FindingsContext, FinishContext, Finished, register
from tracekit.schema import TraceMeta

__all__ = ["expert_load_part", "expert_load_finish", "expert_load_finding"]


def _mk(dims: str | None) -> tuple[int, int] | None:
    """(M, K) of a GEMM op's first operand from its record_shapes string."""
    try:
        d = json.loads(dims or "null")
    except ValueError:
        return None
    if not isinstance(d, list) or not d or not isinstance(d[0], list) or len(d[0]) < 2:
        return None
    x = d[0]
    m = 1
    for v in x[:-1]:
        m *= int(v)
    return m, int(x[-1])


def expert_load_part(df: pl.DataFrame) -> pl.DataFrame:
    """Per rank: the input-projection GEMM instances of MoE GEMM kernels (``rank, step_id, ts, m, k, tokens``);
    an empty frame with a ``why`` column naming what is missing otherwise."""
    kind = pl.col("kind").cast(pl.String)
    ker = df.filter((kind == "kernel") & (pl.col("category").cast(pl.String) == "moe_gemm"))
    if ker.height == 0:
        return pl.DataFrame({"why": ["no_moe_gemm_kernels"]})
    ops = df.filter((kind == "cpu_op") & pl.col("input_dims").is_not_null() & pl.col("name").cast(pl.String).is_in(list(GEMM_OPS)))
    grouped = ker.filter(pl.col("name").cast(pl.String).str.contains("(?i)group|GroupProblemShape")).height > ker.height // 2
    if ops.height == 0:
        return pl.DataFrame({"why": ["grouped_no_offsets" if grouped else "no_shapes"]})
    ops = ops.select(pl.col("rank").cast(pl.Int64), "tid", pl.col("ts_ns").alias("start"), (pl.col("ts_ns") + pl.col("dur_ns")).alias("end"),
                     pl.col("name").cast(pl.String).alias("op"), "input_dims").with_row_index("op_id")
    k = ker.filter(pl.col("launch_ts_ns").is_not_null()).select(pl.col("rank").cast(pl.Int64), pl.col("launch_tid").alias("tid"),
                                                               "launch_ts_ns", "step_id")
    j = iv.covered_by(k, ops.select("rank", "tid", "start", "end", "op_id"), by=["rank", "tid"], at="launch_ts_ns", payload=["op_id"])
    used = j.filter(pl.col("op_id").is_not_null()).group_by("op_id").agg(pl.col("step_id").drop_nulls().first())
    inst = ops.join(used, on="op_id", how="inner")
    if inst.height == 0:
        return pl.DataFrame({"why": ["grouped_no_offsets" if grouped else "no_shapes"]})
    if inst["op"].str.contains("grouped_mm").any():
        return pl.DataFrame({"why": ["grouped_no_offsets"]})
    sig = inst.select("input_dims").unique()
    mk = [_mk(d) for d in sig["input_dims"].to_list()]
    sig = sig.with_columns(pl.Series("m", [v[0] if v else None for v in mk], dtype=pl.Int64),
                           pl.Series("k", [v[1] if v else None for v in mk], dtype=pl.Int64))
    inst = inst.join(sig, on="input_dims", how="left").filter(pl.col("m").is_not_null() & pl.col("step_id").is_not_null())
    # the input projection: the largest K among the rank's MoE GEMMs
    inst = inst.filter(pl.col("k") == pl.col("k").max().over("rank"))
    st = df.filter((kind == "step") & pl.col("tokens").is_not_null()).group_by(pl.col("rank").cast(pl.Int64), "step_id").agg(
        pl.col("tokens").max())
    return inst.join(st, on=["rank", "step_id"], how="inner").select("rank", "step_id", pl.col("start").alias("ts"), "m", "k", "tokens")


def _infer_top_k(t: pl.DataFrame, tot: pl.DataFrame) -> int | None:
    """k when the metadata lacks it: for each k that splits every step's pairs into whole layers, the layer boundaries
    it implies must fall on the step's long pauses (attention runs between MoE layers): the k whose boundaries'
    shortest pause is the longest relative to the median pause inside layers, and at least 2× it."""
    best: tuple[float, int] | None = None
    gaps = t.with_columns((pl.col("ts") - pl.col("ts").shift(1).over(["rank", "step_id"])).alias("gap"),
                          (pl.col("m").cum_sum().over(["rank", "step_id"]) - pl.col("m")).alias("before"))
    gaps = gaps.drop_nulls("gap")
    for k in range(1, 33):
        if not (tot["sum_m"] % (tot["tokens"] * k) == 0).all() or (tot["sum_m"] == tot["tokens"] * k).all():
            continue
        at = (pl.col("before") % (pl.col("tokens") * k) == 0) & (pl.col("before") > 0)
        b, nb = gaps.filter(at), gaps.filter(~at)
        if b.height == 0 or nb.height == 0:
            continue
        score = float(b["gap"].min()) / max(float(nb["gap"].median()), 1.0)  # type: ignore[arg-type]
        if score >= 2 and (best is None or score > best[0]):
            best = (score, k)
    return best[1] if best else None


def expert_load_finish(parts: list[pl.DataFrame], meta: TraceMeta | None) -> dict[str, Any]:
    """The ``expert_load`` section (module doc)."""
    have = [p for p in parts if p.height and "m" in p.columns]
    if not have:
        whys = {w for p in parts if "why" in p.columns for w in p["why"].to_list()}
        if "grouped_no_offsets" in whys:
            return {"status": "grouped_no_offsets", "needs": "grouped GEMM offsets (tokens per expert) are not in profiler traces: "
                    "record the router's expert counts (e.g. SGLang's expert distribution recorder) or profile the per-expert loop "
                    "with --record-shapes"}
        if "no_shapes" in whys:
            return {"status": "no_shapes", "needs": "record shapes in one short window (--record-shapes): the per-expert loop's "
                    "GEMM sizes are the tokens per expert"}
        return {"status": "no_moe_gemm_kernels"}
    model = (((meta or {}).get("capture") or {}).get("workload") or {}).get("model") or {}
    n_exp = int(model["n_experts"]) if model.get("n_experts") else None
    top_k = int(model["top_k"]) if model.get("top_k") else None
    t = pl.concat(have, how="vertical_relaxed").sort(["rank", "step_id", "ts"])
    tot = t.group_by("rank", "step_id").agg(pl.col("m").sum().alias("sum_m"), pl.col("tokens").first())
    if top_k is None:
        top_k = _infer_top_k(t, tot)
    if top_k is None:
        return {"status": "layers_unknown", "needs": "the model's top_k (capture metadata capture.workload.model)"}
    pairs = pl.col("tokens") * top_k
    t = t.join(tot.select("rank", "step_id", "sum_m"), on=["rank", "step_id"]).filter(pl.col("sum_m") % pairs == 0)
    t = t.with_columns(((pl.col("m").cum_sum().over(["rank", "step_id"]) - pl.col("m")) // pairs).alias("layer"))
    # sorted and maintain_order: the per-layer means below sum the steps in one order, so the figure is reproducible
    per = t.group_by("rank", "step_id", "layer", maintain_order=True).agg(
        pl.col("m").max().alias("max_tokens"), pl.len().alias("active"), pl.col("m").sum().alias("pairs"), pl.col("tokens").first())
    mean = (pl.col("pairs") / n_exp) if n_exp else (pl.col("pairs") / pl.col("active"))
    per = per.with_columns(mean.alias("mean_tokens")).with_columns((pl.col("max_tokens") / pl.col("mean_tokens")).alias("max_over_mean"))
    lay = per.group_by("rank", "layer", maintain_order=True).agg(
        pl.len().alias("steps"), pl.col("max_tokens").max(), pl.col("mean_tokens").mean(), pl.col("max_over_mean").max(),
        pl.col("active").mean().alias("active_experts_mean")).sort(["rank", "layer"])
    worst = per.sort(["max_over_mean", "rank", "step_id", "layer"], descending=[True, False, False, False]).row(0, named=True)
    return {"status": "ok", "source": "per-expert loop GEMM sizes (record_shapes)", "top_k": top_k, "n_experts": n_exp,
            "mean_basis": "all experts" if n_exp else "experts that received tokens",
            "layers": lay.to_dicts(), "worst": worst,
            "per_rank_max_over_mean": {str(r): float(v) for r, v in lay.group_by("rank").agg(pl.col("max_over_mean").max()).sort("rank").iter_rows()}}


def expert_load_finding(v: Mapping[str, Any]) -> str | None:
    """One sentence: the worst layer's max/mean, or what the trace lacks (only where MoE GEMMs ran)."""
    if v.get("status") == "ok":
        w = v["worst"]
        lay = ", ".join(f"L{r['layer']} {r['max_over_mean']:.1f}×" for r in v["layers"] if r["rank"] == w["rank"])
        return (f"Expert load: the busiest expert gets {w['max_over_mean']:.1f}× the mean ({w['max_tokens']} tokens vs "
                f"{w['mean_tokens']:.1f} over {v['mean_basis']}; rank {w['rank']}, layer {w['layer']}, step {w['step_id']}); "
                f"max/mean per layer on rank {w['rank']}: {lay}.")
    if v.get("status") in ("grouped_no_offsets", "no_shapes"):
        return f"Expert load imbalance is not in this trace: {v['needs']}."
    return None


# --- the ``expert_load`` analysis (tracekit.analysis.registry) ------------------------------------------------------

def _finish(parts: list[pl.DataFrame], ctx: FinishContext) -> Finished:
    v = expert_load_finish(parts, ctx.meta)
    return Finished({"expert_load": v}, v)


def _findings(ctx: FindingsContext) -> list[Finding]:
    s = expert_load_finding(ctx.result.value)
    return [Finding("expert_load", s, 0.6)] if s else []


ANALYSIS = register(Analysis(
    "expert_load", ("expert_load",),
    ("rank", "kind", "ts_ns", "dur_ns", "tid", "name", "category", "launch_ts_ns", "launch_tid", "step_id", "tokens", "input_dims"),
    lambda df, ctx: expert_load_part(df), _finish, _findings, order=80, findings_first=True))
