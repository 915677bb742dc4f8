"""Checks of one rank's decoded events before they are finalized: times, durations, duplicates.

Contract of :func:`check_times`: takes a reader's frame with ``ts_ns`` (absolute),
``ts_rel_ns`` (as written in the file), ``dur_ns`` (null where the file had no
number) and ``kind`` (``instant`` for ``ph: i`` events), returns the frame with
every problem either repaired and counted in a quality flag (added to
``meta["quality"]``) or refused with an :class:`InputError` where the results
would be meaningless. Everything is a handful of vectorized aggregations; the
expensive checks (clustering of timestamps, de-duplication) run only when a
cheap aggregate says there is something to look at, so a clean rank pays one
``select`` and one ``n_unique`` over its GPU ops.

Flags (``code``: when):

- ``bad_timestamps``: events without a numeric ``ts`` (dropped);
- ``bad_durations``: complete events without a numeric ``dur`` (missing, null,
  boolean, text; taken as 0 ns). No complete event with a numeric ``dur`` at
  all: InputError;
- ``negative_durations``: clamped to 0; ``implausible_durations``: longer than
  :data:`MIXED_CAPTURE_NS` (set to 0: one such event would make the window hours long);
- ``negative_timestamps``: events with a negative ``ts`` in the file (kept when
  they lie with the others, info);
- ``outlier_timestamps``: at most :data:`OUTLIER_MAX_FRACTION` of the events lie
  more than :data:`MIXED_CAPTURE_NS` away from the rest of the rank (dropped);
  ``timestamp_gaps`` when more do (kept: the file may hold several stretches);
- ``duplicate_events``: the same event (kind, thread or stream, start, duration,
  name, correlation) more than once; the copies are dropped.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from tracekit._errors import InputError

__all__ = ["check_times", "MIXED_CAPTURE_NS", "OUTLIER_MAX_FRACTION"]

#: Events (or ranks' first events) further apart than this belong to different captures.
MIXED_CAPTURE_NS = 600 * 10**9
#: at most this fraction of a rank's events are outliers (dropped with a flag); more are kept (``timestamp_gaps``)
OUTLIER_MAX_FRACTION = 0.01
_GPU = ["kernel", "memcpy", "memset"]
_GPU_KEY = ["kind", "ts_ns", "dur_ns", "device", "stream", "correlation", "name"]
_ALL_KEY = ["kind", "pid", "tid", "ts_ns", "dur_ns", "device", "stream", "correlation", "external_id", "name"]


def _flag(meta: dict[str, Any], code: str, message: str, severity: str = "warning", **details: Any) -> None:
    q: dict[str, Any] = {"code": code, "message": message, "severity": severity}
    if details:
        q["details"] = details
    meta.setdefault("quality", []).append(q)


def _us(ns: int) -> str:
    return f"{ns / 1000:.3f} µs"


def check_times(df: pl.DataFrame, meta: dict[str, Any], name: str) -> pl.DataFrame:
    """Validate and repair times and durations of one rank (see the module docstring)."""
    timed = pl.col("kind") != "instant"
    gpu = pl.col("kind").is_in(_GPU)
    dur = pl.col("dur_ns")
    row = df.select(
        pl.col("ts_ns").null_count().alias("bad_ts"),
        (pl.col("ts_rel_ns") < 0).sum().alias("neg_ts"),
        (dur.is_null() & timed).sum().alias("bad_dur"),
        dur.null_count().alias("null_dur"),  # instants have none: 0 ns, no flag
        timed.sum().alias("n_timed"),
        gpu.sum().alias("n_gpu"),
        (dur.is_null() & gpu).sum().alias("bad_gpu_dur"),
        (dur < 0).sum().alias("neg_dur"),
        (dur > MIXED_CAPTURE_NS).sum().alias("long_dur"),
        pl.col("ts_ns").min().alias("lo"),
        pl.col("ts_ns").max().alias("hi"),
    ).row(0, named=True)
    if row["bad_ts"]:
        _flag(meta, "bad_timestamps", f"dropped {row['bad_ts']} events without a numeric ts")
        df = df.filter(pl.col("ts_ns").is_not_null())
    if row["n_timed"] and row["bad_dur"] == row["n_timed"]:
        raise InputError(f"{name}: no complete (ph X) event has a numeric 'dur' ({row['bad_dur']} events); "
                         "every time split would be 0; re-export the trace")
    if row["n_gpu"] and row["bad_gpu_dur"] == row["n_gpu"]:
        raise InputError(f"{name}: no GPU kernel, copy or memset has a numeric 'dur' ({row['n_gpu']} GPU ops); "
                         "GPU time would be 0 everywhere; re-export the trace")
    fix = []
    if row["bad_dur"]:
        _flag(meta, "bad_durations", f"{name}: {row['bad_dur']} complete events without a numeric dur (missing, null, "
              "boolean or text); taken as 0 ns", count=row["bad_dur"])
    if row["neg_dur"]:
        _flag(meta, "negative_durations", f"{row['neg_dur']} events had negative durations; clamped to 0")
    if row["long_dur"]:
        _flag(meta, "implausible_durations", f"{name}: {row['long_dur']} events last longer than "
              f"{MIXED_CAPTURE_NS // 60_000_000_000} min; set to 0 ns (one would stretch the analysis window)",
              count=row["long_dur"])
    if row["null_dur"] or row["neg_dur"] or row["long_dur"]:
        fix.append(pl.when(dur.is_null() | (dur < 0) | (dur > MIXED_CAPTURE_NS)).then(0).otherwise(dur).alias("dur_ns"))
    if fix:
        df = df.with_columns(fix)
    if row["neg_ts"]:
        _flag(meta, "negative_timestamps", f"{name}: {row['neg_ts']} events have a negative ts in the file",
              severity="info", count=row["neg_ts"])
    lo, hi = row["lo"], row["hi"]
    if lo is not None and hi - lo > MIXED_CAPTURE_NS:
        df = _drop_outliers(df, meta, name)
    return _dedupe(df, meta, name)


def _drop_outliers(df: pl.DataFrame, meta: dict[str, Any], name: str) -> pl.DataFrame:
    """Keep the largest group of events whose neighbours are less than MIXED_CAPTURE_NS apart."""
    ts = df.get_column("ts_ns").sort()
    cuts = (ts.diff() > MIXED_CAPTURE_NS).arg_true().to_list()
    bounds = [0, *cuts, ts.len()]
    sizes = [b - a for a, b in zip(bounds, bounds[1:])]
    k = max(range(len(sizes)), key=lambda i: sizes[i])
    keep_lo, keep_hi = int(ts[bounds[k]]), int(ts[bounds[k + 1] - 1])
    n_out = ts.len() - sizes[k]
    if n_out > OUTLIER_MAX_FRACTION * ts.len():  # not a few strays: keep everything, say so
        _flag(meta, "timestamp_gaps", f"{name}: its events form {len(sizes)} groups more than "
              f"{MIXED_CAPTURE_NS // 60_000_000_000} min apart ({n_out} of {ts.len()} events outside the largest); "
              "the time between them counts as idle; check that the file holds one capture", count=n_out)
        return df
    base = int(meta.get("base_time_ns") or 0)
    ex = df.filter((pl.col("ts_ns") < keep_lo) | (pl.col("ts_ns") > keep_hi)).select("name", "ts_rel_ns").head(3)
    shown = ", ".join(f"{str(n)[:40]!r} at ts {_us(int(t))}" for n, t in ex.iter_rows())
    _flag(meta, "outlier_timestamps", f"{name}: dropped {n_out} events whose ts lies more than "
          f"{MIXED_CAPTURE_NS // 60_000_000_000} min from the rest of the rank ({shown}); the other events span "
          f"{(keep_hi - keep_lo) / 1e9:.3f} s", count=n_out, kept_ns=[keep_lo - base, keep_hi - base])
    return df.filter(pl.col("ts_ns").is_between(keep_lo, keep_hi))


def _dedupe(df: pl.DataFrame, meta: dict[str, Any], name: str) -> pl.DataFrame:
    """Events present twice (a file concatenated with itself, a merge gone wrong): keep one of each."""
    have = set(df.columns)
    gkey = [c for c in _GPU_KEY if c in have]
    n_gpu, n_uni = df.lazy().filter(pl.col("kind").is_in(_GPU)).select(
        pl.len(), pl.struct(gkey).n_unique()).collect().row(0)
    if n_gpu == n_uni:
        return df
    before = df.height
    df = df.unique(subset=[c for c in _ALL_KEY if c in have], keep="first", maintain_order=True)
    _flag(meta, "duplicate_events", f"{name}: {before - df.height} events appear more than once (same kind, thread or "
          f"stream, start, duration and name; {n_gpu - n_uni} of them GPU ops); the copies were dropped",
          count=before - df.height)
    return df
