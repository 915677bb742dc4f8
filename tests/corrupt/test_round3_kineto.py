"""Reliability round three (issue 31), Kineto side: every field the reader keeps is checked where it is read.

Built from the real 2-rank A100 trace in /work/shared/traces (``tf0``, shapes recorded: the exact
msgspec decoder) and the same rank without shapes written in torch's own layout (one event per line:
the fast Arrow decoder, asserted by :func:`_decoders`). A number no int64 ns column can hold is one
line naming the field and the event; a value of the wrong type is left empty and counted per field in
``bad_field_types``; lone surrogates and bytes after the gzip data are read and flagged.
"""

from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from corrupt._build import TF0, assert_clean_error, cli_inproc, gpu_kernels, load, need
from tracekit.ingest import kineto, kineto_checks as kc

pytestmark = pytest.mark.filterwarnings("ignore")

run = cli_inproc


@pytest.fixture(scope="module")
def tf0() -> dict:
    need(TF0)
    return load(TF0)


def torch_layout(doc: dict[str, Any]) -> bytes:
    """``doc`` as torch writes it: the top-level keys, then one event per line (the fast decoder's layout)."""
    head = json.dumps({k: v for k, v in doc.items() if k != "traceEvents"})[:-1]
    events = ",\n".join(json.dumps(e) for e in doc["traceEvents"])
    return (head + (", " if len(head) > 1 else "") + '"traceEvents": [\n' + events + "\n]}").encode()


