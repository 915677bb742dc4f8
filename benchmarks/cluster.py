"""Cluster benchmark: ``convert --cluster`` + ``analyze --cluster`` of tiled real ranks, 1..8 workers, and a
1,024-rank simulation with planted stragglers.

Source: the real 2 x H200 capture in ``tests/fixtures/gpu/grouped.trace.parquet`` (NCCL all-reduces every step,
CUDA-graph-free MoE decode; it ships with the repo, so this runs where ``shared/traces`` is absent).

* **Scaling** (``--ranks``, ``--workers``): the source tiled in time (``--tiles``: copies, each a new set of steps and
  collectives, :mod:`tile_real`) and written as Kineto JSON (one file per rank: the source's two ranks, each file
  renamed to its rank). Per (ranks, workers): a loopback LocalCluster of W worker processes, each with
  ``--threads`` polars/parse threads (the same for every W, so W workers use W x threads cores), started before
  the clock starts; then, timed, ``tracekit convert IN --cluster ADDR -o DS`` and ``tracekit analyze DS --cluster
  ADDR --json`` as two client processes. Reported: wall time of the two commands, speedup against 1 worker, the
  client's peak RSS (both commands; ``os.wait4``), the largest worker process' peak RSS (sampled every 50 ms).
* **Simulation** (``--sim``): N ranks as a dataset (pairs ``2g, 2g+1`` are process group ``tp{g}``, copies of the
  source's two ranks), with stragglers planted on ``--plant`` ranks: each planted rank's host starts every
  ``--every``-th step ``--delay-ms`` late (all its rows from that step on shift), and its partner's first
  all-reduce after that point waits for it (longer by the delay, its later rows shifted too). ``analyze
  --cluster`` must name exactly the planted ranks as the top late ranks of ``collectives.stall_summary``; the
  client's peak RSS is reported against the 8-rank case's.

Usage::

    python benchmarks/cluster.py --ranks 8,64,512 --workers 1,2,4,8 --threads 2 --sim 1024 --json cluster.json
    python benchmarks/cluster.py --ranks 8 --workers 1,2 --threads 1 --tiles 2 --sim 64      # a quick check

``--budget`` (s) stops starting new runs once spent (what ran is reported).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "tests" / "fixtures" / "gpu" / "grouped.trace.parquet"
sys.path.insert(0, str(Path(__file__).resolve().parent))


def base_inputs(work: Path, tiles: int) -> tuple[Path, list[Path]]:
    """The source tiled ``tiles`` times in time (2 ranks): its trace and its two Kineto JSON files."""
    import polars as pl
    from tile_real import tile_trace, write_kineto

    from tracekit.schema import scan_trace

    k_src = int(scan_trace(SRC).filter((pl.col("kind") == "kernel") & (pl.col("rank") == 0)).select(pl.len()).collect().item())
    base = work / f"base{tiles}.parquet"
    if not base.exists():
        tile_trace(SRC, base, ranks=2, kernels=2 * k_src * tiles)
    kdir = work / f"base{tiles}_kineto"
    files = sorted(kdir.glob("rank*.trace.json")) if kdir.exists() else write_kineto(base, kdir)
    return base, sorted(files)


def kineto_ranks(base_files: list[Path], out: Path, ranks: int) -> list[Path]:
    """Rank ``t``'s file: the base file of rank ``t % 2``, its header naming rank ``t`` of ``ranks``."""
    out.mkdir(parents=True, exist_ok=True)
    heads, bodies = [], []
    for f in base_files:
        with open(f, "rb") as fh:
            head = fh.readline()
        heads.append(json.loads(head.split(b', "traceEvents"')[0] + b"}"))
        bodies.append(f)
    files = []
    for t in range(ranks):
        s = t % len(base_files)
        h = dict(heads[s], distributedInfo=dict(heads[s]["distributedInfo"], rank=t, world_size=ranks))
        p = out / f"rank{t}.trace.json"
        with open(p, "wb") as w, open(bodies[s], "rb") as r:
            r.readline()
            w.write(json.dumps(h).encode()[:-1] + b', "traceEvents": [\n')
            shutil.copyfileobj(r, w, 1 << 22)
        files.append(p)
    return files


