"""Registry of analyses (memray's reporters, pyinstrument's processors, Perfetto's resolver registry).

Each per-rank analysis of ``tracekit analyze`` declares one :class:`Analysis` in its own module and
registers it (``register(Analysis(...))``): its name, the JSON section key(s) it fills, the trace
columns its part reads, its **part** (one rank's rows + :class:`PartContext` → a small part), its
**finish** (every rank's parts + :class:`FinishContext` → :class:`Finished`: JSON sections and a
typed value), optionally its **findings** (:class:`FindingsContext` → :class:`Finding` candidates for
the one ranker, :func:`tracekit.analysis.findings.rank_findings`) and its options with defaults.

Cross-analysis inputs are declared, never reached for: ``needs`` names the analyses whose
:class:`Finished` the finish receives (``ctx.results``), ``findings_needs`` those its findings receive.
:func:`analyses` lists every registered analysis of ``tracekit.analysis.passes`` (its modules are imported
once, so a new analysis is one new module), ordered by ``order`` then name: the order of the
sections in the JSON and of the finishes (a need must come earlier).
:func:`declared_columns` is the union of the columns every analysis and every :class:`ColumnUse`
(the breakdown, kernel totals, window and row filter of the pipeline) declares:
``tracekit.analysis.stage.pipeline.ANALYSIS_COLUMNS`` is derived from it.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping

import polars as pl

from tracekit._errors import QualityLog, UsageError
from tracekit.analysis.findings import Finding
from tracekit.analysis.plan import CrossRankPlan
from tracekit.schema import TraceMeta, COLUMN_NAMES

__all__ = ["Analysis", "ColumnUse", "RESERVED_SECTIONS", "PartContext", "FinishContext", "FindingsContext", "Finished", "register", "unregister",
           "declare_columns", "analyses", "get", "declared_columns", "findings_order", "resolve_options", "keyword_defaults", "records",
           "concat"]

#: which rows a part gets: the window's rows, or those inside the profiler windows (``observed``)
Rows = Literal["window", "observed"]


@dataclass(frozen=True)
class _Context:
    """What every context holds: the cross-rank plan (:class:`tracekit.analysis.plan.CrossRankPlan`)."""

    plan: CrossRankPlan

    @property
    def meta(self) -> TraceMeta:
        """The trace's run metadata."""
        return self.plan.meta


@dataclass(frozen=True)
class PartContext(_Context):
    """What a part reads besides its rows: the cross-rank plan (meta, window, spans, stall plan, step
    waits), the matched instances of its ranks (aligned clock, arrival in the window), their host
    activity (aligned; None: from the rows), the recorded time per rank of a windowed capture
    (``observed``: set for ``rows="observed"`` parts only) and the analysis' resolved options."""

    instances: pl.DataFrame
    host: pl.DataFrame | None
    observed: dict[int, int] | None
    options: Mapping[str, Any]


@dataclass(frozen=True)
class Finished:
    """A finished analysis: ``sections`` (JSON key → JSON-ready value, in the output's order) and
    ``value``, the typed result that dependents (``needs``) and findings read."""

    sections: dict[str, Any]
    value: Any = None


@dataclass(frozen=True)
class FinishContext(_Context):
    """What a finish reads besides the parts: the plan, the finished analyses it ``needs`` (by name),
    its options, the quality log (flags go there) and ``tables`` (full frames behind sections, e.g.
    the step table for :class:`tracekit.analysis.result.AnalysisResult`)."""

    results: Mapping[str, Finished]
    options: Mapping[str, Any]
    quality: QualityLog
    tables: dict[str, Any]


@dataclass(frozen=True)
class FindingsContext(_Context):
    """What a findings function reads: the plan, its own :class:`Finished`, those of ``findings_needs``, its options."""

    result: Finished
    results: Mapping[str, Finished]
    options: Mapping[str, Any]


@dataclass(frozen=True)
class Analysis:
    """One per-rank analysis (module doc). ``sections``: the JSON keys it fills (not one of
    :data:`RESERVED_SECTIONS`); ``columns``: every trace column its part reads (the pipeline projects
    the scan to the union); ``part`` None: an analysis of other analyses' results only (its finish gets
    no parts); ``rows``: ``"observed"`` (default) for the rows inside the profiler windows,
    ``"window"`` for the window's rows (an analysis that cuts to the spans itself); ``order``:
    position of its sections in the JSON and of its finish; ``findings_first``: its candidates are
    listed before the others' (verdicts that replace a generic sentence of another analysis, e.g.
    the interconnect verdict over the wait share), which decides the order of equal weights only;
    ``fold``: optional, merges the parts of consecutive ranks (in rank order, None entries included) into one,
    with ``finish(parts[:i] + [fold(parts[i:j])] + parts[j:]) == finish(parts)``: a reduce over many ranks then
    holds one folded part per run of ranks (:class:`tracekit.analysis.stage.crossrank.PartsByAnalysis`)."""

    name: str
    sections: tuple[str, ...]
    columns: tuple[str, ...]
    part: Callable[[pl.DataFrame, PartContext], Any] | None
    finish: Callable[[list[Any], FinishContext], Finished]
    findings: Callable[[FindingsContext], list[Finding]] | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    needs: tuple[str, ...] = ()
    findings_needs: tuple[str, ...] = ()
    rows: Rows = "observed"
    order: int = 100
    findings_first: bool = False
    fold: Callable[[list[Any]], Any] | None = None


@dataclass(frozen=True)
class ColumnUse:
    """A stage of the pipeline outside the registry that reads the projected rows (breakdown, kernel totals ...)."""

    name: str
    columns: tuple[str, ...]


