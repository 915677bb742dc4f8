"""Float aggregations whose result does not depend on how polars lays the data out.

polars picks a summation kernel by layout (one chunk or several, sorted fast paths,
group slices vs. gathered groups), and float addition is not associative: the same values
in the same order can sum to results a few ulps apart. The analyses run both on whole
frames and on one rank's rows read from a scan (``tracekit.analysis.stage.pipeline``), and the two
must agree exactly, so float sums and means of per-rank data use a sequential cumulative
sum: one fixed evaluation order (row order), whatever the layout.
"""

from __future__ import annotations

from typing import Any

import polars as pl

__all__ = ["seq_sum", "seq_mean", "fdiv"]


def seq_sum(e: pl.Expr) -> pl.Expr:
    """Sum of ``e`` added in row order (0.0 when empty, as ``sum``)."""
    return e.cum_sum().last().fill_null(0.0)


def seq_mean(e: pl.Expr) -> pl.Expr:
    """Mean of ``e`` (non-null values) added in row order; null when empty, as ``mean``."""
    v = e.drop_nulls()
    return v.cum_sum().last() / v.count()


def fdiv(a: pl.Expr, b: pl.Expr) -> pl.Expr:
    """``a / b`` computed as ``a * (1 / b)``.

    polars divides a column by a broadcast scalar (e.g. a column joined from a one-row table,
    as when a frame holds one rank) as a multiplication by the reciprocal, and an ordinary
    column element by element; the two round differently. Writing the reciprocal explicitly
    gives the same bits both ways (and differs from ``a / b`` by at most one ulp).
    """
    return a * (1.0 / b.cast(pl.Float64))


def as_int(x: Any) -> int:
    """A polars scalar (``Series.min()``, ``.item()``, a row value) as ``int``; raises on null (a caller's bug)."""
    if x is None:
        raise ValueError("as_int: null scalar")
    return int(x)


def as_float(x: Any) -> float:
    """A polars scalar as ``float``; raises on null."""
    if x is None:
        raise ValueError("as_float: null scalar")
    return float(x)
