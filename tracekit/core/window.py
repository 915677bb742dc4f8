"""Choosing the analysis window: explicit time range, skipped steps, profiler-start transient.

The profiler starts unfenced on each rank (SGLang has no barrier after
``torch.profiler.start()``), so early ranks spin inside their first
collective until the last rank arrives. :func:`transient_end_ns` finds the
end of the first collective instance that every rank entered after the
latest rank's first event; the window starts there.
"""

from __future__ import annotations

import math

from dataclasses import dataclass, field

import polars as pl

from tracekit._errors import QualityLog, UsageError
from tracekit.core._num import as_int

__all__ = ["Window", "select_window", "observed_spans", "transient_end_ns", "gpu_ops", "device_ops", "device_op_expr",
           "cpu_device_expr", "cpu_mode_ranks", "parse_time_range", "Overview", "trace_overview", "rank_overview", "overview_of", "span_bounds", "combine_bounds", "small_rows_expr", "SMALL_COLUMNS", "STEP_COLUMNS"]

GPU = ["kernel", "memcpy", "memset"]
#: row kinds that stand in for device work on a rank without GPU ops (docs/cpu_mode.md)
CPU_DEVICE_KINDS = ["cpu_op", "range"]


def cpu_mode_ranks(df: pl.DataFrame) -> list[int]:
    """Ranks in CPU mode: they have categorized ``cpu_op``/``range`` rows and no GPU op."""
    kind = pl.col("kind")
    r = df.lazy().group_by("rank").agg(
        (kind.is_in(CPU_DEVICE_KINDS) & pl.col("category").is_not_null()).any().alias("_c"), kind.is_in(GPU).any().alias("_g")
    ).filter(pl.col("_c") & ~pl.col("_g")).collect()
    return sorted(int(x) for x in r["rank"].to_list())


def cpu_device_expr(cpu_ranks: list[int] | None = None) -> pl.Expr:
    """CPU mode rows: ``cpu_op``/``range`` rows with a category, on a rank that has no GPU op.

    The converter categorizes such rows only in CPU mode (forward-thread operators,
    gloo collectives); the per-rank guard keeps any other CPU row out of GPU traces.
    ``cpu_ranks`` (from :func:`cpu_mode_ranks`) makes the guard a cheap membership test;
    without it the guard is a per-rank window expression.
    """
    kind = pl.col("kind")
    rows = kind.is_in(CPU_DEVICE_KINDS) & pl.col("category").is_not_null()
    if cpu_ranks is not None:
        return rows & pl.col("rank").is_in(list(cpu_ranks)) if cpu_ranks else pl.lit(False)
    return rows & ~kind.is_in(GPU).any().over("rank")


def device_op_expr(cpu_ranks: list[int] | None = None) -> pl.Expr:
    """THE predicate for "device work": GPU ops (kernel, memcpy, memset), or CPU-mode rows (:func:`cpu_device_expr`)."""
    return pl.col("kind").is_in(GPU) | cpu_device_expr(cpu_ranks)


def device_ops(df: pl.DataFrame) -> pl.DataFrame:
    """Rows that are device work (:func:`device_op_expr`); every analysis selects ops through this."""
    return df.filter(device_op_expr(cpu_mode_ranks(df)))


#: kept name: analyses written for GPU traces call this; it includes CPU-mode rows
gpu_ops = device_ops


#: columns of the small cross-rank rows (:attr:`Overview.small`): what collective matching, clock alignment,
#: the transient trim, ``--skip-steps`` and stall step lookups read
SMALL_COLUMNS = [
    "rank", "kind", "ts_ns", "dur_ns", "stream", "name", "category", "family", "launch_ts_ns", "coll_name", "coll_in_nelems",
    "coll_out_nelems", "coll_dtype", "coll_group_size", "pg_name", "pg_ranks", "coll_seq", "step_id", "step_mode", "profiled",
]
#: columns of the overview's step rows (:attr:`Overview.steps`): what the cross-rank plan (stall step lookups) and
#: ``--skip-steps`` read
STEP_COLUMNS = ["rank", "kind", "ts_ns", "dur_ns", "launch_ts_ns", "step_id", "profiled"]
#: ``family`` prefixes of collectives (same as ``collectives._COMM_FAMILY``, ``^(allreduce|collective)\.``)
COMM_FAMILY_PREFIXES = ("allreduce.", "collective.")


