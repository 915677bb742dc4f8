"""Interval algebra: known answers on small hand-built sets, plus a brute-force property check."""

from __future__ import annotations

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from tracekit.core.intervals import clip, covered_by, gaps, merge, overlap_length, union_length


def _iv(pairs, **extra) -> pl.DataFrame:
    d = {"start": [a for a, _ in pairs], "end": [b for _, b in pairs]}
    d.update(extra)
    return pl.DataFrame(d, schema_overrides={"start": pl.Int64, "end": pl.Int64})


def test_merge_overlapping_and_touching() -> None:
    m = merge(_iv([(5, 8), (0, 3), (2, 4), (8, 9), (12, 12), (20, 30), (21, 25)]))
    assert m.rows() == [(0, 4), (5, 9), (20, 30)]  # touching merged, empty dropped, nested absorbed


def test_union_length_by_group() -> None:
    df = _iv([(0, 10), (5, 15), (100, 101), (0, 4)], rank=[0, 0, 0, 1])
    got = dict(union_length(df, by="rank").rows())
    assert got == {0: 16, 1: 4}
    assert union_length(_iv([])).item() == 0


def test_clip() -> None:
    assert clip(_iv([(0, 10), (15, 20), (25, 30)]), 5, 26).rows() == [(5, 10), (15, 20), (25, 26)]
    assert clip(_iv([(0, 4)]), 5, 26).height == 0


def test_gaps_inside_window() -> None:
    g = gaps(_iv([(10, 20), (15, 30), (40, 50)]), 0, 60)
    assert g.rows() == [(0, 10), (30, 40), (50, 60)]
    bounds = pl.DataFrame({"rank": [0, 1], "lo": [0, 0], "hi": [10, 10]})
    g2 = gaps(_iv([(2, 3)], rank=[0]), by="rank", bounds=bounds)
    assert g2.rows() == [(0, 0, 2), (0, 3, 10), (1, 0, 10)]  # rank 1 has no interval: one whole gap


def test_overlap_length() -> None:
    a = _iv([(0, 10), (20, 30)])
    b = _iv([(5, 25)])
    assert overlap_length(a, b).item() == 10


def test_covered_by_flat_and_nested() -> None:
    iv = _iv([(0, 100), (10, 20), (30, 40), (32, 35)], name=["outer", "inner1", "inner2", "inner2a"])
    pts = pl.DataFrame({"ts": [5, 15, 20, 25, 33, 36, 50, 99, 100, -1]})
    got = covered_by(pts, iv, payload=["name"])["name"].to_list()
    # innermost containing interval; after a nested range ends, its parent still contains the point
    assert got == ["outer", "inner1", "outer", "outer", "inner2a", "inner2", "outer", "outer", None, None]


def test_covered_by_per_group() -> None:
    iv = _iv([(0, 100), (10, 20)], tid=[1, 2], name=["a", "b"])
    pts = pl.DataFrame({"tid": [1, 2, 2, 3], "ts": [50, 15, 50, 50]})
    assert covered_by(pts, iv, by="tid", payload=["name"])["name"].to_list() == ["a", "b", None, None]


def _brute_innermost(iv: list[tuple[int, int]], t: int) -> int | None:
    best = None
    for i, (s, e) in enumerate(iv):
        if s <= t < e and (best is None or s > iv[best][0] or (s == iv[best][0] and e < iv[best][1])):
            best = i
    return best


@st.composite
def _laminar(draw) -> list[tuple[int, int]]:
    """A properly nested (laminar) family, like CPU annotation ranges on one thread."""
    out: list[tuple[int, int]] = []

    def build(lo: int, hi: int, depth: int) -> None:
        t = lo
        while t < hi and len(out) < 40:
            s = draw(st.integers(t, hi))
            e = draw(st.integers(s, hi))
            if e > s:
                out.append((s, e))
                if depth < 3:
                    build(s, e, depth + 1)
            t = e + 1
            if draw(st.booleans()):
                break

    build(0, 200, 0)
    return out


