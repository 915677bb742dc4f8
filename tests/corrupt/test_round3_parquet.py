"""Reliability round three (issue 31): a hand-edited trace.parquet, validated on read in one place
(``tracekit.trace_check``) for every command.

The trace is the real 2-rank A100 capture from /work/shared/traces, converted once; each case edits a
copy with pyarrow (types, nulls, enums, ranges, footer) as a user or another tool would. Each violation
is either a one-line error naming the column (exit 2) or a counted repair in a quality flag, the same
for analyze, timeline, export, replay and diff, and never the internal-error exit 70.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from corrupt._build import TF0, TF1, assert_clean_error, cli_inproc, need

pytestmark = pytest.mark.filterwarnings("ignore")

run = cli_inproc
Edit = Callable[[pa.Table, dict[str, Any]], tuple[pa.Table, dict[str, Any]]]


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    need(TF0, TF1)
    out = tmp_path_factory.mktemp("good3") / "trace.parquet"
    assert run("convert", TF0, TF1, "-o", out, "-q").returncode == 0
    return out


@pytest.fixture(scope="module")
def good_json(good: Path) -> dict[str, Any]:
    p = run("analyze", good, "--json")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def edited(good: Path, tmp: Path, edit: Edit, *, statistics: bool = True) -> Path:
    t = pq.read_table(good)
    meta = json.loads(pq.read_metadata(good).metadata[b"tracekit"])
    t, meta = edit(t, meta)
    t = t.replace_schema_metadata({b"tracekit": json.dumps(meta).encode()})
    f = tmp / "bad.parquet"
    pq.write_table(t, f, write_statistics=statistics)
    return f


def col(t: pa.Table, name: str, fn: Callable[[int, Any], Any], typ: pa.DataType | None = None) -> pa.Table:
    """``t`` with column ``name`` replaced by ``fn(row, value)`` (as ``typ``; default: its type, text for a dictionary)."""
    was = t.schema.field(name).type
    typ = typ or (was.value_type if pa.types.is_dictionary(was) else was)
    vals = [fn(i, v) for i, v in enumerate(t.column(name).to_pylist())]
    return t.set_column(t.schema.get_field_index(name), name, pa.array(vals, typ))


def commands(f: Path, good: Path, tmp: Path) -> list[tuple[str, ...]]:
    return [("analyze", str(f), "--json"), ("timeline", str(f), "-o", str(tmp / "x.html"), "--force"),
            ("export", str(f), "--perfetto", str(tmp / "x.json"), "--force"), ("replay", str(f), "--json"),
            ("diff", str(good), str(f), "--json")]


def every_command_ok(f: Path, good: Path, tmp: Path, code: str, *, all_commands: bool = False) -> dict[str, Any]:
    """analyze exits 0 and its --json carries ``code``; with ``all_commands``, timeline, export, replay and diff
    exit 0 too and those without a report say it on stderr (they read through the same validation, so a few
    cases cover them). Returns analyze's JSON."""
    out: dict[str, Any] = {}
    for args in commands(f, good, tmp)[: None if all_commands else 1]:
        p = run(*args)
        assert p.returncode == 0, (args, p.stderr)
        if args[0] == "analyze":
            out = json.loads(p.stdout)
            assert code in {q["code"] for q in out["quality"]}, out["quality"]
        elif args[0] != "diff":  # no report of its own: the flag on stderr
            assert "tracekit: warning: bad.parquet: " in p.stderr, (args, p.stderr)
    return out


def every_command_refuses(f: Path, good: Path, tmp: Path, *words: str, all_commands: bool = False) -> None:
    for args in commands(f, good, tmp)[: None if all_commands else 1]:
        assert_clean_error(run(*args), "bad.parquet", *words, code=2)


def flag(res: dict[str, Any], code: str) -> dict[str, Any]:
    return next(q for q in res["quality"] if q["code"] == code)


# ---- rows that cannot be placed: dropped and counted ----------------------------------------------


@pytest.mark.parametrize("statistics", [True, False], ids=["with_statistics", "without_statistics"])
def test_null_ts_rows_are_dropped_and_counted(tmp_path: Path, good: Path, statistics: bool) -> None:
    f = edited(good, tmp_path, lambda t, m: (col(t, "ts_ns", lambda i, v: None if i % 10 == 0 else v), m),
               statistics=statistics)
    res = every_command_ok(f, good, tmp_path, "invalid_rows", all_commands=statistics)  # before: unflagged; export: exit 70
    q = flag(res, "invalid_rows")
    n = (pq.read_metadata(good).num_rows + 9) // 10
    assert f"dropped {n} of " in q["message"] and f"ts_ns null ({n})" in q["message"]


