"""Convert trace sources (Kineto JSON, nsys exports) of one capture into ``trace.parquet``.

Default (``jobs=1``): sources are read one at a time in rank order (each
file's JSON decoded by a thread pool); a writer thread finalizes each rank and
writes its rows, sorted by time, straight into a staged file in the final
format while the main thread reads the next rank (:class:`_Stager`). After the
last rank, clocks are aligned from the collective rows of all ranks; the
staged file is then renamed into place, or — when a clock offset must be
applied, a rank has several profiler windows, or ranks arrived out of order —
re-read rank by rank into the output (:func:`tracekit.ingest.rankwrite.write_rank`).
``jobs=N``: N worker processes write one temporary part per rank, followed by
the same second pass. Memory is bounded by the largest rank; the output
appears atomically, and an existing file is refused without ``force``.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import threading
import time
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import polars as pl
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from tracekit import _interrupt
from tracekit._errors import InputError, OutputError, QualityLog, TracekitError, UsageError, os_reason
from tracekit._memory import release_memory, tune_runtime
from tracekit.categories import RuleSet, load_rules
from tracekit.ingest.common import finalize_rank, ts_order
from tracekit.ingest.dataset import DatasetBuild, check_dataset_output
from tracekit.ingest.discover import Source, discover
from tracekit.ingest.validate import MIXED_CAPTURE_NS as _MIXED_NS
from tracekit.ingest.staging import make_part_dir, remove_part_dir, remove_stale_parts
from tracekit.ingest.rankwrite import COLL_KEY, COMM, PART_ROWS, emit_frame, write_rank
from tracekit.schema import ARROW_SCHEMA, DICT_COLUMNS, MAX_RANK, TraceWriter, check_output_path, conform, note_input, to_arrow
from tracekit.steplabels import compile_steps_from

__all__ = ["convert", "ConvertResult", "convert_source", "stage_source"]

_PARALLEL_MIN_BYTES = 32 << 20


@dataclass
class ConvertResult:
    out: Path
    ranks: list[int]
    rows: int
    seconds: float
    input_bytes: int
    metadata: dict[str, Any] = field(default_factory=dict)
    quality: list[dict[str, Any]] = field(default_factory=list)


def _read(src: Source, rank: int | None) -> tuple[pl.DataFrame, dict[str, Any]]:
    from tracekit.ingest.readers import get_reader

    return get_reader(src.fmt).read(src.path, rank)


def _raw_ranks(src: Source) -> Iterator[tuple[list[pl.DataFrame], dict[str, Any]]]:
    """Read one source and yield each rank it holds as raw rows (handed over in a one-element list) and metadata.

    A Kineto file is one rank; an nsys report can hold several GPU processes.
    """
    raw, meta = _read(src, None)
    pieces: list[tuple[pl.DataFrame, dict[str, Any]]] = [(raw, meta)]
    from tracekit.ingest.readers import get_reader

    split = get_reader(src.fmt).split
    if split is not None:  # a source holding several ranks (an nsys report with several GPU processes)
        pieces = split(raw, meta)
    del raw
    release_memory()  # the decoded text chunks' heap pages go back before finalize
    pieces.reverse()
    while pieces:
        raw_r, meta_r = pieces.pop()
        meta_r = dict(meta_r)
        rank = meta_r.get("rank")
        if rank is not None and src.rank_hint is not None and rank != src.rank_hint and src.capture_id is None:
            # (SGLang names carry the TP index, which differs from the global rank under DP/PP: not a contradiction)
            meta_r.setdefault("quality", []).append({"code": "rank_name_mismatch", "severity": "warning", "message":
                f"{src.path.name}: the trace says rank {rank} but the file name says rank {src.rank_hint}; "
                f"using rank {rank} (the trace's); rename the file if the trace is wrong"})
        if rank is None:
            rank = src.rank_hint
        if rank is not None and not 0 <= rank <= MAX_RANK:
            raise InputError(f"{src.path}: rank {rank} is out of range (0..{MAX_RANK}); rename the file as rank<N>.json.gz")
        if rank is None:
            rank = -1  # resolved by the parent (single-file inputs become rank 0)
        meta_r.update(rank=rank, window=src.window, source_file=str(src.path))
        hand = [raw_r.with_columns(pl.lit(rank, dtype=pl.Int32).alias("rank"))]
        del raw_r
        yield hand, meta_r


def _finish_rank(hand: list[pl.DataFrame], meta: dict[str, Any], rules: RuleSet) -> pl.DataFrame:
    """Finalize one rank's raw rows (rows unsorted; ``hand`` is emptied) and add its counts to ``meta``."""
    df = finalize_rank(hand, rules, sort=False)  # rows are ordered slice by slice while written
    # aggregates only: a filtered copy of the GPU rows would be a third of the rank
    is_gpu = pl.col("kind").is_in(["kernel", "memcpy", "memset"])
    gpu_ops, cpu_dev, lo, hi = df.select(
        is_gpu.sum().alias("g"), pl.col("category").is_not_null().sum().alias("c"),
        pl.col("ts_ns").min().alias("lo"), (pl.col("ts_ns") + pl.col("dur_ns")).max().alias("hi"),
    ).row(0)
    devices = df.lazy().filter(is_gpu).select(pl.col("device").drop_nulls().unique()).collect().to_series().to_list()
    meta.update(
        {
            "rows": df.height,
            "gpu_ops": int(gpu_ops),
            "cpu_device_ops": 0 if gpu_ops else int(cpu_dev),
            "first_ts_ns": None if lo is None else int(lo),
            "last_end_ns": None if hi is None else int(hi),
            "devices": sorted({int(d) for d in devices}),
        }
    )
    return df


def convert_source(src: Source, rules_path: str | None, part_dir: str, out_label: str = "",
                   steps_from: str | None = None) -> list[dict[str, Any]]:
    """Worker (``--jobs N``): read + finalize one source, write one part file per rank it holds.

    Returns small metadata only (one dict per rank).
    """
    tune_runtime()
    rules = dataclasses.replace(load_rules(rules_path) if rules_path else load_rules(None), steps_from=steps_from)
    out = []
    for hand, meta_r in _raw_ranks(src):
        df = _finish_rank(hand, meta_r, rules)
        fd, part = tempfile.mkstemp(prefix="part.", suffix=".parquet", dir=part_dir)
        os.close(fd)
        _write_part(df, part, out_label)
        meta_r.update(part=part, **_part_summary(df, part + ".comm.parquet", out_label))
        out.append(meta_r)
        del df
        release_memory()
    return out


