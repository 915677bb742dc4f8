"""The analysis behind ``tracekit analyze``: a small cross-rank pass, a per-rank map, a reduce.

One driver, two sources:

* :class:`FrameSource` — an in-memory frame (``tracekit.api.analyze_frame``): the per-rank
  analyses run once on the whole frame (every one of them is keyed by rank);
* :class:`ScanSource` — a ``trace.parquet`` (``tracekit.api.analyze``): the per-rank analyses run
  on one rank at a time, read with a lazy scan that skips the other ranks' row groups and keeps
  only the rows and columns the analyses read (:func:`analysis_columns`, from the registry of analyses,
  :mod:`tracekit.analysis.registry`; :func:`analysis_rows_expr`).
  Memory: one rank's projected rows plus the small cross-rank tables.

Steps (docs/scale.md §2):

1. **overview** (:func:`tracekit.core.window.trace_overview`): per-rank aggregates (row count,
   first timestamp, extent of device ops, CPU mode) and the small rows (collective kernels, steps)
   of every rank — two lazy queries;
2. **window** (:func:`tracekit.core.window.select_window`) from the overview (plus one lazy
   aggregate for ``skip_steps`` / profiler windows);
3. **cross-rank plan** (:func:`tracekit.analysis.stage.crossrank.cross_rank_plan`): collective matching,
   clock offsets, communication split, stall candidates — on the small rows only;
4. **map**, per rank: breakdown (:func:`compute_breakdown`), kernel totals (:func:`kernel_totals`)
   and :func:`tracekit.analysis.stage.crossrank.cross_rank_part` (every registered analysis' part: stall
   inputs, idle causes, PCIe, power, steps, kernel efficiency, MoE GEMMs, expert load, extents); each
   keeps only small outputs;
5. **reduce**: :func:`breakdown_finish`, :func:`merge_kernel_totals` (exact sums; top-N after the
   sum) and :func:`tracekit.analysis.stage.crossrank.cross_rank_finish` (every registered analysis' finish,
   exact: percentiles over the full step table, stall causes from every rank's inputs; then their
   findings through the one ranker);
6. **after the finish**, the stages the caller passes (``after``): the advice layer's next win
   (:func:`tracekit.advice.nextwin.next_win_stage`, passed by :mod:`tracekit.api`) reads the finished
   sections, replays and adds its section and finding. The pipeline imports no layer above analysis.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Protocol, Sequence

import msgspec
import polars as pl

from tracekit import _interrupt
from tracekit._memory import release_memory
from tracekit._errors import InputError, QualityLog, RankError, TracekitError, UsageError
from tracekit.analysis.passes.breakdown import (breakdown_finish, compute_breakdown, kernel_totals, merge_kernel_totals, top_kernels,
                                         uncategorized_top)
from tracekit.analysis.findings import Finding, basic_candidates, rank_findings
from tracekit.analysis.passes.gaps import SYNC_REGEX, host_activity
from tracekit.analysis.plan import CrossRankPlan
from tracekit.analysis.registry import declare_columns, declared_columns
from tracekit.analysis.result import AnalysisResult
from tracekit.analysis.sections import SCHEMA_VERSION, Node, Sections, build
from tracekit.schema import TraceMeta, rank_where, trace_ranks
from tracekit.trace_check import first_line
from tracekit.core.window import Overview, Window, parse_time_range, select_window, trace_overview

__all__ = ["analysis_columns", "analysis_rows_expr", "FrameSource", "ScanSource", "run_analysis", "ANALYSIS_VERSION",
           "FinishedRun", "StageOutput", "AfterFinish", "sections_for", "collect_trace", "RankPart", "analyze_rank", "RankRunner", "LocalRunner",
           "unreadable", "locate_unreadable"]

#: Version of the analyze JSON object (bumped on incompatible changes): the typed tree's
ANALYSIS_VERSION = SCHEMA_VERSION

# what the stages of the per-rank map outside the registry read (tracekit.analysis.registry.declare_columns)
declare_columns("rows", ("kind", "name", "category", "family", "input_dims"))  # analysis_rows_expr
declare_columns("breakdown", ("rank", "kind", "ts_ns", "dur_ns", "category", "family"))  # compute_breakdown + comm_parts
declare_columns("kernel_totals", ("rank", "kind", "ts_ns", "dur_ns", "name", "category", "family"))


def analysis_columns() -> list[str]:
    """The columns any analysis of ``tracekit analyze`` reads: the union of what every registered
    analysis and every stage declares (:func:`tracekit.analysis.registry.declared_columns`), in the
    trace schema's order; a scan projects each rank's rows to these."""
    from tracekit.analysis.stage import crossrank  # noqa: F401 - its stage declares the columns it reads

    return declared_columns()


def __getattr__(name: str) -> Any:
    if name == "ANALYSIS_COLUMNS":  # derived from the registry, so it follows registrations: :func:`analysis_columns`
        return analysis_columns()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def analysis_rows_expr(sync_names: list[str] | None = None) -> pl.Expr:
    """The rows any analysis reads: GPU ops, steps, counters, categorized or ruled rows (CPU mode,
    host readbacks), CPU operators with shapes (kernel efficiency) and blocking runtime calls
    (``sync_names``: the runtime names matching :data:`tracekit.analysis.passes.gaps.SYNC_REGEX`; default:
    the regex on every row).

    Launch calls (``cudaLaunchKernel`` ...) and plain CPU operators — two thirds of a typical
    trace — are left out.
    """
    kind = pl.col("kind")
    sync = pl.col("name").is_in(sync_names) if sync_names is not None else pl.col("name").cast(pl.String).str.contains(SYNC_REGEX)
    return (
        kind.is_in(["kernel", "memcpy", "memset", "step", "counter"])
        | pl.col("category").is_not_null()
        | pl.col("family").is_not_null()
        | ((kind == "cpu_op") & pl.col("input_dims").is_not_null())
        | ((kind == "runtime") & sync)
    )


@dataclass
class FrameSource:
    """An in-memory frame (all ranks); the per-rank analyses run once on all of it."""

    df: pl.DataFrame
    by_rank = False

    def lazy(self) -> pl.LazyFrame:
        return self.df.lazy()

    def parts(self, ranks: list[int]) -> Iterator[tuple[list[int] | None, pl.DataFrame]]:
        yield None, self.df

    def host(self, ranks: list[int] | None) -> pl.DataFrame:
        """Host activity (:func:`tracekit.analysis.passes.gaps.host_activity`) of ``ranks`` (all when None)."""
        return host_activity(ranks_filter(self.df.lazy(), ranks))


class ScanSource:
    """A ``trace.parquet`` read lazily; :meth:`parts` yields one rank's projected rows at a time."""

    by_rank = True

    def __init__(self, path: str | Path, lf: pl.LazyFrame) -> None:
        self.path = path
        self.lf = lf

    def lazy(self) -> pl.LazyFrame:
        return self.lf

    def parts(self, ranks: list[int]) -> Iterator[tuple[list[int] | None, pl.DataFrame]]:
        cols = analysis_columns()
        for r in ranks:
            one = self.lf.filter(pl.col("rank") == r)
            # blocking runtime calls: the regex runs on the rank's distinct runtime names, not on every row
            names = collect_trace(one.filter(pl.col("kind") == "runtime").select(pl.col("name").unique()), self.path, rank=r)
            sync = names.filter(pl.col("name").cast(pl.String).str.contains(SYNC_REGEX))["name"].cast(pl.String).to_list()
            yield [r], collect_trace(one.filter(analysis_rows_expr(sync)).select(cols), self.path, rank=r)

    def host(self, ranks: list[int] | None) -> pl.DataFrame:
        """Host activity of ``ranks`` from a lazy scan of five columns (launch calls are not in the part)."""
        try:
            return host_activity(ranks_filter(self.lf, ranks))
        except Exception as e:  # noqa: BLE001
            raise unreadable(self.path, e, ranks[0] if ranks is not None and len(ranks) == 1 else None) from None


