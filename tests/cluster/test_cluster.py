"""``--cluster`` on a 2-worker LocalCluster: the same JSON as a local analysis, field for field (corpus and the
shared 2 x H200 capture, converted on the cluster into datasets); a worker killed mid-analysis gives the same
answer or a one-line error naming the rank; an unreachable scheduler fails in one line within 10 s; nothing
listens beyond loopback; a corrupt rank among 64 is named, and ``--keep-going`` keeps the others."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

pytest.importorskip("distributed")

from tracekit._errors import InputError  # noqa: E402
from tracekit.api import analyze  # noqa: E402
from tracekit.cluster.analyze import analyze_cluster  # noqa: E402
from tracekit.cluster.engine import cluster_client  # noqa: E402
from tracekit.ingest.convert import convert  # noqa: E402
from tracekit.schema import read_metadata  # noqa: E402

from .conftest import corrupt_copy  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "golden"))
from analyze_golden import CASES, _inputs, compare, load  # noqa: E402

#: the corpus cases plus the shared multi-rank capture (2 x H200 TP2, nsys: real NCCL collectives, clock alignment)
SAME = sorted(c for c in CASES if c.startswith("corpus_")) + ["nsys_h200_tp2"]


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    with cluster_client("local:2") as c:
        yield c


def _doc(res: Any) -> dict[str, Any]:
    doc = json.loads(json.dumps(res.to_json(), default=str))
    doc.pop("trace", None)
    return doc


@pytest.mark.parametrize("case", SAME)
def test_cluster_json_equals_local(case: str, client: Any, tmp_path: Path) -> None:
    """Converted on the cluster into a dataset, analyzed on the cluster: the golden (local, single-file) JSON."""
    want = load(case)
    if want["stage"] != "ok":
        pytest.skip(f"{case}: refused locally ({want['error']})")
    inputs = _inputs(case)
    if not all(Path(p).exists() for p in inputs):
        pytest.skip("shared traces not available")
    trace = inputs[0] if inputs[0].endswith(".parquet") else str(tmp_path / "ds")
    if trace != inputs[0]:
        convert(inputs, trace, layout="dataset", executor=client.get_executor(pure=False))
    assert compare(want["analyze"], _doc(analyze_cluster(client, trace))) == []


def test_nothing_listens_beyond_loopback(client: Any) -> None:
    import psutil

    me = psutil.Process()
    socks = [c.laddr for p in [me, *me.children(recursive=True)] for c in p.net_connections(kind="inet")
             if c.status == psutil.CONN_LISTEN]
    assert len(socks) >= 5  # scheduler (+ its HTTP server), 2 nannies, 2 workers
    assert {a.ip for a in socks} == {"127.0.0.1"}, socks


def _cli(*args: str, env: dict[str, str] | None = None, py: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *py, "-m", "tracekit.cli", *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})


def _closed_port() -> int:
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_scheduler_one_line_fast() -> None:
    """The CLI: a refused scheduler is one line, exit 5, nothing on stdout, well within 10 s — it is told before
    polars, pyarrow or Dask are imported (``-X importtime`` lists every module the command imported)."""
    port = _closed_port()
    t0 = time.monotonic()
    r = _cli("analyze", str(ROOT / "tests" / "fixtures" / "gpu" / "straggler.trace.parquet"), "--cluster",
             f"tcp://127.0.0.1:{port}", py=("-X", "importtime"))
    wall = time.monotonic() - t0
    imported = {ln.split("|")[-1].strip() for ln in r.stderr.splitlines() if ln.startswith("import time:")}
    lines = [ln for ln in r.stderr.splitlines() if not ln.startswith("import time:")]
    assert r.returncode == 5 and r.stdout == "" and wall < 10, (r.returncode, wall, r.stderr[-500:])
    assert lines == [f"tracekit: error: --cluster tcp://127.0.0.1:{port}: cannot reach the scheduler at 127.0.0.1:{port} "
                     "(Connection refused); check the address and that the scheduler is running"], lines
    assert "tracekit.cluster.engine" in imported  # the listing holds the command's own (lazy) imports
    assert not imported & {"polars", "pyarrow", "distributed", "dask"}, sorted(imported & {"polars", "pyarrow", "distributed", "dask"})


def test_silent_scheduler_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """A scheduler that never answers (a listener whose accept queue is full: the kernel drops the connection
    request) is a ClusterError after CONNECT_S (shortened here to 0.5 s), naming the address."""
    from tracekit._errors import ClusterError
    from tracekit.cluster import engine

    monkeypatch.setattr(engine, "CONNECT_S", 0.5)
    with socket.socket() as srv, socket.socket() as first:
        srv.bind(("127.0.0.1", 0))
        srv.listen(0)
        port = srv.getsockname()[1]
        first.connect(("127.0.0.1", port))  # fills the queue: the next connection is never answered
        t0 = time.monotonic()
        with pytest.raises(ClusterError, match=rf"^--cluster tcp://127\.0\.0\.1:{port}: cannot reach the scheduler at "
                           rf"127\.0\.0\.1:{port} \(no answer within 0\.5 s\)"):
            engine.probe(f"tcp://127.0.0.1:{port}")
        assert 0.4 < time.monotonic() - t0 < 5


@pytest.fixture(scope="module")
def straggler_ds(tmp_path_factory: pytest.TempPathFactory, client: Any) -> Path:
    """The 2 x H200 straggler capture tiled to 8 ranks, as a dataset."""
    from .conftest import tiled_kineto

    d = tmp_path_factory.mktemp("s8")
    convert(tiled_kineto(d, 8), d / "ds", layout="dataset", executor=client.get_executor(pure=False))
    return d / "ds"


@contextlib.contextmanager
def _kill_rank(client: Any, spec: str, allowed_failures: int | None = None) -> Iterator[None]:
    """Workers (and those their nannies start again, which inherit this process' environment: the nannies of a
    local cluster run here) die on a rank (:data:`tracekit._env.TEST_KILL_RANK`); optionally fewer allowed
    failures on the scheduler. Undone on exit, and both workers are back."""
    import dask

    key = "TRACEKIT_TEST_KILL_RANK"
    before = client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.allowed_failures)
    os.environ[key] = spec
    client.run(lambda k, v: os.environ.__setitem__(k, v), key, spec)  # a lambda: pickled by value, runs on the workers' os
    if allowed_failures is not None:
        client.run_on_scheduler(lambda dask_scheduler: setattr(dask_scheduler, "allowed_failures", allowed_failures))
    try:
        with dask.config.set({"distributed.scheduler.allowed-failures": allowed_failures if allowed_failures is not None else before}):
            yield
    finally:
        del os.environ[key]
        client.run_on_scheduler(lambda dask_scheduler: setattr(dask_scheduler, "allowed_failures", before))
        client.wait_for_workers(2, timeout=300)
        client.run(lambda k: os.environ.pop(k, None), key)


def test_worker_killed_mid_analysis(straggler_ds: Path, tmp_path: Path, client: Any) -> None:
    """The worker analyzing rank 3 is SIGKILLed once: its nanny starts a new one, Dask reruns the task, the JSON
    is the local one. Killed every time (2 deaths allowed): a one-line error naming rank 3, exit 5, no answer."""
    from tracekit.cluster.analyze import RankFailed

    want = analyze(straggler_ds)
    want.pop("trace")
    marker = tmp_path / "killed"
    with _kill_rank(client, f"3:{marker}"):
        got = _doc(analyze_cluster(client, straggler_ds))
    assert marker.exists()  # it did die
    assert compare(want, got) == []
    with _kill_rank(client, "3:always", allowed_failures=1), pytest.raises(RankFailed) as e:
        analyze_cluster(client, straggler_ds)
    assert e.value.rank == 3 and e.value.exit_code == 5 and "\n" not in str(e.value)
    assert str(e.value).startswith("rank 3: the worker running it died 2 times (killed: out of memory?)"), str(e.value)


def test_corrupt_rank_among_64(kineto64: list[Path], tmp_path: Path, client: Any) -> None:
    """A truncated file among 64: convert on the cluster names rank 37 and writes nothing (no partition, no part
    directory: the tasks still running when it failed are waited out); --keep-going converts 63 and flags rank 37;
    analyze on the cluster of that dataset carries the flag and answers for the 63."""
    files = corrupt_copy(kineto64, 37, tmp_path / "in")
    ex = client.get_executor(pure=False)
    with pytest.raises(InputError, match=r"^rank 37: .*rank37\.trace\.json"):
        convert(files, tmp_path / "ds", layout="dataset", executor=ex)
    assert not (tmp_path / "ds").exists() and not [n for n in os.listdir(tmp_path) if n.startswith(".")]
    res = convert(files, tmp_path / "ds", layout="dataset", executor=ex, keep_going=True)
    assert [f["rank"] for f in res.metadata["failed_ranks"]] == [37] and len(res.ranks) == 63
    meta = read_metadata(tmp_path / "ds")
    assert [f["rank"] for f in meta["failed_ranks"]] == [37] and len(meta["ranks"]) == 63
    doc = _doc(analyze_cluster(client, tmp_path / "ds"))
    assert [q["rank"] for q in doc["quality"] if q["code"] == "rank_failed"] == [37]
    assert len(doc["ranks"]) == 63


def test_analyze_keep_going_corrupt_partition(straggler_ds: Path, tmp_path: Path, client: Any) -> None:
    """A dataset whose rank 5 partition is damaged: analyze on the cluster names rank 5 and its file;
    keep_going answers for the others (exactly analyze(ranks=others) of the undamaged dataset), rank 5 flagged."""
    from tracekit._errors import RankError

    from .test_dataset import damaged_copy

    ds = damaged_copy(straggler_ds, tmp_path / "ds", 5, "footer")
    with pytest.raises(RankError, match=r"^rank 5: .*rank=5/part-0\.parquet: unreadable trace data"):
        analyze_cluster(client, ds)
    got = _doc(analyze_cluster(client, ds, keep_going=True))
    assert [q["rank"] for q in got["quality"] if q["code"] == "rank_failed"] == [5]
    got["quality"] = [q for q in got["quality"] if q["code"] != "rank_failed"]
    want = analyze(straggler_ds, ranks=[0, 1, 2, 3, 4, 6, 7])
    want.pop("trace")
    assert compare(want, got) == []


def test_cli_cluster_keep_going(straggler_ds: Path, tmp_path: Path) -> None:
    """The command end to end on its own local:2 cluster: a damaged rank 5 partition with --keep-going gives the
    JSON of the other ranks on stdout (rank 5 flagged) and exactly one line on stderr (the workers log nothing),
    exit 2 — as without --cluster."""
    from .test_dataset import damaged_copy

    ds = damaged_copy(straggler_ds, tmp_path / "ds", 5, "pages")
    r = _cli("analyze", str(ds), "--json", "--cluster", "local:2", "--keep-going")
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "tracekit: error: 1 rank(s) failed (rank 5); the result covers the other ranks, flagged rank_failed"], r.stderr
    got = json.loads(r.stdout)
    assert [q["rank"] for q in got["quality"] if q["code"] == "rank_failed"] == [5]
    got["quality"] = [q for q in got["quality"] if q["code"] != "rank_failed"]
    got.pop("trace")
    want = analyze(straggler_ds, ranks=[0, 1, 2, 3, 4, 6, 7])
    want.pop("trace")
    assert compare(want, got) == []
