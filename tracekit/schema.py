"""The ``trace.parquet`` contract: Arrow schema, version, metadata, atomic IO.

One file holds every rank, every event kind, telemetry counters and the run
metadata (JSON in the Parquet footer under the key ``tracekit``). Rows are
sorted by ``(rank, ts_ns)``; each rank is written as its own row group(s), so a
reader can stream one rank at a time.

The machine-readable column table is ``schemas/trace_v1.json``; a test checks
that :data:`ARROW_SCHEMA` matches it. Old files load with nulls for columns
added later; files from a newer major schema version are refused.

Many ranks can also be stored as a **directory dataset**, hive-partitioned by rank:
``<dir>/rank=<r>/part-<k>.parquet`` (each part in :data:`ARROW_SCHEMA`, its ``rank`` column equal to
the directory's, rows sorted by ``ts_ns``) plus the footer metadata once, in ``<dir>/_common_metadata``
(a Parquet footer without rows: the schema and the same ``tracekit`` JSON). :func:`read_metadata`,
:func:`scan_trace` and :func:`read_trace` read either; polars (``pl.scan_parquet("<dir>/rank=*/*.parquet",
hive_partitioning=True)``), pyarrow and Spark read the directory as it is.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import stat
import tempfile
from pathlib import Path
from typing import Any, Iterable, Mapping, TypedDict, cast

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from tracekit import __version__
from tracekit._errors import InputError, OutputError, RankError, UsageError, os_reason
from tracekit.enums import CATEGORIES, GPU_OP_KINDS, KINDS  # re-exported: the column vocabularies
from tracekit.trace_check import check_data, check_footer, first_line  # first_line: re-exported (analysis uses it)
from tracekit._inputs import DATASET_META, guard_inputs, is_dataset, is_input, note_input, note_output, profiler_source, published_outputs

__all__ = [
    "TraceMeta", "RankMeta", "CaptureMeta", "as_trace_meta",
    "SCHEMA_VERSION",
    "ARROW_SCHEMA",
    "POLARS_SCHEMA",
    "COLUMNS",
    "KINDS",
    "GPU_OP_KINDS",
    "CATEGORIES",
    "META_KEY",
    "empty_frame",
    "conform",
    "frame_from_rows",
    "TraceWriter",
    "write_trace",
    "read_trace",
    "scan_trace",
    "open_trace",
    "read_metadata",
    "atomic_path",
    "guard_inputs",
    "note_input",
    "note_output",
    "published_outputs",
    "trace_ranks",
    "first_line",
    "rank_where",
    "check_output_path",
    "DATASET_META",
    "is_dataset",
    "dataset_parts",
    "write_dataset_meta",
]

SCHEMA_VERSION = 1
#: ranks are int32 in the trace
MAX_RANK = 2**31 - 1
META_KEY = b"tracekit"
#: footer key of one partition of a directory dataset (``{"rank": r}``): a lone part is not a trace
PART_KEY = b"tracekit_part"
_RANK_DIR = re.compile(r"^rank=(\d+)$")
_PART_FILE = re.compile(r"^part-(\d+)\.parquet$")

_D = pa.dictionary(pa.int32(), pa.string())

# name, arrow type, nullable, unit, meaning
COLUMNS: list[tuple[str, pa.DataType, bool, str, str]] = [
    ("rank", pa.int32(), False, "", "global rank of the process that recorded the row"),
    ("kind", _D, False, "", "row kind, one of KINDS"),
    ("ts_ns", pa.int64(), False, "ns", "start, absolute Unix-epoch ns (CLOCK_REALTIME), clock-aligned across ranks"),
    ("dur_ns", pa.int64(), False, "ns", "duration; 0 for counters and instants"),
    ("device", pa.int32(), True, "", "CUDA device ordinal as seen by the process"),
    ("stream", pa.int64(), True, "", "CUDA stream id (GPU ops, syncs, gpu ranges)"),
    ("pid", pa.int64(), True, "", "process id (CPU rows); Kineto device pid for GPU rows"),
    ("tid", pa.int64(), True, "", "thread id (CPU rows); Kineto lane for GPU rows"),
    ("name", _D, False, "", "event name as recorded (kernel names demangled when the source did)"),
    ("category", _D, True, "", "GPU ops: breakdown category, one of CATEGORIES"),
    ("family", _D, True, "", "GPU ops: id of the first matching rule (e.g. allreduce.nccl), 'other' if none"),
    ("correlation", pa.int64(), True, "", "CUPTI correlation id linking a runtime call to the GPU op(s) it launched"),
    ("external_id", pa.int64(), True, "", "Kineto External id linking CPU ops to their runtime calls"),
    ("graph_id", pa.int64(), True, "", "CUDA graph id for kernels replayed from a graph"),
    ("graph_node_id", pa.int64(), True, "", "CUDA graph node id when the source records it"),
    ("launch_ts_ns", pa.int64(), True, "ns", "GPU ops: start of the launching runtime call (cudaLaunchKernel/cudaGraphLaunch/...)"),
    ("launch_dur_ns", pa.int64(), True, "ns", "GPU ops: duration of the launching runtime call"),
    ("launch_tid", pa.int64(), True, "", "GPU ops: thread of the launching runtime call"),
    ("launch_name", _D, True, "", "GPU ops: name of the launching runtime call"),
    ("grid_x", pa.int32(), True, "", "kernel grid size x"),
    ("grid_y", pa.int32(), True, "", "kernel grid size y"),
    ("grid_z", pa.int32(), True, "", "kernel grid size z"),
    ("block_x", pa.int32(), True, "", "kernel block size x"),
    ("block_y", pa.int32(), True, "", "kernel block size y"),
    ("block_z", pa.int32(), True, "", "kernel block size z"),
    ("registers_per_thread", pa.int32(), True, "", "kernel registers per thread"),
    ("shared_mem_bytes", pa.int64(), True, "bytes", "kernel static + dynamic shared memory"),
    ("bytes", pa.int64(), True, "bytes", "memcpy/memset size"),
    ("memcpy_kind", _D, True, "", "HtoD, DtoH, DtoD, PtoP, HtoH or other"),
    ("src_mem", _D, True, "", "memcpy source memory kind (Pageable, Pinned, Device, ...)"),
    ("dst_mem", _D, True, "", "memcpy destination memory kind"),
    ("coll_name", _D, True, "", "collective name (allreduce, allgather, reduce_scatter, broadcast, send, recv, ...)"),
    ("coll_in_nelems", pa.int64(), True, "elements", "collective input element count"),
    ("coll_out_nelems", pa.int64(), True, "elements", "collective output element count"),
    ("coll_dtype", _D, True, "", "collective element dtype as recorded (Float, BFloat16, ...)"),
    ("coll_group_size", pa.int32(), True, "", "number of ranks in the collective's process group"),
    ("pg_name", _D, True, "", "process group name"),
    ("pg_desc", _D, True, "", "process group description"),
    ("pg_ranks", _D, True, "", "process group ranks as a JSON list string, e.g. [0, 1]"),
    ("coll_seq", pa.int64(), True, "", "collective GPU ops: 0-based sequence number within (rank, process group)"),
    ("step_id", pa.int64(), True, "", "step rows: step number; other rows: the step whose range launched them"),
    ("step_mode", _D, True, "", "step rows: DECODE, EXTEND, MIXED, IDLE, TARGET_VERIFY, DRAFT, PREFILL, TRAIN ..."),
    ("batch_size", pa.int32(), True, "requests", "step rows: batch size"),
    ("tokens", pa.int64(), True, "tokens", "step rows: tokens processed by the forward"),
    ("profiled", pa.bool_(), True, "", "step rows: true when the profiler was recording during the step"),
    ("value", pa.float64(), True, "see name", "counter rows: sample value; the unit is the suffix of name"),
    ("input_dims", pa.string(), True, "", "cpu_op rows with record_shapes: JSON list of input shapes"),
    ("input_types", pa.string(), True, "", "cpu_op rows with record_shapes: JSON list of input dtypes"),
    ("src", _D, True, "", "where the row came from: Kineto cat, NVTX domain, tracekit component"),
]

#: Columns every trace.parquet of any version has; a file without them is refused.
REQUIRED_COLUMNS = ("rank", "kind", "ts_ns", "dur_ns", "name")

ARROW_SCHEMA = pa.schema([pa.field(n, t, nullable=nl) for n, t, nl, _u, _m in COLUMNS])
COLUMN_NAMES = [c[0] for c in COLUMNS]


def _pl_dtype(t: pa.DataType) -> pl.DataType:
    if pa.types.is_dictionary(t):
        return pl.Categorical()
    return {
        pa.int32(): pl.Int32(),
        pa.int64(): pl.Int64(),
        pa.float64(): pl.Float64(),
        pa.bool_(): pl.Boolean(),
        pa.string(): pl.String(),
    }[t]


POLARS_SCHEMA: dict[str, pl.DataType] = {n: _pl_dtype(t) for n, t, _nl, _u, _m in COLUMNS}


def empty_frame() -> pl.DataFrame:
    """An empty frame with the full v1 schema."""
    return pl.DataFrame(schema=POLARS_SCHEMA)


def conform(df: pl.DataFrame) -> pl.DataFrame:
    """Add missing columns as nulls, cast present ones, order as the schema.

    Categorical-ish columns may be given as plain strings.
    """
    exprs = []
    have = df.schema  # once: building a frame's schema costs ~1 ms (it was built twice per column)
    for name, dtype in POLARS_SCHEMA.items():
        if name in have:
            col = pl.col(name)
            if isinstance(dtype, pl.Categorical) and have[name] != pl.Categorical:
                col = col.cast(pl.String).cast(dtype)
            elif have[name] != dtype:
                col = col.cast(dtype)
            exprs.append(col.alias(name))
        else:
            exprs.append(pl.lit(None, dtype=dtype).alias(name))
    return df.select(exprs)


def frame_from_rows(rows: Iterable[Mapping[str, Any]]) -> pl.DataFrame:
    """Build a schema-conformant frame from dicts (tests, small sources)."""
    rows = list(rows)
    if not rows:
        return empty_frame()
    keys: list[str] = []
    for r in rows:
        for k in r:
            if k not in keys:
                if k not in POLARS_SCHEMA:
                    raise ValueError(f"unknown trace column {k!r}")
                keys.append(k)
    data = {k: [r.get(k) for r in rows] for k in keys}
    schema = {k: (pl.String if isinstance(POLARS_SCHEMA[k], pl.Categorical) else POLARS_SCHEMA[k]) for k in keys}
    return conform(pl.DataFrame(data, schema=schema, strict=False))


def to_arrow(df: pl.DataFrame) -> pa.Table:
    """A frame as an Arrow table in exactly :data:`ARROW_SCHEMA` (conformed first)."""
    df = conform(df)
    tbl = df.to_arrow()
    cols = []
    for field in ARROW_SCHEMA:
        col = tbl.column(field.name)
        if pa.types.is_dictionary(field.type):
            if not pa.types.is_dictionary(col.type):
                col = col.cast(pa.string()).dictionary_encode()
            col = col.cast(field.type)
        elif col.type != field.type:
            col = col.cast(field.type)
        cols.append(col)
    return pa.Table.from_arrays(cols, schema=ARROW_SCHEMA)


_to_arrow = to_arrow


class RankMeta(TypedDict, total=False):
    """Footer metadata of one rank (``TraceMeta.ranks``)."""

    rank: int
    device: int | str  # an ordinal, or what tracekit capture writes ("cuda:0")
    device_name: str
    device_props: dict[str, Any]
    source_files: list[str]
    format: str  # "kineto" | "nsys-sqlite" | "nsys-parquetdir" | ...
    backend: str | None
    nccl_version: str | None
    session_start_ns: int
    base_time_ns: int
    source_file: str
    link_gen: int  # PCIe generation of the GPU's link
    link_width: int  # PCIe lanes
    link_bw_bytes_per_s: float  # measured or NVML-derived link bandwidth (else derived from gen x width)
    power_limit_w: float
    nvlink: bool  # the GPU has NVLink
    # read when a footer provides them (tracekit's converters do not write them): they override the GPU table
    nvlink_bytes_per_s: float
    nvlink_bw_bytes_per_s: float
    nvlink_active: bool


class CaptureMeta(TypedDict, total=False):
    """What ``tracekit capture`` recorded about the run (``TraceMeta.capture``)."""

    profiler_windows: list[list[int]]  # absolute ns [start, end) of each profiler window
    window_ns: list[int]
    workload: dict[str, Any]
    host_cpus: int
    duration_s: float
    target: str  # the program or server captured
    mode: str  # "builtin" | "program" | "sglang"
    ground_truth: dict[str, Any]


class TraceMeta(TypedDict, total=False):
    """The run metadata in ``trace.parquet``'s footer (JSON under :data:`META_KEY`), typed.

    Every key is optional (old files load with defaults); a reader uses ``meta.get(key)``.
    ``schemas/trace_v1.md`` documents each field."""

    schema_version: int
    tool_version: str
    world_size: int
    device_mode: str  # "gpu" | "cpu"
    ranks: list[RankMeta]
    source_files: list[str]
    clock_offsets_ns: dict[str, int]
    clock_alignment: dict[str, Any]
    rules: str
    window_ns: list[int]  # capture window, absolute ns
    capture: CaptureMeta
    quality: list[dict[str, Any]]
    steps_from: str
    serve: dict[str, Any]
    telemetry: dict[str, Any]
    clock_residual_ns: float
    failed_ranks: list[dict[str, Any]]  # ranks a --keep-going convert could not write: {rank, message}
    sglang_server_info: dict[str, Any]
    version_history: list[int]
    device_name: str  # one GPU name for the whole job: read only when ``ranks`` names none (other tools' footers)


def as_trace_meta(meta: Mapping[str, Any] | None) -> TraceMeta:
    """A caller's metadata mapping (the library's in-memory entry points) as :class:`TraceMeta`: a shallow copy.

    Its values are not checked here; a file's footer is, by :func:`read_metadata`."""
    return cast(TraceMeta, dict(meta or {}))


