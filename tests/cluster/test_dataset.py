"""The directory dataset (``convert --layout dataset``): the same rows and metadata as one ``trace.parquet``,
read by every command, written atomically, a failed rank never half there; ``--keep-going``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.dataset as pads
import pytest

from tracekit._errors import InputError, OutputError, RankError
from tracekit.api import analyze, analyze_kept
from tracekit.ingest.convert import convert
from tracekit.schema import DATASET_META, dataset_parts, read_metadata, read_trace

from .conftest import corrupt_copy

ROOT = Path(__file__).resolve().parents[2]
RAW = ROOT / "tests" / "fixtures" / "gpu" / "raw_grouped"
TRACES = Path(os.environ.get("TRACEKIT_TRACES", "/work/shared/traces"))
TP2 = [TRACES / "nsys" / "generated-h200" / f"tp2_rank{r}.sqlite" for r in (0, 1)]
sys.path.insert(0, str(ROOT / "tests" / "golden"))
from analyze_golden import compare  # noqa: E402


def _same(a: Path, b: Path) -> None:
    """Dataset ``a`` holds exactly the rows (in order) and metadata of file ``b``; analyze agrees field for field."""
    da, ma = read_trace(a)
    db, mb = read_trace(b)
    assert da.equals(db)
    assert ma == mb
    ja, jb = analyze(a), analyze(b)
    ja.pop("trace"), jb.pop("trace")
    assert compare(jb, ja) == []


def test_windows_rewrite_path(tmp_path: Path) -> None:
    """2 ranks x 2 profiler windows (a real 2 x H200 capture): each rank's partition merges its windows."""
    files = sorted(RAW.glob("*.json.gz"))
    convert(files, tmp_path / "one.parquet")
    convert(files, tmp_path / "ds", layout="dataset")
    assert [(r, p.relative_to(tmp_path / "ds").as_posix()) for r, p in dataset_parts(tmp_path / "ds")] == [
        (0, "rank=0/part-0.parquet"), (1, "rank=1/part-0.parquet")]
    assert sorted(os.listdir(tmp_path / "ds")) == [DATASET_META, "rank=0", "rank=1"]
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]  # no part directory left
    _same(tmp_path / "ds", tmp_path / "one.parquet")


@pytest.mark.skipif(not TP2[0].exists(), reason="shared traces not available")
def test_nsys_tp2_as_is_path(tmp_path: Path) -> None:
    """The shared 2 x H200 nsys capture: each staged rank is renamed into its partition."""
    convert(TP2, tmp_path / "one.parquet")
    convert(TP2, tmp_path / "ds", layout="dataset", jobs=2)
    _same(tmp_path / "ds", tmp_path / "one.parquet")


def test_other_tools_read_it(tmp_path: Path, kineto8: list[Path]) -> None:
    """polars (hive glob) and pyarrow read the directory as it is, rank from the directory names."""
    convert(kineto8, tmp_path / "ds", layout="dataset")
    df, _ = read_trace(tmp_path / "ds")
    pol = pl.scan_parquet(str(tmp_path / "ds" / "rank=*" / "*.parquet"), hive_partitioning=True).group_by("rank").len().collect()
    arr = pads.dataset(tmp_path / "ds", partitioning="hive", format="parquet").to_table(columns=["rank"])
    assert sorted(pol.rows()) == sorted(df.group_by("rank").len().rows())
    assert arr.num_rows == df.height
    assert sorted(set(df["rank"].to_list())) == list(range(8))


def test_read_errors(tmp_path: Path, kineto8: list[Path]) -> None:
    ds = tmp_path / "ds"
    convert(kineto8[:2], ds, layout="dataset")
    with pytest.raises(InputError, match="is one partition of a tracekit dataset.*pass the dataset directory"):
        read_metadata(ds / "rank=1" / "part-0.parquet")
    (tmp_path / "plain").mkdir()
    with pytest.raises(InputError, match="is a directory without _common_metadata"):
        read_trace(tmp_path / "plain")
    (ds / "rank=1" / "part-0.parquet").rename(tmp_path / "moved.parquet")
    with pytest.raises(InputError, match=r"^rank 1: .*: the rank has no partition .*re-convert"):
        read_trace(ds)


def test_output_rules(tmp_path: Path, kineto8: list[Path]) -> None:
    ds = tmp_path / "ds"
    convert(kineto8[:2], ds, layout="dataset")
    with pytest.raises(OutputError, match="exists; pass --force"):
        convert(kineto8[:2], ds, layout="dataset")
    convert(kineto8[2:4], ds, layout="dataset", force=True)  # replaced whole: no partition of the old one stays
    assert {r for r, _ in dataset_parts(ds)} == {2, 3}
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "keep.txt").write_text("x")
    with pytest.raises(OutputError, match="not a tracekit dataset; refusing to replace it"):
        convert(kineto8[:2], tmp_path / "other", layout="dataset", force=True)
    assert (tmp_path / "other" / "keep.txt").exists()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tracekit.cli", *args], capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("layout", ["dataset", "file"])