def compact(obj: Any) -> Any:
    """Copy of a small result whose frames own their memory.

    Filters and gathers of string columns keep views into the source column's buffers, so a
    ten-row table of kernel names can pin a whole rank's names (``shrink_to_fit`` does not
    release views of a cast categorical); an Arrow round trip at the oldest compat level copies
    the referenced bytes only. Walks dataclasses, lists, tuples and dicts.
    """
    if isinstance(obj, pl.DataFrame):
        if obj.width == 0:
            return obj
        out = pl.from_arrow(obj.to_arrow(compat_level=pl.CompatLevel.oldest()))
        assert isinstance(out, pl.DataFrame)
        return out if out.schema == obj.schema else out.cast(obj.schema)
    if is_dataclass(obj) and not isinstance(obj, type) and not obj.__dataclass_params__.frozen:  # type: ignore[attr-defined]
        for f in fields(obj):
            setattr(obj, f.name, compact(getattr(obj, f.name)))
        return obj
    if isinstance(obj, list):
        return [compact(x) for x in obj]
    if isinstance(obj, tuple):
        return tuple(compact(x) for x in obj)
    if isinstance(obj, dict):
        return {k: compact(v) for k, v in obj.items()}
    return obj


def collect_trace(lf: pl.LazyFrame, path: Any, rank: int | None = None) -> pl.DataFrame:
    """``lf`` collected; a read error is an :class:`InputError` naming ``path``, or (``rank`` given) a
    :class:`RankError` naming the rank and where its rows are (``--keep-going`` leaves it out)."""
    try:
        return lf.collect()
    except Exception as e:  # noqa: BLE001
        raise unreadable(path, e, rank) from None


