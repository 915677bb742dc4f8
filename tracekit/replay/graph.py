"""Dependency graph of a trace for replay (see ``docs/replay.md``, model in replay_model.md).

:func:`build_graph` turns a ``trace.parquet`` frame into a :class:`ReplayGraph`:
vertices (CPU calls of the launching thread, sync-call ends, GPU ops, one
rendezvous per collective instance, step markers) and weighted edges such that
the longest path reproduces the observed times exactly (self-replay) while a
what-if that changes a duration moves every time that depends on it.

Edges and their lag attribution (replay_model.md §2, §4):

* CPU program order: previous call end → next call start, weight = observed gap
  (the scalable part is ``egap``; calibration multiplies it).
* launch: launching call start → GPU op start, weight = offset in the call + λ.
* stream FIFO: previous op end (or its rendezvous) → op start, weight δ.
* cross-stream event: source op end → first op launched on the waiting stream
  after ``cudaStreamWaitEvent``. Trace sync records do not carry the recorded
  event's stream in schema v1, so the source is the last op launched before the
  preceding ``cudaEventRecord``; communication ops on side streams without such
  an edge get the c10d fallback (depend on the last main-stream op launched
  before them; the next main-stream op depends on them).
* GPU → CPU sync: blocking call start → its end vertex (own non-wait time) and
  waited op end → end vertex (tail).
* rendezvous: each member's start → instance vertex, weight = transfer
  (min duration over ranks); every member's end is the instance vertex.

Per GPU op (and sync end) the constraint that was binding in the observed trace
keeps its observed residual; the others get the rank's typical value, clamped
to the observed slack so self-replay stays exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from tracekit._errors import InputError, QualityLog
from tracekit.core import blocking as _blocking
from tracekit.core.collectives import collective_ops, match_collectives
from tracekit.dtypes import dtype_bytes_expr
from tracekit.replay.shapes import gemm_weight_bytes
from tracekit.schema import CATEGORIES, GPU_OP_KINDS

__all__ = [
    "ReplayGraph",
    "build_graph",
    "VK_CPU",
    "VK_SYNC_END",
    "VK_GPU",
    "VK_RDV",
    "VK_STEP_START",
    "VK_STEP_END",
    "ET_CPU",
    "ET_LAUNCH",
    "ET_FIFO",
    "ET_EVENT",
    "ET_SYNC_SELF",
    "ET_SYNC_WAIT",
    "ET_RDV",
    "BLOCKING_CALLS",
    "NEG",
    "REPLAY_KINDS",
    "REPLAY_COLUMNS",
    "replay_steps",
]

VK_CPU, VK_SYNC_END, VK_GPU, VK_RDV, VK_STEP_START, VK_STEP_END = range(6)
ET_CPU, ET_LAUNCH, ET_FIFO, ET_EVENT, ET_SYNC_SELF, ET_SYNC_WAIT, ET_RDV = range(7)
NEG = -(1 << 60)  # "minus infinity" in integer ns

#: Blocking host calls and what they wait for (the one list: :mod:`tracekit.core.blocking`).
BLOCKING_CALLS = _blocking.BLOCKING_CALLS
_EVENT_RECORD = _blocking.EVENT_RECORD_CALLS
_STREAM_WAIT = _blocking.STREAM_WAIT_CALLS
_GRAPH_LAUNCH = _blocking.GRAPH_LAUNCH_CALLS

# typical values when a trace has no example of an unconstrained case
_DEFAULT_LAMBDA_NS = 5_000
_DEFAULT_DELTA_NS = 1_000
_DEFAULT_SYNC_SELF_NS = 5_000
_DEFAULT_SYNC_TAIL_NS = 2_000


@dataclass
class ReplayGraph:
    """Arrays of one trace's dependency graph; times are int ns relative to ``origin_ns``.

    Vertex arrays are indexed by vertex id, edge arrays by edge id. ``ops`` has
    one row per GPU op (``vid`` = its vertex) with name, category, family,
    stream, rank, step ordinal, occurrence index within (rank, step, name),
    collective instance and ``w_bytes`` (weight bytes of a GEMM kernel whose operator recorded shapes, else
    null); ``steps`` one row per profiled step and rank with its
    marker vertices; ``instances`` one row per collective instance.
    """

    origin_ns: int
    vkind: np.ndarray
    vrank: np.ndarray
    vobs: np.ndarray  # model-observed start time
    vdur: np.ndarray  # own duration (CPU call, GPU op)
    vbase: np.ndarray  # fixed time for roots, NEG otherwise
    vcat: np.ndarray  # index into CATEGORIES for GPU ops, -1 otherwise
    vinst: np.ndarray  # collective instance of a GPU op / rendezvous vertex, -1 otherwise
    vregion: np.ndarray  # step ordinal whose range contains the chain vertex / launched the GPU op, -1 otherwise
    esrc: np.ndarray
    edst: np.ndarray
    etype: np.ndarray
    efix: np.ndarray  # fixed weight part
    egap: np.ndarray  # calibratable CPU-gap part (>= 0)
    efrom_end: np.ndarray  # add vdur[src] to the weight
    inst_transfer: np.ndarray
    inst_rdv: np.ndarray
    ops: pl.DataFrame
    steps: pl.DataFrame
    instances: pl.DataFrame
    ranks: list[int]
    typical: dict[int, dict[str, int]] = field(default_factory=dict)
    quality: QualityLog = field(default_factory=QualityLog)

    @property
    def n_vertices(self) -> int:
        return int(self.vkind.shape[0])

    @property
    def n_edges(self) -> int:
        return int(self.esrc.shape[0])


# ----------------------------------------------------------------------------- helpers


def _np(s: pl.Series, fill: int = 0) -> np.ndarray:
    return s.fill_null(fill).to_numpy().astype(np.int64, copy=False)


def _mode(s: pl.Series) -> Any:
    s = s.drop_nulls()
    if s.len() == 0:
        return None
    return s.value_counts(sort=True).item(0, 0)


def _asof_back(keys_sorted: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Index of the last key <= q (-1 if none)."""
    return np.searchsorted(keys_sorted, q, side="right") - 1


def _median(x: np.ndarray, default: int) -> int:
    return int(np.median(x)) if x.size else default


