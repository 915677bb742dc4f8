"""Column lookups that never copy the frame they extend (one concept: attach by key).

Finalizing a rank joins small tables (launch calls, rule results, step ids)
onto a frame of millions of rows and ~50 columns. A plain left join copies
every column; :func:`attach` joins only the key and appends the looked-up
columns to the shared ones. Name-keyed lookups go through the categorical
``name`` column's codes, so regexes run once per distinct name
(:func:`distinct_names`) and rows find theirs without casting names to text.

A rank is read as a frame of several chunks (one per group of decoded text
chunks; gluing them into one would copy the rank). Polars rechunks the whole
frame in the next ``select``/``with_columns``/``filter`` as soon as one column's
chunks differ from the others', so every column added here is cut at the
frame's chunk boundaries (:func:`aligned`, zero-copy slices).
"""

from __future__ import annotations

import polars as pl

__all__ = ["attach", "attach_rows", "aligned", "row_index", "distinct_names", "NAME_CODE"]

#: the ``name`` column's dictionary code (stable within the process)
NAME_CODE = pl.col("name").cast(pl.Categorical).to_physical()


def attach(df: pl.DataFrame, small: pl.DataFrame, on: str, key: pl.Expr | None = None) -> pl.DataFrame:
    """``df.join(small, on=on, how="left")`` for ``small`` unique on ``on``, without copying ``df``.

    ``key``: an expression giving the join key from ``df`` (default: ``df[on]``); rows where it
    is null find nothing. Row order and count are kept; ``on`` itself is not added.
    """
    k = (key if key is not None else pl.col(on)).alias(on)
    cols = df.select(k).join(small, on=on, how="left", maintain_order="left").drop(on)
    return df.hstack(aligned(df, cols.get_columns()))


def attach_rows(df: pl.DataFrame, small: pl.DataFrame, on: str) -> pl.DataFrame:
    """:func:`attach` where ``small[on]`` holds row numbers of ``df`` (:func:`row_index`), unique.

    A scatter and one gather per looked-up column instead of a hash join over
    every row of ``df`` (its hash table was the largest transient of finalizing a rank).
    """
    pos = pl.repeat(None, df.height, dtype=pl.UInt32, eager=True)
    if small.height:
        pos = pos.scatter(small.get_column(on).cast(pl.UInt32), pl.int_range(0, small.height, dtype=pl.UInt32, eager=True))
    cols = [small.get_column(c).gather(pos) for c in small.columns if c != on]
    return df.hstack(aligned(df, cols))


def _chunk_lengths(df: pl.DataFrame) -> list[int]:
    # ts_ns is always materialized in a trace frame (a null literal column would report one chunk)
    col = "ts_ns" if "ts_ns" in df.schema else df.columns[0]
    return df.get_column(col).chunk_lengths() if df.width else []


def aligned(df: pl.DataFrame, cols: list[pl.Series]) -> list[pl.Series]:
    """``cols`` (each ``df.height`` long) cut at ``df``'s chunk boundaries, so ``df.hstack(cols)`` stays aligned."""
    lens = _chunk_lengths(df)
    if len(lens) < 2:
        return cols
    out = []
    for s in cols:
        if s.chunk_lengths() == lens:
            out.append(s)
            continue
        pieces, off = [], 0
        for n in lens:
            pieces.append(s.slice(off, n))
            off += n
        out.append(pl.concat(pieces, rechunk=False))
    return out


def row_index(df: pl.DataFrame, name: str) -> pl.DataFrame:
    """``df.with_row_index(name)`` (UInt32, appended last) with the index cut at ``df``'s chunk boundaries."""
    idx = pl.int_range(0, df.height, dtype=pl.UInt32, eager=True).alias(name)
    return df.hstack(aligned(df, [idx]))


def distinct_names(df: pl.DataFrame, where: pl.Expr) -> pl.DataFrame:
    """Distinct ``name`` of the rows matching ``where``: columns ``_code`` (see :data:`NAME_CODE`), ``name`` (text)."""
    return (
        df.lazy().filter(where)
        .select(NAME_CODE.alias("_code"), pl.col("name").cast(pl.String).alias("name"))
        .unique("_code")
        .collect()
    )