def test_unknown_kind_rows_are_dropped_and_named(tmp_path: Path, good: Path) -> None:
    f = edited(good, tmp_path, lambda t, m: (col(t, "kind", lambda i, v: "kernelx" if v == "kernel" else v), m))
    res = every_command_ok(f, good, tmp_path, "invalid_rows")
    assert "kind 'kernelx'" in flag(res, "invalid_rows")["message"]


def test_unknown_category_is_recategorized_from_the_name_and_flagged(tmp_path: Path, good: Path,
                                                                     good_json: dict[str, Any]) -> None:
    f = edited(good, tmp_path, lambda t, m: (col(t, "category", lambda i, v: "foo" if v else v), m))
    res = every_command_ok(f, good, tmp_path, "repaired_values")
    assert "category 'foo' -> from the name" in flag(res, "repaired_values")["message"]
    # before: every GPU op filed as communication; now the same split as the file tracekit wrote
    assert res["ranks"] == good_json["ranks"]


def test_null_category_on_gpu_ops_is_recategorized(tmp_path: Path, good: Path, good_json: dict[str, Any]) -> None:
    f = edited(good, tmp_path, lambda t, m: (col(t, "category", lambda i, v: None), m))
    res = every_command_ok(f, good, tmp_path, "repaired_values")
    assert res["ranks"] == good_json["ranks"]


def test_some_negative_durations_are_set_to_0_and_counted(tmp_path: Path, good: Path) -> None:
    f = edited(good, tmp_path, lambda t, m: (col(t, "dur_ns", lambda i, v: -v if i % 7 == 0 and v else v), m))
    res = every_command_ok(f, good, tmp_path, "repaired_values")
    assert "dur_ns negative -> 0 (" in flag(res, "repaired_values")["message"]


def test_all_negative_durations_is_an_error_not_100_percent_idle(tmp_path: Path, good: Path) -> None:
    f = edited(good, tmp_path, lambda t, m: (col(t, "dur_ns", lambda i, v: -v - 1), m))
    every_command_refuses(f, good, tmp_path, "no GPU kernel, copy or memset has a positive 'dur_ns'")


def test_null_names_are_repaired(tmp_path: Path, good: Path) -> None:
    f = edited(good, tmp_path, lambda t, m: (col(t, "name", lambda i, v: None if i % 5 == 0 else v), m))
    res = every_command_ok(f, good, tmp_path, "repaired_values")
    assert "name null -> '' (" in flag(res, "repaired_values")["message"]


def test_null_rank_rows_are_dropped(tmp_path: Path, good: Path) -> None:
    f = edited(good, tmp_path, lambda t, m: (col(t, "rank", lambda i, v: None if i % 9 == 0 else v), m))
    res = every_command_ok(f, good, tmp_path, "invalid_rows")
    assert "rank null (" in flag(res, "invalid_rows")["message"]


# ---- types and ranges: errors naming the column -----------------------------------------------------


def test_dur_ns_stored_as_uint64_reads_as_the_original(tmp_path: Path, good: Path, good_json: dict[str, Any]) -> None:
    f = edited(good, tmp_path, lambda t, m: (col(t, "dur_ns", lambda i, v: v, pa.uint64()), m))
    for args in commands(f, good, tmp_path):
        p = run(*args)
        assert p.returncode == 0, (args, p.stderr)  # before: internal error, Int128 SchemaError in a vstack
        if args[0] == "analyze":
            assert json.loads(p.stdout)["ranks"] == good_json["ranks"]


def test_uint64_beyond_int64_is_an_error_naming_the_column(tmp_path: Path, good: Path) -> None:
    f = edited(good, tmp_path, lambda t, m: (col(t, "dur_ns", lambda i, v: 2**64 - 1 if i == 3 else v, pa.uint64()), m))
    every_command_refuses(f, good, tmp_path, "column 'dur_ns' holds 18446744073709551615", "outside Int64")


@pytest.mark.parametrize("column, value", [("ts_ns", 2**63 - 1), ("dur_ns", 2**62)])
def test_times_beyond_2_62_ns_are_an_error(tmp_path: Path, good: Path, column: str, value: int) -> None:
    f = edited(good, tmp_path, lambda t, m: (col(t, column, lambda i, v: value if i == 5 else v), m))
    every_command_refuses(f, good, tmp_path, f"column '{column}' holds {value}", "2^62")


