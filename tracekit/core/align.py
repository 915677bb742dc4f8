"""Clock alignment across ranks from matched collectives.

Timestamps start absolute (CLOCK_REALTIME; ranks on one host share the clock,
replay_model.md §8). Collective kernels of one instance END within microseconds
of each other on every rank (kernel_families.md), so each rank's residual offset
is the median, over matched instances, of (instance mean end − own end). The
offsets are solved iteratively (any connected set of groups), anchored so the
lowest rank keeps offset 0, and applied only when they shrink the median end
spread to ≤ 50 µs or by at least half (otherwise end times do not agree and the
collectives cannot serve as a clock reference). ``residual_ns`` is the 90th percentile of the per-instance end spread
after alignment; a ``clock_residual_high`` flag is raised above 50 µs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

import polars as pl

from tracekit._errors import Quality, QualityLog
from tracekit.core.collectives import match_collectives
from tracekit.core._num import as_int
from tracekit.schema import TraceMeta

__all__ = ["AlignResult", "align_clocks", "solve_clock_offsets", "apply_offsets", "RESIDUAL_WARN_NS"]

RESIDUAL_WARN_NS = 50_000


@dataclass
class AlignResult:
    """``df`` aligned; ``offsets_ns`` added per rank (on top of any offsets in the metadata)."""

    df: pl.DataFrame | None  # None from solve_clock_offsets (offsets only)
    offsets_ns: dict[int, int]
    residual_ns: int | None
    residual_before_ns: int | None
    instances_used: int
    applied: bool
    quality: list[Quality] = field(default_factory=list)

    def __iter__(self) -> Iterator[Any]:  # allows ``df, offsets, residual = align_clocks(...)``
        return iter((self.df, self.offsets_ns, self.residual_ns))

    def to_json(self) -> dict[str, Any]:
        return {
            "offsets_ns": {str(k): v for k, v in self.offsets_ns.items()},
            "residual_ns": self.residual_ns,
            "residual_before_ns": self.residual_before_ns,
            "instances_used": self.instances_used,
            "applied": self.applied,
        }


def apply_offsets(df: pl.DataFrame, offsets_ns: Mapping[int, int]) -> pl.DataFrame:
    """Add ``offsets_ns[rank]`` to ``ts_ns`` and ``launch_ts_ns`` of every row of that rank."""
    if not offsets_ns or all(v == 0 for v in offsets_ns.values()):
        return df
    off = pl.col("rank").cast(pl.Int64).replace_strict({int(k): int(v) for k, v in offsets_ns.items()}, default=0, return_dtype=pl.Int64)
    return df.with_columns((pl.col("ts_ns") + off).alias("ts_ns"), (pl.col("launch_ts_ns") + off).alias("launch_ts_ns"))


def _spread(ends: pl.DataFrame, off: dict[int, float], q: float) -> float | None:
    e = ends.with_columns(
        (pl.col("end_ns").cast(pl.Float64) + pl.col("rank").replace_strict(off, default=0.0, return_dtype=pl.Float64)).alias("_e")
    )
    s = e.group_by(["pg", "seq"]).agg((pl.col("_e").max() - pl.col("_e").min()).alias("s"))
    v = s["s"].quantile(q) if s.height else None
    return float(v) if v is not None else None


def align_clocks(
    df: pl.DataFrame,
    meta: TraceMeta | None = None,
    *,
    instances: pl.DataFrame | None = None,
    min_instances: int = 3,
    iterations: int = 5,
    ranks: list[int] | None = None,
) -> AlignResult:
    """Refine per-rank clock offsets from collective end times and apply them (pure).

    ``meta`` is read for ``clock_offsets_ns`` already applied by the converter
    (reported in quality details only). Returns an :class:`AlignResult` which also
    unpacks as ``(df_aligned, offsets_ns, residual_ns)``. ``ranks`` (default: the
    ranks of ``df``) are the ranks offsets are solved for: pass them when ``df`` holds
    only the collective rows of a trace.
    """
    if ranks is None:
        ranks = sorted(int(r) for r in df.get_column("rank").unique().to_list())
    if instances is None and len(ranks) >= 2:
        instances = match_collectives(df)
    al = solve_clock_offsets(ranks, instances, meta, min_instances=min_instances, iterations=iterations)
    al.df = apply_offsets(df, al.offsets_ns) if al.applied else df
    return al


def solve_clock_offsets(
    ranks: list[int],
    instances: pl.DataFrame | None,
    meta: TraceMeta | None = None,
    *,
    min_instances: int = 3,
    iterations: int = 5,
) -> AlignResult:
    """The offsets of :func:`align_clocks` from matched instances alone (``df`` of the result is None).

    Needs only the instance table (collective rows of all ranks), never a whole trace:
    apply the offsets per rank with :func:`apply_offsets`.
    """
    q = QualityLog()
    ranks = sorted(int(r) for r in ranks)
    zero = {r: 0 for r in ranks}
    if len(ranks) < 2 or instances is None:
        return AlignResult(None, zero, None, None, 0, False, list(q))
    ends = instances.filter((pl.col("quality") == "ok") & (pl.col("n_ranks") >= 2)).select("pg", "seq", "rank", "end_ns")
    if ends.height:  # relative times keep float math exact (absolute ns exceed float64 precision)
        ends = ends.with_columns(pl.col("end_ns") - as_int(ends["end_ns"].min()))
    n_inst = ends.select(pl.struct("pg", "seq").n_unique()).item() if ends.height else 0
    if n_inst < min_instances:
        q.add("clock_alignment_skipped",
              f"only {n_inst} matched collective instance(s) (need {min_instances}); ranks kept on absolute time",
              severity="info")
        return AlignResult(None, zero, None, None, int(n_inst), False, list(q))
    off: dict[int, float] = {r: 0.0 for r in ranks}
    for _ in range(iterations):
        e = ends.with_columns(
            (pl.col("end_ns").cast(pl.Float64) + pl.col("rank").replace_strict(off, default=0.0, return_dtype=pl.Float64)).alias("_e")
        )
        e = e.with_columns(pl.col("_e").mean().over(["pg", "seq"]).alias("_m"))
        upd = e.group_by("rank").agg((pl.col("_m") - pl.col("_e")).median().alias("d"))
        for r, d in zip(upd["rank"].to_list(), upd["d"].to_list()):
            off[int(r)] += float(d)
    base = off[ranks[0]]
    offsets = {r: int(round(off[r] - base)) for r in ranks}
    missing = [r for r in ranks if r not in set(ends["rank"].unique().to_list())]
    for r in missing:
        offsets[r] = 0
    before50 = _spread(ends, {r: 0.0 for r in ranks}, 0.5)
    after50 = _spread(ends, {r: float(v) for r, v in offsets.items()}, 0.5)
    before90 = _spread(ends, {r: 0.0 for r in ranks}, 0.9)
    applied = (
        after50 is not None and before50 is not None and any(offsets.values()) and after50 < before50
        and (after50 <= RESIDUAL_WARN_NS or after50 <= 0.5 * before50)
    )
    if not applied:
        offsets = zero
    res90 = _spread(ends, {r: float(v) for r, v in offsets.items()}, 0.9)
    res = int(round(res90)) if res90 is not None else None
    if missing:
        q.add("clock_alignment_partial", f"rank(s) {missing} share no matched collective; kept on absolute time",
              ranks=missing)
    if res is not None and res > RESIDUAL_WARN_NS:
        q.add("clock_residual_high",
              f"collective end times still differ by {res / 1000:.1f} µs (p90) after alignment; "
              "cross-rank waits below that are not meaningful",
              residual_ns=res, prior_offsets_ns=(meta or {}).get("clock_offsets_ns"))
    return AlignResult(None, offsets, res, int(round(before90)) if before90 is not None else None, int(n_inst), applied, list(q))