def stage_source(src: Source, rules_path: str | None, steps_from: str | None, staged: str, out_label: str,
                 single_source: bool) -> list[dict[str, Any]]:
    """Task: read + finalize one source; write each rank it holds to ``<staged>-<k>.parquet`` (final format).

    Returns small metadata only, one dict per rank (as :func:`tracekit.ingest.convert.convert_source`, plus
    ``written_rank``, ``written_rows``, ``written_lo``/``written_hi``: what the staged file holds)."""
    tune_runtime()
    rules = dataclasses.replace(load_rules(rules_path), steps_from=steps_from)
    out = []
    for k, (hand, meta_r) in enumerate(_raw_ranks(src)):
        df = _finish_rank(hand, meta_r, rules)
        r = meta_r["rank"] if meta_r["rank"] != -1 or not single_source else 0
        part = f"{staged}-{k}.parquet"
        w = TraceWriter(part, force=True, label=out_label, final=False, part_rank=max(r, 0))
        try:
            rows, lo, hi = emit_frame(w, r, df, None)
            w.close()
        except BaseException:
            w.abort()
            raise
        meta_r.update(part=part, written_rank=r, written_rows=rows, written_lo=lo, written_hi=hi,
                      **_part_summary(df, part + ".comm.parquet", out_label))
        out.append(meta_r)
        del df
        release_memory()
    return out


class _Cancelled(Exception):
    """The conversion is being abandoned: the writer thread stops between batches."""


class _Stager:
    """Finalizes each rank and writes it straight into the output format, on a thread, while the
    main thread reads the next rank.

    Each rank becomes consecutive row groups of ``path`` (a Parquet file in the
    final format); its metadata records them as ``row_groups`` so a second pass
    can re-read them as parts when the ranks cannot stay as written (see
    :func:`_write_output`). Capture-side rows are merged here when ``merge_extra``.

    Memory: the thread works on one rank while the next is read only when that
    rank is small (:data:`OVERLAP_MAX_BYTES` of raw rows); a larger rank is
    finished before the next one is read, so memory stays one rank's.

    The thread is a daemon and checks for cancellation between batches, so an
    error or an interrupt in the main thread never waits for a whole rank.
    """

    def __init__(self, path: str, part_dir: str, out_label: str, rules: RuleSet, extra: pl.DataFrame | None, merge_extra: bool,
                 compression: str = "zstd") -> None:
        self.path, self.part_dir, self.out_label, self.rules = path, part_dir, out_label, rules
        self.extra, self.merge_extra = extra, merge_extra
        # the staged file becomes the output when its ranks can stay as written: the output's codec
        self.w = TraceWriter(path, force=True, label=out_label, final=False, compression=compression)
        self._thread: threading.Thread | None = None
        #: set when the writer thread ends; waited on instead of join()/is_alive(): an exception (Ctrl-C) raised
        #: inside Thread.join can leave a running thread marked stopped on CPython 3.11 (bpo-45274)
        self._done = threading.Event()
        self._error: BaseException | None = None
        self._cancel = False
        self._summarized = threading.Event()  # the rank being written has its metadata (rows still being written)
        self.metas: list[dict[str, Any]] = []

    def submit(self, hand: list[pl.DataFrame], meta: dict[str, Any], single_source: bool) -> None:
        """Hand over one rank's raw rows (``hand`` is emptied); returns once the previous rank is written."""
        self.wait()
        r = meta["rank"] if meta["rank"] != -1 or not single_source else 0
        ex = None
        if self.merge_extra and self.extra is not None:
            ex = self.extra.filter(pl.col("rank") == r)
        big = hand[0].estimated_size() > OVERLAP_MAX_BYTES
        self._summarized.clear()
        self._done.clear()
        self._thread = threading.Thread(target=self._run, args=([hand.pop()], meta, r, ex), name="tk-write", daemon=True)
        self._thread.start()
        if big:
            self.wait()

    def _run(self, hand: list[pl.DataFrame], meta: dict[str, Any], r: int, extra: pl.DataFrame | None) -> None:
        try:
            df = _finish_rank(hand, meta, self.rules)
            comm_path = os.path.join(self.part_dir, f"comm.{len(self.metas)}.parquet")
            meta.update(_part_summary(df, comm_path, self.out_label), part=self.path, written_rank=r, extra_merged=extra is not None)
            self.metas.append(meta)
            self._summarized.set()  # the main thread may align clocks while the rows are written
            rg0 = self.w.row_groups
            rows, lo, hi = emit_frame(self.w, r, df, extra, stop=self._stopped)
            meta.update(row_groups=(rg0, self.w.row_groups), written_rows=rows, written_lo=lo, written_hi=hi)
            del df
            release_memory()
        except BaseException as e:  # noqa: BLE001 - re-raised in the main thread by wait()
            self._error = e
        finally:
            self._summarized.set()
            self._done.set()

    def _stopped(self) -> None:
        if self._cancel:
            raise _Cancelled
        _interrupt.check("write")  # Ctrl-C: the writer thread stops too (its KeyboardInterrupt reaches wait())

    def wait_summary(self) -> None:
        """Wait until the rank being written has its metadata in :attr:`metas` (or failed)."""
        while self._thread is not None and not self._summarized.wait(0.05):
            _interrupt.check("wait")
        if self._error is not None:
            self.wait()

    def wait(self) -> None:
        """Wait for the rank being written; re-raise its error here."""
        if self._thread is not None:
            while not self._done.wait(0.05):  # a bounded wait: a signal (Ctrl-C, SIGTERM) is handled between waits
                _interrupt.check("wait")
            self._thread = None
        if self._error is not None:
            e, self._error = self._error, None
            raise e

    def discard(self, grace_s: float = 5.0) -> None:
        """Error path: stop the writer (its own error is not the one to report) and drop the staged file."""
        self._cancel = True
        t = self._thread
        if t is None or self._done.wait(grace_s):
            self.w.abort()
        else:  # still inside a write: leave its writer alone, only unlink the file
            self.w.discard_file()


