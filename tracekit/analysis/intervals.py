"""Vectorized interval algebra on polars frames (half-open ``[start, end)`` in ns).

All functions take frames with integer ``start``/``end`` columns (names
configurable) and optional grouping columns ``by``; none loops per event.
"""

from __future__ import annotations

from typing import Sequence

import polars as pl

__all__ = ["merge", "union_length", "clip", "gaps", "overlap_length", "covered_by"]


def _by(by: str | Sequence[str] | None) -> list[str]:
    if by is None:
        return []
    return [by] if isinstance(by, str) else list(by)


def clip(df: pl.DataFrame, lo: int | pl.Expr, hi: int | pl.Expr, *, start: str = "start", end: str = "end") -> pl.DataFrame:
    """Clip intervals to ``[lo, hi)``; drops the ones that end up empty."""
    lo_e = pl.lit(lo) if isinstance(lo, int) else lo
    hi_e = pl.lit(hi) if isinstance(hi, int) else hi
    return df.with_columns(
        pl.max_horizontal(pl.col(start), lo_e).alias(start),
        pl.min_horizontal(pl.col(end), hi_e).alias(end),
    ).filter(pl.col(end) > pl.col(start))


def merge(df: pl.DataFrame, *, by: str | Sequence[str] | None = None, start: str = "start", end: str = "end") -> pl.DataFrame:
    """Union of intervals per group: disjoint, sorted ``by..., start, end``.

    Touching intervals (``end == next start``) are merged.
    """
    keys = _by(by)
    if df.height == 0:
        return df.select(keys + [start, end])
    d = df.select(keys + [start, end]).filter(pl.col(end) > pl.col(start)).sort(keys + [start])
    prev_end = pl.col(end).cum_max().shift(1)
    if keys:
        prev_end = prev_end.over(keys)
    d = d.with_columns(prev_end.alias("_pe"))
    new = pl.col("_pe").is_null() | (pl.col(start) > pl.col("_pe"))
    d = d.with_columns(new.cast(pl.Int64).cum_sum().alias("_g"))
    return (
        d.group_by(keys + ["_g"], maintain_order=True)
        .agg(pl.col(start).min(), pl.col(end).max())
        .drop("_g")
        .sort(keys + [start])
    )


def union_length(df: pl.DataFrame, *, by: str | Sequence[str] | None = None, start: str = "start", end: str = "end") -> pl.DataFrame:
    """Total length of the union per group (column ``length``)."""
    keys = _by(by)
    m = merge(df, by=keys, start=start, end=end)
    if keys:
        return m.group_by(keys, maintain_order=True).agg((pl.col(end) - pl.col(start)).sum().alias("length"))
    return pl.DataFrame({"length": [int((m[end] - m[start]).sum()) if m.height else 0]})


