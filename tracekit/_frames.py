"""Column lookups that never copy the frame they extend (one concept: attach by key).

Finalizing a rank joins small tables (launch calls, rule results, step ids)
onto a frame of millions of rows and ~50 columns. A plain left join copies
every column; :func:`attach` joins only the key and appends the looked-up
columns to the shared ones. Name-keyed lookups go through the categorical
``name`` column's codes, so regexes run once per distinct name
(:func:`distinct_names`) and rows find theirs without casting names to text.
"""

from __future__ import annotations

import polars as pl

__all__ = ["attach", "distinct_names", "NAME_CODE"]

#: the ``name`` column's dictionary code (stable within the process)
NAME_CODE = pl.col("name").cast(pl.Categorical).to_physical()


def attach(df: pl.DataFrame, small: pl.DataFrame, on: str, key: pl.Expr | None = None) -> pl.DataFrame:
    """``df.join(small, on=on, how="left")`` for ``small`` unique on ``on``, without copying ``df``.

    ``key``: an expression giving the join key from ``df`` (default: ``df[on]``); rows where it
    is null find nothing. Row order and count are kept; ``on`` itself is not added.
    """
    k = (key if key is not None else pl.col(on)).alias(on)
    cols = df.select(k).join(small, on=on, how="left", maintain_order="left").drop(on)
    return df.hstack(cols.get_columns())


def distinct_names(df: pl.DataFrame, where: pl.Expr) -> pl.DataFrame:
    """Distinct ``name`` of the rows matching ``where``: columns ``_code`` (see :data:`NAME_CODE`), ``name`` (text)."""
    return (
        df.lazy().filter(where)
        .select(NAME_CODE.alias("_code"), pl.col("name").cast(pl.String).alias("name"))
        .unique("_code")
        .collect()
    )