#: parts of up to this many (in-memory) bytes are uncompressed Arrow IPC, larger ones lz4 Parquet (``--jobs N``)
IPC_PART_MAX_BYTES = 512 << 20
#: a rank of up to this many bytes of raw rows is finalized and written on a thread while the next rank is read
OVERLAP_MAX_BYTES = 128 << 20


def _part_error(e: OSError, part: str, out_label: str) -> OutputError:
    """One-line error for a temporary part that could not be written (disk full, quota, I/O)."""
    return OutputError(f"{out_label or part}: cannot write a temporary part ({e.strerror or e}); free disk space or choose another -o")


def _write_part(df: pl.DataFrame, part: str, out_label: str) -> None:
    """A rank's finalized rows, sorted by ts, in the final Arrow schema, in batches of :data:`PART_ROWS`.

    Format: an uncompressed Arrow IPC stream (written and read back at memory speed) unless
    the part would be large (:data:`IPC_PART_MAX_BYTES`), then lz4 Parquet (~12x smaller on
    disk, ~0.35 s more per 376 k rows). Compressed IPC was not used: zstd IPC grew the
    process by ~10 MB per rank (codec contexts).
    """
    order = ts_order(df)  # sorted slice by slice: no second full copy of the rank
    try:
        if df.estimated_size() <= IPC_PART_MAX_BYTES:
            with ipc.new_stream(part + ".arrows", ARROW_SCHEMA) as w:
                for off in range(0, df.height, PART_ROWS):
                    w.write_table(to_arrow(df[order.slice(off, PART_ROWS)]))
            os.replace(part + ".arrows", part)
            return
        with pq.ParquetWriter(part, ARROW_SCHEMA, compression="lz4", use_dictionary=DICT_COLUMNS, write_statistics=False) as w:
            for off in range(0, df.height, PART_ROWS):
                w.write_table(to_arrow(df[order.slice(off, PART_ROWS)]))
    except OSError as e:
        raise _part_error(e, part, out_label) from None


def _part_summary(df: pl.DataFrame, comm_path: str, out_label: str) -> dict[str, Any]:
    """What the parent needs from a part besides its rows: collective rows (clock alignment, a small
    Parquet file), traced steps (dedupe of capture-side step records), step-id and collective
    sequence ranges (several windows of one rank)."""
    from tracekit.core.window import SMALL_COLUMNS

    comm = df.lazy().filter(COMM).select(SMALL_COLUMNS).collect()  # the 20 columns alignment reads, not a copy of all 49
    comm_part = None
    if comm.height:
        comm_part = comm_path
        try:  # only what matching and clock alignment read (20 of 49 columns: all ranks' rows are loaded at once)
            comm.write_parquet(comm_part, compression="lz4")
        except OSError as e:
            raise _part_error(e, comm_path, out_label) from None
    steps = df.filter(pl.col("kind") == "step").select("ts_ns", "step_id")
    sid = df.get_column("step_id")
    seq = comm.filter(pl.col("coll_seq").is_not_null()).group_by(COLL_KEY.alias("_k")).agg(
        pl.col("coll_seq").min().alias("_lo"), pl.col("coll_seq").max().alias("_hi")
    )
    return {
        "comm_part": comm_part,
        "steps": {"ts_ns": steps["ts_ns"].to_list(), "step_id": steps["step_id"].to_list()},
        "step_id_max": None if sid.max() is None else int(sid.max()),  # type: ignore[arg-type]
        "step_id_any": sid.null_count() < df.height,
        "coll_seq_ranges": {k: (int(lo), int(hi)) for k, lo, hi in seq.iter_rows() if k is not None},
    }


def _world_meta(metas: list[dict[str, Any]], ranks: list[int], quality: QualityLog) -> dict[str, Any]:
    # world_size was range-checked by the reader (<= MAX_WORLD); the missing ranks are built as ranges, never a set
    ws = max([m.get("world_size") or 0 for m in metas] + [len(ranks)])
    missing = _missing(ranks, ws) if ws and max(ranks, default=0) < ws else []
    n_missing = sum(b - a + 1 for a, b in missing)
    if missing and n_missing < ws:
        count: dict[str, Any] = {"missing_count": n_missing} if n_missing > MISSING_LISTED else {}
        quality.add(
            "missing_ranks",
            f"ranks {_ranges_of(missing)} of {ws} are absent; cross-rank results cover only the ranks present",
            missing=[r for a, b in missing for r in range(a, b + 1)][:MISSING_LISTED],
            **count,
        )
    per_rank: list[dict[str, Any]] = []
    for m in sorted(metas, key=lambda m: (m["rank"], m.get("window") or 0)):
        props = m.get("device_props") or []
        devs = m.get("devices") or []
        dev = devs[0] if devs else None
        prop = next((p for p in props if isinstance(p, dict) and p.get("id") == dev), props[0] if props and isinstance(props[0], dict) else None)
        if any(r["rank"] == m["rank"] for r in per_rank):
            per_rank[[r["rank"] for r in per_rank].index(m["rank"])]["source_files"].append(m["source_file"])
            continue
        per_rank.append(
            {
                "rank": m["rank"],
                "device": dev,
                "device_name": (prop or {}).get("name") or m.get("gpu_name"),
                "device_props": prop,
                "source_files": [m["source_file"]],
                "format": m.get("format"),
                "backend": m.get("backend"),
                "nccl_version": m.get("nccl_version"),
                **{k: m[k] for k in ("link_gen", "link_width", "link_bw_bytes_per_s", "power_limit_w", "session_start_ns") if k in m},
            }
        )
    return {"world_size": ws, "ranks": per_rank}


