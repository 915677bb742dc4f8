"""read_kineto on tiny hand-built Kineto documents: known rows, ns-exact times, clear errors."""

from __future__ import annotations

import gzip
import sys
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "golden"))
from kineto_doc import RawNum, annotation, cpu_op, doc, kernel, memcpy, runtime, write_doc  # noqa: E402

from tracekit._errors import InputError  # noqa: E402
from tracekit.ingest.kineto import read_kineto  # noqa: E402
from tracekit.schema import POLARS_SCHEMA  # noqa: E402


def _k(df: pl.DataFrame, kind: str) -> pl.DataFrame:
    return df.filter(pl.col("kind").cast(pl.String) == kind)


@pytest.mark.parametrize("exact", [False, True])
def test_basic_rows_and_columns(tmp_path: Path, exact: bool) -> None:
    evs = [
        runtime("cudaLaunchKernel", 10, 5, corr=42, ext=7, tid=3),
        kernel("my_kernel", 20, 8, corr=42, stream=13, device=1),
        memcpy("Memcpy HtoD (Pageable -> Device)", 30, 2, corr=43, nbytes=65536),
        cpu_op("aten::mm", 9, 7, tid=3, **{"External id": 7}),
        annotation("my_range", 8, 30, tid=3),
    ]
    p = write_doc(tmp_path / "t.json", doc(evs, rank=1, base_ns=1_000_000_000_000))
    df, meta = read_kineto(p, exact=exact)
    assert df.schema == pl.Schema(POLARS_SCHEMA)
    assert meta["rank"] == 1 and meta["world_size"] == 2 and meta["base_time_ns"] == 1_000_000_000_000
    assert sorted(df["kind"].cast(pl.String).to_list()) == ["cpu_op", "kernel", "memcpy", "range", "runtime"]
    k = _k(df, "kernel").row(0, named=True)
    assert k["ts_ns"] == 1_000_000_000_000 + 20_000 and k["dur_ns"] == 8_000
    assert (k["rank"], k["device"], k["stream"], k["correlation"]) == (1, 1, 13, 42)
    assert (k["grid_x"], k["grid_y"], k["grid_z"], k["block_x"], k["block_y"], k["block_z"]) == (4, 2, 1, 128, 1, 1)
    assert (k["registers_per_thread"], k["shared_mem_bytes"]) == (32, 1024)
    m = _k(df, "memcpy").row(0, named=True)
    assert (m["memcpy_kind"], m["src_mem"], m["dst_mem"], m["bytes"]) == ("HtoD", "Pageable", "Device", 65536)
    r = _k(df, "runtime").row(0, named=True)
    assert (r["tid"], r["correlation"], r["external_id"], r["device"]) == (3, 42, 7, None)


@pytest.mark.parametrize("exact", [False, True])
def test_epoch_float_timestamps_are_ns_exact(tmp_path: Path, exact: bool) -> None:
    # absolute-epoch µs with ns digits (PyTorch >= 2.3 with ns resolution): a float64 would round these
    evs = [
        kernel("k0", RawNum("1712195495505543.217"), RawNum("1.001"), corr=1),
        kernel("k1", RawNum("1712195495505545.999"), RawNum("0.5"), corr=2),
        kernel("k2", RawNum("1712195495505546"), RawNum("2"), corr=3),
    ]
    p = write_doc(tmp_path / "ns.json", doc(evs, rank=0, displayTimeUnit="ns"))
    df, _ = read_kineto(p, exact=exact)
    k = _k(df, "kernel").sort("ts_ns")
    assert k["ts_ns"].to_list() == [1712195495505543217, 1712195495505545999, 1712195495505546000]
    assert k["dur_ns"].to_list() == [1001, 500, 2000]