def test_a_zero_row_file_is_an_error(tmp_path: Path, good: Path) -> None:
    f = edited(good, tmp_path, lambda t, m: (t.slice(0, 0), m))
    every_command_refuses(f, good, tmp_path, "no rows")  # before: an empty report, exit 0


def test_a_rank_the_footer_does_not_list_is_kept_and_flagged(tmp_path: Path, good: Path) -> None:
    f = edited(good, tmp_path, lambda t, m: (col(t, "rank", lambda i, v: 5 if v == 1 else v), m))
    res = every_command_ok(f, good, tmp_path, "unlisted_ranks", all_commands=True)  # before: accepted silently
    n = sum(1 for v in pq.read_table(good).column("rank").to_pylist() if v == 1)
    assert f"{n} rows of rank(s) 5 that the footer's ranks (0, 1) do not list" in flag(res, "unlisted_ranks")["message"]


def test_a_negative_rank_is_an_error(tmp_path: Path, good: Path) -> None:
    f = edited(good, tmp_path, lambda t, m: (col(t, "rank", lambda i, v: -1 if v == 1 else v), m))
    every_command_refuses(f, good, tmp_path, "column 'rank' holds -1")


def test_kind_stored_as_plain_text_reads_as_the_original(tmp_path: Path, good: Path, good_json: dict[str, Any]) -> None:
    f = edited(good, tmp_path, lambda t, m: (col(t, "kind", lambda i, v: v, pa.string()), m))
    p = run("analyze", f, "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["ranks"] == good_json["ranks"]


# ---- footer -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [None, "1", True, -1, 1.5], ids=["null", "text", "boolean", "negative", "fraction"])
def test_schema_version_of_the_wrong_type_is_an_error_naming_the_field(tmp_path: Path, good: Path, value: object) -> None:
    f = edited(good, tmp_path, lambda t, m: (t, {**m, "schema_version": value}))
    every_command_refuses(f, good, tmp_path, "footer field 'schema_version'", all_commands=value is None)  # was exit 70


@pytest.mark.parametrize("field, value", [
    ("quality", 5), ("quality", [1, {"code": 2}, "x"]), ("window_ns", "soon"), ("world_size", True),
    ("capture", {"profiler_windows": [[1]], "workload": "x"}), ("clock_offsets_ns", {"1": "a"}), ("device_mode", 3),
], ids=["quality_int", "quality_junk", "window_text", "world_bool", "capture_junk", "offsets_text", "mode_int"])
def test_footer_fields_of_the_wrong_type_are_ignored_and_flagged(tmp_path: Path, good: Path, field: str, value: object) -> None:
    f = edited(good, tmp_path, lambda t, m: (t, {**m, field: value}))
    res = every_command_ok(f, good, tmp_path, "bad_footer", all_commands=field == "quality" and value == 5)  # was exit 70
    assert f" {field}" in flag(res, "bad_footer")["message"], flag(res, "bad_footer")


@pytest.mark.parametrize("field", ["quality", "device_mode", "ranks", "window_ns", "world_size", "capture", "clock_offsets_ns",
                                   "tool_version", "rules"])
def test_a_null_footer_field_reads_as_absent(tmp_path: Path, good: Path, field: str) -> None:
    """A null is the field absent (as in an older file): the reader's default, no flag (device_mode null was exit 70:
    the result tree's device_mode is text)."""
    f = edited(good, tmp_path, lambda t, m: (t, {**m, field: None}))
    p = run("analyze", f, "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert "bad_footer" not in {q["code"] for q in doc["quality"]}
    if field == "device_mode":
        assert doc["device_mode"] == "gpu"


def test_a_device_name_that_is_a_number_is_ignored_and_flagged(tmp_path: Path, good: Path) -> None:
    f = edited(good, tmp_path, lambda t, m: (t, {**m, "ranks": [{**r, "device_name": 5} for r in m["ranks"]]}))
    res = every_command_ok(f, good, tmp_path, "bad_footer")  # before: internal error, AttributeError ('upper')
    assert "ranks[0].device_name (an integer)" in flag(res, "bad_footer")["message"]


def test_a_clean_file_gets_no_read_flag(good_json: dict[str, Any]) -> None:
    assert not {"invalid_rows", "repaired_values", "bad_footer", "unlisted_ranks"} & {q["code"] for q in good_json["quality"]}
