"""MoE structure without names: routers, expert loops and eager attention recognized from the launch pattern.

Name rules cannot tell an expert GEMM of a loop-based MoE (transformers' ``eager`` experts, a Python
loop of ``linear`` calls, ``batched_mm``'s ``bmm`` over gathered weights) from a dense GEMM, nor a
router's ``softmax``/``topk`` from any other. Their *order* tells. On each rank's GPU ops in launch
order (host order: one model forward is a sequence):

* **router** = a top-k kernel (``gatherTopK``, ``bitonicSort``/``radixSelect`` of ``topk``, any name
  with ``topk``) whose nearest preceding probability kernel (``softmax``/``sigmoid``, at most
  :data:`MAX_PROBS_TO_TOPK` ops before it and after any earlier top-k) itself follows a GEMM by at
  most :data:`MAX_GEMM_TO_PROBS` ops: the gate GEMM (and the GEMM run it ends, e.g. a split-K
  reduce), the probabilities and the top-k are ``moe_routing`` (family ``moe_routing.gate``).
  The DSA indexer's and a sampler's top-k have no GEMM -> softmax/sigmoid -> top-k chain.
* **MoE block** = from the router to the *last combine* before the next norm (a named norm kernel,
  or the ``MeanOps`` reduction of a decomposed RMSNorm) or the next router. Combine kernels are the
  ``index_add_`` of a per-expert loop (``indexFunc{Small,Large}Index``), ``scatter_add``/``index_put``,
  or the sum over the top-k (``sum_functor`` reduce). A router with no combine after it is no MoE block
  (a sampler's softmax -> top-k) and is left alone.
  Inside the block: GEMMs are ``moe_gemm`` (family ``moe_gemm.structure``), the activation
  (family ``elementwise.activation``) stays other_compute, copies/memsets stay memory, everything
  else (nonzero, index, gather, sort, histogram, masked_fill, the routing-weight multiply) is
  ``moe_routing`` (family ``moe_routing.dispatch``). A shared expert runs after the combine, so its
  GEMMs stay dense.
* **eager attention** = GEMM, at most :data:`MAX_ATTN_GAP` ops, ``softmax``, at most
  :data:`MAX_ATTN_GAP` ops, GEMM, no top-k among them (outside any router/MoE block): both GEMMs (QK^T and PV) and the
  softmax are ``attention`` (family ``attention.eager``).
* **sparse-attention indexer** (DeepSeek-V3.2 / GLM-5 DSA "lightning indexer", NSA-style top-k attention) =
  a top-k outside every MoE block whose next GEMM-or-attention op is an attention kernel (nothing but mask
  building between): the top-k picks the keys that attention reads. The GEMM chain just before the top-k
  (query-key scores, head weights, the weighted sum) is attention math (family ``attention.indexer``);
  the top-k and the mask building stay other_compute. A router's top-k is followed by expert GEMMs, a
  sampler's by the next step's projections, so neither matches.

Only ops whose category came from a name rule are touched (a context rule's attribution from
module ranges wins). Vectorized: cumulative counts and ``join_asof`` on op positions; regexes run on
the distinct names only.
"""

from __future__ import annotations

import polars as pl

from tracekit._frames import NAME_CODE, attach_rows, distinct_names, row_index

__all__ = ["COMBINE_REGEX", "NORM_ANCHOR_REGEX", "PROBS_REGEX", "TOPK_REGEX", "apply_moe_structure"]

TOPK_REGEX = r"(?i)topk|radixSelect"
PROBS_REGEX = r"(?i)softmax|sigmoid"
#: combine kernels: eager index_add_ (indexFunc*), scatter_add/index_put, the sum over the top-k; Inductor names
#: its fused kernels after the ops they hold (``triton_poi_fused_index_add_…``, ``triton_red_fused_…_sum_…``)
COMBINE_REGEX = (r"indexFunc(Small|Large)Index|scatter_add|index_put|sum_functor|func_wrapper_t<[^,]*, at::native::sum"
                 r"|^triton_\w*fused\w*(index_add|scatter_add)|^triton_(red|per)_fused\w*_sum")
