"""Longest-path simulation of a :class:`~tracekit.replay.graph.ReplayGraph`.

The graph's edge set is fixed; what-ifs change :class:`SimInputs` (durations,
collective transfer times, edge weights, the CPU-gap scale, disabled edges).
:class:`Schedule` holds the topological order and the in-edge lists, computed
once per graph. Weights are computed vectorized; the only per-vertex loop is
the max-plus recurrence in :func:`simulate` (no vectorized formulation exists
for a DAG whose chains couple through syncs and rendezvous; it runs over plain
Python lists, ~0.3 µs per edge — see ``benchmarks/replay.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
import numpy as np
import polars as pl

from tracekit._errors import InputError
from tracekit.analysis.steptime import gpu_part_expr, prev_gpu_end, step_ns_expr
from tracekit.replay.graph import (
    ET_CPU,
    ET_EVENT,
    ET_FIFO,
    ET_LAUNCH,
    ET_RDV,
    ET_SYNC_SELF,
    ET_SYNC_WAIT,
    NEG,
    VK_GPU,
    ReplayGraph,
)
from tracekit.schema import CATEGORIES

__all__ = ["SimInputs", "Schedule", "SimResult", "inputs_from_graph", "make_schedule", "simulate",
           "step_times", "critical_path_breakdown", "HOST_BUCKETS"]

#: Critical-path buckets besides the GPU categories.
HOST_BUCKETS = ("cpu", "launch", "queue", "sync")


@dataclass
class SimInputs:
    """What a what-if may change. Arrays are private copies (see :func:`inputs_from_graph`)."""

    vdur: np.ndarray
    inst_transfer: np.ndarray
    efix: np.ndarray
    egap: np.ndarray
    enabled: np.ndarray
    gap_scale: float = 1.0

    def copy(self) -> "SimInputs":
        return replace(self, vdur=self.vdur.copy(), inst_transfer=self.inst_transfer.copy(), efix=self.efix.copy(),
                       egap=self.egap.copy(), enabled=self.enabled.copy())


def inputs_from_graph(g: ReplayGraph, gap_scale: float = 1.0) -> SimInputs:
    return SimInputs(g.vdur.copy(), g.inst_transfer.copy(), g.efix.copy(), g.egap.copy(),
                     np.ones(g.n_edges, bool), gap_scale)


@dataclass
class Schedule:
    """Topological order and CSR in-edge lists (by position in the order)."""

    order: np.ndarray  # vertex id at each position
    pos: np.ndarray  # position of each vertex
    edge_perm: np.ndarray  # edges sorted by destination position
    ptr: list[int]
    src_pos: list[int]
    deg: list[int]  # in-degree by position
    e1: np.ndarray  # index into edge_perm of each position's first in-edge (0 if none)
    e2: np.ndarray  # ... second in-edge
    s1: list[int]  # source position of the first / second in-edge
    s2: list[int]


def make_schedule(g: ReplayGraph, max_passes: int = 64) -> Schedule:
    """Order vertices by observed time, repairing ties/skew so every edge points forward.

    Raises :class:`InputError` if the graph has a cycle (inconsistent trace).
    """
    n = g.n_vertices
    prio = np.array([2, 5, 3, 4, 1, 0], np.int64)[g.vkind]
    base_order = np.lexsort((np.arange(n), prio, g.vobs))
    rank0 = np.empty(n, np.int64)
    rank0[base_order] = np.arange(n)
    key = rank0.copy()
    src, dst = g.esrc, g.edst
    for _ in range(max_passes):
        bad = key[src] >= key[dst]
        if not bad.any():
            break
        np.maximum.at(key, dst[bad], key[src[bad]] + 1)
    else:
        key = _kahn(n, src, dst, rank0)
    order = np.lexsort((rank0, key))
    pos = np.empty(n, np.int64)
    pos[order] = np.arange(n)
    if (pos[src] >= pos[dst]).any():
        key = _kahn(n, src, dst, rank0)
        order = np.argsort(key, kind="stable")
        pos[order] = np.arange(n)
    dpos = pos[dst]
    perm = np.argsort(dpos, kind="stable")
    counts = np.bincount(dpos, minlength=n)
    ptr = np.concatenate([[0], np.cumsum(counts)])
    sp = pos[src][perm]
    m = max(sp.size - 1, 0)
    e1 = np.minimum(ptr[:-1], m)
    e2 = np.minimum(ptr[:-1] + 1, m)
    s1 = np.where(counts >= 1, sp[e1] if sp.size else 0, 0)
    s2 = np.where(counts >= 2, sp[e2] if sp.size else 0, 0)
    return Schedule(order=order, pos=pos, edge_perm=perm, ptr=ptr.tolist(), src_pos=sp.tolist(),
                    deg=counts.tolist(), e1=e1, e2=e2, s1=s1.tolist(), s2=s2.tolist())


def _kahn(n: int, src: np.ndarray, dst: np.ndarray, tiebreak: np.ndarray) -> np.ndarray:
    """Topological positions by Kahn's algorithm (fallback; Python loop)."""
    import heapq

    indeg = np.bincount(dst, minlength=n).tolist()
    perm = np.argsort(src, kind="stable")
    s_ptr = np.concatenate([[0], np.cumsum(np.bincount(src, minlength=n))]).tolist()
    out_dst = dst[perm].tolist()
    tb = tiebreak.tolist()
    heap = [(tb[v], v) for v in range(n) if indeg[v] == 0]
    heapq.heapify(heap)
    key = np.empty(n, np.int64)
    i = 0
    while heap:
        _, v = heapq.heappop(heap)
        key[v] = i
        i += 1
        for e in range(s_ptr[v], s_ptr[v + 1]):
            d = out_dst[e]
            indeg[d] -= 1
            if indeg[d] == 0:
                heapq.heappush(heap, (tb[d], d))
    if i != n:
        raise InputError("replay graph has a dependency cycle (inconsistent timestamps or correlations); "
                         "re-convert the trace or report it")
    return key


