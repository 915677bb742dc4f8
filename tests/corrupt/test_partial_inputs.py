"""Recoverable problems: exit 0, partial results, and a quality flag saying what is wrong.

Built from the real 2-rank HTA set (``trace_filter``: A100, NCCL SendRecv, 10
collectives per rank) and the CPU-only gloo rank, in ``tmp_path``.
"""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import polars as pl
import pytest

from corrupt._build import CPU_ONLY, TF0, TF1, cli_inproc as run, dump, gpu_kernels, load, need, with_rank
from tracekit.api import analyze
from tracekit.ingest.convert import convert
from tracekit.schema import read_trace


@pytest.fixture(scope="module")
def tf0() -> dict:
    need(TF0)
    return load(TF0)


@pytest.fixture(scope="module")
def tf1() -> dict:
    need(TF1)
    return load(TF1)


def _ok(p) -> None:
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr and p.stderr.strip() == "", p.stderr


def _codes(res: dict) -> dict[str, dict]:
    return {q["code"]: q for q in res["quality"]}


def _analyze_json(path: Path) -> dict:
    p = run("analyze", path, "--json")
    _ok(p)
    return json.loads(p.stdout)


def test_no_gpu_events_warns_and_reports_partial(tmp_path: Path) -> None:
    need(CPU_ONLY)
    out = tmp_path / "t.parquet"
    p = run("convert", CPU_ONLY, "-o", out)
    _ok(p)
    assert "no_gpu_events" in p.stdout
    res = _analyze_json(out)
    assert "no_gpu_events" in _codes(res)
    # partial results: nothing or the CPU-mode stand-ins (docs/cpu_mode.md), never a broken split
    assert [r["rank"] for r in res["ranks"]] in ([], [34])
    for r in res["ranks"]:
        assert sum(r["time_ns"].values()) == r["window_ns"] and min(r["time_ns"].values()) >= 0
    df, _ = read_trace(out)
    assert df.height > 0 and set(df["rank"].unique()) == {34}  # the CPU rows are kept
    p = run("analyze", out)  # terminal report renders the warning too
    _ok(p)
    assert "no_gpu_events" in p.stdout


def test_missing_rank_3_of_8(tmp_path: Path, tf0: dict, tf1: dict) -> None:
    d = tmp_path / "in"
    for r in range(8):
        if r != 3:
            dump(with_rank(tf0 if r % 2 == 0 else tf1, r, 8), d / f"rank{r}.json.gz")
    res = convert([d], tmp_path / "t.parquet")
    assert res.ranks == [0, 1, 2, 4, 5, 6, 7]
    q = {x["code"]: x for x in res.quality}
    assert "3 of 8" in q["missing_ranks"]["message"]
    a = analyze(tmp_path / "t.parquet")
    assert "3 of 8" in _codes(a)["missing_ranks"]["message"]
    assert [r["rank"] for r in a["ranks"]] == [0, 1, 2, 4, 5, 6, 7]


def _cut_after_collective(doc: dict, n: int) -> dict:
    """The rank 'died' right after its n-th collective: drop every later event."""
    ks = sorted((e for e in gpu_kernels(doc) if "nccl" in e["name"].lower()), key=lambda e: e["ts"])
    cut = ks[n - 1]["ts"] + ks[n - 1]["dur"]
    d = copy.copy(doc)
    d["traceEvents"] = [e for e in doc["traceEvents"] if e.get("ph") == "M" or e.get("ts", 0) <= cut]
    return d


def test_rank_died_mid_run(tmp_path: Path, tf0: dict, tf1: dict) -> None:
    d = tmp_path / "in"
    dump(tf0, d / "rank0.json.gz")
    dump(_cut_after_collective(tf1, 5), d / "rank1.json.gz")
    out = tmp_path / "t.parquet"
    _ok(run("convert", d, "-o", out, "-q"))
    res = _analyze_json(out)
    q = _codes(res)
    assert "collective_count_mismatch" in q, list(q)
    assert "{0: 10, 1: 5}" in q["collective_count_mismatch"]["message"]
    assert "collective_unmatched" in q
    assert [r["rank"] for r in res["ranks"]] == [0, 1]


def test_clock_skew_seconds_is_corrected_and_flagged(tmp_path: Path, tf0: dict, tf1: dict) -> None:
    """Rank 1's host clock 3 s ahead: aligned from collective ends, flagged as clock_skew."""
    good, bad = tmp_path / "good", tmp_path / "bad"
    dump(tf0, good / "rank0.json.gz")
    dump(tf1, good / "rank1.json.gz")
    dump(tf0, bad / "rank0.json.gz")
    dump(dict(tf1, baseTimeNanoseconds=3 * 10**9), bad / "rank1.json.gz")
    rg = convert([good], tmp_path / "g.parquet")
    rb = convert([bad], tmp_path / "b.parquet")
    qb = {x["code"]: x for x in rb.quality}
    assert "clock_skew" in qb and "clock_skew" not in {x["code"] for x in rg.quality}
    assert "rank 1 ahead by 3.0" in qb["clock_skew"]["message"], qb["clock_skew"]["message"]
    # after correction, rank 1 sits where it sits without skew (to within 1 ms)
    g1 = read_trace(tmp_path / "g.parquet", ranks=[1])[0]["ts_ns"].min()
    b1 = read_trace(tmp_path / "b.parquet", ranks=[1])[0]["ts_ns"].min()
    assert abs(b1 - g1) < 1_000_000
    assert "clock_skew" in _codes(analyze(tmp_path / "b.parquet"))