#: layer boundaries: a named norm kernel, a decomposed RMSNorm's mean reduction, or Inductor's fused RMSNorm
NORM_ANCHOR_REGEX = r"MeanOps|(?i:rms_?norm|layer_?norm)|^triton_(red|per)_fused\w*(mean\w*rsqrt|rsqrt\w*mean)"
MAX_PROBS_TO_TOPK = 4
MAX_GEMM_TO_PROBS = 3
MAX_ATTN_GAP = 4
#: a sparse-attention indexer: its top-k at most this many ops before the attention it feeds (mask building between)
MAX_INDEXER_TO_ATTN = 24
#: ... and its key-scoring GEMMs within this many ops before the top-k
MAX_INDEXER_SPAN = 16

GPU_KINDS = ["kernel", "memcpy", "memset"]
_GEMM_CATS = ["dense_gemm"]


def _name_flags(df: pl.DataFrame, gpu: pl.Expr) -> pl.DataFrame:
    names = distinct_names(df, gpu)
    n = pl.col("name")
    # a sum-over-top-k reduce: torch's reduce_kernel with a sum functor (the func_wrapper lambda of sum_kernel_cuda)
    sum_reduce = n.str.contains(r"reduce_kernel") & n.str.contains(r"sum_functor|sum_kernel|func_wrapper_t") & ~n.str.contains(r"MeanOps|ArgMax|ArgMin|MaxOps|MinOps|NormOps|WelfordOps")
    return names.select(
        "_code",
        (n.str.contains(TOPK_REGEX)).alias("_topk"),
        (n.str.contains(PROBS_REGEX) & ~n.str.contains(TOPK_REGEX)).alias("_probs"),
        (n.str.contains(COMBINE_REGEX) | sum_reduce).alias("_combine"),
        (n.str.contains(NORM_ANCHOR_REGEX)).alias("_norm"),
        (n.str.contains(r"(?i)softmax")).alias("_softmax"),
        (n.str.contains(r"(?i)gemm|gemv|nvjet|cutlass|xmma|^Cijk_|splitKreduce")).alias("_gemmname"),
    )


def last_before(flag: str) -> pl.Expr:
    """Position (``_pos``) of the last op with ``flag`` strictly before this one."""
    return pl.when(pl.col(flag)).then(pl.col("_pos")).forward_fill().shift(1)


def next_after(flag: str) -> pl.Expr:
    """Position (``_pos``) of the next op with ``flag`` strictly after this one."""
    return pl.when(pl.col(flag)).then(pl.col("_pos")).backward_fill().shift(-1)


def apply_moe_structure(df: pl.DataFrame) -> pl.DataFrame:
    """Re-attribute GPU ops by the MoE / eager-attention launch pattern (module docstring); one rank."""
    gpu = pl.col("kind").is_in(GPU_KINDS)
    if not df.select(gpu.any()).item():
        return df
    d = row_index(df, "_row")
    by_name = ~pl.col("_fam").fill_null("").str.starts_with("ctx.")
    ops = _launch_order(d, _name_flags(df, gpu), gpu, by_name)
    upd: list[pl.DataFrame] = []
    blocks = _moe_blocks(ops)
    if blocks is None:  # no router at all
        blocks = pl.DataFrame(schema={"_start": pl.Int64, "_end": pl.Int64})
    else:
        upd.append(_block_updates(ops, blocks, by_name))
    # eager attention: GEMM .. softmax .. GEMM, outside the MoE blocks
    ops = ops.with_columns(next_after("_gemm").alias("_g_next"), next_after("_topk").alias("_k_next"))
    hit = _eager_attention(ops, blocks, by_name)
    if hit is not None:
        upd.append(hit.select("_row", pl.lit("attention").alias("_c"), pl.lit("attention.eager").alias("_f")))
    eager_pos = hit.select("_pos") if hit is not None else pl.DataFrame(schema={"_pos": pl.Int64})
    idx = _indexer_gemms(ops, blocks, eager_pos, by_name)
    if idx.height:
        upd.append(idx.select("_row", pl.lit("attention").alias("_c"), pl.lit("attention.indexer").alias("_f")))
    if not upd:
        return df
    u = pl.concat(upd, how="vertical_relaxed").unique("_row", keep="first")
    out = attach_rows(d, u, "_row")
    return out.with_columns(
        pl.coalesce(pl.col("_c").cast(pl.Categorical), pl.col("category").cast(pl.Categorical)).alias("category"),
        pl.coalesce(pl.col("_f").cast(pl.Categorical), pl.col("family").cast(pl.Categorical)).alias("family"),
    ).drop(["_row", "_c", "_f"])


