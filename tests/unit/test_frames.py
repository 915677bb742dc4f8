"""_frames: lookups that extend a frame without copying it, and keep a chunked frame's columns aligned."""

from __future__ import annotations

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from tracekit._frames import aligned, attach, attach_rows, row_index


def _chunked() -> pl.DataFrame:
    parts = [pl.DataFrame({"ts_ns": list(range(o, o + n)), "k": [i % 3 for i in range(o, o + n)]}) for o, n in ((0, 4), (4, 3), (7, 5))]
    return pl.concat(parts, rechunk=False)


def test_row_index_and_aligned_cut_at_the_frames_chunks() -> None:
    df = _chunked()
    assert df.get_column("ts_ns").chunk_lengths() == [4, 3, 5]
    out = row_index(df, "_row")
    assert out.get_column("_row").to_list() == list(range(12))
    assert out.get_column("_row").chunk_lengths() == [4, 3, 5]
    s = aligned(df, [pl.Series("x", range(12))])[0]
    assert s.chunk_lengths() == [4, 3, 5] and s.to_list() == list(range(12))
    # an expression over aligned columns keeps the chunks (a misaligned one would rechunk the frame)
    assert out.with_columns(pl.col("_row") + pl.col("ts_ns")).get_column("ts_ns").n_chunks() == 3


@pytest.mark.parametrize("rows", [[], [0], [11, 3, 5], list(range(12))])
def test_attach_rows_is_a_left_join_on_the_row_number(rows: list[int]) -> None:
    df = row_index(_chunked(), "_row")
    small = pl.DataFrame({"_row": rows, "v": [r * 10 for r in rows], "s": [f"n{r}" for r in rows]},
                         schema={"_row": pl.UInt32, "v": pl.Int64, "s": pl.Categorical})
    got = attach_rows(df, small, "_row")
    want = df.join(small, on="_row", how="left", maintain_order="left")
    assert_frame_equal(got, want)
    assert got.get_column("v").chunk_lengths() == [4, 3, 5]
    assert_frame_equal(attach(df, small, "_row"), want)