def unreadable(path: Any, e: BaseException, rank: int | None = None) -> InputError:
    """The one-line error of a failed read of ``path`` (of rank ``rank``'s rows: a :class:`RankError`)."""
    if rank is None:
        return InputError(f"{path}: unreadable trace data ({first_line(e)}); re-convert the source")
    where = rank_where(path, rank) if isinstance(path, (str, Path)) else str(path)
    return RankError(f"rank {rank}: {where}: unreadable trace data ({first_line(e)}); re-convert the source", rank)


def locate_unreadable(source: "FrameSource | ScanSource", e: BaseException) -> InputError:
    """A scan of the whole trace failed with ``e``: the first rank whose own rows fail the same overview
    (:func:`tracekit.core.window.trace_overview`), as a :class:`RankError`; else ``e`` as one line. A dataset's
    ranks come from its directory names, and the scan of one rank reads only that rank's partition."""
    if not isinstance(source, ScanSource):
        return unreadable("trace", e)
    try:
        ranks = trace_ranks(source.path)
    except TracekitError:
        return unreadable(source.path, e)
    for r in ranks:
        try:
            trace_overview(source.lazy().filter(pl.col("rank") == r), by_rank=True)
        except Exception as er:  # noqa: BLE001
            return unreadable(source.path, er, r)
    return unreadable(source.path, e)


def _window_inside(tr: tuple[int, int], spec: str, origin: int, meta: TraceMeta, ov: Any, quality: QualityLog) -> tuple[int, int]:
    """An explicit ``--window`` must start inside the capture; its end is clipped to the capture's end.

    A window before the start or past the end would count unrecorded time as idle
    (">100% of its window", "100% idle"): that is a usage error, not a result.
    """
    wn = meta.get("window_ns")
    end: int | None = wn[1] if wn else None
    if end is None and ov.ranks.height:
        hi = ov.ranks["hi"].max()
        end = int(hi) if hi is not None else None
    if end is None or end <= origin:
        return tr
    span = f"0s:{(end - origin) / 1e9:.6f}s"
    if tr[0] < origin:
        raise UsageError(f"--window {spec!r}: starts before the capture ({span}); START must be >= 0")
    if tr[0] >= end:
        raise UsageError(f"--window {spec!r}: starts after the capture ends ({span}); choose a range inside it")
    if tr[1] > end:
        quality.add("window_clipped", f"--window {spec!r} ends after the capture; analyzed up to its end "
                    f"({(end - origin) / 1e9:.6f}s)", severity="info")
        return tr[0], end
    return tr