def gaps(
    df: pl.DataFrame,
    lo: int | None = None,
    hi: int | None = None,
    *,
    by: str | Sequence[str] | None = None,
    start: str = "start",
    end: str = "end",
    bounds: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """Complement of the union inside a window: the idle gaps.

    The window is ``[lo, hi)`` for all groups, or per group from ``bounds``
    (columns ``by..., lo, hi``). Groups with no interval are one whole gap only
    when they appear in ``bounds``.
    """
    keys = _by(by)
    m = merge(df, by=keys, start=start, end=end)
    if bounds is None:
        if lo is None or hi is None:
            raise ValueError("gaps() needs lo/hi or bounds")
        if keys:
            bounds = m.select(keys).unique().with_columns(pl.lit(lo).alias("lo"), pl.lit(hi).alias("hi"))
        else:
            bounds = pl.DataFrame({"lo": [lo], "hi": [hi]})
    if keys:
        m = m.join(bounds, on=keys, how="inner")
    else:
        m = m.join(bounds, how="cross")
    m = clip(m, pl.col("lo"), pl.col("hi"), start=start, end=end)
    nxt = pl.col(start).shift(-1)
    prv = pl.col(end).shift(1)
    if keys:
        nxt, prv = nxt.over(keys), prv.over(keys)
    inner = m.with_columns(prv.alias("_ps")).select(
        keys + [pl.coalesce(pl.col("_ps"), pl.col("lo")).alias("start"), pl.col(start).alias("end")]
    )
    last = m.group_by(keys, maintain_order=True).agg(pl.col(end).max().alias("start"), pl.col("hi").first().alias("end")) if keys else (
        m.select(pl.col(end).max().alias("start"), pl.col("hi").first().alias("end")) if m.height else pl.DataFrame()
    )
    parts = [inner]
    if last.height:
        parts.append(last.select(keys + ["start", "end"]))
    # groups in bounds with no intervals at all
    if keys:
        empty = bounds.join(m.select(keys).unique(), on=keys, how="anti").select(keys + [pl.col("lo").alias("start"), pl.col("hi").alias("end")])
    else:
        empty = bounds.select(pl.col("lo").alias("start"), pl.col("hi").alias("end")) if m.height == 0 else pl.DataFrame()
    if empty.height:
        parts.append(empty)
    out = pl.concat([p.cast({"start": pl.Int64, "end": pl.Int64}) for p in parts], how="vertical_relaxed")
    return out.filter(pl.col("end") > pl.col("start")).sort(keys + ["start"])


def overlap_length(
    a: pl.DataFrame, b: pl.DataFrame, *, by: str | Sequence[str] | None = None, start: str = "start", end: str = "end"
) -> pl.DataFrame:
    """|A ∩ B| per group, via |A| + |B| − |A ∪ B| (column ``length``)."""
    keys = _by(by)
    la = union_length(a, by=keys, start=start, end=end).rename({"length": "_a"})
    lb = union_length(b, by=keys, start=start, end=end).rename({"length": "_b"})
    lab = union_length(pl.concat([a.select(keys + [start, end]), b.select(keys + [start, end])]), by=keys, start=start, end=end)
    if keys:
        j = lab.join(la, on=keys, how="left").join(lb, on=keys, how="left").fill_null(0)
    else:
        j = pl.concat([lab, la, lb], how="horizontal")
    return j.select(keys + [(pl.col("_a") + pl.col("_b") - pl.col("length")).alias("length")])


def covered_by(
    points: pl.DataFrame,
    intervals: pl.DataFrame,
    *,
    by: str | Sequence[str] | None = None,
    at: str = "ts",
    start: str = "start",
    end: str = "end",
    payload: Sequence[str] = (),
    keep_order: bool = True,
) -> pl.DataFrame:
    """For each point, the innermost (latest-starting) interval containing it.

    ``keep_order=False`` returns the points in no particular order (callers
    that attach the result by a row key skip a sort of every point).

    Adds ``payload`` columns of the matching interval (null when none contains
    the point). Exact for properly nested intervals (CPU ranges of one
    thread): a ``join_asof`` finds the latest interval starting at or before
    the point; when that one has already ended, a sweep over interval
    boundaries finds the enclosing interval still open at that nesting depth.
    """
    keys = _by(by)
    iv = intervals.select(keys + [pl.col(start).alias("_s"), pl.col(end).alias("_e")] + list(payload))
    iv = iv.sort(keys + ["_s", "_e"], descending=[False] * len(keys) + [False, True])
    pts = points.with_row_index("_i").sort(keys + [at])
    j = pts.join_asof(iv, left_on=at, right_on="_s", by=keys or None, strategy="backward", check_sortedness=False)
    inside = pl.col(at) < pl.col("_e")
    miss = j.filter(pl.col("_s").is_not_null() & ~inside)
    if miss.height:
        j = pl.concat([j.filter(pl.col("_s").is_null() | inside), _enclosing(miss.select(pts.columns), iv, keys, at)],
                      how="vertical_relaxed")
        inside = pl.col(at) < pl.col("_e")
    j = j.with_columns([pl.when(inside).then(pl.col(p)).otherwise(None).alias(p) for p in payload])
    return (j.sort("_i") if keep_order else j).drop(["_i", "_s", "_e"])


def _enclosing(pts: pl.DataFrame, iv: pl.DataFrame, keys: list[str], at: str) -> pl.DataFrame:
    """Points whose latest-starting interval has ended: match the open interval at their depth."""
    iv = iv.with_row_index("_id")
    starts = iv.select(keys + [pl.col("_s").alias("__tev"), pl.lit(1).alias("_d"), pl.lit(1).alias("_o"), (-pl.col("_e")).alias("_x"), "_id"])
    ends = iv.select(keys + [pl.col("_e").alias("__tev"), pl.lit(-1).alias("_d"), pl.lit(0).alias("_o"), pl.lit(0, dtype=pl.Int64).alias("_x"), "_id"])
    ev = pl.concat([starts, ends.with_columns(pl.col("_x").cast(starts.schema["_x"]))]).sort(keys + ["__tev", "_o", "_x"])
    depth = pl.col("_d").cum_sum()
    ev = ev.with_columns((depth.over(keys) if keys else depth).alias("_depth"))
    p = pts.join_asof(ev.select(keys + ["__tev", "_depth"]), left_on=at, right_on="__tev", by=keys or None,
                      strategy="backward", check_sortedness=False).drop("__tev")
    open_at = ev.filter(pl.col("_d") == 1).select(keys + ["__tev", "_depth", "_id"])
    p = p.sort(keys + [at]).join_asof(open_at, left_on=at, right_on="__tev", by=keys + ["_depth"],
                                     strategy="backward", check_sortedness=False).drop(["__tev", "_depth"])
    return p.join(iv.drop(keys), on="_id", how="left").drop("_id")
