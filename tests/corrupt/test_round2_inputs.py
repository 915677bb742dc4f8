"""Reliability round two (issue 20): bad metadata, times, durations, phases, duplicates and file kinds.

Each case is built from the real 2-rank A100 trace in /work/shared/traces inside
``tmp_path`` and run through ``tracekit.cli.main`` in-process. A recoverable
problem must exit 0 with a quality flag that carries a count; an unusable input
one line on stderr (``assert_clean_error``), never the internal-error exit 70.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest

from corrupt._build import TF0, assert_clean_error, cli_inproc, dump, gpu_kernels, load, need

pytestmark = pytest.mark.filterwarnings("ignore")

run = cli_inproc


@pytest.fixture(scope="module")
def tf0() -> dict:
    need(TF0)
    return load(TF0)


def _mut(tf0: dict, tmp: Path, fn, name: str = "rank0.json") -> Path:
    d = copy.deepcopy(tf0)
    fn(d)
    return dump(d, tmp / name)


def _convert_ok(src: Path, tmp: Path) -> tuple[str, dict]:
    out = tmp / "t.parquet"
    p = run("convert", src, "-o", out, "--force")
    assert p.returncode == 0, p.stderr
    from tracekit.schema import read_metadata

    return p.stdout, {q["code"]: q for q in read_metadata(out)["quality"]}


# ---- metadata that would size things ---------------------------------------------------------


def test_world_size_of_a_billion_is_ignored_not_allocated(tmp_path: Path, tf0: dict) -> None:
    src = _mut(tf0, tmp_path, lambda d: d["distributedInfo"].update(world_size=10**9))
    out, q = _convert_ok(src, tmp_path)
    assert "bad_world_size" in q and "1000000000" in q["bad_world_size"]["message"]
    assert "missing_ranks" not in q  # the claim sized nothing
    assert not list(tmp_path.glob(".tracekit-parts-*"))


@pytest.mark.parametrize("ws", [-3, 0, True, "lots"])
def test_world_size_not_a_positive_int_is_flagged(tmp_path: Path, tf0: dict, ws: object) -> None:
    src = _mut(tf0, tmp_path, lambda d: d["distributedInfo"].update(world_size=ws))
    _, q = _convert_ok(src, tmp_path)
    assert "bad_world_size" in q


def test_world_size_not_above_rank_is_ignored(tmp_path: Path, tf0: dict) -> None:
    src = _mut(tf0, tmp_path, lambda d: d["distributedInfo"].update(rank=5, world_size=2), "rank5.json")
    _, q = _convert_ok(src, tmp_path)
    assert "bad_world_size" in q and "not above its rank 5" in q["bad_world_size"]["message"]


def test_rank_of_10_to_12_in_the_trace_falls_back_to_the_file_name(tmp_path: Path, tf0: dict) -> None:
    src = _mut(tf0, tmp_path, lambda d: d["distributedInfo"].update(rank=10**12), "rank1.json")
    out, q = _convert_ok(src, tmp_path)
    assert "bad_rank_field" in q and "1000000000000" in q["bad_rank_field"]["message"]
    assert "[1]" in out


def test_rank_of_10_to_12_in_the_file_name_is_one_line(tmp_path: Path, tf0: dict) -> None:
    d = copy.deepcopy(tf0)
    d["distributedInfo"].pop("rank", None)
    src = dump(d, tmp_path / "rank1000000000000.json")
    p = run("convert", src, "-o", tmp_path / "t.parquet")
    assert_clean_error(p, "rank1000000000000.json", "out of range", code=2)


def test_string_rank_is_read_and_flagged_not_assumed_0(tmp_path: Path, tf0: dict) -> None:
    src = _mut(tf0, tmp_path, lambda d: d["distributedInfo"].update(rank="1"), "trace.json")
    out, q = _convert_ok(src, tmp_path)
    assert "[1]" in out and "rank_assumed" not in q
    assert q["bad_rank_field"]["severity"] == "info"


def test_junk_string_rank_is_flagged(tmp_path: Path, tf0: dict) -> None:
    src = _mut(tf0, tmp_path, lambda d: d["distributedInfo"].update(rank="zero"), "trace.json")
    _, q = _convert_ok(src, tmp_path)
    assert "bad_rank_field" in q and "'zero'" in q["bad_rank_field"]["message"]
    assert "rank_assumed" in q


def test_rank_contradicting_the_file_name_is_flagged(tmp_path: Path, tf0: dict) -> None:
    src = _mut(tf0, tmp_path, lambda d: d["distributedInfo"].update(rank=5), "rank2.json")
    out, q = _convert_ok(src, tmp_path)
    m = q["rank_name_mismatch"]["message"]
    assert "rank 5" in m and "rank 2" in m and "rank2.json" in m
    assert "[5]" in out


# ---- times, durations, phases, duplicates -----------------------------------------------------


def test_one_kernel_at_ts_minus_5_is_dropped_and_the_window_stays_real(tmp_path: Path, tf0: dict) -> None:
    src = _mut(tf0, tmp_path, lambda d: gpu_kernels(d)[0].update(ts=-5))
    _, q = _convert_ok(src, tmp_path)
    assert q["outlier_timestamps"]["details"]["count"] == 1
    assert q["negative_timestamps"]["details"]["count"] == 1
    p = run("analyze", tmp_path / "t.parquet", "--json")
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    r0 = res["ranks"][0]
    assert r0["window_ns"] < 10 * 10**9  # the real ~1.2 s, not 53 years
    assert r0["gpu_busy_ns"] > 0.1 * r0["window_ns"]  # not "GPU idle 100% of its window"
    assert "outlier_timestamps" in {x["code"] for x in res["quality"]}


@pytest.mark.parametrize("bad", ["missing", None, True, "abc"], ids=["missing", "null", "boolean", "text"])
def test_bad_durations_on_some_kernels_are_counted(tmp_path: Path, tf0: dict, bad: object) -> None:
    def f(d: dict) -> None:
        for k in gpu_kernels(d)[:7]:
            if bad == "missing":
                k.pop("dur")
            else:
                k["dur"] = bad

    src = _mut(tf0, tmp_path, f)
    _, q = _convert_ok(src, tmp_path)
    assert q["bad_durations"]["details"]["count"] == 7


@pytest.mark.parametrize("bad", ["missing", None, True], ids=["missing", "null", "boolean"])
def test_no_gpu_op_with_a_duration_is_an_error(tmp_path: Path, tf0: dict, bad: object) -> None:
    def f(d: dict) -> None:
        for e in d["traceEvents"]:
            if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
                if bad == "missing":
                    e.pop("dur", None)
                else:
                    e["dur"] = bad

    src = _mut(tf0, tmp_path, f)
    p = run("convert", src, "-o", tmp_path / "t.parquet")
    assert_clean_error(p, "rank0.json", "dur", "re-export", code=2)
    assert not (tmp_path / "t.parquet").exists()


def test_unknown_phase_is_counted(tmp_path: Path, tf0: dict) -> None:
    def f(d: dict) -> None:
        for k in gpu_kernels(d)[:3]:
            k["ph"] = "Q"

    src = _mut(tf0, tmp_path, f)
    _, q = _convert_ok(src, tmp_path)
    assert q["unknown_phases"]["details"]["phases"] == {"Q": 3}


def test_every_event_duplicated_is_flagged_and_counted_once(tmp_path: Path, tf0: dict) -> None:
    src0 = _mut(tf0, tmp_path / "a", lambda d: None)
    _, q0 = _convert_ok(src0, tmp_path / "a")
    from tracekit.schema import read_trace

    once = read_trace(tmp_path / "a" / "t.parquet")[0]
    src = _mut(tf0, tmp_path, lambda d: d.update(traceEvents=d["traceEvents"] + copy.deepcopy(d["traceEvents"])))
    _, q = _convert_ok(src, tmp_path)
    twice = read_trace(tmp_path / "t.parquet")[0]
    assert "duplicate_events" not in q0
    assert q["duplicate_events"]["details"]["count"] == once.height
    assert twice.height == once.height
    assert twice["dur_ns"].sum() == once["dur_ns"].sum()


# ---- file kinds -------------------------------------------------------------------------------


def test_symlink_loop_in_an_input_directory(tmp_path: Path) -> None:
    d = tmp_path / "in"
    d.mkdir()
    os.symlink(d / "b.json", d / "a.json")
    os.symlink(d / "a.json", d / "b.json")
    for target in (d, d / "a.json"):
        p = run("convert", target, "-o", tmp_path / "t.parquet")
        assert_clean_error(p, "a.json", "symbolic link", code=2)


def test_fifo_named_json_is_refused_without_blocking(tmp_path: Path) -> None:
    f = tmp_path / "rank0.json"
    os.mkfifo(f)
    p = run("convert", f, "-o", tmp_path / "t.parquet")
    assert_clean_error(p, "rank0.json", "FIFO", code=2)
    p = run("convert", tmp_path, "-o", tmp_path / "t.parquet")
    assert_clean_error(p, "rank0.json", "FIFO", code=2)


def test_dev_zero_named_json_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "rank0.json"
    os.symlink("/dev/zero", f)
    p = run("convert", f, "-o", tmp_path / "t.parquet")
    assert_clean_error(p, "rank0.json", "device", code=2)


def test_fifo_given_to_analyze_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "t.parquet"
    os.mkfifo(f)
    for args in (("analyze", f), ("timeline", f, "-o", tmp_path / "x.html"), ("replay", f), ("export", f, "--perfetto", tmp_path / "x.json")):
        assert_clean_error(run(*args), "t.parquet", "FIFO", code=2)


# ---- messages that say where ------------------------------------------------------------------


def _text(tf0: dict) -> bytes:
    import gzip

    return gzip.decompress(TF0.read_bytes())


def test_nan_is_located_by_line_and_column(tmp_path: Path, tf0: dict) -> None:
    raw = _text(tf0)
    i = raw.find(b'"dur": ', len(raw) // 2)
    j = raw.find(b",", i)
    f = tmp_path / "rank0.json"
    f.write_bytes(raw[:i] + b'"dur": NaN' + raw[j:])
    msg = assert_clean_error(run("convert", f, "-o", tmp_path / "t.parquet"), "rank0.json", "NaN", "line", "column",
                             f"byte {i + 7}", code=2)
    assert '"dur": NaN' in msg


def test_bom_is_accepted(tmp_path: Path, tf0: dict) -> None:
    f = tmp_path / "rank0.json"
    f.write_bytes(b"\xef\xbb\xbf" + _text(tf0))
    out, q = _convert_ok(f, tmp_path)
    assert "4810 rows" in out


def test_one_bad_byte_in_a_kernel_name_is_located(tmp_path: Path, tf0: dict) -> None:
    raw = _text(tf0)
    i = raw.find(b'"name": "', raw.find(b'"cat": "kernel"', len(raw) // 2)) + 10
    f = tmp_path / "rank0.json"
    f.write_bytes(raw[:i] + b"\xff" + raw[i + 1:])
    assert_clean_error(run("convert", f, "-o", tmp_path / "t.parquet"), "rank0.json", "UTF-8", "0xff", f"byte {i}", code=2)


@pytest.fixture(scope="module")
def good_parquet(tmp_path_factory, tf0: dict) -> Path:
    d = tmp_path_factory.mktemp("good2")
    src = dump(tf0, d / "rank0.json.gz")
    out = d / "trace.parquet"
    assert run("convert", src, "-o", out, "-q").returncode == 0
    return out


@pytest.mark.parametrize("col, to", [("dur_ns", "str"), ("ts_ns", "float"), ("kind", "int")])
def test_parquet_with_footer_but_wrong_column_type(tmp_path: Path, good_parquet: Path, col: str, to: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    t = pq.read_table(good_parquet)
    md = pq.read_metadata(good_parquet).metadata
    vals = t.column(col).to_pylist()
    arr = {"str": lambda: pa.array([str(v) for v in vals]), "float": lambda: pa.array([float(v) for v in vals]),
           "int": lambda: pa.array(list(range(len(vals))))}[to]()
    t = t.set_column(t.schema.get_field_index(col), col, arr)
    t = t.replace_schema_metadata({b"tracekit": md[b"tracekit"]})
    bad = tmp_path / "bad.parquet"
    pq.write_table(t, bad)
    for args in (("analyze", bad), ("timeline", bad, "-o", tmp_path / "x.html"), ("replay", bad),
                 ("export", bad, "--perfetto", tmp_path / "x.json"), ("diff", good_parquet, bad)):
        assert_clean_error(run(*args), "bad.parquet", f"column '{col}' has type", "re-convert", code=2)


@pytest.mark.parametrize(
    "name, text, words",
    [
        ("bad.yaml", "rules:\n  - pattern: [unclosed\n    : : :\n", ["invalid YAML", "line 3"]),
        ("list.yaml", "- 1\n- 2\n", ["rules[0] needs id, category and regex"]),
        ("scalar.yaml", "42\n", ["'rules' list"]),
        ("types.yaml", "rules:\n  - {id: 1, category: gemm, regex: 5}\n", ["must be text"]),
        ("ctx.json", '{"rules": [], "context": [5]}', ["context[0]"]),
        ("bin.yaml", b"\xff\xfe\x00bad", ["not UTF-8"]),
    ],
)
def test_malformed_rules_files(tmp_path: Path, tf0: dict, name: str, text, words: list[str]) -> None:
    if name.endswith(".yaml"):
        pytest.importorskip("yaml")
    r = tmp_path / name
    r.write_bytes(text if isinstance(text, bytes) else text.encode())
    src = dump(tf0, tmp_path / "rank0.json.gz")
    assert_clean_error(run("convert", src, "-o", tmp_path / "t.parquet", "--rules", r), name, *words, code=2)