def _launch_order(d: pl.DataFrame, flags: pl.DataFrame, gpu: pl.Expr, by_name: pl.Expr) -> pl.DataFrame:
    """The rank's GPU ops in launch order (``_pos``) with their name flags (kernels only), GEMM runs (a GEMM plus its
    split-K reduce: ``_run0``, the run's first position) and the last probability / top-k / GEMM op before each."""
    fam = pl.col("family").cast(pl.String)
    ops = (
        d.lazy().filter(gpu)
        .select("_row", NAME_CODE.alias("_code"), pl.col("kind").cast(pl.String).alias("_kind"),
                pl.col("category").cast(pl.String).alias("_cat"), fam.alias("_fam"),
                pl.coalesce("launch_ts_ns", "ts_ns").alias("_t"), "ts_ns")
        .collect()
        .join(flags, on="_code", how="left")
        .sort(["_t", "ts_ns", "_row"])
        .with_row_index("_pos")
        .with_columns(pl.col("_pos").cast(pl.Int64))
    )
    kernel = pl.col("_kind") == "kernel"
    ops = ops.with_columns(
        (kernel & pl.col("_topk").fill_null(False)).alias("_topk"),
        (kernel & pl.col("_probs").fill_null(False)).alias("_probs"),
        (kernel & pl.col("_combine").fill_null(False)).alias("_combine"),
        (kernel & pl.col("_norm").fill_null(False)).alias("_norm"),
        (kernel & pl.col("_softmax").fill_null(False)).alias("_softmax"),
        # a GEMM by its name rule, or one a context rule already re-attributed (e.g. the gate GEMM in a router range)
        (kernel & (pl.col("_cat").is_in(_GEMM_CATS) | (~by_name & pl.col("_gemmname").fill_null(False)))).alias("_gemm"),
    )
    run = (pl.col("_gemm") != pl.col("_gemm").shift(1)).fill_null(True).cum_sum()
    ops = ops.with_columns(run.alias("_run")).with_columns(pl.col("_pos").min().over("_run").alias("_run0"))
    return ops.with_columns(
        last_before("_probs").alias("_p_prev"),
        last_before("_topk").alias("_k_prev"),
        last_before("_gemm").alias("_g_prev"),
    )