class _Builder:
    """Accumulates vertices and edges across ranks."""

    def __init__(self) -> None:
        self.v: dict[str, list[np.ndarray]] = {k: [] for k in ("kind", "rank", "obs", "dur", "base", "cat", "inst")}
        self.e: dict[str, list[np.ndarray]] = {k: [] for k in ("src", "dst", "type", "fix", "gap", "from_end")}
        self.n = 0
        self.ne = 0
        self.region: dict[int, int] = {}  # vertex id -> step region (sparse, filled per rank)
        self.region_parts: list[tuple[np.ndarray, np.ndarray]] = []

    def add_vertices(self, kind: np.ndarray | int, rank: int, obs: np.ndarray, dur: np.ndarray | None = None,
                     cat: np.ndarray | None = None, inst: np.ndarray | None = None) -> np.ndarray:
        m = obs.shape[0]
        ids = np.arange(self.n, self.n + m, dtype=np.int64)
        self.n += m
        self.v["kind"].append(np.broadcast_to(np.asarray(kind, dtype=np.int8), (m,)).copy())
        self.v["rank"].append(np.full(m, rank, dtype=np.int32))
        self.v["obs"].append(obs.astype(np.int64))
        self.v["dur"].append(np.zeros(m, np.int64) if dur is None else dur.astype(np.int64))
        self.v["base"].append(np.full(m, NEG, dtype=np.int64))
        self.v["cat"].append(np.full(m, -1, np.int16) if cat is None else cat.astype(np.int16))
        self.v["inst"].append(np.full(m, -1, np.int64) if inst is None else inst.astype(np.int64))
        return ids

    def add_edges(self, src: np.ndarray, dst: np.ndarray, etype: int, fix: np.ndarray,
                  gap: np.ndarray | None = None, from_end: np.ndarray | bool = False) -> np.ndarray:
        m = src.shape[0]
        ids = np.arange(self.ne, self.ne + m, dtype=np.int64)
        self.ne += m
        if m == 0:
            return ids
        self.e["src"].append(src.astype(np.int64))
        self.e["dst"].append(dst.astype(np.int64))
        self.e["type"].append(np.full(m, etype, np.int8))
        self.e["fix"].append(np.asarray(fix, dtype=np.int64) * np.ones(m, np.int64))
        self.e["gap"].append(np.zeros(m, np.int64) if gap is None else gap.astype(np.int64))
        self.e["from_end"].append(np.broadcast_to(np.asarray(from_end, dtype=bool), (m,)).copy())
        return ids

    def cat(self, part: str, key: str, dtype: Any) -> np.ndarray:
        src = self.v if part == "v" else self.e
        return np.concatenate(src[key]) if src[key] else np.zeros(0, dtype)


# ----------------------------------------------------------------------------- per-rank tables


_CAT_INDEX = {c: i for i, c in enumerate(CATEGORIES)}
#: the row kinds and columns replay reads (callers that stream a trace project to these)
REPLAY_KINDS = (*GPU_OP_KINDS, "runtime", "sync", "step")
_COLS = ("rank", "kind", "ts_ns", "dur_ns", "device", "stream", "tid", "name", "category", "family", "correlation",
         "launch_ts_ns", "launch_tid", "launch_name", "pg_name", "coll_seq", "coll_name", "coll_in_nelems",
         "coll_out_nelems", "coll_dtype", "coll_group_size", "bytes", "step_id", "step_mode", "tokens", "profiled",
         "src", "pg_ranks")
REPLAY_COLUMNS = _COLS


def replay_steps(r: pl.DataFrame) -> pl.DataFrame:
    """The steps replay uses of one rank's rows, in time order: profiled ``kind="step"`` rows; annotation
    steps (on the launching thread) win over ``tracekit.step`` records of the same forwards."""
    steps = r.filter((pl.col("kind") == "step") & (pl.col("profiled").fill_null(True))).sort("ts_ns")
    ann = steps.filter(pl.col("src").cast(pl.String).fill_null("") != "tracekit.step")
    return ann if ann.height else steps


def _main_tid(r: pl.DataFrame, steps: pl.DataFrame, ops: pl.DataFrame) -> Any:
    """The launching thread: owner of the step annotations, else the thread with most launches."""
    tid = _mode(steps.get_column("tid")) if steps.height else None
    if tid is None and ops.height:
        tid = _mode(ops.get_column("launch_tid"))
    if tid is None:
        rt = r.filter(pl.col("kind") == "runtime")
        tid = _mode(rt.get_column("tid")) if rt.height else None
    return tid


def build_graph(df: pl.DataFrame, instances: pl.DataFrame | None = None) -> ReplayGraph:
    """Build the replay graph of every rank in ``df`` (a trace.parquet frame).

    ``instances``: matched collective instances on the trace's clock (``rank, arrival_ns, dur_ns, pg, seq,
    transfer_ns``: :meth:`tracekit.analysis.result.AnalysisResult.instances_in_input_time`); default: matched
    here by :func:`tracekit.core.collectives.match_collectives`.

    Raises :class:`InputError` when the frame has no GPU ops or no CUDA runtime
    calls (replay needs both, i.e. a torch.profiler/Kineto or nsys trace with
    CUDA activities).
    """
    matched = instances
    need = {"rank", "kind", "ts_ns", "dur_ns"}
    if not need.issubset(df.columns):
        raise InputError(f"trace frame lacks columns {sorted(need - set(df.columns))}; pass a trace.parquet frame")
    q = QualityLog()
    kind_s = pl.col("kind")
    gpu_all = df.filter(kind_s.is_in(list(GPU_OP_KINDS)))
    if gpu_all.height == 0:
        raise InputError("trace has no GPU ops (kernel/memcpy/memset rows); replay needs a CUDA trace")
    if df.filter(kind_s == "runtime").height == 0:
        raise InputError("trace has no CUDA runtime rows; capture with CUDA activities (torch.profiler CUDA) to replay")
    ranks = sorted(int(x) for x in gpu_all.get_column("rank").unique().to_list())
    del gpu_all
    wb = gemm_weight_bytes(df)  # weight bytes of GEMM kernels with recorded shapes (structural what-ifs)
    keep = [c for c in _COLS if c in df.columns]
    df = df.filter(kind_s.is_in(list(REPLAY_KINDS))).select(keep)
    origin = int(df.select(pl.col("ts_ns").min()).item())
    parts = {int(k[0]): v for k, v in df.partition_by("rank", as_dict=True).items()}
    del df

    b = _Builder()
    per_rank: list[dict[str, Any]] = []
    for rank in ranks:
        per_rank.append(_rank_vertices(b, parts.pop(rank), rank, origin, q))

    ops = pl.concat([p["ops"] for p in per_rank], how="vertical_relaxed")
    ops = ops.join(wb.select(pl.col("rank").cast(pl.Int32), (pl.col("ts_ns") - origin).alias("ts"), "w_bytes")
                   .unique(["rank", "ts"]), on=["rank", "ts"], how="left", maintain_order="left")
    instances, op_inst = _collective_instances(ops, q, len(ranks), origin, matched)
    ops = ops.with_columns(pl.Series("inst", op_inst))
    # rendezvous vertices
    inst_obs = instances.get_column("rdv_obs").to_numpy()
    rdv_ids = b.add_vertices(VK_RDV, -1, inst_obs, inst=np.arange(instances.height))
    instances = instances.with_columns(pl.Series("rdv", rdv_ids))
    vinst_gpu = op_inst.copy()

    typical: dict[int, dict[str, int]] = {}
    for p in per_rank:
        typical[p["rank"]] = _rank_edges(b, p, ops.filter(pl.col("rank") == p["rank"]), instances, q)

    ops = ops.with_columns(
        pl.Series("launch_eid", np.concatenate([p["launch_eid"] for p in per_rank])),
        pl.Series("fifo_eid", np.concatenate([p["fifo_eid"] for p in per_rank])),
    )
    return _assemble(b, per_rank, ops, instances, rdv_ids, vinst_gpu, ranks, typical, q, origin)


