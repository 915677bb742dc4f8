"""MoE structure without names: routers, expert loops and eager attention recognized from the launch pattern.

Name rules cannot tell an expert GEMM of a loop-based MoE (transformers' ``eager`` experts, a Python
loop of ``linear`` calls, ``batched_mm``'s ``bmm`` over gathered weights, one ``bmm`` over all experts)
from a dense GEMM, nor a router's ``softmax``/``topk`` from any other. Their *order* tells, and so does
the aten op that launched each kernel (a Kineto trace links them by ``External id``; a trace without CPU
ops, e.g. an nsys export, has only the order). On each rank's GPU ops in launch order (host order: one
model forward is a sequence):

* **router** = a top-k kernel (``gatherTopK``, ``radixSelect``, any name with ``topk``, or any kernel
  ``aten::topk`` launched), not preceded by another top-k since its gate GEMM, with its probabilities
  (``softmax``/``sigmoid``) on either side: *probabilities first* (gate GEMM, at most
  :data:`MAX_GEMM_TO_PROBS` ops, probabilities, at most :data:`MAX_PROBS_TO_TOPK` ops, top-k: Mixtral,
  Qwen, OLMoE, DeepSeek, GLM) or *top-k first* (gate GEMM, at most :data:`MAX_GEMM_TO_PROBS` ops, top-k,
  then the probabilities over the chosen experts before any other GEMM: GPT-OSS, Granite, Llama 4). The gate GEMM is the one GEMM op before it (a split-K GEMM and its reduce, one aten
  op); a GEMM right before it that another op launched (a shared expert's down projection) stays dense.
  The DSA indexer's and a sampler's top-k have no GEMM -> probabilities -> top-k chain around them.
* **MoE block** = from the router to the *last combine* before the next norm (a named norm kernel,
  or the ``MeanOps`` reduction of a decomposed RMSNorm) or the next router. Combine kernels are the
  ``index_add_`` of a per-expert loop (``indexFunc{Small,Large}Index``), ``scatter_add``/``index_put``,
  or the sum over the top-k (``sum_functor`` reduce). A router with no combine after it is no MoE block
  (a sampler's softmax -> top-k) and is left alone.
  A block *loops over experts* when what every per-expert loop shares is there: a host sync after the
  top-k (``nonzero``/``.item()`` read back to the host: a device-to-host copy) or at least two combines
  each fed by a GEMM since the one before. Inside the block: GEMMs are ``moe_gemm`` (family
  ``moe_gemm.structure``) when the block loops, when a batched or grouped op launched them
  (``bmm``, ``baddbmm``, ``_grouped_mm``), or by anything but a plain GEMM op (no launching op in the
  trace, a compiled region, a graph replay); a plain
  ``mm``/``addmm``/``linear`` GEMM in a block that does not loop is a shared expert or a projection beside
  the experts (Llama 4's shared expert runs between the experts and their combine): it stays dense_gemm,
  family :data:`BLOCK_DENSE_FAMILY`, and counts in the MoE range of ``moe_detection`` (docs/breakdown.md).
  A GEMM with a fused or a separate bias, an interleaved gate_up or a clamp in the loop is an expert GEMM
  like any other: the rule reads positions, not what sits between them.
  The activation (family ``elementwise.activation``, or launched by ``aten::silu``/``gelu``/``sigmoid``/...)
  stays other_compute, copies/memsets stay memory, everything else (nonzero, index, gather, sort,
  histogram, masked_fill, the bias add, the clamps, the routing-weight multiply) is ``moe_routing``
  (family ``moe_routing.dispatch``). A shared expert that runs before the router or after the combine
  stays dense.
* **eager attention** = ``softmax`` (by name or launched by ``aten::_softmax``) between its nearest GEMMs
  (QK^T before, PV after), with no top-k and no norm between them, outside any MoE block: both GEMMs and
  the softmax are ``attention`` (family ``attention.eager``). When both GEMMs were launched by batched
  matmuls (``bmm``/``baddbmm``; a projection is an ``mm``/``addmm``), any ops may sit between them and the
  softmax (masks, attention sinks concatenated and max-subtracted, a copy of the sliced probabilities): the
  nearest GEMMs and the absent top-k and norm bound it; when a launching op is unknown (an nsys trace, a
  graph replay), at most :data:`MAX_ATTN_GAP` ops on each side.
* **unrouted loop** (saying when unsure): between two norms, outside every MoE block, a host sync and at least two
  combines each fed by a GEMM: shaped like a per-expert loop, but no router precedes it. Its GEMMs stay dense_gemm
  with family :data:`LOOP_DENSE_FAMILY`, and count in the MoE range of ``moe_detection``.
* **sparse-attention indexer** (DeepSeek-V3.2 / GLM-5 DSA "lightning indexer", NSA-style top-k attention) =
  a top-k outside every MoE block whose next GEMM-or-attention op is an attention kernel (nothing but mask
  building between): the top-k picks the keys that attention reads. The GEMM chain just before the top-k
  (query-key scores, head weights, the weighted sum) is attention math (family ``attention.indexer``);
  the top-k and the mask building stay other_compute. A router's top-k is followed by expert GEMMs, a
  sampler's by the next step's projections, so neither matches.

Only ops whose category came from a name rule are touched (a context rule's attribution from
module ranges, ``ctx.*`` families, wins: with module context the module decides). Vectorized:
cumulative counts and ``join_asof`` on op positions; regexes run on the distinct names only.
"""