def _starts_with(col: str, prefix: str, dtype: pl.DataType | None) -> pl.Expr:
    """``str.starts_with`` that works on the categories of a Categorical column (no per-row strings)."""
    if isinstance(dtype, pl.Categorical):
        return pl.col(col).cat.starts_with(prefix)
    return pl.col(col).cast(pl.String).str.starts_with(prefix)


def small_rows_expr(schema: pl.Schema | None = None) -> pl.Expr:
    """Rows every cross-rank step needs: steps, and device-op candidates that are communication or collectives.

    A superset: CPU-mode candidates (categorized ``cpu_op``/``range`` rows) are kept on every rank;
    consumers apply :func:`device_op_expr` with :attr:`Overview.cpu_ranks`.
    """
    kind = pl.col("kind")
    fd = schema.get("family") if schema is not None else None
    dev = kind.is_in(GPU) | (kind.is_in(CPU_DEVICE_KINDS) & pl.col("category").is_not_null())
    coll = (pl.col("category") == "communication") | _starts_with("family", COMM_FAMILY_PREFIXES[0], fd) \
        | _starts_with("family", COMM_FAMILY_PREFIXES[1], fd)
    return (kind == "step") | (dev & coll.fill_null(False))


@dataclass
class Overview:
    """What the cross-rank steps need from a whole trace, small whatever the trace size.

    ``ranks``: one row per rank present (any row): ``rank, rows, min_ts, has_gpu, has_cpu_dev, lo, hi``
    where ``lo``/``hi`` are the extent of the rank's device ops (null without any);
    ``small``: the collective candidates of :func:`small_rows_expr` (:data:`SMALL_COLUMNS`), in file order;
    ``cpu_ranks``: ranks in CPU mode (:func:`cpu_mode_ranks`);
    ``steps``: the step rows, in file order, with the :data:`STEP_COLUMNS` read across ranks (a trace of many
    ranks has far more step rows than collectives, and a step row needs 7 of the 20 columns).
    """

    ranks: pl.DataFrame
    small: pl.DataFrame
    cpu_ranks: list[int]
    steps: pl.DataFrame = field(default_factory=pl.DataFrame)

    def take_small(self) -> pl.DataFrame:
        """The small rows, handed over: the overview keeps none (so the taker can free them)."""
        rows, self.small = self.small, pl.DataFrame()
        return rows

    def take_steps(self) -> pl.DataFrame:
        """The step rows, handed over (as :meth:`take_small`)."""
        rows, self.steps = self.steps, pl.DataFrame()
        return rows

    @property
    def all_ranks(self) -> list[int]:
        return [int(r) for r in self.ranks["rank"].to_list()]

    @property
    def extents(self) -> pl.DataFrame:
        """``rank, lo, hi`` of the ranks with device ops."""
        return self.ranks.filter(pl.col("lo").is_not_null()).select("rank", "lo", "hi")


def _rank_aggs() -> list[pl.Expr]:
    kind = pl.col("kind")
    gpu = kind.is_in(GPU)
    cpu = kind.is_in(CPU_DEVICE_KINDS) & pl.col("category").is_not_null()
    end = pl.col("ts_ns") + pl.col("dur_ns")
    return [
        pl.len().alias("rows"), pl.col("ts_ns").min().alias("min_ts"), gpu.any().alias("has_gpu"), cpu.any().alias("has_cpu_dev"),
        pl.col("ts_ns").filter(gpu).min().alias("_glo"), end.filter(gpu).max().alias("_ghi"),
        pl.col("ts_ns").filter(cpu).min().alias("_clo"), end.filter(cpu).max().alias("_chi"),
    ]