def _assemble(b: _Builder, per_rank: list[dict[str, Any]], ops: pl.DataFrame, instances: pl.DataFrame, rdv_ids: np.ndarray,
              vinst_gpu: np.ndarray, ranks: list[int], typical: dict[int, dict[str, int]], q: QualityLog,
              origin: int) -> ReplayGraph:
    """The :class:`ReplayGraph` from the builder's vertex and edge parts (each rank's chain starts at its observed time)."""
    vkind = b.cat("v", "kind", np.int8)
    vregion = np.full(vkind.size, -1, np.int64)
    for ids, reg in b.region_parts:
        vregion[ids] = reg
    vinst = b.cat("v", "inst", np.int64)
    gpu_vid = ops.get_column("vid").to_numpy()
    vinst[gpu_vid] = vinst_gpu
    vbase = b.cat("v", "base", np.int64)
    for p in per_rank:
        if p["chain"].size:
            vbase[p["chain"][0]] = p["chain_obs"][0]
    return ReplayGraph(
        origin_ns=origin,
        vkind=vkind,
        vrank=b.cat("v", "rank", np.int32),
        vobs=b.cat("v", "obs", np.int64),
        vdur=b.cat("v", "dur", np.int64),
        vbase=vbase,
        vcat=b.cat("v", "cat", np.int16),
        vinst=vinst,
        vregion=vregion,
        esrc=b.cat("e", "src", np.int64),
        edst=b.cat("e", "dst", np.int64),
        etype=b.cat("e", "type", np.int8),
        efix=b.cat("e", "fix", np.int64),
        egap=b.cat("e", "gap", np.int64),
        efrom_end=b.cat("e", "from_end", bool),
        inst_transfer=instances.get_column("transfer_ns").to_numpy().astype(np.int64),
        inst_rdv=rdv_ids,
        ops=ops,
        steps=pl.concat([p["steps"] for p in per_rank], how="vertical_relaxed"),
        instances=instances,
        ranks=ranks,
        typical=typical,
        quality=q,
    )


def _rank_vertices(b: _Builder, r: pl.DataFrame, rank: int, origin: int, q: QualityLog) -> dict[str, Any]:
    """One rank's vertices: its host chain (runtime calls and step markers, in time order) and its GPU ops."""
    steps = replay_steps(r)
    ops = r.filter(pl.col("kind").is_in(list(GPU_OP_KINDS)))
    tid = _main_tid(r, steps, ops)
    synthetic = steps.height == 0
    if synthetic:
        steps = _whole_rank_step(r, tid, rank, q)
    rt = _host_calls(r, tid, origin, rank, q)
    ch = _chain(b, rt, steps, origin, rank)
    step_tbl = pl.DataFrame({
        "rank": np.full(steps.height, rank, np.int32),
        "step_ord": np.arange(steps.height, dtype=np.int64),
        "step_id": steps.get_column("step_id").cast(pl.Int64),
        "tokens": steps.get_column("tokens").cast(pl.Int64),
        "step_mode": steps.get_column("step_mode").cast(pl.String),
        "obs_ts": ch["s_ts"],
        "obs_dur_ns": ch["s_end"] - ch["s_ts"],
        "start_vid": ch["st_vid"],
        "end_vid": ch["en_vid"],
    })
    ops_tbl = _gpu_vertices(b, ops, rank, origin, step_tbl, synthetic)
    # sync records (for streams of Stream Sync / Stream Wait Event)
    sync = r.filter(pl.col("kind") == "sync").select(pl.col("name").cast(pl.String), "stream", "correlation")
    return {
        "rank": rank, "tid": tid, "chain": ch["vids"], "chain_obs": ch["obs"], "chain_dur": ch["dur"],
        "chain_kind": ch["kind"], "chain_region": ch["region"], "rt": rt, "rt_names": rt.get_column("name").cast(pl.String),
        "rt_vid": ch["rt_vid"], "steps": step_tbl, "ops": ops_tbl, "sync": sync, "origin": origin,
    }


def _whole_rank_step(r: pl.DataFrame, tid: int | None, rank: int, q: QualityLog) -> pl.DataFrame:
    """One synthetic step over the whole rank (its GPU ops and its main thread's runtime calls), flagged."""
    kind_s = pl.col("kind")
    own = kind_s.is_in(list(GPU_OP_KINDS)) | ((kind_s == "runtime") & (pl.col("tid") == tid))
    span = r.filter(own).select(pl.col("ts_ns").min().alias("a"), (pl.col("ts_ns") + pl.col("dur_ns")).max().alias("z"))
    a, z = int(span.item(0, "a")), int(span.item(0, "z"))
    q.add("replay_no_steps", "no step annotations: the whole trace replays as one step", rank=rank)
    return pl.DataFrame({"ts_ns": [a], "dur_ns": [z - a], "step_id": [None], "tokens": [None], "step_mode": [None], "tid": [tid]},
                        schema={"ts_ns": pl.Int64, "dur_ns": pl.Int64, "step_id": pl.Int64, "tokens": pl.Int64,
                                "step_mode": pl.String, "tid": pl.Int64})


