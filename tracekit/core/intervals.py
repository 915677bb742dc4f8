"""Vectorized interval algebra on polars frames (half-open ``[start, end)`` in ns).

All functions take frames with integer ``start``/``end`` columns (names
configurable) and optional grouping columns ``by``; none loops per event.

Overlaps between two sets of intervals go through :func:`overlap_index`
(and its wrappers :func:`overlap_join` and :func:`intersect`): sort, then
search. A pair overlaps when ``r.start < l.end and r.end > l.start``; every
such pair has either the right start inside ``[l.start, l.end)`` or the left
start strictly inside ``(r.start, r.end)``, and each of those sets is one
contiguous run of a sorted column, found with a forward ``join_asof``. The cost
is ``O((n + m) log(n + m) + pairs)``: never the ``n x m`` of a join on the group
key followed by a time filter.
"""

from __future__ import annotations

from typing import Any, Sequence

import polars as pl

__all__ = ["merge", "union_length", "clip", "gaps", "overlap_length", "covered_by", "overlap_index", "overlap_join", "intersect"]


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


def _sorted_by_keys(d: pl.DataFrame, keys: list[str], t: str) -> pl.DataFrame:
    """``d.sort(keys + [t])``, through one Int64 sort key when it fits: each key column's dense
    code (a one-column sort each), mixed radix, times the time span, plus the time. Polars sorts
    several columns through row encoding, about ten times slower than one integer column."""
    if not keys or d.height < 50_000:
        return d.sort(keys + [t])
    tcol = d.get_column(t)
    lo, hi = tcol.min(), tcol.max()
    if lo is None or hi is None or not all(d.schema[k].is_integer() for k in keys) or not d.schema[t].is_integer():
        return d.sort(keys + [t])
    span = int(hi) - int(lo) + 1  # type: ignore[arg-type]
    codes = d.select([(pl.col(k).rank("dense") - 1).cast(pl.Int64).alias(f"_c{i}") for i, k in enumerate(keys)])
    radix = [int(codes.get_column(f"_c{i}").max()) + 1 for i in range(len(keys))]  # type: ignore[arg-type]
    total = 1
    for r in radix:
        total *= r
    if total * span >= 2**62:
        return d.sort(keys + [t])
    code = pl.lit(0, pl.Int64)
    for i, r in enumerate(radix):
        code = code * r + codes.get_column(f"_c{i}")
    key = code * span + (pl.col(t).cast(pl.Int64) - int(lo))  # type: ignore[arg-type]
    return d.with_columns(key.alias("_sk")).sort("_sk").drop("_sk")


def merge(df: pl.DataFrame, *, by: str | Sequence[str] | None = None, start: str = "start", end: str = "end") -> pl.DataFrame:
    """Union of intervals per group: disjoint, sorted ``by..., start, end``.

    Touching intervals (``end == next start``) are merged. One sort and one pass: each group's
    times are shifted into a band of their own (``gid * span``), so a single running maximum of the
    ends serves every group (no per-group window function, no hash group-by).
    """
    keys = _by(by)
    if df.height == 0:
        return df.select(keys + [start, end])
    d = _sorted_by_keys(df.select(keys + [start, end]).filter(pl.col(end) > pl.col(start)), keys, start)
    if d.height == 0:
        return d
    lo = int(d.get_column(start).min())  # type: ignore[arg-type]
    span = int(d.get_column(end).max()) - lo + 1  # type: ignore[arg-type]
    if keys:
        changed = pl.any_horizontal([pl.col(k).ne_missing(pl.col(k).shift(1)) for k in keys]).fill_null(True)
        d = d.with_columns(changed.cast(pl.Int64).cum_sum().alias("_gid"))
        n_groups = int(d.get_column("_gid").max())  # type: ignore[arg-type]
    else:
        d = d.with_columns(pl.lit(0, pl.Int64).alias("_gid"))
        n_groups = 1
    if (n_groups + 1) * span >= 2**62:  # bands would overflow int64: per-group running maximum instead
        cm = pl.col(end).cum_max().over("_gid")
        pe = cm.shift(1).over("_gid")
        new = pe.is_null() | (pl.col(start) > pe)
        d = d.with_columns(cm.alias("_cm"), new.alias("_new"))
    else:
        off = pl.col("_gid") * span - lo
        cm = (pl.col(end) + off).cum_max()
        d = d.with_columns(cm.alias("_cm")).with_columns(
            (pl.col("_cm").shift(1).is_null() | ((pl.col(start) + off) > pl.col("_cm").shift(1))).alias("_new"),
            (pl.col("_cm") - off).alias("_cm"),
        )
    last = pl.col("_new").shift(-1).fill_null(True)
    starts = d.filter(pl.col("_new")).select(keys + [start])
    ends = d.filter(last).select(pl.col("_cm").cast(d.schema[end]).alias(end))
    return pl.concat([starts, ends], how="horizontal")


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
    (columns ``by..., lo, hi``; several rows of a group are several windows).
    Windows with no interval are one whole gap.
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
    bounds = bounds.select(keys + ["lo", "hi"]).with_row_index("_sp")
    gk = keys + ["_sp"]  # each window of a group on its own (a group may have several)
    m = intersect(m, bounds, by=keys, start=start, end=end).sort(gk + [start])
    prv = pl.col(end).shift(1).over(gk)
    inner = m.with_columns(prv.alias("_ps")).select(
        gk + [pl.coalesce(pl.col("_ps"), pl.col("lo")).alias("start"), pl.col(start).alias("end")]
    )
    last = m.group_by(gk, maintain_order=True).agg(pl.col(end).max().alias("start"), pl.col("hi").first().alias("end"))
    # windows with no interval at all are one whole gap
    empty = bounds.join(m.select(gk).unique(), on=gk, how="anti").select(gk + [pl.col("lo").alias("start"), pl.col("hi").alias("end")])
    parts = [p.select(gk + ["start", "end"]).cast({"start": pl.Int64, "end": pl.Int64}) for p in (inner, last, empty) if p.height]
    if not parts:
        return pl.DataFrame(schema={**{k: bounds.schema[k] for k in keys}, "start": pl.Int64, "end": pl.Int64})
    out = pl.concat(parts, how="vertical_relaxed")
    return out.filter(pl.col("end") > pl.col("start")).sort(keys + ["start"]).select(keys + ["start", "end"])


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