@settings(max_examples=60, deadline=None)
@given(_laminar(), st.lists(st.integers(-5, 205), min_size=1, max_size=30))
def test_covered_by_matches_brute_force_on_nested_ranges(iv, pts) -> None:
    df = _iv(iv, idx=list(range(len(iv)))) if iv else _iv([], idx=[])
    got = covered_by(pl.DataFrame({"ts": pts}, schema={"ts": pl.Int64}), df, payload=["idx"])["idx"].to_list()
    want = [_brute_innermost(iv, t) for t in pts]
    # equal-start ties: either interval of the tie is innermost-by-start; compare the intervals, not ids
    assert [iv[g] if g is not None else None for g in got] == [iv[w] if w is not None else None for w in want]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 100), st.integers(0, 30)), max_size=30), st.integers(0, 130), st.integers(0, 130))
def test_union_and_gaps_partition_window(pairs, a, b) -> None:
    lo, hi = min(a, b), max(a, b) + 1
    df = _iv([(s, s + d) for s, d in pairs])
    covered = {t for s, d in pairs for t in range(s, s + d)}
    assert union_length(df).item() == len(covered)
    g = gaps(df, lo, hi)
    gap_len = int((g["end"] - g["start"]).sum()) if g.height else 0
    inside = len({t for t in covered if lo <= t < hi})
    assert gap_len + inside == hi - lo


# ---- overlap primitive (sort + search) against the cross product filtered on time --------------------------

from tracekit.core.intervals import intersect, overlap_index, overlap_join  # noqa: E402

_ivg = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 120), st.integers(0, 40)), max_size=30)


def _gframe(rows: list[tuple[int, int, int]]) -> pl.DataFrame:
    return pl.DataFrame([(g, s, s + d) for g, s, d in rows], schema={"g": pl.Int64, "start": pl.Int64, "end": pl.Int64},
                        orient="row")


def _brute_pairs(a: pl.DataFrame, b: pl.DataFrame, keyed: bool) -> list[tuple[int, int]]:
    out = []
    for i, (ga, sa, ea) in enumerate(a.rows()):
        for j, (gb, sb, eb) in enumerate(b.rows()):
            if (not keyed or ga == gb) and sb < ea and eb > sa:
                out.append((i, j))
    return out


@settings(max_examples=150, deadline=None)
@given(_ivg, _ivg, st.booleans())
def test_overlap_index_matches_brute_force(a_rows, b_rows, keyed) -> None:
    a, b = _gframe(a_rows), _gframe(b_rows)
    got = overlap_index(a, b, by="g" if keyed else None).rows()
    assert got == _brute_pairs(a, b, keyed)  # zero-length, duplicate, nested and touching intervals included


@settings(max_examples=80, deadline=None)
@given(_ivg, _ivg)
def test_intersect_matches_brute_force_points(a_rows, spans_rows) -> None:
    a = _gframe(a_rows).with_row_index("id")
    sp = _gframe(spans_rows).rename({"start": "lo", "end": "hi"}).with_row_index("sid")
    got = sorted(intersect(a, sp, by="g").select("id", "sid", "start", "end").rows())
    want = []
    for i, g, s, e in a.rows():
        for k, g2, lo, hi in sp.rows():
            if g == g2 and max(s, lo) < min(e, hi):
                want.append((i, k, max(s, lo), min(e, hi)))
    assert got == sorted(want)


