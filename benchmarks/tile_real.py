"""Scale inputs made of a REAL GPU capture, tiled in time and across ranks.

The source is a ``trace.parquet`` converted from a real capture (the scale benchmark uses the
2×H200 nsys set in ``shared/traces/nsys/generated-h200``: NCCL all-reduces every step, NVTX steps,
planted host stalls, 64 MiB H2D/D2H PCIe phases, 2 kHz GPU metrics with PCIe throughput).

``tile_trace(src, out, ranks=R, kernels=N)`` writes a trace with ``N`` kernels in all over ``R``
ranks. Target rank ``t`` is a copy of source rank ``t % S`` (``S`` source ranks); ranks
``g*S .. g*S+S-1`` form process group ``tp{g}`` (their collectives are matched together, the
``S``-rank groups of a data-parallel x tensor-parallel job). Each rank repeats its source rank
``T`` times; tile ``k`` is shifted by ``k * (extent + gap_ns)`` and its step ids, collective
sequence numbers, correlation and external ids by ``k`` times their span, so every tile is a
new set of steps and collective instances. Each tile is one profiler window
(``capture.profiler_windows``): the gap between tiles was "not recorded", like a capture with
``--profile-every``. ``counter_tiles`` keeps the GPU-metrics counter rows in the first tiles only
(the number of counter-derived PCIe phases grows with it); by default every tile keeps them.

``write_kineto(trace, outdir)`` writes the same events as one Kineto JSON per rank (GPU kernels,
copies and memsets with their launching runtime calls, ``ProfilerStep#N`` per step), the input
HolisticTraceAnalysis reads, so both tools measure the same events.
"""

from __future__ import annotations

import json
import re
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from tracekit.schema import TraceWriter, conform, read_metadata, scan_trace

__all__ = ["TileInfo", "tile_trace", "write_kineto"]

_SHIFT_IDS = ("step_id", "coll_seq", "correlation", "external_id", "graph_id")


@dataclass
class TileInfo:
    ranks: int
    kernels: int
    kernels_per_rank: int
    tiles: int
    rows: int
    steps_per_rank: int
    collectives_per_rank: int
    profiler_windows: int
    source_kernels_per_rank: int


def _spans(src: pl.DataFrame) -> dict[str, int]:
    out = {}
    for c in _SHIFT_IDS:
        s = src.get_column(c)
        lo, hi = s.min(), s.max()
        out[c] = int(hi) - min(int(lo), 0) + 1 if hi is not None and lo is not None else 0  # type: ignore[arg-type]
    return out


