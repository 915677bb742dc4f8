"""Property tests: interval algebra, exclusive breakdown and collective waits against brute force.

Intervals live on small integer grids so the brute-force answer is a set of
integer points (half-open ``[start, end)``): the union covers ``t`` iff some
``start <= t < end``.
"""

from __future__ import annotations

import os
from typing import Iterable

import polars as pl
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tracekit.analysis.passes.breakdown import PRIORITY, SPLIT_PRIORITY, compute_breakdown
from tracekit.core.intervals import clip, covered_by, gaps, merge, overlap_length, union_length
from tracekit.core.window import Window
from tracekit.schema import CATEGORIES, frame_from_rows

SCALE = int(os.environ.get("TRACEKIT_FUZZ_SCALE", "1"))
FAST = settings(max_examples=80 * SCALE, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=40 * SCALE, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])

iv_st = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 200), st.integers(0, 60)), max_size=25)


def _frame(ivs: Iterable[tuple[int, int, int]]) -> pl.DataFrame:
    rows = [(g, s, s + n) for g, s, n in ivs]
    return pl.DataFrame(rows, schema={"g": pl.Int64, "start": pl.Int64, "end": pl.Int64}, orient="row")


def _points(df: pl.DataFrame, g: int | None = None) -> set[int]:
    if g is not None:
        df = df.filter(pl.col("g") == g)
    out: set[int] = set()
    for s, e in zip(df["start"].to_list(), df["end"].to_list()):
        out.update(range(s, e))
    return out


# ---- interval algebra --------------------------------------------------------------------------------


@FAST
@given(ivs=iv_st)
def test_merge_is_disjoint_sorted_exact_and_idempotent(ivs) -> None:
    df = _frame(ivs)
    m = merge(df, by="g")
    for g in range(3):
        sub = m.filter(pl.col("g") == g)
        s, e = sub["start"].to_list(), sub["end"].to_list()
        assert all(a < b for a, b in zip(s, e))  # no empty pieces
        assert all(e[i] < s[i + 1] for i in range(len(s) - 1))  # sorted, disjoint, not touching
        assert _points(sub) == _points(df, g)
    assert merge(m, by="g").equals(m)
    m0 = merge(df)  # no groups
    assert merge(m0).equals(m0) and _points(m0) == _points(df)


@FAST
@given(ivs=iv_st)
def test_union_length_matches_brute_force(ivs) -> None:
    df = _frame(ivs)
    u = union_length(df, by="g")
    got = dict(zip(u["g"].to_list(), u["length"].to_list()))
    for g in range(3):
        assert got.get(g, 0) == len(_points(df, g))
    assert union_length(df)["length"][0] == len(_points(df))


@FAST
@given(ivs=iv_st, lo=st.integers(-20, 150), span=st.integers(1, 200))
def test_gaps_and_union_partition_the_window(ivs, lo: int, span: int) -> None:
    hi = lo + span
    df = _frame(ivs)
    window = set(range(lo, hi))
    g0 = gaps(df, lo, hi)
    gap_pts = _points(g0)
    covered = _points(df) & window
    assert gap_pts == window - covered  # gaps ∪ union = window, gaps ∩ union = ∅
    assert int((g0["end"] - g0["start"]).sum() or 0) + len(covered) == hi - lo
    # per group with explicit bounds: a group without intervals is one whole gap
    bounds = pl.DataFrame({"g": [0, 1, 2], "lo": [lo] * 3, "hi": [hi] * 3})
    gg = gaps(df, by="g", bounds=bounds)
    for g in range(3):
        assert _points(gg, g) == window - _points(df, g)
    c = clip(df, lo, hi)
    assert _points(c) == covered and (c.height == 0 or (c["end"] > c["start"]).all())


@FAST
@given(a=iv_st, b=iv_st)
def test_overlap_length_matches_brute_force(a, b) -> None:
    fa, fb = _frame(a), _frame(b)
    got = overlap_length(fa, fb, by="g")
    d = dict(zip(got["g"].to_list(), got["length"].to_list()))
    for g in range(3):
        want = len(_points(fa, g) & _points(fb, g))
        assert d.get(g, 0) == want
    assert overlap_length(fa, fb)["length"][0] == len(_points(fa) & _points(fb))


@st.composite
def nested(draw):
    """Properly nested intervals (one thread's CPU ranges) from a random open/close sequence."""
    t, stack, out, ident = 0, [], [], 0
    for op in draw(st.lists(st.sampled_from(["open", "close", "close", "skip"]), max_size=40)):
        t += draw(st.integers(1, 5))
        if op == "open":
            stack.append((ident, t))
            ident += 1
        elif op == "close" and stack:
            i, s = stack.pop()
            out.append((i, s, t))
    while stack:
        t += draw(st.integers(1, 5))
        i, s = stack.pop()
        out.append((i, s, t))
    return out, t