def _host_calls(r: pl.DataFrame, tid: int | None, origin: int, rank: int, q: QualityLog) -> pl.DataFrame:
    """The main thread's runtime calls in time order (longest first at equal start), without the calls nested in
    another call of the same thread (driver under runtime)."""
    kind_s = pl.col("kind")
    rt = r.filter((kind_s == "runtime") & (pl.col("tid") == tid)) if tid is not None else r.filter(kind_s == "runtime")
    rt = rt.sort(["ts_ns", "dur_ns"], descending=[False, True])
    ts = _np(rt.get_column("ts_ns")) - origin
    end = ts + _np(rt.get_column("dur_ns"))
    if ts.size:
        prev_max = np.concatenate([[NEG], np.maximum.accumulate(end)[:-1]])
        keep = ~(end <= prev_max)
        if (~keep).any():
            q.add("replay_nested_calls", f"{int((~keep).sum())} nested runtime calls folded into their parent",
                  severity="info", rank=rank)
        rt = rt.filter(pl.Series(keep))
    return rt


def _chain(b: _Builder, rt: pl.DataFrame, steps: pl.DataFrame, origin: int, rank: int) -> dict[str, np.ndarray]:
    """The host chain's vertices: runtime calls and step start/end markers sorted by (time, marker before call),
    the vertex of each call and step marker, and each chain vertex's step region (after its start marker, up to and
    including its end marker; -1 outside every step)."""
    n_rt, n_st = rt.height, steps.height
    s_ts = _np(steps.get_column("ts_ns")) - origin
    s_end = s_ts + _np(steps.get_column("dur_ns"))
    c_ts = np.concatenate([_np(rt.get_column("ts_ns")) - origin, s_ts, s_end])
    c_dur = np.concatenate([_np(rt.get_column("dur_ns")), np.zeros(2 * n_st, np.int64)])
    c_kind = np.concatenate([np.full(n_rt, VK_CPU), np.full(n_st, VK_STEP_START), np.full(n_st, VK_STEP_END)])
    prio = np.concatenate([np.full(n_rt, 2), np.full(n_st, 1), np.zeros(n_st)])
    order = np.lexsort((prio, c_ts))
    chain_local = np.empty_like(order)
    chain_local[order] = np.arange(order.size)
    vids = b.add_vertices(c_kind[order].astype(np.int8), rank, c_ts[order], c_dur[order])
    st_pos = chain_local[n_rt:n_rt + n_st]
    en_pos = chain_local[n_rt + n_st:]
    pos = np.arange(vids.size)
    k = np.searchsorted(st_pos, pos, side="left") - 1
    region = np.where((k >= 0) & (pos <= en_pos[np.maximum(k, 0)] if en_pos.size else False), k, -1)
    b.region_parts.append((vids, region))
    return {"vids": vids, "obs": c_ts[order], "dur": c_dur[order], "kind": c_kind[order], "region": region,
            "rt_vid": vids[chain_local[:n_rt]], "st_vid": vids[st_pos], "en_vid": vids[en_pos], "s_ts": s_ts, "s_end": s_end}


def _gpu_vertices(b: _Builder, ops: pl.DataFrame, rank: int, origin: int, step_tbl: pl.DataFrame, synthetic: bool) -> pl.DataFrame:
    """The rank's GPU ops in start order (graph clock, the columns replay reads, their step and occurrence), each
    with its vertex (``vid``)."""
    step_map = dict(zip(step_tbl.get_column("step_id").to_list(), step_tbl.get_column("step_ord").to_list()))
    ops = ops.sort(["ts_ns"])
    sid = ops.get_column("step_id").cast(pl.Int64)
    ops_tbl = ops.select(
        pl.lit(rank, pl.Int32).alias("rank"),
        (pl.col("ts_ns") - origin).alias("ts"),
        pl.col("dur_ns").alias("dur"),
        pl.col("kind").cast(pl.String),
        pl.col("name").cast(pl.String),
        pl.col("category").cast(pl.String).fill_null("other_compute"),
        pl.col("family").cast(pl.String).fill_null("other"),
        pl.col("device").fill_null(-1).cast(pl.Int64),
        pl.col("stream").fill_null(-1).cast(pl.Int64),
        pl.col("correlation"),
        (pl.col("launch_ts_ns") - origin).alias("launch_ts"),
        pl.col("launch_tid"),
        pl.col("launch_name").cast(pl.String),
        pl.col("pg_name").cast(pl.String),
        pl.col("coll_seq"),
        pl.col("coll_name").cast(pl.String),
        pl.col("coll_in_nelems"),
        pl.col("coll_out_nelems"),
        pl.col("coll_dtype").cast(pl.String),
        pl.col("coll_group_size"),
        pl.col("pg_ranks").cast(pl.String) if "pg_ranks" in ops.columns else pl.lit(None, pl.String).alias("pg_ranks"),
        pl.col("bytes"),
        (pl.lit(0, pl.Int64) if synthetic else
         sid.replace_strict(step_map, default=-1, return_dtype=pl.Int64).fill_null(-1)).alias("step_ord"),
    )
    ops_tbl = ops_tbl.with_columns(
        pl.int_range(pl.len()).over(["step_ord", "name"]).alias("occ"),
        pl.col("category").replace_strict(_CAT_INDEX, default=_CAT_INDEX["other_compute"], return_dtype=pl.Int16)
        .alias("cat_idx"),
    )
    ovid = b.add_vertices(VK_GPU, rank, _np(ops_tbl.get_column("ts")), _np(ops_tbl.get_column("dur")),
                          cat=ops_tbl.get_column("cat_idx").to_numpy())
    return ops_tbl.with_columns(pl.Series("vid", ovid))


# ----------------------------------------------------------------------------- collectives