from __future__ import annotations

import polars as pl

from tracekit._frames import NAME_CODE, attach_rows, distinct_names, row_index

__all__ = ["BLOCK_DENSE_FAMILY", "LOOP_DENSE_FAMILY", "COMBINE_REGEX", "NORM_ANCHOR_REGEX", "PROBS_REGEX", "TOPK_REGEX", "apply_moe_structure"]

TOPK_REGEX = r"(?i)topk|radixSelect"
PROBS_REGEX = r"(?i)softmax|sigmoid"
#: combine kernels: eager index_add_ (indexFunc*), scatter_add/index_put, the sum over the top-k; Inductor names
#: its fused kernels after the ops they hold (``triton_poi_fused_index_add_…``, ``triton_red_fused_…_sum_…``)
COMBINE_REGEX = (r"indexFunc(Small|Large)Index|scatter_add|index_put|sum_functor|func_wrapper_t<[^,]*, at::native::sum"
                 r"|^triton_\w*fused\w*(index_add|scatter_add)|^triton_(red|per)_fused\w*_sum")
#: layer boundaries: a named norm kernel, a decomposed RMSNorm's mean reduction, or Inductor's fused RMSNorm
NORM_ANCHOR_REGEX = r"MeanOps|(?i:rms_?norm|layer_?norm)|^triton_(red|per)_fused\w*(mean\w*rsqrt|rsqrt\w*mean)"
#: launching aten ops (``External id``): a top-k, an activation, a softmax, a batched/grouped GEMM
TOPK_OPS = r"^aten::topk$"
ACT_OPS = r"^aten::(silu|gelu|relu|sigmoid|tanh|mish|hardswish|glu|silu_|gelu_|relu_|sigmoid_)$"
SOFTMAX_OPS = r"^aten::(_softmax|softmax|_safe_softmax)$"
BATCHED_GEMM_OPS = r"^aten::(bmm|baddbmm|_grouped_mm|grouped_mm|_scaled_grouped_mm)$"
#: a plain 2-D GEMM op (a projection's): the one launching op that makes a GEMM of a non-looping block dense
FLAT_GEMM_OPS = r"^aten::(mm|addmm|linear|matmul|addmv|mv|_scaled_mm)$"
#: a GEMM inside an MoE block that the launch pattern does not make an expert GEMM (category dense_gemm)
BLOCK_DENSE_FAMILY = "gemm.moe_block"
#: a GEMM of a loop shaped like a per-expert loop that no router precedes (category dense_gemm)
LOOP_DENSE_FAMILY = "gemm.moe_loop"
MAX_PROBS_TO_TOPK = 4
#: the gate GEMM to the first op that reads its logits: the probabilities, or the top-k of a top-k-first router
MAX_GEMM_TO_PROBS = 3
#: eager attention when a GEMM's launching op is unknown (between two batched matmuls no count applies)
MAX_ATTN_GAP = 4
#: a sparse-attention indexer: its top-k at most this many ops before the attention it feeds (mask building between)
MAX_INDEXER_TO_ATTN = 24
#: ... and its key-scoring GEMMs within this many ops before the top-k
MAX_INDEXER_SPAN = 16
#: ... at most this many ops apart in their chain (and the last one at most this + 1 before the top-k)
MAX_INDEXER_GAP = 4

