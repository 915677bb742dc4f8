"""Bad inputs through the CLI: non-zero exit, one line on stderr naming file/rank/field + remedy, no traceback.

Each case is built from the real traces in /work/shared/traces inside ``tmp_path``;
the originals are only read. Every case runs ``tracekit.cli.main`` in-process
(``run``; an escaping exception fails the test like a traceback would), and
``test_real_process`` repeats a sample through the installed console script.
"""

from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path
from typing import Callable

import polars as pl
import pyarrow.parquet as pq
import pytest

from corrupt._build import TF0, TF1, assert_clean_error, cli, cli_inproc, dump, load, need, with_rank

pytestmark = pytest.mark.filterwarnings("ignore")

run = cli_inproc


@pytest.fixture(scope="module")
def tf0() -> dict:
    need(TF0)
    return load(TF0)


@pytest.fixture(scope="module")
def tf1() -> dict:
    need(TF1)
    return load(TF1)


@pytest.fixture(scope="module")
def good_parquet(tmp_path_factory, tf0) -> Path:
    """A genuine trace.parquet converted from rank 0 of the real 2-rank set."""
    d = tmp_path_factory.mktemp("good")
    src = dump(tf0, d / "rank0.json.gz")
    out = d / "trace.parquet"
    p = run("convert", src, "-o", out, "-q")
    assert p.returncode == 0, p.stderr
    return out


# ---- Kineto JSON that cannot be read --------------------------------------------------------


