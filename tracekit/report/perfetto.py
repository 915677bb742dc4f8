"""Perfetto / Chrome-JSON export: one merged, clock-aligned, multi-rank trace.

Layout (ui.perfetto.dev, chrome://tracing):

* one **process per rank** (``pid = rank + 1``; pid 0 is the idle process in Perfetto),
  named ``rank N (GPU name)``;
* per rank, one **track (tid) per GPU stream** (``tid = 1000 + i``), never with
  overlapping slices: an op that starts before its predecessor on the same stream
  ended is clipped to that start (counted in ``clipped``);
* ``steps`` (tid 1), ``ranges`` (tid 2, NVTX / record_function, nested), ``stalls``
  (tid 3, instant events from the analysis), ``PCIe-bound`` (tid 4), GPU-range tracks
  per stream (tid 2000 + i) and, with ``include_cpu``, CPU threads (tid 100000 + i,
  cpu_op / runtime / sync rows) with launch → kernel flows;
* slices carry their category in ``cat`` (kernel category, ``step``, ``range`` …);
* counters as ``ph: C`` tracks (``name`` = counter, one arg named by its unit);
* collectives as **flows across ranks**: the kernels of one instance (same
  ``pg_name`` + ``coll_seq``, or the analysis' ``collective_instances``) are chained in
  arrival order (``ph: s`` → ``ph: f``).

Timestamps are µs (3 decimals = ns) since the capture start; the absolute start is
``otherData.tracekit_base_ns``. Nested tracks are made to nest perfectly (Perfetto
drops partially overlapping slices): crossing ranges are clipped to their parent.
The file is written atomically, gzip-compressed when the name ends in ``.gz``.
"""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Mapping, cast

import numpy as np
import polars as pl

from tracekit import __version__, _interrupt
from tracekit._errors import OutputError
from tracekit.report.timeline_data import CPU_LANE, analysis_events, capture_bounds, counter_group, gpu_ops
from tracekit.report.timeline_detail import collective_instances
from tracekit.schema import atomic_path

__all__ = ["export_perfetto", "nest_fix", "TID_STEPS", "TID_RANGES", "TID_STALLS", "TID_PCIE", "TID_STREAM0"]

TID_STEPS, TID_RANGES, TID_STALLS, TID_PCIE = 1, 2, 3, 4
TID_STREAM0, TID_GPU_RANGE0, TID_CPU0 = 1000, 2000, 100_000
_OVERFLOW = 500_000
_MAX_DEPTH = 64


# ------------------------------------------------------------------ track fixing (vectorized)
def sequential_fix(f: pl.DataFrame, track: str = "tid") -> pl.DataFrame:
    """Clip each slice's end to the next slice's start on the same (pid, track): no overlap at all."""
    f = f.sort(["pid", track, "start", "end"])
    nxt = pl.col("start").shift(-1).over(["pid", track])
    return f.with_columns(pl.min_horizontal(pl.col("end"), pl.coalesce(nxt, pl.col("end"))).alias("_e")).with_columns(
        (pl.col("_e") < pl.col("end")).alias("_clipped"), pl.col("_e").alias("end")).drop("_e")