@pytest.mark.parametrize("exact", [False, True])
def test_base_time_plus_relative_ts(tmp_path: Path, exact: bool) -> None:
    base = 1_767_225_600_000_000_000
    evs = [kernel("k", RawNum("3600000000.123"), RawNum("12.345"), corr=1), kernel("k", 5, 1, corr=2)]
    p = write_doc(tmp_path / "b.json.gz", doc(evs, rank=0, base_ns=base))
    df, _ = read_kineto(p, exact=exact)
    k = _k(df, "kernel").sort("ts_ns")
    assert k["ts_ns"].to_list() == [base + 5_000, base + 3_600_000_000_123]
    assert k["dur_ns"].to_list() == [1_000, 12_345]


def test_sub_ns_digits_round_half_up(tmp_path: Path) -> None:
    evs = [kernel("k", RawNum("100.0004"), RawNum("1.0005"), corr=1)]
    df, _ = read_kineto(write_doc(tmp_path / "r.json", doc(evs, rank=0)), exact=True)
    assert (df["ts_ns"][0], df["dur_ns"][0]) == (100_000, 1_001)


def test_record_param_comms_fields(tmp_path: Path) -> None:
    rpc = cpu_op(
        "record_param_comms", 10, 20, tid=5,
        **{"Collective name": "allreduce", "In msg nelems": 1024, "Out msg nelems": 1024, "Group size": 2,
           "dtype": "BFloat16", "Process Group Name": "0", "Process Group Description": "default_pg",
           "Process Group Ranks": "[0, 1]", "Seq": 3},
    )
    df, _ = read_kineto(write_doc(tmp_path / "c.json", doc([rpc], rank=0)))
    r = df.row(0, named=True)
    assert (r["coll_name"], r["coll_in_nelems"], r["coll_out_nelems"], r["coll_group_size"]) == ("allreduce", 1024, 1024, 2)
    assert (r["coll_dtype"], r["pg_name"], r["pg_desc"], r["pg_ranks"], r["coll_seq"]) == ("BFloat16", "0", "default_pg", "[0, 1]", 3)


def test_rank_argument_and_missing_rank(tmp_path: Path) -> None:
    p = write_doc(tmp_path / "x.json", doc([kernel("k", 1, 1, corr=1)]))
    df, meta = read_kineto(p)
    assert meta["rank"] is None
    df, meta = read_kineto(p, rank=5)
    assert meta["rank"] == 5 and df["rank"].unique().to_list() == [5]


def test_unknown_categories_become_quality_note(tmp_path: Path) -> None:
    evs = [kernel("k", 1, 1, corr=1), {"ph": "X", "cat": "weird_cat", "name": "w", "pid": 0, "tid": 0, "ts": 1, "dur": 1},
           {"ph": "X", "cat": "python_function", "name": "f", "pid": 0, "tid": 0, "ts": 1, "dur": 1}]
    df, meta = read_kineto(write_doc(tmp_path / "u.json", doc(evs, rank=0)))
    assert df.height == 1
    codes = {q["code"]: q for q in meta["quality"]}
    assert codes["unknown_event_kinds"]["details"]["unknown"] == {"weird_cat": 1}


def test_negative_duration_clamped_with_flag(tmp_path: Path) -> None:
    df, meta = read_kineto(write_doc(tmp_path / "n.json", doc([kernel("k", 10, -3, corr=1)], rank=0)))
    assert df["dur_ns"].to_list() == [0]
    assert "negative_durations" in {q["code"] for q in meta["quality"]}


# ---- bad input: one-line InputError naming the file and saying why -----------------------------


@pytest.mark.parametrize(
    "content, why",
    [
        (b"", "empty"),
        (b"{\"traceEvents\": [{\"ph\": \"X\", ", "invalid JSON"),
        (b"[1, 2, 3]", "traceEvents"),
        (b"{\"traceEvents\": 5}", "not a list"),
        (b"{\"schema\": \"1.0.1\", \"nodes\": []}", "traceEvents"),  # PyTorch execution trace (Chakra ET)
        (b"{\"foo\": 1}", "traceEvents"),
    ],
)
def test_bad_input_one_line_error(tmp_path: Path, content: bytes, why: str) -> None:
    p = tmp_path / "bad.json"
    p.write_bytes(content)
    with pytest.raises(InputError) as ei:
        read_kineto(p)
    msg = str(ei.value)
    assert str(p) in msg and why in msg and "\n" not in msg