def no_shapes(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` without recorded shapes and without the profiler's own text-pid lane: every chunk fits the fast decoder."""
    d = copy.deepcopy(doc)
    d.pop("record_shapes", None)
    d["traceEvents"] = [e for e in d["traceEvents"] if isinstance(e.get("pid"), int)]  # the "Spans" lane has a text pid
    for e in d["traceEvents"]:
        if isinstance(e.get("args"), dict):
            e["args"].pop("Input Dims", None)
            e["args"].pop("Input type", None)
    return d


def _write(tmp: Path, doc: dict[str, Any], layout: str, name: str = "rank0.json") -> Path:
    f = tmp / name
    f.write_bytes(torch_layout(doc) if layout == "torch" else json.dumps(doc).encode())
    return f


def _convert(src: Path, tmp: Path) -> tuple[pl.DataFrame, dict[str, dict[str, Any]]]:
    out = tmp / "t.parquet"
    p = run("convert", src, "-o", out, "--force", "-q")
    assert p.returncode == 0, p.stderr
    from tracekit.schema import read_trace

    df, meta = read_trace(out)
    return df, {q["code"]: q for q in meta["quality"]}


def _decoders(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Count the chunks each decoder produced (the fast one returns None when it hands a chunk over)."""
    seen = {"fast": 0, "exact": 0}
    fast, exact = kineto._fast_stage, kineto._exact_stage

    def f(*a: Any, **k: Any) -> Any:
        r = fast(*a, **k)
        seen["fast"] += r is not None
        return r

    def e(*a: Any, **k: Any) -> Any:
        seen["exact"] += 1
        return exact(*a, **k)

    monkeypatch.setattr(kineto, "_fast_stage", f)
    monkeypatch.setattr(kineto, "_exact_stage", e)
    return seen


def test_the_torch_layout_fixture_takes_the_fast_decoder(tmp_path: Path, tf0: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _decoders(monkeypatch)
    _convert(_write(tmp_path, no_shapes(tf0), "torch"), tmp_path)
    assert seen["fast"] >= 1 and seen["exact"] == 0, seen


# ---- numbers no int64 ns column can hold: one line naming the field --------------------------------


@pytest.mark.parametrize("base", [1e30, 10**30, -5, 2**62], ids=["float_1e30", "int_10_30", "negative", "2_62"])
def test_base_time_outside_int64_ns_is_an_error_naming_the_field(tmp_path: Path, tf0: dict, base: object) -> None:
    d = copy.deepcopy(tf0)
    d["baseTimeNanoseconds"] = base
    p = run("convert", _write(tmp_path, d, "compact"), "-o", tmp_path / "t.parquet")
    assert_clean_error(p, "rank0.json", "baseTimeNanoseconds", "outside", code=2)  # before: internal error (i128 -> i64)
    assert not (tmp_path / "t.parquet").exists()


@pytest.mark.parametrize("base", ["soon", [1], True], ids=["text", "list", "boolean"])
def test_base_time_of_the_wrong_type_is_ignored_and_flagged(tmp_path: Path, tf0: dict, base: object) -> None:
    d = copy.deepcopy(tf0)
    d["baseTimeNanoseconds"] = base
    _, q = _convert(_write(tmp_path, d, "compact"), tmp_path)
    assert "baseTimeNanoseconds" in q["bad_field_types"]["message"]


@pytest.mark.parametrize("layout", ["torch", "compact"])
@pytest.mark.parametrize("field, value, words", [
    ("ts", 1e30, ["ts 1e+30", "int64 ns"]),
    ("dur", 1e30, ["dur 1e+30", "int64 ns"]),
    ("ts", 2**63, ["ts 9223372036854775808"]),
    ("stream", 10**20, ["args.stream 100000000000000000000", "64-bit integer"]),
    ("correlation", -(2**64), ["args.correlation", "64-bit integer"]),
])
def test_a_number_outside_int64_is_an_error_naming_the_field_and_event(tmp_path: Path, tf0: dict, layout: str,
                                                                       field: str, value: object, words: list[str]) -> None:
    d = no_shapes(tf0) if layout == "torch" else copy.deepcopy(tf0)
    k = gpu_kernels(d)[3]
    (k if field in ("ts", "dur") else k["args"])[field] = value
    p = run("convert", _write(tmp_path, d, layout), "-o", tmp_path / "t.parquet")
    assert_clean_error(p, "rank0.json", *words, k["name"][:30], code=2)  # before: dropped ("without a numeric ts") or null


# ---- wrong types: left empty, counted per field -------------------------------------------------------


@pytest.mark.parametrize("layout", ["torch", "compact"])
@pytest.mark.parametrize("value, kind", [(True, "boolean"), (7.5, "fractional number"), ([7], "list"), ({"a": 1}, "object"),
                                         ("seven", "text")])
def test_a_stream_of_the_wrong_type_is_left_empty_and_counted(tmp_path: Path, tf0: dict, layout: str, value: object,
                                                              kind: str) -> None:
    d = no_shapes(tf0) if layout == "torch" else copy.deepcopy(tf0)
    for k in gpu_kernels(d)[:3]:
        k["args"]["stream"] = value
    df, q = _convert(_write(tmp_path, d, layout), tmp_path)
    fields = q["bad_field_types"]["details"]["fields"]
    assert fields == {"args.stream": {kind: 3}}, fields
    kern = df.filter(pl.col("kind") == "kernel")
    assert kern["stream"].null_count() == 3  # before: a boolean became stream 1, 7.5 became 7, unflagged
    assert 1 not in kern["stream"].to_list() or value is not True


def test_args_that_is_not_an_object_is_counted_on_every_kernel(tmp_path: Path, tf0: dict) -> None:
    d = no_shapes(tf0)
    n = len(gpu_kernels(d))
    for k in gpu_kernels(d):
        k["args"] = "junk"
    df, q = _convert(_write(tmp_path, d, "torch"), tmp_path)
    assert q["bad_field_types"]["details"]["fields"] == {"args": {"text": n}}  # before: every stream/device null, no flag
    assert "args: %d event(s)" % n in q["bad_field_types"]["message"]


@pytest.mark.parametrize("value, want", [("7", 7), ("0x0", 0), ("0x1f", 31), (7.0, 7)])
def test_an_integer_written_as_text_is_read_as_its_number(tmp_path: Path, tf0: dict, value: object, want: int) -> None:
    """Real traces do this: ROCm writes "stream": "0x0", vLLM "bytes": "256"."""
    d = copy.deepcopy(tf0)
    for k in gpu_kernels(d)[:2]:
        k["args"]["stream"] = value
    df, q = _convert(_write(tmp_path, d, "compact"), tmp_path)
    assert "bad_field_types" not in q
    assert df.filter(pl.col("kind") == "kernel")["stream"].head(2).to_list() == [want, want]


def test_device_name_that_is_a_number_is_dropped_with_a_flag_and_analyze_runs(tmp_path: Path, tf0: dict) -> None:
    d = copy.deepcopy(tf0)
    d["deviceProperties"] = [{"id": 0, "name": 5, "totalGlobalMem": "lots", "numSms": 108}]
    _, q = _convert(_write(tmp_path, d, "compact"), tmp_path)
    fields = q["bad_field_types"]["details"]["fields"]
    assert fields == {"deviceProperties.name": {"integer": 1}, "deviceProperties.totalGlobalMem": {"text": 1}}
    p = run("analyze", tmp_path / "t.parquet", "--json")
    assert p.returncode == 0, p.stderr  # before: internal error, AttributeError: 'int' object has no attribute 'upper'


# ---- nesting, surrogates, gzip ---------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["torch", "compact"])
def test_200k_nested_arrays_in_one_event_is_one_line_saying_where(tmp_path: Path, tf0: dict, layout: str) -> None:
    d = no_shapes(tf0)
    marker = "NESTED_HERE"
    gpu_kernels(d)[2]["args"]["grid"] = marker
    text = torch_layout(d) if layout == "torch" else json.dumps(d).encode()
    deep = b"[" * 200_000 + b"]" * 200_000
    f = tmp_path / "rank0.json"
    f.write_bytes(text.replace(json.dumps(marker).encode(), deep))
    msg = assert_clean_error(run("convert", f, "-o", tmp_path / "t.parquet"), "rank0.json", "nested more than 256 levels",
                             "line", "column", code=2)  # before: internal error, RecursionError
    assert "[[[[" in msg


def test_deep_offset_ignores_brackets_inside_strings() -> None:
    assert kc.deep_offset(b'{"a": "[[[[[[[[\\"[[[[", "b": [[1]]}', 3) is None
    assert kc.deep_offset(b'{"a": "x\\\\", "b": [[[[1]]]]}', 3) == 20  # an escaped backslash ends the string
    assert kc.deep_offset(b"[[[[", 2) == 2


@pytest.mark.parametrize("layout", ["torch", "compact"])
def test_a_lone_surrogate_escape_is_read_as_u_fffd_and_counted(tmp_path: Path, tf0: dict, layout: str) -> None:
    d = no_shapes(tf0) if layout == "torch" else copy.deepcopy(tf0)
    k = gpu_kernels(d)[4]
    name = k["name"]
    k["name"] = name + "\ud800"  # json.dumps writes the escape \ud800: valid JSON, not valid text
    gpu_kernels(d)[5]["name"] = "pair \U0001f600"  # a valid pair stays
    df, q = _convert(_write(tmp_path, d, layout), tmp_path)
    names = set(df.filter(pl.col("kind") == "kernel")["name"].cast(pl.String).to_list())
    assert name + "\ufffd" in names and "pair \U0001f600" in names
    assert q["lone_surrogates"]["details"]["count"] == 1  # before: "invalid JSON ...; the file is corrupt or truncated"


def test_fix_lone_surrogates_keeps_pairs_and_escaped_backslashes() -> None:
    fixed, n = kc.fix_lone_surrogates(b'"a\\ud800b" "\\ud83d\\ude00" "\\\\ud800" "\\udc00"')
    assert (fixed, n) == (b'"a\\ufffdb" "\\ud83d\\ude00" "\\\\ud800" "\\ufffd"', 2)


@pytest.mark.parametrize("tail, severity", [(b"garbage after the stream", "warning"), (b"\x00" * 512, "info")],
                         ids=["garbage", "zero_padding"])
def test_bytes_after_a_complete_gzip_are_read_and_flagged(tmp_path: Path, tf0: dict, tail: bytes, severity: str) -> None:
    f = tmp_path / "rank0.json.gz"
    f.write_bytes(gzip.compress(json.dumps(tf0).encode()) + tail)
    df, q = _convert(f, tmp_path)
    assert q["trailing_data"]["details"]["bytes"] == len(tail)  # before: "truncated or corrupt gzip"
    assert q["trailing_data"]["severity"] == severity
    assert df.filter(pl.col("kind") == "kernel").height == len(gpu_kernels(tf0))


def test_a_truncated_gzip_is_still_called_truncated(tmp_path: Path, tf0: dict) -> None:
    f = tmp_path / "rank0.json.gz"
    data = gzip.compress(json.dumps(tf0).encode())
    f.write_bytes(data[: len(data) // 2])
    assert_clean_error(run("convert", f, "-o", tmp_path / "t.parquet"), "rank0.json.gz", "truncated", code=2)


def test_checked_ints_counts_only_where_the_field_matters() -> None:
    tally: dict[str, int] = {}
    s = kc.checked_ints("args.x", [1, True, "2", None, [3]], ["a"] * 5, "f", tally, only=[True, False, True, True, True])
    assert s.to_list() == [1, None, 2, None, None]
    assert tally == {kc.tally_key("args.x", "list"): 1}
    with pytest.raises(kc.InputError, match="args.x 9223372036854775808 of event 'b'"):
        kc.checked_ints("args.x", [1, 2**63], ["a", "b"], "f", {})

