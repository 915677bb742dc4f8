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

__all__ = ["Window", "select_window", "observed_spans", "transient_end_ns", "gpu_ops", "device_ops", "device_op_expr",
           "cpu_device_expr", "cpu_mode_ranks", "parse_time_range"]

GPU = ["kernel", "memcpy", "memset"]
#: row kinds that stand in for device work on a rank without GPU ops (docs/cpu_mode.md)
CPU_DEVICE_KINDS = ["cpu_op", "range"]


def cpu_mode_ranks(df: pl.DataFrame) -> list[int]:
    """Ranks in CPU mode: they have categorized ``cpu_op``/``range`` rows and no GPU op."""
    kind = pl.col("kind").cast(pl.String)
    cand = df.filter(pl.col("category").is_not_null()).filter(kind.is_in(CPU_DEVICE_KINDS)).get_column("rank").unique()
    if cand.len() == 0:
        return []
    gpu = df.filter(pl.col("rank").is_in(cand.implode())).filter(kind.is_in(GPU)).get_column("rank").unique()
    return sorted(set(cand.to_list()) - set(gpu.to_list()))


def cpu_device_expr(cpu_ranks: list[int] | None = None) -> pl.Expr:
    """CPU mode rows: ``cpu_op``/``range`` rows with a category, on a rank that has no GPU op.

    The converter categorizes such rows only in CPU mode (forward-thread operators,
    gloo collectives); the per-rank guard keeps any other CPU row out of GPU traces.
    ``cpu_ranks`` (from :func:`cpu_mode_ranks`) makes the guard a cheap membership test;
    without it the guard is a per-rank window expression.
    """
    kind = pl.col("kind").cast(pl.String)
    rows = kind.is_in(CPU_DEVICE_KINDS) & pl.col("category").is_not_null()
    if cpu_ranks is not None:
        return rows & pl.col("rank").is_in(list(cpu_ranks)) if cpu_ranks else pl.lit(False)
    return rows & ~kind.is_in(GPU).any().over("rank")


def device_op_expr(cpu_ranks: list[int] | None = None) -> pl.Expr:
    """THE predicate for "device work": GPU ops (kernel, memcpy, memset), or CPU-mode rows (:func:`cpu_device_expr`)."""
    return pl.col("kind").cast(pl.String).is_in(GPU) | cpu_device_expr(cpu_ranks)


def device_ops(df: pl.DataFrame) -> pl.DataFrame:
    """Rows that are device work (:func:`device_op_expr`); every analysis selects ops through this."""
    return df.filter(device_op_expr(cpu_mode_ranks(df)))


#: kept name: analyses written for GPU traces call this; it includes CPU-mode rows
gpu_ops = device_ops


@dataclass(frozen=True)
class Window:
    start_ns: int | None  # None: per-rank extent of GPU ops
    end_ns: int | None
    trimmed_transient_ns: int = 0
    skipped_steps: int = 0
    reason: str = "extent"
    #: observed stretches (profiler windows of a windowed capture); time outside them is not analyzed
    spans: tuple[tuple[int, int], ...] | None = None

    def with_spans(self, spans: tuple[tuple[int, int], ...] | None) -> "Window":
        return Window(self.start_ns, self.end_ns, self.trimmed_transient_ns, self.skipped_steps, self.reason, spans)


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


def observed_spans(df: pl.DataFrame, profiler_windows: list[list[int]] | None) -> tuple[tuple[int, int], ...] | None:
    """Profiler windows of a windowed capture, each extended to the end of the GPU ops launched inside it.

    None when the capture had at most one window (then the extent of GPU ops is the window).
    """
    if not profiler_windows or len(profiler_windows) < 2:
        return None
    ops = gpu_ops(df).select(pl.coalesce("launch_ts_ns", "ts_ns").alias("l"), (pl.col("ts_ns") + pl.col("dur_ns")).alias("e"))
    spans = []
    for a, b in sorted((int(x[0]), int(x[1])) for x in profiler_windows):
        inside = ops.filter((pl.col("l") >= a) & (pl.col("l") <= b))
        end = max(b, int(inside["e"].max())) if inside.height else b
        start = min(a, int(gpu_ops(df).filter((pl.col("ts_ns") + pl.col("dur_ns") > a) & (pl.col("ts_ns") < a))["ts_ns"].min() or a))
        spans.append((start, end))
    merged: list[tuple[int, int]] = []
    for a, b in spans:
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return tuple(merged)


def select_window(
    df: pl.DataFrame,
    *,
    time_range: tuple[int, int] | None = None,
    skip_steps: int = 0,
    trim_transient: bool = True,
    quality: QualityLog | None = None,
    min_skew_ns: int = 1_000_000,
    profiler_windows: list[list[int]] | None = None,
) -> Window:
    w = _select(df, time_range=time_range, skip_steps=skip_steps, trim_transient=trim_transient, quality=quality, min_skew_ns=min_skew_ns)
    spans = observed_spans(df, profiler_windows)
    if spans:
        q = quality if quality is not None else QualityLog()
        q.add("profiler_windows", f"windowed capture: analyzing the {len(spans)} profiler windows only "
              f"({sum(b - a for a, b in spans) / 1e6:.1f} ms); time between windows was not recorded", severity="info")
        return w.with_spans(spans)
    return w


def _select(
    df: pl.DataFrame,
    *,
    time_range: tuple[int, int] | None,
    skip_steps: int,
    trim_transient: bool,
    quality: QualityLog | None,
    min_skew_ns: int,
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
