"""The trace.parquet contract: code schema == schemas/trace_v1.json, footer metadata, versions, atomic IO."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tracekit._errors import InputError, OutputError
from tracekit.schema import (
    ARROW_SCHEMA,
    CATEGORIES,
    COLUMNS,
    KINDS,
    META_KEY,
    POLARS_SCHEMA,
    SCHEMA_VERSION,
    TraceWriter,
    atomic_path,
    conform,
    frame_from_rows,
    read_metadata,
    read_trace,
    scan_trace,
    write_trace,
)

SCHEMA_JSON = Path(__file__).resolve().parents[2] / "schemas" / "trace_v1.json"
SCHEMA_MD = SCHEMA_JSON.with_suffix(".md")


def _type_str(t: pa.DataType) -> str:
    if pa.types.is_dictionary(t):
        return f"dictionary<{_type_str(t.index_type)},{_type_str(t.value_type)}>"
    return {pa.float64(): "double", pa.bool_(): "bool"}.get(t, str(t))


def _doc() -> dict:
    return json.loads(SCHEMA_JSON.read_text())


def test_arrow_schema_equals_schema_file() -> None:
    doc = _doc()
    assert doc["schema_version"] == SCHEMA_VERSION
    want = [(c["name"], c["arrow_type"], c["nullable"]) for c in doc["columns"]]
    have = [(f.name, _type_str(f.type), f.nullable) for f in ARROW_SCHEMA]
    assert have == want  # names, order, types and nullability


def test_schema_file_units_and_meanings_match_code() -> None:
    doc = {c["name"]: c for c in _doc()["columns"]}
    for name, _t, _nl, unit, meaning in COLUMNS:
        assert doc[name].get("unit", "") == unit, name
        assert doc[name]["meaning"] == meaning, name


def test_schema_file_kinds_categories() -> None:
    doc = _doc()
    assert tuple(doc["kinds"]) == KINDS
    assert tuple(doc["categories"]) == CATEGORIES


def test_readable_table_lists_every_column() -> None:
    md = SCHEMA_MD.read_text()
    for f in ARROW_SCHEMA:
        assert f"| `{f.name}` | {_type_str(f.type)} | {'yes' if f.nullable else 'no'} |" in md, f.name


def test_polars_schema_matches_arrow() -> None:
    assert list(POLARS_SCHEMA) == ARROW_SCHEMA.names
    df = frame_from_rows([{"rank": 0, "kind": "kernel", "ts_ns": 1, "dur_ns": 2, "name": "k"}])
    assert df.schema == pl.Schema(POLARS_SCHEMA)


def test_frame_from_rows_rejects_unknown_column() -> None:
    with pytest.raises(ValueError, match="unknown trace column"):
        frame_from_rows([{"rank": 0, "bogus": 1}])


def _rows() -> pl.DataFrame:
    return frame_from_rows(
        [
            {"rank": 1, "kind": "kernel", "ts_ns": 30, "dur_ns": 5, "name": "b", "stream": 7, "category": "memory"},
            {"rank": 0, "kind": "kernel", "ts_ns": 20, "dur_ns": 5, "name": "a", "stream": 7, "grid_x": 3,
             "category": "other_compute", "family": "other"},  # as convert writes it: every GPU op has a category
            {"rank": 0, "kind": "counter", "ts_ns": 10, "dur_ns": 0, "name": "power_w", "value": 123.5},
            {"rank": 0, "kind": "step", "ts_ns": 5, "dur_ns": 50, "name": "step[DECODE bs=8]", "step_id": 0,
             "step_mode": "DECODE", "batch_size": 8, "tokens": 8, "profiled": True},
        ]
    )


def test_write_read_round_trip_with_footer_metadata(tmp_path: Path) -> None:
    p = tmp_path / "t.parquet"
    meta = {"world_size": 2, "ranks": [{"rank": 0, "device_name": "H200"}, {"rank": 1, "device_name": "H200"}],
            "clock_offsets_ns": {"0": 0, "1": -5},
            "capture": {"window_ns": [5, 55]}, "quality": [{"code": "x", "message": "y", "severity": "info"}]}
    write_trace(_rows(), p, meta)
    assert pq.read_schema(p).remove_metadata() == ARROW_SCHEMA
    df, got = read_trace(p)
    assert got["schema_version"] == SCHEMA_VERSION and "tool_version" in got
    for k, v in meta.items():
        assert got[k] == v
    # sorted by (rank, ts_ns); values intact
    assert df.select("rank", "ts_ns").rows() == [(0, 5), (0, 10), (0, 20), (1, 30)]
    assert df.filter(pl.col("kind") == "counter")["value"].to_list() == [123.5]
    assert df.filter(pl.col("kind") == "step").row(0, named=True)["batch_size"] == 8
    # one rank at a time
    d1, _ = read_trace(p, ranks=[1])
    assert d1["name"].cast(pl.String).to_list() == ["b"]
    # readable without tracekit
    assert pq.read_table(p).num_rows == 4


def test_newer_schema_version_refused(tmp_path: Path) -> None:
    p = tmp_path / "new.parquet"
    tbl = pa.Table.from_pylist([{"rank": 0}], schema=pa.schema([pa.field("rank", pa.int32())]))
    tbl = tbl.replace_schema_metadata({META_KEY: json.dumps({"schema_version": SCHEMA_VERSION + 1})})
    pq.write_table(tbl, p)
    with pytest.raises(InputError, match="newer") as ei:
        read_trace(p)
    assert str(p) in str(ei.value) and "upgrade" in str(ei.value)


def test_older_file_missing_columns_loads_with_nulls(tmp_path: Path) -> None:
    p = tmp_path / "old.parquet"
    full = conform(_rows()).to_arrow()
    keep = [n for n in full.column_names if n not in ("coll_seq", "tokens")]
    tbl = full.select(keep).replace_schema_metadata({META_KEY: json.dumps({"schema_version": 1})})
    pq.write_table(tbl, p)
    df, _ = read_trace(p)
    assert df.columns == ARROW_SCHEMA.names
    assert df["coll_seq"].null_count() == df.height and df["tokens"].null_count() == df.height
    assert scan_trace(p).collect().height == 4


@pytest.mark.parametrize(
    "make, why",
    [
        (lambda p: None, "no such file"),
        (lambda p: p.write_text("hello"), "not a Parquet file"),
        (lambda p: p.write_text('\n {"traceEvents": []}'), "is JSON .*convert it first: tracekit convert"),
        (lambda p: p.write_bytes(gzip.compress(b'{"traceEvents": []}')), "is gzip-compressed .*tracekit convert"),
        (lambda p: p.write_bytes(b"SQLite format 3\x00" + bytes(84)), "is an SQLite database .*tracekit convert"),
        (lambda p: pq.write_table(pa.table({"a": [1]}), p), "without tracekit metadata"),
    ],
)
def test_non_trace_inputs_refused(tmp_path: Path, make, why: str) -> None:
    p = tmp_path / "x.parquet"
    make(p)
    with pytest.raises(InputError, match=why):
        read_metadata(p)


def test_refuses_overwrite_without_force(tmp_path: Path) -> None:
    p = tmp_path / "t.parquet"
    write_trace(_rows(), p, {"world_size": 1})
    before = p.read_bytes()
    with pytest.raises(OutputError, match="--force"):
        write_trace(_rows().head(1), p, {"world_size": 9})
    assert p.read_bytes() == before
    write_trace(_rows().head(1), p, {"world_size": 9}, force=True)
    assert read_metadata(p)["world_size"] == 9 and read_trace(p)[0].height == 1


def test_no_partial_file_on_error(tmp_path: Path) -> None:
    p = tmp_path / "t.parquet"
    with pytest.raises(RuntimeError):
        with TraceWriter(p) as w:
            w.write(_rows())
            raise RuntimeError("boom")
    assert not p.exists()
    assert list(tmp_path.iterdir()) == []  # temp file cleaned up too


def test_atomic_path_keeps_old_file_on_error(tmp_path: Path) -> None:
    p = tmp_path / "out.bin"
    p.write_bytes(b"old")
    with pytest.raises(ValueError):
        with atomic_path(p, force=True) as tmp:
            tmp.write_bytes(b"partial")
            raise ValueError("x")
    assert p.read_bytes() == b"old" and [x.name for x in tmp_path.iterdir()] == ["out.bin"]


def test_output_directory_must_exist(tmp_path: Path) -> None:
    with pytest.raises(OutputError, match="does not exist"):
        write_trace(_rows(), tmp_path / "nope" / "t.parquet")
