"""The analysis result: one typed object that every view reads.

:func:`tracekit.analysis.stage.pipeline.run_analysis` decides the window once, matches the collectives once, builds the
step table and the breakdown once, and returns an :class:`AnalysisResult`:

* ``sections`` — the typed tree of what the analysis found (:class:`tracekit.analysis.sections.Sections`: window,
  breakdown, collectives, stalls, idle, PCIe, power, steps, verdicts, next win, findings, data quality);
  ``analyze --json`` is its one encoder, :meth:`AnalysisResult.to_json` (docs/analyze_json.md,
  ``schemas/analyze_v1.json``);
* ``extra`` — the typed sections of registered analyses outside the built-in tree (a new analysis' own node);
* the frames behind the sections that views draw from: the per-rank breakdown, every kernel's totals, the matched
  collective instances, the full step table.

Views (terminal, HTML, diff, replay, timeline, export) take this object; none re-derives a figure it holds.

Time bases: ``instances`` are on the aligned clock the analysis uses (clock offsets applied);
:meth:`AnalysisResult.instances_in_input_time` gives them on the trace's own clock, the one views draw on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import msgspec
import polars as pl

from tracekit.analysis.passes.steps import counted_steps
from tracekit.analysis.sections import Node, Sections
from tracekit.analysis.steptime import StepTime, job_steps, step_time
from tracekit.core.window import Window
from tracekit.schema import TraceMeta

__all__ = ["AnalysisResult", "INSTANCE_VIEW_COLUMNS", "instances_in_input_time", "encode"]

#: columns of :attr:`AnalysisResult.instances` (a subset of ``collectives.INSTANCE_COLUMNS``)
INSTANCE_VIEW_COLUMNS = [
    "pg", "seq", "rank", "name", "coll_name", "step_id", "arrival_ns", "end_ns", "dur_ns", "wait_ns", "transfer_ns",
    "late_rank", "n_ranks", "quality",
]


def encode(sections: Sections, extra: Mapping[str, Node] | None = None) -> dict[str, Any]:
    """The ``analyze --json`` object of a tree: its fields in order (absent ones left out), the ``extra``
    sections of analyses outside the built-in tree just before ``findings``."""
    doc: dict[str, Any] = _lists(msgspec.to_builtins(sections))
    if not extra:
        return doc
    out: dict[str, Any] = {}
    for k, v in doc.items():
        if k == "findings":
            out.update({name: _lists(msgspec.to_builtins(node)) for name, node in extra.items()})
        out[k] = v
    return out


def _lists(x: Any) -> Any:
    """JSON's own types: the tree's tuples (immutable nodes) as lists."""
    if isinstance(x, dict):
        return {k: _lists(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_lists(v) for v in x]
    return x


@dataclass(frozen=True)
class AnalysisResult:
    """Everything one analysis of one trace decided (see the module doc).

    ``breakdown``: per-rank exclusive split (``rank, window_start_ns, window_ns, gpu_busy_ns``, one column per bucket,
    ``idle``; ``window_ns`` is the observed time: profiler windows only); ``kernel_totals``: ``category, name, other,
    count, total_ns`` of every kernel in the window; ``instances``: matched collective instances in the window
    (:data:`INSTANCE_VIEW_COLUMNS`); ``step_table``: the full step table (one row per rank and step in the window,
    the rows of ``sections.steps.steps``; empty without steps).
    """

    meta: TraceMeta
    window: Window
    sections: Sections
    buckets: tuple[str, ...] = ()
    breakdown: pl.DataFrame = field(default_factory=pl.DataFrame)
    kernel_totals: pl.DataFrame = field(default_factory=pl.DataFrame)
    instances: pl.DataFrame = field(default_factory=pl.DataFrame)
    clock_offsets_ns: Mapping[int, int] = field(default_factory=dict)
    step_table: pl.DataFrame = field(default_factory=pl.DataFrame)
    extra: Mapping[str, Node] = field(default_factory=dict)

    # ---- the stable JSON object
    def to_json(self) -> dict[str, Any]:
        """The ``analyze --json`` object (docs/analyze_json.md): :func:`encode` of the tree."""
        return encode(self.sections, self.extra)

    def with_trace(self, path: str) -> "AnalysisResult":
        """This result, its ``trace`` field set to the analyzed file's path."""
        from dataclasses import replace

        return replace(self, sections=msgspec.structs.replace(self.sections, trace=path))

    # ---- what views need
    @property
    def spans(self) -> tuple[tuple[int, int], ...]:
        """Observed stretches: the profiler windows, else ``[start, end)`` of the window, else the per-rank extents' hull."""
        if self.window.spans:
            return tuple(self.window.spans)
        lo = self.window.start_ns
        hi = self.window.end_ns
        if (lo is None or hi is None) and self.breakdown.height:
            lo = int(self.breakdown["window_start_ns"].min()) if lo is None else lo  # type: ignore[arg-type]
            ends = self.breakdown.select((pl.col("window_start_ns") + pl.col("window_ns")).max()).item()
            hi = int(ends) if hi is None else hi
        return ((int(lo), int(hi)),) if lo is not None and hi is not None else ()

    @property
    def ranks(self) -> list[int]:
        return [int(r) for r in self.breakdown["rank"].to_list()] if self.breakdown.height else []

    def observed_ns(self) -> dict[int, int]:
        """Analyzed time per rank (ns)."""
        return {int(r): int(w) for r, w in zip(self.breakdown["rank"].to_list(), self.breakdown["window_ns"].to_list())}

    def profiled_steps(self) -> pl.DataFrame:
        """Step rows that have GPU work (the ones the step summary counts)."""
        st = self.step_table
        if st.height == 0:
            return st
        return st.filter(~pl.col("no_gpu")) if "no_gpu" in st.columns else st

    def steps_per_rank(self) -> float:
        """Profiled steps per rank in the window, with or without GPU work (the window's time covers them all: the
        per-step basis of ``diff``; a step whose ops the profiler cut still took its share of the window)."""
        st = self.step_table
        if st.height == 0:
            return 0.0
        st = st.filter(pl.col("profiled").fill_null(True)) if "profiled" in st.columns else st
        if st.height == 0:
            return 0.0
        m = st.group_by("rank").len()["len"].mean()
        return float(m) if isinstance(m, (int, float)) else 0.0

    def step_time(self) -> StepTime | None:
        """The trace's step time and tokens/s: the one every view prints (:mod:`tracekit.analysis.steptime`;
        ``steps.step_time`` in the JSON)."""
        st = self.step_table
        if st.height == 0 or "gpu_ops" not in st.columns:
            return None
        return step_time(counted_steps(st))

    def job_steps(self) -> pl.DataFrame:
        """The job steps :meth:`step_time` is taken over (:func:`tracekit.analysis.steptime.job_steps` of the steps
        that count): what ``diff`` pairs between two runs."""
        st = self.step_table
        if st.height == 0 or "gpu_ops" not in st.columns:
            return job_steps(pl.DataFrame())
        return job_steps(counted_steps(st))

    def tokens_per_s(self) -> float | None:
        """Tokens/s of :meth:`step_time` (the primary shape's tokens per step / its step time p50)."""
        st = self.step_time()
        return st.tokens_per_s if st is not None else None

    def collective_wait_ns(self) -> dict[int, int]:
        """Total collective wait per rank (the one definition: :mod:`tracekit.analysis.collectives`)."""
        if self.instances.height == 0:
            return {}
        t = self.instances.group_by("rank").agg(pl.col("wait_ns").sum()).sort("rank")
        return {int(r): int(w) for r, w in zip(t["rank"].to_list(), t["wait_ns"].to_list())}

    def instances_in_input_time(self) -> pl.DataFrame:
        """:attr:`instances` with ``arrival_ns``/``end_ns`` back on the trace's own clock (what views draw)."""
        return instances_in_input_time(self.instances, self.clock_offsets_ns)


def instances_in_input_time(instances: pl.DataFrame, clock_offsets_ns: Mapping[int, int]) -> pl.DataFrame:
    """Instance rows (aligned clock) with ``arrival_ns``/``end_ns`` back on the trace's own clock."""
    if not any(clock_offsets_ns.values()) or instances.height == 0:
        return instances
    back = {int(k): -int(v) for k, v in clock_offsets_ns.items()}
    off = pl.col("rank").cast(pl.Int64).replace_strict(back, default=0, return_dtype=pl.Int64)
    return instances.with_columns(pl.col("arrival_ns") + off, pl.col("end_ns") + off)