def nest_fix(f: pl.DataFrame, track: str = "tid") -> pl.DataFrame:
    """Make slices on each (pid, track) nest perfectly: depth = slices open at each start;
    each slice is clipped to its parent (latest-starting slice one level up) and to its
    next sibling; slices without a parent move to an overflow track (track + 500000),
    which is made sequential. Adds ``_clipped``. Loops over depth levels, never events."""
    if f.height == 0:
        return f.with_columns(pl.lit(False).alias("_clipped"))
    f = f.with_columns(pl.struct("pid", track).rank("dense").cast(pl.Int64).alias("_trk"))
    f = f.sort(["_trk", "start", "end"], descending=[False, False, True])
    t0 = int(f.get_column("start").min())  # type: ignore[arg-type]
    trk = f.get_column("_trk").to_numpy()
    s = f.get_column("start").to_numpy() - t0
    e = f.get_column("end").to_numpy() - t0
    shift = np.int64(1) << np.int64(max(int(max(e.max(), s.max())).bit_length(), 1))
    skey, ekey = trk * shift + s, np.sort(trk * shift + e)
    first = np.searchsorted(ekey, trk * shift, side="left")
    pos = np.arange(f.height) - np.searchsorted(trk, trk, side="left")  # position within track
    depth = pos - (np.searchsorted(ekey, skey, side="right") - first)
    f = f.with_columns(pl.Series("_d", np.clip(depth, 0, _MAX_DEPTH + 1)), pl.col("end").alias("_orig"),
                       pl.int_range(pl.len()).alias("_i"))
    f = f.with_columns(pl.when(pl.col("_d") > _MAX_DEPTH).then(-1).otherwise(pl.col("_d")).alias("_d"))
    done: list[pl.DataFrame] = []
    prev: pl.DataFrame | None = None
    orphans: list[pl.DataFrame] = [f.filter(pl.col("_d") < 0)]
    for d in range(0, int(f.get_column("_d").max() or 0) + 1):  # type: ignore[arg-type]
        lvl = f.filter(pl.col("_d") == d).sort(["_trk", "start"])
        if lvl.height == 0:
            break
        if prev is not None:
            par = prev.select("_trk", pl.col("start").alias("_ps"), pl.col("end").alias("_pe")).sort(["_trk", "_ps"])
            lvl = lvl.join_asof(par, left_on="start", right_on="_ps", by="_trk", strategy="backward",
                                check_sortedness=False)
            # no parent, or starts after the parent ended (a zero-length slice exactly at the parent's end still fits)
            bad = pl.col("_pe").is_null() | (pl.col("start") > pl.col("_pe")) | (
                (pl.col("start") == pl.col("_pe")) & (pl.col("end") > pl.col("start")))
            orphans.append(lvl.filter(bad).drop(["_ps", "_pe"]))
            lvl = lvl.filter(~bad).with_columns(pl.min_horizontal("end", "_pe").alias("end")).drop(["_ps", "_pe"])
        nxt = pl.col("start").shift(-1).over("_trk")
        lvl = lvl.with_columns(pl.min_horizontal(pl.col("end"), pl.coalesce(nxt, pl.col("end"))).alias("end"))
        done.append(lvl)
        prev = lvl
    out = pl.concat(done) if done else f.clear()
    orph = pl.concat(orphans)
    if orph.height:
        orph = sequential_fix(orph.with_columns((pl.col(track) + _OVERFLOW).alias(track)), track)
        out = pl.concat([out, orph.drop("_clipped")])
    return out.with_columns((pl.col("end") < pl.col("_orig")).alias("_clipped")).sort("_i").drop(
        ["_trk", "_d", "_orig", "_i"])


# ------------------------------------------------------------------ event frames → JSON lines
_US = 1e3


def _x_events(f: pl.DataFrame, base: int, args: list[str]) -> pl.Series:
    """JSON text of X slices from columns name, cat, pid, tid, start, end (+ args columns)."""
    cols = [pl.col("name").cast(pl.String), pl.col("cat").cast(pl.String), pl.lit("X").alias("ph"),
            ((pl.col("start") - base) / _US).round(3).alias("ts"),
            ((pl.col("end") - pl.col("start")) / _US).round(3).alias("dur"), "pid", "tid"]
    if args:
        cols.append(pl.struct(args).alias("args"))
    # drop null args (never the first key of a struct, which is "name" / the first arg)
    return f.select(pl.struct(cols).struct.json_encode().str.replace_all(r',"[A-Za-z_]+":null', "").alias("j")
                    ).get_column("j")


