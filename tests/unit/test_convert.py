"""convert end to end: every real Kineto trace converts or fails with one clear line; atomic output; --rules; CLI."""

from __future__ import annotations

import os

import json
import sys
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "golden"))
from kineto_doc import doc, kernel, runtime, write_doc  # noqa: E402

from tracekit._errors import InputError, OutputError  # noqa: E402
from tracekit.cli import app  # noqa: E402
from tracekit.ingest.convert import convert  # noqa: E402
from tracekit.ingest.kineto import read_kineto  # noqa: E402
from tracekit.schema import ARROW_SCHEMA, read_metadata, read_trace  # noqa: E402

TRACES = Path(os.environ.get("TRACEKIT_TRACES", "/work/shared/traces") + "")
HTA, LENS = TRACES / "hta", TRACES / "tracelens"
ALL = sorted(p for d in (HTA, LENS) if d.exists() for p in d.rglob("*") if p.is_file() and (p.name.endswith((".json", ".json.gz", ".raw.gz"))))
#: inputs that are not Kineto traces, and the reason the one-line error must give
NOT_KINETO = {
    "execution_trace/benchmark_simple_add_et.json.gz": "traceEvents",  # PyTorch execution trace (Chakra ET)
    "memory_analysis/memory_timeline.raw.gz": "unsupported input",  # export_memory_timeline_raw rows
    "inference/sglang_decode/capture_traces/execution_details.json": "traceEvents",  # a JSON list of capture settings
}
needs_traces = pytest.mark.skipif(not HTA.exists(), reason="shared traces not available")


def _rel(p: Path) -> str:
    for base in (HTA, LENS):
        if p.is_relative_to(base):
            return str(p.relative_to(base))
    return p.name


@needs_traces
@pytest.mark.parametrize("path", ALL, ids=_rel)
def test_every_real_trace_converts_or_fails_clearly(path: Path, tmp_path: Path) -> None:
    out = tmp_path / "trace.parquet"
    why = NOT_KINETO.get(_rel(path))
    if why is not None:
        with pytest.raises(InputError) as ei:
            convert([path], out)
        msg = str(ei.value)
        assert why in msg and str(path) in msg and "\n" not in msg
        assert not out.exists()
        return
    res = convert([path], out)
    df, meta = read_trace(out)
    assert df.height == res.rows > 0 and len(res.ranks) == 1
    assert meta["source_files"] == [str(path)]
    assert df["ts_ns"].is_sorted() and (df["dur_ns"] >= 0).all()
    gpu = df.filter(pl.col("kind").cast(pl.String).is_in(["kernel", "memcpy", "memset"]))
    assert gpu["category"].null_count() == 0  # every GPU op gets exactly one category
    if gpu.height == 0:
        assert "no_gpu_events" in {q["code"] for q in meta["quality"]}


@needs_traces
@pytest.mark.parametrize("path", [p for p in ALL if _rel(p) not in NOT_KINETO], ids=_rel)
def test_exact_and_fast_decoders_agree(path: Path) -> None:
    a, ma = read_kineto(path, exact=False)
    b, mb = read_kineto(path, exact=True)
    assert_frame_equal(a, b, categorical_as_str=True)
    assert ma["rank"] == mb["rank"]


@needs_traces
def test_trace_filter_two_ranks_one_file(tmp_path: Path) -> None:
    out = tmp_path / "tf.parquet"
    res = convert([HTA / "trace_filter"], out)
    assert res.ranks == [0, 1]
    df, meta = read_trace(out)
    assert sorted(df["rank"].unique().to_list()) == [0, 1]
    assert [r["rank"] for r in meta["ranks"]] == [0, 1] and meta["world_size"] == 128
    assert "missing_ranks" in {q["code"] for q in meta["quality"]}
    per = df.filter(pl.col("kind") == "kernel").group_by("rank").len().sort("rank")["len"].to_list()
    assert per == [1154, 1104]  # kernel counts from the traces' inventory
    # rows sorted by (rank, ts) and stored rank by rank
    assert df.select("rank", "ts_ns").equals(df.select("rank", "ts_ns").sort("rank", "ts_ns"))