def _inputs(inputs: Sequence[str | Path], out: Path, rules: str | Path | RuleSet | None,
            skipped: list[tuple[Path, str]]) -> tuple[list[Source], str | None, int]:
    """The sources (none of them the output), the rules file (validated) and the input bytes; every input noted.
    Files in an input directory that are no trace go to ``skipped`` (:func:`tracekit.ingest.discover.discover`)."""
    sources = discover(inputs, skipped)
    for s in sources:
        if s.path.resolve() == out.resolve():
            raise InputError(f"{out}: the output would overwrite an input; choose another -o")
    rules_path = str(rules) if isinstance(rules, (str, Path)) else None
    if isinstance(rules, RuleSet):
        rules_path = rules.sources[0] if rules.sources else None
    if rules_path:
        load_rules(rules_path)  # validate early, one-line error
    for s in sources:
        note_input(s.path)
    if rules_path:
        note_input(rules_path)
    in_bytes = sum(s.path.stat().st_size if s.path.is_file() else sum(f.stat().st_size for f in s.path.iterdir()) for s in sources)
    return sources, rules_path, in_bytes


def _stage_serially(stager: "_Stager", sources: list[Source], prog: "_Progress", keep_going: bool, failed: list[dict[str, Any]]) -> None:
    """Every source's ranks, in rank order, handed to the stager (``jobs=1``, one file)."""
    n = len(sources)
    for s in sorted(sources, key=lambda s: (s.rank_hint is None, s.rank_hint or 0, s.window or 0)):
        _interrupt.check("rank")
        for hand, meta_r in _ranks_or_failure(s, keep_going, failed, n > 1):
            _interrupt.check("rank")
            stager.submit(hand, meta_r, single_source=n == 1)
        prog.step(s.path.name)


@dataclass
class _Conversion:
    """One :func:`convert`: its settings, and the temporary state that :meth:`cleanup` undoes whatever happens."""

    out: Path
    force: bool
    layout: str
    rules_path: str | None
    steps_from: str | None
    executor: Executor | None
    keep_going: bool
    #: the capture's rows (``extra_frames``) as one frame, or None
    extra: pl.DataFrame | None
    #: the output file's Parquet codec (:func:`convert`)
    compression: str = "zstd"
    #: the temporary part directory, once created
    part_dir: str | None = None
    #: ``jobs=1`` file output: the staged file, until it is the output or closed for a second pass
    stager: _Stager | None = None
    #: ``layout="dataset"``: the dataset being built
    build: DatasetBuild | None = None
    #: sources that failed (``keep_going``)
    failed: list[dict[str, Any]] = field(default_factory=list)

    def make_part_dir(self, out_dir: str) -> str:
        """Create the temporary part directory in ``out_dir`` (recorded for :meth:`cleanup`)."""
        try:
            with _interrupt.deferred():  # a Ctrl-C raises once part_dir records it (then it is removed below)
                self.part_dir = part_dir = make_part_dir(out_dir)
        except OSError as e:
            raise OutputError(f"{self.out}: cannot create a temporary directory in {out_dir} {os_reason(e, writing=True)}") from None
        return part_dir

    def cleanup(self) -> None:
        """Drop the staged file if it is still open (an error), then the part directory."""
        with _interrupt.deferred():  # the cleanup itself is never cut short by a Ctrl-C (it would leave the parts)
            if self.stager is not None:
                self.stager.discard()
            if self.part_dir is not None:
                remove_part_dir(self.part_dir)


class _Footer:
    """The output's footer metadata, completed (:meth:`complete`) once the rows' time window is known, and the
    capture rows of ranks the trace lacks (``orphan``), written just before it."""

    def __init__(self, meta: dict[str, Any], quality: QualityLog, caller_q: list[Any], orphan: pl.DataFrame | None) -> None:
        self.meta, self.quality, self.caller_q, self.orphan = meta, quality, caller_q, orphan
        self.caller_codes = {q.get("code") for q in caller_q if isinstance(q, dict)}

    def complete(self, first: int | None, last: int | None) -> None:
        self.meta["window_ns"] = [first, last]
        # the capture knows more about missing ranks than the file count does: keep its flag only
        self.meta["quality"] = [q.to_json() for q in self.quality
                                if not (q.code == "missing_ranks" and "missing_ranks" in self.caller_codes)] + self.caller_q

    def finish(self, w: TraceWriter, rows: int, first: int | None, last: int | None) -> int:
        """Capture rows of ranks the trace lacks, then the footer metadata; returns the rows written."""
        if self.orphan is not None and self.orphan.height:
            w.write(self.orphan)
            rows += self.orphan.height
        self.complete(first, last)
        w.close(self.meta)
        return rows


def convert(
    inputs: Sequence[str | Path],
    out: str | Path,
    *,
    force: bool = False,
    rules: str | Path | RuleSet | None = None,
    jobs: int | None = None,
    progress: bool = False,
    extra_frames: Sequence[pl.DataFrame] = (),
    metadata: dict[str, Any] | None = None,
    on_progress: Callable[[int, int, str], None] | None = None,
    align: bool = True,
    steps_from: str | None = None,
    layout: str = "file",
    executor: Executor | None = None,
    keep_going: bool = False,
    compression: str = "zstd",
) -> ConvertResult:
    """Convert one capture's sources into ``out`` (see module docstring).

    ``layout``: ``"file"`` (one ``trace.parquet``) or ``"dataset"`` (a directory hive-partitioned by rank,
    :mod:`tracekit.ingest.dataset`). ``executor``: runs the per-source tasks (and the dataset's per-rank
    rewrites) instead of this process or a ``--jobs`` pool, e.g. a Dask client's (``tracekit.cluster``); its
    workers must reach the sources and the output's directory. ``keep_going``: a source that fails is
    flagged (``rank_failed``, ``failed_ranks`` in the metadata) and the others are converted; otherwise its
    error, naming the rank, stops the conversion.

    ``rules``: a rules file path (extends the defaults). ``extra_frames``:
    schema rows from the capture (step records, counters, markers) merged by
    rank. ``metadata``: merged into the footer metadata. ``steps_from``: a regex;
    ranges matching it are the steps instead of the built-in grammar (tracekit.steplabels). ``compression``: the
    output file's Parquet codec (``layout="file"``): zstd, or lz4 for a trace.parquet read once and removed (a
    profiler trace given to ``analyze``: ``tracekit.commands._source``).
    """
    t0 = time.perf_counter()
    tune_runtime()
    compile_steps_from(steps_from)
    out = Path(out)
    skipped: list[tuple[Path, str]] = []
    sources, rules_path, in_bytes = _inputs(inputs, out, rules, skipped)
    quality = _check_output(out, layout, force, skipped)
    out_dir = str(out.parent if str(out.parent) else ".")
    remove_stale_parts(out_dir)  # left by killed conversions (tracekit.ingest.staging)
    conv = _Conversion(out, force, layout, rules_path, steps_from, executor, keep_going, _capture_rows(extra_frames),
                       compression=compression)
    try:
        part_dir = conv.make_part_dir(out_dir)
        prog = _Progress(progress, len(sources), on_progress)
        metas = _read_sources(conv, sources, part_dir, jobs or 1, in_bytes, prog)
        prog.close()
        ranks, offsets, footer = _describe(conv, sources, metas, quality, align, metadata)
        rows = _write_output(conv, metas, ranks, offsets, footer)
    finally:
        conv.cleanup()
    return ConvertResult(out, ranks, rows, time.perf_counter() - t0, in_bytes, footer.meta, footer.meta["quality"])