def _truncated_gz(t: Path, tf0: dict) -> Path:
    raw = TF0.read_bytes()
    f = t / "rank0.json.gz"
    f.write_bytes(raw[: len(raw) // 2])
    return f


def _invalid_json(t: Path, tf0: dict) -> Path:
    txt = gzip.decompress(TF0.read_bytes())
    f = t / "rank0.json"
    f.write_bytes(txt[: len(txt) // 3])  # cut mid-document
    return f


def _garbled_json(t: Path, tf0: dict) -> Path:
    txt = gzip.decompress(TF0.read_bytes())
    i = txt.find(b'"ph": "X"', len(txt) // 2)
    f = t / "rank0.json"
    f.write_bytes(txt[:i] + b'"ph": X?' + txt[i + 9 :])  # one bad token deep inside traceEvents
    return f


def _not_a_trace_object(t: Path, tf0: dict) -> Path:
    d = {k: v for k, v in tf0.items() if k != "traceEvents"}  # real header, no events key
    return dump(d, t / "rank0.json")


def _bare_array(t: Path, tf0: dict) -> Path:
    return dump(tf0["traceEvents"][:50], t / "rank0.json")


def _events_not_list(t: Path, tf0: dict) -> Path:
    d = dict(tf0, traceEvents={"ph": "X"})
    return dump(d, t / "rank0.json.gz")


def _events_not_objects(t: Path, tf0: dict) -> Path:
    d = dict(tf0, traceEvents=[1, "x", None])
    return dump(d, t / "rank0.json.gz")


def _empty_trace(t: Path, tf0: dict) -> Path:
    d = dict(tf0, traceEvents=[])
    return dump(d, t / "rank0.json.gz")


def _only_metadata_events(t: Path, tf0: dict) -> Path:
    """Only 'M' (process/thread name) events: a profiler that recorded nothing."""
    d = dict(tf0, traceEvents=[e for e in tf0["traceEvents"] if e.get("ph") == "M"])
    assert d["traceEvents"]
    return dump(d, t / "rank0.json.gz")


def _zero_bytes(t: Path, tf0: dict) -> Path:
    f = t / "rank0.json.gz"
    f.write_bytes(b"")
    return f


CASES: dict[str, tuple[Callable[[Path, dict], Path], tuple[str, ...]]] = {
    # case: (builder, substrings the one-line message must contain: file, field, remedy)
    "truncated_gz": (_truncated_gz, ("rank0.json.gz", "gzip", "re-copy")),
    "invalid_json": (_invalid_json, ("rank0.json", "invalid json", "truncated")),
    "garbled_json": (_garbled_json, ("rank0.json", "invalid json", "corrupt")),
    "not_a_trace_object": (_not_a_trace_object, ("rank0.json", "traceevents")),
    "bare_array": (_bare_array, ("rank0.json", "traceevents", "expected an object")),
    "events_not_list": (_events_not_list, ("rank0.json.gz", "traceevents", "not a list")),
    "events_not_objects": (_events_not_objects, ("rank0.json.gz", "traceevents")),
    "empty_trace": (_empty_trace, ("rank0.json.gz", "no events")),
    "only_metadata_events": (_only_metadata_events, ("rank0.json.gz", "no events")),
    "zero_bytes": (_zero_bytes, ("rank0.json.gz", "empty file", "re-export")),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_convert_bad_kineto_cli(case: str, tmp_path: Path, tf0: dict) -> None:
    build, must = CASES[case]
    src = build(tmp_path, tf0)
    out = tmp_path / "trace.parquet"
    p = run("convert", src, "-o", out)
    assert_clean_error(p, *must, code=2)
    assert not out.exists()
    assert not [f for f in tmp_path.iterdir() if f.name.startswith(".")], "temp files left behind"


# ---- several ranks that do not belong together ----------------------------------------------


def test_duplicate_ranks_cli(tmp_path: Path, tf0: dict) -> None:
    d = tmp_path / "in"
    dump(tf0, d / "a.json.gz")
    dump(tf0, d / "b_rank0.json.gz")  # same distributedInfo.rank 0
    p = run("convert", d, "-o", tmp_path / "t.parquet")
    assert_clean_error(p, "duplicate rank 0", "a.json.gz", "b_rank0.json.gz", "one capture", code=2)


def test_sglang_profile_ids_mixed_cli(tmp_path: Path, tf0: dict, tf1: dict) -> None:
    d = tmp_path / "in"
    dump(tf0, d / "1745000001-TP-0.trace.json.gz")
    dump(tf1, d / "1745999999-TP-1.trace.json.gz")
    p = run("convert", d, "-o", tmp_path / "t.parquet")
    assert_clean_error(p, "different captures", "1745000001", "1745999999", "one capture", code=2)


def test_captures_hours_apart_refused_cli(tmp_path: Path, tf0: dict, tf1: dict) -> None:
    """Same job layout, but rank 1's clock base is 3 h later: two captures, refused (not 'aligned')."""
    d = tmp_path / "in"
    dump(tf0, d / "rank0.json.gz")
    dump(dict(tf1, baseTimeNanoseconds=3 * 3600 * 10**9), d / "rank1.json.gz")
    p = run("convert", d, "-o", tmp_path / "t.parquet")
    msg = assert_clean_error(p, "rank 1", "rank1.json.gz", "rank0.json.gz", "different captures", "one capture", code=2)
    assert "3.0 h" in msg, msg
    assert not (tmp_path / "t.parquet").exists()


# ---- Parquet inputs to analyze --------------------------------------------------------------


def _footer(good: Path) -> dict[bytes, bytes]:
    md = pq.read_metadata(good).metadata
    assert md and b"tracekit" in md
    return dict(md)


def _newer_schema(t: Path, good: Path) -> Path:
    tbl = pq.read_table(good)
    meta = json.loads(_footer(good)[b"tracekit"])
    meta["schema_version"] = 2
    f = t / "newer.parquet"
    pq.write_table(tbl.replace_schema_metadata({b"tracekit": json.dumps(meta).encode()}), f)
    return f


def _plain_parquet(t: Path, good: Path) -> Path:
    f = t / "plain.parquet"
    pl.read_parquet(good).select("ts_ns", "dur_ns").write_parquet(f)  # real columns, no tracekit footer
    return f


def _truncated_parquet(t: Path, good: Path) -> Path:
    raw = good.read_bytes()
    f = t / "half.parquet"
    f.write_bytes(raw[: len(raw) // 2])
    return f


def _footer_but_not_trace(t: Path, good: Path) -> Path:
    """tracekit footer metadata on a table that has none of the trace columns."""
    md = {b"tracekit": _footer(good)[b"tracekit"]}
    tbl = pl.DataFrame({"a": [1, 2]}).to_arrow().replace_schema_metadata(md)
    f = t / "other.parquet"
    pq.write_table(tbl, f)
    return f


PARQUET_CASES = {
    "newer_schema": (_newer_schema, ("newer.parquet", "schema_version 2", "upgrade tracekit")),
    "plain_parquet": (_plain_parquet, ("plain.parquet", "without tracekit metadata", "tracekit convert")),
    "truncated_parquet": (_truncated_parquet, ("half.parquet", "not a parquet file")),
    "footer_but_not_trace": (_footer_but_not_trace, ("other.parquet", "missing", "rank", "tracekit convert")),
}


@pytest.mark.parametrize("case", sorted(PARQUET_CASES))
def test_analyze_bad_parquet_cli(case: str, tmp_path: Path, good_parquet: Path) -> None:
    build, must = PARQUET_CASES[case]
    f = build(tmp_path, good_parquet)
    p = run("analyze", f)
    assert_clean_error(p, *must, code=2)
    p = run("analyze", f, "--json")
    assert_clean_error(p, *must, code=2)
    assert p.stdout == ""


def test_analyze_missing_file_cli(tmp_path: Path) -> None:
    assert_clean_error(run("analyze", tmp_path / "nope.parquet"), "nope.parquet", "no such file", code=2)


# ---- outputs ---------------------------------------------------------------------------------


def test_output_is_input_cli(tmp_path: Path, tf0: dict) -> None:
    src = dump(tf0, tmp_path / "rank0.json.gz")
    before = src.read_bytes()
    for extra in ((), ("--force",)):
        p = run("convert", src, "-o", src, *extra)
        assert_clean_error(p, "rank0.json.gz", "overwrite an input", "-o", code=2)
        assert src.read_bytes() == before


def test_output_exists_without_force_cli(tmp_path: Path, tf0: dict) -> None:
    src = dump(tf0, tmp_path / "rank0.json.gz")
    out = tmp_path / "trace.parquet"
    out.write_bytes(b"precious")
    p = run("convert", src, "-o", out)
    assert_clean_error(p, "trace.parquet", "exists", "--force", code=3)
    assert out.read_bytes() == b"precious"


def test_output_directory_missing_cli(tmp_path: Path, tf0: dict) -> None:
    src = dump(tf0, tmp_path / "rank0.json.gz")
    p = run("convert", src, "-o", tmp_path / "no" / "such" / "trace.parquet")
    assert_clean_error(p, "trace.parquet", "does not exist", "create it", code=3)


def test_unsupported_input_cli(tmp_path: Path, good_parquet: Path) -> None:
    p = run("convert", good_parquet, "-o", tmp_path / "t.parquet")
    assert_clean_error(p, "trace.parquet", "unsupported input", "kineto", code=2)


def test_missing_input_cli(tmp_path: Path) -> None:
    p = run("convert", tmp_path / "rank9.json.gz", "-o", tmp_path / "t.parquet")
    assert_clean_error(p, "rank9.json.gz", "no such file", code=2)


def test_rank_of_several_files_unknown_cli(tmp_path: Path, tf0: dict) -> None:
    """Two files without distributedInfo.rank and without a rank in the name: which is which?"""
    d = tmp_path / "in"
    nodi = {k: v for k, v in tf0.items() if k != "distributedInfo"}
    dump(nodi, d / "a.json.gz")
    dump(copy.deepcopy(nodi), d / "b.json.gz")
    p = run("convert", d, "-o", tmp_path / "t.parquet")
    assert_clean_error(p, "a.json.gz", "b.json.gz", "no rank", "rename", code=2)


def test_with_rank_helper_keeps_original(tf0: dict) -> None:
    """Guard for the builders: they never mutate the shared fixture."""
    d = with_rank(tf0, 5, 8)
    assert d["distributedInfo"]["rank"] == 5 and tf0["distributedInfo"]["rank"] == 0


# ---- the same through a real process (exit code, stderr, no traceback from the console script) ----

REAL = ["truncated_gz", "not_a_trace_object", "empty_trace"]
REAL_PARQUET = ["newer_schema", "footer_but_not_trace"]


@pytest.mark.parametrize("case", REAL)
def test_real_process_kineto(case: str, tmp_path: Path, tf0: dict) -> None:
    build, must = CASES[case]
    p = cli("convert", build(tmp_path, tf0), "-o", tmp_path / "t.parquet")
    assert_clean_error(p, *must, code=2)


@pytest.mark.parametrize("case", REAL_PARQUET)
def test_real_process_parquet(case: str, tmp_path: Path, good_parquet: Path) -> None:
    build, must = PARQUET_CASES[case]
    assert_clean_error(cli("analyze", build(tmp_path, good_parquet), "--json"), *must, code=2)


def test_real_process_output_exists(tmp_path: Path, tf0: dict) -> None:
    src = dump(tf0, tmp_path / "rank0.json.gz")
    out = tmp_path / "t.parquet"
    out.write_bytes(b"x")
    assert_clean_error(cli("convert", src, "-o", out), "exists", "--force", code=3)
