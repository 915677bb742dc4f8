"""What-if scenarios: parse ``--what-if`` specs and apply them to :class:`SimInputs`.

Spec grammar (one scenario per flag; ``+`` combines edits in one scenario; a regex that holds ``+`` is
quoted, ``re:'fused.+moe'=0.5``, or writes it ``\\+`` for a literal plus: :func:`split_edits`):

* ``<target>=<factor>`` — scale GPU op durations. ``target`` is a category
  (``moe_gemm``), a family rule id (``allreduce.nccl``) or ``re:<regex>`` on the
  kernel name. For communication ops the collective *transfer* (min over
  ranks) is scaled, never the observed duration (which includes arrival skew).
* ``<collective>=bw:<bandwidth>,lat:<latency>`` or ``<collective>=<preset>`` —
  transfer from a fabric model (:mod:`tracekit.replay.fabric`); ``collective``
  is ``allreduce``, ``allgather``, ``reduce_scatter``, ``all2all``, ``broadcast``
  or ``all``.
* ``no-host-sync`` — GPU→CPU sync waits removed (the calls keep their own cost).
* ``grouped-experts`` — every per-expert MoE loop becomes one grouped block (:mod:`tracekit.replay.structural`).
* ``cuda-graph[:node=0.3us,launch=10us]`` — CUDA-graph emulation of every step
  range (the forward): its host calls and gaps collapse into one launch of cost
  ``launch`` (default: :data:`GRAPH_LAUNCH_HOST_FRACTION` of the step's eager host
  time), kernels chain on their streams with per-node overhead ``node``.
* oracle substitution is not a spec: see :func:`oracle_whatif` (``--durations-from``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import polars as pl

from tracekit._errors import UsageError
from tracekit.replay.fabric import Fabric, parse_fabric
from tracekit.replay.graph import ET_CPU, ET_SYNC_SELF, ET_SYNC_WAIT, VK_CPU, VK_STEP_START, ReplayGraph
from tracekit.replay.simulate import SimInputs
from tracekit.schema import CATEGORIES

__all__ = ["WhatIf", "parse_whatif", "oracle_whatif", "GRAPH_NODE_NS", "GRAPH_LAUNCH_NS", "GRAPH_LAUNCH_HOST_FRACTION"]

#: CUDA-graph per-node overhead δ_g on H200 (replay_model.md §6: 0.27–0.33 µs).
GRAPH_NODE_NS = 300
#: Unprofiled cudaGraphLaunch cost when given as a constant (``cuda-graph:launch=…``); the pilot did not measure it
#: (its profiled 322–516 µs must not be used).
GRAPH_LAUNCH_NS = 10_000
#: Default graph launch cost: this fraction of the step's eager host time at the calibrated scale. Measured on one
#: H200 (truth pair a_tk_grouped → a_tk_grouped_graph, tests/replay/truth): the graph step ran 1.90 ms on one host and
#: 2.06 ms on a 1.76x slower one for the same kernels, so the launch's host cost scales with the host, and with the
#: nodes (about one per eager launch). Checked on the other host's pair and on the 2xH200 graphs fixture.
GRAPH_LAUNCH_HOST_FRACTION = 0.016

_COLL_ALIASES = {
    "allreduce": "allreduce", "all_reduce": "allreduce", "allgather": "allgather", "all_gather": "allgather",
    "reduce_scatter": "reducescatter", "reducescatter": "reducescatter", "all2all": "alltoall",
    "alltoall": "alltoall", "all_to_all": "alltoall", "broadcast": "broadcast", "all": "",
    "collectives": "", "send": "send", "recv": "recv",
}


@dataclass
class WhatIf:
    """One scenario: a spec string and the edits that implement it."""

    spec: str
    edits: list[Callable[[ReplayGraph, SimInputs, list[str]], None]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def apply(self, g: ReplayGraph, inp: SimInputs) -> tuple[SimInputs, list[str]]:
        out = inp.copy()
        notes: list[str] = list(self.notes)
        for e in self.edits:
            e(g, out, notes)
        return out, notes


def _ops_mask(g: ReplayGraph, target: str, spec: str) -> np.ndarray:
    ops = g.ops
    if target.startswith("re:"):
        try:
            rx = re.compile(target[3:])
        except re.error as e:
            raise UsageError(f"what-if {spec!r}: bad regex {target[3:]!r} ({e})") from None
        names = ops.get_column("name").unique().to_list()
        hit = [n for n in names if rx.search(n)]
        return ops.get_column("name").is_in(hit).to_numpy()
    if target in CATEGORIES:
        return (ops.get_column("category") == target).to_numpy()
    fam = ops.get_column("family")
    if (fam == target).any() or "." in target:
        return (fam == target).to_numpy()
    raise UsageError(f"what-if {spec!r}: {target!r} is not a category ({', '.join(CATEGORIES)}), a family id "
                     "present in the trace, or re:<regex>")


def _scale_edit(target: str, factor: float, spec: str) -> Callable[[ReplayGraph, SimInputs, list[str]], None]:
    def edit(g: ReplayGraph, inp: SimInputs, notes: list[str]) -> None:
        m = _ops_mask(g, target, spec)
        if not m.any():
            raise UsageError(f"what-if {spec!r}: {target!r} names no GPU op of this trace; list its categories and "
                             "families with `tracekit analyze` (top kernels)")
        vid = g.ops.get_column("vid").to_numpy()
        inst = g.ops.get_column("inst").to_numpy()
        coll = inst >= 0
        plain = m & ~coll
        inp.vdur[vid[plain]] = np.rint(inp.vdur[vid[plain]] * factor).astype(np.int64)
        ci = np.unique(inst[m & coll])
        if ci.size:
            inp.inst_transfer[ci] = np.rint(inp.inst_transfer[ci] * factor).astype(np.int64)
        notes.append(f"{spec}: scaled {int(plain.sum())} ops and {ci.size} collective transfers by {factor:g}")
    return edit


def _fabric_edit(coll: str, fab: Fabric, spec: str) -> Callable[[ReplayGraph, SimInputs, list[str]], None]:
    def edit(g: ReplayGraph, inp: SimInputs, notes: list[str]) -> None:
        inst = g.instances
        if inst.height == 0:
            raise UsageError(f"what-if {spec!r}: the trace has no collectives to put on another fabric")
        names = inst.get_column("coll_name").fill_null("").str.to_lowercase().str.replace_all("_", "").to_list()
        fams = inst.get_column("family").fill_null("").to_list()
        sel = [i for i, (n, f) in enumerate(zip(names, fams))
               if not coll or coll in n or f.replace("_", "").startswith(coll)]
        if not sel:
            raise UsageError(f"what-if {spec!r}: the trace has no {coll or 'collective'} collectives")
        nbytes = inst.get_column("bytes").to_list()
        gsize = inst.get_column("group_size").fill_null(1).to_list()
        done = missing = 0
        for i in sel:
            if nbytes[i] is None:
                missing += 1
                continue
            inp.inst_transfer[i] = int(round(fab.transfer_ns(float(nbytes[i]), names[i] or coll or "allreduce",
                                                             int(gsize[i]))))
            done += 1
        notes.append(f"{spec}: {done} collective transfers from fabric {fab.name}")
        if missing:
            notes.append(f"{spec}: {missing} collectives without message size kept their observed transfer "
                         "(capture with record_shapes / NCCL metadata)")
    return edit


def _step_slot(g: ReplayGraph, call: np.ndarray) -> np.ndarray:
    """Per host call: ordinal of the rank's latest step that started at or before it (-1 before the first step)."""
    st = g.steps.select("rank", "step_ord", "start_vid").sort(["rank", "step_ord"])
    out = np.full(call.size, -1, np.int64)
    for r in np.unique(g.vrank[call]):
        rows = st.filter(pl.col("rank") == int(r))
        starts = g.vobs[rows.get_column("start_vid").to_numpy()]
        m = g.vrank[call] == r
        k = np.searchsorted(starts, g.vobs[call[m]], side="right") - 1
        out[m] = np.where(k >= 0, rows.get_column("step_ord").to_numpy()[np.maximum(k, 0)], -1)
    return out