class _Sink:
    """The open output: writes JSON lines comma-separated, counts events and what was written (``stats``)."""

    def __init__(self, fh: IO[bytes], base: int) -> None:
        self.fh, self.base, self.n = fh, base, 0
        self.stats = {"events": 0, "slices": 0, "flows": 0, "counters": 0, "instants": 0, "clipped": 0}

    def write(self, lines: pl.Series | list[str]) -> None:
        _interrupt.check("export")  # Ctrl-C stops between chunks; the atomic writer removes the temp file
        if isinstance(lines, pl.Series):
            if lines.len() == 0:
                return
            text = ",\n".join(lines.to_list())
            n = lines.len()
        else:
            if not lines:
                return
            text = ",\n".join(lines)
            n = len(lines)
        self.fh.write(((",\n" if self.n else "") + text).encode("utf-8"))
        self.n += n

    def slices(self, f: pl.DataFrame, args: list[str]) -> None:
        """X slices of ``f`` (already made sequential or nested: its ``_clipped`` column is counted)."""
        self.stats["clipped"] += int(f.get_column("_clipped").sum())
        self.write(_x_events(f, self.base, args))
        self.stats["slices"] += f.height


def _meta(pid: int, tid: int | None, kind: str, value: Any) -> str:
    ev: dict[str, Any] = {"name": kind, "ph": "M", "pid": pid, "args": {"name" if "name" in kind else "sort_index": value}}
    if tid is not None:
        ev["tid"] = tid
    return json.dumps(ev)


