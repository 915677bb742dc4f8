"""Choosing the analysis window: explicit time range, skipped steps, profiler-start transient.

The profiler starts unfenced on each rank (SGLang has no barrier after
``torch.profiler.start()``), so early ranks spin inside their first
collective until the last rank arrives. :func:`transient_end_ns` finds the
end of the first collective instance that every rank entered after the
latest rank's first event; the window starts there.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from tracekit._errors import QualityLog, UsageError

__all__ = ["Window", "select_window", "transient_end_ns", "gpu_ops", "parse_time_range"]

GPU = ["kernel", "memcpy", "memset"]


def gpu_ops(df: pl.DataFrame) -> pl.DataFrame:
    return df.filter(pl.col("kind").cast(pl.String).is_in(GPU))


@dataclass(frozen=True)
class Window:
    start_ns: int | None  # None: per-rank extent of GPU ops
    end_ns: int | None
    trimmed_transient_ns: int = 0
    skipped_steps: int = 0
    reason: str = "extent"


def parse_time_range(spec: str, origin_ns: int) -> tuple[int, int]:
    """``"12.30s:12.45s"`` / ``"12300ms:12450ms"`` / ``"5:6"`` (s) relative to ``origin_ns``."""

    def one(x: str) -> int:
        x = x.strip()
        for suf, mul in (("ms", 1_000_000), ("us", 1_000), ("µs", 1_000), ("ns", 1), ("s", 1_000_000_000)):
            if x.endswith(suf):
                return int(float(x[: -len(suf)]) * mul)
        return int(float(x) * 1_000_000_000)

    try:
        a, b = spec.split(":", 1)
        lo, hi = origin_ns + one(a), origin_ns + one(b)
    except ValueError:
        raise UsageError(f"--window {spec!r}: expected START:END such as 12.30s:12.45s") from None
    if hi <= lo:
        raise UsageError(f"--window {spec!r}: END must be after START")
    return lo, hi


def transient_end_ns(df: pl.DataFrame) -> int | None:
    """End of the first collective all ranks entered after the latest rank's first event; None if n/a."""
    ops = gpu_ops(df)
    ranks = ops.get_column("rank").unique()
    if ranks.len() < 2:
        return None
    comm = ops.filter(pl.col("category").cast(pl.String) == "communication")
    if comm.height == 0:
        return None
    latest_first = int(ops.group_by("rank").agg(pl.col("ts_ns").min())["ts_ns"].max())
    after = comm.filter(pl.col("ts_ns") >= latest_first).sort("ts_ns")
    firsts = after.group_by("rank").agg((pl.col("ts_ns") + pl.col("dur_ns")).first().alias("end"))
    if firsts.height < ranks.len():
        return None
    return int(firsts["end"].max())


def select_window(
    df: pl.DataFrame,
    *,
    time_range: tuple[int, int] | None = None,
    skip_steps: int = 0,
    trim_transient: bool = True,
    quality: QualityLog | None = None,
    min_skew_ns: int = 1_000_000,
) -> Window:
    """Decide the analysis window. Explicit ``time_range`` wins; then ``skip_steps``; then the transient trim.

    The transient is trimmed only when ranks' first GPU ops are more than
    ``min_skew_ns`` (1 ms) apart: below that the first collective holds no
    start-up spin worth removing.
    """
    q = quality if quality is not None else QualityLog()
    if time_range is not None:
        return Window(time_range[0], time_range[1], reason="explicit")
    ops = gpu_ops(df)
    if ops.height == 0:
        return Window(None, None, reason="empty")
    lo = int(ops["ts_ns"].min())
    hi = int((ops["ts_ns"] + ops["dur_ns"]).max())
    if skip_steps:
        steps = df.filter((pl.col("kind").cast(pl.String) == "step") & pl.col("profiled").fill_null(True)).sort("ts_ns")
        starts = steps.group_by("step_id").agg(pl.col("ts_ns").min()).sort("step_id") if steps.height else steps
        if starts.height <= skip_steps:
            raise UsageError(f"--skip-steps {skip_steps}: the trace has only {starts.height} profiled steps")
        # first op launched at or after the first kept step
        first_kept = int(starts["ts_ns"][skip_steps])
        later = ops.filter(pl.coalesce("launch_ts_ns", "ts_ns") >= first_kept)
        lo = int(later["ts_ns"].min()) if later.height else first_kept
        q.add("steps_skipped", f"skipped the first {skip_steps} steps ({(lo - int(ops['ts_ns'].min())) / 1e6:.3f} ms)", severity="info")
        return Window(lo, hi, skipped_steps=skip_steps, reason="skip_steps")
    if trim_transient:
        t = transient_end_ns(df)
        if t is not None and t > lo:
            skew = int(ops.group_by("rank").agg(pl.col("ts_ns").min())["ts_ns"].max()) - lo
            if skew > min_skew_ns:
                q.add(
                    "profiler_start_transient_trimmed",
                    f"ranks started profiling {skew / 1e6:.3f} ms apart; trimmed the first {(t - lo) / 1e6:.3f} ms "
                    "(up to the end of the first collective all ranks entered)",
                    severity="info",
                    trimmed_ns=t - lo,
                )
                return Window(t, hi, trimmed_transient_ns=t - lo, reason="transient_trimmed")
    return Window(None, None, reason="extent")