#: keys of the analyze JSON that the pipeline itself writes (an analysis' section may not replace one)
RESERVED_SECTIONS = frozenset({"schema_version", "trace_schema_version", "world_size", "device_mode", "window", "buckets", "ranks",
                               "overall", "top_kernels", "uncategorized_top", "findings", "quality", "next_win", "trace"})


@dataclass
class _Registry:
    """The registry's state, one per process: the registered analyses (by name, in registration order), the pipeline
    stages' column uses, and whether :mod:`tracekit.analysis.passes` was imported (:func:`_load`)."""

    analyses: dict[str, Analysis] = field(default_factory=dict)
    uses: dict[str, ColumnUse] = field(default_factory=dict)
    loaded: bool = False


_REGISTRY = _Registry()


def _check_columns(name: str, columns: tuple[str, ...]) -> None:
    unknown = [c for c in columns if c not in COLUMN_NAMES]
    if unknown:
        raise UsageError(f"analysis {name!r}: declares columns not in the trace schema: {', '.join(unknown)}; "
                         "use names from tracekit.schema.COLUMN_NAMES")


def register(a: Analysis) -> Analysis:
    """Add ``a`` (its name must be new: :func:`unregister` first to replace one); returns it."""
    if a.name in _REGISTRY.analyses:
        raise UsageError(f"analysis {a.name!r} is already registered; unregister it first")
    _check_columns(a.name, a.columns)
    taken = {s: o.name for o in _REGISTRY.analyses.values() for s in o.sections} | {s: "the pipeline" for s in RESERVED_SECTIONS}
    clash = [s for s in a.sections if s in taken]
    if clash:
        raise UsageError(f"analysis {a.name!r}: section {clash[0]!r} is already filled by {taken[clash[0]]!r}")
    _REGISTRY.analyses[a.name] = a
    return a


def unregister(name: str) -> Analysis | None:
    """Remove the analysis ``name``; returns it (None when not registered)."""
    return _REGISTRY.analyses.pop(name, None)


def declare_columns(name: str, columns: tuple[str, ...]) -> ColumnUse:
    """Declare the columns a pipeline stage outside the registry reads (idempotent per name)."""
    _check_columns(name, columns)
    u = _REGISTRY.uses[name] = ColumnUse(name, columns)
    return u


def _load() -> None:
    """Import every module of :mod:`tracekit.analysis.passes` once, so each one's registrations run."""
    if _REGISTRY.loaded:
        return
    _REGISTRY.loaded = True
    import tracekit.analysis.passes as pkg

    for m in pkgutil.iter_modules(pkg.__path__):
        if not m.name.startswith("_"):
            importlib.import_module(f"tracekit.analysis.passes.{m.name}")


def analyses() -> tuple[Analysis, ...]:
    """Every registered analysis, by ``order`` then name; a ``needs`` entry must be listed earlier."""
    _load()
    out = tuple(sorted(_REGISTRY.analyses.values(), key=lambda a: (a.order, a.name)))
    seen: set[str] = set()
    for a in out:
        late = [n for n in a.needs if n not in seen]
        if late:
            raise UsageError(f"analysis {a.name!r} needs {late[0]!r}, which is not registered before it (lower order)")
        seen.add(a.name)
    return out


def get(name: str) -> Analysis:
    """The registered analysis ``name``."""
    _load()
    return _REGISTRY.analyses[name]


def findings_order(listing: tuple[Analysis, ...]) -> list[Analysis]:
    """The analyses with findings, in the order their candidates reach the ranker (``findings_first`` ones first)."""
    return sorted((a for a in listing if a.findings is not None), key=lambda a: not a.findings_first)


def column_uses() -> tuple[ColumnUse, ...]:
    _load()
    return tuple(_REGISTRY.uses.values())


def declared_columns() -> list[str]:
    """Union of the columns of every analysis and column use, in the trace schema's order."""
    want: set[str] = set()
    for a in analyses():
        want.update(a.columns)
    for u in column_uses():
        want.update(u.columns)
    return [c for c in COLUMN_NAMES if c in want]


def resolve_options(a: Analysis, given: Mapping[str, Mapping[str, Any]] | None) -> dict[str, Any]:
    """``a``'s options: its defaults, overridden by ``given[a.name]``; an unknown option is a usage error."""
    mine = dict((given or {}).get(a.name) or {})
    unknown = sorted(set(mine) - set(a.options))
    if unknown:
        known = ", ".join(sorted(a.options)) or "none"
        raise UsageError(f"analysis {a.name!r} has no option {unknown[0]!r} (options: {known})")
    return {**a.options, **mine}


def keyword_defaults(fn: Callable[..., Any], *, exclude: tuple[str, ...] = ()) -> dict[str, Any]:
    """``fn``'s keyword-only parameters and their defaults (less ``exclude``): an analysis' options stated once, where
    its function states them."""
    return {n: p.default for n, p in inspect.signature(fn).parameters.items()
            if p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is not inspect.Parameter.empty and n not in exclude}


def records(df: pl.DataFrame, n: int | None = None) -> list[dict[str, Any]]:
    """A section's rows (the first ``n`` when given) as JSON-ready dicts."""
    if df.height == 0:
        return []
    return (df.head(n) if n else df).to_dicts()


def concat(frames: list[pl.DataFrame], empty: Mapping[str, Any] | None = None) -> pl.DataFrame:
    """Parts' frames glued (relaxed types); ``empty`` (a schema) when none has columns."""
    have = [f for f in frames if f.width]
    if not have:
        return pl.DataFrame(schema=dict(empty or {"rank": pl.Int64}))
    return pl.concat(have, how="vertical_relaxed")