def edge_weights(g: ReplayGraph, inp: SimInputs) -> np.ndarray:
    """Effective weight of every edge (int ns); NEG for disabled edges."""
    w = inp.efix + np.rint(inp.egap * inp.gap_scale).astype(np.int64)
    w = w + np.where(g.efrom_end, inp.vdur[g.esrc], 0)
    rdv = g.etype == ET_RDV
    if rdv.any():
        w[rdv] = inp.inst_transfer[g.vinst[g.edst[rdv]]]
    w[~inp.enabled] = NEG
    return w


@dataclass
class SimResult:
    t: np.ndarray  # simulated start time per vertex (int ns, relative to graph origin)
    w: np.ndarray  # effective edge weights used
    inputs: SimInputs


def simulate(g: ReplayGraph, inp: SimInputs, sched: Schedule) -> SimResult:
    """Longest path: t[v] = max(base[v], max over in-edges (t[src] + w))."""
    w = edge_weights(g, inp)
    wp = w[sched.edge_perm]
    wl = wp.tolist()
    if wp.size:
        w1 = wp[sched.e1].tolist()
        w2 = wp[sched.e2].tolist()
    else:
        w1 = w2 = [0] * g.n_vertices
    src, ptr, deg, s1, s2 = sched.src_pos, sched.ptr, sched.deg, sched.s1, sched.s2
    t = g.vbase[sched.order].tolist()  # filled in place, by position
    for v in range(len(t)):
        d = deg[v]
        if d == 0:
            continue
        x = t[s1[v]] + w1[v]
        if d >= 2:
            y = t[s2[v]] + w2[v]
            if y > x:
                x = y
            if d > 2:
                for e in range(ptr[v] + 2, ptr[v + 1]):
                    y = t[src[e]] + wl[e]
                    if y > x:
                        x = y
        if x > t[v]:
            t[v] = x
    tp = np.asarray(t, dtype=np.int64)
    out = np.empty(tp.size, np.int64)
    out[sched.order] = tp
    return SimResult(out, w, inp)