def _base_metadata() -> dict[str, Any]:
    return {"schema_version": SCHEMA_VERSION, "tool_version": __version__}


def _file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def check_output_path(final: str | os.PathLike[str], *, force: bool) -> None:
    """Refuse an output target that is an input, not a regular file, or exists without ``force``.

    Raises :class:`UsageError` (the output is an input of this command) or :class:`OutputError`.
    """
    final = Path(final)
    try:
        st = os.stat(final)
    except FileNotFoundError:
        st = None
    except OSError as e:  # a symlink loop, a path through a file, a permission error on the directory
        raise OutputError(f"{final}: cannot use as output {os_reason(e, writing=True)}") from None
    if st is not None:
        if is_input(st):
            raise UsageError(f"{final}: the output would overwrite an input; choose another -o")
        if not stat.S_ISREG(st.st_mode):
            kind = _file_kind(st.st_mode)
            hint = f"; name a file inside it, e.g. {final / 'trace.parquet'}" if kind == "a directory" else "; -o must name a regular file"
            raise OutputError(f"{final}: is {kind}, not a file; refusing to replace it{hint}")
        if not force:
            raise OutputError(f"{final}: exists; pass --force to overwrite")
    parent = final.parent if str(final.parent) else Path(".")
    if not parent.exists():
        raise OutputError(f"{final}: directory {parent} does not exist; create it first")
    if not parent.is_dir():
        raise OutputError(f"{final}: {parent} is not a directory; choose another -o")