@needs_traces
def test_nccl_metadata_attached_on_real_trace(tmp_path: Path) -> None:
    out = tmp_path / "n.parquet"
    convert([HTA / "nccl_parser_config" / "nccl_data.json.gz"], out)
    df, _ = read_trace(out)
    comm = df.filter((pl.col("kind") == "kernel") & (pl.col("category") == "communication"))
    by = dict(comm.group_by(pl.col("coll_name").cast(pl.String)).len().iter_rows())
    assert by == {"allreduce": 15, "broadcast": 6}  # inventory: 15 AllReduce, 6 Broadcast kernels
    assert comm["pg_name"].null_count() == 0 and comm["coll_in_nelems"].null_count() == 0
    # numbered within the process group (all collective kinds), in time order
    assert comm.sort("ts_ns")["coll_seq"].to_list() == list(range(21))


def _two_files(d: Path) -> None:
    d.mkdir()
    for r in (0, 1):
        write_doc(d / f"rank{r}.json", doc([runtime("cudaLaunchKernel", 1, 1, corr=1), kernel("weird", 2, 3, corr=1)],
                                           rank=r, base_ns=10**18))


def test_refuses_overwrite_and_keeps_old_file(tmp_path: Path) -> None:
    _two_files(tmp_path / "in")
    out = tmp_path / "t.parquet"
    convert([tmp_path / "in"], out)
    before = out.read_bytes()
    with pytest.raises(OutputError, match="--force"):
        convert([tmp_path / "in"], out)
    assert out.read_bytes() == before
    convert([tmp_path / "in"], out, force=True)
    assert read_trace(out)[0].height == 4


def test_no_partial_output_on_bad_input(tmp_path: Path) -> None:
    _two_files(tmp_path / "in")
    (tmp_path / "in" / "rank2.json").write_text('{"traceEvents": [{"ph": "X", ')  # truncated
    out = tmp_path / "t.parquet"
    with pytest.raises(InputError, match="rank2.json"):
        convert([tmp_path / "in"], out)
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]  # no temp files or part directories left


def test_output_never_overwrites_an_input(tmp_path: Path) -> None:
    p = write_doc(tmp_path / "rank0.json", doc([kernel("k", 1, 1, corr=1)], rank=0))
    with pytest.raises(InputError, match="overwrite an input"):
        convert([p], p, force=True)


def test_rules_option(tmp_path: Path) -> None:
    _two_files(tmp_path / "in")
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps({"rules": [{"id": "mine.weird", "category": "attention", "regex": "^weird$"}]}))
    out = tmp_path / "t.parquet"
    res = CliRunner().invoke(app, ["convert", str(tmp_path / "in"), "-o", str(out), "--rules", str(rules), "-q"])
    assert res.exit_code == 0, res.output
    df, meta = read_trace(out)
    k = df.filter(pl.col("kind") == "kernel")
    assert k["category"].cast(pl.String).unique().to_list() == ["attention"]
    assert k["family"].cast(pl.String).unique().to_list() == ["mine.weird"]
    assert meta["rules"] == str(rules)


def test_cli_errors_are_one_line_with_exit_codes(tmp_path: Path) -> None:
    _two_files(tmp_path / "in")
    out = tmp_path / "t.parquet"
    r = CliRunner().invoke(app, ["convert", str(tmp_path / "in"), "-o", str(out), "-q"])
    assert r.exit_code == 0 and out.exists()
    r = CliRunner().invoke(app, ["convert", str(tmp_path / "in"), "-o", str(out), "-q"])
    assert r.exit_code == OutputError.exit_code and "--force" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(app, ["convert", str(tmp_path / "missing"), "-o", str(tmp_path / "x.parquet")])
    assert r.exit_code == InputError.exit_code and "no such file" in r.output and len(r.output.strip().splitlines()) == 1