def _first_at_or_after(
    sorted_t: pl.DataFrame, queries: pl.DataFrame, keys: list[str], q: str, *, strict: bool
) -> pl.Series:
    """Global row position in ``sorted_t`` (columns ``keys, _t, _pos``; sorted by keys then ``_t``,
    ``_pos`` its row number) of the first row of the query's group with ``_t >= q`` (``> q`` when
    ``strict``); the group's end when none, ``0`` when the group is absent. One value per query row, in order."""
    qq = _sorted_by_keys(queries.select(keys + [pl.col(q).alias("_q")]).with_row_index("_qi"), keys, "_q")
    j = qq.join_asof(sorted_t.select(keys + ["_t", "_pos"]), left_on="_q", right_on="_t", by=keys or None,
                     strategy="forward", allow_exact_matches=not strict, check_sortedness=False)
    if keys:
        ends = sorted_t.group_by(keys).agg((pl.col("_pos").max() + 1).alias("_end"))
        j = _frames_lookup(j, ends, keys)
        pos = pl.coalesce(pl.col("_pos"), pl.col("_end"), pl.lit(0, pl.UInt32))
    else:
        pos = pl.coalesce(pl.col("_pos"), pl.lit(sorted_t.height, pl.UInt32))
    return j.sort("_qi").select(pos.cast(pl.Int64).alias("_p")).to_series()