def _op_end(g: ReplayGraph, t: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """End time of every GPU op (rendezvous time for collectives)."""
    vid = g.ops.get_column("vid").to_numpy()
    inst = g.ops.get_column("inst").to_numpy()
    end: np.ndarray = t[vid] + dur[vid]
    coll = inst >= 0
    end[coll] = t[g.inst_rdv[inst[coll]]]
    return np.asarray(end)


def step_times(g: ReplayGraph, t: np.ndarray | None, dur: np.ndarray | None = None) -> pl.DataFrame:
    """Per (rank, step): the step's time by the one definition (:func:`tracekit.analysis.steptime.step_ns_expr`):
    the larger of its host range (start marker → end marker) and its GPU part (from its start, or the end of the
    rank's earlier steps' GPU work if later, to its last op's end; a collective ends at its rendezvous). ``start``/``end``/``start_vertex``/``end_vertex`` are those of the
    larger one (the critical path walks from ``end_vertex`` back to ``start_vertex``); ``host_ns`` is the host range
    alone (what a program's own clock around the step measures), ``host_start`` its start; ``gpu_ops`` counts the ops.

    With ``t=None`` the observed times are used (GPU op ends as recorded): analyze's ``step_ns``.
    """
    if g.steps.height == 0:
        return pl.DataFrame(schema={"rank": pl.Int32, "step_ord": pl.Int64, "step_id": pl.Int64, "tokens": pl.Int64,
                                    "start": pl.Int64, "end": pl.Int64, "dur_ns": pl.Int64, "host_ns": pl.Int64,
                                    "host_start": pl.Int64, "start_vertex": pl.Int64,
                                    "end_vertex": pl.Int64, "_gpu_last": pl.Boolean, "gpu_ops": pl.UInt32})
    vid = g.ops.get_column("vid").to_numpy()
    if t is None:
        tt = g.vobs
        ends = g.vobs[vid] + g.vdur[vid]
    else:
        tt = t
        ends = _op_end(g, t, g.vdur if dur is None else dur)
    every = pl.DataFrame({"rank": g.ops.get_column("rank"), "step_ord": g.ops.get_column("step_ord"),
                          "t0": tt[vid], "end": ends, "vid": g.ops.get_column("vid")})
    ops = every.filter(pl.col("step_ord") >= 0)
    span = ops.group_by(["rank", "step_ord"]).agg(
        pl.col("t0").min().alias("gpu_start"), pl.col("vid").sort_by("t0").first().alias("first_vid"),
        pl.col("end").max().alias("gpu_end"), pl.col("vid").sort_by("end").last().alias("last_vid"),
        pl.len().alias("gpu_ops"))
    st = g.steps.select("rank", "step_ord", "step_id", "tokens", "start_vid", "end_vid")
    st = st.with_columns(pl.Series("m0", tt[st.get_column("start_vid").to_numpy()]),
                         pl.Series("m1", tt[st.get_column("end_vid").to_numpy()]))
    st = st.join(span, on=["rank", "step_ord"], how="left").with_columns(pl.col("gpu_ops").fill_null(0))
    st = st.sort(["rank", "step_ord"])
    outside = every.filter(pl.col("step_ord") < 0).select("rank", pl.col("t0").alias("start"), "end")
    st = st.with_columns(prev_gpu_end(st.select("rank", pl.col("m0").alias("start"), "gpu_end"), outside).alias("_prev"),
                         pl.col("last_vid").shift(1).over("rank").alias("_prev_vid"))
    part = gpu_part_expr(pl.col("m0"), pl.col("gpu_start"), pl.col("gpu_end"), pl.col("_prev"))
    gpu = part.fill_null(NEG) > (pl.col("m1") - pl.col("m0"))
    # the GPU part starts where earlier steps' work ended (backlog), or at the first op (a rank's first step)
    backlog = pl.col("_prev").fill_null(NEG) > pl.col("m0")
    first = pl.col("_prev").is_null()
    st = st.with_columns(
        pl.when(gpu).then(pl.col("gpu_end") - part).otherwise(pl.col("m0")).alias("start"),
        pl.when(gpu).then(pl.col("gpu_end")).otherwise(pl.col("m1")).alias("end"),
        pl.when(gpu & first).then(pl.col("first_vid")).when(gpu & backlog).then(pl.col("_prev_vid"))
        .otherwise(pl.col("start_vid")).alias("start_vertex"),
        pl.when(gpu).then(pl.col("last_vid")).otherwise(pl.col("end_vid")).alias("end_vertex"),
        gpu.alias("_gpu_last"),
        step_ns_expr(pl.col("m1") - pl.col("m0"), part).alias("dur_ns"),
        (pl.col("m1") - pl.col("m0")).alias("host_ns"),
        pl.col("m0").alias("host_start"),
    )
    return st.select("rank", "step_ord", "step_id", "tokens", "start", "end", "dur_ns", "host_ns", "host_start",
                     "start_vertex", "end_vertex", "_gpu_last", "gpu_ops")


def critical_path_breakdown(g: ReplayGraph, res: SimResult, steps: pl.DataFrame,
                            max_steps: int = 64) -> dict[str, float]:
    """Mean per step of the critical path's time by bucket (GPU categories + cpu/launch/queue/sync).

    For each step (on the rank whose step ends last; at most ``max_steps`` evenly
    spaced steps) the path is followed backwards over tight edges from the step's
    completion to its start marker; each edge's weight goes to the bucket of its
    kind (an op's own duration to its category, a rendezvous to communication).
    """
    buckets = {c: 0.0 for c in (*CATEGORIES, *HOST_BUCKETS)}
    if steps.height == 0 or max_steps <= 0:  # 0: not wanted (next win reads step times only)
        return buckets
    t, w = res.t, res.w
    src, dst = g.esrc, g.edst
    tight = np.flatnonzero((w > NEG // 2) & (t[src] + w == t[dst]))
    # one binding in-edge per vertex (the latest-listed tight edge)
    pred = np.full(g.n_vertices, -1, np.int64)
    pred[dst[tight]] = tight
    dur = res.inputs.vdur
    cats = list(CATEGORIES)
    etype = g.etype
    vkind, vcat = g.vkind, g.vcat
    efrom = g.efrom_end
    # choose, per step ordinal, the rank whose step took longest (the job step's time)
    sel = steps.sort("dur_ns").group_by("step_ord", maintain_order=True).agg(pl.all().last()).sort("step_ord")
    if sel.height > max_steps:
        idx = np.linspace(0, sel.height - 1, max_steps).astype(int)
        sel = sel[idx]
    n = 0
    for sv, endv, gpu_last in zip(sel.get_column("start_vertex").to_list(), sel.get_column("end_vertex").to_list(),
                                  sel.get_column("_gpu_last").to_list()):
        sv = int(sv)
        t0 = int(t[sv])
        v = int(endv)
        n += 1
        if gpu_last:  # the step completes with a GPU op's end
            if g.vinst[v] >= 0 and vkind[v] == VK_GPU:
                v = int(g.inst_rdv[g.vinst[v]])
            else:
                buckets[cats[vcat[v]]] += float(dur[v])
        guard = 0
        while v != sv and t[v] > t0 and guard < 10_000_000:
            guard += 1
            e = pred[v]
            if e < 0:
                break
            u = int(src[e])
            we = float(w[e])
            if t[u] < t0:  # clip the part before the step start
                we = float(t[v] - t0)
            own = float(dur[u]) if efrom[e] else 0.0
            own = min(own, we)
            et = etype[e]
            if own:
                if vkind[u] == VK_GPU:
                    buckets[cats[vcat[u]]] += own
                else:
                    buckets["cpu"] += own
            rest = we - own
            if et == ET_RDV:
                buckets["communication"] += rest
            elif et in (ET_CPU, ET_SYNC_SELF):
                buckets["cpu"] += rest
            elif et == ET_LAUNCH:
                buckets["launch"] += rest
            elif et in (ET_FIFO, ET_EVENT):
                buckets["queue"] += rest
            elif et == ET_SYNC_WAIT:
                buckets["sync"] += rest
            v = u
    if n:
        for k in buckets:
            buckets[k] /= n
    return buckets