def test_footer_metadata(tmp_path: Path) -> None:
    _two_files(tmp_path / "in")
    out = tmp_path / "t.parquet"
    convert([tmp_path / "in"], out, metadata={"capture": {"target": "unit"}})
    meta = read_metadata(out)
    assert meta["schema_version"] == 1 and meta["world_size"] == 2
    assert meta["capture"] == {"target": "unit"}
    assert meta["window_ns"] == [10**18 + 1000, 10**18 + 5000]
    assert [Path(f).name for f in meta["source_files"]] == ["rank0.json", "rank1.json"]
    import pyarrow.parquet as pq

    assert pq.read_schema(out).remove_metadata() == ARROW_SCHEMA


@needs_traces
@pytest.mark.parametrize("way", ["second-pass", "no-overlap", "jobs-2-parquet-parts", "jobs-2"])
def test_write_paths_give_the_same_file(tmp_path: Path, monkeypatch, way: str) -> None:
    """The staged file renamed into place (the default), a second pass over it (clock offsets, windows,
    rank order), ranks written without overlapping the next read, and worker processes writing Arrow
    IPC or lz4 Parquet parts: the output rows are identical, sorted by (rank, ts_ns), clock offsets and all."""
    import tracekit.ingest.convert as conv

    src = HTA / "trace_filter"
    ref = convert([src], tmp_path / "ref.parquet", jobs=1)
    jobs = 1
    if way == "second-pass":
        monkeypatch.setattr(conv, "_staged_as_is", lambda *a: False)
    elif way == "no-overlap":
        monkeypatch.setattr(conv, "OVERLAP_MAX_BYTES", 0)
    else:
        monkeypatch.setattr(conv, "_PARALLEL_MIN_BYTES", 0)
        jobs = 2
        if way == "jobs-2-parquet-parts":
            monkeypatch.setattr(conv, "IPC_PART_MAX_BYTES", 0)
    other = convert([src], tmp_path / "other.parquet", jobs=jobs)
    a, ma = read_trace(ref.out)
    b, mb = read_trace(other.out)
    assert a.height > 1000 and a.get_column("rank").unique().sort().to_list() == [0, 1]
    assert_frame_equal(a, b)
    assert ma["clock_offsets_ns"] == mb["clock_offsets_ns"] and ma["window_ns"] == mb["window_ns"]
    assert a.equals(a.sort(["rank", "ts_ns"], maintain_order=True))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.parquet", "ref.parquet"]  # no parts left behind


def _window_doc(t0_us: int, n: int) -> dict:
    from kineto_doc import annotation

    evs = [annotation("ProfilerStep#0", t0_us, 100 * n)]
    for i in range(n):
        evs += [runtime("cudaLaunchKernel", t0_us + i * 100 + 1, 5, corr=i + 1),
                kernel("gemm_kernel", t0_us + i * 100 + 10, 50, corr=i + 1)]
    return doc(evs, rank=0, world_size=1)


@pytest.mark.parametrize("gap_us", [10_000, -500], ids=["apart", "overlapping"])
def test_windows_of_one_rank_merge_in_time_order(tmp_path: Path, gap_us: int) -> None:
    """Two profiler windows of one rank: streamed one after the other when apart in time, merged and
    sorted in memory when they overlap; either way rows are in time order and step ids stay unique."""
    a = write_doc(tmp_path / "rank0.win0.trace.json", _window_doc(1000, 20))
    b = write_doc(tmp_path / "rank0.win1.trace.json", _window_doc(1000 + 2000 + gap_us, 20))
    res = convert([a, b], tmp_path / "o.parquet")
    df, _meta = read_trace(res.out)
    assert df.height == 82
    assert df.get_column("ts_ns").is_sorted()
    steps = df.filter(pl.col("kind") == "step").sort("ts_ns")
    assert steps.get_column("step_id").to_list() == [0, 1]
    k = df.filter(pl.col("kind") == "kernel")
    assert k.group_by("step_id").len().sort("step_id").get_column("len").to_list() == [20, 20]