def test_corrupt_rank_named_and_keep_going(tmp_path: Path, kineto8: list[Path], layout: str) -> None:
    """A truncated file among 8: the error names rank 5 and nothing is written; --keep-going writes the other 7,
    flags rank 5 and still exits non-zero; analyze reads the result and carries the flag."""
    files = corrupt_copy(kineto8, 5, tmp_path / "in")
    out = tmp_path / ("ds" if layout == "dataset" else "t.parquet")
    r = _cli("convert", *map(str, files), "-o", str(out), "--layout", layout, "-q")
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(err) == 1 and err[0].startswith("tracekit: error: rank 5: "), r.stderr
    assert not out.exists() and not [n for n in os.listdir(tmp_path) if n.startswith(".")]
    r = _cli("convert", *map(str, files), "-o", str(out), "--layout", layout, "-q", "--keep-going")
    assert r.returncode == 2 and "1 source(s) failed (rank 5)" in r.stderr and "Traceback" not in r.stderr
    meta = read_metadata(out)
    assert [f["rank"] for f in meta["failed_ranks"]] == [5]
    assert [m["rank"] for m in meta["ranks"]] == [0, 1, 2, 3, 4, 6, 7]
    a = _cli("analyze", str(out), "--json")
    assert a.returncode == 0, a.stderr
    doc = json.loads(a.stdout)
    assert [q["rank"] for q in doc["quality"] if q["code"] == "rank_failed"] == [5]
    assert sorted(x["rank"] for x in doc["ranks"]) == [0, 1, 2, 3, 4, 6, 7]


@pytest.fixture(scope="module")
def ds8(tmp_path_factory: pytest.TempPathFactory, kineto8: list[Path]) -> Path:
    ds = tmp_path_factory.mktemp("ds8") / "ds"
    convert(kineto8, ds, layout="dataset")
    return ds


def damaged_copy(ds: Path, dest: Path, rank: int, how: str) -> Path:
    """A copy of dataset ``ds`` whose rank ``rank`` partition is damaged: ``footer`` (cut, its footer unreadable) or
    ``pages`` (bytes garbled in the middle: the footer reads, the column data does not decode)."""
    import random
    import shutil

    shutil.copytree(ds, dest)
    part = dest / f"rank={rank}" / "part-0.parquet"
    data = bytearray(part.read_bytes())
    if how == "footer":
        data = data[: len(data) // 3] + b"\0" * 64 + data[-2000:]
    else:
        rnd = random.Random(rank)
        for i in range(len(data) // 4, len(data) // 2):
            data[i] = rnd.randrange(256)
    part.write_bytes(bytes(data))
    return dest


def _no_trace(doc: dict[str, Any]) -> dict[str, Any]:
    doc.pop("trace", None)
    return doc


@pytest.mark.parametrize(("rank", "how"), [(5, "footer"), (0, "footer"), (3, "pages")])
def test_analyze_damaged_partition_named_and_keep_going(tmp_path: Path, ds8: Path, rank: int, how: str) -> None:
    """A damaged partition among 8 (rank 0's too: the scan's schema comes from the metadata, not from the first
    partition): analyze names the rank and its file; --keep-going (analyze_kept) answers exactly as the undamaged
    dataset does for the other ranks, plus one rank_failed flag."""
    bad = damaged_copy(ds8, tmp_path / "bad", rank, how)
    with pytest.raises(RankError, match=rf"^rank {rank}: .*rank={rank}/part-0\.parquet: unreadable trace data .*re-convert"):
        analyze(bad)
    got = _no_trace(analyze_kept(bad).to_json())
    flags = [q for q in got["quality"] if q["code"] == "rank_failed"]
    assert [(q["rank"], q["severity"]) for q in flags] == [(rank, "error")]
    got["quality"] = [q for q in got["quality"] if q["code"] != "rank_failed"]
    others = [r for r in range(8) if r != rank]
    assert compare(_no_trace(analyze(ds8, ranks=others)), got) == []


def test_analyze_keep_going_cli(tmp_path: Path, ds8: Path) -> None:
    """The CLI: without --keep-going one line naming rank 5, exit 2, nothing on stdout; with it the JSON of the other
    ranks (rank 5 flagged) on stdout and one line on stderr saying which rank is missing, exit 2 (as convert)."""
    bad = damaged_copy(ds8, tmp_path / "bad", 5, "footer")
    r = _cli("analyze", str(bad), "--json")
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2 and r.stdout == "" and len(err) == 1 and err[0].startswith("tracekit: error: rank 5: "), r.stderr
    r = _cli("analyze", str(bad), "--json", "--keep-going")
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "tracekit: error: 1 rank(s) failed (rank 5); the result covers the other ranks, flagged rank_failed"], r.stderr
    doc = json.loads(r.stdout)
    assert [q["rank"] for q in doc["quality"] if q["code"] == "rank_failed"] == [5]
    assert sorted(x["rank"] for x in doc["ranks"]) == [0, 1, 2, 3, 4, 6, 7]
    ok = _cli("analyze", str(ds8), "--keep-going", "--json")  # nothing failed: exit 0, no flag
    assert ok.returncode == 0 and ok.stderr == "" and "rank_failed" not in ok.stdout, ok.stderr
