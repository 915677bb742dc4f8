"""Streaming one rank's rows into ``trace.parquet``, in bounded batches.

Shared by both ways :mod:`tracekit.ingest.convert` writes a rank: straight from
the finalized frame (:func:`emit_frame`, the usual case) and from earlier
written parts (:func:`write_rank`, when clock offsets, profiler windows or the
rank order require a second pass). Per batch: capture-side rows merged in time
order, the rank column set, the clock offset applied.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from tracekit import _interrupt
from tracekit.core._num import as_int
from tracekit.ingest.common import ts_order
from tracekit.schema import ARROW_SCHEMA, TraceWriter, conform, to_arrow

__all__ = ["PART_ROWS", "COMM", "COLL_KEY", "emit_frame", "write_rank", "dedupe_steps", "window_shifts"]

#: rows per batch streamed into the output (and per row group of a part file)
PART_ROWS = 1 << 17
COMM = pl.col("category") == "communication"
COLL_KEY = pl.coalesce(pl.col("pg_name").cast(pl.String), pl.lit("fam:") + pl.col("family").cast(pl.String))


def emit_frame(w: TraceWriter, r: int, df: pl.DataFrame, extra: pl.DataFrame | None,
               stop: Callable[[], None] | None = None) -> tuple[int, int | None, int | None]:
    """Write one rank's finalized (unsorted) rows, sorted by ts slice by slice, with its capture-side rows.

    Capture-side step records the trace carries are dropped and their step ids
    given to the traced steps (:func:`dedupe_steps`). Returns (rows, first ts, last end).
    Memory: one batch besides ``df`` — the sort is an index, never a second copy of the rank.
    ``stop`` is called before each batch (it raises to abandon the write).
    """
    extra, sid_map = _extra_rows(lambda: df.filter(pl.col("kind") == "step").select("ts_ns", "step_id", "kind"), extra)
    order = ts_order(df)
    batches = (_transform(to_arrow(df[order.slice(off, PART_ROWS)]), (0, {}), sid_map) for off in range(0, df.height, PART_ROWS))
    return _emit(w, r, batches, 0, extra, stop)


def _extra_rows(traced: Callable[[], pl.DataFrame], extra: pl.DataFrame | None) -> tuple[pl.DataFrame | None, dict[int, int]]:
    """Capture-side rows to merge (sorted by ts, minus the steps the trace carries) and the traced steps'
    new ids (:func:`dedupe_steps`); ``traced`` gives the rank's traced step rows, built only when needed."""
    if extra is None or not extra.height:
        return None, {}
    extra, sid_map = dedupe_steps(traced(), extra)
    return (conform(extra).sort("ts_ns", maintain_order=True) if extra.height else None), sid_map


def _emit(w: TraceWriter, r: int, batches: Iterator[pa.Table], offset: int, extra: pl.DataFrame | None,
          stop: Callable[[], None] | None = None) -> tuple[int, int | None, int | None]:
    rows, lo, hi = 0, None, None
    for tbl in _merge_extra(batches, extra):
        if stop is not None:
            stop()
        _interrupt.check("write")
        tbl = _finish_batch(tbl, r, offset)
        if not tbl.num_rows:
            continue
        w.write(tbl)
        rows += tbl.num_rows
        ts = tbl.column("ts_ns")
        b_lo = pc.min(ts).as_py()
        b_hi = pc.max(pc.add(ts, tbl.column("dur_ns"))).as_py()
        lo = b_lo if lo is None else min(lo, b_lo)
        hi = b_hi if hi is None else max(hi, b_hi)
    return rows, lo, hi