def tile_trace(src: str | Path, out: str | Path, *, ranks: int, kernels: int, gap_ns: int = 2_000_000,
               counter_tiles: int | None = None, force: bool = True, batch_tiles: int = 12) -> TileInfo:
    """Write the tiled trace (module doc); returns what it holds."""
    meta = read_metadata(src)
    lf = scan_trace(src)
    base = lf.select(pl.col("ts_ns").min(), (pl.col("ts_ns") + pl.col("dur_ns").fill_null(0)).max().alias("e")).collect()
    t0, t1 = int(base["ts_ns"][0]), int(base["e"][0])
    period = (t1 - t0) + gap_ns
    src_ranks = sorted(int(r) for r in lf.select(pl.col("rank").unique()).collect()["rank"].to_list())
    per_src = {r: lf.filter(pl.col("rank") == r).collect() for r in src_ranks}
    S = len(src_ranks)
    k_src = min(int((d.get_column("kind") == "kernel").sum()) for d in per_src.values())
    kpr = max(1, kernels // ranks)
    tiles = max(1, math.ceil(kpr / k_src))
    rank_meta = {int(m["rank"]): m for m in meta.get("ranks", [])}
    w = TraceWriter(out, force=force)
    rows = 0
    steps = colls = 0
    try:
        for t in range(ranks):
            s = src_ranks[t % S]
            g = t // S
            d = per_src[s]
            members = f"[{', '.join(str(g * S + i) for i in range(S))}]"
            is_coll = pl.col("coll_name").is_not_null() | (pl.col("category") == "communication")
            d = d.with_columns(
                pl.lit(t, pl.Int32).alias("rank"), pl.lit(t, pl.Int32).alias("device"),
                pl.when(is_coll).then(pl.lit(f"tp{g}")).otherwise(pl.col("pg_name").cast(pl.String)).alias("pg_name"),
                pl.when(is_coll).then(pl.lit(members)).otherwise(pl.col("pg_ranks").cast(pl.String)).alias("pg_ranks"),
                pl.when(is_coll).then(pl.lit(S, pl.Int32)).otherwise(pl.col("coll_group_size")).alias("coll_group_size"),
            )
            sp = _spans(d)
            steps = int((d.get_column("kind") == "step").sum()) * tiles
            colls = int(d.select(is_coll & (pl.col("kind") == "kernel")).to_series().sum()) * tiles
            is_step_name = pl.col("name").cast(pl.String).str.contains(r"^step \d+$")
            batch: list[pl.DataFrame] = []
            for k in range(tiles):
                off = k * period
                x = d if counter_tiles is None or k < counter_tiles else d.filter(pl.col("kind") != "counter")
                x = x.with_columns(
                    pl.col("ts_ns") + off, pl.col("launch_ts_ns") + off,
                    *[(pl.col(c) + k * sp[c]) for c in _SHIFT_IDS if sp[c]],
                ).with_columns(
                    pl.when(is_step_name & pl.col("step_id").is_not_null())
                    .then(pl.lit("step ") + pl.col("step_id").cast(pl.String))
                    .otherwise(pl.col("name").cast(pl.String)).alias("name"),
                )
                batch.append(x)
                if len(batch) >= batch_tiles or k == tiles - 1:
                    part = conform(pl.concat(batch, how="vertical_relaxed"))
                    w.write(part)
                    rows += part.height
                    batch = []
        windows = [[t0 + k * period, t0 + k * period + (t1 - t0)] for k in range(tiles)]
        m: dict[str, Any] = {k: v for k, v in meta.items() if k not in ("quality", "clock_alignment")}
        m.update(
            world_size=ranks,
            ranks=[dict(rank_meta.get(src_ranks[t % S], {}), rank=t, device=t) for t in range(ranks)],
            clock_offsets_ns={str(t): 0 for t in range(ranks)},
            window_ns=[t0, t0 + (tiles - 1) * period + (t1 - t0)],
            capture=dict(meta.get("capture") or {}, profiler_windows=windows),
            source_files=[f"tiled from {src}"],
        )
        w.close(m)
    except BaseException:
        w.abort()
        raise
    return TileInfo(ranks, tiles * k_src * ranks, tiles * k_src, tiles, rows, steps, colls, tiles, k_src)


def write_kineto(trace: str | Path, outdir: str | Path) -> list[Path]:
    """One Kineto JSON per rank of ``trace`` (module doc); returns the files."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    meta = read_metadata(trace)
    lf = scan_trace(trace)
    base = int(lf.select(pl.col("ts_ns").min()).collect().item())
    ranks = sorted(int(r) for r in lf.select(pl.col("rank").unique()).collect()["rank"].to_list())
    files = []
    us = lambda c: ((pl.col(c) - base).cast(pl.Float64) / 1000.0)  # noqa: E731
    for r in ranks:
        d = lf.filter(pl.col("rank") == r).collect()
        kind = pl.col("kind").cast(pl.String)
        gpu = d.filter(kind.is_in(["kernel", "memcpy", "memset"]) & pl.col("correlation").is_not_null())
        cat = pl.col("kind").cast(pl.String).replace_strict({"kernel": "kernel", "memcpy": "gpu_memcpy", "memset": "gpu_memset"})
        ev_gpu = gpu.select(pl.struct(
            pl.lit("X").alias("ph"), cat.alias("cat"), pl.col("name").cast(pl.String).alias("name"),
            pl.col("device").cast(pl.Int64).alias("pid"), pl.col("stream").cast(pl.Int64).alias("tid"),
            us("ts_ns").alias("ts"), (pl.col("dur_ns").cast(pl.Float64) / 1000.0).alias("dur"),
            pl.struct(pl.col("device").cast(pl.Int64).alias("device"), pl.col("stream").cast(pl.Int64).alias("stream"),
                      pl.col("correlation").alias("correlation"),
                      pl.col("external_id").fill_null(pl.col("correlation")).alias("External id")).alias("args"),
        ).struct.json_encode().alias("j"))
        launches = gpu.filter(pl.col("launch_ts_ns").is_not_null()).select(pl.struct(
            pl.lit("X").alias("ph"), pl.lit("cuda_runtime").alias("cat"),
            pl.col("launch_name").cast(pl.String).fill_null("cudaLaunchKernel").alias("name"),
            pl.lit(100 + r, pl.Int64).alias("pid"), pl.col("launch_tid").fill_null(1).alias("tid"),
            us("launch_ts_ns").alias("ts"), (pl.col("launch_dur_ns").fill_null(1000).cast(pl.Float64) / 1000.0).alias("dur"),
            pl.struct(pl.col("correlation").alias("correlation"),
                      pl.col("external_id").fill_null(pl.col("correlation")).alias("External id")).alias("args"),
        ).struct.json_encode().alias("j"))
        steps = d.filter(kind == "step").select(pl.struct(
            pl.lit("X").alias("ph"), pl.lit("user_annotation").alias("cat"),
            (pl.lit("ProfilerStep#") + pl.col("step_id").cast(pl.String)).alias("name"),
            pl.lit(100 + r, pl.Int64).alias("pid"), pl.col("tid").fill_null(1).alias("tid"),
            us("ts_ns").alias("ts"), (pl.col("dur_ns").cast(pl.Float64) / 1000.0).alias("dur"),
        ).struct.json_encode().alias("j"))
        body = pl.concat([ev_gpu, launches, steps]).get_column("j")
        head = {"schemaVersion": 1, "baseTimeNanoseconds": base,
                "distributedInfo": {"backend": "nccl", "rank": r, "world_size": int(meta.get("world_size") or len(ranks))},
                "deviceProperties": []}
        p = outdir / f"rank{r}.trace.json"
        with open(p, "w") as f:
            f.write(json.dumps(head)[:-1] + ', "traceEvents": [\n')
            for i in range(0, body.len(), 200_000):
                f.write(("," if i else "") + ",\n".join(body.slice(i, 200_000).to_list()))
            f.write("\n]}\n")
        files.append(p)
        del d, gpu
    return files


# ---- Kineto JSON tiled at the text level (the real file's own bytes, numbers shifted) -----------------

_TS = re.compile(rb'("ts"\s*:\s*)(-?\d+)')
_IDS = re.compile(rb'("(?:External id|correlation|Python id|Python parent id|Ev Idx|id)"\s*:\s*)(\d+)')
_STEP = re.compile(rb'("name"\s*:\s*"(?:forward|ProfilerStep|step|decode|prefill)#)(\d+)')
_RANK = re.compile(rb'("rank"\s*:\s*)\d+')


def _text_body(raw: bytes) -> tuple[bytes, bytes, bytes]:
    """(head up to and including ``"traceEvents": [``, the events between the brackets, the tail from ``]``)."""
    m = re.search(rb'"traceEvents"\s*:\s*\[', raw)
    if m is None:
        raise ValueError("no traceEvents array")
    end = raw.rfind(b"]")
    return raw[: m.end()], raw[m.end(): end].strip().rstrip(b","), raw[end:]


def _shift(body: bytes, rx: re.Pattern[bytes], by: int) -> bytes:
    return rx.sub(lambda m: m.group(1) + str(int(m.group(2)) + by).encode(), body) if by else body


def tile_kineto_json(src: str | Path, out: str | Path, *, copies: int, rank: int | None = None,
                     world_size: int | None = None, gzip_level: int | None = None) -> dict[str, int]:
    """Write ``copies`` back-to-back copies of the real Kineto trace ``src``'s events as one file.

    The events are the source's own text: copy ``k`` has its ``ts`` shifted by ``k`` times the
    trace's span (+1 ms; the integer part only, so the decimals stay the source's), its ids
    (``External id``, ``correlation``, flow ``id``, ``Ev Idx``) by ``k`` times their largest value,
    and numbered step labels (``forward#N``, ``ProfilerStep#N``) by ``k`` times their count, so every
    copy is a new set of steps. ``rank`` rewrites ``distributedInfo.rank`` (8 ranks of one real
    file), or adds ``distributedInfo`` (``rank``, ``world_size``) when the trace has none, written as
    torch writes it (``"rank": N``: HolisticTraceAnalysis finds ranks with that pattern). Returns the sizes written.
    """
    import gzip as _gz

    raw = Path(src).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = _gz.decompress(raw)
    head, body, tail = _text_body(raw)
    ts = [int(m.group(2)) for m in _TS.finditer(body)]
    span_us = (max(ts) - min(ts)) + 1000 if ts else 0
    id_span = max((int(m.group(2)) for m in _IDS.finditer(body)), default=0) + 1
    step_span = max((int(m.group(2)) for m in _STEP.finditer(body)), default=-1) + 1
    if rank is not None and _RANK.search(head):
        head = _RANK.sub(lambda m: m.group(1) + str(rank).encode(), head, count=1)
    elif rank is not None:
        di = f'\n  "distributedInfo": {{"backend": "nccl", "rank": {rank}, "world_size": {world_size or rank + 1}}},'
        brace = head.index(b"{")
        head = head[: brace + 1] + di.encode() + head[brace + 1:]
    opener = (lambda p: _gz.open(p, "wb", compresslevel=gzip_level)) if gzip_level else (lambda p: open(p, "wb"))
    n = 0
    with opener(out) as f:
        f.write(head + b"\n")
        for k in range(copies):
            part = _shift(_shift(_shift(body, _TS, k * span_us), _IDS, k * id_span), _STEP, k * step_span)
            f.write((b",\n" if k else b"") + part)
            n += len(part)
        f.write(b"\n" + tail)
    return {"events_bytes": n, "copies": copies, "span_us": span_us}


def cut_kineto_json(src: str | Path, out: str | Path, *, target_bytes: int) -> dict[str, int]:
    """The first stretch of the real Kineto trace ``src`` in time, about ``target_bytes`` of event text.

    Every event that starts before the cut is kept as its own text (metadata events, which carry no
    ``dur``, always), so the result is the same capture recorded for a shorter time. Returns its size.
    """
    import gzip as _gz

    import msgspec
    import numpy as np

    class _Ts(msgspec.Struct):
        ts: Any = None
        ph: Any = None

    raw = Path(src).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = _gz.decompress(raw)
    head, body, tail = _text_body(raw)
    del raw
    events = msgspec.json.decode(b"[" + body + b"]", type=list[msgspec.Raw])
    dec = msgspec.json.Decoder(_Ts)
    ts = np.empty(len(events))
    size = np.empty(len(events), dtype=np.int64)
    for i, e in enumerate(events):
        v = dec.decode(e)
        ts[i] = -np.inf if v.ph == "M" or not isinstance(v.ts, (int, float)) else float(v.ts)
        size[i] = len(e)
    order = np.argsort(ts, kind="stable")
    reach = np.searchsorted(np.cumsum(size[order]), target_bytes)
    cut = ts[order[min(reach, len(order) - 1)]]
    kept = [e for e, t in zip(events, ts) if t <= cut]
    with open(out, "wb") as f:
        f.write(head + b"\n")
        for i in range(0, len(kept), 100_000):
            f.write((b",\n" if i else b"") + b",\n".join(bytes(e) for e in kept[i:i + 100_000]))
        f.write(b"\n" + tail)
    return {"events": len(kept), "of": len(events), "bytes": Path(out).stat().st_size}