def _check_output(out: Path, layout: str, force: bool, skipped: list[tuple[Path, str]]) -> QualityLog:
    """Refuse a bad ``layout`` or output before the work; returns the quality log, with the inputs skipped."""
    if layout not in ("file", "dataset"):
        raise UsageError(f"--layout {layout!r}: must be file or dataset")
    # refuse early (before the work) when the output exists, is an input, a device/FIFO/directory, or cannot be written
    check_dataset_output(out, force=force) if layout == "dataset" else check_output_path(out, force=force)
    quality = QualityLog()
    for path, why in skipped:
        quality.add("input_skipped", f"{path}: skipped, {why}", path=str(path))
    return quality


def _capture_rows(extra_frames: Sequence[pl.DataFrame]) -> pl.DataFrame | None:
    """The capture's rows (``extra_frames``, conformed to the schema) as one frame; None when there are none."""
    return pl.concat([conform(e) for e in extra_frames if e is not None and e.height], how="vertical_relaxed") if any(
        e is not None and e.height for e in extra_frames
    ) else None


def _read_sources(conv: _Conversion, sources: list[Source], part_dir: str, jobs: int, in_bytes: int,
                  prog: "_Progress") -> list[dict[str, Any]]:
    """Read and finalize every source; returns the ranks' metadata. A dataset, an executor or ``--jobs N`` over
    enough input: one task per source (:func:`_run_sources`); else one rank at a time into the staged file."""
    parallel = jobs > 1 and len(sources) > 1 and in_bytes >= _PARALLEL_MIN_BYTES
    if conv.layout == "dataset":
        conv.build = DatasetBuild(conv.out, part_dir)
    if conv.build is not None or conv.executor is not None or parallel:
        args = (conv.rules_path, part_dir, str(conv.out), conv.steps_from)
        return _run_sources(conv.executor, jobs if parallel else 1, sources, conv.build, args, prog, conv.keep_going, conv.failed)
    # one rank at a time, in rank order, written in the output format on a thread while the next
    # rank is read; the staged file becomes the output unless a second pass is needed (_write_output)
    rules_set = dataclasses.replace(load_rules(conv.rules_path) if conv.rules_path else load_rules(None), steps_from=conv.steps_from)
    windows = any(s.window is not None for s in sources)
    conv.stager = _Stager(os.path.join(part_dir, "stage.parquet"), part_dir, str(conv.out), rules_set, conv.extra, merge_extra=not windows,
                          compression=conv.compression)
    _stage_serially(conv.stager, sources, prog, conv.keep_going, conv.failed)
    conv.stager.wait_summary()  # the last rank's rows are still being written while clocks are aligned
    return conv.stager.metas


def _describe(conv: _Conversion, sources: list[Source], metas: list[dict[str, Any]], quality: QualityLog, align: bool,
              metadata: dict[str, Any] | None) -> tuple[list[int], dict[int, int], _Footer]:
    """Check the ranks read (failed, empty, unnamed, duplicate, of different captures), align their clocks and
    gather the footer metadata; returns the ranks, their clock offsets and the footer."""
    _note_failures(conv.failed, metas, quality)
    _check_empty(metas, quality)
    _resolve_ranks(metas, quality)
    _check_same_capture(metas)
    ranks = sorted({m["rank"] for m in metas})
    md = _world_meta(metas, ranks, quality)
    _rank_quality(metas, md, quality)
    offsets, align_info = _align(metas, ranks, quality, align)
    _check_skew(metas, offsets, quality)
    meta: dict[str, Any] = {
        **md,
        "source_files": [str(s.path) for s in sources],
        "clock_offsets_ns": {str(r): int(offsets.get(r, 0)) for r in ranks},
        "clock_alignment": align_info,
        "rules": conv.rules_path or "default",
    }
    if conv.steps_from is not None:
        meta["steps_from"] = conv.steps_from
    if conv.failed:
        meta["failed_ranks"] = conv.failed
    for k, v in (metadata or {}).items():
        if k == "quality":
            continue
        meta[k] = v
    caller_q = list((metadata or {}).get("quality", []))
    orphan = conv.extra.filter(~pl.col("rank").is_in(ranks)).sort(["rank", "ts_ns"]) if conv.extra is not None else None
    return ranks, offsets, _Footer(meta, quality, caller_q, orphan)


def _rank_quality(metas: list[dict[str, Any]], md: dict[str, Any], quality: QualityLog) -> None:
    """Each rank's own quality flags (from its reader); then no GPU work in any rank: CPU mode, or a warning."""
    for m in metas:
        for q in m.get("quality") or []:
            quality.add(q["code"], q["message"], severity=q.get("severity", "warning"), rank=m["rank"], **(q.get("details") or {}))
    if not any(m["gpu_ops"] for m in metas):
        if any(m.get("cpu_device_ops") for m in metas):  # CPU mode (docs/cpu_mode.md)
            md["device_mode"] = "cpu"
            quality.add("no_gpu_events", "the trace has no GPU kernels, copies or memsets; CPU mode: operators on the "
                        "forward thread and gloo collectives stand in for device work (docs/cpu_mode.md)", severity="info")
        else:
            quality.add("no_gpu_events", "the trace has no GPU kernels, copies or memsets; analyses of GPU time will be empty")