def _collective_instances(ops: pl.DataFrame, q: QualityLog, n_ranks: int, origin: int,
                          matched: pl.DataFrame | None = None) -> tuple[pl.DataFrame, np.ndarray]:
    """Collective instances of the graph's ops and the instance index per op row (-1 if none).

    Which ops form one instance, and its transfer (min duration over the instance's ranks), come from the one
    matching, :func:`tracekit.core.collectives.match_collectives`: ``matched`` when the caller has it (the
    analysis' instances on the trace's clock: ``rank, arrival_ns, dur_ns, pg, seq, transfer_ns``), else computed
    here from the ops; collective ops ``matched`` does not hold (outside the analysis window) are matched among
    themselves. Name, family, bytes and group size are the members' own metadata.
    """
    cols = {"key": pl.String, "n_members": pl.UInt32, "transfer_ns": pl.Int64, "rdv_obs": pl.Int64, "coll_name": pl.String,
            "family": pl.String, "bytes": pl.Int64, "group_size": pl.Int64, "step_ord": pl.Int64, "occ": pl.Int64}
    c = collective_ops(ops.with_row_index("_row").with_columns((pl.col("ts") + origin).alias("ts_ns"),
                                                               pl.col("dur").alias("dur_ns")), cpu_ranks=[])
    if c.height == 0:
        return pl.DataFrame(schema=cols), np.full(ops.height, -1, np.int64)
    on = ["rank", "ts_ns", "dur_ns"]

    def keyed(m: pl.DataFrame, tag: str) -> pl.DataFrame:
        return m.select(pl.col("rank").cast(pl.Int64), pl.col("arrival_ns").alias("ts_ns"), "dur_ns",
                        pl.format(tag + "{}:{}", pl.col("pg"), pl.col("seq")).alias("key"), "transfer_ns").unique(on, keep="first")

    c = c.with_columns(pl.col("rank").cast(pl.Int64))
    if matched is not None and matched.height:
        c = c.join(keyed(matched, ""), on=on, how="left")
        rest = c.filter(pl.col("key").is_null()).drop("key", "transfer_ns")
        if rest.height:
            c = c.filter(pl.col("key").is_not_null()).vstack(
                rest.join(keyed(match_collectives(_match_frame(rest), cpu_ranks=[]), "rest:"), on=on, how="left")
                .select(c.columns))
    else:
        c = c.join(keyed(match_collectives(_match_frame(c), cpu_ranks=[]), ""), on=on, how="left")
    c = c.filter(pl.col("key").is_not_null()).sort(["rank", "ts"]).with_columns(
        pl.int_range(pl.len()).over(["rank", "step_ord", "family"]).alias("_sidx"))
    dsize = dtype_bytes_expr(pl.col("coll_dtype").cast(pl.String))
    c = c.with_columns(pl.coalesce(pl.col("coll_in_nelems") * dsize, pl.col("bytes")).alias("_bytes"))
    inst = c.group_by("key", maintain_order=True).agg(
        pl.len().alias("n_members"),
        pl.col("transfer_ns").min(),
        (pl.col("ts").max() + pl.col("transfer_ns").min()).alias("rdv_obs"),
        pl.col("coll_name").drop_nulls().first().alias("coll_name"),
        pl.col("family").first(),
        pl.col("_bytes").drop_nulls().first().alias("bytes"),
        pl.coalesce(pl.col("coll_group_size").drop_nulls().first().cast(pl.Int64),
                    pl.col("rank").n_unique().cast(pl.Int64)).alias("group_size"),
        pl.col("step_ord").first(),
        pl.col("_sidx").first().alias("occ"),
        pl.col("rank").n_unique().alias("_nr"),
    )
    dup = inst.filter(pl.col("n_members") != pl.col("_nr"))
    if dup.height:
        q.add("replay_collective_key_collision",
              f"{dup.height} collective instances matched several ops of one rank; instance keys are ambiguous")
    if n_ranks > 1:
        part = inst.filter(pl.col("_nr") < n_ranks)
        if part.height:
            q.add("replay_unmatched_collectives",
                  f"{part.height} of {inst.height} collective instances are not present on every rank; "
                  "they replay as single-rank ops (profiler windows may differ across ranks)")
    inst = inst.drop("_nr").with_row_index("inst").with_columns(pl.col("inst").cast(pl.Int64))
    m = c.select("_row", "key").join(inst.select("key", "inst"), on="key", how="left")
    out = np.full(ops.height, -1, np.int64)
    out[m.get_column("_row").to_numpy()] = m.get_column("inst").to_numpy()
    return inst.drop("inst").select(list(cols)), out


def _match_frame(c: pl.DataFrame) -> pl.DataFrame:
    """The graph's collective ops as :func:`match_collectives` reads them (trace columns, absolute time)."""
    return c.select("rank", "kind", "category", "family", "name", "ts_ns", "dur_ns", "stream", "pg_name", "coll_seq",
                    "coll_name", "coll_in_nelems", "coll_out_nelems", "coll_dtype", "coll_group_size",
                    pl.col("pg_ranks") if "pg_ranks" in c.columns else pl.lit(None, pl.String).alias("pg_ranks"),
                    pl.col("step_ord").alias("step_id"), pl.col("launch_ts").alias("launch_ts_ns"))


# ----------------------------------------------------------------------------- edges


@dataclass(frozen=True)
class _OpArrays:
    """One rank's GPU ops as arrays, in the row order of its op table (sorted by start): vertex, observed start and
    duration, instance (-1: not a collective), the vertex and observed time of its end (a collective's: its
    rendezvous), launch time (its start when no call launched it), stream, stream FIFO predecessor (-1: first on
    its stream) and graph launches (``graph_inner``: its predecessor belongs to the same graph launch)."""

    vid: np.ndarray
    ts: np.ndarray
    dur: np.ndarray
    inst: np.ndarray
    is_coll: np.ndarray
    end_vid: np.ndarray
    end_obs: np.ndarray
    from_end: np.ndarray
    lts: np.ndarray
    no_launch: np.ndarray
    stream: np.ndarray
    prev: np.ndarray
    is_graph: np.ndarray
    graph_inner: np.ndarray


def _op_arrays(ops: pl.DataFrame, instances: pl.DataFrame, rank: int, q: QualityLog) -> _OpArrays:
    rdv = instances.get_column("rdv").to_numpy() if instances.height else np.zeros(0, np.int64)
    rdv_obs = instances.get_column("rdv_obs").to_numpy() if instances.height else np.zeros(0, np.int64)
    o_vid = _np(ops.get_column("vid"))
    o_ts = _np(ops.get_column("ts"))
    o_dur = _np(ops.get_column("dur"))
    o_inst = _np(ops.get_column("inst"), -1)
    o_is_coll = o_inst >= 0
    # the op's "end": its rendezvous vertex for collectives
    o_end_vid = np.where(o_is_coll, rdv[np.maximum(o_inst, 0)] if rdv.size else o_vid, o_vid)
    o_end_obs = np.where(o_is_coll, rdv_obs[np.maximum(o_inst, 0)] if rdv_obs.size else o_ts + o_dur, o_ts + o_dur)
    lts_s = ops.get_column("launch_ts")
    no_launch = lts_s.is_null().to_numpy()
    if no_launch.any():
        q.add("replay_unlaunched_ops", f"{int(no_launch.sum())} GPU ops have no launching call (no correlation); "
              "anchored to the host timeline at their observed start", rank=rank)
    n_ops = o_ts.size
    # stream FIFO predecessor
    dev = _np(ops.get_column("device"), -1)
    stream = _np(ops.get_column("stream"), -1)
    sk = np.lexsort((o_ts, stream, dev))
    same = np.zeros(n_ops, bool)
    if n_ops > 1:
        same[sk[1:]] = (stream[sk[1:]] == stream[sk[:-1]]) & (dev[sk[1:]] == dev[sk[:-1]])
    prev = np.full(n_ops, -1, np.int64)
    prev[sk[1:]] = np.where(same[sk[1:]], sk[:-1], -1)
    # graph launches: ops sharing a correlation with a cudaGraphLaunch; within one launch, ops whose stream
    # predecessor belongs to the same launch have no launch edge
    corr = ops.get_column("correlation").fill_null(-1).to_numpy()
    is_graph = ops.get_column("launch_name").is_in(list(_GRAPH_LAUNCH)).fill_null(False).to_numpy()
    graph_inner = is_graph & (prev >= 0) & (corr == np.where(prev >= 0, corr[np.maximum(prev, 0)], -2))
    return _OpArrays(o_vid, o_ts, o_dur, o_inst, o_is_coll, o_end_vid, o_end_obs, ~o_is_coll,
                     np.where(no_launch, o_ts, _np(lts_s)), no_launch, stream, prev, is_graph, graph_inner)