def dedupe_steps(rank_df: pl.DataFrame, extra: pl.DataFrame) -> tuple[pl.DataFrame, dict[int, int]]:
    """Drop capture-side step records that the trace itself carries as steps.

    A capture-side record (forward hook JSONL, tracekit instrumentation) of a
    forward that ran while the profiler recorded duplicates the trace's own
    ``tk.fwd``/``step[...]`` step. The hook wraps the traced range, so a record
    matches the traced step that starts inside it (latest record starting at or
    before the traced start, and ending after it); traced steps left over are
    matched to the nearest record start within half the shortest record. Matched
    records are dropped and their ``step_id`` (the capture's global forward
    number) is returned as a mapping for the traced step; traced steps with no
    record get ids past the capture's largest, so ids never repeat. Unmatched
    records stay, with ``profiled`` false when unknown: they are the unprofiled
    step timings.
    """
    if extra.height == 0:
        return extra, {}
    is_step = pl.col("kind") == "step"
    traced = rank_df.filter(is_step).select(pl.col("ts_ns").alias("_t"), pl.col("step_id").alias("_tsid")).sort("_t")
    cand = extra.with_row_index("_i")
    steps = cand.filter(is_step)
    if steps.height == 0:
        return extra, {}
    mapping: dict[int, int] = {}
    if traced.height:
        recs = steps.select("_i", pl.col("ts_ns").alias("_rs"), (pl.col("ts_ns") + pl.col("dur_ns")).alias("_re"), pl.col("step_id").alias("_rid")).sort("_rs")
        m = traced.join_asof(recs, left_on="_t", right_on="_rs", strategy="backward", check_sortedness=False)
        hit = m.filter(pl.col("_rs").is_not_null() & (pl.col("_t") <= pl.col("_re"))).unique("_i", keep="first")
        rest = traced.filter(~pl.col("_tsid").is_in(hit.get_column("_tsid").implode()))
        if rest.height:
            left = recs.filter(~pl.col("_i").is_in(hit.get_column("_i").implode()))
            tol = max(1, as_int(steps["dur_ns"].min() or 1)) // 2
            m2 = rest.join_asof(left, left_on="_t", right_on="_rs", strategy="nearest", tolerance=tol, check_sortedness=False)
            hit = pl.concat([hit, m2.filter(pl.col("_rs").is_not_null()).unique("_i", keep="first").select(hit.columns)])
        cand = cand.filter(~pl.col("_i").is_in(hit.get_column("_i").implode()))
        pairs = hit.filter(pl.col("_tsid").is_not_null() & pl.col("_rid").is_not_null()).unique("_tsid", keep="first")
        mapping = {int(a): int(b) for a, b in zip(pairs["_tsid"].to_list(), pairs["_rid"].to_list())}
        if mapping:
            unmapped = [int(x) for x in traced["_tsid"].drop_nulls().to_list() if int(x) not in mapping]
            top = max([int(x) for x in steps["step_id"].drop_nulls().to_list()] + list(mapping.values()), default=-1)
            for k, old in enumerate(sorted(set(unmapped))):
                mapping[old] = top + 1 + k
    kept = cand.with_columns(
        pl.when(is_step).then(pl.col("profiled").fill_null(False)).otherwise(pl.col("profiled")).alias("profiled")
    ).drop("_i")
    return kept, mapping


def write_rank(w: TraceWriter, r: int, parts: list[dict[str, Any]], offset: int, extra: pl.DataFrame | None) -> tuple[int, int | None, int | None]:
    """Stream rank ``r``'s parts into ``w``; returns (rows, first ts, last end) after the clock offset.

    Per part: window shifts of step ids / collective sequence numbers (several
    profiler windows, see :func:`window_shifts`), the rank column, the clock
    offset. Capture-side rows (``extra``) lose the steps the trace carries
    (:func:`dedupe_steps`) and are merged in time order. Memory: one batch of
    :data:`PART_ROWS` rows (plus the extra rows), never the whole rank — unless
    windows overlap in time, when the rank is sorted in memory.
    """
    shifts = window_shifts(parts)
    extra, sid_map = _extra_rows(lambda: pl.concat([
        _shifted(pl.DataFrame(m["steps"], schema={"ts_ns": pl.Int64, "step_id": pl.Int64}).with_columns(pl.lit("step").alias("kind")), sh)
        for m, sh in zip(parts, shifts)
    ], how="vertical_relaxed"), extra)
    disjoint = all((parts[i].get("last_end_ns") or 0) <= (parts[i + 1].get("first_ts_ns") or 0) for i in range(len(parts) - 1))
    if disjoint:
        batches = (_transform(b, sh, sid_map) for m, sh in zip(parts, shifts) for b in _part_batches(m))
    else:
        whole = pl.concat([_transform_df(pl.from_arrow(_read_part(m)), sh, sid_map) for m, sh in zip(parts, shifts)],  # type: ignore[arg-type]
                          how="vertical_relaxed")
        batches = (pa.Table.from_batches([b]) for b in to_arrow(whole.sort("ts_ns", maintain_order=True)).to_batches(PART_ROWS))
    return _emit(w, r, batches, offset, extra)


def _is_ipc(part: str) -> bool:
    with open(part, "rb") as f:
        return f.read(4) != b"PAR1"


def _part_batches(m: dict[str, Any]) -> Iterator[pa.Table]:
    """A part's rows in order: an Arrow IPC stream, a Parquet part, or row groups ``[a, b)`` of a staged file."""
    part = m["part"]
    if "row_groups" not in m and _is_ipc(part):
        with ipc.open_stream(part) as r:
            for b in r:
                yield pa.Table.from_batches([b])
        return
    f = pq.ParquetFile(part)
    a, b = m.get("row_groups") or (0, f.num_row_groups)
    for i in range(a, b):
        yield f.read_row_group(i)