def test_clock_skew_without_collectives_is_suspected(tmp_path: Path) -> None:
    need(CPU_ONLY)
    doc = dict(load(CPU_ONLY))
    # keep only what cannot serve as a clock reference: no collectives (gloo/nccl annotations, record_param_comms)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not any(
        k in str(e.get("name", "")).lower() for k in ("gloo", "nccl", "all_reduce", "allreduce", "record_param_comms", "barrier"))]
    assert any(e.get("ph") == "X" for e in doc["traceEvents"])
    d = tmp_path / "in"
    dump(with_rank(doc, 0, 2), d / "rank0.json.gz")
    dump(dict(with_rank(doc, 1, 2), baseTimeNanoseconds=doc["baseTimeNanoseconds"] + 5 * 10**9), d / "rank1.json.gz")
    res = convert([d], tmp_path / "t.parquet")
    q = {x["code"]: x for x in res.quality}
    assert "clock_skew_suspected" in q and "5.00 s" in q["clock_skew_suspected"]["message"]


def test_one_rank_empty(tmp_path: Path, tf0: dict, tf1: dict) -> None:
    d = tmp_path / "in"
    dump(with_rank(tf0, 0, 2), d / "rank0.json.gz")
    dump(dict(with_rank(tf1, 1, 2), traceEvents=[]), d / "rank1.json.gz")
    out = tmp_path / "t.parquet"
    p = run("convert", d, "-o", out)
    _ok(p)
    assert "empty_rank" in p.stdout and "rank1.json.gz" in p.stdout
    res = _analyze_json(out)
    assert "empty_rank" in _codes(res)
    assert [r["rank"] for r in res["ranks"]] == [0]


def test_negative_and_zero_durations(tmp_path: Path, tf0: dict) -> None:
    doc = copy.deepcopy(tf0)
    ks = gpu_kernels(doc)
    ks[0]["dur"], ks[1]["dur"], ks[2]["dur"] = -5.0, 0, -0.001
    dump(doc, tmp_path / "in" / "rank0.json.gz")
    out = tmp_path / "t.parquet"
    p = run("convert", tmp_path / "in", "-o", out)
    _ok(p)
    assert "negative_durations: 2 events" in p.stdout
    df, _ = read_trace(out)
    assert df["dur_ns"].min() == 0
    k = df.filter(pl.col("kind").cast(pl.String) == "kernel")
    assert k.height == len(gpu_kernels(tf0))  # nothing dropped
    assert k.filter(pl.col("dur_ns") == 0).height >= 3
    res = _analyze_json(out)
    assert "negative_durations" in _codes(res)
    r = res["ranks"][0]
    assert sum(r["time_ns"].values()) == r["window_ns"]


def _canon(df: pl.DataFrame) -> pl.DataFrame:
    df = df.with_columns([pl.col(c).cast(pl.String) for c, t in df.schema.items() if t == pl.Categorical])
    return df.sort(df.columns, nulls_last=True)


def test_events_out_of_order_give_the_same_trace(tmp_path: Path, tf0: dict) -> None:
    shuffled = copy.copy(tf0)
    shuffled["traceEvents"] = list(tf0["traceEvents"])
    random.Random(7).shuffle(shuffled["traceEvents"])
    dump(tf0, tmp_path / "a" / "rank0.json.gz")
    dump(shuffled, tmp_path / "b" / "rank0.json.gz")
    convert([tmp_path / "a"], tmp_path / "a.parquet")
    convert([tmp_path / "b"], tmp_path / "b.parquet")
    a, _ = read_trace(tmp_path / "a.parquet")
    b, _ = read_trace(tmp_path / "b.parquet")
    assert a.height == b.height > 0
    assert _canon(a).equals(_canon(b))
    assert b["ts_ns"].is_sorted()
    ra, rb = analyze(tmp_path / "a.parquet"), analyze(tmp_path / "b.parquet")
    for k in ("ranks", "overall", "window", "top_kernels"):
        assert ra[k] == rb[k], k


def test_unknown_event_kinds_are_noted(tmp_path: Path, tf0: dict) -> None:
    doc = copy.copy(tf0)
    t0 = min(e["ts"] for e in tf0["traceEvents"] if e.get("ph") == "X")
    extra = [{"ph": "X", "cat": "gpu_hyperspace", "name": "warp", "pid": 0, "tid": 7, "ts": t0 + i, "dur": 3} for i in range(3)]
    doc["traceEvents"] = list(tf0["traceEvents"]) + extra
    dump(doc, tmp_path / "u" / "rank0.json.gz")
    dump(tf0, tmp_path / "o" / "rank0.json.gz")
    out = tmp_path / "u.parquet"
    p = run("convert", tmp_path / "u", "-o", out)
    _ok(p)
    assert "unknown_event_kinds" in p.stdout and "gpu_hyperspace (3)" in p.stdout
    ro = convert([tmp_path / "o"], tmp_path / "o.parquet")
    assert read_trace(out)[0].height == ro.rows  # skipped, not turned into rows
    assert "unknown_event_kinds" in _codes(analyze(out))
