"""The program clock's unprofiled step timings, matched to the profiled steps, and their noise floor.

One definition for analyze (``steps.unprofiled``), replay (the calibration target, ``baseline.measured_step_ns_p50``)
and next win: the unprofiled step time of a trace is :func:`matched_timing` of its primary shape.

Unprofiled timings are ``kind="step"`` rows with ``profiled=False`` (written by
capture, ``src="tracekit.step"``), one per rank and step. The job's step time is
the max over ranks of the same step (ranks of a TP group finish a step
together; the slowest rank is what a client sees).

Like is compared with like (:func:`matched_timing`): a serving run's batch
grows and its step time with it, so each replayed (profiled) step is compared
with the unprofiled steps of the same mode and token count that ran closest in
time to the profiled steps of that shape (``k`` of them). The measured p50 is
the median over the replayed steps of their matched medians; the noise floor is
the same statistic computed from the earlier and the later half (in time) of
each matched set: |p50(early) − p50(late)| / p50.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from tracekit.analysis.steptime import p50

__all__ = ["UnprofiledTiming", "unprofiled_timing", "matched_timing", "matched_period", "consecutive_periods",
           "job_step_series", "MATCH_K", "MATCH_RADIUS"]

#: unprofiled steps matched per (mode, tokens) shape, and how far (in forwards) from a profiled step they may be
MATCH_K = 10
MATCH_RADIUS = 50


@dataclass(frozen=True)
class UnprofiledTiming:
    """Job-level unprofiled step times (ns) and their run-to-run spread."""

    step_ns: np.ndarray
    p50: float
    mean: float
    noise: float | None  # |median(first half) − median(second half)| / median; None with < 4 steps
    halves_ns: tuple[float, float] | None
    tokens_p50: float | None
    matched: list[dict[str, Any]] | None = None  # per shape: mode, tokens, n_ref, n_matched, p50_ns (matched_timing only)


def _f(v: Any) -> float:
    return float(v)


def job_step_series(steps: pl.DataFrame, key: str = "step_ord", dur: str = "dur_ns") -> np.ndarray:
    """Per step index: max over ranks of the duration, in step order."""
    if steps.height == 0:
        return np.zeros(0)
    s = steps.group_by(key).agg(pl.col(dur).max()).sort(key)
    return s.get_column(dur).to_numpy().astype(float)


def unprofiled_timing(df: pl.DataFrame, meta: dict[str, Any] | None = None, mode: str | None = None) -> UnprofiledTiming | None:
    """The unprofiled step timings recorded at capture (only ``step_mode == mode`` when given), or None."""
    st = _unprofiled_rows(df, mode)
    if st.height == 0:
        return None
    st = st.sort(["rank", "ts_ns"]).with_columns(pl.int_range(pl.len()).over("rank").alias("_i"))
    x = job_step_series(st, key="_i")
    if x.size == 0:
        return None
    tok = st.get_column("tokens").drop_nulls()
    noise = halves = None
    if x.size >= 4:
        h = x.size // 2
        a, b = p50(x[:h]), p50(x[h:])
        halves = (a, b)
        noise = abs(a - b) / p50(x)
    return UnprofiledTiming(x, p50(x), float(x.mean()), noise, halves,
                            _f(tok.median()) if tok.len() else None)


def _unprofiled_rows(df: pl.DataFrame, mode: str | None = None) -> pl.DataFrame:
    """The unprofiled step records (``kind="step"``, ``profiled=False``; tracekit's own, ``src="tracekit.step"``, where
    there are any), of ``mode`` when given."""
    st = df.filter((pl.col("kind").cast(pl.String) == "step") & (pl.col("profiled") == False))  # noqa: E712
    if mode is not None:
        st = st.filter(pl.col("step_mode").cast(pl.String) == mode)
    if "src" in st.columns:
        own = st.filter(pl.col("src").cast(pl.String) == "tracekit.step")
        if own.height:
            st = own
    return st


def _job_unprofiled(df: pl.DataFrame) -> pl.DataFrame:
    """Unprofiled step rows → one row per job step: ts (min over ranks), dur (max over ranks), mode, tokens, and
    ``fwd``: the step id (null where the records carry none: then the n-th of every rank is one job step)."""
    st = _unprofiled_rows(df)
    if st.height == 0:
        return pl.DataFrame(schema={"ts": pl.Int64, "dur": pl.Int64, "mode": pl.String, "tokens": pl.Int64, "fwd": pl.Int64})
    st = st.sort(["rank", "ts_ns"]).with_columns(pl.int_range(pl.len()).over("rank").alias("_i"))
    ids = st.get_column("step_id").null_count() == 0
    key = "step_id" if ids else "_i"
    return (st.group_by(key).agg(pl.col("ts_ns").min().alias("ts"), pl.col("dur_ns").max().alias("dur"),
                                 pl.col("step_mode").cast(pl.String).first().alias("mode"),
                                 pl.col("tokens").cast(pl.Int64).first().alias("tokens"))
            .select("ts", "dur", "mode", "tokens", (pl.col(key).cast(pl.Int64) if ids else pl.lit(None, pl.Int64)).alias("fwd"))
            .sort("ts"))


def _nearest(x: np.ndarray, anchors: np.ndarray) -> np.ndarray:
    """Distance of each ``x`` to its nearest anchor (``anchors`` non-empty), without an x × anchors matrix."""
    a = np.sort(anchors)
    i = np.clip(np.searchsorted(a, x), 1, a.size - 1) if a.size > 1 else np.zeros(x.size, np.int64)
    d: np.ndarray = np.abs(x - a[i])
    if a.size > 1:
        d = np.minimum(d, np.abs(x - a[i - 1]))
    return d


def consecutive_periods(jobs: pl.DataFrame, ts: str, fwd: str, ok: pl.Expr) -> pl.DataFrame:
    """``ts`` and ``period`` (to the next row's ``ts``) of the rows of ``jobs`` (one per job step, in step order) whose
    next row is the next forward (``fwd`` + 1) and where ``ok`` holds for both: the program's step period."""
    j = jobs.with_columns(ok.alias("_ok"))
    j = j.with_columns((pl.col(ts).shift(-1) - pl.col(ts)).alias("period"), (pl.col(fwd).shift(-1) - pl.col(fwd)).alias("_d"),
                       pl.col("_ok").shift(-1).alias("_ok1"))
    keep = pl.col("_ok") & pl.col("_ok1").fill_null(False) & (pl.col("_d") == 1) & (pl.col("period") > 0)
    return j.filter(keep).select(pl.col(ts).alias("ts"), "period")


def _job_profiled(df: pl.DataFrame) -> pl.DataFrame:
    st = df.filter((pl.col("kind").cast(pl.String) == "step") & (pl.col("profiled").fill_null(True)))
    if st.height == 0:
        return pl.DataFrame(schema={"ts": pl.Int64, "mode": pl.String, "tokens": pl.Int64})
    st = st.sort(["rank", "ts_ns"]).with_columns(pl.int_range(pl.len()).over("rank").alias("_i"))
    return (st.group_by("_i").agg(pl.col("ts_ns").min().alias("ts"), pl.col("step_mode").cast(pl.String).first()
                                  .alias("mode"), pl.col("tokens").cast(pl.Int64).first())
            .select("ts", "mode", "tokens").sort("ts"))


def matched_timing(df: pl.DataFrame, ref: pl.DataFrame, *, k: int = MATCH_K,
                   radius: int = MATCH_RADIUS) -> UnprofiledTiming | None:
    """Unprofiled timing of ``df`` matched to the reference steps ``ref`` (columns ``mode``, ``tokens``; one row
    per replayed job step), or None when ``df`` has no unprofiled step of those modes.

    Per distinct (mode, tokens) of ``ref``: the ``k`` unprofiled job steps of ``df`` with that mode and token
    count closest in time to ``df``'s own profiled steps of that shape (to all its profiled steps when it has
    none of that shape), counting distance in forwards and keeping only those within ``radius`` forwards when
    there are any (a run's step time can drift at a constant shape); with no unprofiled step of that token
    count, those of the nearest token count. The headline (``p50``, ``mean``, ``noise``) is the primary
    shape's (most reference steps; ties: more tokens); ``matched`` lists every shape.
    """
    un = _job_unprofiled(df)
    if un.height == 0 or ref.height == 0:
        return None
    prof = _job_profiled(df)
    shapes = ref.group_by(["mode", "tokens"]).len().sort(["mode", "tokens"], nulls_last=True)
    per: dict[tuple[Any, Any], tuple[float, float, float, float, int]] = {}
    picked: dict[tuple[Any, Any], np.ndarray] = {}
    info: list[dict[str, Any]] = []
    all_ts = prof.get_column("ts").to_numpy()
    # position of every job step (profiled or not) in forward order: distances are counted in forwards
    order_ts = np.sort(np.concatenate([un.get_column("ts").to_numpy(), all_ts]))
    for mode, tokens, n_ref in shapes.iter_rows():
        cand = un.filter(pl.col("mode").eq_missing(mode))
        if cand.height == 0:
            continue
        used_tokens = tokens
        if tokens is not None:
            same = cand.filter(pl.col("tokens") == tokens)
            if same.height == 0:
                near = cand.with_columns((pl.col("tokens") - tokens).abs().alias("_d")).sort("_d")
                used_tokens = near.item(0, "tokens")
                same = cand.filter(pl.col("tokens") == used_tokens)
            cand = same
        anchors = prof.filter(pl.col("mode").eq_missing(mode) & pl.col("tokens").eq_missing(tokens)).get_column("ts").to_numpy()
        if anchors.size == 0:
            anchors = all_ts
        ts = cand.get_column("ts").to_numpy()
        dur = cand.get_column("dur").to_numpy().astype(float)
        if anchors.size:
            pos = np.searchsorted(order_ts, ts)
            apos = np.searchsorted(order_ts, anchors)
            dist = _nearest(pos, apos)
            idx = np.argsort(dist, kind="stable")[:k]
            if (dist[idx] <= radius).any():
                idx = idx[dist[idx] <= radius]
            pick = np.sort(idx)  # back in time order
        else:
            pick = np.arange(min(k, ts.size))
        x = dur[pick]
        h = x.size // 2
        a = p50(x[:h]) if h else p50(x)
        bb = p50(x[h:])
        per[(mode, tokens)] = (p50(x), float(x.mean()), a, bb, int(x.size))
        picked[(mode, tokens)] = x
        info.append({"mode": mode, "tokens": tokens, "matched_tokens": used_tokens, "n_ref": int(n_ref),
                     "n_matched": int(x.size), "p50_ns": p50(x)})
    if not per:
        return None
    # headline: the primary shape (most reference steps; ties: more tokens), as the replay's step_series
    cnt = shapes.filter(pl.struct("mode", "tokens").map_elements(lambda r: (r["mode"], r["tokens"]) in per,
                                                                  return_dtype=pl.Boolean))
    if cnt.height == 0:
        return None
    cnt = cnt.sort(["len", "tokens"], descending=True, nulls_last=True)
    key = (cnt.item(0, "mode"), cnt.item(0, "tokens"))
    med, mean, ha, hb, n = per[key]
    for d in info:
        pp = per[(d["mode"], d["tokens"])]
        d["noise"] = abs(pp[2] - pp[3]) / pp[0] if pp[0] and pp[4] >= 4 else None
        d["primary"] = (d["mode"], d["tokens"]) == key
    noise = abs(ha - hb) / med if (med and n >= 4) else None
    return UnprofiledTiming(picked[key], med, mean, noise, (ha, hb) if noise is not None else None,
                            float(key[1]) if key[1] is not None else None, info)


def matched_period(df: pl.DataFrame, mode: str | None, tokens: float | None, *, k: int = MATCH_K) -> float | None:
    """p50 of the program clock's step *period* at one shape: start of an unprofiled job step to the start of the next
    forward, over pairs of consecutive forwards (``step_id`` + 1) that both have that mode and token count; the
    ``2k`` pairs closest in time to the trace's profiled steps. None with fewer than 4 such pairs or without step ids.

    Where a step's labelled range closes before its GPU work ends (the program syncs after the range, or not at all)
    the range measures only the host's launching; the period, to the next step's start, also holds the GPU work the
    loop waited for. It is what :func:`tracekit.replay.api.replay` fits the GPU-side gaps to when a step is GPU-bound.
    """
    job = _job_unprofiled(df)
    if job.height < 5 or job.get_column("fwd").null_count():
        return None
    same = pl.col("mode").eq_missing(mode) & pl.col("tokens").eq_missing(None if tokens is None else int(tokens))
    pairs = consecutive_periods(job.sort("fwd"), "ts", "fwd", same)
    if pairs.height < 4:
        return None
    anchors = _job_profiled(df).get_column("ts").to_numpy()
    per = pairs.get_column("period").to_numpy().astype(float)
    if anchors.size:
        dist = _nearest(pairs.get_column("ts").to_numpy(), anchors)
        per = per[np.argsort(dist, kind="stable")[:2 * k]]
    return p50(per)