def _frames_lookup(df: pl.DataFrame, small: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """Equality lookup of a per-group table (one row per group): no time condition, no fan-out."""
    return df.join(small, on=keys, how="left", maintain_order="left")


def _expand(lo: pl.Series, hi: pl.Series, other: str, this: str) -> pl.DataFrame:
    """Rows ``(this=i, other=p)`` for every ``p`` in ``[lo[i], hi[i])``."""
    d = pl.DataFrame({"_lo": lo, "_hi": hi}).with_row_index(this).filter(pl.col("_hi") > pl.col("_lo"))
    return d.select(this, pl.int_ranges("_lo", "_hi", dtype=pl.Int64).alias(other)).explode(other)


def overlap_index(
    left: pl.DataFrame,
    right: pl.DataFrame,
    *,
    by: str | Sequence[str] | None = None,
    start: str = "start",
    end: str = "end",
    right_start: str | None = None,
    right_end: str | None = None,
) -> pl.DataFrame:
    """Row numbers ``left_idx, right_idx`` (UInt32) of every overlapping pair with equal ``by`` keys.

    Overlap: ``right.start < left.end and right.end > left.start`` (half-open; a zero-length
    interval overlaps one that strictly contains it). Rows sorted by ``left_idx, right_idx``.
    Cost ``O((n + m) log(n + m) + pairs)`` (module doc); nulls in a bound match nothing.
    """
    keys = _by(by)
    rs, re_ = right_start or start, right_end or end
    out_schema: dict[Any, Any] = {"left_idx": pl.UInt32, "right_idx": pl.UInt32}
    if left.height == 0 or right.height == 0:
        return pl.DataFrame(schema=out_schema)
    lf = left.select(keys + [pl.col(start).alias("_s"), pl.col(end).alias("_e")]).with_row_index("_orig")
    rf = right.select(keys + [pl.col(rs).alias("_s"), pl.col(re_).alias("_e")]).with_row_index("_orig")
    if keys:  # a common type per key column, so both sides group alike
        rf = rf.cast({k: lf.schema[k] for k in keys})
    lf = lf.drop_nulls(["_s", "_e"])
    rf = rf.drop_nulls(["_s", "_e"])
    # (1) right starts inside [l.s, l.e): a run of the right frame sorted by start
    rsort = _sorted_by_keys(rf, keys, "_s").with_row_index("_pos").with_columns(pl.col("_s").alias("_t"))
    lo = _first_at_or_after(rsort, lf, keys, "_s", strict=False)
    hi = _first_at_or_after(rsort, lf, keys, "_e", strict=False)
    a = _expand(lo, hi, "_rp", "_li")
    a = a.with_columns(lf.get_column("_orig").gather(a.get_column("_li")).alias("left_idx"),
                       rsort.get_column("_orig").gather(a.get_column("_rp")).alias("right_idx"),
                       rsort.get_column("_e").gather(a.get_column("_rp")).alias("_re"),
                       lf.get_column("_s").gather(a.get_column("_li")).alias("_ls"))
    a = a.filter(pl.col("_re") > pl.col("_ls")).select("left_idx", "right_idx")
    # (2) left starts strictly inside (r.s, r.e): a run of the left frame sorted by start
    lsort = _sorted_by_keys(lf, keys, "_s").with_row_index("_pos").with_columns(pl.col("_s").alias("_t"))
    lo2 = _first_at_or_after(lsort, rf, keys, "_s", strict=True)
    hi2 = _first_at_or_after(lsort, rf, keys, "_e", strict=False)
    b = _expand(lo2, hi2, "_lp", "_ri")
    b = b.select(lsort.get_column("_orig").gather(b.get_column("_lp")).alias("left_idx"),
                 rf.get_column("_orig").gather(b.get_column("_ri")).alias("right_idx"))
    return pl.concat([a, b]).cast(out_schema).sort(["left_idx", "right_idx"])


def overlap_join(
    left: pl.DataFrame,
    right: pl.DataFrame,
    *,
    by: str | Sequence[str] | None = None,
    start: str = "start",
    end: str = "end",
    right_start: str | None = None,
    right_end: str | None = None,
    suffix: str = "_right",
) -> pl.DataFrame:
    """One row per overlapping pair (see :func:`overlap_index`): the left row's columns, then the
    right row's (``by`` keys once; other clashing names get ``suffix``)."""
    keys = _by(by)
    ix = overlap_index(left, right, by=keys, start=start, end=end, right_start=right_start, right_end=right_end)
    lcols = set(left.columns)
    r = right.drop(keys).rename({c: c + suffix for c in right.columns if c in lcols and c not in keys})
    return pl.concat([left[ix.get_column("left_idx")], r[ix.get_column("right_idx")]], how="horizontal")


def intersect(
    df: pl.DataFrame,
    spans: pl.DataFrame,
    *,
    by: str | Sequence[str] | None = None,
    start: str = "start",
    end: str = "end",
    span_start: str = "lo",
    span_end: str = "hi",
) -> pl.DataFrame:
    """``df``'s intervals cut to each span of ``spans`` they overlap (same ``by`` keys), with the span's
    other columns attached; pieces left empty are dropped. An interval inside several spans
    becomes one piece per span."""
    keys = _by(by)
    j = overlap_join(df, spans, by=keys, start=start, end=end, right_start=span_start, right_end=span_end)
    return clip(j, pl.col(span_start), pl.col(span_end), start=start, end=end)


def in_spans(spans: Sequence[tuple[int, int]], start: pl.Expr, end: pl.Expr, *, closed: bool = False) -> pl.Expr:
    """Whether ``[start, end)`` overlaps any of ``spans`` (``closed``: ``[start, end]`` meets any ``[a, b]``).

    One binary search per row over the (merged, sorted) span starts instead of one comparison per span:
    the only candidate is the last span starting before the row ends.
    """
    if not spans:
        return pl.lit(False)
    merged: list[list[int]] = []
    for a, b in sorted((int(a), int(b)) for a, b in spans):
        if merged and (a <= merged[-1][1] if closed else a < merged[-1][1]):  # half-open: touching spans stay apart
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    starts = pl.Series([a for a, _ in merged], dtype=pl.Int64)
    ends = pl.Series([b for _, b in merged], dtype=pl.Int64)
    k = pl.lit(starts).search_sorted(end, side="right" if closed else "left").cast(pl.Int64) - 1
    b_k = pl.lit(ends).gather(k.clip(lower_bound=0))
    return (k >= 0) & ((b_k >= start) if closed else (b_k > start))