GPU_KINDS = ["kernel", "memcpy", "memset"]
_GEMM_CATS = ["dense_gemm"]
_POS = pl.col("_pos")


def _name_flags(df: pl.DataFrame, gpu: pl.Expr) -> pl.DataFrame:
    names = distinct_names(df, gpu)
    n = pl.col("name")
    # a sum-over-top-k reduce: torch's reduce_kernel with a sum functor (the func_wrapper lambda of sum_kernel_cuda)
    sum_reduce = n.str.contains(r"reduce_kernel") & n.str.contains(r"sum_functor|sum_kernel|func_wrapper_t") & ~n.str.contains(r"MeanOps|ArgMax|ArgMin|MaxOps|MinOps|NormOps|WelfordOps")
    return names.select(
        "_code",
        (n.str.contains(TOPK_REGEX)).alias("_topk_n"),
        (n.str.contains(PROBS_REGEX) & ~n.str.contains(TOPK_REGEX)).alias("_probs_n"),
        (n.str.contains(COMBINE_REGEX) | sum_reduce).alias("_combine"),
        (n.str.contains(NORM_ANCHOR_REGEX)).alias("_norm"),
        (n.str.contains(r"(?i)softmax")).alias("_softmax_n"),
        (n.str.contains(r"(?i)gemm|gemv|nvjet|cutlass|xmma|^Cijk_|splitKreduce")).alias("_gemmname"),
        (n.str.contains(r"(?i)splitKreduce")).alias("_reduce"),
    )


def _launch_ops(df: pl.DataFrame, ops: pl.DataFrame) -> pl.DataFrame:
    """``_op``: the aten op that launched each GPU op (its ``External id`` on a ``cpu_op`` row), null when unknown."""
    if "external_id" not in df.columns:
        return ops.with_columns(pl.lit(None, dtype=pl.String).alias("_op"))
    cpu = (df.lazy().filter((pl.col("kind") == "cpu_op") & pl.col("external_id").is_not_null())
           .select(pl.col("external_id").alias("_xid"), pl.col("name").cast(pl.String).alias("_op"))
           .unique("_xid", keep="first").collect())
    return ops.join(cpu, on="_xid", how="left", maintain_order="left")


def last_before(flag: str) -> pl.Expr:
    """Position (``_pos``) of the last op with ``flag`` strictly before this one."""
    return pl.when(pl.col(flag)).then(_POS).forward_fill().shift(1)


def next_after(flag: str) -> pl.Expr:
    """Position (``_pos``) of the next op with ``flag`` strictly after this one."""
    return pl.when(pl.col(flag)).then(_POS).backward_fill().shift(-1)


