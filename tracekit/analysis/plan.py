"""The cross-rank plan: what the cross-rank stage hands every analysis' part, finish and findings.

:func:`tracekit.analysis.stage.crossrank.cross_rank_plan` builds one :class:`CrossRankPlan` from the small
cross-rank rows (collective and step rows of every rank): clock offsets, matched instances, the collective
summaries, the communication split and the stall plan (:class:`StallPlan`, made by
:func:`tracekit.analysis.passes.stalls.stall_plan`). The types live here, below the registry, so that the
registry's contexts (:mod:`tracekit.analysis.registry`) can name them without importing the stage or a pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from tracekit._errors import QualityLog
from tracekit.core.align import AlignResult
from tracekit.core.collectives import split_communication
from tracekit.schema import TraceMeta

__all__ = ["CrossRankPlan", "StallPlan"]


@dataclass
class StallPlan:
    """The cross-rank half of :func:`tracekit.analysis.passes.stalls.detect_stalls`, from the instance table and the step rows only.

    ``cand``: (instance, waiting rank) rows above the thresholds; ``li``: one row per instance
    (late and first rank, their arrivals and previous sync points, step starts); ``pts``: the
    time points whose busy-before value each rank must supply (``pg, seq, k, rank, t``).
    """

    cand: pl.DataFrame
    li: pl.DataFrame
    pts: pl.DataFrame
    idle_frac: float
    tol_ns: int


@dataclass
class CrossRankPlan:
    """The cross-rank half of :func:`tracekit.analysis.stage.crossrank.cross_rank_sections`, from the small cross-rank rows only.

    ``inst``: matched instances (aligned time base) with arrival inside the window, only the
    columns the per-rank analyses read (``name`` categorical); ``groups``, ``per_rank``,
    ``instances``: the collective summaries, already computed; ``waits``: ``rank, arrival_ns, wait_ns``
    of every instance in the input's time base (:meth:`comm_parts` splits each rank's collective
    kernels with it); ``split``: whether the breakdown splits communication (some collective
    kernel has a duration).
    """

    meta: TraceMeta
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
    #: every registered analysis' options (defaults, overridden by ``opts["options"][name]``)
    options: dict[str, dict[str, Any]] = field(default_factory=dict)

    def comm_parts(self, df: pl.DataFrame, ranks: list[int] | None = None) -> pl.DataFrame:
        """Wait/transfer intervals of the collective kernels in ``df`` (input time base) for the breakdown."""
        w = self.waits if ranks is None else self.waits.filter(pl.col("rank").is_in(ranks))
        return split_communication(df, w, cpu_ranks=self.cpu_ranks)

    def rank_instances(self, ranks: list[int] | None) -> pl.DataFrame:
        """Instance rows of ``ranks`` (all when None) as :func:`match_collectives` types them."""
        i = self.inst if ranks is None else self.inst.filter(pl.col("rank").is_in(ranks))
        return i.with_columns(pl.col("name").cast(pl.String))
