"""A profiler's own output where a trace.parquet is expected (``tracekit/commands/_source.py``): analyze, diff,
timeline, export and replay convert it for the run, give the answer they give on the converted trace.parquet, leave
nothing behind (also on an error or Ctrl-C) and never touch the input.

Inputs are real traces from /work/shared/traces, copied into ``tmp_path``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from corrupt._build import TF0, TF1, assert_clean_error, cli_inproc as run, dump, load, need, with_rank

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture()
def tmpdir_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """TMPDIR of this test alone: what the commands leave there is seen."""
    d = tmp_path / "tmp"
    d.mkdir()
    monkeypatch.setenv("TMPDIR", str(d))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    return d


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Rank 0 of the real 2-rank set as a .json.gz, the two ranks as a directory, and their conversions."""
    need(TF0, TF1)
    d = tmp_path_factory.mktemp("src")
    one = dump(load(TF0), d / "rank0.json.gz")
    two = d / "ranks"
    two.mkdir()
    dump(with_rank(load(TF0), 0, 2), two / "rank0.json.gz")
    dump(with_rank(load(TF1), 1, 2), two / "rank1.json.gz")
    out = {"one": one, "two": two}
    for k in ("one", "two"):
        pq = d / f"{k}.parquet"
        p = run("convert", out[k], "-o", pq, "-q")
        assert p.returncode == 0, p.stderr
        out[k + "_pq"] = pq
    return out


def _analyze(path: Path) -> dict:
    p = run("analyze", path, "--json")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@pytest.mark.parametrize("which", ["one", "two"])
def test_analyze_of_the_json_is_the_analyze_of_its_conversion(which: str, sources: dict[str, Path], tmpdir_env: Path) -> None:
    src = sources[which]
    before = sorted((f.name, f.read_bytes()) for f in (src.iterdir() if src.is_dir() else [src]))
    p = run("analyze", src, "--json")
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    want = _analyze(sources[which + "_pq"])
    assert got.pop("trace") == str(src)
    want.pop("trace")
    assert got == want
    # one line on stderr says what happened and how to keep the conversion
    line = [x for x in p.stderr.splitlines() if "converted for this run" in x]
    assert len(line) == 1 and str(src) in line[0] and "tracekit convert" in line[0]
    assert f"{len(want['ranks'])} rank" in line[0]
    assert not list(tmpdir_env.iterdir()), "the temporary trace.parquet is removed"
    assert sorted((f.name, f.read_bytes()) for f in (src.iterdir() if src.is_dir() else [src])) == before
    assert not [f for f in src.parent.iterdir() if f.name.startswith(".tracekit")], "nothing written beside the input"


def test_report_of_the_json(sources: dict[str, Path], tmpdir_env: Path) -> None:
    p = run("analyze", sources["one"])
    assert p.returncode == 0, p.stderr
    assert p.stdout == run("analyze", sources["one_pq"]).stdout
    assert not list(tmpdir_env.iterdir())


def test_diff_timeline_export_replay_read_the_json(sources: dict[str, Path], tmp_path: Path, tmpdir_env: Path) -> None:
    one, pq = sources["one"], sources["one_pq"]
    d1, d2 = run("diff", one, pq, "--json", "--labels", "a,b"), run("diff", pq, pq, "--json", "--labels", "a,b")
    assert d1.returncode == 0 and d2.returncode == 0, d1.stderr + d2.stderr
    assert json.loads(d1.stdout) == json.loads(d2.stdout)
    for cmd in (("timeline", one, "-o", tmp_path / "t.html"), ("export", one, "--perfetto", tmp_path / "p.json.gz")):
        p = run(*cmd)
        assert p.returncode == 0, p.stderr
        assert "converted for this run" in p.stderr
    assert (tmp_path / "t.html").stat().st_size > 0 and (tmp_path / "p.json.gz").stat().st_size > 0
    r1, r2 = run("replay", one, "-w", "moe_gemm=0.5", "--json"), run("replay", pq, "-w", "moe_gemm=0.5", "--json")
    assert r1.returncode == r2.returncode
    assert r1.stdout == r2.stdout
    assert not list(tmpdir_env.iterdir())