def _no_sync_edit(g: ReplayGraph, inp: SimInputs, notes: list[str]) -> None:
    """Remove the host syncs of each step but its last: their GPU→CPU waits and the calls' own cost.

    A step's syncs are the blocking calls from its start to the next step's start (so a readback right after the
    step's range is the step's). The last one is where the host takes the step's result (the sampled tokens): the
    next step needs it, so removing it is not "removing a host sync" but overlapping steps (an async scheduler),
    which this what-if does not claim; syncs before the first step stay too. Without that rule the host ran ahead
    by every remaining step (a 2xH200 capture: 9.4 ms per step predicted as 104 ms)."""
    self_e = np.flatnonzero(g.etype == ET_SYNC_SELF)
    m = g.etype == ET_SYNC_WAIT
    if self_e.size == 0 or not m.any():
        raise UsageError("what-if 'no-host-sync': the trace has no host syncs (blocking CUDA calls) to remove")
    z, call = g.edst[self_e], g.esrc[self_e]
    slot = _step_slot(g, call)
    zs = pl.DataFrame({"z": z, "rank": g.vrank[call], "slot": slot, "t": g.vobs[z]})
    last = zs.sort("t").group_by("rank", "slot").agg(pl.col("z").last())["z"].to_numpy()
    gone = z[(slot >= 0) & ~np.isin(z, last)]
    if gone.size == 0:
        raise UsageError("what-if 'no-host-sync': the trace's only host syncs are each step's last (where the host "
                         "takes the step's result); there is no sync to remove")
    drop = m & np.isin(g.edst, gone)
    inp.enabled[drop] = False
    inp.efix[np.flatnonzero((g.etype == ET_SYNC_SELF) & np.isin(g.edst, gone))] = 0
    inp.vdur[call[np.isin(z, gone)]] = 0
    notes.append(f"no-host-sync: removed {gone.size} host syncs inside steps ({int(drop.sum())} GPU→CPU waits, and "
                 f"the calls' own time); kept each step's last ({last.size}), where the host takes its result")