def test_ranks_out_of_file_order_are_rewritten_in_rank_order(tmp_path: Path, monkeypatch) -> None:
    """File names say one rank, distributedInfo another: ranks reach the staged file as 1, 0, so the
    output is written by a second pass; rows still come sorted by (rank, ts_ns), each rank once."""
    import tracekit.ingest.convert as conv

    as_is: list[bool] = []
    real = conv._staged_as_is
    monkeypatch.setattr(conv, "_staged_as_is", lambda *a: as_is.append(real(*a)) or as_is[-1])
    a = write_doc(tmp_path / "rank0.json", doc([runtime("cudaLaunchKernel", 1, 1, corr=1), kernel("ka", 5, 2, corr=1)], rank=1))
    b = write_doc(tmp_path / "rank1.json", doc([runtime("cudaLaunchKernel", 2, 1, corr=1), kernel("kb", 6, 2, corr=1)], rank=0))
    res = convert([a, b], tmp_path / "o.parquet")
    df, meta = read_trace(res.out)
    assert df.get_column("rank").to_list() == [0, 0, 1, 1]
    assert df.filter(pl.col("kind") == "kernel").get_column("name").cast(pl.String).to_list() == ["kb", "ka"]
    assert [r["rank"] for r in meta["ranks"]] == [0, 1]
    assert as_is == [False]  # the second pass ran
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.parquet", "rank0.json", "rank1.json"]


def test_jobs_workers_share_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    # --jobs N: each spawned worker gets cores // N parse and polars threads, set before it imports polars
    import multiprocessing as mp
    import os
    from concurrent.futures import ProcessPoolExecutor

    from tracekit.ingest._workers import init_worker, worker_threads

    assert worker_threads(10_000) == 1
    assert worker_threads(1) == len(os.sched_getaffinity(0))
    monkeypatch.delenv("TRACEKIT_PARSE_THREADS", raising=False)
    monkeypatch.delenv("POLARS_MAX_THREADS", raising=False)
    with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn"), initializer=init_worker, initargs=(1,)) as ex:
        assert ex.submit(pl.thread_pool_size).result() == 1
        assert ex.submit(os.getenv, "TRACEKIT_PARSE_THREADS").result() == "1"
    monkeypatch.setenv("TRACEKIT_PARSE_THREADS", "7")  # the user's choice wins
    monkeypatch.setenv("POLARS_MAX_THREADS", "3")
    init_worker(1)
    assert (os.environ["TRACEKIT_PARSE_THREADS"], os.environ["POLARS_MAX_THREADS"]) == ("7", "3")


@needs_traces
@pytest.mark.parametrize("layout_ranks", [1, 2])
def test_compression_changes_the_codec_not_the_trace(layout_ranks: int, tmp_path: Path) -> None:
    """``compression="lz4"`` (the temporary file of ``tracekit analyze trace.json``): same rows and metadata, lz4 codec;
    one rank (the staged file is the output) and two (a second pass writes the output)."""
    import pyarrow.parquet as pq

    src = HTA / "trace_filter" / "sampled_rank-0.json.gz"
    inputs = [src] if layout_ranks == 1 else [src, HTA / "trace_filter" / "sampled_rank-1.json.gz"]
    outs = {}
    for codec in ("zstd", "lz4"):
        out = tmp_path / f"{codec}.parquet"
        convert(inputs, out, compression=codec)
        md = pq.ParquetFile(out).metadata
        assert {md.row_group(i).column(j).compression for i in range(md.num_row_groups) for j in range(md.num_columns)} == {codec.upper()}
        outs[codec] = read_trace(out)
    assert_frame_equal(outs["zstd"][0], outs["lz4"][0])
    a, b = ({k: v for k, v in m.items() if k not in ("convert_s", "created_unix", "output")} for m in (outs["zstd"][1], outs["lz4"][1]))
    assert a == b