def kineto_copies(src: Path, out: Path, ranks: int) -> list[Path]:
    """``ranks`` copies of one real Kineto JSON (``.json`` or ``.json.gz``, e.g. a ``tile_real.cut_kineto_json`` cut of a
    single-GPU capture), each naming its rank in ``distributedInfo`` (inserted before ``traceEvents``)."""
    import gzip

    raw = src.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    at = raw.find(b'"traceEvents"')
    if at < 0 or b'"distributedInfo"' in raw[:at]:
        raise SystemExit(f"{src}: expected a Kineto JSON without distributedInfo before its traceEvents")
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for t in range(ranks):
        p = out / f"rank{t}.trace.json"
        info = json.dumps({"backend": "nccl", "rank": t, "world_size": ranks}).encode()
        with open(p, "wb") as w:
            w.write(raw[:at])
            w.write(b'"distributedInfo": ' + info + b", ")
            w.write(raw[at:])
        files.append(p)
    return files


class Cluster:
    """A loopback LocalCluster of ``workers`` processes in its own process (``_serve``), and a controller client."""

    def __init__(self, workers: int, threads: int, work: Path) -> None:
        addr_file = work / f"addr-{os.getpid()}-{workers}.txt"
        addr_file.unlink(missing_ok=True)
        self.proc = subprocess.Popen([sys.executable, __file__, "_serve", str(workers), str(threads), str(addr_file)],
                                     start_new_session=True)
        t0 = time.monotonic()
        while not addr_file.exists() or not addr_file.read_text().strip():
            if self.proc.poll() is not None or time.monotonic() - t0 > 120:
                raise RuntimeError("the local cluster did not start")
            time.sleep(0.1)
        self.address = addr_file.read_text().strip()
        self.start_s = time.monotonic() - t0
        from distributed import Client

        self.client = Client(self.address, set_as_default=False)
        self.workers = workers
        self.client.wait_for_workers(workers)

    def worker_pids(self) -> list[int]:
        return [int(p) for p in self.client.run(os.getpid).values()]

    def restart(self) -> None:
        """Fresh worker processes before a case; one that does not come back within 60 s is waited for no longer
        (the worker peaks are sampled during the case, so they do not depend on it)."""
        try:
            self.client.restart(timeout=60, wait_for_workers=False)
            self.client.wait_for_workers(self.workers, timeout=60)
        except Exception as e:  # noqa: BLE001
            print(f"restart: {type(e).__name__}: {str(e)[:200]}; continuing with the workers there are", flush=True)

    def close(self) -> None:
        self.client.close()
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(30)


def _serve(workers: int, threads: int, addr_file: str) -> None:
    import logging

    import dask
    from distributed import LocalCluster

    dask.config.set({"distributed.scheduler.worker-saturation": 1.0})
    env = {"POLARS_MAX_THREADS": str(threads), "TRACEKIT_PARSE_THREADS": str(threads)}
    cl = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address="127.0.0.1:0",
                      silence_logs=logging.ERROR, env=env, memory_limit=0)
    Path(addr_file + ".tmp").write_text(cl.scheduler_address)
    os.replace(addr_file + ".tmp", addr_file)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    cl.close()


class PeakSampler(threading.Thread):
    """Peak RSS of each of ``pids``, sampled every 50 ms until :meth:`stop`."""

    def __init__(self, pids: list[int]) -> None:
        super().__init__(daemon=True)
        import psutil

        self.procs = [psutil.Process(p) for p in pids]
        self.peak = {p: 0 for p in pids}
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            for p in self.procs:
                try:
                    self.peak[p.pid] = max(self.peak[p.pid], p.memory_info().rss)
                except Exception:  # noqa: BLE001 - a worker restarted
                    pass
            self._halt.wait(0.05)

    def stop(self) -> dict[int, int]:
        self._halt.set()
        self.join()
        return self.peak