def test_bad_json_is_the_converters_one_line_error(tmp_path: Path, tmpdir_env: Path) -> None:
    f = dump({"traceEvents": []}, tmp_path / "rank0.json")
    for cmd in (("analyze", f), ("analyze", f, "--json"), ("timeline", f, "-o", tmp_path / "t.html"), ("diff", f, f)):
        p = run(*cmd)
        assert_clean_error(p, "rank0.json", "no events", code=2)
        assert p.stdout == ""
    assert not list(tmpdir_env.iterdir())
    assert not (tmp_path / "t.html").exists()


def test_interrupted_conversion_leaves_nothing(sources: dict[str, Path], tmpdir_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C while the input is converted: exit 130, the temporary directory removed."""
    import tracekit.ingest.convert as conv

    real = conv.convert

    def interrupted(inputs, out, **kw):  # the conversion is written, then Ctrl-C lands
        real(inputs, out, **kw)
        assert Path(out).is_file()
        raise KeyboardInterrupt

    monkeypatch.setattr(conv, "convert", interrupted)
    p = run("analyze", sources["one"])
    assert p.returncode == 130 and "interrupted" in p.stderr
    assert not list(tmpdir_env.iterdir())


def test_cluster_still_needs_a_parquet_its_workers_can_read(sources: dict[str, Path]) -> None:
    """``--cluster``: the workers read the path, so a JSON is refused with the convert command to run."""
    pytest.importorskip("distributed")
    p = run("analyze", sources["one"], "--cluster", "local:1")
    assert_clean_error(p, "rank0.json.gz", "not a trace.parquet", "tracekit convert", code=2)


def test_a_dataset_or_parquet_is_read_in_place(sources: dict[str, Path], tmpdir_env: Path) -> None:
    from tracekit._inputs import is_profiler_input as needs_convert
    from tracekit.commands._source import trace_source

    pq = sources["one_pq"]
    assert not needs_convert(pq) and needs_convert(sources["one"]) and needs_convert(sources["two"])
    with trace_source(pq) as got:
        assert got == pq
    assert not list(tmpdir_env.iterdir())
    assert os.path.exists(pq)
    shutil.copy(pq, tmpdir_env / "x.parquet")
    assert not needs_convert(tmpdir_env / "x.parquet")


def test_keep_going_leaves_out_a_rank_that_cannot_be_converted(tmp_path: Path, tmpdir_env: Path) -> None:
    """``analyze DIR --keep-going`` on rank files, one truncated: the other rank is analyzed, the broken one flagged
    ``rank_failed`` and named on stderr, exit 2 (as ``convert --keep-going``); without the flag, the one-line error."""
    need(TF0, TF1)
    d = tmp_path / "ranks"
    d.mkdir()
    dump(with_rank(load(TF0), 0, 2), d / "rank0.json.gz")
    raw = dump(with_rank(load(TF1), 1, 2), tmp_path / "rank1.json.gz").read_bytes()
    (d / "rank1.json.gz").write_bytes(raw[: len(raw) // 3])
    p = run("analyze", d, "--keep-going", "--json")
    assert p.returncode == 2
    got = json.loads(p.stdout)
    assert [r["rank"] for r in got["ranks"]] == [0]
    assert [q["rank"] for q in got["quality"] if q["code"] == "rank_failed"] == [1]
    assert "1 rank(s) failed (rank 1)" in p.stderr
    assert_clean_error(run("analyze", d), "rank 1", "rank1.json.gz", "truncated or corrupt gzip", code=2)
    assert not list(tmpdir_env.iterdir())


def test_no_temporary_directory_is_a_one_line_error(sources: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    import errno
    import tempfile

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tempfile, "mkdtemp", full)
    p = run("analyze", sources["one"])
    assert_clean_error(p, "cannot create a temporary directory", "rank0.json.gz", "No space left", "TMPDIR", code=3)