def _moe_blocks(ops: pl.DataFrame) -> pl.DataFrame | None:
    """MoE blocks (``_start``, ``_end``, ``_topk_pos``): from a router's gate GEMM run (GEMM → probabilities →
    top-k within the limits) to the last combine before the next norm anchor or the next router; a router with no
    combine after it (a sampler's softmax → top-k) is not a block. None when no router is found at all."""
    pos = pl.col("_pos")
    # the probability kernel's own last GEMM (looked up at the probability kernel's position)
    at = ops.select(pos.alias("_p_prev"), pl.col("_g_prev").alias("_pg"))
    gate_run0 = ops.select(pos.alias("_pg"), pl.col("_run0").alias("_g0"))
    cand = ops.filter(pl.col("_topk")).join(at, on="_p_prev", how="left").join(gate_run0, on="_pg", how="left")
    routers = cand.filter(
        pl.col("_p_prev").is_not_null() & (pos - pl.col("_p_prev") <= MAX_PROBS_TO_TOPK)
        & (pl.col("_k_prev").is_null() | (pl.col("_k_prev") < pl.col("_p_prev")))
        & pl.col("_pg").is_not_null() & (pl.col("_p_prev") - pl.col("_pg") <= MAX_GEMM_TO_PROBS)
    ).select(pl.col("_g0").alias("_start"), pos.alias("_topk_pos"))
    if not routers.height:
        return None
    nxt_norm = ops.select(pos.alias("_topk_pos"), next_after("_norm").alias("_nn"))
    routers = routers.sort("_topk_pos").join(nxt_norm, on="_topk_pos", how="left").with_columns(
        pl.col("_start").shift(-1).alias("_next_router"),
    ).with_columns(
        pl.min_horizontal(pl.col("_nn").fill_null(ops.height), pl.col("_next_router").fill_null(ops.height)).alias("_limit")
    )
    comb = ops.filter(pl.col("_combine")).select(pos.alias("_cpos"))
    # the last combine before the limit: backward as-of on the limit - 1
    routers = routers.with_columns((pl.col("_limit") - 1).alias("_q")).sort("_q").join_asof(
        comb.sort("_cpos"), left_on="_q", right_on="_cpos", strategy="backward"
    ).with_columns(
        pl.when(pl.col("_cpos").is_not_null() & (pl.col("_cpos") > pl.col("_topk_pos"))).then(pl.col("_cpos"))
        .otherwise(pl.col("_topk_pos")).alias("_end")
    )
    routers = routers.filter(pl.col("_end") > pl.col("_topk_pos"))
    return routers.select("_start", "_end", "_topk_pos").sort("_start")


def _block_updates(ops: pl.DataFrame, blocks: pl.DataFrame, by_name: pl.Expr) -> pl.DataFrame:
    """New category / family (``_c``, ``_f``) of the kernels inside MoE blocks: the gate part is routing, GEMMs
    are MoE GEMMs, the rest dispatch (kernels a context rule attributed, activations, communication, memory and
    attention keep theirs)."""
    pos = pl.col("_pos")
    inb = ops.sort("_pos").join_asof(blocks, left_on="_pos", right_on="_start", strategy="backward").filter(
        pl.col("_end").is_not_null() & (pos <= pl.col("_end"))
    )
    gate_part = pos <= pl.col("_topk_pos")
    cat = (
        pl.when(pl.col("_kind") != "kernel").then(pl.lit(None, dtype=pl.String))
        .when(~by_name).then(pl.lit(None, dtype=pl.String))
        .when(gate_part).then(pl.lit("moe_routing"))
        .when(pl.col("_cat") == "moe_gemm").then(pl.lit(None, dtype=pl.String))
        .when(pl.col("_gemm")).then(pl.lit("moe_gemm"))
        .when(pl.col("_fam") == "elementwise.activation").then(pl.lit(None, dtype=pl.String))
        .when(pl.col("_cat").is_in(["communication", "memory", "attention", "moe_routing"])).then(pl.lit(None, dtype=pl.String))
        .otherwise(pl.lit("moe_routing"))
    )
    famx = (
        pl.when(gate_part).then(pl.lit("moe_routing.gate"))
        .when(pl.col("_gemm")).then(pl.lit("moe_gemm.structure"))
        .otherwise(pl.lit("moe_routing.dispatch"))
    )
    return inb.select("_row", cat.alias("_c"), famx.alias("_f")).filter(pl.col("_c").is_not_null())


