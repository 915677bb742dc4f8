"""Hypothesis over hand-edited trace.parquet files and over a stdout that fails (issue 31).

Invariants, for random edits of a real trace (nulls, enum values, types and widths, ranges, zero rows, the
footer's fields, with and without Parquet statistics):

* ``analyze`` exits 0 or 2 only: never the internal error 70, no traceback; a failure is one line naming the file;
* an edit that drops or changes rows is never silent: exit 2, or exit 0 with a read-time quality flag
  (``invalid_rows``, ``repaired_values``, ``bad_footer``); an edit that changes nothing the schema forbids gives
  no such flag (a clean file stays clean);
* a stdout that fails after N characters with ENOSPC, EPIPE or EIO gives exit 3 and one ``stdout`` line (or exit 0
  when the output was shorter than N), for analyze, diff, replay and convert.

In-process (``tracekit.cli.main``) on 1500 events of the A100 trace: about 30 s on 2 cores by default
(``TRACEKIT_FUZZ_SCALE=10`` for ten times more examples).
"""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corrupt._build import TF0, small_rank, cli_inproc, dump, load, need

pytestmark = pytest.mark.filterwarnings("ignore")

SCALE = int(os.environ.get("TRACEKIT_FUZZ_SCALE", "1"))
SETTINGS = settings(max_examples=25 * SCALE, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
READ_FLAGS = {"invalid_rows", "repaired_values", "bad_footer", "unlisted_ranks"}


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    need(TF0)
    doc = small_rank(load(TF0))
    d = tmp_path_factory.mktemp("pqfuzz")
    src = dump(doc, d / "rank0.json")
    out = d / "trace.parquet"
    assert cli_inproc("convert", src, "-o", out, "-q").returncode == 0
    return {"json": src, "parquet": out, "table": pq.read_table(out),
            "meta": json.loads(pq.read_metadata(out).metadata[b"tracekit"])}


# ---- edits ------------------------------------------------------------------------------------------

#: (column, value) edits that must be flagged or refused; the others (nullable columns) are allowed
FLAGGED_NULLS = {"rank", "kind", "ts_ns", "dur_ns", "name"}
COLUMNS = ["rank", "kind", "ts_ns", "dur_ns", "name", "category", "device", "stream", "correlation", "bytes"]
JUNK_KIND = st.sampled_from(["kernelx", "", "KERNEL", "idle", "counter\x00"])
JUNK_CAT = st.sampled_from(["foo", "idle", "", "Communication", "dense-gemm"])

edit = st.one_of(
    st.tuples(st.just("null"), st.sampled_from(COLUMNS), st.integers(1, 50)),
    st.tuples(st.just("kind"), JUNK_KIND, st.integers(1, 50)),
    st.tuples(st.just("category"), JUNK_CAT, st.integers(1, 50)),
    st.tuples(st.just("negative"), st.just("dur_ns"), st.integers(1, 50)),
    st.tuples(st.just("huge"), st.sampled_from(["ts_ns", "dur_ns"]), st.sampled_from([2**62, 2**63 - 1, -(2**63)])),
    st.tuples(st.just("type"), st.sampled_from(["rank", "ts_ns", "dur_ns", "stream", "kind"]),
              st.sampled_from(["uint64", "int32", "int16", "float64", "string"])),
    st.tuples(st.just("rank"), st.sampled_from([-1, 5, 2**31 - 1]), st.integers(1, 50)),
    st.tuples(st.just("footer"), st.sampled_from(["schema_version", "quality", "ranks", "window_ns", "world_size",
                                                  "capture", "clock_offsets_ns", "device_mode", "device_name"]),
              st.sampled_from([None, "x", 5, -1, 1.5, True, [1], {"a": 1}, [[1]]])),
    st.tuples(st.just("empty"), st.just(""), st.just(0)),
)


def _every(n: int, step: int) -> list[bool]:
    return [i % max(1, 51 - step) == 0 for i in range(n)]


def _apply(t: pa.Table, meta: dict[str, Any], e: tuple[str, Any, Any]) -> tuple[pa.Table, dict[str, Any], str]:
    """One edit; returns the table, the footer and what it must cause: "flag", "error", "either" or "none"."""
    kind, what, arg = e
    if kind == "footer":
        return _footer(t, meta, what, arg)
    if kind == "empty":
        return t.slice(0, 0), meta, "error"
    name = what if kind in ("null", "negative", "huge", "type") else {"kind": "kind", "category": "category", "rank": "rank"}[kind]
    vals = t.column(name).to_pylist()
    hit = _every(len(vals), arg) if isinstance(arg, int) and kind != "huge" else [i == 7 for i in range(len(vals))]
    typ = t.schema.field(name).type
    typ = typ.value_type if pa.types.is_dictionary(typ) else typ
    expect = "none"
    if kind == "null":
        vals = [None if h else v for v, h in zip(vals, hit)]
        expect = "flag" if name in FLAGGED_NULLS else "either"  # a null category on a GPU op is repaired (flag)
    elif kind in ("kind", "category"):
        vals = [what if h and v is not None else v for v, h in zip(vals, hit)]
        expect = "flag"
    elif kind == "negative":
        vals = [-v - 1 if h and v is not None else v for v, h in zip(vals, hit)]
        expect = "either"  # all GPU ops negative: an error
    elif kind == "huge":
        vals = [arg if h else v for v, h in zip(vals, hit)]
        expect = "error"
    elif kind == "rank":  # negative: an error; a rank the footer does not list: kept, flagged
        vals = [what if h else v for v, h in zip(vals, hit)]
        expect = "error" if what < 0 else "flag"
    elif kind == "type":
        return _retype(t, meta, name, arg, vals)
    if vals == t.column(name).to_pylist():
        expect = "none"  # the edit hit no row it could change
    return t.set_column(t.schema.get_field_index(name), name, pa.array(vals, typ)), meta, expect


def _retype(t: pa.Table, meta: dict[str, Any], name: str, to: str, vals: list[Any]) -> tuple[pa.Table, dict[str, Any], str]:
    typ = {"uint64": pa.uint64(), "int32": pa.int32(), "int16": pa.int16(), "float64": pa.float64(), "string": pa.string()}[to]
    was = t.schema.field(name).type
    text = pa.types.is_dictionary(was) or pa.types.is_string(was)
    try:
        arr = pa.array([None if v is None else (str(v) if to == "string" else v) for v in vals], typ) if not text or to == "string" \
            else None
    except (pa.ArrowInvalid, OverflowError):
        arr = None  # the values do not fit that type: not a possible file
    if arr is None:
        return t, meta, "none"
    same_family = (to in ("uint64", "int32", "int16")) == pa.types.is_integer(was) or text and to == "string"
    return t.set_column(t.schema.get_field_index(name), name, arr), meta, "none" if same_family else "error"


#: footer values that are of the right type, by hand from schemas/trace_v1.md (None is always allowed)
FOOTER_OK = {
    "quality": lambda v: isinstance(v, list) and all(isinstance(q, dict) and isinstance(q.get("code"), str) for q in v),
    "ranks": lambda v: isinstance(v, list) and all(isinstance(r, dict) and type(r.get("rank")) is int for r in v),
    "window_ns": lambda v: isinstance(v, list) and len(v) == 2 and all(type(x) is int for x in v) and v[0] <= v[1],
    "world_size": lambda v: type(v) is int and v >= 1,
    "capture": lambda v: isinstance(v, dict) and "profiler_windows" not in v,
    "clock_offsets_ns": lambda v: isinstance(v, dict) and all(type(x) is int for x in v.values()),
    "device_mode": lambda v: v in ("gpu", "cpu"),
}


def _footer(t: pa.Table, meta: dict[str, Any], key: str, value: Any) -> tuple[pa.Table, dict[str, Any], str]:
    m = json.loads(json.dumps(meta))
    if key == "device_name":
        m["ranks"] = [{**r, "device_name": value} for r in m.get("ranks", [])]
        return t, m, "none" if value is None or isinstance(value, str) else "flag"
    m[key] = value
    if key == "schema_version":
        return t, m, "none" if value in (0, 1) and not isinstance(value, bool) else "error"
    return t, m, "none" if value is None or FOOTER_OK[key](value) else "flag"


def _write(t: pa.Table, meta: dict[str, Any], f: Path, statistics: bool) -> None:
    pq.write_table(t.replace_schema_metadata({b"tracekit": json.dumps(meta).encode()}), f, write_statistics=statistics)


@SETTINGS
@given(edits=st.lists(edit, min_size=1, max_size=3), statistics=st.booleans())
def test_an_edited_trace_is_refused_in_one_line_or_read_with_a_flag(base: dict[str, Any], tmp_path_factory, edits,
                                                                     statistics: bool) -> None:
    t, meta, expect = base["table"], base["meta"], []
    for e in edits:
        t, meta, x = _apply(t, meta, e)
        expect.append(x)
    d = tmp_path_factory.mktemp("e")
    f = d / "edited.parquet"
    _write(t, meta, f, statistics)
    p = cli_inproc("analyze", f, "--json")
    assert p.returncode in (0, 2), (edits, p.returncode, p.stderr[-800:])
    assert "internal error" not in p.stderr and "Traceback" not in p.stderr, (edits, p.stderr[-800:])
    if p.returncode == 2:  # "flag" edits may be refused too (every row dropped, no GPU op with a duration left)
        lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("tracekit: error: ") and "edited.parquet" in lines[0], (edits, lines)
        assert set(expect) - {"none"}, (edits, "a clean edit was refused", lines)
        return
    codes = {q["code"] for q in json.loads(p.stdout)["quality"]} & READ_FLAGS
    assert "error" not in expect, (edits, "accepted", codes)
    if "flag" in expect:
        assert codes, (edits, "rows dropped or changed without a flag")
    if set(expect) == {"none"}:
        assert not codes, (edits, "a clean edit was flagged", codes)
    shutil.rmtree(d, ignore_errors=True)


# ---- stdout that fails -------------------------------------------------------------------------------


class FailingStdout(io.StringIO):
    """A stdout that accepts ``limit`` characters, then fails every write with ``err``."""

    def __init__(self, limit: int, err: int) -> None:
        super().__init__()
        self.limit, self.err = limit, err

    def write(self, s: str) -> int:
        if self.tell() + len(s) > self.limit:
            raise OSError(self.err, os.strerror(self.err))
        return super().write(s)


def _run_with_stdout(args: list[Any], stdout: io.StringIO) -> tuple[int, str]:
    import contextlib
    import sys

    from tracekit.cli import main

    err = io.StringIO()
    argv, sys.argv = sys.argv, ["tracekit", *map(str, args)]
    rc = 0
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(err):
            main()
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = argv
    return rc, err.getvalue()


@SETTINGS
@given(cmd=st.sampled_from(["analyze", "analyze_json", "diff", "replay", "convert"]),
       limit=st.one_of(st.just(0), st.integers(1, 4000)), err=st.sampled_from([errno.ENOSPC, errno.EPIPE, errno.EIO]))
def test_a_failing_stdout_is_exit_3_and_one_line(base: dict[str, Any], tmp_path_factory, cmd: str, limit: int, err: int) -> None:
    d = tmp_path_factory.mktemp("so")
    out = d / "t.parquet"
    args = {"analyze": ["analyze", base["parquet"]], "analyze_json": ["analyze", base["parquet"], "--json"],
            "diff": ["diff", base["parquet"], base["parquet"]], "replay": ["replay", base["parquet"], "--json"],
            "convert": ["convert", base["json"], "-o", out]}[cmd]
    rc, stderr = _run_with_stdout(args, FailingStdout(limit, err))
    lines = [ln for ln in stderr.splitlines() if ln.strip() and not ln.startswith("tracekit: warning")]
    assert "internal error" not in stderr and "Traceback" not in stderr, (cmd, stderr[-800:])
    if rc == 0:
        assert not lines, (cmd, lines)  # the whole output fitted
    else:
        assert rc == 3 and len(lines) == 1 and lines[0].startswith("tracekit: error: stdout"), (cmd, rc, lines)
        assert os.strerror(err) in lines[0]
    if cmd == "convert":
        assert out.exists() and (rc == 0 or f"{out} was written and kept" in lines[0])
    shutil.rmtree(d, ignore_errors=True)
