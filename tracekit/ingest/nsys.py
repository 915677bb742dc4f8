"""Nsight Systems reader: ``.sqlite`` exports and ``parquetdir`` directories → raw trace rows.

Contract of :func:`read_nsys` (same as ``read_kineto``): one report in, a *raw*
frame out — rows follow :mod:`tracekit.schema` but are not finalized (no launch
join, categories, steps or collective numbering: that is
``tracekit.ingest.common.finalize_rank``, run once per rank).

What becomes a row (facts: ``shared/docs/nsys_schema.md``):

* ``kernel``: ``CUPTI_ACTIVITY_KIND_KERNEL``; name = demangled name via
  ``StringIds`` (``shortName`` when missing); grid/block/registers/shared memory,
  ``correlation``, ``graph_id`` / ``graph_node_id``.
* ``memcpy`` / ``memset``: ``bytes``, ``memcpy_kind`` (HtoD, DtoH, DtoD, PtoP, HtoH;
  array copies fold into the device side, unified-memory copies into HtoD/DtoH/DtoD),
  ``src_mem`` / ``dst_mem``; names as Kineto writes them (``Memcpy HtoD (Pinned -> Device)``).
* ``runtime``: runtime **and** driver API calls, ``_v\\d+`` suffix stripped, ``src``
  ``cuda_runtime`` / ``cuda_driver``; ``sync``: ``CUPTI_ACTIVITY_KIND_SYNCHRONIZATION``.
* ``range``: NVTX push/pop and start/end ranges (incl. the obsolete NVTXT kinds),
  ``src`` = NVTX domain name (``nvtx`` for the default domain); ``instant``: NVTX marks.
* ``counter``: ``GPU_METRICS`` samples, names from :mod:`tracekit.ingest.nsys_metrics`.

Times: ``ts_ns = TARGET_INFO_SESSION_START_TIME.utcEpochNs + relative ts`` (skipped
when the export was made with ``--ts-normalize``), so reports of several ranks
line up on the shared UTC clock. GPU rows use Kineto's lane convention
(``pid`` = device, ``tid`` = stream); CPU rows carry the real pid/tid unpacked
from ``globalTid``.

Ranks: ``rank`` argument, else a rank in the file name (``rank0``, ``rank_1``,
``-TP-3``), else 0. A report that holds several processes with GPU work (one
nsys run around a whole ``torchrun``) is split: its GPU processes become ranks
``base, base+1, ...`` ordered by device; :func:`split_ranks` returns one
``(frame, meta)`` per rank so each can be finalized on its own (correlation ids
are per process).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import polars as pl

from tracekit.ingest.readers import Reader
from tracekit._errors import InputError, QualityLog
from tracekit.ingest.nsys_metrics import counter_name, value_scale
from tracekit.ingest.nsys_source import SESSION_TABLE, NsysSource, is_nsys_path, open_source
from tracekit.schema import conform, empty_frame

__all__ = ["read_nsys", "split_ranks", "rank_from_name", "is_nsys_path", "COPY_KINDS", "MEM_KINDS", "SYNC_NAMES"]

#: ENUM_CUDA_MEMCPY_OPER -> memcpy_kind
COPY_KINDS = {0: "other", 1: "HtoD", 2: "DtoH", 3: "HtoD", 4: "DtoH", 5: "DtoD", 6: "DtoD", 7: "DtoD", 8: "DtoD",
              9: "HtoH", 10: "PtoP", 11: "HtoD", 12: "DtoH", 13: "DtoD"}
#: ENUM_CUDA_MEM_KIND -> src_mem / dst_mem
MEM_KINDS = {0: "Pageable", 1: "Pinned", 2: "Device", 3: "Array", 4: "Managed", 5: "Device Static",
             6: "Managed Static", 7: "Unknown"}
#: ENUM_CUPTI_SYNC_TYPE -> sync row name (Kineto's cuda_sync names)
SYNC_NAMES = {0: "Unknown Sync", 1: "Event Sync", 2: "Stream Wait Event", 3: "Stream Sync", 4: "Context Sync"}

_RANGE_TYPES = (59, 60, 70, 71)  # NvtxPushPopRange, NvtxStartEndRange, Nvtxt variants
_MARK_TYPES = (34, 65)
_DOMAIN_CREATE = 75
_SENTINEL = 0xFFFFFFFF  # uint32 "none" in stream/event columns

_RANK_PATTERNS = (
    re.compile(r"rank[-_]?(\d+)", re.IGNORECASE),
    re.compile(r"(?:^|[-_.])tp[-_](\d+)(?!\d)", re.IGNORECASE),
)


def rank_from_name(path: str | Path) -> int | None:
    """Rank encoded in a file/dir name (``tp2_rank0.sqlite`` → 0, ``x-TP-3.sqlite`` → 3), else None."""
    name = Path(path).name
    for pat in _RANK_PATTERNS:
        m = pat.search(name)
        if m:
            return int(m.group(1))
    return None


def _pid(col: str) -> pl.Expr:
    return ((pl.col(col) // (1 << 24)) % (1 << 24)).cast(pl.Int64)


def _tid(col: str) -> pl.Expr:
    return (pl.col(col) % (1 << 24)).cast(pl.Int64)


def _nullify_sentinel(col: str) -> pl.Expr:
    return pl.when(pl.col(col) >= _SENTINEL).then(None).otherwise(pl.col(col)).alias(col)


class _Reader:
    def __init__(self, src: NsysSource, quality: QualityLog) -> None:
        self.src = src
        self.q = quality
        sid = src.read("StringIds", ["id", "value"])
        self.strings = (
            sid.select(pl.col("id").cast(pl.Int64), pl.col("value").cast(pl.String))
            if sid is not None and sid.width
            else pl.DataFrame(schema={"id": pl.Int64, "value": pl.String})
        )
        self.meta_export = self._kv("META_DATA_EXPORT")
        sess = src.read(SESSION_TABLE)
        if sess is None or sess.height == 0 or "utcEpochNs" not in sess.columns:
            raise InputError(f"{src.path}: {SESSION_TABLE} is empty; cannot place events in time — re-export the report")
        self.session_ns = int(sess["utcEpochNs"][0])
        normalized = str(self.meta_export.get("EXPORT_PARAM_TIME_NORMALIZE", "false")).lower() == "true"
        self.offset = 0 if normalized else self.session_ns
        self.normalized = normalized
        self.session_row = sess.row(0, named=True)
        self.cuda_dev = self._cuda_devices()

    def _kv(self, table: str) -> dict[str, str]:
        df = self.src.read(table, ["name", "value"])
        if df is None or df.width < 2:
            return {}
        return {str(k): str(v) for k, v in df.iter_rows()}

    def _cuda_devices(self) -> pl.DataFrame:
        df = self.src.read("TARGET_INFO_CUDA_DEVICE", ["gpuId", "cudaId", "pid"])
        if df is None or df.width < 3 or df.height == 0:
            return pl.DataFrame(schema={"_proc": pl.Int64, "_gpu": pl.Int64, "_cuda": pl.Int64})
        return df.select(pl.col("pid").alias("_proc"), pl.col("gpuId").alias("_gpu"),
                         pl.col("cudaId").alias("_cuda")).unique(["_proc", "_gpu"])

    def name_of(self, df: pl.DataFrame, id_col: str, out: str) -> pl.DataFrame:
        """Left-join StringIds on ``id_col`` → string column ``out``."""
        s = self.strings.rename({"id": id_col, "value": out})
        return df.join(s, on=id_col, how="left")

    def _device(self, df: pl.DataFrame) -> pl.DataFrame:
        """deviceId (GPU id) → CUDA ordinal of the process (TARGET_INFO_CUDA_DEVICE), else deviceId."""
        df = df.join(self.cuda_dev, left_on=["_proc", "deviceId"], right_on=["_proc", "_gpu"], how="left")
        return df.with_columns(pl.coalesce("_cuda", "deviceId").cast(pl.Int32).alias("device")).drop("_cuda")

    def _gpu_lane(self, kind: str) -> list[pl.Expr]:
        """kind, times and the GPU lane (Kineto convention: pid = device, tid = stream) of a device-side row."""
        return [
            pl.lit(kind).alias("kind"),
            *self._times(),
            pl.col("device"),
            pl.col("streamId").alias("stream"),
            pl.col("device").cast(pl.Int64).alias("pid"),
            pl.col("streamId").alias("tid"),
        ]

    def _times(self, start: str = "start", end: str | None = "end") -> list[pl.Expr]:
        ts = (pl.col(start) + self.offset).alias("ts_ns")
        if end is None:
            return [ts, pl.lit(0, dtype=pl.Int64).alias("dur_ns")]
        dur = (pl.col(end) - pl.col(start)).clip(lower_bound=0).fill_null(0).alias("dur_ns")
        return [ts, dur]

    # -- GPU ops ---------------------------------------------------------------------------------------
    def kernels(self) -> pl.DataFrame | None:
        cols = ["start", "end", "deviceId", "streamId", "correlationId", "globalPid", "demangledName", "shortName",
                "gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ", "registersPerThread", "staticSharedMemory",
                "dynamicSharedMemory", "graphNodeId", "graphId"]
        k = self.src.read("CUPTI_ACTIVITY_KIND_KERNEL", cols)
        if k is None or k.height == 0:
            return None
        k = self.name_of(k, "demangledName", "_dn") if "demangledName" in k.columns else k.with_columns(pl.lit(None, pl.String).alias("_dn"))
        k = self.name_of(k, "shortName", "_sn") if "shortName" in k.columns else k.with_columns(pl.lit(None, pl.String).alias("_sn"))
        k = k.with_columns(_pid("globalPid").alias("_proc"))
        k = self._device(k)
        def opt(c: str) -> pl.Expr:
            return pl.col(c) if c in k.columns else pl.lit(None, dtype=pl.Int64)

        missing = k.filter(pl.col("_dn").is_null() & pl.col("_sn").is_null()).height
        if missing:
            self.q.add("nsys_unnamed_kernels", f"{self.src.path.name}: {missing} kernels without a name in StringIds",
                       count=missing)
        return k.select(
            *self._gpu_lane("kernel"),
            pl.coalesce(pl.when(pl.col("_dn").str.len_bytes() > 0).then(pl.col("_dn")), pl.col("_sn"),
                        pl.lit("<unknown kernel>")).alias("name"),
            pl.col("correlationId").alias("correlation"),
            opt("graphId").alias("graph_id"),
            opt("graphNodeId").alias("graph_node_id"),
            *[opt(a).cast(pl.Int32).alias(b) for a, b in (
                ("gridX", "grid_x"), ("gridY", "grid_y"), ("gridZ", "grid_z"), ("blockX", "block_x"),
                ("blockY", "block_y"), ("blockZ", "block_z"), ("registersPerThread", "registers_per_thread"))],
            (opt("staticSharedMemory").fill_null(0) + opt("dynamicSharedMemory").fill_null(0)).alias("shared_mem_bytes"),
            pl.lit("nsys").alias("src"),
            "_proc",
        )

    def memcpys(self) -> pl.DataFrame | None:
        cols = ["start", "end", "deviceId", "streamId", "correlationId", "globalPid", "bytes", "copyKind", "srcKind",
                "dstKind", "graphNodeId"]
        m = self.src.read("CUPTI_ACTIVITY_KIND_MEMCPY", cols)
        if m is None or m.height == 0:
            return None
        m = self._device(m.with_columns(_pid("globalPid").alias("_proc")))
        kind = pl.col("copyKind").replace_strict(COPY_KINDS, default="other", return_dtype=pl.String)
        smem = pl.col("srcKind").replace_strict(MEM_KINDS, default="Unknown", return_dtype=pl.String)
        dmem = pl.col("dstKind").replace_strict(MEM_KINDS, default="Unknown", return_dtype=pl.String)
        return m.select(
            *self._gpu_lane("memcpy"),
            pl.format("Memcpy {} ({} -> {})", kind, smem, dmem).alias("name"),
            pl.col("correlationId").alias("correlation"),
            (pl.col("graphNodeId") if "graphNodeId" in m.columns else pl.lit(None, pl.Int64)).alias("graph_node_id"),
            pl.col("bytes"),
            kind.alias("memcpy_kind"),
            smem.alias("src_mem"),
            dmem.alias("dst_mem"),
            pl.lit("nsys").alias("src"),
            "_proc",
        )

    def memsets(self) -> pl.DataFrame | None:
        cols = ["start", "end", "deviceId", "streamId", "correlationId", "globalPid", "bytes", "memKind", "graphNodeId"]
        m = self.src.read("CUPTI_ACTIVITY_KIND_MEMSET", cols)
        if m is None or m.height == 0:
            return None
        m = self._device(m.with_columns(_pid("globalPid").alias("_proc")))
        mk = (pl.col("memKind") if "memKind" in m.columns else pl.lit(2, pl.Int64)).replace_strict(
            MEM_KINDS, default="Unknown", return_dtype=pl.String)
        return m.select(
            *self._gpu_lane("memset"),
            pl.format("Memset ({})", mk).alias("name"),
            pl.col("correlationId").alias("correlation"),
            (pl.col("graphNodeId") if "graphNodeId" in m.columns else pl.lit(None, pl.Int64)).alias("graph_node_id"),
            pl.col("bytes"),
            mk.alias("dst_mem"),
            pl.lit("nsys").alias("src"),
            "_proc",
        )

    def syncs(self) -> pl.DataFrame | None:
        cols = ["start", "end", "deviceId", "streamId", "correlationId", "globalPid", "syncType"]
        s = self.src.read("CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", cols)
        if s is None or s.height == 0:
            return None
        s = self._device(s.with_columns(_pid("globalPid").alias("_proc"), _nullify_sentinel("streamId")))
        return s.select(
            *self._gpu_lane("sync"),
            pl.col("syncType").replace_strict(SYNC_NAMES, default="Unknown Sync", return_dtype=pl.String).alias("name"),
            pl.col("correlationId").alias("correlation"),
            pl.lit("cuda_sync").alias("src"),
            "_proc",
        )

    # -- CPU side --------------------------------------------------------------------------------------
    def runtime(self) -> pl.DataFrame | None:
        r = self.src.read("CUPTI_ACTIVITY_KIND_RUNTIME", ["start", "end", "eventClass", "globalTid", "correlationId", "nameId"])
        if r is None or r.height == 0:
            return None
        r = self.name_of(r, "nameId", "_n")
        cls = pl.col("eventClass") if "eventClass" in r.columns else pl.lit(None, pl.Int64)
        return r.select(
            pl.lit("runtime").alias("kind"),
            *self._times(),
            _pid("globalTid").alias("pid"),
            _tid("globalTid").alias("tid"),
            pl.col("_n").fill_null("<unknown api>").str.replace(r"_v\d+$", "").alias("name"),
            pl.col("correlationId").alias("correlation"),
            pl.when(cls == 0).then(pl.lit("cuda_runtime")).when(cls == 1).then(pl.lit("cuda_driver"))
            .otherwise(pl.lit("cuda_api")).alias("src"),
            _pid("globalTid").alias("_proc"),
        )

    def nvtx(self) -> pl.DataFrame | None:
        cols = ["start", "end", "eventType", "text", "textId", "globalTid", "domainId"]
        n = self.src.read("NVTX_EVENTS", cols)
        if n is None or n.height == 0:
            return None
        for c, dt in (("text", pl.String), ("textId", pl.Int64), ("domainId", pl.Int64)):
            if c not in n.columns:
                n = n.with_columns(pl.lit(None, dtype=dt).alias(c))
        n = self.name_of(n, "textId", "_t")
        n = n.with_columns(pl.coalesce("text", "_t").alias("_text"))
        dom = (
            n.filter(pl.col("eventType") == _DOMAIN_CREATE)
            .select(pl.col("domainId"), pl.col("_text").alias("_domain"))
            .unique("domainId", keep="last")
        )
        ev = n.filter(pl.col("eventType").is_in(_RANGE_TYPES + _MARK_TYPES)).join(dom, on="domainId", how="left")
        if ev.height == 0:
            return None
        is_mark = pl.col("eventType").is_in(_MARK_TYPES)
        open_ranges = ev.filter(~is_mark & pl.col("end").is_null()).height
        if open_ranges:
            self.q.add("nsys_open_nvtx_ranges", f"{self.src.path.name}: {open_ranges} NVTX ranges without an end "
                       "(still open when the capture stopped); kept with duration 0", count=open_ranges)
        return ev.select(
            pl.when(is_mark).then(pl.lit("instant")).otherwise(pl.lit("range")).alias("kind"),
            (pl.col("start") + self.offset).alias("ts_ns"),
            pl.when(is_mark).then(0).otherwise((pl.col("end") - pl.col("start")).clip(lower_bound=0))
            .fill_null(0).cast(pl.Int64).alias("dur_ns"),
            _pid("globalTid").alias("pid"),
            _tid("globalTid").alias("tid"),
            pl.col("_text").fill_null("<unnamed>").alias("name"),
            pl.coalesce(
                pl.col("_domain"),
                pl.when(pl.col("domainId").fill_null(0) == 0).then(pl.lit("nvtx"))
                .otherwise(pl.format("nvtx_domain_{}", pl.col("domainId"))),
            ).alias("src"),
            _pid("globalTid").alias("_proc"),
        )

    def metrics(self) -> tuple[pl.DataFrame | None, dict[str, str]]:
        g = self.src.read("GPU_METRICS", ["timestamp", "typeId", "metricId", "value"])
        names = self.src.read("TARGET_INFO_GPU_METRICS", ["typeId", "metricId", "metricName"])
        if g is None or g.height == 0 or names is None or names.height == 0:
            return None, {}
        names = names.unique(["typeId", "metricId"])
        mapping = {m: counter_name(m) for m in names["metricName"].unique().to_list() if m is not None}
        names = names.with_columns(pl.col("metricName").replace_strict(mapping, default=None, return_dtype=pl.String)
                                   .alias("_counter"))
        g = g.join(names.select("typeId", "metricId", "_counter"), on=["typeId", "metricId"], how="inner")
        if g.height == 0:
            return None, mapping
        mx = g.group_by("_counter").agg(pl.col("value").max().cast(pl.Float64).alias("_mx"))
        scales = {c: value_scale(c, float(v or 0)) for c, v in mx.iter_rows()}
        g = g.with_columns((pl.col("typeId") % 256).alias("deviceId"))  # GPU of a sample: typeId & 0xFF
        neg = g.filter(pl.col("timestamp") < 0).height
        if neg:
            self.q.add("nsys_metrics_before_start", f"{self.src.path.name}: {neg} GPU_METRICS samples precede the "
                       "capture start (negative timestamps); kept", severity="info", count=neg)
        out = g.select(
            pl.lit("counter").alias("kind"),
            (pl.col("timestamp") + self.offset).alias("ts_ns"),
            pl.lit(0, dtype=pl.Int64).alias("dur_ns"),
            pl.col("deviceId"),
            pl.col("_counter").alias("name"),
            (pl.col("value").cast(pl.Float64) * pl.col("_counter").replace_strict(scales, return_dtype=pl.Float64))
            .alias("value"),
            pl.lit("nsys_gpu_metrics").alias("src"),
        )
        return out, mapping

    def gpus(self) -> list[dict[str, Any]]:
        cols = ["id", "name", "busLocation", "smCount", "memoryBandwidth", "totalMemory", "clockRate", "uuid",
                "computeMajor", "computeMinor", "l2CacheSize", "chipName"]
        df = self.src.read("TARGET_INFO_GPU", cols)
        if df is None or df.height == 0:
            return []
        out = []
        for r in df.sort("id").iter_rows(named=True):
            out.append({
                "id": r.get("id"),
                "name": r.get("name"),
                "bus_location": r.get("busLocation"),
                "numSms": r.get("smCount"),
                "totalGlobalMem": r.get("totalMemory"),
                "memory_bandwidth_bytes_per_s": r.get("memoryBandwidth"),
                "clock_rate_hz": r.get("clockRate"),
                "computeMajor": r.get("computeMajor"),
                "computeMinor": r.get("computeMinor"),
                "l2_cache_bytes": r.get("l2CacheSize"),
                "chip": r.get("chipName"),
                "uuid": r.get("uuid"),
            })
        return out

    def diagnostics(self) -> None:
        d = self.src.read("DIAGNOSTIC_EVENT", ["severity", "text"])
        if d is None or d.height == 0 or "text" not in d.columns:
            return
        warn = d.filter((pl.col("severity") >= 2) & pl.col("text").str.contains(r"(?i)not all|dropped|lost|overflow"))
        for (text,) in warn.select("text").unique(maintain_order=True).iter_rows():
            self.q.add("nsys_diagnostic", f"{self.src.path.name}: nsys reported: {text}", text=text)


def _assign_ranks(df: pl.DataFrame, base: int, q: QualityLog, path: Path) -> tuple[pl.DataFrame, list[dict[str, Any]]]:
    """Map processes to ranks: one GPU process → everything is ``base``; several → one rank each by device."""
    gpu = df.filter(pl.col("kind").is_in(["kernel", "memcpy", "memset"]) & pl.col("_proc").is_not_null())
    procs = (
        gpu.group_by("_proc").agg(pl.col("device").min().alias("dev"), pl.len().alias("n")).sort(["dev", "_proc"])
        if gpu.height else pl.DataFrame(schema={"_proc": pl.Int64, "dev": pl.Int32, "n": pl.UInt32})
    )
    if procs.height <= 1:
        info = [{"rank": base, "pid": procs["_proc"][0] if procs.height else None,
                 "device": procs["dev"][0] if procs.height else None}]
        return df.with_columns(pl.lit(base, dtype=pl.Int32).alias("rank")), info
    pmap = procs.with_columns((pl.int_range(pl.len()) + base).cast(pl.Int32).alias("rank"))
    info = [{"rank": r, "pid": p, "device": d} for p, d, _n, r in pmap.iter_rows()]
    dmap = pmap.select(pl.col("dev").alias("device"), pl.col("rank").alias("_rank_dev")).unique("device", keep="first")
    df = df.join(pmap.select("_proc", "rank"), on="_proc", how="left")
    df = df.join(dmap, on="device", how="left")
    # counters have no process: attribute them by device
    df = df.with_columns(
        pl.when(pl.col("kind") == "counter").then(pl.col("_rank_dev")).otherwise(pl.col("rank")).alias("rank")
    ).drop("_rank_dev")
    dropped = df.filter(pl.col("rank").is_null()).height
    if dropped:
        q.add("nsys_rows_without_rank", f"{path.name}: {dropped} rows from processes without GPU work were dropped "
              "(report holds several GPU processes)", count=dropped)
    q.add("nsys_processes_split", f"{path.name}: report holds {procs.height} GPU processes; read as ranks "
          f"{base}..{base + procs.height - 1} ordered by device", severity="info")
    return df.filter(pl.col("rank").is_not_null()), info


def read_nsys(path: str | Path, rank: int | None = None) -> tuple[pl.DataFrame, dict[str, Any]]:
    """Read one nsys export (``.sqlite`` file or parquetdir) into raw rows and metadata.

    ``rank``: explicit rank (or first rank when the report holds several GPU
    processes); default: the rank in the file name, else 0. The frame is sorted
    by ``(rank, ts_ns)`` and conforms to :data:`tracekit.schema.POLARS_SCHEMA`.
    ``meta`` keys: ``source_file``, ``format`` ("nsys-sqlite" / "nsys-parquetdir"),
    ``rank``, ``ranks`` (list of {rank, pid, device}), ``session_start_ns``,
    ``clock_offset_ns`` (added to relative timestamps), ``export_schema_version``,
    ``product_version``, ``gpus``, ``device_props``, ``device_name``,
    ``gpu_metric_names`` (nsys name → counter name), ``quality``.
    Raises :class:`InputError` for missing or non-nsys input.
    """
    p = Path(path)
    q = QualityLog()
    with open_source(p) as src:
        rd = _Reader(src, q)
        frames = [f for f in (rd.kernels(), rd.memcpys(), rd.memsets(), rd.syncs(), rd.runtime(), rd.nvtx()) if f is not None]
        metrics, mapping = rd.metrics()
        gpus = rd.gpus()
        rd.diagnostics()
    if metrics is not None:
        # counters: GPU id → CUDA ordinal through the (single) process mapping when known
        metrics = metrics.join(rd.cuda_dev.unique("_gpu", keep="first").select("_gpu", "_cuda"),
                               left_on="deviceId", right_on="_gpu", how="left")
        metrics = metrics.with_columns(pl.coalesce("_cuda", "deviceId").cast(pl.Int32).alias("device")).drop(
            "_cuda", "deviceId")
        frames.append(metrics)
    base = rank if rank is not None else (rank_from_name(p) or 0)
    if frames:
        df = pl.concat(frames, how="diagonal_relaxed")
        if "_proc" not in df.columns:
            df = df.with_columns(pl.lit(None, dtype=pl.Int64).alias("_proc"))
        df, ranks = _assign_ranks(df, base, q, p)
        df = conform(df.drop("_proc")).sort(["rank", "ts_ns"], maintain_order=True)
    else:
        q.add("nsys_no_events", f"{p.name}: the report holds no kernel, copy, API or NVTX events", rank=base)
        df, ranks = empty_frame(), [{"rank": base, "pid": None, "device": None}]
    used = {r["device"] for r in ranks if r.get("device") is not None}
    used_props = [g for g in gpus if g["id"] in used] or gpus
    meta: dict[str, Any] = {
        "source_file": str(p),
        "format": f"nsys-{src.kind}",
        "rank": ranks[0]["rank"],
        "ranks": ranks,
        "world_size": None,
        "session_start_ns": rd.session_ns,
        "session_start_utc": rd.session_row.get("utcTime"),
        "clock_offset_ns": rd.offset,
        "ts_normalized": rd.normalized,
        "export_schema_version": rd.meta_export.get("EXPORT_SCHEMA_VERSION"),
        "product_version": rd.meta_export.get("EXPORT_PRODUCT_VERSION"),
        "derived_window_ns": rd.meta_export.get("DERIVED_WINDOW_NS"),
        "gpus": gpus,
        "device_props": used_props,
        "device_name": used_props[0]["name"] if used_props else None,
        "gpu_metric_names": mapping,
        "quality": [x.to_json() for x in q],
    }
    return df, meta


def split_ranks(df: pl.DataFrame, meta: dict[str, Any]) -> list[tuple[pl.DataFrame, dict[str, Any]]]:
    """One ``(frame, meta)`` per rank of a :func:`read_nsys` result (a single pair for one-process reports)."""
    ranks = meta.get("ranks") or [{"rank": meta.get("rank", 0)}]
    if len(ranks) <= 1:
        return [(df, meta)]
    out = []
    for info in ranks:
        m = dict(meta, rank=info["rank"], ranks=[info])
        dev = info.get("device")
        props = [g for g in meta.get("gpus", []) if g.get("id") == dev]
        if props:
            m["device_props"] = props
            m["device_name"] = props[0]["name"]
        out.append((df.filter(pl.col("rank") == info["rank"]), m))
    return out


def _detect(p: Path) -> bool:
    if p.name.endswith(".sqlite"):
        return True
    try:
        return p.is_dir() and (p / "TARGET_INFO_SESSION_START_TIME.parquet").exists()
    except OSError:  # a symlink loop (Python < 3.12 raises from is_dir)
        return False


READER = Reader("nsys", _detect, lambda p, rank: read_nsys(p, rank=rank), split=split_ranks, priority=1)