def _rank_edges(b: _Builder, p: dict[str, Any], ops: pl.DataFrame, instances: pl.DataFrame, q: QualityLog) -> dict[str, int]:
    """One rank's edges: launch, stream FIFO, cross-stream event and rendezvous edges of its GPU ops, each weighted
    so that replaying the observed trace reproduces it (replay_model.md §4), then its host program order and syncs."""
    a = _op_arrays(ops, instances, p["rank"], q)
    chain, c_obs = p["chain"], p["chain_obs"]
    o_vid, o_ts, o_is_coll, o_end_vid, o_end_obs = a.vid, a.ts, a.is_coll, a.end_vid, a.end_obs
    o_from_end, o_lts, no_launch, stream, prev = a.from_end, a.lts, a.no_launch, a.stream, a.prev
    is_graph, graph_inner, n_ops = a.is_graph, a.graph_inner, a.ts.size
    # ---- launch source vertex in the chain
    li = _asof_back(c_obs, o_lts)
    li = np.maximum(li, 0)
    l_src = chain[li]
    l_off = o_lts - c_obs[li]
    lam_obs = o_ts - o_lts
    prev_end_obs = np.where(prev >= 0, o_end_obs[np.maximum(prev, 0)], NEG)
    # ---- cross-stream event edges
    ev_src, ev_dst = _event_edges(p, ops, o_lts, stream, prev, q)
    ev_src_end_obs = o_end_obs[ev_src] if ev_src.size else np.zeros(0, np.int64)
    ev_max = np.full(n_ops, NEG, np.int64)
    if ev_src.size:
        np.maximum.at(ev_max, ev_dst, ev_src_end_obs)
    idle = ((prev < 0) | (prev_end_obs <= o_lts)) & (ev_max <= o_lts)
    lam_typ = _median(lam_obs[idle & ~is_graph & ~no_launch], _DEFAULT_LAMBDA_NS)
    lam_typ = max(lam_typ, 0)
    queued = (prev >= 0) & (o_lts + lam_typ <= prev_end_obs)
    delta_obs = o_ts - prev_end_obs
    delta_typ = max(_median(delta_obs[queued & ~o_is_coll[np.maximum(prev, 0)]], _DEFAULT_DELTA_NS), 0)

    # ---- binding decision per op (replay_model.md §4)
    cand_launch = np.where(graph_inner, NEG, o_lts + lam_typ)
    cand_fifo = np.where(prev >= 0, prev_end_obs + delta_typ, NEG)
    cand_ev = ev_max
    cands = np.vstack([cand_launch, cand_fifo, cand_ev])
    binding = np.argmax(cands, axis=0)
    has_any = cands.max(axis=0) > NEG
    binding = np.where(has_any, binding, 0)
    # launch edge
    l_w = np.where(binding == 0, lam_obs, np.minimum(lam_typ, lam_obs))
    sel = ~graph_inner
    launch_eid = np.full(n_ops, -1, np.int64)
    launch_eid[sel] = b.add_edges(l_src[sel], o_vid[sel], ET_LAUNCH, (l_off + l_w)[sel])
    b.region_parts.append((o_vid, p["chain_region"][li] if li.size else np.zeros(0, np.int64)))
    # FIFO edge
    f_w = np.where(binding == 1, delta_obs, np.minimum(delta_typ, delta_obs))
    sel = prev >= 0
    pv = prev[sel]
    fifo_eid = np.full(n_ops, -1, np.int64)
    fifo_eid[sel] = b.add_edges(o_end_vid[pv], o_vid[sel], ET_FIFO, f_w[sel], from_end=o_from_end[pv])
    p["launch_eid"], p["fifo_eid"] = launch_eid, fifo_eid
    # event edges
    if ev_src.size:
        slack = o_ts[ev_dst] - ev_src_end_obs
        is_bind = (binding[ev_dst] == 2) & (ev_src_end_obs == ev_max[ev_dst])
        e_w = np.where(is_bind, slack, np.minimum(0, slack))
        b.add_edges(o_end_vid[ev_src], o_vid[ev_dst], ET_EVENT, e_w, from_end=o_from_end[ev_src])
    # rendezvous arrivals (weight set from the instance transfer at simulation time)
    sel = o_is_coll
    b.add_edges(o_vid[sel], o_end_vid[sel], ET_RDV, np.zeros(int(sel.sum()), np.int64))

    # ---- CPU program order + syncs
    sync_typ = _cpu_edges(b, p, ops, o_lts, o_end_vid, o_end_obs, o_from_end, stream, q)
    return {"lambda_ns": lam_typ, "delta_ns": delta_typ, **sync_typ,
            "n_event_edges": int(ev_src.size), "tid": p["tid"] if p["tid"] is not None else -1}