def _ops_frame(df: pl.DataFrame, gpu: pl.Expr) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The rank's GPU ops in launch order with their flags (``_pos`` = position), and ``df`` with ``_row``."""
    d = row_index(df, "_row")
    xid = pl.col("external_id") if "external_id" in df.columns else pl.lit(None, dtype=pl.Int64)
    if "graph_id" in df.columns:  # a CUDA graph's kernels share their replay's External id: no launching op each
        xid = pl.when(pl.col("graph_id").is_null()).then(xid)
    mk = pl.col("memcpy_kind").cast(pl.String) if "memcpy_kind" in df.columns else pl.lit(None, dtype=pl.String)
    ops = (
        d.lazy().filter(gpu)
        .select("_row", NAME_CODE.alias("_code"), pl.col("kind").cast(pl.String).alias("_kind"),
                pl.col("category").cast(pl.String).alias("_cat"), pl.col("family").cast(pl.String).alias("_fam"),
                pl.coalesce("launch_ts_ns", "ts_ns").alias("_t"), "ts_ns", xid.alias("_xid"), mk.alias("_mk"))
        .collect()
        .join(_name_flags(df, gpu), on="_code", how="left")
        .sort(["_t", "ts_ns", "_row"])
        .with_row_index("_pos")
        .with_columns(_POS.cast(pl.Int64))
    )
    ops = _launch_ops(df, ops)
    kernel = pl.col("_kind") == "kernel"
    op = pl.col("_op").fill_null("")
    by_name = ~pl.col("_fam").fill_null("").str.starts_with("ctx.")
    ops = ops.with_columns(
        (kernel & (pl.col("_topk_n").fill_null(False) | op.str.contains(TOPK_OPS))).alias("_topk"),
        (kernel & pl.col("_probs_n").fill_null(False)).alias("_probs"),
        (kernel & pl.col("_combine").fill_null(False)).alias("_combine"),
        (kernel & pl.col("_norm").fill_null(False)).alias("_norm"),
        (kernel & (pl.col("_softmax_n").fill_null(False) | op.str.contains(SOFTMAX_OPS))).alias("_softmax"),
        # a GEMM by its name rule, or one a context rule already re-attributed (e.g. the gate GEMM in a router range)
        (kernel & (pl.col("_cat").is_in(_GEMM_CATS) | (~by_name & pl.col("_gemmname").fill_null(False)))).alias("_gemm"),
        (kernel & ((pl.col("_fam") == "elementwise.activation") | op.str.contains(ACT_OPS))).alias("_act"),
        op.str.contains(BATCHED_GEMM_OPS).alias("_batched"),
        op.str.contains(FLAT_GEMM_OPS).alias("_flat"),
        ((pl.col("_kind") == "memcpy") & (pl.col("_mk") == "DtoH")).alias("_sync"),
        by_name.alias("_byname"),
    )
    # the GEMM op each GEMM kernel belongs to: its aten GEMM op (not a compiled region or graph replay that
    # launched many), else the GEMM before a split-K reduce
    gkey = pl.when(pl.col("_batched") | pl.col("_flat")).then(pl.col("_xid")).otherwise(
        pl.when(pl.col("_gemm") & ~pl.col("_reduce").fill_null(False)).then(-_POS - 1).forward_fill())
    ops = ops.with_columns(pl.when(pl.col("_gemm")).then(gkey).alias("_gkey"))
    ops = ops.with_columns(pl.when(pl.col("_gemm")).then(_POS.min().over("_gkey")).alias("_g0"))
    return ops.with_columns(last_before("_probs").alias("_p_prev"), last_before("_topk").alias("_k_prev"),
                            last_before("_gemm").alias("_g_prev"), next_after("_gemm").alias("_g_next"),
                            next_after("_topk").alias("_k_next"), next_after("_probs").alias("_p_next"),
                            last_before("_norm").alias("_n_prev"), next_after("_norm").alias("_n_next")), d


def _routers(ops: pl.DataFrame) -> pl.DataFrame:
    """``_start`` (the gate GEMM op's first kernel) and ``_topk_pos`` of each router (module docstring)."""
    at = ops.select(_POS.alias("_p_prev"), pl.col("_g_prev").alias("_pg"))
    g0 = ops.select(_POS.alias("_gg"), pl.col("_g0").alias("_gs"))
    cand = ops.filter(pl.col("_topk")).join(at, on="_p_prev", how="left")
    k_prev = pl.col("_k_prev")
    probs_first = (
        pl.col("_p_prev").is_not_null() & (_POS - pl.col("_p_prev") <= MAX_PROBS_TO_TOPK)
        & (k_prev.is_null() | (k_prev < pl.col("_p_prev")))
        & pl.col("_pg").is_not_null() & (pl.col("_p_prev") - pl.col("_pg") <= MAX_GEMM_TO_PROBS)
    )
    topk_first = (
        pl.col("_g_prev").is_not_null() & (_POS - pl.col("_g_prev") <= MAX_GEMM_TO_PROBS)
        & (k_prev.is_null() | (k_prev < pl.col("_g_prev")))
        & pl.col("_p_next").is_not_null()
        & (pl.col("_g_next").is_null() | (pl.col("_g_next") > pl.col("_p_next")))
    )
    hit = cand.filter(probs_first | topk_first).with_columns(
        pl.when(probs_first).then(pl.col("_pg")).otherwise(pl.col("_g_prev")).alias("_gg"))
    return hit.join(g0, on="_gg", how="left").select(pl.col("_gs").alias("_start"), _POS.alias("_topk_pos")).sort("_topk_pos")