def test_truncated_gzip(tmp_path: Path) -> None:
    p = tmp_path / "t.json.gz"
    p.write_bytes(gzip.compress(b'{"traceEvents": []}' * 100)[:30])
    with pytest.raises(InputError, match="gzip"):
        read_kineto(p)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot read"):
        read_kineto(tmp_path / "nope.json")


def test_exact_and_fast_paths_agree_on_mixed_doc(tmp_path: Path) -> None:
    evs = []
    for i in range(300):
        evs.append(runtime("cudaLaunchKernel", 10 * i, 2, corr=i + 1, ext=i))
        evs.append(kernel(f"k{i % 7}", 10 * i + 3, RawNum(f"{i % 5}.25"), corr=i + 1, stream=7 + i % 3))
        evs.append(cpu_op("aten::add", 10 * i - 1, 4, **{"External id": i}))
    evs.insert(10, {"ph": "i", "cat": "cpu_instant_event", "name": "x", "pid": 1, "tid": 1, "ts": 5, "s": "t"})
    evs.insert(20, {"ph": "i", "name": "marker", "pid": 1, "tid": 1, "ts": 6, "s": "t"})  # kept, in file order
    evs.insert(30, {"ph": "X", "cat": "weird", "name": "w", "pid": 1, "tid": 1, "ts": 7, "dur": 1})
    evs.insert(40, runtime("cudaLaunchKernel", 5, 1, corr=1000))
    evs[41]["args"]["Input Dims"] = [[2048, 2048], []]  # shapes recorded without a record_shapes key
    p = write_doc(tmp_path / "m.json", doc(evs, rank=0, base_ns=10**18))
    a, _ = read_kineto(p, exact=False)
    b, _ = read_kineto(p, exact=True)
    assert a.height == 902
    assert_frame_equal(a, b, categorical_as_str=True)
    assert a.filter(pl.col("kind") == "instant")["name"].to_list() == ["marker"]


def _events_text(evs: list[dict], sep: str, indent: int | None = None) -> bytes:
    import json

    body = sep.join(json.dumps(e, indent=indent) for e in evs)
    return ('{"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 1}, "baseTimeNanoseconds": 1000,\n'
            '"traceEvents": [\n' + body + "\n]}").encode()


@pytest.mark.parametrize(
    "sep,indent",
    [(",\n  ", None), (",\n", None), (",\n", 2), (",", None), (", ", None), (" ,\r\n\t", None), (",\n\n", 4)],
    ids=["torch", "per-line", "indented", "minified", "spaced", "odd-whitespace", "blank-lines"],
)
def test_event_layouts_decode_alike(tmp_path: Path, sep: str, indent: int | None) -> None:
    # the fast path blanks the separators between events in place; every layout must give the exact path's rows
    evs = []
    for i in range(200):
        evs.append(runtime("cudaLaunchKernel", 10 * i, 2, corr=i + 1, ext=i))
        evs.append(kernel("void f<{lambda()#1}>(), {x}", 10 * i + 3, 1.5, corr=i + 1))  # braces and commas in a name
    evs[7]["args"]["nested"] = [{"a": 1}, {"b": 2}]  # objects inside an event: spread over lines when indented
    p = tmp_path / "t.json"
    p.write_bytes(_events_text(evs, sep, indent))
    a, _ = read_kineto(p, exact=False)
    b, _ = read_kineto(p, exact=True)
    assert a.height == 400
    assert_frame_equal(a, b, categorical_as_str=True)


