"""Convert trace sources (Kineto JSON, nsys exports) of one capture into ``trace.parquet``.

Per source (a rank, or a window of a rank) a worker reads and finalizes the
rows and writes them to a temporary Parquet part; the parent then streams
rank by rank into the final file, merging capture-side rows (step records,
telemetry) and clock offsets. Memory is bounded by the largest rank; workers
never pickle frames back. The output appears atomically, and an existing
file is refused without ``force``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import polars as pl
import pyarrow.parquet as pq

from tracekit._errors import InputError, OutputError, QualityLog, TracekitError
from tracekit._memory import release_memory, tune_runtime
from tracekit.categories import RuleSet, load_rules
from tracekit.ingest.common import finalize_rank, ts_order
from tracekit.ingest.discover import Source, discover
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from tracekit.schema import ARROW_SCHEMA, DICT_COLUMNS, TraceWriter, conform, to_arrow

__all__ = ["convert", "ConvertResult", "convert_source"]

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
    if src.fmt == "kineto":
        from tracekit.ingest.kineto import read_kineto

        return read_kineto(src.path, rank=rank)
    try:
        from tracekit.ingest.nsys import read_nsys  # type: ignore[attr-defined]
    except ImportError:
        raise InputError(f"{src.path}: Nsight Systems import is not available in this build") from None
    return read_nsys(src.path, rank=rank)


def convert_source(src: Source, rules_path: str | None, part_dir: str, out_label: str = "") -> list[dict[str, Any]]:
    """Worker: read + finalize one source, write one part file per rank it holds.

    Returns small metadata only (one dict per rank; an nsys report can hold
    several GPU processes, i.e. several ranks).
    """
    tune_runtime()
    rules = load_rules(rules_path) if rules_path else load_rules(None)
    raw, meta = _read(src, None)
    pieces: list[tuple[pl.DataFrame, dict[str, Any]]] = [(raw, meta)]
    if src.fmt == "nsys":
        from tracekit.ingest.nsys import split_ranks

        pieces = split_ranks(raw, meta)
    del raw  # each piece is dropped once finalized: one rank's raw rows at a time
    release_memory()  # the decoded text chunks' heap pages (~70 MB per 113 MB of JSON) go back before finalize
    out = []
    pieces.reverse()
    while pieces:
        raw_r, meta_r = pieces.pop()
        meta_r = dict(meta_r)
        rank = meta_r.get("rank")
        if rank is None:
            rank = src.rank_hint
        if rank is None:
            rank = -1  # resolved by the parent (single-file inputs become rank 0)
        raw_r = raw_r.with_columns(pl.lit(rank, dtype=pl.Int32).alias("rank"))
        df = finalize_rank(raw_r, rules, sort=False)  # rows are ordered slice by slice while the part is written
        del raw_r
        fd, part = tempfile.mkstemp(prefix="part.", suffix=".parquet", dir=part_dir)
        os.close(fd)
        _write_part(df, part, out_label)
        gpu = df.filter(pl.col("kind").is_in(["kernel", "memcpy", "memset"]))
        meta_r.update(
            {
                "rank": rank,
                "part": part,
                "rows": df.height,
                "gpu_ops": gpu.height,
                "cpu_device_ops": 0 if gpu.height else df.filter(pl.col("category").is_not_null()).height,
                "first_ts_ns": int(df["ts_ns"].min()) if df.height else None,
                "last_end_ns": int((df["ts_ns"] + df["dur_ns"]).max()) if df.height else None,
                "devices": sorted({int(d) for d in gpu["device"].drop_nulls().unique().to_list()}),
                "window": src.window,
                "source_file": str(src.path),
                **_part_summary(df, part, out_label),
            }
        )
        out.append(meta_r)
        del df, gpu
        release_memory()
    return out


#: rows per row group of a part file = rows per batch streamed into the final file
PART_ROWS = 1 << 17
#: parts of up to this many (in-memory) bytes are uncompressed Arrow IPC, larger ones lz4 Parquet
IPC_PART_MAX_BYTES = 512 << 20
_COMM = pl.col("category") == "communication"
_COLL_KEY = pl.coalesce(pl.col("pg_name").cast(pl.String), pl.lit("fam:") + pl.col("family").cast(pl.String))


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


def _part_summary(df: pl.DataFrame, part: str, out_label: str) -> dict[str, Any]:
    """What the parent needs from a part besides its rows: collective rows (clock alignment, a small
    Parquet file), traced steps (dedupe of capture-side step records), step-id and collective
    sequence ranges (several windows of one rank)."""
    comm = df.filter(_COMM)
    comm_part = None
    if comm.height:
        comm_part = part + ".comm.parquet"
        try:
            comm.write_parquet(comm_part, compression="lz4")
        except OSError as e:
            raise _part_error(e, part, out_label) from None
    steps = df.filter(pl.col("kind") == "step").select("ts_ns", "step_id")
    sid = df.get_column("step_id")
    seq = comm.filter(pl.col("coll_seq").is_not_null()).group_by(_COLL_KEY.alias("_k")).agg(
        pl.col("coll_seq").min().alias("_lo"), pl.col("coll_seq").max().alias("_hi")
    )
    return {
        "comm_part": comm_part,
        "steps": {"ts_ns": steps["ts_ns"].to_list(), "step_id": steps["step_id"].to_list()},
        "step_id_max": None if sid.max() is None else int(sid.max()),  # type: ignore[arg-type]
        "step_id_any": sid.null_count() < df.height,
        "coll_seq_ranges": {k: (int(lo), int(hi)) for k, lo, hi in seq.iter_rows() if k is not None},
    }


def _dedupe_steps(rank_df: pl.DataFrame, extra: pl.DataFrame) -> tuple[pl.DataFrame, dict[int, int]]:
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
            tol = int(max(1, (steps["dur_ns"].min() or 1)) // 2)
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


def _world_meta(metas: list[dict[str, Any]], ranks: list[int], quality: QualityLog) -> dict[str, Any]:
    ws = max([m.get("world_size") or 0 for m in metas] + [len(ranks)])
    expected = set(range(ws))
    missing = sorted(expected - set(ranks)) if ws and max(ranks, default=0) < ws else []
    if missing and len(missing) < ws:
        quality.add(
            "missing_ranks",
            f"ranks {_ranges(missing)} of {ws} are absent; cross-rank results cover only the ranks present",
            missing=missing,
        )
    per_rank = []
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
) -> ConvertResult:
    """Convert one capture's sources into ``out`` (see module docstring).

    ``rules``: a rules file path (extends the defaults). ``extra_frames``:
    schema rows from the capture (step records, counters, markers) merged by
    rank. ``metadata``: merged into the footer metadata.
    """
    t0 = time.perf_counter()
    tune_runtime()
    out = Path(out)
    sources = discover(inputs)
    for s in sources:
        if s.path.resolve() == out.resolve():
            raise InputError(f"{out}: the output would overwrite an input; choose another -o")
    rules_path = str(rules) if isinstance(rules, (str, Path)) else None
    if isinstance(rules, RuleSet):
        rules_path = rules.sources[0] if rules.sources else None
    if rules_path:
        load_rules(rules_path)  # validate early, one-line error
    in_bytes = sum(s.path.stat().st_size if s.path.is_file() else sum(f.stat().st_size for f in s.path.iterdir()) for s in sources)
    # refuse early (before the work) when the output exists or cannot be written
    if out.exists() and not force:
        raise OutputError(f"{out}: exists; pass --force to overwrite")
    if not (out.parent if str(out.parent) else Path(".")).is_dir():
        raise OutputError(f"{out}: directory {out.parent} does not exist; create it first")
    quality = QualityLog()
    part_dir = tempfile.mkdtemp(prefix=".tracekit-parts-", dir=str(out.parent if str(out.parent) else "."))
    metas: list[dict[str, Any]] = []
    try:
        n = len(sources)
        jobs = jobs or 1
        prog = _Progress(progress, n, on_progress)
        if jobs > 1 and n > 1 and in_bytes >= _PARALLEL_MIN_BYTES:
            import multiprocessing as mp

            with ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn")) as ex:
                futs = {ex.submit(convert_source, s, rules_path, part_dir, str(out)): s for s in sources}
                for f in as_completed(futs):
                    try:
                        metas.extend(f.result())
                    except TracekitError:
                        raise
                    except Exception as e:  # noqa: BLE001
                        raise InputError(f"{futs[f].path}: conversion failed ({type(e).__name__}: {e})") from None
                    prog.step(str(futs[f].path.name))
        else:
            # one rank at a time (its JSON decoded by a thread pool): memory of one rank.
            # (Writing a part on a thread while the next rank parses saved ~1 s of 18 at +35 MB peak: not taken.)
            for s in sources:
                metas.extend(convert_source(s, rules_path, part_dir, str(out)))
                prog.step(s.path.name)
        prog.close()
        _check_empty(metas, quality)
        _resolve_ranks(metas, quality)
        _check_same_capture(metas)
        ranks = sorted({m["rank"] for m in metas})
        extra = pl.concat([conform(e) for e in extra_frames if e is not None and e.height], how="vertical_relaxed") if any(
            e is not None and e.height for e in extra_frames
        ) else None
        md = _world_meta(metas, ranks, quality)
        for m in metas:
            for q in m.get("quality") or []:
                quality.add(q["code"], q["message"], severity=q.get("severity", "warning"), rank=m["rank"])
        if not any(m["gpu_ops"] for m in metas):
            if any(m.get("cpu_device_ops") for m in metas):  # CPU mode (docs/cpu_mode.md)
                md["device_mode"] = "cpu"
                quality.add("no_gpu_events", "the trace has no GPU kernels, copies or memsets; CPU mode: operators on the "
                            "forward thread and gloo collectives stand in for device work (docs/cpu_mode.md)", severity="info")
            else:
                quality.add("no_gpu_events", "the trace has no GPU kernels, copies or memsets; analyses of GPU time will be empty")
        offsets, align_info = _align(metas, ranks, quality, align)
        _check_skew(metas, offsets, quality)
        rows = 0
        with TraceWriter(out, force=force) as w:
            first, last = None, None
            for r in ranks:
                parts = sorted((m for m in metas if m["rank"] == r), key=lambda m: (m.get("window") or 0, m.get("first_ts_ns") or 0))
                ex = extra.filter(pl.col("rank") == r) if extra is not None else None
                n, lo, hi = _write_rank(w, r, parts, offsets.get(r, 0), ex)
                rows += n
                if lo is not None:
                    first = lo if first is None else min(first, lo)
                    last = hi if last is None else max(last, hi)
                for m in parts:
                    for f in (m["part"], m.get("comm_part")):
                        if f:
                            os.unlink(f)
            if extra is not None:
                orphan = extra.filter(~pl.col("rank").is_in(ranks))
                if orphan.height:
                    w.write(orphan.sort(["rank", "ts_ns"]))
                    rows += orphan.height
            meta: dict[str, Any] = {
                **md,
                "source_files": [str(s.path) for s in sources],
                "window_ns": [first, last],
                "clock_offsets_ns": {str(r): int(offsets.get(r, 0)) for r in ranks},
                "clock_alignment": align_info,
                "rules": rules_path or "default",
            }
            for k, v in (metadata or {}).items():
                if k == "quality":
                    continue
                meta[k] = v
            caller_q = list((metadata or {}).get("quality", []))
            caller_codes = {q.get("code") for q in caller_q if isinstance(q, dict)}
            # the capture knows more about missing ranks than the file count does: keep its flag only
            meta["quality"] = [q.to_json() for q in quality if not (q.code == "missing_ranks" and "missing_ranks" in caller_codes)] + caller_q
            w.close(meta)
    finally:
        shutil.rmtree(part_dir, ignore_errors=True)
    return ConvertResult(out, ranks, rows, time.perf_counter() - t0, in_bytes, meta, meta["quality"])


#: First events of two ranks further apart than this: files of different captures (refused).
MIXED_CAPTURE_NS = 600 * 10**9
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
    try:
        from tracekit.analysis.align import align_clocks
    except ImportError:
        return {}, {"applied": False, "reason": "alignment unavailable"}
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


# ---- final write: parts -> output, one rank at a time, in bounded batches -----------------------


def _write_rank(w: TraceWriter, r: int, parts: list[dict[str, Any]], offset: int, extra: pl.DataFrame | None) -> tuple[int, int | None, int | None]:
    """Stream rank ``r``'s parts into ``w``; returns (rows, first ts, last end) after the clock offset.

    Per part: window shifts of step ids / collective sequence numbers (several
    profiler windows, see :func:`_window_shifts`), the rank column, the clock
    offset. Capture-side rows (``extra``) lose the steps the trace carries
    (:func:`_dedupe_steps`) and are merged in time order. Memory: one batch of
    :data:`PART_ROWS` rows (plus the extra rows), never the whole rank — unless
    windows overlap in time, when the rank is sorted in memory.
    """
    shifts = _window_shifts(parts)
    sid_map: dict[int, int] = {}
    if extra is not None and extra.height:
        traced = pl.concat([
            _shifted(pl.DataFrame(m["steps"], schema={"ts_ns": pl.Int64, "step_id": pl.Int64}).with_columns(pl.lit("step").alias("kind")), sh)
            for m, sh in zip(parts, shifts)
        ], how="vertical_relaxed")
        extra, sid_map = _dedupe_steps(traced, extra)
        extra = conform(extra).sort("ts_ns", maintain_order=True) if extra.height else None
    else:
        extra = None
    disjoint = all((parts[i].get("last_end_ns") or 0) <= (parts[i + 1].get("first_ts_ns") or 0) for i in range(len(parts) - 1))
    if disjoint:
        batches = (_transform(b, sh, sid_map) for m, sh in zip(parts, shifts) for b in _part_batches(m["part"]))
    else:
        whole = pl.concat([_transform_df(pl.from_arrow(_read_part(m["part"])), sh, sid_map) for m, sh in zip(parts, shifts)],  # type: ignore[arg-type]
                          how="vertical_relaxed")
        batches = (pa.Table.from_batches([b]) for b in to_arrow(whole.sort("ts_ns", maintain_order=True)).to_batches(PART_ROWS))
    rows, lo, hi = 0, None, None
    for tbl in _merge_extra(batches, extra):
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


def _is_ipc(part: str) -> bool:
    with open(part, "rb") as f:
        return f.read(4) != b"PAR1"


def _part_batches(part: str) -> Iterator[pa.Table]:
    if _is_ipc(part):
        with ipc.open_stream(part) as r:
            for b in r:
                yield pa.Table.from_batches([b])
        return
    f = pq.ParquetFile(part)
    for i in range(f.num_row_groups):
        yield f.read_row_group(i)


def _read_part(part: str) -> pa.Table:
    if _is_ipc(part):
        with ipc.open_stream(part) as r:
            return r.read_all()
    return pq.read_table(part)


def _window_shifts(parts: list[dict[str, Any]]) -> list[tuple[int, dict[str, int]]]:
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
            pl.when(_COMM & pl.col("coll_seq").is_not_null())
            .then(pl.col("coll_seq") + _COLL_KEY.replace_strict(seq_shift, default=0, return_dtype=pl.Int64))
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
        both = pl.concat([pl.from_arrow(t), conform(e)], how="vertical_relaxed")  # type: ignore[list-item]
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
            tbl = tbl.set_column(j, ARROW_SCHEMA.field(name), pc.add(tbl.column(j), pa.scalar(offset, pa.int64())))
    return tbl


def _const(v: int, n: int) -> pa.Array:
    import numpy as np

    return pa.array(np.full(n, v, dtype=np.int32))


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
    return pq.read_metadata(path).num_rows