def _collective_flows(ops: pl.DataFrame, stream_tid: pl.DataFrame, analysis: Mapping[str, Any]) -> pl.DataFrame:
    """Flow pairs (s → f) chaining each collective instance's ops across ranks in arrival order.

    Instances from ``analysis['collective_instances']`` (the analysis' matching,
    :func:`tracekit.core.collectives.match_collectives`) when given, else the frame's
    ``pg_name`` + ``coll_seq``. Each end lies inside its slice *as exported* (slices are
    clipped to the next op on their stream): the start at the next rank's arrival (clipped
    into the slice, so a flow never runs backwards), the end at the middle of the next slice.
    """
    inst = collective_instances(ops, analysis)
    if inst.height == 0:
        return pl.DataFrame()
    end = pl.col("ts_ns") + pl.col("dur_ns")
    o = ops.select(pl.col("rank").cast(pl.Int64), "device", "stream", "ts_ns", "dur_ns").sort(
        ["rank", "device", "stream", "ts_ns"]).with_columns(
        pl.min_horizontal(end, pl.coalesce(pl.col("ts_ns").shift(-1).over(["rank", "device", "stream"]), end)).alias("_end"))
    c = o.join(inst.select("rank", "ts_ns", "pg", "seq").unique(["rank", "ts_ns"]), on=["rank", "ts_ns"], how="inner")
    c = c.join(stream_tid.with_columns(pl.col("rank").cast(pl.Int64)), on=["rank", "device", "stream"], how="inner").select(
        (pl.col("rank") + 1).cast(pl.Int64).alias("pid"), "tid", "pg", "seq", "ts_ns", "_end",
        (pl.col("ts_ns") + (pl.col("_end") - pl.col("ts_ns")) // 2).alias("mid"))
    nxt = ["pg", "seq"]
    c = c.sort(["pg", "seq", "ts_ns"]).with_columns(
        pl.col("pid").shift(-1).over(nxt).alias("pid2"), pl.col("tid").shift(-1).over(nxt).alias("tid2"),
        pl.col("mid").shift(-1).over(nxt).alias("mid2"), pl.col("ts_ns").shift(-1).over(nxt).alias("_arr2"))
    c = c.filter(pl.col("pid2").is_not_null()).with_columns(
        pl.max_horizontal(pl.col("ts_ns"), pl.min_horizontal(pl.col("_arr2"), pl.col("_end") - 1, pl.col("mid2"))).alias("mid"))
    return c.drop(["_end", "_arr2"]).with_row_index("id", offset=1)


#: GPU-op columns written as a slice's args
_OP_ARGS = ["kind", "family", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "registers_per_thread",
            "shared_mem_bytes", "bytes", "correlation", "step_id", "stream", "coll_name", "pg_name", "coll_seq"]


def export_perfetto(
    df: pl.DataFrame,
    meta: Mapping[str, Any] | None,
    out: str | os.PathLike[str],
    *,
    analysis: Mapping[str, Any] | None = None,
    force: bool = False,
    include_cpu: bool = False,
    compresslevel: int = 6,
) -> dict[str, Any]:
    """Write the merged Chrome-JSON trace; returns counts (events, slices, flows, counters, clipped, bytes)."""
    out = Path(out)
    name = out.name.lower()
    if not (name.endswith(".json") or name.endswith(".json.gz")):
        raise OutputError(f"{out}: name the Perfetto export *.json or *.json.gz")
    meta = meta or {}
    analysis = analysis or {}
    base, _end = capture_bounds(df, meta)
    ranks = sorted(df.get_column("rank").unique().to_list()) if df.height else []
    tracks = _Tracks.of(df, meta)
    stalls = analysis_events(analysis.get("stalls"))
    pcie = analysis_events(analysis.get("pcie_phases"))
    flows = _collective_flows(tracks.ops, tracks.streams, analysis)
    with atomic_path(out, force=force) as tmp, open(tmp, "wb") as raw:
        # gzip header without a file name or a time: the same trace exports to the same bytes (the default header
        # held the temp file's random name and the time of the run)
        gz = gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=compresslevel, mtime=0) if name.endswith(".gz") else None
        fh = cast(IO[bytes], gz) if gz is not None else raw
        with fh:
            fh.write(b'{"traceEvents":[\n')
            sink = _Sink(fh, base)
            for r in ranks:
                _write_rank(sink, df.filter(pl.col("rank") == r), int(r), tracks, include_cpu)
                _write_analysis(sink, int(r), stalls, pcie)
            _write_collective_flows(sink, flows)
            other = {"tracekit_version": __version__, "tracekit_base_ns": str(base),
                     "clock_offsets_ns": meta.get("clock_offsets_ns"), "ranks": ranks,
                     "slices_clipped_to_nest": sink.stats["clipped"]}
            fh.write(("\n],\"displayTimeUnit\":\"ns\",\"otherData\":" + json.dumps(other, default=str) + "}\n")
                     .encode("utf-8"))
            stats: dict[str, Any] = {**sink.stats, "events": sink.n}
    stats["bytes"] = out.stat().st_size
    stats["path"] = str(out)
    return stats


@dataclass(frozen=True)
class _Tracks:
    """What every rank's tracks are made of: device ops (GPU ops, or CPU-mode operators / gloo collectives; stream =
    thread id), one track id per (rank, device, stream), the device-side ranges, the CPU lanes that only run gloo
    collectives and the GPU names."""

    ops: pl.DataFrame
    streams: pl.DataFrame
    dev_ranges: pl.DataFrame
    comm_threads: frozenset[tuple[int, int]]
    gpu_names: dict[int, str]

    @staticmethod
    def of(df: pl.DataFrame, meta: Mapping[str, Any]) -> _Tracks:
        ops = gpu_ops(df)
        dev_ranges = ops.filter(pl.col("kind").cast(pl.String) == "range").select(
            pl.col("rank"), pl.col("ts_ns"), pl.col("tid"), pl.lit(True).alias("_dev"))
        ops = ops.drop("tid")
        streams = ops.select("rank", "device", "stream").unique().sort(["rank", "device", "stream"]).with_columns(
            (pl.int_range(pl.len()).over("rank") + TID_STREAM0).cast(pl.Int64).alias("tid"))
        comm = ops.filter(pl.col("device") == CPU_LANE).group_by(["rank", "stream"]).agg(
            (pl.col("category") == "communication").all().alias("c")).filter(pl.col("c")).select("rank", "stream")
        names = {int(r["rank"]): str(r["device_name"]) for r in (meta.get("ranks") or [])
                 if isinstance(r, Mapping) and r.get("rank") is not None and r.get("device_name")}
        return _Tracks(ops, streams, dev_ranges, frozenset((int(a), int(b)) for a, b in comm.iter_rows()), names)


def _write_rank(sink: _Sink, rk: pl.DataFrame, r: int, t: _Tracks, include_cpu: bool) -> None:
    """One rank's process: its track names, GPU ops, steps, nested ranges (and CPU threads), counters."""
    pid = r + 1
    md = [_meta(pid, None, "process_name", f"rank {r}" + (f" ({t.gpu_names[r]})" if r in t.gpu_names else "")),
          _meta(pid, None, "process_sort_index", r)]
    for tid, label in ((TID_STEPS, "steps"), (TID_RANGES, "ranges (NVTX / record_function)"),
                       (TID_STALLS, "stalls"), (TID_PCIE, "PCIe-bound")):
        md += [_meta(pid, tid, "thread_name", label), _meta(pid, tid, "thread_sort_index", tid)]
    for dev, st, tid in t.streams.filter(pl.col("rank") == r).select("device", "stream", "tid").iter_rows():
        label = (f"CPU thread {st} ({'gloo collectives' if (r, int(st)) in t.comm_threads else 'forward ops'})"
                 if dev == CPU_LANE else f"GPU {dev} stream {st}")
        md += [_meta(pid, tid, "thread_name", label), _meta(pid, tid, "thread_sort_index", tid)]
    sink.write(md)
    o = t.ops.filter(pl.col("rank") == r).join(t.streams, on=["rank", "device", "stream"], how="left")
    if o.height:  # GPU ops: one track per stream, sequential
        sink.slices(sequential_fix(o.select(
            pl.col("name").cast(pl.String), pl.col("category").alias("cat"), pl.lit(pid).alias("pid"),
            "tid", pl.col("ts_ns").alias("start"), (pl.col("ts_ns") + pl.col("dur_ns")).alias("end"),
            pl.col("kind").cast(pl.String).alias("kind"), pl.col("family").cast(pl.String).alias("family"),
            "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "registers_per_thread",
            "shared_mem_bytes", "bytes", "correlation", "step_id",
            pl.col("coll_name").cast(pl.String), pl.col("pg_name").cast(pl.String), "coll_seq",
            pl.col("stream").alias("stream"))), _OP_ARGS)
    st = rk.filter(pl.col("kind").cast(pl.String) == "step")
    if st.height:
        sink.slices(sequential_fix(st.select(
            pl.col("name").cast(pl.String), pl.lit("step").alias("cat"), pl.lit(pid).alias("pid"),
            pl.lit(TID_STEPS).alias("tid"), pl.col("ts_ns").alias("start"),
            (pl.col("ts_ns") + pl.col("dur_ns")).alias("end"), "step_id",
            pl.col("step_mode").cast(pl.String), "batch_size", "tokens", "profiled")),
            ["step_id", "step_mode", "batch_size", "tokens", "profiled"])
    nested = _range_tracks(sink, rk, r, t)
    if include_cpu:
        nested += _cpu_tracks(sink, rk, r, t)
    for nf in nested:
        if nf.height == 0:
            continue
        nf = nest_fix(nf)
        over = nf.filter(pl.col("tid") >= _OVERFLOW).select("tid").unique()
        sink.write([_meta(pid, int(x), "thread_name", f"overflow of track {int(x) - _OVERFLOW}")
                    for x in over.get_column("tid").to_list()])
        sink.slices(nf, ["src"])
    _write_counters(sink, rk, pid)


def _range_tracks(sink: _Sink, rk: pl.DataFrame, r: int, t: _Tracks) -> list[pl.DataFrame]:
    """CPU-side ranges (one nested track) and GPU ranges per stream (named here), not yet nested."""
    pid, kind = r + 1, pl.col("kind").cast(pl.String)
    rg = rk.filter(kind == "range").join(t.dev_ranges, on=["rank", "ts_ns", "tid"], how="left").filter(
        pl.col("_dev").is_null()).select(
        pl.col("name").cast(pl.String), pl.lit("range").alias("cat"), pl.lit(pid).alias("pid"),
        pl.lit(TID_RANGES).alias("tid"), pl.col("ts_ns").alias("start"),
        (pl.col("ts_ns") + pl.col("dur_ns")).alias("end"), pl.col("src").cast(pl.String))
    range_tids = t.streams.with_columns((pl.col("tid") - TID_STREAM0 + TID_GPU_RANGE0).alias("tid"))
    gr = rk.filter(kind == "gpu_range").join(range_tids, on=["rank", "device", "stream"], how="inner").select(
        pl.col("name").cast(pl.String), pl.lit("gpu_range").alias("cat"), pl.lit(pid).alias("pid"),
        pl.col("tid"), pl.col("ts_ns").alias("start"), (pl.col("ts_ns") + pl.col("dur_ns")).alias("end"),
        pl.col("src").cast(pl.String))
    for gtid, sdev, sst in (gr.select("tid").unique().join(range_tids, on="tid").filter(pl.col("rank") == r)
                            .select("tid", "device", "stream").iter_rows()):
        sink.write([_meta(pid, gtid, "thread_name", f"GPU {sdev} stream {sst} ranges"),
                    _meta(pid, gtid, "thread_sort_index", gtid)])
    return [rg, gr]


def _cpu_tracks(sink: _Sink, rk: pl.DataFrame, r: int, t: _Tracks) -> list[pl.DataFrame]:
    """CPU threads (cpu_op / runtime / sync rows; named here, not yet nested) and launch → kernel flows (written)."""
    pid, kind = r + 1, pl.col("kind").cast(pl.String)
    cpu = rk.filter(kind.is_in(["cpu_op", "runtime", "sync"]) & (pl.col("dur_ns") >= 0))
    if not cpu.height:
        return []
    th = cpu.select(pl.col("tid").fill_null(0).alias("otid")).unique().sort("otid").with_columns(
        (pl.int_range(pl.len()) + TID_CPU0).cast(pl.Int64).alias("tid"))
    sink.write([m for otid, tid in th.iter_rows() for m in
                (_meta(pid, tid, "thread_name", f"CPU thread {otid}"), _meta(pid, tid, "thread_sort_index", tid))])
    cpu = cpu.with_columns(pl.col("tid").fill_null(0).alias("otid")).drop("tid").join(th, on="otid")
    launches = cpu.filter(pl.col("correlation").is_not_null()).select(
        pl.col("tid").alias("ctid"), pl.col("correlation"), pl.col("ts_ns").alias("cs"),
        (pl.col("ts_ns") + pl.col("dur_ns") // 2).alias("cmid"))
    kl = t.ops.filter((pl.col("rank") == r) & pl.col("correlation").is_not_null()).join(
        t.streams, on=["rank", "device", "stream"]).join(launches, on="correlation").select(
        "ctid", "cs", "cmid", "tid", (pl.col("ts_ns") + pl.col("dur_ns") // 2).alias("kmid")).with_columns(
        # a flow never runs backwards: start no later than the kernel's middle (inside the call)
        pl.max_horizontal("cs", pl.min_horizontal("cmid", "kmid")).alias("cmid"))
    if kl.height:
        kl = kl.with_columns(pl.Series("id", np.arange(kl.height) + 1 + 10**9 * (r + 1)))
        common = [pl.lit("launch").alias("name"), pl.lit("launch").alias("cat")]
        sink.write(kl.select(pl.struct(*common, pl.lit("s").alias("ph"), "id", pl.lit(pid).alias("pid"),
                                       pl.col("ctid").alias("tid"), ((pl.col("cmid") - sink.base) / _US).round(3).alias("ts"))
                             .struct.json_encode()).to_series())
        sink.write(kl.select(pl.struct(*common, pl.lit("f").alias("ph"), pl.lit("e").alias("bp"), "id",
                                       pl.lit(pid).alias("pid"), "tid", ((pl.col("kmid") - sink.base) / _US).round(3).alias("ts"))
                             .struct.json_encode()).to_series())
        sink.stats["flows"] += kl.height
    return [cpu.select(pl.col("name").cast(pl.String), kind.alias("cat"), pl.lit(pid).alias("pid"), "tid",
                       pl.col("ts_ns").alias("start"), (pl.col("ts_ns") + pl.col("dur_ns")).alias("end"),
                       pl.col("src").cast(pl.String))]


def _write_counters(sink: _Sink, rk: pl.DataFrame, pid: int) -> None:
    """Counters as ``ph: C`` tracks, one per unit group (the arg is named by the unit)."""
    cn = rk.filter((pl.col("kind").cast(pl.String) == "counter") & pl.col("value").is_not_null() & pl.col("value").is_finite())
    if not cn.height:
        return
    units = {n: counter_group(n) for n in cn.get_column("name").cast(pl.String).unique().to_list()}
    cn = cn.select(
        pl.col("name").cast(pl.String), pl.col("ts_ns"), pl.col("value"),
        pl.col("name").cast(pl.String).replace_strict({n: u[1] or "value" for n, u in units.items()}).alias("unit"),
        pl.col("name").cast(pl.String).replace_strict({n: u[2] for n, u in units.items()}, return_dtype=pl.Float64).alias("scale"))
    for unit, g in cn.partition_by("unit", as_dict=True).items():
        sink.write(g.select(pl.struct(
            "name", pl.lit("counter").alias("cat"), pl.lit("C").alias("ph"),
            ((pl.col("ts_ns") - sink.base) / _US).round(3).alias("ts"), pl.lit(pid).alias("pid"),
            pl.struct((pl.col("value") * pl.col("scale")).alias(str(unit[0]))).alias("args"),
        ).struct.json_encode()).to_series())
        sink.stats["counters"] += g.height


def _write_analysis(sink: _Sink, r: int, stalls: list[dict[str, Any]], pcie: list[dict[str, Any]]) -> None:
    """The analysis' stalls (instants) and PCIe-bound phases (slices) on rank ``r``'s tracks."""
    pid = r + 1
    inst = [json.dumps({"name": f"stall: {s['label'] or 'wait'}", "cat": "stall", "ph": "i", "s": "t",
                        "pid": pid, "tid": TID_STALLS, "ts": round((s["start_ns"] - sink.base) / _US, 3),
                        "args": {"wait_ns": s["dur_ns"], "detail": s["detail"]}})
            for s in stalls if s["rank"] in (None, r)]
    sink.write(inst)
    sink.stats["instants"] += len(inst)
    ph = [p for p in pcie if p["rank"] in (None, r)]
    if ph:
        pf = sequential_fix(pl.DataFrame({
            "name": [f"PCIe-bound {p['label']}".strip() for p in ph], "cat": ["pcie"] * len(ph),
            "pid": [pid] * len(ph), "tid": [TID_PCIE] * len(ph), "start": [p["start_ns"] for p in ph],
            "end": [p["end_ns"] for p in ph], "detail": [p["detail"] for p in ph]}))
        sink.write(_x_events(pf, sink.base, ["detail"]))
        sink.stats["slices"] += pf.height


def _write_collective_flows(sink: _Sink, flows: pl.DataFrame) -> None:
    """Collective flows across ranks: each instance's kernels chained in arrival order."""
    if not flows.height:
        return
    common = [pl.lit("collective").alias("name"), pl.lit("collective").alias("cat")]
    sink.write(flows.select(pl.struct(*common, pl.lit("s").alias("ph"), "id", "pid", "tid",
                                      ((pl.col("mid") - sink.base) / _US).round(3).alias("ts"),
                                      pl.struct(pl.col("pg"), pl.col("seq")).alias("args"))
                            .struct.json_encode()).to_series())
    sink.write(flows.select(pl.struct(*common, pl.lit("f").alias("ph"), pl.lit("e").alias("bp"), "id",
                                      pl.col("pid2").alias("pid"), pl.col("tid2").alias("tid"),
                                      ((pl.col("mid2") - sink.base) / _US).round(3).alias("ts"),
                                      pl.struct(pl.col("pg"), pl.col("seq")).alias("args"))
                            .struct.json_encode()).to_series())
    sink.stats["flows"] += flows.height