def _region_host_ns(g: ReplayGraph, inp: SimInputs) -> np.ndarray:
    """Per step range: the host's time in it at the inputs' CPU-gap scale (calls' own time + program-order gaps)."""
    reg = g.vregion
    n = int(reg.max()) + 1 if reg.size and reg.max() >= 0 else 0
    out = np.zeros(max(n, 0), np.float64)
    v = np.flatnonzero((g.vkind == VK_CPU) & (reg >= 0))
    np.add.at(out, reg[v], inp.vdur[v])
    e = np.flatnonzero((g.etype == ET_CPU) & (reg[g.edst] >= 0) & inp.enabled)
    np.add.at(out, reg[g.edst[e]], np.maximum(inp.efix[e] + inp.egap[e] * inp.gap_scale, 0))
    return out


def _graph_edit(node_ns: int, launch_ns: int | None) -> Callable[[ReplayGraph, SimInputs, list[str]], None]:
    def edit(g: ReplayGraph, inp: SimInputs, notes: list[str]) -> None:
        reg = g.vregion
        if not (reg >= 0).any():
            raise UsageError("what-if 'cuda-graph': the trace has no step ranges to capture as graphs")
        # host side: calls and gaps inside each step collapse; the launch costs launch_ns, by default a fraction
        # of the step's calibrated eager host time (GRAPH_LAUNCH_HOST_FRACTION)
        host = _region_host_ns(g, inp)
        cpu_e = (g.etype == ET_CPU) & (reg[g.edst] >= 0)
        inp.efix[cpu_e] = 0
        inp.egap[cpu_e] = 0
        first = np.flatnonzero(cpu_e & (g.vkind[g.esrc] == VK_STEP_START))
        cost = (np.full(first.size, launch_ns, np.int64) if launch_ns is not None
                else np.rint(host[reg[g.edst[first]]] * GRAPH_LAUNCH_HOST_FRACTION).astype(np.int64))
        inp.efix[first] = cost
        inp.vdur[(g.vkind == VK_CPU) & (reg >= 0)] = 0
        # GPU side: first op per (rank, stream, step) launched with the graph, the rest chained by node_ns
        ops = g.ops.with_columns(pl.Series("_reg", reg[g.ops.get_column("vid").to_numpy()]))
        ops = ops.filter(pl.col("_reg") >= 0).sort("ts")
        if ops.height == 0:
            return
        firsts = ops.with_columns(pl.int_range(pl.len()).over(["rank", "device", "stream", "_reg"]).alias("_i"))
        first_rows = firsts.filter(pl.col("_i") == 0)
        rest = firsts.filter(pl.col("_i") > 0)
        le = first_rows.get_column("launch_eid").to_numpy()
        le = le[le >= 0]
        inp.efix[le] = 0
        rl = rest.get_column("launch_eid").to_numpy()
        inp.enabled[rl[rl >= 0]] = False
        rf = rest.get_column("fifo_eid").to_numpy()
        inp.efix[rf[rf >= 0]] = node_ns
        how = (f"launch {launch_ns / 1e3:g} us" if launch_ns is not None else
               f"launch {GRAPH_LAUNCH_HOST_FRACTION:.1%} of the step's eager host time (median "
               f"{float(np.median(cost)) / 1e3:.0f} us)")
        notes.append(f"cuda-graph: {ops.height} ops in {int(first_rows.get_column('_reg').n_unique())} step ranges, "
                     f"{how}, node {node_ns / 1e3:g} us")
    return edit