def _small_query(lf: pl.LazyFrame, schema: pl.Schema) -> pl.LazyFrame:
    return lf.filter(small_rows_expr(schema) & (pl.col("kind") != "step")).select([c for c in SMALL_COLUMNS if c in schema])


def _step_query(lf: pl.LazyFrame, schema: pl.Schema) -> pl.LazyFrame:
    return lf.filter(pl.col("kind") == "step").select([c for c in STEP_COLUMNS if c in schema])


def rank_overview(lf: pl.LazyFrame, rank: int, *, small: bool = True) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """One rank's part of :func:`trace_overview` (``lf``: the whole scan, filtered here): its aggregate row, its
    small rows and its step rows. :func:`overview_of` of every rank's parts, in rank order, is
    ``trace_overview(lf, by_rank=True)``."""
    schema = lf.collect_schema()
    one = lf.filter(pl.col("rank") == rank)
    agg = one.select(pl.lit(rank, dtype=schema["rank"]).alias("rank"), *_rank_aggs()).collect()
    if not small:
        return agg, pl.DataFrame(), pl.DataFrame()
    rows, steps = pl.collect_all([_small_query(one, schema), _step_query(one, schema)])
    return agg, rows, steps


def overview_of(agg: pl.DataFrame, rows: pl.DataFrame, steps: pl.DataFrame | None = None) -> Overview:
    """The :class:`Overview` from the per-rank aggregate rows, the small rows and the step rows."""
    cpu_mode = pl.col("has_cpu_dev") & ~pl.col("has_gpu")
    ranks = agg.with_columns(
        pl.when(pl.col("has_gpu")).then(pl.col("_glo")).when(cpu_mode).then(pl.col("_clo")).alias("lo"),
        pl.when(pl.col("has_gpu")).then(pl.col("_ghi")).when(cpu_mode).then(pl.col("_chi")).alias("hi"),
    ).drop(["_glo", "_ghi", "_clo", "_chi"]).sort("rank")
    cpu_ranks = sorted(int(r) for r in ranks.filter(cpu_mode)["rank"].to_list())
    return Overview(ranks, rows, cpu_ranks, steps if steps is not None else pl.DataFrame())


def trace_overview(df: pl.DataFrame | pl.LazyFrame, *, small: bool = True, by_rank: bool = False) -> Overview:
    """Lazy queries over ``df`` (a frame or a scan): per-rank aggregates, and the small rows.

    ``by_rank``: one query per rank (:func:`rank_overview`: a rank-sorted ``trace.parquet`` then reads one rank's
    row groups at a time, so memory stays at one rank's few columns); otherwise one query
    over everything (in-memory frames).
    """
    lf = df.lazy()
    aggs = _rank_aggs()
    schema = lf.collect_schema()
    rows = steps = pl.DataFrame()
    if by_rank:
        present = sorted(int(r) for r in lf.select(pl.col("rank").unique()).collect(engine="streaming")["rank"].to_list())
        parts = [rank_overview(lf, r, small=small) for r in present]
        agg = pl.concat([a for a, _, _ in parts]) if parts else lf.group_by("rank").agg(aggs).collect()
        if small and parts:
            rows, steps = pl.concat([x for _, x, _ in parts]), pl.concat([x for _, _, x in parts])
        elif small:
            rows, steps = pl.collect_all([_small_query(lf, schema), _step_query(lf, schema)])
    else:
        agg = lf.group_by("rank").agg(aggs).collect()
        if small:
            rows, steps = pl.collect_all([_small_query(lf, schema), _step_query(lf, schema)])
    return overview_of(agg, rows, steps)


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


