"""Convert speed and memory: tracekit vs HolisticTraceAnalysis (traceinsight) on the same input, same run.

Inputs:
  * a synthetic 8-rank trace with >= 1M GPU kernels in total
    (``benchmarks/gen_synthetic.py``; generated once into ``--work``, reused when present);
  * one real trace (default: HTA's ``df_index_resolver``, 51 MB of JSON, 1 rank).

Every measurement runs in a fresh subprocess (``--child``), so import time is
included and no state is shared. The parent samples the whole process tree's
RSS (``/proc``, every 20 ms) to get the true peak of parent + workers together
(both tools fork/spawn one worker per rank, up to the core count); the child's
``ru_maxrss`` of itself and of its largest worker are printed too.

Throughput = uncompressed JSON bytes / wall time; "per core" divides by the
cores the box has (both tools use all of them for multi-rank input); "per
CPU-second" divides by user+sys time of the process tree.

    python benchmarks/convert.py                      # full run (~6-9 min on 2 cores)
    python benchmarks/convert.py --kernels-per-rank 20000 --skip-hta   # quick smoke
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

__all__ = ["main"]

HERE = Path(__file__).resolve().parent
REAL_DEFAULT = Path("/work/shared/traces/hta/df_index_resolver")


# ---- child side -------------------------------------------------------------------------------


def _child(argv: list[str]) -> int:
    what = argv[0]
    if what.startswith("tracekit"):
        import tracekit

        tracekit.configure_env()  # the CLI's allocator setting, before polars loads (tracekit._memory)
    t0 = time.perf_counter()
    info: dict = {}
    if what == "tracekit":
        from tracekit.ingest.convert import convert

        res = convert([argv[1]], argv[2], force=True)
        info = {"rows": res.rows, "ranks": res.ranks}
    elif what == "tracekit-analyze":
        from tracekit.api import analyze

        res = analyze(argv[1])
        info = {"ranks": len(res["ranks"]), "window": res["window"]["reason"]}
    elif what == "hta":
        import logging

        logging.disable(logging.WARNING)
        from hta.trace_analysis import TraceAnalysis

        ta = TraceAnalysis(trace_dir=argv[1])
        info = {"rows": int(sum(len(df) for df in ta.t.traces.values())), "ranks": sorted(ta.t.traces)}
    else:
        raise SystemExit(f"unknown child {what}")
    wall = time.perf_counter() - t0
    me, ch = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    info.update(
        wall_s=wall,
        self_maxrss_mb=me.ru_maxrss / 1024,
        child_maxrss_mb=ch.ru_maxrss / 1024,
        cpu_s=me.ru_utime + me.ru_stime + ch.ru_utime + ch.ru_stime,
    )
    print("RESULT " + json.dumps(info))
    return 0


# ---- parent side ------------------------------------------------------------------------------


def _tree_rss_kb(root: int) -> int:
    """Sum of VmRSS over ``root`` and all its descendants (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(d))
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        stack.extend(children.get(pid, []))
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
                        break
        except OSError:
            pass
    return total


def measure_child(script: Path, args: list[str], timeout: float, env: dict[str, str] | None = None,
                  peak_key: str = "peak_tree_rss_mb") -> dict:
    """Run ``script --child ARGS``, sampling the RSS of its whole process tree: its RESULT line, its wall time
    (``proc_wall_s``) and the peak (``peak_key``, MB), or ``{"error": ...}``. The benchmarks' one child runner."""
    cmd = [sys.executable, str(script), "--child", *args]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})
    peak, stop = [0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], _tree_rss_kb(proc.pid))
            stop.wait(0.02)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return {"error": f"timed out after {timeout:.0f} s"}
    finally:
        stop.set()
        th.join()
    res = next((json.loads(line[7:]) for line in out.splitlines() if line.startswith("RESULT ")), None)
    if proc.returncode != 0 or res is None:
        return {"error": (err.strip().splitlines() or ["?"])[-1][:300]}
    return {**res, "proc_wall_s": time.perf_counter() - t0, peak_key: peak[0] / 1024}


def _measure(args: list[str], timeout: float) -> dict:
    return measure_child(Path(__file__).resolve(), args, timeout)


def _raw_bytes(d: Path) -> int:
    total = 0
    for p in sorted(d.iterdir()):
        if p.name.endswith(".gz"):
            with gzip.open(p, "rb") as f:
                while True:
                    b = f.read(1 << 24)
                    if not b:
                        break
                    total += len(b)
        elif p.name.endswith(".json"):
            total += p.stat().st_size
    return total


