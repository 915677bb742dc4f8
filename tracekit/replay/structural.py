"""Structural what-ifs: a change of the program's structure predicted from one trace (``grouped-experts``).

**MoE blocks** (:func:`moe_blocks`): per (rank, step) the GPU ops in launch order are cut at attention,
dense-GEMM and communication ops (the layer's other work); in each piece, the ops from its first to its last MoE
op (``moe_routing``/``moe_gemm``) are one MoE block. A block is a **per-expert loop** when it holds at least
:data:`LOOP_MIN_GEMMS` expert GEMM kernels and no grouped GEMM (family ``*grouped*``); ``syncs`` counts the host
syncs the launching thread made inside it (a host-synced loop: ``.tolist()``/``nonzero`` of the expert counts).

**Per-expert loop → grouped experts** (``grouped-experts``), per loop block, assuming:

* *host*: the grouped implementation issues :data:`GROUPED_BLOCK_OPS` launches per MoE block (the median
  measured in the corpus' grouped_mm traces, ``tests/replay/truth/grouped_cost.py``). The block's first that many
  launches keep their host calls and gaps (the framework's own cost per launch, as recorded and calibrated); every
  later host call of the block and the gaps before them go, and the gap after the block (the loop's epilogue)
  becomes the kept calls' median gap; so do all host syncs inside the block (a grouped implementation reads no
  expert counts back);
* *GPU*: the loop's expert GEMMs become two grouped GEMMs (gate/up and down) of
  ``GROUPED_NS_PER_EXPERT × experts + weight bytes / GROUPED_BYTES_PER_S`` each (fitted on the corpus' eager and
  grouped_mm pairs of the same models: experts = the loop's GEMMs / 2, weight bytes from the config), placed on
  the block's first two kept expert-GEMM kernels; the weight bytes are the loop GEMMs' own (record_shapes;
  :mod:`tracekit.replay.shapes`). Without recorded shapes the grouped GEMM time is the loop's GEMM kernel time ×
  :data:`GROUPED_TIME_RATIO` (the corpus median; noted). The other kept ops keep their durations (dispatch and
  combine kernels of about the same size); later ops of the block take no time.

It does not model a different routing (which experts get tokens) or kernels the grouped path adds beyond the
count. A trace without a per-expert loop cannot express this change: :class:`~tracekit.UsageError`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from tracekit._errors import UsageError
from tracekit.core.blocking import GRAPH_LAUNCH_CALLS
from tracekit.replay.graph import ET_CPU, ET_SYNC_SELF, ET_SYNC_WAIT, VK_CPU, ReplayGraph
from tracekit.replay.simulate import SimInputs

__all__ = ["GROUPED_BLOCK_OPS", "GROUPED_BYTES_PER_S", "GROUPED_NS_PER_EXPERT", "GROUPED_TIME_RATIO", "LOOP_MIN_GEMMS",
           "MoEBlocks", "Structure", "grouped_experts_edit", "moe_blocks", "structure"]

#: expert GEMM kernels in one MoE block from which it is a per-expert loop (a grouped block has 2-4)
LOOP_MIN_GEMMS = 8
#: launches per MoE block of a grouped implementation (corpus median; tests/replay/truth/grouped_cost.py)
GROUPED_BLOCK_OPS = 37
#: grouped GEMM kernel cost: per expert with tokens, and the weight bytes' rate (corpus fit, same script)
GROUPED_NS_PER_EXPERT = 190.0
GROUPED_BYTES_PER_S = 4.27e12
#: without recorded shapes: grouped GEMM time / the loop's expert GEMM kernel time (corpus median)
GROUPED_TIME_RATIO = 0.12

_BOUNDARY = ("attention", "dense_gemm", "communication")
_MOE = ("moe_routing", "moe_gemm")


@dataclass(frozen=True)
class MoEBlocks:
    """``ops``: the graph's GPU ops in MoE blocks (``row`` into ``g.ops``, ``block``, ``pos`` in launch order,
    ``chain`` = launching host call's vertex, ``is_gemm``); ``blocks``: one row per block (``block``, ``rank``,
    ``step_ord``, ``n_ops``, ``n_gemm``, ``loop``, ``syncs``, ``c0``/``c1`` = first/last launching call vertex, ``s0`` =
    where its syncs are counted from: a loop's from the start of its piece of the layer)."""

    ops: pl.DataFrame
    blocks: pl.DataFrame


def _launch_order(g: ReplayGraph) -> pl.DataFrame:
    le = g.ops.get_column("launch_eid").to_numpy()
    chain = np.where(le >= 0, g.esrc[np.maximum(le, 0)], -1)
    return g.ops.select("rank", "step_ord", "category", "family", "vid", "w_bytes", "dur").with_row_index("row").with_columns(
        pl.Series("chain", chain)).filter((pl.col("chain") >= 0) & (pl.col("step_ord") >= 0)).sort(["rank", "chain"])


