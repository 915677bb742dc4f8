"""Cross-rank sections of ``tracekit analyze`` (one entry point for ``tracekit.api``).

``cross_rank_sections(df, meta, opts)`` runs clock alignment and collective matching, then every
analysis of the registry (:mod:`tracekit.analysis.registry`: stalls and the collective summary, idle
causes, PCIe phases, power verdicts, step statistics, kernel efficiency, MoE GEMMs, expert load,
the interconnect verdict, ...), and returns JSON-ready sections plus plain-words ``findings``
(most costly first, from the one ranker). ``_comm_parts`` (a frame, not JSON) carries the
per-kernel wait/transfer intervals for the breakdown, in the frame's original time base.
Every number is defined in ``docs/metrics.md``.

It runs in three steps so that ``tracekit.api.analyze`` never holds more than one rank:
:func:`cross_rank_plan` (the cross-rank work, on the collective and step rows of all
ranks), :func:`cross_rank_part` (each registered analysis' part, on one rank's rows — or, here,
once on the whole frame) and :func:`cross_rank_finish` (each one's exact reduce, in registry
order, with the finished analyses it declares it needs; then their findings). Nothing here names
an analysis: a new one is a module that registers itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import polars as pl

from tracekit._errors import QualityLog
from tracekit.core.align import apply_offsets, solve_clock_offsets
from tracekit.core.collectives import collective_ops, collective_quality, collective_summary, match_collectives
from tracekit.analysis.findings import Finding, rank_findings
from tracekit.core.intervals import in_spans
from tracekit.analysis.registry import (Analysis, FindingsContext, FinishContext, Finished, PartContext, analyses, declare_columns,
                                        findings_order, resolve_options)
from tracekit.analysis.passes.stalls import MIN_REL_STEP, MIN_WAIT_NS, stall_plan, stall_steps
from tracekit.analysis.plan import CrossRankPlan
from tracekit.analysis.passes.steps import comm_wait_by_step
from tracekit.analysis.result import INSTANCE_VIEW_COLUMNS
from tracekit.core.window import STEP_COLUMNS, cpu_mode_ranks
from tracekit.schema import TraceMeta

__all__ = ["cross_rank_sections", "cross_rank_plan", "cross_rank_part", "cross_rank_finish", "CrossRankPart", "PartsByAnalysis",
           "section_keys"]

#: what the part driver itself reads of a rank's rows: clock offsets, the window clip, the profiler-window filter
declare_columns("cross_rank", ("rank", "ts_ns", "dur_ns", "launch_ts_ns"))  # launch_ts_ns: apply_offsets


def section_keys() -> tuple[str, ...]:
    """The JSON sections of :func:`cross_rank_sections`: every registered analysis' (registry order), then ``findings``."""
    return (*(k for a in analyses() for k in a.sections), "findings")


def __getattr__(name: str) -> Any:
    if name == "SECTION_KEYS":  # derived from the registry: :func:`section_keys`
        return section_keys()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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


@dataclass
class CrossRankPart:
    """Small outputs of :func:`cross_rank_part` for the ranks of one frame: each registered analysis' part, by name."""

    parts: dict[str, Any]


def cross_rank_plan(
    small: pl.DataFrame,
    meta: TraceMeta,
    opts: Mapping[str, Any] | None = None,
    *,
    ranks: list[int] | None = None,
    cpu_ranks: list[int] | None = None,
    steps: pl.DataFrame | None = None,
) -> CrossRankPlan:
    """Collective matching, clock offsets, instance window, communication split and the stall plan.

    ``small``: the trace's collective and step rows (a whole frame), or its collective candidates alone
    (:attr:`tracekit.core.window.Overview.small`) with its step rows as ``steps`` (:attr:`~tracekit.core.window.Overview.steps`);
    ``ranks``/``cpu_ranks``: of the whole trace (default: from ``small``). ``opts`` as for :func:`cross_rank_sections`.
    """
    opts = dict(opts or {})
    options = {a.name: resolve_options(a, opts.get("options")) for a in analyses()}  # an unknown option fails here, first
    qv = opts.get("quality")
    q: QualityLog = qv if isinstance(qv, QualityLog) else QualityLog()
    max_items = int(opts.get("max_items", 200))
    lo, hi = _window_bounds(opts.get("window"))
    if ranks is None:
        ranks = sorted(int(r) for r in small.get_column("rank").unique().to_list())
    if cpu_ranks is None:
        cpu_ranks = cpu_mode_ranks(small)
    # split first, each kind with the columns read here: the step rows of many ranks are most of the small rows,
    # and they need the overview's STEP_COLUMNS
    is_step = (pl.col("kind") == "step").fill_null(False)
    rows = steps if steps is not None else small
    step_rows = rows.lazy().filter(is_step).select([c for c in STEP_COLUMNS if c in rows.columns]).collect() if rows.width else rows
    del steps, rows
    coll = collective_ops(small.lazy().filter(~is_step).collect(), cpu_ranks=cpu_ranks)
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
                         n_inst, waits, split, list(cpu_ranks), comm_wait, sp, min_wait, min_rel, view, options)


def _options_of(plan: CrossRankPlan, a: Analysis) -> dict[str, Any]:
    """``a``'s resolved options (its defaults when it was registered after ``plan`` was made)."""
    return plan.options.get(a.name, dict(a.options))


#: instance columns the per-rank analyses read (idle causes: waiting_on_peer; PCIe: collective phases)
_INST_KEEP = ["rank", "name", "step_id", "arrival_ns", "end_ns", "wait_ns", "transfer_ns", "late_rank", "bus_bw_bytes_per_s"]