_T = {"ns": 1, "us": 1000, "µs": 1000, "ms": 1_000_000}


#: largest duration factor (a GPU op 1000x slower); a larger one overflows int64 ns on a long trace
MAX_FACTOR = 1000.0
#: largest cuda-graph node / launch overhead
MAX_OVERHEAD_NS = 10**9


def _dur_ns(text: str, spec: str) -> int:
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ns|us|µs|ms)?\s*", text)
    if not m:
        raise UsageError(f"what-if {spec!r}: cannot read duration {text!r}; e.g. 0.3us")
    ns = int(round(float(m.group(1)) * _T[m.group(2) or "us"]))
    if ns > MAX_OVERHEAD_NS:
        raise UsageError(f"what-if {spec!r}: duration {text!r} is above 1 s; an overhead is 0..1000ms")
    return ns


def split_edits(spec: str) -> list[str]:
    """The edits of one scenario: ``spec`` cut at each ``+`` outside quotes. A quoted part (``'...'`` or ``"..."``)
    is kept verbatim without its quotes (``re:'a+b'=0.5`` is the regex ``a+b``); ``\\+`` is kept as is (a
    regex's literal plus) and never cuts."""
    parts, cur, quote, i = [], [], "", 0
    while i < len(spec):
        ch = spec[i]
        if quote:
            if ch == quote:
                quote = ""
            else:
                cur.append(ch)
        elif ch in "'\"":
            quote = ch
        elif ch == "\\" and spec[i + 1: i + 2] == "+":
            cur.append("\\+")
            i += 1
        elif ch == "+":
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
        i += 1
    if quote:
        raise UsageError(f"what-if {spec!r}: a quote ({quote}) is not closed")
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def parse_whatif(spec: str) -> WhatIf:
    """Parse one ``--what-if`` value (see module doc); raises :class:`UsageError` on bad specs."""
    w = WhatIf(spec=spec)
    for part in split_edits(spec):
        low = part.lower()
        if low in ("no-host-sync", "no-sync", "remove-syncs", "nosync"):
            w.edits.append(_no_sync_edit)
            continue
        if low in ("grouped-experts", "grouped_experts", "grouped-moe"):
            from tracekit.replay.structural import grouped_experts_edit

            w.edits.append(grouped_experts_edit)
            continue
        if low.startswith(("cuda-graph", "cudagraph", "graph")):
            node = GRAPH_NODE_NS
            launch: int | None = None
            _, _, opts = part.partition(":")
            for o in [x.strip() for x in opts.split(",") if x.strip()]:
                k, _, v = o.partition("=")
                if k in ("node", "delta", "node_overhead"):
                    node = _dur_ns(v, spec)
                elif k in ("launch", "launch_cost"):
                    launch = _dur_ns(v, spec)
                else:
                    raise UsageError(f"what-if {spec!r}: unknown cuda-graph option {k!r}; use node=, launch=")
            w.edits.append(_graph_edit(node, launch))
            continue
        lhs, eq, rhs = part.partition("=")
        if not eq or not lhs or not rhs:
            raise UsageError(f"what-if {spec!r}: expected TARGET=FACTOR (moe_gemm=0.33), "
                             "COLLECTIVE=bw:400GB/s,lat:5us, no-host-sync, grouped-experts or cuda-graph")
        lhs, rhs = lhs.strip(), rhs.strip()
        factor: float | None
        try:
            factor = float(rhs.lstrip("x×"))
        except ValueError:
            factor = None
        if factor is not None:
            if not math.isfinite(factor) or not 0 < factor <= MAX_FACTOR:
                raise UsageError(f"what-if {spec!r}: factor must be a finite number in (0, {MAX_FACTOR:g}] "
                                 f"(range 0..{MAX_FACTOR:g}, 0 excluded; e.g. 0.5 for twice as fast)")
            w.edits.append(_scale_edit(lhs, factor, spec))
            continue
        coll = _COLL_ALIASES.get(lhs.lower())
        if coll is None and (lhs in CATEGORIES or lhs.startswith("re:") or "." in lhs):
            raise UsageError(f"what-if {spec!r}: factor {rhs!r} is not a number (e.g. {lhs}=0.5)")
        if coll is None:
            raise UsageError(f"what-if {spec!r}: {lhs!r} is not a collective ({', '.join(_COLL_ALIASES)}); "
                             "fabric models apply to collectives")
        w.edits.append(_fabric_edit(coll, parse_fabric(rhs, spec), spec))
    if not w.edits:
        raise UsageError(f"what-if {spec!r}: empty")
    return w