def _blocks(ops: pl.DataFrame, routers: pl.DataFrame) -> pl.DataFrame:
    """MoE blocks ``_start``, ``_end``, ``_topk_pos``, ``_loop`` (module docstring): router to its last combine."""
    nxt_norm = ops.select(_POS.alias("_topk_pos"), next_after("_norm").alias("_nn"))
    r = routers.join(nxt_norm, on="_topk_pos", how="left").with_columns(
        pl.col("_start").shift(-1).alias("_next_router")).with_columns(
        pl.min_horizontal(pl.col("_nn").fill_null(ops.height), pl.col("_next_router").fill_null(ops.height)).alias("_limit"))
    comb = ops.filter(pl.col("_combine")).select(_POS.alias("_cpos"))
    # the last combine before the limit: backward as-of on the limit - 1
    r = r.with_columns((pl.col("_limit") - 1).alias("_q")).sort("_q").join_asof(
        comb.sort("_cpos"), left_on="_q", right_on="_cpos", strategy="backward")
    # a router with no combine after it is not an MoE block (e.g. a sampler's softmax -> top-k)
    r = r.filter(pl.col("_cpos").is_not_null() & (pl.col("_cpos") > pl.col("_topk_pos")))
    blocks = r.select("_start", pl.col("_cpos").alias("_end"), "_topk_pos").sort("_start")
    if blocks.height == 0:
        return blocks.with_columns(pl.lit(False).alias("_loop"))
    inb = _in_blocks(ops, blocks)
    after = _POS > pl.col("_topk_pos")
    fed = pl.col("_combine") & (pl.col("_g_prev") > pl.max_horizontal(last_before("_combine"), pl.col("_topk_pos")))
    loop = inb.sort("_pos").with_columns(fed.over("_start").alias("_fed")).group_by("_start").agg(
        ((pl.col("_sync") & after).any() | ((pl.col("_fed") & after).sum() >= 2)).alias("_loop"))
    return blocks.join(loop, on="_start", how="left").with_columns(pl.col("_loop").fill_null(False)).sort("_start")


def _in_blocks(ops: pl.DataFrame, blocks: pl.DataFrame) -> pl.DataFrame:
    """The ops inside a block, with the block's columns."""
    return ops.sort("_pos").join_asof(blocks.sort("_start"), left_on="_pos", right_on="_start", strategy="backward").filter(
        pl.col("_end").is_not_null() & (_POS <= pl.col("_end")))


def _block_updates(ops: pl.DataFrame, blocks: pl.DataFrame) -> pl.DataFrame:
    """New ``_c``/``_f`` of the ops inside the MoE blocks (only ops a name rule categorized)."""
    inb = _in_blocks(ops, blocks)
    gate = _POS <= pl.col("_topk_pos")
    expert_gemm = pl.col("_gemm") & (pl.col("_loop") | ~pl.col("_flat"))
    none = pl.lit(None, dtype=pl.String)
    cat = (
        pl.when(pl.col("_kind") != "kernel").then(none)
        .when(~pl.col("_byname")).then(none)
        .when(gate).then(pl.lit("moe_routing"))
        .when(pl.col("_cat") == "moe_gemm").then(none)
        .when(expert_gemm).then(pl.lit("moe_gemm"))
        .when(pl.col("_gemm")).then(pl.lit("dense_gemm"))
        .when(pl.col("_act")).then(none)
        .when(pl.col("_cat").is_in(["communication", "memory", "attention", "moe_routing"])).then(none)
        .otherwise(pl.lit("moe_routing"))
    )
    fam = (
        pl.when(gate).then(pl.lit("moe_routing.gate"))
        .when(expert_gemm).then(pl.lit("moe_gemm.structure"))
        .when(pl.col("_gemm")).then(pl.lit(BLOCK_DENSE_FAMILY))
        .otherwise(pl.lit("moe_routing.dispatch"))
    )
    return inb.select("_row", cat.alias("_c"), fam.alias("_f")).filter(pl.col("_c").is_not_null())


def _outside(ops: pl.DataFrame, blocks: pl.DataFrame) -> pl.DataFrame:
    """The ops outside every MoE block."""
    if blocks.height == 0:
        return ops
    j = ops.sort("_pos").join_asof(blocks.select("_start", "_end").sort("_start"), left_on="_pos", right_on="_start", strategy="backward")
    return j.filter(pl.col("_end").is_null() | (_POS > pl.col("_end"))).drop(["_start", "_end"])