def moe_blocks(g: ReplayGraph) -> MoEBlocks:
    """The MoE blocks of every step (module doc)."""
    o = _launch_order(g)
    cat = pl.col("category")
    o = o.with_columns(
        cat.is_in(list(_BOUNDARY)).cum_sum().over(["rank", "step_ord"]).alias("piece"),
        cat.is_in(list(_MOE)).alias("moe"),
        ((cat == "moe_gemm") & ~pl.col("family").str.contains("grouped|prep")).alias("is_gemm"),
        pl.col("family").str.contains("grouped").alias("grouped"),
    )
    key = ["rank", "step_ord", "piece"]
    o = o.with_columns(pl.int_range(pl.len()).over(key).alias("_i"),
                       pl.col("chain").min().over(key).alias("p0"))  # the piece's first launching call
    span = o.filter(pl.col("moe")).group_by(key).agg(pl.col("_i").min().alias("_a"), pl.col("_i").max().alias("_z"))
    o = o.join(span, on=key).filter((pl.col("_i") >= pl.col("_a")) & (pl.col("_i") <= pl.col("_z")))
    o = o.with_columns(pl.struct(key).rank("dense").cast(pl.Int64).alias("block"), (pl.col("_i") - pl.col("_a")).alias("pos"))
    blocks = o.group_by("block").agg(
        pl.col("rank").first(), pl.col("step_ord").first(), pl.len().alias("n_ops"), pl.col("is_gemm").sum().alias("n_gemm"),
        pl.col("grouped").any().alias("_g"), pl.col("chain").min().alias("c0"), pl.col("chain").max().alias("c1"),
        pl.col("p0").first(),
    ).with_columns(((pl.col("n_gemm") >= LOOP_MIN_GEMMS) & ~pl.col("_g")).alias("loop")).drop("_g").sort("block")
    # a loop's count readback may come before its first MoE kernel (the counts kernel is not categorized MoE): its
    # syncs are those from the start of its piece of the layer
    blocks = blocks.with_columns(pl.when(pl.col("loop")).then(pl.col("p0")).otherwise(pl.col("c0")).alias("s0")).drop("p0")
    blocks = blocks.with_columns(pl.Series("syncs", _syncs_in(g, blocks), dtype=pl.Int64))
    return MoEBlocks(o.select("row", "block", "pos", "chain", "is_gemm", "vid", "w_bytes", "dur"), blocks)


def _sync_calls(g: ReplayGraph) -> tuple[np.ndarray, np.ndarray]:
    """(call vertex, sync-end vertex) of every blocking host call."""
    e = np.flatnonzero(g.etype == ET_SYNC_SELF)
    return g.esrc[e], g.edst[e]


def _syncs_in(g: ReplayGraph, blocks: pl.DataFrame) -> list[int]:
    call, _z = _sync_calls(g)
    call = np.sort(call)
    c0, c1 = blocks.get_column("s0").to_numpy(), blocks.get_column("c1").to_numpy()
    n = np.searchsorted(call, c1, side="right") - np.searchsorted(call, c0, side="left")
    return [int(x) for x in n]


def _grouped_ns(ops: pl.DataFrame) -> tuple[float, bool]:
    """Predicted time of the two grouped GEMMs replacing one loop block's expert GEMMs; (ns, from shapes)."""
    gem = ops.filter(pl.col("is_gemm"))
    experts = max(1.0, gem.height / 2)
    wb = gem.get_column("w_bytes")
    if wb.null_count() == 0 and gem.height:
        return 2 * GROUPED_NS_PER_EXPERT * experts + float(wb.sum()) / GROUPED_BYTES_PER_S * 1e9, True
    return float(gem.get_column("dur").sum()) * GROUPED_TIME_RATIO, False


def grouped_experts_edit(g: ReplayGraph, inp: SimInputs, notes: list[str]) -> None:
    """``grouped-experts``: every per-expert loop block becomes a grouped block (module doc)."""
    mb = moe_blocks(g)
    loops = mb.blocks.filter(pl.col("loop"))
    if loops.height == 0:
        raise UsageError("what-if 'grouped-experts': the trace has no per-expert MoE loop (no MoE block with "
                         f"{LOOP_MIN_GEMMS} or more expert GEMM kernels); nothing to group")
    call, zend = _sync_calls(g)
    shaped = 0
    for b, c0, s0, c1 in loops.select("block", "c0", "s0", "c1").iter_rows():
        ops = mb.ops.filter(pl.col("block") == b).sort("pos")
        keep = ops.head(GROUPED_BLOCK_OPS)
        cut = int(keep.get_column("chain").to_numpy().max())  # host calls after the kept launches go
        _drop_host(g, inp, int(c0), cut, int(c1))
        _drop_syncs(g, inp, call, zend, int(s0), int(c1))
        ns, from_shapes = _grouped_ns(ops)
        shaped += from_shapes
        _regpu(g, inp, ops, keep, ns)
    notes.append(f"grouped-experts: {loops.height} per-expert loop blocks → grouped ({GROUPED_BLOCK_OPS} launches each, "
                 f"no host sync); grouped GEMM time from recorded shapes in {shaped} of them"
                 + ("" if shaped == loops.height else f", from the loop's GEMM time × {GROUPED_TIME_RATIO} in the rest "
                    "(record shapes for the bytes model)"))


