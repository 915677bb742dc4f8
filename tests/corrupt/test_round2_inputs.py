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