def _read_part(m: dict[str, Any]) -> pa.Table:
    return pa.concat_tables(list(_part_batches(m)), promote_options="none") if m.get("rows") else ARROW_SCHEMA.empty_table()


def window_shifts(parts: list[dict[str, Any]]) -> list[tuple[int, dict[str, int]]]:
    """Per part (window of one rank): (step-id shift, {collective key: seq shift}).

    Several profiler windows of one rank: keep step ids and collective sequence numbers unique.
    Each window was finalized on its own, so both restart at 0. Windows are
    barrier-aligned across ranks (same steps everywhere), so shifting each
    window past the previous one's maximum, per process group, keeps
    instances matchable across ranks. (Recorded ``Seq`` values never
    overlap and are left alone.)
    """
    if len(parts) < 2:
        return [(0, {})] * len(parts)
    out, base = [], 0
    seq_max: dict[str, int] = {}
    for m in parts:
        mx = m.get("step_id_max")
        step_add = base if (base and m.get("step_id_any")) else 0
        base = (int(mx) + step_add + 1) if mx is not None else base
        shift: dict[str, int] = {}
        for k, (lo_s, hi_s) in (m.get("coll_seq_ranges") or {}).items():
            prev = seq_max.get(k)
            add = (prev + 1 - lo_s) if prev is not None and lo_s <= prev else 0
            shift[k] = add
            seq_max[k] = hi_s + add
        out.append((step_add, {k: v for k, v in shift.items() if v}))
    return out


def _shifted(df: pl.DataFrame, sh: tuple[int, dict[str, int]]) -> pl.DataFrame:
    return df.with_columns(pl.col("step_id") + sh[0]) if sh[0] else df


def _transform_df(df: pl.DataFrame, sh: tuple[int, dict[str, int]], sid_map: dict[int, int]) -> pl.DataFrame:
    step_add, seq_shift = sh
    if step_add:
        df = df.with_columns(pl.col("step_id") + step_add)
    if seq_shift:
        df = df.with_columns(
            pl.when(COMM & pl.col("coll_seq").is_not_null())
            .then(pl.col("coll_seq") + COLL_KEY.replace_strict(seq_shift, default=0, return_dtype=pl.Int64))
            .otherwise(pl.col("coll_seq"))
            .alias("coll_seq")
        )
    if sid_map:
        df = df.with_columns(pl.col("step_id").replace(sid_map))
    return df


def _transform(tbl: pa.Table, sh: tuple[int, dict[str, int]], sid_map: dict[int, int]) -> pa.Table:
    if not sh[0] and not sh[1] and not sid_map:
        return tbl
    return to_arrow(_transform_df(pl.from_arrow(tbl), sh, sid_map))  # type: ignore[arg-type]


def _merge_extra(batches: Iterator[pa.Table], extra: pl.DataFrame | None) -> Iterator[pa.Table]:
    """Interleave sorted ``extra`` rows with sorted batches (ties: trace rows first, as a stable sort would)."""
    if extra is None or not extra.height:
        yield from batches
        return
    ets = extra.get_column("ts_ns")
    pos, prev = 0, None

    def combine(t: pa.Table, e: pl.DataFrame) -> pa.Table:
        if not e.height:
            return t
        head = pl.from_arrow(t)
        assert isinstance(head, pl.DataFrame)
        both = pl.concat([head, conform(e)], how="vertical_relaxed")
        return to_arrow(both.sort("ts_ns", maintain_order=True))

    for b in batches:
        if not b.num_rows:
            continue
        if prev is not None:
            k = int(ets.search_sorted(b.column("ts_ns")[0].as_py(), side="left"))
            yield combine(prev, extra[pos:k])
            pos = max(pos, k)
        prev = b
    if prev is not None:
        yield combine(prev, extra[pos:])
    elif pos < extra.height:
        yield to_arrow(extra[pos:])


def _finish_batch(tbl: pa.Table, r: int, offset: int) -> pa.Table:
    """Set the rank column and apply the clock offset (Arrow compute, no conversion)."""
    i = tbl.schema.get_field_index("rank")
    tbl = tbl.set_column(i, ARROW_SCHEMA.field("rank"), _const(r, tbl.num_rows))
    if offset:
        for name in ("ts_ns", "launch_ts_ns"):
            j = tbl.schema.get_field_index(name)
            tbl = tbl.set_column(j, ARROW_SCHEMA.field(name), pc.add(tbl.column(j), _const(offset, 1, pl.Int64)[0]))
    return tbl


def _const(v: int, n: int, dtype: pl.DataType | type[pl.DataType] = pl.Int32) -> pa.Array:
    # through polars: building an Arrow array or scalar from Python values makes pyarrow import pandas (+0.2 s, +40 MB)
    return pl.repeat(v, n, dtype=dtype, eager=True).to_arrow()