@dataclass(frozen=True)
class FinishedRun:
    """What a stage after the cross-rank finish reads: the source, its overview, the metadata, the finished
    sections so far (JSON-ready, by key; ``_candidates``: the findings candidates) and the cross-rank plan (on a
    cluster, without its per-rank tables ``inst``, ``waits``, ``groups`` and ``per_rank``: ``view`` holds the
    matched instances)."""

    source: FrameSource | ScanSource
    overview: Overview
    meta: TraceMeta
    sections: Mapping[str, Any]
    plan: CrossRankPlan


@dataclass(frozen=True)
class StageOutput:
    """What a stage after the finish adds: JSON sections (by key, appended in order) and findings candidates."""

    sections: dict[str, Any]
    findings: list[Finding]


#: a stage after the cross-rank finish (:func:`run_analysis` ``after``)
AfterFinish = Callable[[FinishedRun], StageOutput]
#: a stage after the finish may name the sections it reads as a ``sections_read`` attribute (a tuple of keys): a
#: runner that ships the run elsewhere (a cluster's) then sends only those (see :func:`sections_for`)


def sections_for(stage: AfterFinish, sections: Mapping[str, Any]) -> dict[str, Any]:
    """The finished sections ``stage`` reads: those its ``sections_read`` names, else all of them."""
    keys = getattr(stage, "sections_read", None)
    return {k: sections[k] for k in keys if k in sections} if keys is not None else dict(sections)


@dataclass
class RankPart:
    """The small outputs of the per-rank map for the ranks of one frame (one rank, or a whole in-memory frame):
    its breakdown part, its kernel totals and every registered analysis' part (None without the cross-rank pass);
    ``ranks``: whose they are (None: a whole frame), so the reduce puts parts that arrive in any order in rank order."""

    breakdown: Any
    totals: pl.DataFrame
    cross: Any
    ranks: list[int] | None = None


def analyze_rank(df: pl.DataFrame, ranks: list[int] | None, win: Window, plan: CrossRankPlan | None, split: bool,
                 host: pl.DataFrame | None) -> RankPart:
    """The per-rank map (step 4) on ``df``: one rank's projected rows (``ranks=[r]``; the result then owns its
    memory, :func:`compact`) or a whole frame (``ranks=None``). Pure: it reads ``plan`` only for ``ranks``' rows
    (so a plan narrowed to them gives the same part) and writes nothing; ``host``: the ranks' host activity."""
    from tracekit.analysis.stage import crossrank

    cp = plan.comm_parts(df, ranks) if plan is not None else None
    part = RankPart(compute_breakdown(df, win, comm_parts=cp, split=split), kernel_totals(df, win),
                    crossrank.cross_rank_part(df, plan, ranks=ranks, host=host) if plan is not None else None,
                    list(ranks) if ranks is not None else None)
    return compact(part) if ranks is not None else part  # keep nothing of the rank's frame alive (string views)


class RankRunner(Protocol):
    """Where the per-rank work of :func:`run_analysis` runs (:class:`LocalRunner`, or a cluster's)."""

    def overview(self, source: "FrameSource | ScanSource",
                 profiler_windows: list[list[int]] | None) -> tuple[Overview, pl.DataFrame | None]:
        """The trace's :class:`Overview` and, optionally, its :func:`tracekit.core.window.span_bounds` row."""
        ...

    def map(self, source: "FrameSource | ScanSource", ranks: list[int], win: Window, plan: CrossRankPlan | None,
            split: bool) -> Iterator[RankPart]:
        """:func:`analyze_rank` of every part of ``source`` (``ranks``), in any order (e.g. as tasks end): each part
        names its ranks and :func:`run_analysis` reduces them in rank order."""
        ...

    def after(self, stage: "AfterFinish", run: "FinishedRun") -> "StageOutput":
        """One stage after the finish."""
        ...