def _write_output(conv: _Conversion, metas: list[dict[str, Any]], ranks: list[int], offsets: dict[int, int],
                  footer: _Footer) -> int:
    """Write and publish the output: the dataset's partitions, the staged file as it is, or a second pass over the
    parts (:func:`_rewrite`). Returns the rows written."""
    if conv.stager is not None:
        conv.stager.wait()
    if conv.build is not None:
        rows, first, last = _finish_dataset(conv.build, metas, ranks, offsets, conv.extra, footer.orphan, conv.executor)
        footer.complete(first, last)
        _interrupt.check("publish")  # the last point a Ctrl-C stops the command: the rename commits it
        conv.build.publish(footer.meta, conv.force)
        return rows
    if conv.stager is not None and _staged_as_is(metas, offsets, conv.stager.merge_extra):
        # the staged file is the output: ranks in order, one part each, no clock offset to apply
        staged = conv.stager.path
        lo = [m["written_lo"] for m in metas if m["written_lo"] is not None]
        hi = [m["written_hi"] for m in metas if m["written_hi"] is not None]
        rows = footer.finish(conv.stager.w, sum(m["written_rows"] for m in metas), min(lo, default=None), max(hi, default=None))
        conv.stager = None
        _interrupt.check("publish")  # the last point a Ctrl-C stops the command: the rename commits it
        _publish(staged, conv.out, conv.force)
        return rows
    if conv.stager is not None:  # second pass over the staged rows: close the staged file to read it back
        conv.stager.w.close({})
        conv.stager = None
    return _rewrite(conv, metas, ranks, offsets, footer)


def _rewrite(conv: _Conversion, metas: list[dict[str, Any]], ranks: list[int], offsets: dict[int, int], footer: _Footer) -> int:
    """The second pass: each rank's parts (its windows in order) streamed into the output with its clock offset and
    the capture rows not merged yet, each part removed once read; returns the rows written."""
    rows = 0
    first: int | None = None
    last: int | None = None
    with TraceWriter(conv.out, force=conv.force, compression=conv.compression) as w:
        for r in ranks:
            _interrupt.check("rank")
            parts = sorted((m for m in metas if m["rank"] == r), key=lambda m: (m.get("window") or 0, m.get("first_ts_ns") or 0))
            merged = any(m.get("extra_merged") for m in parts)
            ex = conv.extra.filter(pl.col("rank") == r) if conv.extra is not None and not merged else None
            nr, lo_r, hi_r = write_rank(w, r, parts, offsets.get(r, 0), ex)
            rows += nr
            if lo_r is not None and hi_r is not None:  # both or neither: rows were written (ts_ns, dur_ns never null)
                first = lo_r if first is None else min(first, lo_r)
                last = hi_r if last is None else max(last, hi_r)
            for m in parts:
                for f in (m["part"] if "row_groups" not in m else None, m.get("comm_part")):
                    if f:
                        os.unlink(f)
        _interrupt.check("publish")  # the last point a Ctrl-C stops the command: close() renames the output
        rows = footer.finish(w, rows, first, last)
    return rows


def _finish_dataset(build: DatasetBuild, metas: list[dict[str, Any]], ranks: list[int], offsets: dict[int, int],
                    extra: pl.DataFrame | None, orphan: pl.DataFrame | None, executor: Executor | None) -> tuple[int, int | None, int | None]:
    """Every rank's partition and the capture rows of ranks the trace lacks (:meth:`DatasetBuild.commit`)."""
    def extra_of(r: int) -> pl.DataFrame | None:
        ex = extra.filter(pl.col("rank") == r) if extra is not None else None
        return ex if ex is not None and ex.height else None

    rows, first, last = build.commit(metas, ranks, offsets, extra_of, executor.submit if executor is not None else None)
    if orphan is not None and orphan.height:
        rows += build.write_orphans(orphan)
    return rows, first, last


