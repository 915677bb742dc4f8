"""Golden tests of read_nsys on a hand-built nsys SQLite export with known answers."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from polars.testing import assert_frame_equal

from tracekit._errors import InputError
from tracekit.ingest.nsys import rank_from_name, read_nsys, split_ranks
from tracekit.ingest.nsys_metrics import counter_name
from tracekit.schema import POLARS_SCHEMA

SESSION = 1_700_000_000_000_000_000
GPID = (662 << 24)  # globalPid of pid 662
GTID = (662 << 24) | 663  # pid 662, tid 663


def _tables() -> dict[str, tuple[list[str], list[tuple]]]:
    """Minimal nsys schema (3.20-like, without optional columns) with a few events."""
    return {
        "META_DATA_EXPORT": (["name", "value"], [("EXPORT_SCHEMA_VERSION", "3.20.3"),
                                                  ("EXPORT_PRODUCT_VERSION", "2025.3.2.0")]),
        "TARGET_INFO_SESSION_START_TIME": (["utcEpochNs", "utcTime", "localTime"], [(SESSION, "t", "t")]),
        "StringIds": (["id", "value"], [(1, "fused_moe_kernel"), (2, "void fused_moe_kernel<int>(int)"),
                                        (3, "cudaLaunchKernel_v7000"), (4, "registered range"),
                                        (5, "cuLaunchKernelEx"), (6, "short_only")]),
        "CUPTI_ACTIVITY_KIND_KERNEL": (
            ["start", "end", "deviceId", "streamId", "correlationId", "globalPid", "demangledName", "shortName",
             "gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ", "registersPerThread", "staticSharedMemory",
             "dynamicSharedMemory"],
            [(1_000, 3_500, 0, 7, 11, GPID, 2, 1, 8, 1, 1, 128, 1, 1, 64, 1024, 2048),
             (4_000, 4_100, 0, 7, 12, GPID, None, 6, 1, 1, 1, 32, 1, 1, 16, 0, 0)],
        ),
        "CUPTI_ACTIVITY_KIND_MEMCPY": (
            ["start", "end", "deviceId", "streamId", "correlationId", "globalPid", "bytes", "copyKind", "srcKind",
             "dstKind"],
            [(5_000, 6_000, 0, 14, 13, GPID, 1 << 20, 1, 1, 2), (6_500, 6_600, 0, 7, 14, GPID, 64, 10, 2, 2)],
        ),
        "CUPTI_ACTIVITY_KIND_RUNTIME": (
            ["start", "end", "eventClass", "globalTid", "correlationId", "nameId"],
            [(500, 900, 0, GTID, 11, 3), (3_000, 3_200, 1, GTID, 12, 5)],
        ),
        "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": (
            ["start", "end", "deviceId", "streamId", "correlationId", "globalPid", "syncType"],
            [(7_000, 7_400, 0, 7, 15, GPID, 3), (7_500, 7_600, 0, 4294967295, 16, GPID, 4)],
        ),
        "NVTX_EVENTS": (
            ["start", "end", "eventType", "text", "textId", "globalTid", "domainId"],
            [(-5, None, 75, "NCCL", None, GTID, 2),
             (100, 9_000, 59, "step 0", None, GTID, 0),
             (200, 800, 59, None, 4, GTID, 0),
             (300, 700, 60, "ncclAllReduce", None, GTID, 2),
             (950, None, 34, "mark", None, GTID, 0),
             (960, None, 59, "open", None, GTID, 0)],
        ),
        "TARGET_INFO_GPU_METRICS": (
            ["typeId", "sourceId", "typeName", "metricId", "metricName"],
            [(0x1000100000000, 0, "", 0, "GPC Clock Frequency [MHz]"), (0x1000100000000, 0, "", 28,
                                                                          "PCIe RX Throughput [Throughput %]"),
             (0x1000100000000, 0, "", 40, "Weird New Metric [Bytes]")],
        ),
        "GPU_METRICS": (
            ["rawTimestamp", "timestamp", "typeId", "metricId", "value"],
            [(0, -50, 0x1000100000000, 0, 1_980_000_000), (0, -50, 0x1000100000000, 28, 57),
             (0, 450, 0x1000100000000, 28, 3), (0, 450, 0x1000100000000, 40, 9)],
        ),
        "TARGET_INFO_GPU": (
            ["id", "name", "busLocation", "smCount", "memoryBandwidth", "totalMemory", "clockRate"],
            [(0, "NVIDIA H200", "0000:00:06.0", 132, 4_814_304_000_000, 150_109_880_320, 1_980_000_000)],
        ),
    }


def _write_sqlite(path: Path, tables: dict[str, tuple[list[str], list[tuple]]]) -> Path:
    con = sqlite3.connect(path)
    for t, (cols, rows) in tables.items():
        types = ["TEXT" if c in ("name", "value", "text", "utcTime", "localTime", "metricName", "typeName", "busLocation")
                 and not (t == "GPU_METRICS" and c == "value") else "INTEGER" for c in cols]
        con.execute(f'CREATE TABLE "{t}" (' + ", ".join(f'"{c}" {ty}' for c, ty in zip(cols, types)) + ")")
        con.executemany(f'INSERT INTO "{t}" VALUES (' + ",".join("?" * len(cols)) + ")", rows)
    con.commit()
    con.close()
    return path


@pytest.fixture()
def tiny(tmp_path: Path) -> Path:
    return _write_sqlite(tmp_path / "job_rank3.sqlite", _tables())


def _rows(df: pl.DataFrame, kind: str) -> list[dict]:
    return df.filter(pl.col("kind").cast(pl.String) == kind).sort("ts_ns").to_dicts()


def test_schema_and_rank_from_file_name(tiny: Path) -> None:
    df, meta = read_nsys(tiny)
    assert df.schema == pl.Schema(POLARS_SCHEMA)
    assert df["rank"].unique().to_list() == [3]
    assert meta["rank"] == 3 and meta["session_start_ns"] == SESSION and meta["clock_offset_ns"] == SESSION
    assert meta["export_schema_version"] == "3.20.3"
    assert meta["device_name"] == "NVIDIA H200"
    assert meta["device_props"][0]["numSms"] == 132
    assert meta["device_props"][0]["memory_bandwidth_bytes_per_s"] == 4_814_304_000_000
    assert meta["device_props"][0]["bus_location"] == "0000:00:06.0"
    df2, meta2 = read_nsys(tiny, rank=5)
    assert df2["rank"].unique().to_list() == [5] and meta2["rank"] == 5


def test_kernels(tiny: Path) -> None:
    k = _rows(read_nsys(tiny)[0], "kernel")
    assert [r["name"] for r in k] == ["void fused_moe_kernel<int>(int)", "short_only"]  # demangled, shortName fallback
    assert k[0]["ts_ns"] == SESSION + 1_000 and k[0]["dur_ns"] == 2_500
    assert (k[0]["grid_x"], k[0]["block_x"], k[0]["registers_per_thread"], k[0]["shared_mem_bytes"]) == (8, 128, 64, 3072)
    assert (k[0]["device"], k[0]["stream"], k[0]["correlation"], k[0]["pid"], k[0]["tid"]) == (0, 7, 11, 0, 7)
    assert k[0]["category"] is None  # raw rows: finalize_rank categorizes


def test_memcpy_kinds_and_bytes(tiny: Path) -> None:
    m = _rows(read_nsys(tiny)[0], "memcpy")
    assert [(r["memcpy_kind"], r["src_mem"], r["dst_mem"], r["bytes"]) for r in m] == [
        ("HtoD", "Pinned", "Device", 1 << 20), ("PtoP", "Device", "Device", 64)]
    assert m[0]["name"] == "Memcpy HtoD (Pinned -> Device)"
    assert m[0]["stream"] == 14


def test_runtime_names_stripped_and_pid_tid_unpacked(tiny: Path) -> None:
    r = _rows(read_nsys(tiny)[0], "runtime")
    assert [(x["name"], x["src"], x["correlation"]) for x in r] == [
        ("cudaLaunchKernel", "cuda_runtime", 11), ("cuLaunchKernelEx", "cuda_driver", 12)]
    assert (r[0]["pid"], r[0]["tid"]) == (662, 663)
    assert r[0]["ts_ns"] == SESSION + 500 and r[0]["dur_ns"] == 400


def test_sync_rows(tiny: Path) -> None:
    s = _rows(read_nsys(tiny)[0], "sync")
    assert [(x["name"], x["stream"], x["correlation"]) for x in s] == [("Stream Sync", 7, 15), ("Context Sync", None, 16)]


def test_nvtx_ranges_domains_marks(tiny: Path) -> None:
    df, meta = read_nsys(tiny)
    r = _rows(df, "range")
    assert [(x["name"], x["src"], x["dur_ns"]) for x in r] == [
        ("step 0", "nvtx", 8_900), ("registered range", "nvtx", 600), ("ncclAllReduce", "NCCL", 400), ("open", "nvtx", 0)]
    assert (r[0]["pid"], r[0]["tid"]) == (662, 663)
    i = _rows(df, "instant")
    assert [(x["name"], x["dur_ns"], x["ts_ns"]) for x in i] == [("mark", 0, SESSION + 950)]
    assert "nsys_open_nvtx_ranges" in {q["code"] for q in meta["quality"]}


def test_gpu_metrics_counters(tiny: Path) -> None:
    df, meta = read_nsys(tiny)
    c = df.filter(pl.col("kind").cast(pl.String) == "counter").sort("ts_ns", "name")
    got = [(x["name"], x["ts_ns"] - SESSION, x["value"], x["device"]) for x in c.to_dicts()]
    assert got == [("gpc_clock_mhz", -50, 1980.0, 0), ("pcie_rx_pct", -50, 57.0, 0), ("pcie_rx_pct", 450, 3.0, 0),
                   ("weird_new_metric_bytes", 450, 9.0, 0)]
    assert meta["gpu_metric_names"]["PCIe RX Throughput [Throughput %]"] == "pcie_rx_pct"
    assert "nsys_metrics_before_start" in {q["code"] for q in meta["quality"]}


def test_missing_tables_mean_no_events(tmp_path: Path) -> None:
    t = _tables()
    keep = {k: t[k] for k in ("META_DATA_EXPORT", "TARGET_INFO_SESSION_START_TIME", "StringIds",
                              "CUPTI_ACTIVITY_KIND_KERNEL")}
    df, meta = read_nsys(_write_sqlite(tmp_path / "k.sqlite", keep))
    assert df["kind"].cast(pl.String).unique().to_list() == ["kernel"]
    assert meta["gpus"] == [] and meta["gpu_metric_names"] == {}
    only = {k: t[k] for k in ("META_DATA_EXPORT", "TARGET_INFO_SESSION_START_TIME")}
    df, meta = read_nsys(_write_sqlite(tmp_path / "empty.sqlite", only))
    assert df.height == 0 and df.schema == pl.Schema(POLARS_SCHEMA)
    assert "nsys_no_events" in {q["code"] for q in meta["quality"]}


def test_ts_normalized_export_not_shifted(tmp_path: Path) -> None:
    t = _tables()
    t["META_DATA_EXPORT"][1].append(("EXPORT_PARAM_TIME_NORMALIZE", "true"))
    df, meta = read_nsys(_write_sqlite(tmp_path / "n.sqlite", t))
    assert meta["clock_offset_ns"] == 0
    assert _rows(df, "kernel")[0]["ts_ns"] == 1_000


def test_parquetdir_equals_sqlite(tmp_path: Path, tiny: Path) -> None:
    d = tmp_path / "tiny_rank3_pqtdir"
    d.mkdir()
    con = sqlite3.connect(tiny)
    for t, (cols, _rows_) in _tables().items():
        rows = con.execute(f'SELECT * FROM "{t}"').fetchall()
        arrays = {c: [r[i] for r in rows] for i, c in enumerate(cols)}
        unsigned = {"globalPid", "globalTid", "typeId", "streamId", "demangledName", "shortName", "nameId"}
        tbl = pa.table({c: pa.array(v, type=pa.uint64() if c in unsigned else None) for c, v in arrays.items()})
        pq.write_table(tbl, d / f"{t}.parquet")
    con.close()
    a, _ = read_nsys(tiny)
    b, mb = read_nsys(d)
    assert mb["format"] == "nsys-parquetdir"
    assert_frame_equal(a, b)


def test_multi_process_report_splits_into_ranks(tmp_path: Path) -> None:
    t = _tables()
    gpid2, gtid2 = (700 << 24), (700 << 24) | 701
    t["CUPTI_ACTIVITY_KIND_KERNEL"][1].append((2_000, 2_500, 1, 7, 11, gpid2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0))
    t["CUPTI_ACTIVITY_KIND_RUNTIME"][1].append((1_500, 1_600, 0, gtid2, 11, 3))
    t["CUPTI_ACTIVITY_KIND_RUNTIME"][1].append((1_500, 1_600, 0, (999 << 24) | 1, 99, 3))  # no GPU work
    df, meta = read_nsys(_write_sqlite(tmp_path / "all.sqlite", t))
    assert [(r["rank"], r["pid"], r["device"]) for r in meta["ranks"]] == [(0, 662, 0), (1, 700, 1)]
    k = df.filter(pl.col("kind").cast(pl.String) == "kernel")
    assert sorted(zip(k["rank"].to_list(), k["device"].to_list())) == [(0, 0), (0, 0), (1, 1)]
    rt = df.filter(pl.col("kind").cast(pl.String) == "runtime")
    assert sorted(zip(rt["rank"].to_list(), rt["pid"].to_list())) == [(0, 662), (0, 662), (1, 700)]
    assert "nsys_rows_without_rank" in {q["code"] for q in meta["quality"]}
    parts = split_ranks(df, meta)
    assert [m["rank"] for _, m in parts] == [0, 1]
    assert [p["rank"].unique().to_list() for p, _ in parts] == [[0], [1]]


@pytest.mark.parametrize(
    "name,rank",
    [("tp2_rank0.sqlite", 0), ("run_rank_12.sqlite", 12), ("rank-3_pqtdir", 3), ("1761800000.1-TP-5.sqlite", 5),
     ("x_tp_2.sqlite", 2), ("report.sqlite", None), ("stp3.sqlite", None)],
)
def test_rank_from_name(name: str, rank: int | None) -> None:
    assert rank_from_name(name) == rank


def test_counter_name_generic_rule() -> None:
    assert counter_name("SMs Active [Throughput %]") == "sm_active_pct"
    assert counter_name("Foo Bar Rate [Throughput %]") == "foo_bar_rate_pct"
    assert counter_name("No Unit") == "no_unit"


def test_errors_name_file_and_remedy(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        read_nsys(tmp_path / "missing.sqlite")
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(InputError, match=r"bad\.sqlite.*SQLite"):
        read_nsys(bad)
    other = _write_sqlite(tmp_path / "other.sqlite", {"foo": (["a"], [(1,)])})
    with pytest.raises(InputError, match="not an Nsight Systems export"):
        read_nsys(other)
    d = tmp_path / "emptydir"
    d.mkdir()
    with pytest.raises(InputError, match="parquetdir"):
        read_nsys(d)