class LocalRunner:
    """The per-rank work in this process, one rank (or the whole in-memory frame) at a time."""

    def overview(self, source: "FrameSource | ScanSource",
                 profiler_windows: list[list[int]] | None) -> tuple[Overview, pl.DataFrame | None]:
        try:
            return trace_overview(source.lazy(), by_rank=source.by_rank), None
        except Exception as e:  # noqa: BLE001 - a damaged file fails the first scan: name its rank where one can
            raise locate_unreadable(source, e) from None

    def map(self, source: "FrameSource | ScanSource", ranks: list[int], win: Window, plan: CrossRankPlan | None,
            split: bool) -> Iterator[RankPart]:
        for rs, df in source.parts(ranks):
            _interrupt.check("analyze")  # Ctrl-C stops between ranks (tracekit._interrupt)
            yield analyze_rank(df, rs, win, plan, split, source.host(rs) if plan is not None else None)
            del df

    def after(self, stage: "AfterFinish", run: "FinishedRun") -> "StageOutput":
        return stage(run)


def run_analysis(
    source: FrameSource | ScanSource,
    meta: TraceMeta,
    *,
    window: str | None = None,
    skip_steps: int = 0,
    trim_transient: bool = True,
    top: int = 5,
    cross_rank: bool = True,
    after: Sequence[AfterFinish] = (),
    runner: "RankRunner | None" = None,
) -> AnalysisResult:
    """The :class:`AnalysisResult` of ``source``; ``.to_json()`` is the analyze JSON object (docs/analyze_json.md).

    ``after``: stages run after the cross-rank finish (with ``cross_rank`` only), in order; each one's sections join
    the JSON and its findings the one ranker (:mod:`tracekit.api` passes the next win). ``runner``: where the
    per-rank work (overview, map) and the after stages run (default :class:`LocalRunner`: here, one rank at a time;
    :mod:`tracekit.cluster.analyze` runs them as cluster tasks). The result does not depend on the runner."""
    runner = runner if runner is not None else LocalRunner()
    quality = QualityLog()
    for q in meta.get("quality") or []:
        quality.add(q.get("code", "note"), q.get("message", ""), severity=q.get("severity", "warning"), rank=q.get("rank"))
    path = getattr(source, "path", "trace")
    lf = source.lazy()
    capture = meta.get("capture")
    pw = capture.get("profiler_windows") if isinstance(capture, dict) else None
    try:
        ov, bounds = runner.overview(source, pw)
    except TracekitError:
        raise
    except Exception as e:  # noqa: BLE001 - a corrupt file fails in the first scan
        raise InputError(f"{path}: unreadable trace data ({first_line(e)}); re-convert the source") from None
    tr = None
    if window:
        wn = meta.get("window_ns")
        origin: int | None = wn[0] if wn else None
        if origin is None:
            m = ov.ranks["min_ts"].min() if ov.ranks.height else None
            origin = int(m) if m is not None else 0  # type: ignore[arg-type]
        tr = parse_time_range(window, origin)
        tr = _window_inside(tr, window, int(origin), meta, ov, quality)
    win = select_window(lf, time_range=tr, skip_steps=skip_steps, trim_transient=trim_transient and tr is None, quality=quality,
                        profiler_windows=pw, overview=ov, bounds=bounds)
    plan = None
    if cross_rank:
        from tracekit.analysis.stage import crossrank

        plan = crossrank.cross_rank_plan(ov.take_small(), meta, {"window": win, "quality": quality}, ranks=ov.all_ranks,
                                         cpu_ranks=ov.cpu_ranks, steps=ov.take_steps())
    split = plan.split if plan is not None else False
    red = _Reduce(ov.all_ranks if source.by_rank else [])
    for part in runner.map(source, ov.all_ranks, win, plan, split):
        red.add(part)
    bd_parts, cr_parts, kt_parts = red.result()
    del red
    tables: dict[str, Any] = {}
    extra: dict[str, Any] = crossrank.cross_rank_finish(plan, cr_parts, tables) if plan is not None else {}
    bd = breakdown_finish(bd_parts, win, split=split)
    totals = merge_kernel_totals(kt_parts) if kt_parts else None
    del cr_parts, bd_parts, kt_parts  # reduced: the stages after the finish run without every rank's parts
    release_memory()  # ... and without the heap pages that held them
    if plan is not None:
        for stage in after:
            _interrupt.check("analyze")
            out = runner.after(stage, FinishedRun(source, ov, meta, extra, plan))
            extra.update(out.sections)
            if out.findings:
                extra.setdefault("_candidates", []).extend(out.findings)
    sections, others = _typed(_result(meta, win, bd, totals, top, extra, quality))
    view = plan.view if plan is not None and plan.view is not None else pl.DataFrame()
    offsets = {int(k): int(v) for k, v in plan.align.offsets_ns.items()} if plan is not None and plan.align.applied else {}
    return AnalysisResult(meta=meta, window=win, sections=sections, buckets=tuple(bd.buckets),
                          breakdown=bd.table, kernel_totals=totals if totals is not None else pl.DataFrame(), instances=view,
                          clock_offsets_ns=offsets, step_table=tables.get("steps", pl.DataFrame()), extra=others)