def _unrouted_loops(ops: pl.DataFrame, blocks: pl.DataFrame) -> pl.DataFrame:
    """``_row`` of the dense GEMMs of loops shaped like a per-expert loop (between two norms: a host sync and at least
    two combines each fed by a GEMM) that no router precedes: left dense, family :data:`LOOP_DENSE_FAMILY`."""
    o = _outside(ops, blocks).with_columns(pl.col("_norm").cum_sum().alias("_seg"))
    fed = pl.col("_combine") & pl.col("_g_prev").is_not_null() & (pl.col("_g_prev") > last_before("_combine").fill_null(-1)) & (
        pl.col("_g_prev") > pl.col("_n_prev").fill_null(-1))
    o = o.with_columns(fed.alias("_fed"))
    segs = o.group_by("_seg").agg(pl.col("_fed").sum().alias("_nf"), pl.col("_sync").any().alias("_s"),
                                  _POS.filter(pl.col("_fed")).max().alias("_last")).filter((pl.col("_nf") >= 2) & pl.col("_s"))
    if segs.height == 0:
        return pl.DataFrame(schema={"_row": pl.UInt32})
    hit = o.join(segs, on="_seg", how="inner").filter(
        pl.col("_gemm") & pl.col("_byname") & (pl.col("_cat") == "dense_gemm") & (_POS < pl.col("_last")))
    return hit.select("_row")


def _eager_attention(ops: pl.DataFrame, blocks: pl.DataFrame) -> pl.DataFrame:
    """Positions ``_pos`` of eager attention's QK^T GEMM, softmax and PV GEMM outside the MoE blocks."""
    batched = ops.select(_POS.alias("_g"), pl.col("_batched").alias("_b"))
    s = ops.filter(pl.col("_softmax") & pl.col("_g_prev").is_not_null() & pl.col("_g_next").is_not_null())
    s = s.join(batched.rename({"_g": "_g_prev", "_b": "_b1"}), on="_g_prev", how="left").join(
        batched.rename({"_g": "_g_next", "_b": "_b2"}), on="_g_next", how="left")
    gap = pl.when(pl.col("_b1") & pl.col("_b2")).then(pl.lit(None, dtype=pl.Int64)).otherwise(MAX_ATTN_GAP)
    att = s.filter(
        ((_POS - pl.col("_g_prev") <= gap) & (pl.col("_g_next") - _POS <= gap)).fill_null(True)
        # a top-k between them makes it a router or sampler, a norm a layer boundary: not attention
        & (pl.col("_k_prev").is_null() | (pl.col("_k_prev") < pl.col("_g_prev")))
        & (pl.col("_k_next").is_null() | (pl.col("_k_next") > pl.col("_g_next")))
        & (pl.col("_n_prev").is_null() | (pl.col("_n_prev") < pl.col("_g_prev")))
        & (pl.col("_n_next").is_null() | (pl.col("_n_next") > pl.col("_g_next")))
    ).select(pl.col("_g_prev").alias("_a"), _POS.alias("_s"), pl.col("_g_next").alias("_b"))
    if att.height and blocks.height:
        att = att.sort("_a").join_asof(blocks.select("_start", "_end"), left_on="_a", right_on="_start", strategy="backward").filter(
            pl.col("_end").is_null() | (pl.col("_a") > pl.col("_end"))).select("_a", "_s", "_b")
    return pl.concat([att.select(pl.col(c).alias("_pos")) for c in ("_a", "_s", "_b")]).unique()