def _event_edges(p: dict[str, Any], ops: pl.DataFrame, o_lts: np.ndarray, stream: np.ndarray, prev: np.ndarray,
                 q: QualityLog) -> tuple[np.ndarray, np.ndarray]:
    """(source op row, dependent op row) pairs for cross-stream waits, with the c10d fallback."""
    rt, names_s = p["rt"], p["rt_names"]
    r_ts = _np(rt.get_column("ts_ns")) - p["origin"]
    r_corr = rt.get_column("correlation").fill_null(-1).to_numpy()
    n_ops = o_lts.size
    if n_ops == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    lorder = np.lexsort((_np(ops.get_column("ts")), o_lts))  # launch order
    l_sorted = o_lts[lorder]
    srcs: list[np.ndarray] = []
    dsts: list[np.ndarray] = []
    waits = np.flatnonzero(names_s.is_in(list(_STREAM_WAIT)).to_numpy())
    rec_mask = names_s.is_in(list(_EVENT_RECORD)).to_numpy()
    if waits.size:
        sync = p["sync"]
        wmap = dict(zip(sync.get_column("correlation").to_list(), sync.get_column("stream").to_list()))
        rec_idx = np.flatnonzero(rec_mask)
        rec_ts = r_ts[rec_idx]
        w_ts = r_ts[waits]
        # source: last op launched before the preceding event record
        ri = _asof_back(rec_ts, w_ts)
        ok = ri >= 0
        src_q = np.where(ok, rec_ts[np.maximum(ri, 0)], NEG) if rec_ts.size else np.full(w_ts.size, NEG)
        si = _asof_back(l_sorted, src_q)
        ok &= si >= 0
        src_row = lorder[np.maximum(si, 0)]
        # waiting stream: from the sync record, else the stream of the next op launched after the wait
        nxt = np.searchsorted(l_sorted, w_ts, side="right")
        has_next = nxt < n_ops
        next_row = lorder[np.minimum(nxt, n_ops - 1)]
        w_stream = np.array([wmap.get(int(c)) if wmap.get(int(c)) not in (None, -1) else -1 for c in r_corr[waits]],
                            dtype=np.int64) if waits.size else np.zeros(0, np.int64)
        w_stream = np.where(w_stream >= 0, w_stream, np.where(has_next, stream[next_row], -1))
        # dependent: first op on the waiting stream launched after the wait
        dep = _first_on_stream_after(o_lts, stream, w_ts, w_stream)
        ok &= (dep >= 0) & (stream[src_row] != w_stream)
        srcs.append(src_row[ok])
        dsts.append(dep[ok])
    src = np.concatenate(srcs) if srcs else np.zeros(0, np.int64)
    dst = np.concatenate(dsts) if dsts else np.zeros(0, np.int64)
    # c10d fallback for communication ops on side streams without an incoming event edge
    is_comm = (ops.get_column("category") == "communication").fill_null(False).to_numpy()
    main = int(np.bincount(stream - stream.min()).argmax() + stream.min()) if n_ops else -1
    side_coll = np.flatnonzero(is_comm & (stream != main))
    side_coll = side_coll[~np.isin(side_coll, dst)]
    if side_coll.size:
        is_main = stream[lorder] == main
        main_rows = lorder[is_main]
        main_l = l_sorted[is_main]
        bi = _asof_back(main_l, o_lts[side_coll] - 1)
        ok = bi >= 0
        fb_src = np.concatenate([main_rows[np.maximum(bi, 0)][ok]])
        fb_dst = side_coll[ok]
        ai = np.searchsorted(main_l, o_lts[side_coll], side="right")
        ok2 = ai < main_rows.size
        src = np.concatenate([src, fb_src, side_coll[ok2]])
        dst = np.concatenate([dst, fb_dst, main_rows[np.minimum(ai, main_rows.size - 1)][ok2]])
        q.add("replay_c10d_fallback", f"{side_coll.size} side-stream collectives without a resolvable event wait: "
              "using the c10d fallback (main stream → collective → next main-stream op)", severity="info",
              rank=p["rank"])
    if waits.size and not rec_mask.any():
        q.add("replay_unresolved_waits", f"{waits.size} cudaStreamWaitEvent calls without a cudaEventRecord on "
              "the launching thread; their cross-stream edges are missing", rank=p["rank"])
    return src.astype(np.int64), dst.astype(np.int64)