def test_parse_events_leaves_the_chunk_as_given() -> None:
    from tracekit.ingest.kineto import _parse_events

    for text in (b'[{"ph": "X", "ts": 1},\n  {"ph": "X", "ts": 2}]', b'[{"ph": "X", "a": [{"x": 1},\n {"y": 2}]},\n{"ph": "i"}]',
                 b'[{"ph": "X", "ts": 1}, {"ph": "X"]'):
        chunk = bytearray(text)
        tbl = _parse_events(chunk)
        assert bytes(chunk) == text
        if b'"a"' in text or text.endswith(b'"X"]'):
            # objects split over lines inside an event, or invalid JSON: no table; the caller decodes the chunk exactly
            assert tbl is None
        else:
            assert tbl is not None and tbl.num_rows == 2


@pytest.mark.parametrize("gz", [True, False])
@pytest.mark.parametrize("threads", ["1", "3"])
def test_many_small_chunks_give_the_whole_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, threads: str, gz: bool) -> None:
    # the streaming reader cuts the events into chunks (blocks of inflated text, or views of a mapped plain
    # file), decodes them on a thread pool and stacks them in groups: rows and their order must not depend
    # on the chunk size, the group size, the thread count or the compression
    import tracekit.ingest.kineto as kineto

    evs = []
    n = 6000  # > 1 MB of text: the stream cuts chunks only that far ahead of the decoder
    for i in range(n):
        evs.append(runtime("cudaLaunchKernel", 10 * i, 2, corr=i + 1, ext=i))
        evs.append(kernel(f"k{i % 5}", 10 * i + 3, 1.25, corr=i + 1, stream=7 + i % 2))
    evs[301]["args"]["Input Dims"] = [[4, 4]]  # one chunk takes the exact decoder
    p = tmp_path / ("t.json.gz" if gz else "t.json")
    text = _events_text(evs, ",\n  ")
    p.write_bytes(gzip.compress(text) if gz else text)
    whole, _ = kineto._read_whole(p, None, None)
    monkeypatch.setenv("TRACEKIT_PARSE_THREADS", threads)
    monkeypatch.setattr(kineto, "_STREAM_CHUNK_BYTES", 64 << 10)
    monkeypatch.setattr(kineto, "_GROUP_CHUNKS", 3)
    stacks: list[int] = []
    stack = kineto._stack
    monkeypatch.setattr(kineto, "_stack", lambda frames: (stacks.append(len(frames)), stack(frames))[1])
    streamed, _ = kineto._read_streaming(p, None, None)
    # groups of 3 chunks, glued without a copy: one aligned chunk per group
    assert len(stacks) > 3 and set(stacks[:-1]) == {3} and 1 <= stacks[-1] <= 3
    assert streamed.get_column("ts_ns").n_chunks() == len(stacks) == streamed.get_column("kind").n_chunks()
    assert streamed.height == 2 * n
    assert_frame_equal(streamed, whole, categorical_as_str=True)


def test_columns_null_in_a_chunk_take_no_place_in_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # most args fields are null in most chunks; a chunk drops them (_sparse) and the read adds them back
    # where other chunks have values, or as null literals where none does: same rows, same schema
    import tracekit.ingest.kineto as kineto

    evs = []
    n = 6000
    for i in range(n):
        evs.append(runtime("cudaLaunchKernel", 10 * i, 2, corr=i + 1))
        evs.append(kernel(f"k{i % 5}", 10 * i + 3, 1.25, corr=i + 1))
    evs.append(cpu_op("record_param_comms", 10 * n, 5, **{"Collective name": "allreduce", "In msg nelems": 8}))
    p = tmp_path / "t.json.gz"
    p.write_bytes(gzip.compress(_events_text(evs, ",\n  ")))
    import json

    chunk = ("[" + ",\n  ".join(json.dumps(e) for e in evs[:100]) + "]").encode()
    stage, _ = kineto._stage_chunk(bytearray(chunk), p, None)
    assert "coll_name" not in stage.columns and "bytes" not in stage.columns and "grid_x" in stage.columns
    whole, _ = kineto._read_whole(p, None, None)
    monkeypatch.setenv("TRACEKIT_PARSE_THREADS", "1")
    monkeypatch.setattr(kineto, "_CHUNK_BYTES", 64 << 10)
    monkeypatch.setattr(kineto, "_GROUP_CHUNKS", 3)
    streamed, _ = kineto._read_streaming(p, None, None)
    assert streamed.schema == pl.Schema(POLARS_SCHEMA)
    assert_frame_equal(streamed, whole, categorical_as_str=True)
    coll = streamed.filter(pl.col("coll_name").is_not_null())
    assert coll.select("name", "coll_name", "coll_in_nelems").rows() == [("record_param_comms", "allreduce", 8)]
    assert streamed.get_column("bytes").null_count() == streamed.height


