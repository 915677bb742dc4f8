"""Scale benchmark: time and peak memory of convert / analyze / a lazy scan against kernel count.

For each case (total kernels, ranks) it writes a synthetic N-rank Kineto capture
with :func:`gen_synthetic.write_synthetic_kineto`, then runs, each in its own
process so peak memory is measured per phase (sum of RSS over the process tree,
sampled every 50 ms, so parallel convert workers count):

* ``tracekit convert <dir> -o trace.parquet -q``
* ``tracekit analyze --json trace.parquet``
* a lazy scan (``scan_trace`` → per-rank, per-category kernel time), the access
  path a distributed engine would use on the same file.

Convert's peak is also given against the largest rank's uncompressed JSON,
as is and above the *floor*: the peak of converting a tiny capture (the
interpreter, polars, pyarrow and their first-use pages; measured once per run).

Usage::

    python benchmarks/scale.py                         # 1M, 4M, 16M kernels on 8 ranks + a 64-rank case
    python benchmarks/scale.py --sizes 250k,1M --ranks 8 --rank64 256k --budget 600 --json scale.json

A case whose phase exceeds ``--timeout`` is recorded as a timeout and larger
cases of the same rank count are skipped; ``--budget`` bounds the whole run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_synthetic import write_synthetic_kineto  # noqa: E402

__all__ = ["Case", "run_case", "main"]

_SCAN = r"""
import sys, polars as pl
from tracekit.schema import scan_trace
lf = scan_trace(sys.argv[1])
out = (lf.filter(pl.col("kind").cast(pl.String) == "kernel")
         .group_by("rank", pl.col("category").cast(pl.String))
         .agg(pl.col("dur_ns").sum(), pl.len())
         .collect())