def parse_time_spec(spec: str) -> tuple[int, int]:
    """``"12.30s:12.45s"`` / ``"12300ms:12450ms"`` / ``"5:6"`` (units ns/us/ms/s, default s) → (start, end) ns
    relative to the capture start. The one ``--window`` grammar (analyze, timeline, export)."""

    def one(x: str) -> int:
        x = x.strip()
        mul = 1_000_000_000
        for suf, m in (("ms", 1_000_000), ("us", 1_000), ("µs", 1_000), ("ns", 1), ("s", 1_000_000_000)):
            if x.endswith(suf):
                x, mul = x[: -len(suf)], m
                break
        v = float(x) * mul
        if not math.isfinite(v) or abs(v) > 1e18:  # inf, nan, or beyond int64 nanoseconds
            raise ValueError(x)
        return int(v)

    try:
        a, b = spec.split(":", 1)
        lo, hi = one(a), one(b)
    except ValueError:
        raise UsageError(f"--window {spec!r}: expected START:END of finite times such as 12.30s:12.45s") from None
    if hi <= lo:
        raise UsageError(f"--window {spec!r}: END must be after START")
    return lo, hi


def parse_time_range(spec: str, origin_ns: int) -> tuple[int, int]:
    """:func:`parse_time_spec` in absolute ns (``origin_ns`` = the capture start)."""
    a, b = parse_time_spec(spec)
    return origin_ns + a, origin_ns + b


def transient_end_ns(df: pl.DataFrame | pl.LazyFrame, *, overview: "Overview | None" = None) -> int | None:
    """End of the first collective all ranks entered after the latest rank's first event; None if n/a."""
    ov = overview if overview is not None else trace_overview(df)
    ext = ov.extents
    if ext.height < 2:
        return None
    comm = ov.small.lazy().filter(device_op_expr(ov.cpu_ranks) & (pl.col("category") == "communication")).select(
        "rank", "ts_ns", "dur_ns").collect()
    if comm.height == 0:
        return None
    latest_first = as_int(ext["lo"].max())
    after = comm.filter(pl.col("ts_ns") >= latest_first).sort("ts_ns", maintain_order=True)
    firsts = after.group_by("rank").agg((pl.col("ts_ns") + pl.col("dur_ns")).first().alias("end"))
    if firsts.height < ext.height:
        return None
    return as_int(firsts["end"].max())


def span_bounds(df: pl.DataFrame | pl.LazyFrame, profiler_windows: list[list[int]], *,
                cpu_ranks: list[int] | None) -> pl.DataFrame:
    """What :func:`observed_spans` reads of the trace: one row, per profiler window ``i``, ``e{i}`` (last end of a
    device op launched inside it) and ``s{i}`` (first start of a device op running into it). Per-rank rows combine
    exactly (:func:`combine_bounds`: max of ``e``, min of ``s``), so a rank's row can be computed where the rank lies."""
    wins = sorted((int(x[0]), int(x[1])) for x in profiler_windows)
    launch, end = pl.coalesce("launch_ts_ns", "ts_ns"), pl.col("ts_ns") + pl.col("dur_ns")
    aggs = []
    for i, (a, b) in enumerate(wins):
        aggs.append(end.filter((launch >= a) & (launch <= b)).max().alias(f"e{i}"))
        aggs.append(pl.col("ts_ns").filter((end > a) & (pl.col("ts_ns") < a)).min().alias(f"s{i}"))
    return df.lazy().filter(device_op_expr(cpu_ranks)).select(aggs).collect(engine="streaming")  # one pass, bounded memory on a scan


def combine_bounds(rows: list[pl.DataFrame]) -> pl.DataFrame:
    """Per-rank :func:`span_bounds` rows as the one row of the whole trace."""
    both = pl.concat(rows)
    return both.select([pl.col(c).max() if c.startswith("e") else pl.col(c).min() for c in both.columns])