def test_overlap_join_columns_and_other_names() -> None:
    ph = pl.DataFrame({"rank": [0, 1], "start_ns": [10, 0], "dur_ns": [10, 5]}).with_columns(
        (pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns"))
    ops = pl.DataFrame({"rank": [0, 0, 1, 1], "start": [0, 15, 4, 5], "end": [12, 30, 5, 9], "name": list("abcd")})
    j = overlap_join(ph, ops, by="rank", start="start_ns", end="end_ns", right_start="start", right_end="end")
    assert j.select("rank", "start_ns", "name").rows() == [(0, 10, "a"), (0, 10, "b"), (1, 0, "c")]
    assert overlap_index(ph.head(0), ops, by="rank", start="start_ns", end="end_ns",
                         right_start="start", right_end="end").height == 0


def test_overlap_index_is_not_a_cross_product() -> None:
    """200k ops x 500 phases of one rank: sort + search stays near the output size."""
    import time

    n = 200_000
    ops = pl.DataFrame({"rank": [0] * n, "start": pl.int_range(0, n * 10, 10, eager=True),
                        "end": pl.int_range(5, n * 10 + 5, 10, eager=True)})
    ph = pl.DataFrame({"rank": [0] * 500, "start": pl.int_range(0, 500 * 4000, 4000, eager=True),
                       "end": pl.int_range(100, 500 * 4000 + 100, 4000, eager=True)})
    t = time.perf_counter()
    ix = overlap_index(ph, ops, by="rank")
    assert ix.height == 500 * 10  # each phase [k*4000, k*4000+100) meets 10 ops
    assert time.perf_counter() - t < 5.0  # the cross product (1e8 rows) would take far longer and ~2.4 GB


@settings(max_examples=60, deadline=None)
@given(_ivg, st.lists(st.tuples(st.integers(0, 3), st.integers(0, 120), st.integers(1, 40)), min_size=1, max_size=6))
def test_gaps_with_several_windows_per_group(rows, wins) -> None:
    df = _gframe(rows)
    bounds = pl.DataFrame([(g, s, s + d) for g, s, d in wins], schema={"g": pl.Int64, "lo": pl.Int64, "hi": pl.Int64}, orient="row")
    got = gaps(df, by="g", bounds=bounds)
    for g, lo, hi in bounds.rows():
        covered = {t for gg, s, e in df.rows() if gg == g for t in range(s, e)}
        want = {t for t in range(lo, hi) if t not in covered}
        pieces = got.filter(pl.col("g") == g)
        have = {t for _, s, e in pieces.rows() for t in range(max(s, lo), min(e, hi))}
        assert have == want


def test_merge_large_grouped_frame_matches_per_group_merge() -> None:
    """Above 50k rows merge sorts through one composite integer key; it must equal merging each group alone."""
    import numpy as np

    rng = np.random.default_rng(7)
    n = 120_000
    s = rng.integers(0, 10**9, n) + 1_796_000_000_000_000_000
    df = pl.DataFrame({"rank": rng.integers(0, 4, n), "tid": rng.choice([-(2**62), 5, 17, 2**40], n),
                       "start": s, "end": s + rng.integers(0, 40_000, n)})
    got = merge(df, by=["rank", "tid"])
    want = pl.concat([merge(g.drop(["rank", "tid"])).with_columns(pl.lit(r, pl.Int64).alias("rank"), pl.lit(t, pl.Int64).alias("tid"))
                      for (r, t), g in df.group_by(["rank", "tid"])]).select(got.columns).sort(["rank", "tid", "start"])
    assert got.sort(["rank", "tid", "start"]).equals(want)
    assert got.height > 1000


def test_overlap_index_large_keyed_frames_match_per_group() -> None:
    """The composite-key sort path (>50k rows) gives the same pairs as each group on its own."""
    import numpy as np

    rng = np.random.default_rng(3)
    n = 60_000
    s = rng.integers(0, 10**8, n)
    ops = pl.DataFrame({"rank": rng.integers(0, 3, n), "start": s, "end": s + rng.integers(0, 5_000, n)})
    ph = pl.DataFrame({"rank": [0, 1, 2, 1], "start": [0, 5_000_000, 90_000_000, 0], "end": [200_000, 5_300_000, 90_100_000, 10]})
    got = overlap_index(ph, ops, by="rank")
    want = []
    for i, (r, a, b) in enumerate(ph.rows()):
        hit = ops.with_row_index("j").filter((pl.col("rank") == r) & (pl.col("start") < b) & (pl.col("end") > a))
        want += [(i, j) for j in hit["j"].to_list()]
    assert got.rows() == sorted(want) and len(want) > 100


@settings(max_examples=100, deadline=None)
@given(_ivg, st.lists(st.tuples(st.integers(0, 150), st.integers(0, 30)), min_size=1, max_size=6), st.booleans())
def test_in_spans_matches_any_span(rows, sp, closed) -> None:
    from tracekit.core.intervals import in_spans

    rows = rows + [(0, 5, 0), (1, 10, 0)]  # zero-length rows where spans may touch
    sp = sp + [(0, 5), (5, 5), (10, 0)]
    spans = [(a, a + d) for a, d in sp]
    df = _gframe(rows)
    got = df.select(in_spans(spans, pl.col("start"), pl.col("end"), closed=closed).alias("m"))["m"].to_list() if df.height else []
    if closed:
        want = [any(e >= a and s <= b for a, b in spans) for _, s, e in df.rows()]
    else:
        want = [any(e > a and s < b for a, b in spans) for _, s, e in df.rows()]
    assert got == want