#: the map's parts are folded every this many while it runs: a client of many ranks holds one merged kernel-totals
#: table and one folded part per run of this many ranks for each analysis with a ``fold``, not every rank's (both
#: exact; up to this many ranks nothing is folded before the finish, as before)
_FOLD = 64


def _rank_order(part: RankPart) -> int:
    """Where a part goes in the reduce: its first rank (a whole frame's part is the only one)."""
    return min(part.ranks) if part.ranks else -1


class _Reduce:
    """The map's parts, arriving in any order, reduced as they come: kernel totals merged every :data:`_FOLD`
    parts (a sum: any order); the cross-rank parts of consecutive ranks (``expected``: the ranks in the order the
    finish reads them, one part each) gathered by analysis and folded every :data:`_FOLD`
    (:class:`~tracekit.analysis.stage.crossrank.PartsByAnalysis`); a part that comes before those of lower ranks
    waits for them. Parts of ranks not in ``expected`` (a whole frame's) are ordered at the end."""

    def __init__(self, expected: Sequence[int]) -> None:
        from tracekit.analysis.stage.crossrank import PartsByAnalysis

        self.expected = sorted(expected)
        self.at = 0
        self.waiting: dict[int, RankPart] = {}
        self.run: list[RankPart] = []
        self.breakdown: list[Any] = []
        self.cross = PartsByAnalysis()
        self.totals: list[pl.DataFrame] = []

    def add(self, part: RankPart) -> None:
        self.totals.append(part.totals)
        if len(self.totals) >= _FOLD:
            self.totals = [merge_kernel_totals(self.totals)]
        self.waiting[_rank_order(part)] = part
        while self.at < len(self.expected) and self.expected[self.at] in self.waiting:
            self.run.append(self.waiting.pop(self.expected[self.at]))
            self.at += 1
            if len(self.run) >= _FOLD:
                self._flush()

    def _flush(self) -> None:
        self.breakdown += [p.breakdown for p in self.run]
        cross = [p.cross for p in self.run if p.cross is not None]
        if cross:
            self.cross.extend(cross)
        self.run = []

    def result(self) -> tuple[list[Any], Any, list[pl.DataFrame]]:
        """(breakdown parts, cross-rank parts by analysis, kernel totals parts), every part in rank order."""
        self.run += [self.waiting.pop(k) for k in sorted(self.waiting)]  # all above the folded ranks
        self._flush()
        return self.breakdown, self.cross, self.totals


_TREE_FIELDS = frozenset(f.name for f in msgspec.structs.fields(Sections))


