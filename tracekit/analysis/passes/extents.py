"""Per-rank extents of the window: what the findings and the interconnect verdict measure shares against.

The ``extents`` analysis (no JSON section): per rank, the extent of its device ops inside the analysed rows
(first start → last end; :func:`tracekit.core.window.device_op_expr`), whether the window holds rows but no
GPU op (CPU mode), and, for a windowed capture, the recorded time per rank (the profiler windows' total).
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from tracekit.analysis.registry import Analysis, FinishContext, Finished, PartContext, concat, register
from tracekit.core.window import cpu_mode_ranks, device_op_expr

__all__ = ["Extents", "ExtentPart"]


@dataclass
class ExtentPart:
    """One rank's (or a frame's): ``extents`` (rank, w), rows and GPU-op rows in the window, recorded time."""

    extents: pl.DataFrame
    rows: int
    gpu_rows: int
    observed: dict[int, int] | None


@dataclass(frozen=True)
class Extents:
    """``wmap``: rank → extent of its device ops; ``cpu``: rows but no GPU op (CPU mode); ``observed``: rank →
    recorded time of a windowed capture (None otherwise); ``seen``: the extent capped by the recorded time."""

    wmap: dict[int, int]
    cpu: bool
    observed: dict[int, int] | None
    seen: dict[int, int]


def _part(df: pl.DataFrame, ctx: PartContext) -> ExtentPart:
    ext = df.lazy().filter(device_op_expr(cpu_mode_ranks(df))).group_by("rank").agg(
        ((pl.col("ts_ns") + pl.col("dur_ns")).max() - pl.col("ts_ns").min()).alias("w")).collect()
    gpu_rows = int(df.select(pl.col("kind").is_in(["kernel", "memcpy", "memset"]).sum()).item())
    return ExtentPart(ext, df.height, gpu_rows, ctx.observed)


def _finish(parts: list[ExtentPart], ctx: FinishContext) -> Finished:
    extents = concat([p.extents for p in parts], {"rank": pl.Int64, "w": pl.Int64})
    wmap = {int(r): int(w) for r, w in zip(extents["rank"].to_list(), extents["w"].to_list())} if extents.height else {}
    cpu = sum(p.rows for p in parts) > 0 and sum(p.gpu_rows for p in parts) == 0
    observed: dict[int, int] | None = None
    if ctx.plan.spans:
        observed = {}
        for p in parts:
            observed.update(p.observed or {})
    seen = {r: min(w, (observed or {}).get(r, w)) for r, w in wmap.items()}  # windowed capture: recorded time only
    return Finished({}, Extents(wmap, cpu, observed, seen))


ANALYSIS = register(Analysis("extents", (), ("rank", "kind", "ts_ns", "dur_ns", "category"), _part, _finish, order=0))