class atomic_path:
    """Context manager: yields a temp path next to ``final``; renames on success.

    Refuses to overwrite an existing file unless ``force``. On error the temp
    file is removed and the destination is untouched. ``commit``: the rename
    publishes the command's output, so a Ctrl-C stops the command before it and
    none after it (:func:`tracekit._interrupt.committing`); False for staging files.
    """

    def __init__(self, final: str | os.PathLike[str], *, force: bool = False, suffix: str = "", commit: bool = True) -> None:
        self.final = Path(final)
        self.force = force
        self.commit = commit
        self.suffix = suffix or self.final.suffix
        self.tmp: Path | None = None

    def __enter__(self) -> Path:
        check_output_path(self.final, force=self.force)
        parent = self.final.parent if str(self.final.parent) else Path(".")
        from tracekit import _interrupt

        try:
            with _interrupt.deferred():  # a Ctrl-C raises once self.tmp records the file (never a leaked temp file)
                try:
                    fd, name = tempfile.mkstemp(prefix=f".{self.final.name}.", suffix=self.suffix + ".tmp", dir=parent)
                except OSError as e:
                    raise OutputError(f"{self.final}: cannot create a file in {parent} {os_reason(e, writing=True)}") from None
                os.close(fd)
                self.tmp = Path(name)
        except BaseException:
            if self.tmp is not None:  # __exit__ is not called when __enter__ raises
                self._drop()
            raise
        return self.tmp

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        assert self.tmp is not None
        if exc_type is None:
            from tracekit import _interrupt

            try:
                with _interrupt.committing() if self.commit else contextlib.nullcontext():
                    check_output_path(self.final, force=self.force)  # it may have changed while the output was made
                    umask = os.umask(0)
                    os.umask(umask)
                    os.chmod(self.tmp, 0o666 & ~umask)  # mkstemp creates 0600; outputs get the usual mode
                    os.replace(self.tmp, self.final)
                if self.commit:
                    note_output(self.final)
            except BaseException as e:
                self._drop()
                if isinstance(e, OSError):
                    raise OutputError(f"{self.final}: cannot write {os_reason(e, writing=True)}") from None
                raise
        else:
            self._drop()
            if exc_type is not None and issubclass(exc_type, OSError) and isinstance(exc, OSError) and exc.errno is not None:
                # disk full / permission / I/O error while the caller wrote the temp file: one line, no traceback
                raise OutputError(f"{self.final}: cannot write {os_reason(exc, writing=True)}") from None

    def _drop(self) -> None:
        assert self.tmp is not None
        try:
            self.tmp.unlink()
        except FileNotFoundError:
            pass