def _line(tool: str, r: dict, raw_mb: float, cores: int) -> str:
    if "error" in r:
        return f"  {tool:<10} FAILED: {r['error']}"
    w = r["proc_wall_s"]
    return (
        f"  {tool:<10} wall {w:7.2f} s | {raw_mb / w:7.1f} MB/s | {raw_mb / w / cores:7.1f} MB/s/core | "
        f"{raw_mb / max(r['cpu_s'], 1e-9):7.1f} MB/CPU-s | peak RSS tree {r['peak_tree_rss_mb']:7.0f} MB "
        f"(self {r['self_maxrss_mb']:.0f}, largest worker {r['child_maxrss_mb']:.0f})"
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return _child(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/tracekit-bench"), help="scratch dir (synthetic trace, outputs)")
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--kernels-per-rank", type=int, default=125_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--real", type=Path, default=REAL_DEFAULT, help="directory of a real Kineto trace")
    ap.add_argument("--skip-hta", action="store_true")
    ap.add_argument("--timeout", type=float, default=540.0, help="per measurement, seconds")
    a = ap.parse_args(argv)

    cores = os.cpu_count() or 1
    a.work.mkdir(parents=True, exist_ok=True)
    syn = a.work / f"synthetic-{a.ranks}x{a.kernels_per_rank}-s{a.seed}"
    if not (syn.exists() and len(list(syn.glob("*.json.gz"))) == a.ranks):
        sys.path.insert(0, str(HERE))
        from gen_synthetic import write_synthetic_kineto

        t = time.perf_counter()
        write_synthetic_kineto(syn, a.ranks, a.kernels_per_rank, a.seed)
        print(f"generated {syn} in {time.perf_counter() - t:.1f} s")
    inputs = [(f"synthetic {a.ranks} ranks x {a.kernels_per_rank} kernels", syn)]
    if a.real.exists():
        inputs.append((f"real {a.real.name}", a.real))
    print(f"machine: {cores} cores; python {sys.version.split()[0]}")
    summary = []
    for label, d in inputs:
        raw = _raw_bytes(d)
        gz = sum(p.stat().st_size for p in d.iterdir() if p.is_file())
        raw_mb = raw / 1e6
        print(f"\n{label}: {raw_mb:.1f} MB JSON ({gz / 1e6:.1f} MB gz) in {d}")
        out = a.work / f"{d.name}.parquet"
        tk = _measure(["tracekit", str(d), str(out)], a.timeout)
        print(_line("tracekit", tk, raw_mb, cores), flush=True)
        if "error" not in tk:
            print(f"             {tk['rows']:,} rows, ranks {tk['ranks']}, trace.parquet {out.stat().st_size / 1e6:.1f} MB")
        hta = {"error": "skipped"} if a.skip_hta else _measure(["hta", str(d)], a.timeout)
        print(_line("HTA", hta, raw_mb, cores), flush=True)
        if "error" not in tk and "error" not in hta:
            sp = hta["proc_wall_s"] / tk["proc_wall_s"]
            mem = tk["peak_tree_rss_mb"] / hta["peak_tree_rss_mb"]
            spc = hta["cpu_s"] / tk["cpu_s"]
            print(f"  ratio      tracekit throughput = {sp:.1f}x HTA by wall time, {spc:.1f}x by CPU time; "
                  f"tracekit peak memory = {mem:.2f}x HTA's (target >= 10x, <= 0.33x)")
            summary.append((label, sp, spc, mem))
        if "error" not in tk and d == syn:
            an = _measure(["tracekit-analyze", str(out)], a.timeout)
            if "error" in an:
                print(f"  analyze    FAILED: {an['error']}")
            else:
                print(f"  analyze    tracekit.api.analyze on the {a.ranks}-rank trace: {an['proc_wall_s']:.2f} s wall "
                      f"(process incl. imports), peak RSS {an['peak_tree_rss_mb']:.0f} MB")
    if summary:
        print("\nsummary: " + "; ".join(f"{lab}: {sp:.1f}x faster (wall), {spc:.1f}x (CPU), {mem:.2f}x memory"
                                      for lab, sp, spc, mem in summary))
    print(f"load average at the end: {os.getloadavg()[0]:.1f} on {cores} cores (wall times are inflated by other load)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