print(out.height)
"""


@dataclass
class Case:
    ranks: int
    kernels: int
    kernels_per_rank: int = 0
    events: int = 0
    json_mb: float = 0.0
    #: uncompressed JSON of the largest rank (the gzip trailer's size field)
    rank_json_mb: float = 0.0
    parquet_mb: float = 0.0
    gen_s: float = 0.0
    phases: dict[str, dict[str, float | str]] = field(default_factory=dict)


def _parse_n(s: str) -> int:
    s = s.strip().lower()
    mul = 1
    if s.endswith("k"):
        mul, s = 1_000, s[:-1]
    elif s.endswith("m"):
        mul, s = 1_000_000, s[:-1]
    return int(float(s) * mul)


def _inflated_size(path: Path) -> int:
    """Uncompressed size of a single-member .gz below 4 GiB (its trailer), else of the file itself."""
    if path.suffix != ".gz":
        return path.stat().st_size
    with open(path, "rb") as f:
        f.seek(-4, os.SEEK_END)
        return int.from_bytes(f.read(4), "little")


def floor_rss(work: Path, timeout: float) -> dict[str, float | str]:
    """Peak RSS of converting a tiny 1-rank capture in a fresh process: interpreter, libraries and their
    first-use pages — the part of every convert peak that does not depend on the input."""
    src = work / "floor" / "raw"
    shutil.rmtree(src.parent, ignore_errors=True)
    write_synthetic_kineto(src, 1, 2000, 0, tp_size=1)
    r = _measure([sys.executable, "-m", "tracekit.cli", "convert", str(src), "-o", str(src.parent / "t.parquet"), "-q", "--force"], timeout)
    shutil.rmtree(src.parent, ignore_errors=True)
    return r


def _measure(cmd: list[str], timeout: float, stdout: Path | None = None) -> dict[str, float | str]:
    """Run ``cmd``; wall seconds and peak RSS (MB) of its whole process tree."""
    t0 = time.perf_counter()
    out = open(stdout, "wb") if stdout else subprocess.DEVNULL
    try:
        p = psutil.Popen(cmd, stdout=out, stderr=subprocess.PIPE)
        peak = 0
        status = "ok"
        while p.poll() is None:
            try:
                procs = [p] + p.children(recursive=True)
                rss = 0
                for q in procs:
                    try:
                        rss += q.memory_info().rss
                    except psutil.Error:
                        pass
                peak = max(peak, rss)
            except psutil.Error:
                pass
            if time.perf_counter() - t0 > timeout:
                for q in p.children(recursive=True):
                    q.kill()
                p.kill()
                status = "timeout"
                break
            time.sleep(0.05)
        p.wait()
        err = p.stderr.read().decode(errors="replace") if p.stderr else ""
        if status == "ok" and p.returncode != 0:
            status = f"exit {p.returncode}: {err.strip().splitlines()[-1] if err.strip() else ''}"
    finally:
        if stdout:
            out.close()  # type: ignore[union-attr]
    return {"seconds": round(time.perf_counter() - t0, 2), "peak_rss_mb": round(peak / 1e6, 1), "status": status}


def run_case(ranks: int, kernels: int, work: Path, *, timeout: float, seed: int = 0, keep: bool = False) -> Case:
    c = Case(ranks=ranks, kernels=kernels, kernels_per_rank=max(1, kernels // ranks))
    d = work / f"r{ranks}_k{kernels}"
    shutil.rmtree(d, ignore_errors=True)
    src = d / "raw"
    t0 = time.perf_counter()
    spec = write_synthetic_kineto(src, ranks, c.kernels_per_rank, seed, tp_size=min(ranks, 8))
    c.gen_s = round(time.perf_counter() - t0, 2)
    c.json_mb = round(sum(p.stat().st_size for p in spec.paths) / 1e6, 1)
    c.rank_json_mb = round(max(_inflated_size(p) for p in spec.paths) / 1e6, 1)
    # kernel + launch + cpu op per kernel, plus per-step annotations/copies
    c.events = 3 * c.kernels_per_rank * ranks + spec.steps * ranks * 11
    trace = d / "trace.parquet"
    tk = [sys.executable, "-m", "tracekit.cli"]
    c.phases["convert"] = _measure(tk + ["convert", str(src), "-o", str(trace), "-q", "--force"], timeout)
    if c.phases["convert"]["status"] == "ok":
        c.parquet_mb = round(trace.stat().st_size / 1e6, 1)
        c.phases["analyze"] = _measure(tk + ["analyze", "--json", str(trace)], timeout, stdout=d / "analyze.json")
        c.phases["scan"] = _measure([sys.executable, "-c", _SCAN, str(trace)], timeout)
    if not keep:
        shutil.rmtree(src, ignore_errors=True)
    return c


def _row(c: Case) -> str:
    def ph(n: str) -> str:
        p = c.phases.get(n)
        if not p:
            return f"{'-':>9} {'-':>8}"
        if p["status"] != "ok":
            return f"{str(p['status'])[:18]:>18}"
        return f"{p['seconds']:>8.1f}s {p['peak_rss_mb']:>7.0f}M"

    return (f"{c.ranks:>5} {c.kernels:>10,} {c.events:>11,} {c.json_mb:>8.1f} {c.rank_json_mb:>8.1f} {c.parquet_mb:>8.1f} "
            f"{c.gen_s:>6.1f}s  {ph('convert')}  {ph('analyze')}  {ph('scan')}")


def _ratios(c: Case, floor_mb: float) -> str:
    p = c.phases.get("convert")
    if not p or p["status"] != "ok" or not c.rank_json_mb:
        return ""
    peak = float(p["peak_rss_mb"])
    return (f"      convert peak / largest rank's JSON: {peak / c.rank_json_mb:.2f}x; "
            f"above the floor ({floor_mb:.0f} MB): {(peak - floor_mb) / c.rank_json_mb:.2f}x")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1M,4M,16M", help="total kernels per case (k/M suffixes)")
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--rank64", default="1M", help="total kernels of the 64-rank case ('' to skip)")
    ap.add_argument("--workdir", default=None, help="scratch directory (default: a temp dir)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per phase")
    ap.add_argument("--budget", type=float, default=3600.0, help="seconds for the whole run; later cases are skipped")
    ap.add_argument("--keep", action="store_true", help="keep the generated JSON")
    ap.add_argument("--json", default=None, help="also write the results here")
    a = ap.parse_args(argv)
    work = Path(a.workdir) if a.workdir else Path(os.environ.get("TMPDIR", "/tmp")) / "tracekit-scale"
    work.mkdir(parents=True, exist_ok=True)
    plan = [(a.ranks, _parse_n(s)) for s in a.sizes.split(",") if s.strip()]
    if a.rank64:
        plan.append((64, _parse_n(a.rank64)))
    print(f"host: {os.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB; python {sys.version.split()[0]}")
    fl = floor_rss(work, a.timeout)
    floor_mb = float(fl["peak_rss_mb"])
    print(f"floor: converting a 1-rank, 2,000-kernel capture peaks at {floor_mb:.0f} MB ({fl['seconds']} s)")
    print(f"{'ranks':>5} {'kernels':>10} {'events':>11} {'gz MB':>8} {'rank MB':>8} {'pq MB':>8} {'gen':>7}  "
          f"{'convert':>18}  {'analyze':>18}  {'lazy scan':>18}")
    t_start = time.perf_counter()
    results: list[Case] = []
    failed_ranks: set[int] = set()
    for ranks, kernels in plan:
        if ranks in failed_ranks:
            print(f"{ranks:>5} {kernels:>10,}  skipped (a smaller case timed out)")
            continue
        if time.perf_counter() - t_start > a.budget:
            print(f"{ranks:>5} {kernels:>10,}  skipped (--budget {a.budget:.0f}s spent)")
            continue
        c = run_case(ranks, kernels, work, timeout=a.timeout, keep=a.keep)
        results.append(c)
        print(_row(c), flush=True)
        print(_ratios(c, floor_mb), flush=True)
        if any(p["status"] != "ok" for p in c.phases.values()):
            failed_ranks.add(ranks)
    if a.json:
        Path(a.json).write_text(json.dumps({"floor": fl, "cases": [asdict(c) for c in results]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