@FAST
@given(data=nested(), pts=st.lists(st.integers(0, 250), max_size=30))
def test_covered_by_finds_the_innermost_enclosing_interval(data, pts) -> None:
    ivs, _ = data
    iv = pl.DataFrame(ivs, schema={"id": pl.Int64, "start": pl.Int64, "end": pl.Int64}, orient="row")
    p = pl.DataFrame({"ts": pts}, schema={"ts": pl.Int64})
    got = covered_by(p, iv, at="ts", payload=["id"])
    assert got["ts"].to_list() == pts  # input order kept
    for t, gid in zip(got["ts"].to_list(), got["id"].to_list()):
        inside = [(s, i) for i, s, e in ivs if s <= t < e]
        assert gid == (max(inside)[1] if inside else None), (t, ivs)


# ---- exclusive breakdown -----------------------------------------------------------------------------

ops_st = st.lists(
    st.tuples(st.integers(0, 1), st.integers(0, 400), st.integers(0, 120), st.sampled_from([*CATEGORIES, None])),
    min_size=1,
    max_size=30,
)


def _ops_frame(ops) -> pl.DataFrame:
    return frame_from_rows(
        {"rank": r, "kind": "kernel", "ts_ns": s, "dur_ns": d, "name": f"k{c}", "category": c, "stream": i % 3}
        for i, (r, s, d, c) in enumerate(ops)
    )


def _brute_breakdown(ops, rank: int, lo: int, hi: int) -> dict[str, int]:
    prio = {b: i for i, b in enumerate(PRIORITY)}
    out = {b: 0 for b in PRIORITY} | {"idle": 0}
    mine = [(s, s + d, c or "other_compute") for r, s, d, c in ops if r == rank]
    for t in range(lo, hi):
        running = [prio[c] for s, e, c in mine if s <= t < e]
        out[PRIORITY[min(running)] if running else "idle"] += 1
    return out


@SLOW
@given(ops=ops_st, win=st.one_of(st.none(), st.tuples(st.integers(-50, 300), st.integers(1, 300))))
def test_breakdown_buckets_sum_to_window_and_match_brute_force(ops, win) -> None:
    df = _ops_frame(ops)
    window = Window(win[0], win[0] + win[1]) if win else None
    bd = compute_breakdown(df, window)
    for rec in bd.as_records():
        r = rec["rank"]
        t = rec["time_ns"]
        assert all(v >= 0 for v in t.values()), t
        assert sum(t.values()) == rec["window_ns"]  # categories + idle = window, exactly
        assert rec["gpu_busy_ns"] == rec["window_ns"] - t["idle"]
        lo = rec["window_start_ns"]
        hi = lo + rec["window_ns"]
        if window is None:
            mine = [(s, s + d) for rr, s, d, _c in ops if rr == r]
            assert (lo, hi) == (min(s for s, _ in mine), max(e for _, e in mine))
        else:
            assert (lo, hi) == (window.start_ns, window.end_ns)
        assert t == _brute_breakdown(ops, r, lo, hi)
    assert sorted(x["rank"] for x in bd.as_records()) == sorted({r for r, *_ in ops})


# ---- collective waits --------------------------------------------------------------------------------

AR = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


@st.composite
def collectives(draw):
    """Ranks x instances of one allreduce group; arrivals random, ends nearly common; some dropped."""
    n_ranks = draw(st.integers(2, 4))
    n_inst = draw(st.integers(1, 8))
    physical = draw(st.booleans())
    rows = []
    t = 0
    for _k in range(n_inst):
        t += draw(st.integers(50, 400))
        end = t + draw(st.integers(5, 100))
        for r in range(n_ranks):
            if draw(st.integers(0, 9)) == 0:
                continue  # this rank lost the instance (died, dropped events)
            arrive = draw(st.integers(t - 40, end - 1))
            if physical:
                stop = end + draw(st.integers(0, 3))
            else:
                stop = arrive + draw(st.integers(0, 150))  # anything goes: waits must still be sane
            rows.append({"rank": r, "kind": "kernel", "ts_ns": arrive, "dur_ns": max(0, stop - arrive), "name": AR,
                         "category": "communication", "family": "allreduce.nccl", "stream": 7, "pg_name": "0",
                         "coll_name": "allreduce", "coll_in_nelems": 1024, "coll_dtype": "BFloat16"})
    return rows


@SLOW
@given(rows=collectives())
def test_waits_are_never_negative_and_fit_in_the_kernel(rows) -> None:
    from tracekit.core.collectives import collective_quality, match_collectives, split_communication

    assume(rows)
    df = frame_from_rows(rows)
    inst = match_collectives(df)
    assert inst.height == len(rows)
    assert (inst["wait_ns"] >= 0).all()
    assert (inst["wait_ns"] + inst["transfer_ns"] <= inst["dur_ns"]).all()
    assert set(inst["quality"].unique().to_list()) <= {"ok", "incomplete", "mismatched"}
    collective_quality(inst)  # never raises
    parts = split_communication(df, inst)
    per = parts.group_by(["rank", "part"]).agg((pl.col("end") - pl.col("start")).sum())
    assert (parts["end"] > parts["start"]).all()
    assert int(per["end"].sum() or 0) == int(df["dur_ns"].sum())  # wait + transfer = kernel, per kernel summed
    bd = compute_breakdown(df, None, comm_parts=parts)
    assert bd.buckets == (SPLIT_PRIORITY if parts.height else PRIORITY)
    for rec in bd.as_records():
        assert sum(rec["time_ns"].values()) == rec["window_ns"] and min(rec["time_ns"].values()) >= 0