def observed_spans(
    df: pl.DataFrame | pl.LazyFrame, profiler_windows: list[list[int]] | None, *, cpu_ranks: list[int] | None = None,
    bounds: pl.DataFrame | None = None,
) -> tuple[tuple[int, int], ...] | None:
    """Profiler windows of a windowed capture, each extended to the end of the GPU ops launched inside it.

    None when the capture had at most one window (then the extent of GPU ops is the window).
    One lazy aggregation over the device ops (``df`` may be a lazy scan), or none when ``bounds``
    (:func:`span_bounds` of the whole trace) is given.
    """
    if not profiler_windows or len(profiler_windows) < 2:
        return None
    if bounds is None:
        if cpu_ranks is None:
            cpu_ranks = trace_overview(df.lazy(), small=False).cpu_ranks
        bounds = span_bounds(df, profiler_windows, cpu_ranks=cpu_ranks)
    wins = sorted((int(x[0]), int(x[1])) for x in profiler_windows)
    row = bounds.row(0)
    spans = []
    for i, (a, b) in enumerate(wins):
        e, s0 = row[2 * i], row[2 * i + 1]
        spans.append((min(a, int(s0 or a)), max(b, int(e)) if e is not None else b))
    merged: list[tuple[int, int]] = []
    for a, b in spans:
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return tuple(merged)


def select_window(
    df: pl.DataFrame | pl.LazyFrame,
    *,
    time_range: tuple[int, int] | None = None,
    skip_steps: int = 0,
    trim_transient: bool = True,
    quality: QualityLog | None = None,
    min_skew_ns: int = 1_000_000,
    profiler_windows: list[list[int]] | None = None,
    overview: "Overview | None" = None,
    bounds: pl.DataFrame | None = None,
) -> Window:
    """Decide the analysis window (see :func:`_select`); ``df`` may be a frame or a lazy scan.

    Everything is decided from small inputs: the :class:`Overview` (per-rank extents of
    device ops, communication and step rows; computed here when not given) plus, for
    profiler windows, one lazy aggregation over ``df`` unless ``bounds`` (:func:`span_bounds` of the
    whole trace, e.g. combined from per-rank rows) is given.
    """
    lf = df.lazy()
    ov = overview
    if ov is None and (time_range is None or (profiler_windows and len(profiler_windows) >= 2)):
        ov = trace_overview(lf)
    w = _select(lf, ov, time_range=time_range, skip_steps=skip_steps, trim_transient=trim_transient, quality=quality,
                min_skew_ns=min_skew_ns)
    spans = observed_spans(lf, profiler_windows, cpu_ranks=ov.cpu_ranks if ov is not None else None, bounds=bounds)
    if spans:
        q = quality if quality is not None else QualityLog()
        q.add("profiler_windows", f"windowed capture: analyzing the {len(spans)} profiler windows only "
              f"({sum(b - a for a, b in spans) / 1e6:.1f} ms); time between windows was not recorded", severity="info")
        return w.with_spans(spans)
    return w


def _select(
    lf: pl.LazyFrame,
    ov: "Overview | None",
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
    assert ov is not None
    ext = ov.extents
    if ext.height == 0:
        return Window(None, None, reason="empty")
    lo0 = as_int(ext["lo"].min())
    lo = lo0
    hi = as_int(ext["hi"].max())
    if skip_steps:
        steps = ov.steps.lazy().filter(pl.col("profiled").fill_null(True)).select(
            "step_id", "ts_ns").collect().sort("ts_ns", maintain_order=True)
        starts = steps.group_by("step_id").agg(pl.col("ts_ns").min()).sort("step_id") if steps.height else steps
        if starts.height <= skip_steps:
            raise UsageError(f"--skip-steps {skip_steps}: the trace has only {starts.height} profiled steps")
        # first op launched at or after the first kept step
        first_kept = int(starts["ts_ns"][skip_steps])
        later = lf.filter(device_op_expr(ov.cpu_ranks) & (pl.coalesce("launch_ts_ns", "ts_ns") >= first_kept)).select(
            pl.col("ts_ns").min()).collect(engine="streaming").item()
        lo = int(later) if later is not None else first_kept
        q.add("steps_skipped", f"skipped the first {skip_steps} steps ({(lo - lo0) / 1e6:.3f} ms)", severity="info")
        return Window(lo, hi, skipped_steps=skip_steps, reason="skip_steps")
    if trim_transient:
        t = transient_end_ns(lf, overview=ov)
        if t is not None and t > lo:
            skew = as_int(ext["lo"].max()) - lo
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