def _eager_attention(ops: pl.DataFrame, blocks: pl.DataFrame, by_name: pl.Expr) -> pl.DataFrame | None:
    """The name-rule dense GEMMs / other ops of eager attention (GEMM .. softmax .. GEMM within the gaps, no top-k
    between them, outside the MoE blocks); None when the pattern does not occur."""
    pos = pl.col("_pos")
    att = ops.filter(
        pl.col("_softmax") & pl.col("_g_prev").is_not_null() & pl.col("_g_next").is_not_null()
        & (pos - pl.col("_g_prev") <= MAX_ATTN_GAP) & (pl.col("_g_next") - pos <= MAX_ATTN_GAP)
        # a top-k between them makes it a router or sampler, not attention
        & (pl.col("_k_prev").is_null() | (pl.col("_k_prev") < pl.col("_g_prev")))
        & (pl.col("_k_next").is_null() | (pl.col("_k_next") > pl.col("_g_next")))
    ).select(pl.col("_g_prev").alias("_a"), pos.alias("_s"), pl.col("_g_next").alias("_b"))
    if not att.height:
        return None
    if blocks.height:
        att = att.sort("_a").join_asof(blocks.select("_start", "_end"), left_on="_a", right_on="_start", strategy="backward").filter(
            pl.col("_end").is_null() | (pl.col("_a") > pl.col("_end"))).select("_a", "_s", "_b")
    pos_hit = pl.concat([att.select(pl.col(c).alias("_pos")) for c in ("_a", "_s", "_b")]).unique()
    return ops.join(pos_hit, on="_pos", how="inner").filter(by_name & pl.col("_cat").is_in(["dense_gemm", "other_compute"]))


def _indexer_gemms(ops: pl.DataFrame, blocks: pl.DataFrame, eager_pos: pl.DataFrame, by_name: pl.Expr) -> pl.DataFrame:
    """The key-scoring GEMMs of a sparse-attention indexer (module docstring): ``_row`` of each.

    A top-k outside every MoE block whose next GEMM-or-attention op is an attention op (a named attention
    kernel, or eager attention found above) at most :data:`MAX_INDEXER_TO_ATTN` ops later selects keys
    for that attention. The GEMM chain ending at most ``MAX_ATTN_GAP + 1`` ops before it (consecutive
    GEMMs at most ``MAX_ATTN_GAP`` ops apart, within :data:`MAX_INDEXER_SPAN` ops of the top-k) scored
    the keys: attention, not dense GEMMs.
    """
    pos = pl.col("_pos")
    empty = pl.DataFrame(schema={"_row": pl.UInt32})
    if not ops.select(pl.col("_topk").any()).item():
        return empty
    attn = (pl.col("_kind") == "kernel") & ((pl.col("_cat") == "attention") | pos.is_in(eager_pos["_pos"].implode()))
    o = ops.with_columns(attn.alias("_attn")).with_columns((pl.col("_gemm") & ~pl.col("_attn")).alias("_gx"))
    o = o.with_columns(next_after("_attn").alias("_a_next"), next_after("_gx").alias("_gx_next"),
                       last_before("_gx").alias("_gx_prev"))
    cand = o.filter(
        pl.col("_topk") & pl.col("_a_next").is_not_null() & (pl.col("_a_next") - pos <= MAX_INDEXER_TO_ATTN)
        & (pl.col("_gx_next").is_null() | (pl.col("_gx_next") > pl.col("_a_next")))
        & pl.col("_gx_prev").is_not_null() & (pos - pl.col("_gx_prev") <= MAX_ATTN_GAP + 1)
    ).select(pos.alias("_k"), pl.col("_gx_prev").alias("_g1"))
    if cand.height and blocks.height:  # a router's or dispatch's top-k is not an indexer's
        cand = cand.sort("_k").join_asof(blocks.select("_start", "_end").sort("_start"), left_on="_k", right_on="_start",
                                         strategy="backward").filter(pl.col("_end").is_null() | (pl.col("_k") > pl.col("_end")))
    if cand.height == 0:
        return empty
    # GEMM chains: a new chain where the gap to the previous (non-attention) GEMM exceeds MAX_ATTN_GAP ops
    g = o.filter(pl.col("_gx")).select("_pos", "_row", "_cat", "_fam").with_columns(
        ((pos - pos.shift(1)).fill_null(MAX_INDEXER_SPAN + 1) > MAX_ATTN_GAP + 1).cum_sum().alias("_chain"))
    chain_of = g.select(pos.alias("_g1"), "_chain")
    cand = cand.join(chain_of, on="_g1", how="inner").select("_k", "_chain")
    hit = g.join(cand, on="_chain", how="inner").filter((pos < pl.col("_k")) & (pl.col("_k") - pos <= MAX_INDEXER_SPAN))
    return hit.filter(by_name & (pl.col("_cat") == "dense_gemm")).select("_row").unique()