def _run_sources(executor: Executor | None, jobs: int, sources: list[Source], build: DatasetBuild | None,
                 args: tuple[str | None, str, str, str | None], prog: "_Progress", keep_going: bool,
                 failed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each source as a task (:func:`tracekit.ingest.dataset.stage_source` for a dataset, else :func:`convert_source`):
    on ``executor``, else a pool of ``jobs`` worker processes, else here one after the other. Returns the ranks'
    metadata; a failure stops everything (its error names the rank) or, with ``keep_going``, goes to ``failed``."""
    rules_path, part_dir, label, steps_from = args
    order = sorted(sources, key=lambda s: (s.rank_hint is None, s.rank_hint or 0, s.window or 0))

    def task(i: int, s: Source) -> tuple[Any, ...]:
        if build is not None:
            return (stage_source, s, rules_path, steps_from, build.staged(i), label, len(sources) == 1)
        return (convert_source, s, rules_path, part_dir, label, steps_from)

    metas: list[dict[str, Any]] = []
    if executor is None and jobs <= 1:
        for i, s in enumerate(order):
            _interrupt.check("rank")
            try:
                fn, *a = task(i, s)
                metas.extend(fn(*a))
            except Exception as e:  # noqa: BLE001 - named and re-raised (or kept, --keep-going) by _failure
                failed.append(_failure(s, e, keep_going, len(order) > 1))
            prog.step(s.path.name)
        return metas
    own = _process_pool(jobs) if executor is None else None
    ex = own if own is not None else executor
    assert ex is not None
    try:
        with _interrupt.blocked():  # worker processes start with SIGINT blocked (the parent handles Ctrl-C)
            futs = {ex.submit(*task(i, s)): (i, s) for i, s in enumerate(order)}
        got: dict[int, list[dict[str, Any]]] = {}
        for f in _as_completed(futs):
            i, s = futs[f]
            try:
                got[i] = f.result()
            except Exception as e:  # noqa: BLE001
                failed.append(_failure(s, e, keep_going, len(order) > 1))
            prog.step(str(s.path.name))
        metas = [m for i in sorted(got) for m in got[i]]  # in source order, whatever order the tasks ended in
        failed.sort(key=lambda f: (f["rank"] is None, f["rank"] or 0, f["source_file"]))
    except BaseException:
        if own is not None:
            _stop_pool(own)  # Ctrl-C / an error: do not wait for the other ranks' workers
        else:
            for f in futs if "futs" in locals() else ():
                f.cancel()
        raise
    if own is not None:
        own.shutdown(wait=True)
    return metas


def _process_pool(jobs: int) -> ProcessPoolExecutor:
    import multiprocessing as mp

    from tracekit.ingest._workers import init_worker, worker_threads

    # each worker gets its share of the cores (set before the worker imports polars)
    return ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn"), initializer=init_worker,
                               initargs=(worker_threads(jobs),))


def _failure(src: Source, e: BaseException, keep_going: bool, many: bool = True) -> dict[str, Any]:
    """A source that failed: raised as a one-line error naming its rank (``many``: among several sources), or
    (``keep_going``) returned as the record kept in ``failed_ranks``."""
    from tracekit.schema import first_line

    if _interrupt.is_interrupt(e):
        raise e
    msg = str(e) if isinstance(e, TracekitError) else f"{src.path}: conversion failed ({first_line(e)})"
    r = src.rank_hint
    where = f"rank {r}" if r is not None else f"{src.path.name}"
    if not keep_going:
        named = msg if (r is None or not many or f"rank {r}" in msg) else f"{where}: {msg}"
        if isinstance(e, TracekitError):
            raise type(e)(named) from None
        raise InputError(named) from None
    return {"rank": r, "source_file": str(src.path), "error": msg}


def _ranks_or_failure(src: Source, keep_going: bool, failed: list[dict[str, Any]],
                      many: bool) -> Iterator[tuple[list[pl.DataFrame], dict[str, Any]]]:
    """:func:`_raw_ranks` of ``src``; a read that fails is named by :func:`_failure` (kept under ``keep_going``)."""
    it = _raw_ranks(src)
    while True:
        try:
            item = next(it)
        except StopIteration:
            return
        except Exception as e:  # noqa: BLE001
            failed.append(_failure(src, e, keep_going, many))
            return
        yield item


def _note_failures(failed: list[dict[str, Any]], metas: list[dict[str, Any]], quality: QualityLog) -> None:
    """Sources that failed under ``--keep-going``: one ``rank_failed`` flag each; all of them failed: the first error."""
    if failed and not metas:
        raise InputError(f"{failed[0]['error']} (every source failed)")
    for f in failed:
        where = f"rank {f['rank']}" if f["rank"] is not None else Path(f["source_file"]).name
        quality.add("rank_failed", f"{where} was not converted ({f['error']}); results cover the other ranks",
                    severity="error", rank=f["rank"])


def _as_completed(futs: dict[Any, Any]) -> Iterator[Any]:
    """``as_completed`` in bounded waits with an interrupt check between them (a blocked wait hears no Ctrl-C)."""
    from concurrent.futures import FIRST_COMPLETED, wait

    left = set(futs)
    while left:
        _interrupt.check("rank")
        done, left = wait(left, timeout=0.1, return_when=FIRST_COMPLETED)
        yield from done


def _stop_pool(ex: ProcessPoolExecutor) -> None:
    """Cancel queued ranks and kill the running workers (their parts are in the part directory, removed after)."""
    procs = list(getattr(ex, "_processes", {}).values())
    ex.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        try:
            p.kill()
        except Exception:  # noqa: BLE001 - already gone
            pass
    for p in procs:
        p.join(5)


def _staged_as_is(metas: list[dict[str, Any]], offsets: dict[int, int], merged_extra: bool) -> bool:
    """Whether the staged file can be the output unchanged: each rank written once, in increasing
    rank order, under its final rank number, with no clock offset to apply and capture rows merged."""
    if not merged_extra or any(offsets.values()):
        return False
    written = [m["written_rank"] for m in metas]
    return all(m["written_rank"] == m["rank"] for m in metas) and all(a < b for a, b in zip(written, written[1:]))


def _publish(staged: str, out: Path, force: bool) -> None:
    """Move the finished staged file to ``out`` (same directory tree: an atomic rename)."""
    try:
        with _interrupt.committing():  # a Ctrl-C before the rename stops the command; after it, it succeeded
            check_output_path(out, force=force)
            os.replace(staged, out)
    except OSError as e:
        raise OutputError(f"{out}: cannot write {os_reason(e, writing=True)}") from None


#: First events of two ranks further apart than this: files of different captures (refused).
MIXED_CAPTURE_NS = _MIXED_NS
#: Clock offsets (applied or suspected) at least this large are reported as host clock skew.
SKEW_WARN_NS = 100 * 10**6


def _check_empty(metas: list[dict[str, Any]], quality: QualityLog) -> None:
    """No events at all: refuse. Some ranks empty: flag them (they count as present)."""
    empty = [m for m in metas if not m.get("rows")]
    if not empty:
        return
    if len(empty) == len(metas):
        names = empty[0]["source_file"] if len(empty) == 1 else (
            ", ".join(Path(m["source_file"]).name for m in empty[:4]) + (" ..." if len(empty) > 4 else ""))
        raise InputError(
            f"{names}: the trace has no events; the profiler recorded nothing (check its schedule and that the workload ran while it was active)"
        )
    for m in empty:
        quality.add("empty_rank", f"{Path(m['source_file']).name}: no events recorded for this rank; its results are empty",
                    rank=m["rank"] if m["rank"] != -1 else None)


def _first_by_rank(metas: list[dict[str, Any]]) -> dict[int, tuple[int, str]]:
    first: dict[int, tuple[int, str]] = {}
    for m in metas:
        t = m.get("first_ts_ns")
        if t is None:
            continue
        if m["rank"] not in first or t < first[m["rank"]][0]:
            first[m["rank"]] = (int(t), Path(m["source_file"]).name)
    return first


def _human_s(ns: int) -> str:
    s = ns / 1e9
    return f"{s / 3600:.1f} h" if s >= 3600 else (f"{s / 60:.1f} min" if s >= 60 else f"{s:.2f} s")


def _check_same_capture(metas: list[dict[str, Any]]) -> None:
    """Ranks whose first events are more than MIXED_CAPTURE_NS apart come from different captures."""
    first = _first_by_rank(metas)
    if len(first) < 2:
        return
    lo = min(first, key=lambda r: (first[r][0], r))
    hi = max(first, key=lambda r: (first[r][0], -r))
    gap = first[hi][0] - first[lo][0]
    if gap > MIXED_CAPTURE_NS:
        raise InputError(
            f"rank {hi} ({first[hi][1]}) starts {_human_s(gap)} after rank {lo} ({first[lo][1]}): files from different "
            "captures are mixed (or a host clock is that far off); pass the files of one capture"
        )


def _check_skew(metas: list[dict[str, Any]], offsets: dict[int, int], quality: QualityLog) -> None:
    """Warn about host clock skew: large alignment offsets, or ranks far apart that could not be aligned."""
    big = {r: o for r, o in offsets.items() if abs(o) >= SKEW_WARN_NS}
    if big:
        parts = ", ".join(f"rank {r} {'ahead' if o < 0 else 'behind'} by {abs(o) / 1e9:.3f} s" for r, o in sorted(big.items()))
        quality.add("clock_skew", f"host clocks disagree: {parts} (corrected from collective end times); "
                    "synchronize the hosts' clocks (NTP/PTP)", offsets_ns={str(r): o for r, o in big.items()})
        return
    first = _first_by_rank(metas)
    if len(first) < 2 or any(offsets.values()):
        return
    spread = max(t for t, _ in first.values()) - min(t for t, _ in first.values())
    if spread >= 10 * SKEW_WARN_NS:
        quality.add("clock_skew_suspected", f"ranks' first events are {_human_s(spread)} apart and no collectives could align "
                    "their clocks; cross-rank timings may be off by up to that much", spread_ns=spread)


def _align(metas: list[dict[str, Any]], ranks: list[int], quality: QualityLog, enabled: bool) -> tuple[dict[int, int], dict[str, Any]]:
    """Per-rank clock offsets from matched collective end times (small cross-rank pass)."""
    if not enabled or len(ranks) < 2:
        return {}, {"applied": False, "reason": "single rank" if len(ranks) < 2 else "disabled"}
    from tracekit.core.align import align_clocks

    comm_parts = [pl.read_parquet(m["comm_part"]) for m in metas if m.get("comm_part")]
    if not comm_parts:
        return {}, {"applied": False, "reason": "no collectives"}
    comm = pl.concat(comm_parts, how="vertical_relaxed")
    if comm.height == 0:
        return {}, {"applied": False, "reason": "no collectives"}
    res = align_clocks(comm)
    for q in res.quality:
        quality.append(q)
    info = res.to_json()
    return ({int(k): int(v) for k, v in res.offsets_ns.items()} if res.applied else {}), info


#: ranks listed in a missing_ranks flag's details (its count is always given)
MISSING_LISTED = 4096


def _missing(present: list[int], ws: int) -> list[tuple[int, int]]:
    """Ranges ``(a, b)`` (inclusive) of ``range(ws)`` not in ``present`` (sorted), without a set of ``ws`` elements."""
    out, nxt = [], 0
    for r in sorted(set(present)):
        if r >= ws:
            break
        if r > nxt:
            out.append((nxt, r - 1))
        nxt = r + 1
    if nxt < ws:
        out.append((nxt, ws - 1))
    return out


def _ranges_of(rs: list[tuple[int, int]], limit: int = 12) -> str:
    parts = [str(a) if a == b else f"{a}-{b}" for a, b in rs[:limit]]
    return ", ".join(parts) + (f", ... ({len(rs) - limit} more ranges)" if len(rs) > limit else "")


def _ranges(xs: list[int]) -> str:
    """[2,3,4,7] -> '2-4, 7'."""
    out, i = [], 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        out.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ", ".join(out)


def _resolve_ranks(metas: list[dict[str, Any]], quality: QualityLog) -> None:
    unknown = [m for m in metas if m["rank"] == -1]
    if unknown:
        if len(metas) == 1:
            metas[0]["rank"] = 0
            quality.add("rank_assumed", f"{Path(metas[0]['source_file']).name}: no rank in the trace or file name; assumed rank 0", severity="info")
            _set_rank(metas[0], 0)
        else:
            names = ", ".join(Path(m["source_file"]).name for m in unknown)
            raise InputError(f"{names}: no rank in distributedInfo or the file name; rename files as rank<N>.json.gz or convert them separately")
    seen: dict[int, dict[str, Any]] = {}
    for m in metas:
        r = m["rank"]
        if r in seen and (m.get("window") is None or seen[r].get("window") is None):
            raise InputError(
                f"duplicate rank {r}: {Path(seen[r]['source_file']).name} and {Path(m['source_file']).name}; pass the files of one capture"
            )
        seen.setdefault(r, m)


def _set_rank(m: dict[str, Any], rank: int) -> None:
    m["rank"] = rank  # the part's rank column is replaced while it is streamed into the output


class _Progress:
    def __init__(self, enabled: bool, total: int, cb: Callable[[int, int, str], None] | None) -> None:
        self.total, self.done, self.cb = total, 0, cb
        self._p = None
        if enabled and total > 1:
            from rich.progress import Progress

            self._p = Progress(transient=True)
            self._p.start()
            self._task = self._p.add_task("converting ranks", total=total)

    def step(self, label: str) -> None:
        self.done += 1
        if self._p is not None:
            self._p.update(self._task, advance=1, description=f"converted {label}")
        if self.cb:
            self.cb(self.done, self.total, label)

    def close(self) -> None:
        if self._p is not None:
            self._p.stop()


def parquet_rows(path: str | Path) -> int:
    rows: int = pq.read_metadata(path).num_rows
    return rows