def _mapped(path: Path) -> bool:
    """Whether this process still maps ``path`` (the plain-file reader maps it while it reads)."""
    return str(path) in Path("/proc/self/maps").read_text()


@pytest.mark.parametrize("gz", [True, False])
@pytest.mark.parametrize("damage", ["garbled", "cut"])
def test_a_file_broken_mid_way_leaves_no_thread_or_mapping(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gz: bool, damage: str) -> None:
    # many chunks decoded on the parse threads, the damage in the middle: one-line error, and afterwards no
    # parse thread runs and the file is no longer mapped (the reader stops its workers on the error)
    import threading

    import tracekit.ingest.kineto as kineto

    evs = [kernel(f"k{i % 7}", 10 * i, 1.5, corr=i + 1) for i in range(8000)]
    text = _events_text(evs, ",\n  ")
    mid = text.index(b"},\n", len(text) // 2) + 2  # between two events, half-way
    text = text[:mid] + b"@@ not json @@," + text[mid:] if damage == "garbled" else text[:mid]
    p = tmp_path / ("t.json.gz" if gz else "t.json")
    p.write_bytes(gzip.compress(text) if gz else text)
    monkeypatch.setenv("TRACEKIT_PARSE_THREADS", "3")
    monkeypatch.setattr(kineto, "_STREAM_CHUNK_BYTES", 64 << 10)
    before = {t.ident for t in threading.enumerate()}
    with pytest.raises(InputError) as ei:
        read_kineto(p)
    msg = str(ei.value)
    assert "\n" not in msg and p.name in msg and ("invalid JSON" in msg or "truncated" in msg), msg
    assert {t.ident for t in threading.enumerate() if t.is_alive()} <= before
    assert not _mapped(p)


@pytest.mark.parametrize("exact", [False, True])
def test_module_ranges_of_a_stack_trace_are_kept(tmp_path: Path, exact: bool) -> None:
    """with_stack/with_modules: ``nn.Module: <Class>_<n>`` python_function ranges are read as ranges (module
    context, tracekit.ingest.modules); the other Python frames are not."""
    evs = [
        {"ph": "X", "cat": "python_function", "name": "nn.Module: Qwen3MoeExperts_0", "pid": 1, "tid": 3, "ts": 10, "dur": 20},
        {"ph": "X", "cat": "python_function", "name": "torch/nn/functional.py(1600): linear", "pid": 1, "tid": 3, "ts": 11, "dur": 2},
        cpu_op("aten::mm", 12, 1, tid=3, **{"External id": 7}),
    ]
    df, meta = read_kineto(write_doc(tmp_path / "s.json", doc(evs, rank=0)), exact=exact)
    rng = _k(df, "range")
    assert rng["name"].cast(pl.String).to_list() == ["nn.Module: Qwen3MoeExperts_0"]
    assert rng["dur_ns"].to_list() == [20_000]
    assert not meta.get("quality") or not any(q.get("code") == "unknown_event_kinds" for q in meta["quality"])