# ----------------------------------------------------------------------------- oracle


def oracle_whatif(g: ReplayGraph, target: ReplayGraph, spec: str = "oracle") -> WhatIf:
    """Substitute per-kernel durations (and collective transfers) measured in ``target``.

    Ops match by (rank, step ordinal, name, occurrence within the step); steps
    beyond the target's count wrap around. Fallbacks: the median over the
    target's steps of (rank, name, occurrence), then the name's median. Ops
    with no match keep their duration (the count is reported). Collective
    transfers match by (step, family, index within the step), then the
    (family, index) median, then the family median.
    """
    base = g.ops.select("rank", "step_ord", "name", "occ", "vid", "inst")
    tgt = target.ops.select("rank", "step_ord", "name", "occ", "dur", "inst")
    so = target.ops.get_column("step_ord").to_numpy()
    n_t = max(int(so.max()) + 1 if so.size else 1, 1)
    base = base.with_columns(
        pl.when(pl.col("step_ord") >= 0).then(pl.col("step_ord") % n_t).otherwise(-1).alias("_tso"))
    t_plain = tgt.filter(pl.col("inst") < 0)
    exact = t_plain.group_by(["rank", "step_ord", "name", "occ"]).agg(pl.col("dur").first().alias("_d0"))
    by_occ = t_plain.group_by(["rank", "name", "occ"]).agg(pl.col("dur").median().alias("_d1"))
    by_name = t_plain.group_by(["name"]).agg(pl.col("dur").median().alias("_d2"))
    m = (base.filter(pl.col("inst") < 0)
         .join(exact, left_on=["rank", "_tso", "name", "occ"], right_on=["rank", "step_ord", "name", "occ"], how="left")
         .join(by_occ, on=["rank", "name", "occ"], how="left")
         .join(by_name, on="name", how="left"))
    d = m.select("vid", pl.coalesce("_d0", "_d1", "_d2").alias("d"),
                 pl.when(pl.col("_d0").is_not_null()).then(0).when(pl.col("_d1").is_not_null()).then(1)
                 .when(pl.col("_d2").is_not_null()).then(2).otherwise(3).alias("how"))
    counts = d.group_by("how").len().sort("how")
    cmap = dict(zip(counts.get_column("how").to_list(), counts.get_column("len").to_list()))
    hit = d.filter(pl.col("d").is_not_null())
    vids = hit.get_column("vid").to_numpy()
    durs = hit.get_column("d").cast(pl.Int64).to_numpy()
    # collectives
    bi = g.instances.with_row_index("i").select("i", "step_ord", "family", "occ")
    ti = target.instances.select("step_ord", "family", "occ", "transfer_ns")
    if bi.height and ti.height:
        bi = bi.with_columns(pl.when(pl.col("step_ord") >= 0).then(pl.col("step_ord") % n_t).otherwise(-1)
                             .alias("_tso"))
        ex = ti.group_by(["step_ord", "family", "occ"]).agg(pl.col("transfer_ns").first().alias("_t0"))
        bo = ti.group_by(["family", "occ"]).agg(pl.col("transfer_ns").median().alias("_t1"))
        bf = ti.group_by(["family"]).agg(pl.col("transfer_ns").median().alias("_t2"))
        ci = (bi.join(ex, left_on=["_tso", "family", "occ"], right_on=["step_ord", "family", "occ"], how="left")
              .join(bo, on=["family", "occ"], how="left").join(bf, on="family", how="left")
              .select("i", pl.coalesce("_t0", "_t1", "_t2").alias("t")).filter(pl.col("t").is_not_null()))
        c_idx = ci.get_column("i").cast(pl.Int64).to_numpy()
        c_t = ci.get_column("t").cast(pl.Int64).to_numpy()
    else:
        c_idx = np.zeros(0, np.int64)
        c_t = np.zeros(0, np.int64)
    n_ops = int(d.height)

    def edit(gg: ReplayGraph, inp: SimInputs, notes: list[str]) -> None:
        inp.vdur[vids] = durs
        inp.inst_transfer[c_idx] = c_t

    note = (f"{spec}: {cmap.get(0, 0)}/{n_ops} ops matched exactly, {cmap.get(1, 0)} by occurrence median, "
            f"{cmap.get(2, 0)} by name median, {cmap.get(3, 0)} unmatched (kept); "
            f"{c_idx.size}/{g.instances.height} collective transfers substituted")
    return WhatIf(spec=spec, edits=[edit], notes=[note])