def apply_moe_structure(df: pl.DataFrame) -> pl.DataFrame:
    """Re-attribute GPU ops by the MoE / eager-attention launch pattern (module docstring); one rank."""
    gpu = pl.col("kind").is_in(GPU_KINDS)
    if not df.select(gpu.any()).item():
        return df
    ops, d = _ops_frame(df, gpu)
    upd: list[pl.DataFrame] = []
    routers = _routers(ops)
    blocks = _blocks(ops, routers) if routers.height else pl.DataFrame(
        schema={"_start": pl.Int64, "_end": pl.Int64, "_topk_pos": pl.Int64, "_loop": pl.Boolean})
    if blocks.height:
        upd.append(_block_updates(ops, blocks))
    pos_hit = _eager_attention(ops, blocks)
    hit = ops.join(pos_hit, on="_pos", how="inner").filter(pl.col("_byname") & pl.col("_cat").is_in(["dense_gemm", "other_compute"]))
    if hit.height:
        upd.append(hit.select("_row", pl.lit("attention").alias("_c"), pl.lit("attention.eager").alias("_f")))
    idx = _indexer_gemms(ops, blocks, hit.select("_pos"))
    if idx.height:
        upd.append(idx.select("_row", pl.lit("attention").alias("_c"), pl.lit("attention.indexer").alias("_f")))
    loops = _unrouted_loops(ops, blocks)
    if loops.height:
        upd.append(loops.select("_row", pl.lit("dense_gemm").alias("_c"), pl.lit(LOOP_DENSE_FAMILY).alias("_f")))
    if not upd:
        return df
    u = pl.concat(upd, how="vertical_relaxed").unique("_row", keep="first")
    out = attach_rows(d, u, "_row")
    return out.with_columns(
        pl.coalesce(pl.col("_c").cast(pl.Categorical), pl.col("category").cast(pl.Categorical)).alias("category"),
        pl.coalesce(pl.col("_f").cast(pl.Categorical), pl.col("family").cast(pl.Categorical)).alias("family"),
    ).drop(["_row", "_c", "_f"])


def _indexer_gemms(ops: pl.DataFrame, blocks: pl.DataFrame, eager_pos: pl.DataFrame) -> pl.DataFrame:
    """The key-scoring GEMMs of a sparse-attention indexer (module docstring): ``_row`` of each.

    A top-k outside every MoE block whose next GEMM-or-attention op is an attention op (a named attention
    kernel, or eager attention found above) at most :data:`MAX_INDEXER_TO_ATTN` ops later selects keys
    for that attention. The GEMM chain ending at most ``MAX_INDEXER_GAP + 1`` ops before it (consecutive
    GEMMs at most :data:`MAX_INDEXER_GAP` ops apart, within :data:`MAX_INDEXER_SPAN` ops of the top-k) scored
    the keys: attention, not dense GEMMs.
    """
    empty = pl.DataFrame(schema={"_row": pl.UInt32})
    if not ops.select(pl.col("_topk").any()).item():
        return empty
    attn = (pl.col("_kind") == "kernel") & ((pl.col("_cat") == "attention") | _POS.is_in(eager_pos["_pos"].implode()))
    o = ops.with_columns(attn.alias("_attn")).with_columns((pl.col("_gemm") & ~pl.col("_attn")).alias("_gx"))
    o = o.with_columns(next_after("_attn").alias("_a_next"), next_after("_gx").alias("_gx_next"),
                       last_before("_gx").alias("_gx_prev"))
    cand = o.filter(
        pl.col("_topk") & pl.col("_a_next").is_not_null() & (pl.col("_a_next") - _POS <= MAX_INDEXER_TO_ATTN)
        & (pl.col("_gx_next").is_null() | (pl.col("_gx_next") > pl.col("_a_next")))
        & pl.col("_gx_prev").is_not_null() & (_POS - pl.col("_gx_prev") <= MAX_INDEXER_GAP + 1)
    ).select(_POS.alias("_k"), pl.col("_gx_prev").alias("_g1"))
    if cand.height and blocks.height:  # a router's or dispatch's top-k is not an indexer's
        cand = cand.sort("_k").join_asof(blocks.select("_start", "_end").sort("_start"), left_on="_k", right_on="_start",
                                         strategy="backward").filter(pl.col("_end").is_null() | (pl.col("_k") > pl.col("_end")))
    if cand.height == 0:
        return empty
    # GEMM chains: a new chain where the gap to the previous (non-attention) GEMM exceeds MAX_INDEXER_GAP ops
    g = o.filter(pl.col("_gx")).select("_pos", "_row", "_cat", "_byname").with_columns(
        ((_POS - _POS.shift(1)).fill_null(MAX_INDEXER_SPAN + 1) > MAX_INDEXER_GAP + 1).cum_sum().alias("_chain"))
    chain_of = g.select(_POS.alias("_g1"), "_chain")
    cand = cand.join(chain_of, on="_g1", how="inner").select("_k", "_chain")
    hit = g.join(cand, on="_chain", how="inner").filter((_POS < pl.col("_k")) & (pl.col("_k") - _POS <= MAX_INDEXER_SPAN))
    return hit.filter(pl.col("_byname") & (pl.col("_cat") == "dense_gemm")).select("_row").unique()