def _typed(doc: dict[str, Any]) -> tuple[Sections, dict[str, Node]]:
    """The analyze object as the typed tree (:class:`tracekit.analysis.sections.Sections`, validated: a key or a type
    the tree does not declare fails here), plus the sections of analyses outside the tree, each its own typed node."""
    others = {k: v for k, v in doc.items() if k not in _TREE_FIELDS}
    for k, v in others.items():
        if not isinstance(v, Node):
            raise TypeError(f"analysis section {k!r}: a {type(v).__name__}, not a typed node; return a "
                            "tracekit.analysis.sections.Node subclass (the typed result tree, docs/architecture.md)")
    return build({k: v for k, v in doc.items() if k in _TREE_FIELDS}, Sections), others


def _result(meta: TraceMeta, win: Window, bd: Any, totals: pl.DataFrame | None, top: int, extra: dict[str, Any],
            quality: QualityLog) -> dict[str, Any]:
    ranks = bd.as_records()
    overall_t: dict[str, int] = {}
    for r in ranks:
        for k, v in r["time_ns"].items():
            overall_t[k] = overall_t.get(k, 0) + int(v)
    if totals is None:
        totals = pl.DataFrame(schema={"category": pl.String, "name": pl.String, "other": pl.Boolean, "count": pl.Int64,
                                      "total_ns": pl.Int64})
    tk = top_kernels(None, totals=totals, n=top)
    top_by_cat: dict[str, list[dict[str, Any]]] = {}
    for row in tk.iter_rows(named=True):
        top_by_cat.setdefault(row["category"], []).append(
            {"name": row["name"], "count": row["count"], "total_ns": row["total_ns"], "mean_ns": row["mean_ns"]}
        )
    unc = uncategorized_top(None, totals=totals, n=10)
    res: dict[str, Any] = {
        "schema_version": ANALYSIS_VERSION,
        "trace_schema_version": meta.get("schema_version"),
        "world_size": meta.get("world_size"),
        "device_mode": meta.get("device_mode", "gpu"),
        "window": {
            "start_ns": win.start_ns,
            "end_ns": win.end_ns,
            "reason": win.reason,
            "trimmed_transient_ns": win.trimmed_transient_ns,
            "skipped_steps": win.skipped_steps,
        },
        "buckets": list(bd.buckets) + ["idle"],
        "ranks": ranks,
        "overall": {
            "window_ns": sum(r["window_ns"] for r in ranks),
            "gpu_busy_ns": sum(r["gpu_busy_ns"] for r in ranks),
            "time_ns": overall_t,
        },
        "top_kernels": top_by_cat,
        "uncategorized_top": [dict(r) for r in unc.iter_rows(named=True)],
    }
    cands = extra.pop("_candidates", None)
    res.update(extra)
    # one ranker for every finding (tracekit.analysis.findings); without the cross-rank pass, the breakdown's own
    base = basic_candidates(res, meta)
    if cands is not None:  # the cross-rank pass has its own idle sentences: keep the headline and what dominates
        base = [f for f in base if f.headline or f.code == "dominant"]
    resid = ((res.get("collectives") or {}).get("clock_alignment") or {}).get("residual_ns")
    res["findings"] = rank_findings(base + list(cands or []), residual_ns=resid)
    res["quality"] = _once([q.to_json() for q in quality])
    return res


def _once(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each (code, rank, message) once — the trace's stored flags and the analysis' own repeat some;
    the entry with details wins, at the first one's position."""
    pos: dict[tuple[Any, ...], int] = {}
    out: list[dict[str, Any]] = []
    for q in items:
        k = (q.get("code"), q.get("rank"), q.get("message"))
        if k in pos:
            if q.get("details") and not out[pos[k]].get("details"):
                out[pos[k]] = q
            continue
        pos[k] = len(out)
        out.append(q)
    return out


def ranks_filter(lf: pl.LazyFrame, ranks: Sequence[int] | None) -> pl.LazyFrame:
    return lf if ranks is None else lf.filter(pl.col("rank").is_in(list(ranks)))