#: Parquet dictionary encoding: the string columns only (trying it on every integer column cost ~25% of write time)
DICT_COLUMNS = [f.name for f in ARROW_SCHEMA if pa.types.is_dictionary(f.type) or pa.types.is_string(f.type)]
#: min/max statistics for the columns readers filter on (row groups skipped by rank, time, kind, category, step)
STATS_COLUMNS = ["rank", "ts_ns", "dur_ns", "kind", "category", "family", "step_id", "device"]


class TraceWriter:
    """Streaming writer: add one rank's (or one chunk's) frame at a time.

    Memory stays bounded by the largest chunk. Call :meth:`close` with the run
    metadata; the file appears (atomically) only then.
    """

    def __init__(self, path: str | os.PathLike[str], *, force: bool = False, row_group_size: int = 1 << 20,
                 label: str | None = None, final: bool = True, part_rank: int | None = None,
                 compression: str = "zstd") -> None:
        """``label``: the file errors name (default ``path``), e.g. the output a staging file becomes;
        ``compression``: Parquet's codec (zstd: the smallest files; lz4 for a file read once, right away);
        ``final``: False for a staging file (its close is not the command's commit, see :class:`atomic_path`);
        ``part_rank``: the file is rank ``part_rank``'s partition of a directory dataset (its footer says so
        under :data:`PART_KEY`; the dataset's metadata is written once, by :func:`write_dataset_meta`)."""
        self._part_rank = part_rank
        self._atomic = atomic_path(path, force=force, commit=final)
        self._label = label or str(path)
        self._tmp = self._atomic.__enter__()
        self._writer: pq.ParquetWriter | None = None
        self._row_group_size = row_group_size
        self._compression = compression
        self.rows = 0
        #: row groups written so far (each :meth:`write` adds ceil(rows / row_group_size))
        self.row_groups = 0

    def write(self, df: pl.DataFrame | pa.Table) -> None:
        tbl = df if isinstance(df, pa.Table) else _to_arrow(df)
        if tbl.schema != ARROW_SCHEMA:
            tbl = _to_arrow(pl.from_arrow(tbl))  # type: ignore[arg-type]
        try:
            if self._writer is None:
                self._writer = pq.ParquetWriter(
                    self._tmp, ARROW_SCHEMA, compression=self._compression, use_dictionary=DICT_COLUMNS,
                    write_statistics=STATS_COLUMNS,
                )
            self._writer.write_table(tbl, row_group_size=self._row_group_size)
        except OSError as e:
            self._io_failed(e)
        self.rows += tbl.num_rows
        self.row_groups += -(-tbl.num_rows // self._row_group_size)

    def _io_failed(self, e: OSError) -> None:
        """Disk full, quota, I/O error: drop the temp file, keep any old output, one-line OutputError."""
        self.abort()
        raise OutputError(f"{self._label}: cannot write {os_reason(e, writing=True)}") from None

    def close(self, metadata: Mapping[str, Any] | None = None) -> None:
        meta = _base_metadata()
        meta.update(metadata or {})
        meta["schema_version"] = SCHEMA_VERSION
        try:
            if self._writer is None:
                self._writer = pq.ParquetWriter(self._tmp, ARROW_SCHEMA, compression=self._compression)
            if self._part_rank is None:
                self._writer.add_key_value_metadata({META_KEY.decode(): json.dumps(meta, default=str)})
            else:
                part = {"rank": self._part_rank, "schema_version": SCHEMA_VERSION}
                self._writer.add_key_value_metadata({PART_KEY.decode(): json.dumps(part)})
            self._writer.close()
            self._atomic.__exit__(None, None, None)
        except OSError as e:
            self._io_failed(e)

    def discard_file(self) -> None:
        """Remove the temp file without touching the writer (another thread may still be inside a write)."""
        self._atomic.__exit__(RuntimeError, None, None)

    def abort(self) -> None:
        if self._writer is not None:
            try:
                self._writer.close()
            except Exception:  # noqa: BLE001 - best effort on the error path
                pass
        self._atomic.__exit__(RuntimeError, None, None)

    def __enter__(self) -> "TraceWriter":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if exc_type is not None:
            self.abort()


def write_trace(
    df: pl.DataFrame, path: str | os.PathLike[str], metadata: Mapping[str, Any] | None = None, *, force: bool = False
) -> None:
    """Write a whole frame as ``trace.parquet`` (sorted by rank, ts_ns), atomically."""
    df = conform(df).sort(["rank", "ts_ns"], maintain_order=True)
    w = TraceWriter(path, force=force)
    try:
        for part in df.partition_by("rank", maintain_order=True) if df.height else [df]:
            w.write(part)
        w.close(metadata)
    except BaseException:
        w.abort()
        raise


def check_input_file(p: Path) -> None:
    """Refuse an input that is not a readable regular file (a FIFO or device would block or never end)."""
    try:
        st = os.stat(p)
    except OSError as e:
        raise InputError(f"{p}: cannot read {os_reason(e, writing=False)}") from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError(f"{p}: is a directory; pass a trace.parquet file")
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{p}: is {_file_kind(st.st_mode)}, not a file; pass the trace file itself")
    if not os.access(p, os.R_OK):
        raise InputError(f"{p}: cannot read (Permission denied); check the file's permissions")


def read_metadata(path: str | os.PathLike[str]) -> TraceMeta:
    """Run metadata from the footer of a ``trace.parquet``, or from ``_common_metadata`` of a directory
    dataset; raises InputError for non-trace files, a dataset partition on its own, newer versions."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: no such file; check the path")
    if p.is_dir():
        return _dataset_metadata(p)
    check_input_file(p)
    note_input(p)
    try:
        md = pq.read_metadata(p).metadata or {}
    except Exception as e:  # noqa: BLE001
        src = profiler_source(p)
        if src is not None:
            raise InputError(f"{p}: is {src}, not a trace.parquet; convert it first: tracekit convert {shlex.quote(str(p))} -o trace.parquet") from None
        raise InputError(f"{p}: not a Parquet file ({type(e).__name__}); pass a trace.parquet written by tracekit") from None
    if md.get(META_KEY) is None and PART_KEY in md:
        raise InputError(f"{p}: is one partition of a tracekit dataset, not a trace; pass the dataset directory {p.parent.parent}")
    return _parse_meta(p, md.get(META_KEY))


def _parse_meta(p: Path, raw: bytes | None) -> TraceMeta:
    if raw is None:
        raise InputError(f"{p}: Parquet file without tracekit metadata; convert the source with `tracekit convert`")
    try:
        meta: Any = json.loads(raw)
    except ValueError:
        raise InputError(f"{p}: corrupt tracekit metadata in the footer; re-convert the source") from None
    if not isinstance(meta, dict):
        raise InputError(f"{p}: corrupt tracekit metadata in the footer (not an object); re-convert the source")
    return cast(TraceMeta, check_footer(meta, p, SCHEMA_VERSION))


def _dataset_metadata(p: Path) -> TraceMeta:
    f = p / DATASET_META
    if not f.is_file():
        raise InputError(f"{p}: is a directory without {DATASET_META}, not a tracekit dataset; pass a trace.parquet file "
                         "or a dataset directory written by `tracekit convert --layout dataset`")
    note_input(p)
    try:
        md = pq.read_metadata(f).metadata or {}
    except Exception as e:  # noqa: BLE001
        raise InputError(f"{f}: not a Parquet footer ({type(e).__name__}); re-convert the source into a new dataset") from None
    return _parse_meta(f, md.get(META_KEY))


def dataset_parts(path: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """``(rank, file)`` of every partition file of a directory dataset, by rank (numerically) then part number.

    Only ``rank=<r>/part-<k>.parquet`` counts: the temporary files of unfinished writes (``.part-0.parquet.*.tmp``)
    and any other name are not parts."""
    p = Path(path)
    out: list[tuple[int, Path]] = []
    try:
        with os.scandir(p) as it:
            dirs = sorted((int(m.group(1)), e.path) for e in it if e.is_dir() and (m := _RANK_DIR.match(e.name)))
        for r, d in dirs:
            with os.scandir(d) as it:
                files = sorted((int(m.group(1)), e.path) for e in it if e.is_file() and (m := _PART_FILE.match(e.name)))
            out += [(r, Path(f)) for _, f in files]
    except OSError as e:
        raise InputError(f"{p}: cannot read {os_reason(e, writing=False)}") from None
    return out


def trace_ranks(path: str | os.PathLike[str]) -> list[int]:
    """The ranks of a ``trace.parquet`` or a directory dataset, sorted. A dataset's come from its directory names
    (no partition is read, so a damaged one does not hide the others); a file's from its ``rank`` column."""
    if Path(path).is_dir():
        return sorted({r for r, _ in dataset_parts(path)})
    lf = pl.scan_parquet(Path(path)).select(pl.col("rank").unique())
    try:
        return sorted(int(r) for r in lf.collect()["rank"].to_list())
    except Exception as e:  # noqa: BLE001
        raise InputError(f"{path}: unreadable trace data ({first_line(e)}); re-convert the source") from None


def rank_where(path: str | os.PathLike[str], rank: int) -> str:
    """Where rank ``rank``'s rows are, for a message: its partition file(s) in a dataset, else ``path``."""
    if Path(path).is_dir():
        files = [str(f) for r, f in dataset_parts(path) if r == rank]
        if files:
            return files[0] if len(files) == 1 else f"{Path(path) / f'rank={rank}'}"
    return str(path)


def _scan_dataset(p: Path, meta: TraceMeta, ranks: Iterable[int] | None = None) -> tuple[pl.LazyFrame, list[Path]]:
    """A lazy scan of every partition (of ``ranks`` only, when given), rank from the directory names; every rank
    the metadata lists has its partition (a rank that failed at convert time under ``--keep-going`` is listed in
    ``failed_ranks`` instead: a lost one is a :class:`RankError`); also the partition files (their footers'
    statistics serve the read-time checks)."""
    want = None if ranks is None else {int(r) for r in ranks}
    parts = [(r, f) for r, f in dataset_parts(p) if want is None or r in want]
    have = {r for r, _ in parts}
    failed = {int(f["rank"]) for f in meta.get("failed_ranks") or [] if isinstance(f, dict) and f.get("rank") is not None}
    listed = [int(r["rank"]) for r in meta.get("ranks") or [] if isinstance(r, dict) and r.get("rank") is not None]
    lost = [r for r in listed if r not in have and r not in failed and (want is None or r in want)]
    if lost:
        more = f" (and {len(lost) - 1} more rank(s))" if len(lost) > 1 else ""
        raise RankError(f"rank {lost[0]}: {p}: the rank has no partition ({p / f'rank={lost[0]}'}/part-*.parquet){more}; "
                        "the dataset is incomplete: re-convert it", lost[0])
    if not parts:
        which = "" if want is None else f" of rank(s) {sorted(want)}"
        raise InputError(f"{p}: the dataset has no partitions{which} (rank=N/part-*.parquet); re-convert the source")
    for _, f in parts:
        note_input(f)
    files = [f for _, f in parts]
    # the schema from the metadata, not from the first partition: a damaged partition fails only the reads of its rank
    return pl.scan_parquet([str(f) for f in files], hive_partitioning=True, hive_schema={"rank": POLARS_SCHEMA["rank"]},
                           schema=_dataset_schema(p)), files


def _dataset_schema(p: Path) -> pl.Schema:
    f = p / DATASET_META
    try:
        arrow = pq.read_schema(f)
    except Exception as e:  # noqa: BLE001
        raise InputError(f"{f}: not a Parquet footer ({type(e).__name__}); re-convert the source into a new dataset") from None
    return pl.Schema(pl.DataFrame(arrow.empty_table()).schema)


def write_dataset_meta(root: str | os.PathLike[str], metadata: Mapping[str, Any]) -> None:
    """Write a directory dataset's footer metadata (:data:`DATASET_META`: the schema and the ``tracekit`` JSON),
    atomically."""
    meta = _base_metadata()
    meta.update(metadata)
    meta["schema_version"] = SCHEMA_VERSION
    schema = ARROW_SCHEMA.with_metadata({META_KEY.decode(): json.dumps(meta, default=str)})
    with atomic_path(Path(root) / DATASET_META, force=True, commit=False) as tmp:
        pq.write_metadata(schema, tmp)


def open_trace(path: str | os.PathLike[str], ranks: Iterable[int] | None = None) -> tuple[pl.LazyFrame, TraceMeta]:
    """The rows of a ``trace.parquet`` or a directory dataset as a lazy scan in exactly :data:`POLARS_SCHEMA`
    (rows by rank, then time; missing columns of older files as nulls) and its footer, both validated
    (:mod:`tracekit.trace_check`: one-line errors naming the column, or repairs flagged in ``meta["quality"]``).
    Every command reads its traces through here.

    A dataset: ``ranks`` restricts the scan and the checks to those ranks' partitions (a cluster task reads and
    checks its rank's only); a partition that fails the checks is a :class:`RankError` naming its rank and file
    (``--keep-going`` leaves it out). A ``trace.parquet`` is checked whole (filter the scan for ``ranks``)."""
    meta = read_metadata(path)
    p = Path(path)
    if not p.is_dir():
        return check_data(p, cast(dict[str, Any], meta), pl.scan_parquet(p), [p], POLARS_SCHEMA, REQUIRED_COLUMNS), meta
    lf, files = _scan_dataset(p, meta, ranks)
    try:
        return check_data(p, cast(dict[str, Any], meta), lf, files, POLARS_SCHEMA, REQUIRED_COLUMNS), meta
    except InputError as e:
        raise _failed_partition(p, meta, files, e) from None


def _failed_partition(p: Path, meta: Mapping[str, Any], files: list[Path], e: InputError) -> InputError:
    """The checks of a dataset failed with ``e``: the first partition that fails them alone, as a :class:`RankError`
    (its message names the file); ``e`` when none does alone."""
    import copy

    if len(files) == 1:  # that partition's
        r = int(files[0].parent.name.partition("=")[2])
        msg = str(e)
        return RankError(f"rank {r}: {files[0]}{msg[len(str(p)):]}" if msg.startswith(f"{p}:") else f"rank {r}: {msg}", r)
    for f in files:
        r = int(f.parent.name.partition("=")[2])
        one = pl.scan_parquet([str(f)], hive_partitioning=True, hive_schema={"rank": POLARS_SCHEMA["rank"]}, schema=_dataset_schema(p))
        try:
            check_data(f, copy.deepcopy(dict(meta)), one, [f], POLARS_SCHEMA, REQUIRED_COLUMNS)
        except InputError as er:
            return RankError(f"rank {r}: {er}", r)
    return e


def scan_trace(path: str | os.PathLike[str]) -> pl.LazyFrame:
    """:func:`open_trace`'s lazy scan alone."""
    return open_trace(path)[0]


def read_trace(path: str | os.PathLike[str], *, ranks: Iterable[int] | None = None) -> tuple[pl.DataFrame, dict[str, Any]]:
    """Read events (optionally only some ranks) and metadata (validated: :func:`open_trace`)."""
    lf, meta = open_trace(path)
    if ranks is not None:
        lf = lf.filter(pl.col("rank").is_in(list(ranks)))
    try:
        df = lf.collect()
    except Exception as e:  # noqa: BLE001
        raise InputError(f"{path}: unreadable trace data ({first_line(e)}); re-convert the source") from None
    return df, dict(meta)
