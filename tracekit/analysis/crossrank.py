"""Cross-rank sections of ``tracekit analyze`` (one entry point for ``tracekit.api``).

``cross_rank_sections(df, meta, opts)`` runs clock alignment, collective matching,
stalls, idle causes, PCIe phases, power verdicts, step statistics and kernel
efficiency, and returns JSON-ready sections plus plain-words ``findings`` (most
costly first). ``_comm_parts`` (a frame, not JSON) carries the per-kernel
wait/transfer intervals for the breakdown, in the frame's original time base.
Every number is defined in ``docs/metrics.md``.

It runs in three steps so that ``tracekit.api.analyze`` never holds more than one rank:
:func:`cross_rank_plan` (the cross-rank work, on the collective and step rows of all
ranks), :func:`cross_rank_part` (the per-rank analyses, on one rank's rows — or, here,
once on the whole frame) and :func:`cross_rank_finish` (exact reduce of the parts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import polars as pl

from tracekit._errors import QualityLog
from tracekit.analysis.align import AlignResult, apply_offsets, solve_clock_offsets
from tracekit.analysis.collectives import (collective_ops, collective_quality, collective_summary, match_collectives,
                                           split_communication)
from tracekit.analysis.efficiency import efficiency_finish, kernel_efficiency, moe_gemm_finish, moe_gemm_findings, moe_gemm_part
from tracekit.analysis.experts import expert_load_finding, expert_load_finish, expert_load_part
from tracekit.analysis.findings import Finding, cross_rank_candidates, rank_findings
from tracekit.analysis.interconnect import interconnect_verdict
from tracekit.analysis.intervals import in_spans
from tracekit.analysis.gaps import IdleCauses, idle_causes, restrict_to_spans
from tracekit.analysis.pcie import PciePart, pcie_finish, pcie_part
from tracekit.analysis.power import PowerResult, power_finish, power_part
from tracekit.analysis.stalls import (MIN_REL_STEP, MIN_WAIT_NS, StallPart, StallPlan, empty_stalls, lost_by_rank, stall_finish,
                                      stall_part, stall_plan, stall_steps, stall_summary)
from tracekit.analysis.steps import StepPart, comm_wait_by_step, step_finish, step_part
from tracekit.analysis.result import INSTANCE_VIEW_COLUMNS
from tracekit.analysis.window import cpu_mode_ranks, device_op_expr

__all__ = ["cross_rank_sections", "cross_rank_plan", "cross_rank_part", "cross_rank_finish", "CrossRankPlan", "CrossRankPart",
           "SECTION_KEYS"]

SECTION_KEYS = ("stalls", "collectives", "idle_causes_ns", "idle_gaps", "pcie_phases", "power", "steps", "kernel_efficiency", "moe_gemm",
                "interconnect", "expert_load", "findings")



def _window_bounds(win: Any) -> tuple[int | None, int | None]:
    if win is None:
        return None, None
    return getattr(win, "start_ns", None), getattr(win, "end_ns", None)


def _clip_rows(df: pl.DataFrame, lo: int | None, hi: int | None) -> pl.DataFrame:
    if lo is None and hi is None:
        return df
    e = pl.lit(True)
    if lo is not None:
        e = e & ((pl.col("ts_ns") + pl.col("dur_ns")) > lo)
    if hi is not None:
        e = e & (pl.col("ts_ns") < hi)
    return df.filter(e)


def _records(df: pl.DataFrame, n: int | None = None) -> list[dict[str, Any]]:
    if df.height == 0:
        return []
    return (df.head(n) if n else df).to_dicts()


@dataclass
class CrossRankPlan:
    """The cross-rank half of :func:`cross_rank_sections`, from the small cross-rank rows only.

    ``inst``: matched instances (aligned time base) with arrival inside the window, only the
    columns the per-rank analyses read (``name`` categorical); ``groups``, ``per_rank``,
    ``instances``: the collective summaries, already computed; ``waits``: ``rank, arrival_ns, wait_ns``
    of every instance in the input's time base (:meth:`comm_parts` splits each rank's collective
    kernels with it); ``split``: whether the breakdown splits communication (some collective
    kernel has a duration).
    """

    meta: Mapping[str, Any]
    quality: QualityLog
    max_items: int
    lo: int | None
    hi: int | None
    spans: Any
    align: AlignResult
    inst: pl.DataFrame
    groups: pl.DataFrame
    per_rank: pl.DataFrame
    instances: int
    waits: pl.DataFrame
    split: bool
    cpu_ranks: list[int]
    comm_wait: pl.DataFrame | None
    stalls: StallPlan | None
    min_wait: int
    min_rel: float
    #: matched instances in the window for the views (:data:`tracekit.analysis.result.INSTANCE_VIEW_COLUMNS`), aligned clock
    view: pl.DataFrame | None = None

    def comm_parts(self, df: pl.DataFrame, ranks: list[int] | None = None) -> pl.DataFrame:
        """Wait/transfer intervals of the collective kernels in ``df`` (input time base) for the breakdown."""
        w = self.waits if ranks is None else self.waits.filter(pl.col("rank").is_in(ranks))
        return split_communication(df, w, cpu_ranks=self.cpu_ranks)

    def rank_instances(self, ranks: list[int] | None) -> pl.DataFrame:
        """Instance rows of ``ranks`` (all when None) as :func:`match_collectives` types them."""
        i = self.inst if ranks is None else self.inst.filter(pl.col("rank").is_in(ranks))
        return i.with_columns(pl.col("name").cast(pl.String))


@dataclass
class CrossRankPart:
    """Small outputs of :func:`cross_rank_part` for the ranks of one frame."""

    stalls: StallPart | None
    idle_totals: pl.DataFrame
    idle_largest: pl.DataFrame
    pcie: PciePart
    power: PowerResult
    steps: StepPart | None
    efficiency: pl.DataFrame
    moe: pl.DataFrame  # per (rank, step): MoE GEMM time, launches, tokens (efficiency.moe_gemm_part)
    experts: pl.DataFrame  # per-expert loop input projections (experts.expert_load_part)
    extents: pl.DataFrame  # rank, w: device-op extent per rank in the window (findings)
    rows: int  # rows in the window
    gpu_rows: int  # GPU-op rows in the window (0 and rows > 0: CPU mode)
    observed: dict[int, int] | None


def cross_rank_plan(
    small: pl.DataFrame,
    meta: Mapping[str, Any],
    opts: Mapping[str, Any] | None = None,
    *,
    ranks: list[int] | None = None,
    cpu_ranks: list[int] | None = None,
) -> CrossRankPlan:
    """Collective matching, clock offsets, instance window, communication split and the stall plan.

    ``small``: the trace's collective and step rows (:attr:`tracekit.analysis.window.Overview.small`,
    or a whole frame); ``ranks``/``cpu_ranks``: of the whole trace (default: from ``small``).
    ``opts`` as for :func:`cross_rank_sections`.
    """
    opts = dict(opts or {})
    qv = opts.get("quality")
    q: QualityLog = qv if isinstance(qv, QualityLog) else QualityLog()
    max_items = int(opts.get("max_items", 200))
    lo, hi = _window_bounds(opts.get("window"))
    if ranks is None:
        ranks = sorted(int(r) for r in small.get_column("rank").unique().to_list())
    if cpu_ranks is None:
        cpu_ranks = cpu_mode_ranks(small)
    coll = collective_ops(small, cpu_ranks=cpu_ranks)
    step_rows = small.filter(pl.col("kind") == "step")
    del small  # the caller may hand its only reference over: the collective and step rows are all that is kept
    inst0 = match_collectives(coll, cpu_ranks=cpu_ranks)
    al = solve_clock_offsets(ranks, inst0, meta)
    q.extend(al.quality)
    inst_all = match_collectives(apply_offsets(coll, al.offsets_ns), cpu_ranks=cpu_ranks) if al.applied else inst0
    q.extend(collective_quality(inst_all))
    inst = inst_all
    if lo is not None:
        inst = inst.filter(pl.col("arrival_ns") >= lo)
    if hi is not None:
        inst = inst.filter(pl.col("arrival_ns") < hi)
    # communication split in the caller's (unaligned) time base
    back = {int(k): -int(v) for k, v in al.offsets_ns.items()}
    inst_orig = inst_all.with_columns(
        (pl.col("arrival_ns") + pl.col("rank").replace_strict(back, default=0, return_dtype=pl.Int64)).alias("arrival_ns")
    ) if al.applied else inst_all
    waits = inst_orig.select("rank", "arrival_ns", "wait_ns")
    split = coll.filter(pl.col("dur_ns") > 0).height > 0  # = split_communication(coll, inst_orig) has rows
    del inst_orig, inst0, inst_all
    min_wait = int(opts.get("min_wait_ns", MIN_WAIT_NS))
    min_rel = float(opts.get("min_rel_step", MIN_REL_STEP))
    # stalls read the step rows of the aligned frame inside the window (the same rows each rank's slice holds)
    del coll
    steps = _clip_rows(apply_offsets(step_rows, al.offsets_ns) if al.applied else step_rows, lo, hi)
    sp = stall_plan(inst, stall_steps(steps), min_wait_ns=min_wait, min_rel_step=min_rel)
    comm_wait = comm_wait_by_step(inst)
    groups = collective_summary(inst)
    per_rank = inst.group_by("rank").agg(
        pl.col("dur_ns").sum().alias("kernel_ns"), pl.col("wait_ns").sum().alias("wait_ns"),
        (pl.col("dur_ns") - pl.col("wait_ns")).sum().alias("transfer_ns"),
    ).sort("rank") if inst.height else pl.DataFrame()
    n_inst = int(inst.select(pl.struct("pg", "seq").n_unique()).item()) if inst.height else 0
    view = inst.select([c for c in INSTANCE_VIEW_COLUMNS if c in inst.columns])
    inst = inst.select(_INST_KEEP).with_columns(pl.col("name").cast(pl.Categorical))
    return CrossRankPlan(meta, q, max_items, lo, hi, getattr(opts.get("window"), "spans", None), al, inst, groups, per_rank,
                         n_inst, waits, split, list(cpu_ranks), comm_wait, sp, min_wait, min_rel, view)


#: instance columns the per-rank analyses read (idle causes: waiting_on_peer; PCIe: collective phases)
_INST_KEEP = ["rank", "name", "step_id", "arrival_ns", "end_ns", "wait_ns", "transfer_ns", "late_rank", "bus_bw_bytes_per_s"]


def cross_rank_part(df: pl.DataFrame, plan: CrossRankPlan, *, ranks: list[int] | None = None,
                    host: pl.DataFrame | None = None) -> CrossRankPart:
    """Per-rank analyses (stall inputs, idle causes, PCIe, power, steps, kernel efficiency) of the ranks in ``df``.

    ``df``: one rank's rows (then ``ranks=[r]`` narrows the instance table to it) or a whole frame
    (``ranks=None``), in the input's time base; the plan's clock offsets and window are applied here.
    ``host``: :func:`tracekit.analysis.gaps.host_activity` of the ranks (input time base) when ``df``
    does not hold every host row (a projected scan); default: from ``df``.
    """
    lo, hi, meta = plan.lo, plan.hi, plan.meta
    adf = apply_offsets(df, plan.align.offsets_ns) if plan.align.applied else df
    wdf = _clip_rows(adf, lo, hi)
    del adf
    inst = plan.rank_instances(ranks)
    stalls = stall_part(plan.stalls, wdf) if plan.stalls is not None else None
    window = (lo, hi) if lo is not None and hi is not None else None
    if host is not None and plan.align.applied and host.height:
        off = {int(k): int(v) for k, v in plan.align.offsets_ns.items()}
        sh = pl.col("rank").replace_strict(off, default=0, return_dtype=pl.Int64)
        host = host.with_columns(pl.col("start") + sh, pl.col("end") + sh)
    idle = idle_causes(wdf, inst, window=window, host=host)
    observed = None
    spans = plan.spans
    if spans:  # windowed capture: time between profiler windows was not recorded
        idle = restrict_to_spans(idle, spans)
        wdf = wdf.filter(in_spans(spans, pl.col("ts_ns"), pl.col("ts_ns") + pl.col("dur_ns"), closed=True))
        total = sum(int(b) - int(a) for a, b in spans)
        observed = {int(r): total for r in wdf.get_column("rank").unique().to_list()}
    pcie = pcie_part(wdf, meta, instances=inst)
    pw = power_part(wdf, meta, observed_ns=observed)
    st = step_part(wdf, plan.comm_wait)
    eff = kernel_efficiency(wdf, meta)
    ext = wdf.lazy().filter(device_op_expr(cpu_mode_ranks(wdf))).group_by("rank").agg(
        ((pl.col("ts_ns") + pl.col("dur_ns")).max() - pl.col("ts_ns").min()).alias("w")).collect()
    gpu_rows = int(wdf.select(pl.col("kind").is_in(["kernel", "memcpy", "memset"]).sum()).item())
    moe = moe_gemm_part(wdf, meta)
    return CrossRankPart(stalls, idle.totals, idle.largest, pcie, pw, st, eff, moe, expert_load_part(wdf), ext, wdf.height, gpu_rows,
                         observed)


def cross_rank_finish(plan: CrossRankPlan, parts: list[CrossRankPart], tables: dict[str, Any] | None = None) -> dict[str, Any]:
    """JSON sections from the plan and every rank's :class:`CrossRankPart` (see :func:`cross_rank_sections`).

    ``tables``: when given, receives the full frames behind the sections (``steps``: the step table)."""
    q, max_items, al = plan.quality, plan.max_items, plan.align
    if plan.stalls is not None:
        stalls = stall_finish(plan.stalls, [p.stalls for p in parts if p.stalls is not None])
    else:
        stalls = empty_stalls()
    ssum = stall_summary(stalls)
    lost = lost_by_rank(stalls)
    idle = IdleCauses(pl.DataFrame(), _concat([p.idle_totals for p in parts], _IDLE_TOTALS),
                      _concat([p.idle_largest for p in parts], _IDLE_GAPS))
    pcie = pcie_finish([p.pcie for p in parts])
    pw = power_finish([p.power for p in parts])
    st = step_finish([p.steps for p in parts if p.steps is not None])
    q.extend(st.quality)
    if tables is not None:
        tables["steps"] = st.steps
    eff = efficiency_finish([p.efficiency for p in parts])
    observed: dict[int, int] | None = None
    if plan.spans:
        observed = {}
        for p in parts:
            observed.update(p.observed or {})
    out: dict[str, Any] = {
        "stalls": _records(stalls.sort("wait_ns", descending=True, maintain_order=True).select(
            "waiting_rank", "late_rank", "wait_ns", "ts_ns", "step", "collective", "cause", "detail"), max_items),
        "collectives": {
            "clock_alignment": al.to_json(),
            "instances": plan.instances,
            "groups": _records(plan.groups),
            "per_rank": _records(plan.per_rank),
            "stall_count": stalls.height,
            "stall_summary": _records(ssum),
            "lost_by_rank": {str(r): int(v) for r, v in zip(lost["rank"].to_list(), lost["lost_ns"].to_list())},
            "thresholds": {"min_wait_ns": plan.min_wait, "min_rel_step": plan.min_rel},
        },
        "idle_causes_ns": idle.by_rank_ns(),
        "idle_gaps": {str(r): _records(g.drop("rank"), 10) for (r,), g in idle.largest.group_by("rank", maintain_order=True)},
        "pcie_phases": _records(pcie, max_items),
        "power": pw.to_json(),
        "steps": st.to_json(max_steps=max_items),
        "kernel_efficiency": _records(eff, 50),
        "moe_gemm": moe_gemm_finish([p.moe for p in parts], plan.meta),
        "expert_load": expert_load_finish([p.experts for p in parts], plan.meta),
    }
    extents = _concat([p.extents for p in parts], {"rank": pl.Int64, "w": pl.Int64})
    wmap = {int(r): int(w) for r, w in zip(extents["rank"].to_list(), extents["w"].to_list())} if extents.height else {}
    cpu = sum(p.rows for p in parts) > 0 and sum(p.gpu_rows for p in parts) == 0
    extra = [Finding("moe_gemm", t, w) for w, t in moe_gemm_findings(out["moe_gemm"])]
    n_steps = int(st.steps.filter(~pl.col("no_gpu"))["step_id"].n_unique()) if st.steps.height else 0
    seen = {r: min(w, (observed or {}).get(r, w)) for r, w in wmap.items()}  # windowed capture: recorded time only
    # CPU mode: gloo over host memory on one host, no link to judge
    ic_rows, ic_found = interconnect_verdict(out["collectives"]["groups"], plan.meta, window_ns=sum(seen.values()), steps=n_steps,
                                             ranks=len(wmap) or int(plan.meta.get("world_size") or 2)) if not cpu else ([], [])
    out["interconnect"] = ic_rows
    extra += [Finding("interconnect", t, w, subject=subj) for subj, w, t in ic_found]
    el = expert_load_finding(out["expert_load"])
    if el:
        extra.append(Finding("expert_load", el, 0.6))
    cands = cross_rank_candidates(out, al.residual_ns, idle, pcie, pw, st, eff, wmap, cpu, observed, extra=extra)
    out["findings"] = rank_findings(cands, residual_ns=al.residual_ns)
    out["_candidates"] = cands  # for the one ranker in :mod:`tracekit.analysis.pipeline` (not JSON)
    return out


def _concat(frames: list[pl.DataFrame], empty: Mapping[str, Any] | None = None) -> pl.DataFrame:
    have = [f for f in frames if f.width]
    if not have:
        return pl.DataFrame(schema=dict(empty or {"rank": pl.Int64}))
    return pl.concat(have, how="vertical_relaxed")


_IDLE_TOTALS = {"rank": pl.Int64, "cause": pl.String, "total_ns": pl.Int64, "count": pl.UInt32}
_IDLE_GAPS = {"rank": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64, "dur_ns": pl.Int64, "cause": pl.String,
              "step_id": pl.Int64, "next_name": pl.String, "detail": pl.String}


def cross_rank_sections(df: pl.DataFrame, meta: Mapping[str, Any], opts: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """JSON sections (see :data:`SECTION_KEYS`) + ``_comm_parts``; pure (quality flags go to ``opts['quality']``).

    ``opts``: ``window`` (object with ``start_ns``/``end_ns``, None = whole trace), ``quality`` (a
    :class:`QualityLog` to extend), ``min_wait_ns``, ``min_rel_step``, ``max_items`` (list caps).

    Runs as :func:`cross_rank_plan` (cross-rank, on the collective and step rows) →
    :func:`cross_rank_part` (per rank; here once on the whole frame) → :func:`cross_rank_finish`;
    ``tracekit.api.analyze`` runs the part once per rank instead.
    """
    ranks = sorted(int(r) for r in df.get_column("rank").unique().to_list())
    plan = cross_rank_plan(df, meta, opts, ranks=ranks, cpu_ranks=cpu_mode_ranks(df))
    out = cross_rank_finish(plan, [cross_rank_part(df, plan)])
    out.pop("_candidates", None)
    out["_comm_parts"] = plan.comm_parts(df)
    return out