def _first_on_stream_after(o_lts: np.ndarray, stream: np.ndarray, t: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Per query (t, s): row of the first op on stream s launched after t, -1 if none."""
    order = np.lexsort((o_lts, stream))
    st_sorted, lt_sorted = stream[order], o_lts[order]
    lo = np.searchsorted(st_sorted, s, side="left")
    hi = np.searchsorted(st_sorted, s, side="right")
    # position within the stream block via a combined key
    out = np.full(t.size, -1, np.int64)
    for u in np.unique(s):
        m = s == u
        a, z = int(lo[m][0]), int(hi[m][0])
        if a == z:
            continue
        k = np.searchsorted(lt_sorted[a:z], t[m], side="right")
        ok = k < (z - a)
        res = np.full(k.size, -1, np.int64)
        res[ok] = order[a + k[ok]]
        out[m] = res
    return out


def _last_on_stream_before(o_lts: np.ndarray, o_ts: np.ndarray, stream: np.ndarray, t: np.ndarray,
                           s: np.ndarray) -> np.ndarray:
    """Per query (t, s): row of the last op on stream s launched before t (s == -2: any stream)."""
    out = np.full(t.size, -1, np.int64)
    for u in np.unique(s):
        m = s == u
        rows = np.flatnonzero(stream == u) if u != -2 else np.arange(stream.size)
        if rows.size == 0:
            continue
        rows = rows[np.lexsort((o_ts[rows], o_lts[rows]))]
        k = _asof_back(o_lts[rows], t[m] - 1)
        res = np.where(k >= 0, rows[np.maximum(k, 0)], -1)
        out[m] = res
    return out


def _pageable_copies_block(kinds: pl.Series, r_corr: np.ndarray, ops: pl.DataFrame) -> pl.Series:
    """An async copy call whose copy is device → pageable host memory returns only when the copy is done (CUDA
    stages it through a bounce buffer): it blocks like a synchronous copy (``self``). ``.tolist()``/``.cpu()``
    readbacks are such copies."""
    name = ops.get_column("name").cast(pl.String).fill_null("")
    sync_copy = name.str.contains("DtoH").to_numpy() & name.str.contains("Pageable").to_numpy()
    if not sync_copy.any():
        return kinds
    corr = set(ops.get_column("correlation").fill_null(-1).to_numpy()[sync_copy].tolist())
    hit = np.isin(r_corr, list(corr)) & (kinds == "").to_numpy()
    return pl.Series(kinds.name, np.where(hit, "self", kinds.to_numpy()), dtype=pl.String)


def _cpu_edges(b: _Builder, p: dict[str, Any], ops: pl.DataFrame, o_lts: np.ndarray, o_end_vid: np.ndarray,
               o_end_obs: np.ndarray, o_from_end: np.ndarray, stream: np.ndarray, q: QualityLog) -> dict[str, int]:
    """The host chain's edges: each blocking call's sync-end vertex with its self and wait edges (the waited GPU ops:
    :func:`_waited_ops`), then program order along the chain (a sync call's "end" is its sync-end vertex)."""
    chain, c_obs, c_dur = p["chain"], p["chain_obs"], p["chain_dur"]
    n = chain.size
    if n == 0:
        return {"sync_self_ns": 0, "sync_tail_ns": 0, "n_syncs": 0}
    rt_vid = p["rt_vid"]
    r_ts = _np(p["rt"].get_column("ts_ns")) - p["origin"]
    r_dur = _np(p["rt"].get_column("dur_ns"))
    wc, wo = _waited_ops(p, ops, o_lts, stream, r_ts)
    sync_calls = np.unique(wc)
    # sync-end vertices
    z_obs = r_ts[sync_calls] + r_dur[sync_calls]
    z_vid = b.add_vertices(VK_SYNC_END, p["rank"], z_obs)
    zpos = {int(c): i for i, c in enumerate(sync_calls)}
    z_of_wc = np.array([zpos[int(c)] for c in wc], np.int64) if wc.size else np.zeros(0, np.int64)
    w_end = o_end_obs[wo] if wo.size else np.zeros(0, np.int64)
    wmax = np.full(sync_calls.size, NEG, np.int64)
    if wo.size:
        np.maximum.at(wmax, z_of_wc, w_end)
    s_start = r_ts[sync_calls]
    waited = wmax > s_start  # the wait was binding-ish
    self_typ = _median(r_dur[sync_calls][~waited], _DEFAULT_SYNC_SELF_NS)
    tail_typ = max(_median((z_obs - wmax)[waited], _DEFAULT_SYNC_TAIL_NS), 0)
    # binding: wait if its candidate is later
    cand_self = s_start + self_typ
    cand_wait = np.where(wmax > NEG, wmax + tail_typ, NEG)
    bind_wait = cand_wait > cand_self
    self_w = np.where(bind_wait, np.minimum(self_typ, r_dur[sync_calls]), r_dur[sync_calls])
    b.add_edges(rt_vid[sync_calls], z_vid, ET_SYNC_SELF, self_w)
    if wo.size:
        slack = z_obs[z_of_wc] - w_end
        is_b = bind_wait[z_of_wc] & (w_end == wmax[z_of_wc])
        tw = np.where(is_b, slack, np.minimum(tail_typ, slack))
        b.add_edges(o_end_vid[wo], z_vid[z_of_wc], ET_SYNC_WAIT, tw, from_end=o_from_end[wo])
    # CPU program order: the "end" of a sync call is its sync-end vertex
    end_vid = chain.copy()
    end_obs = c_obs + c_dur
    from_end = np.ones(n, bool)
    chain_pos = np.searchsorted(chain, rt_vid[sync_calls])  # chain ids are contiguous and increasing
    end_vid[chain_pos] = z_vid
    from_end[chain_pos] = False
    if n > 1:
        gap = c_obs[1:] - end_obs[:-1]
        b.add_edges(end_vid[:-1], chain[1:], ET_CPU, np.minimum(gap, 0), gap=np.maximum(gap, 0),
                    from_end=from_end[:-1])
    return {"sync_self_ns": self_typ, "sync_tail_ns": tail_typ, "n_syncs": int(sync_calls.size)}


def _waited_ops(p: dict[str, Any], ops: pl.DataFrame, o_lts: np.ndarray, stream: np.ndarray,
                r_ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(blocking call row, GPU op row it waits for) pairs: a stream sync waits for the last op launched on its stream
    before it, a device sync for the last one of every stream, an event sync for the last op before the event's
    record, a synchronous copy for its own op. Calls without a waited op are left out."""
    names_s = p["rt_names"]
    r_corr = p["rt"].get_column("correlation").fill_null(-1).to_numpy()
    kinds_s = names_s.to_frame("n").select(_blocking.blocking_kind_expr(pl.col("n"))).to_series()
    kinds_s = _pageable_copies_block(kinds_s, r_corr, ops)
    blk = np.flatnonzero((kinds_s != "").to_numpy())
    k = kinds_s.gather(blk).to_numpy() if blk.size else np.zeros(0, object)
    o_ts = _np(ops.get_column("ts"))
    w_call: list[np.ndarray] = []
    w_op: list[np.ndarray] = []
    if blk.size and o_ts.size:
        sync = p["sync"]
        smap = {int(c): int(s) for c, s in zip(sync.get_column("correlation").fill_null(-1).to_list(),
                                              sync.get_column("stream").fill_null(-1).to_list()) if s is not None}
        t = r_ts[blk]
        m = k == "stream"
        if m.any():
            s = np.array([smap.get(int(c), -1) for c in r_corr[blk[m]]], np.int64)
            last_any = _last_on_stream_before(o_lts, o_ts, stream, t[m], np.full(int(m.sum()), -2))
            s = np.where(s >= 0, s, np.where(last_any >= 0, stream[np.maximum(last_any, 0)], -1))
            w_call.append(blk[m])
            w_op.append(_last_on_stream_before(o_lts, o_ts, stream, t[m], s))
        m = k == "device"
        if m.any():
            for u in np.unique(stream):
                w_call.append(blk[m])
                w_op.append(_last_on_stream_before(o_lts, o_ts, stream, t[m], np.full(int(m.sum()), u)))
        m = k == "event"
        if m.any():
            rec = np.flatnonzero(names_s.is_in(list(_EVENT_RECORD)).to_numpy())
            ri = _asof_back(r_ts[rec], t[m])
            qt = np.where(ri >= 0, r_ts[rec][np.maximum(ri, 0)], t[m]) if rec.size else t[m]
            w_call.append(blk[m])
            w_op.append(_last_on_stream_before(o_lts, o_ts, stream, qt, np.full(int(m.sum()), -2)))
        m = k == "self"
        if m.any():
            corr_o = ops.get_column("correlation").fill_null(-2).to_numpy()
            pos = {int(c): i for i, c in enumerate(corr_o)}
            w_call.append(blk[m])
            w_op.append(np.array([pos.get(int(c), -1) for c in r_corr[blk[m]]], np.int64))
    wc = np.concatenate(w_call) if w_call else np.zeros(0, np.int64)
    wo = np.concatenate(w_op) if w_op else np.zeros(0, np.int64)
    ok = wo >= 0
    return wc[ok], wo[ok]