def cross_rank_part(df: pl.DataFrame, plan: CrossRankPlan, *, ranks: list[int] | None = None,
                    host: pl.DataFrame | None = None, only: Sequence[str] | None = None) -> CrossRankPart:
    """Every registered analysis' part (:mod:`tracekit.analysis.registry`) of the ranks in ``df``.

    ``df``: one rank's rows (then ``ranks=[r]`` narrows the instance table to it) or a whole frame
    (``ranks=None``), in the input's time base; the plan's clock offsets and window are applied here.
    ``rows="window"`` parts get the window's rows; then, for a windowed capture, the rows are cut to
    the profiler windows (the time between them was not recorded) for the ``rows="observed"`` parts.
    ``host``: :func:`tracekit.analysis.passes.gaps.host_activity` of the ranks (input time base) when ``df``
    does not hold every host row (a projected scan); default: from ``df``. ``only``: the names of the
    analyses to run (default: every registered one).
    """
    adf = apply_offsets(df, plan.align.offsets_ns) if plan.align.applied else df
    wdf = _clip_rows(adf, plan.lo, plan.hi)
    del adf
    if host is not None and plan.align.applied and host.height:
        off = {int(k): int(v) for k, v in plan.align.offsets_ns.items()}
        sh = pl.col("rank").replace_strict(off, default=0, return_dtype=pl.Int64)
        host = host.with_columns(pl.col("start") + sh, pl.col("end") + sh)
    inst = plan.rank_instances(ranks)
    listing = [a for a in analyses() if a.part is not None and (only is None or a.name in only)]
    out: dict[str, Any] = {}

    def run(a: Analysis, rows: pl.DataFrame, observed: dict[int, int] | None) -> None:
        assert a.part is not None
        out[a.name] = a.part(rows, PartContext(plan, inst, host, observed, _options_of(plan, a)))

    for a in listing:
        if a.rows == "window":
            run(a, wdf, None)
    observed = None
    spans = plan.spans
    if spans:  # windowed capture: time between profiler windows was not recorded
        wdf = wdf.filter(in_spans(spans, pl.col("ts_ns"), pl.col("ts_ns") + pl.col("dur_ns"), closed=True))
        total = sum(int(b) - int(a) for a, b in spans)
        observed = {int(r): total for r in wdf.get_column("rank").unique().to_list()}
    for a in listing:
        if a.rows == "observed":
            run(a, wdf, observed)
    return CrossRankPart(out)


class PartsByAnalysis:
    """Every rank's :class:`CrossRankPart`, by analysis, in rank order: what :func:`cross_rank_finish` reads.

    :meth:`extend` takes a run of parts of consecutive ranks; an analysis with a ``fold``
    (:class:`~tracekit.analysis.registry.Analysis`) keeps the run as one folded part, so a reduce over many ranks
    holds one part per run, not one per rank (the finish is the same: ``fold``'s contract)."""

    def __init__(self, parts: Sequence[CrossRankPart] = ()) -> None:
        self.by_name: dict[str, list[Any]] = {a.name: [] for a in analyses() if a.part is not None}
        if parts:
            self.extend(parts)

    def extend(self, run: Sequence[CrossRankPart]) -> None:
        for a in analyses():
            if a.part is None:
                continue
            items = [p.parts[a.name] for p in run]
            self.by_name[a.name].extend([a.fold(items)] if a.fold is not None and len(items) > 1 else items)

    def of(self, name: str) -> list[Any]:
        return self.by_name.get(name, [])


def cross_rank_finish(plan: CrossRankPlan, parts: "Sequence[CrossRankPart] | PartsByAnalysis",
                      tables: dict[str, Any] | None = None) -> dict[str, Any]:
    """JSON sections from the plan and every rank's :class:`CrossRankPart` (see :func:`cross_rank_sections`), in
    rank order, or those parts already gathered by analysis (:class:`PartsByAnalysis`).

    Each registered analysis finishes in registry order, with the finished analyses it ``needs``;
    then each one's findings (with its ``findings_needs``) go to the one ranker,
    :func:`tracekit.analysis.findings.rank_findings`. ``tables``: when given, receives the full
    frames behind the sections (``steps``: the step table)."""
    listing = analyses()
    by = parts if isinstance(parts, PartsByAnalysis) else PartsByAnalysis(parts)
    tab: dict[str, Any] = tables if tables is not None else {}
    done: dict[str, Finished] = {}
    out: dict[str, Any] = {}
    for a in listing:
        fin = a.finish(by.of(a.name) if a.part is not None else [],
                       FinishContext(plan, {n: done[n] for n in a.needs}, _options_of(plan, a), plan.quality, tab))
        done[a.name] = fin
        out.update(fin.sections)
    cands: list[Finding] = []
    for a in findings_order(listing):
        assert a.findings is not None
        cands += a.findings(FindingsContext(plan, done[a.name], {n: done[n] for n in a.findings_needs},
                                            _options_of(plan, a)))
    out["findings"] = rank_findings(cands, residual_ns=plan.align.residual_ns)
    out["_candidates"] = cands  # for the one ranker in :mod:`tracekit.analysis.stage.pipeline` (not JSON)
    return out


def cross_rank_sections(df: pl.DataFrame, meta: TraceMeta, opts: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """JSON sections (see :func:`section_keys`) + ``_comm_parts``; pure (quality flags go to ``opts['quality']``).

    ``opts``: ``window`` (object with ``start_ns``/``end_ns``, None = whole trace), ``quality`` (a
    :class:`QualityLog` to extend), ``min_wait_ns``, ``min_rel_step``, ``max_items`` (list caps),
    ``options`` (``{analysis name: {option: value}}`` over the registered defaults; an unknown one is
    a :class:`tracekit.UsageError`).

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