#: runs ``tracekit.cli`` with ``sys.argv[1:]`` and, at exit, writes the process' own VmHWM (kB) to $TK_HWM_FILE
_CLIENT = ("import atexit, os, runpy, sys\n"
           "def _hwm():\n"
           "    kb = [l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM:')][0]\n"
           "    open(os.environ['TK_HWM_FILE'], 'w').write(kb)\n"
           "atexit.register(_hwm)\n"
           "sys.argv = ['tracekit', *sys.argv[1:]]\n"
           "runpy.run_module('tracekit.cli', run_name='__main__', alter_sys=True)\n")


def client_run(args: list[str], work: Path) -> tuple[float, int, float, str]:
    """A tracekit command as a client process: (wall s, peak RSS bytes, CPU s, stdout).

    Peak RSS: the client's own ``VmHWM`` (/proc/self/status), read by the client at exit. It is the high-water
    mark of the process' address space since its exec, so it is neither the parent's (``wait4``'s ``ru_maxrss``
    starts at the parent's high-water mark on Linux: the previous device run read 607 MB, the controller's, for
    every case) nor a sample that can miss a short peak."""
    hwm = work / f"hwm-{os.getpid()}.txt"
    hwm.unlink(missing_ok=True)
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-c", _CLIENT, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env={**os.environ, "TK_HWM_FILE": str(hwm)})
    out_b: list[bytes] = []
    reader = threading.Thread(target=lambda: out_b.append(p.stdout.read()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    _, status, ru = os.wait4(p.pid, 0)
    reader.join()
    wall = time.perf_counter() - t0
    err = p.stderr.read().decode()  # type: ignore[union-attr]
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"tracekit {' '.join(args[:1])} failed: {err.strip()[-500:]}")
    return wall, int(hwm.read_text()) * 1024, ru.ru_utime + ru.ru_stime, out_b[0].decode()


def run_case(cl: Cluster, inputs: Path, work: Path, tag: str) -> dict[str, Any]:
    """convert + analyze on the cluster, timed; the cluster's workers are restarted first (fresh memory)."""
    cl.restart()
    ds = work / f"ds-{tag}"
    shutil.rmtree(ds, ignore_errors=True)
    sampler = PeakSampler(cl.worker_pids())
    sampler.start()
    cw, cm, cc, _ = client_run(["convert", str(inputs), "-o", str(ds), "--cluster", cl.address, "-q"], work)
    aw, am, ac, out = client_run(["analyze", str(ds), "--cluster", cl.address, "--json"], work)
    peaks = sampler.stop()
    doc = json.loads(out)
    return {"convert_s": round(cw, 2), "analyze_s": round(aw, 2), "total_s": round(cw + aw, 2),
            "client_peak_mb": round(max(cm, am) / 1e6), "convert_client_mb": round(cm / 1e6), "analyze_client_mb": round(am / 1e6),
            "client_cpu_s": round(cc + ac, 2), "convert_client_cpu_s": round(cc, 2), "analyze_client_cpu_s": round(ac, 2),
            "worker_peak_mb": round(max(peaks.values()) / 1e6), "ranks_analyzed": len(doc["ranks"]),
            "idle_pct_rank0": round(100 * doc["ranks"][0]["time_ns"].get("idle", 0) / max(1, doc["ranks"][0]["window_ns"]), 2)}


def planted_partition(args: tuple[str, str, int, int, list[int], int, int]) -> int:
    """Worker (process pool): write rank ``t``'s partition of the simulation (module docstring); returns its rows."""
    base, out, t, world, planted, delay, every = args
    import polars as pl

    from tracekit.schema import TraceWriter, scan_trace

    g, s = divmod(t, 2)
    df = scan_trace(base).filter(pl.col("rank") == s).collect()
    coll = pl.col("category") == "communication"
    df = df.with_columns(pl.lit(t, pl.Int32).alias("rank"), pl.lit(t, pl.Int32).alias("device"),
                         pl.when(coll).then(pl.lit(f"tp{g}")).otherwise(pl.col("pg_name").cast(pl.String)).alias("pg_name"),
                         pl.when(coll).then(pl.lit(f"[{2 * g}, {2 * g + 1}]")).otherwise(pl.col("pg_ranks").cast(pl.String)).alias("pg_ranks"))
    partner = t ^ 1
    if t in planted or partner in planted:
        df = _plant(df, own=t in planted, delay=delay, every=every)
    dest = Path(out) / f"rank={t}" / "part-0.parquet"
    dest.parent.mkdir(parents=True, exist_ok=True)
    w = TraceWriter(dest, force=True, part_rank=t)
    w.write(df.sort("ts_ns", maintain_order=True))
    w.close()
    return df.height


def _plant(df: Any, *, own: bool, delay: int, every: int) -> Any:
    """Planted straggler: the delayed steps' starts (``own``: this rank starts them late) or the partner's first
    all-reduce after each (it waits); rows after each point shift by ``delay``, the waiting all-reduce grows."""
    import polars as pl

    steps = df.filter((pl.col("kind") == "step") & pl.col("step_id").is_not_null() & (pl.col("step_id") % every == every - 1)
                      & pl.col("profiled").fill_null(True))
    coll = df.filter((pl.col("category") == "communication") & (pl.col("kind") == "kernel")).select(
        pl.coalesce("launch_ts_ns", "ts_ns").alias("launch"), "ts_ns").sort("launch")
    ck0 = coll["launch"]  # a step's all-reduces are launched inside it (they run on the GPU after it)
    # delayed steps: those that hold an all-reduce (both ranks of the pair pick the same step ids)
    starts = sorted({int(a) for a, d in zip(steps["ts_ns"].to_list(), steps["dur_ns"].to_list())
                     if int(ck0.search_sorted(a, side="left")) < int(ck0.search_sorted(a + d, side="left"))})
    if own:
        thr = pl.Series(starts, dtype=pl.Int64)
        n = thr.search_sorted(df["ts_ns"], side="right")  # thresholds at or before each row
        ln = thr.search_sorted(df["launch_ts_ns"].fill_null(0), side="right")
        return df.with_columns((pl.col("ts_ns") + n.cast(pl.Int64) * delay).alias("ts_ns"),
                               (pl.col("launch_ts_ns") + ln.cast(pl.Int64) * delay).alias("launch_ts_ns"))
    idx = ck0.search_sorted(pl.Series(starts, dtype=pl.Int64), side="left").to_list()  # first all-reduce launched after each
    firsts = sorted({int(coll["ts_ns"][int(i)]) for i in idx if int(i) < ck0.len()})
    thr = pl.Series(firsts, dtype=pl.Int64)
    n = thr.search_sorted(df["ts_ns"], side="left")  # thresholds strictly before each row
    is_wait = (pl.col("category") == "communication") & (pl.col("kind") == "kernel") & pl.col("ts_ns").is_in(firsts)
    ln = thr.search_sorted(df["launch_ts_ns"].fill_null(0), side="left")
    return df.with_columns((pl.col("ts_ns") + n.cast(pl.Int64) * delay).alias("ts_ns"),
                           (pl.col("launch_ts_ns") + ln.cast(pl.Int64) * delay).alias("launch_ts_ns"),
                           pl.when(is_wait).then(pl.col("dur_ns") + delay).otherwise(pl.col("dur_ns")).alias("dur_ns"))


def sim_dataset(base: Path, out: Path, ranks: int, planted: list[int], delay: int, every: int) -> None:
    """The simulation's dataset (module docstring), partitions written by a process pool."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    from tracekit.schema import read_metadata, write_dataset_meta

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    # spawn: this process holds the Dask client's threads, which a fork would copy mid-lock
    with ProcessPoolExecutor(max(1, min(16, os.cpu_count() or 1)), mp_context=mp.get_context("spawn")) as ex:
        list(ex.map(planted_partition, [(str(base), str(out), t, ranks, planted, delay, every) for t in range(ranks)], chunksize=8))
    meta = dict(read_metadata(base))
    rm = {int(m["rank"]): m for m in meta.get("ranks", [])}
    meta.update(world_size=ranks, ranks=[dict(rm.get(t % 2, {}), rank=t, device=t) for t in range(ranks)],
                clock_offsets_ns={str(t): 0 for t in range(ranks)}, quality=[])
    write_dataset_meta(out, meta)


def simulate(cl: Cluster, base: Path, work: Path, ranks: int, plant: list[int], delay_ms: float, every: int) -> dict[str, Any]:
    ds = work / f"sim{ranks}"
    t0 = time.perf_counter()
    sim_dataset(base, ds, ranks, plant, int(delay_ms * 1e6), every)
    build = time.perf_counter() - t0
    cl.restart()
    sampler = PeakSampler(cl.worker_pids())
    sampler.start()
    aw, am, ac, out = client_run(["analyze", str(ds), "--cluster", cl.address, "--json"], work)
    peaks = sampler.stop()
    doc = json.loads(out)
    late: dict[int, int] = {}
    for row in doc["collectives"].get("stall_summary") or []:
        late[int(row["late_rank"])] = late.get(int(row["late_rank"]), 0) + int(row["lost_ns"])
    top = sorted(late, key=lambda r: -late[r])[: len(plant)]
    return {"ranks": ranks, "planted": sorted(plant), "found": sorted(top), "ok": sorted(top) == sorted(plant),
            "lost_ms": {str(r): round(late[r] / 1e6, 1) for r in sorted(late, key=lambda r: -late[r])[: len(plant) + 3]},
            "build_s": round(build, 1), "analyze_s": round(aw, 2), "client_peak_mb": round(am / 1e6), "client_cpu_s": round(ac, 2),
            "worker_peak_mb": round(max(peaks.values()) / 1e6), "ranks_analyzed": len(doc["ranks"])}


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def main(argv: list[str]) -> int:
    global SRC
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", default="8,64,512")
    ap.add_argument("--workers", default="1,2,4,8")
    ap.add_argument("--threads", type=int, default=2, help="polars/parse threads per worker (every W)")
    ap.add_argument("--tiles", default="", help="time tiles per rank for each --ranks (default: 512 rank-tiles in all)")
    ap.add_argument("--matrix", default="", help="R:W,W;R:W ... instead of every (ranks, workers) pair")
    ap.add_argument("--sim", type=int, default=1024)
    ap.add_argument("--plant", default="", help="planted straggler ranks (default: 3 spread over --sim)")
    ap.add_argument("--delay-ms", type=float, default=5.0)
    ap.add_argument("--every", type=int, default=4)
    ap.add_argument("--work", default="/tmp/tracekit-cluster-bench")
    ap.add_argument("--src", default=str(SRC), help="the real trace.parquet to tile (default: the grouped 2 x H200 fixture)")
    ap.add_argument("--kineto", default="", help="a real Kineto JSON (.json / .json.gz): every rank a copy of it, instead of "
                                                 "--src tiled (--tiles is then ignored)")
    ap.add_argument("--budget", type=float, default=1e9)
    ap.add_argument("--json", default="")
    a = ap.parse_args(argv)
    SRC = Path(a.src)
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    ranks = _ints(a.ranks)
    tiles = _ints(a.tiles) if a.tiles else [max(1, 512 // r) for r in ranks]
    plan = {int(k): _ints(v) for k, v in (x.split(":") for x in a.matrix.split(";") if x)} if a.matrix else {r: _ints(a.workers) for r in ranks}
    results: dict[str, Any] = {"threads_per_worker": a.threads, "cpus": os.cpu_count(), "cases": [], "sim": None,
                               "source": a.kineto or a.src}
    inputs = {}
    for r, t in zip(ranks, tiles):
        t0 = time.perf_counter()
        if a.kineto:
            t = 1
            inputs[r] = (kineto_copies(Path(a.kineto), work / f"in{r}", r)[0].parent, t)
        else:
            _, files = base_inputs(work, t)
            inputs[r] = (kineto_ranks(files, work / f"in{r}", r)[0].parent, t)
        what = f"copies of {Path(a.kineto).name}" if a.kineto else f"x {t} tiles"
        print(f"inputs: {r} ranks {what} ({sum(f.stat().st_size for f in inputs[r][0].iterdir()) / 1e6:.0f} MB JSON) "
              f"in {time.perf_counter() - t0:.1f} s", flush=True)
    every_w = sorted({w for ws in plan.values() for w in ws} or ({8} if a.sim else set()))  # the simulation: on the most
    workers = every_w[:1] + every_w[-1:] + every_w[1:-1] if len(every_w) > 1 else every_w  # 1, most, then the rest
    for w in workers:
        if time.monotonic() - t_start > a.budget:
            print(f"budget spent: {w} workers not run", flush=True)
            break
        cl = Cluster(w, a.threads, work)
        try:
            for r in ranks:
                if w in plan.get(r, []) and time.monotonic() - t_start <= a.budget:
                    res = dict(ranks=r, tiles=inputs[r][1], workers=w, cluster_start_s=round(cl.start_s, 1),
                               **run_case(cl, inputs[r][0], work, f"{r}-{w}"))
                    results["cases"].append(res)
                    print(json.dumps(res), flush=True)
                    _save(a.json, results)
            if a.sim and w == every_w[-1] and time.monotonic() - t_start <= a.budget:
                base, _ = base_inputs(work, 1)
                # odd ranks: the copies of the source's rank 1 (planting on the other role does not take yet: see docs/scale.md §4)
                plant = _ints(a.plant) or [a.sim // 7 * 2 + 1, a.sim // 2 + 1, a.sim - 3]
                results["sim"] = dict(workers=w, **simulate(cl, base, work, a.sim, plant, a.delay_ms, a.every))
                print(json.dumps(results["sim"]), flush=True)
                _save(a.json, results)
        finally:
            cl.close()
    _summary(results)
    _save(a.json, results)
    return 0


def _save(path: str, results: dict[str, Any]) -> None:
    """The results so far (written after every case: a run stopped at its time limit keeps what it measured)."""
    if path:
        Path(path + ".tmp").write_text(json.dumps(results, indent=1))
        os.replace(path + ".tmp", path)


def _summary(results: dict[str, Any]) -> None:
    base = {c["ranks"]: c["total_s"] for c in results["cases"] if c["workers"] == 1}
    print(f"\n{'ranks':>6} {'tiles':>5} {'workers':>7} {'convert':>8} {'analyze':>8} {'total':>7} {'speedup':>7} {'client MB':>9} {'worker MB':>9}")
    for c in results["cases"]:
        sp = f"{base[c['ranks']] / c['total_s']:.2f}x" if c["ranks"] in base else "-"
        print(f"{c['ranks']:>6} {c['tiles']:>5} {c['workers']:>7} {c['convert_s']:>7.1f}s {c['analyze_s']:>7.1f}s {c['total_s']:>6.1f}s "
              f"{sp:>7} {c['client_peak_mb']:>9} {c['worker_peak_mb']:>9}")
    if results["sim"]:
        s = results["sim"]
        print(f"sim {s['ranks']} ranks: planted {s['planted']} found {s['found']} ({'ok' if s['ok'] else 'MISSED'}), analyze "
              f"{s['analyze_s']} s, client {s['client_peak_mb']} MB, worker {s['worker_peak_mb']} MB")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_serve":
        _serve(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
        sys.exit(0)
    sys.exit(main(sys.argv[1:]))