def _drop_host(g: ReplayGraph, inp: SimInputs, first: int, after: int, last: int) -> None:
    """Host calls (after, last] of one rank's chain and the gaps before them take no time; the gap after the block's
    last call (the loop's epilogue) becomes the kept calls' median gap."""
    if last <= after:
        return
    v = np.arange(after + 1, last + 1)
    inp.vdur[v[g.vkind[v] == VK_CPU]] = 0
    cpu = g.etype == ET_CPU
    e = np.flatnonzero(cpu & (g.edst > after) & (g.edst <= last))
    inp.efix[e] = 0
    inp.egap[e] = 0
    kept = np.flatnonzero(cpu & (g.edst > first) & (g.edst <= after))
    tail = np.flatnonzero(cpu & (g.edst == last + 1) & (g.vrank[g.edst] == g.vrank[last]))
    if kept.size and tail.size:
        inp.egap[tail] = np.minimum(inp.egap[tail], int(np.median(inp.egap[kept])))


def _drop_syncs(g: ReplayGraph, inp: SimInputs, call: np.ndarray, zend: np.ndarray, c0: int, c1: int) -> None:
    """Host syncs made by calls in [c0, c1]: no wait, no own cost."""
    m = (call >= c0) & (call <= c1)
    if not m.any():
        return
    z = zend[m]
    inp.vdur[call[m]] = 0
    inp.efix[np.flatnonzero((g.etype == ET_SYNC_SELF) & np.isin(g.edst, z))] = 0
    inp.enabled[np.flatnonzero((g.etype == ET_SYNC_WAIT) & np.isin(g.edst, z))] = False
    inp.efix[np.flatnonzero((g.etype == ET_CPU) & np.isin(g.esrc, z))] = 0  # the call's end is its sync-end vertex


def _regpu(g: ReplayGraph, inp: SimInputs, ops: pl.DataFrame, keep: pl.DataFrame, grouped_ns: float) -> None:
    """GPU side of one block: expert GEMMs → two grouped GEMMs on the first two kept GEMM slots; ops past the kept
    launches take no time (and no queue or launch delay)."""
    gone = ops.filter(pl.col("pos") >= keep.height)
    vid = gone.get_column("vid").to_numpy()
    inp.vdur[vid] = 0
    rows = gone.get_column("row").to_numpy()
    for col in ("fifo_eid", "launch_eid"):
        e = g.ops.get_column(col).to_numpy()[rows]
        inp.efix[e[e >= 0]] = 0
    kg = keep.filter(pl.col("is_gemm")).get_column("vid").to_numpy()
    inp.vdur[kg] = 0
    slots = kg[:2] if kg.size else keep.get_column("vid").to_numpy()[-2:]
    inp.vdur[slots] = int(round(grouped_ns / max(slots.size, 1)))


@dataclass(frozen=True)
class Structure:
    """What the trace's steps are made of, for deciding which changes can be made (next win)."""

    loop_blocks: int  # per-expert MoE loop blocks
    loop_syncs: int  # host syncs inside them
    other_syncs: int  # host syncs inside steps outside loop blocks, each step's last one (its result) not counted
    graph_launches: int  # ops launched by cudaGraphLaunch (the capture already replays graphs)


def structure(g: ReplayGraph) -> Structure:
    """Per-expert loops, host syncs (inside loops / elsewhere in the steps) and graph launches of a trace."""
    mb = moe_blocks(g)
    loops = mb.blocks.filter(pl.col("loop"))
    call, _z = _sync_calls(g)
    reg = g.vregion[call]
    inside = call[reg >= 0]
    in_loop = np.zeros(inside.size, bool)
    for s0, c1 in loops.select("s0", "c1").iter_rows():
        in_loop |= (inside >= s0) & (inside <= c1)
    per_step = pl.DataFrame({"r": g.vrank[inside], "reg": reg[reg >= 0], "loop": in_loop})
    # a step's last sync is where the host takes the step's result: not a removable sync
    other = per_step.filter(~pl.col("loop")).group_by("r", "reg").len().with_columns((pl.col("len") - 1).clip(0))
    graph_ops = int(g.ops.get_column("launch_name").is_in(list(GRAPH_LAUNCH_CALLS)).fill_null(False).sum())
    return Structure(int(loops.height), int(in_loop.sum()), int(other.get_column("len").sum()) if other.height else 0,
                     graph_ops)
