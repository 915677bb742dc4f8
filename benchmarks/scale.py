"""Scale benchmark: time and peak memory of analyze (and convert) against kernel count, on REAL captures.

Default (``--real``): the inputs are a real 2×H200 capture (``shared/traces/nsys/generated-h200``,
NCCL all-reduces, NVTX steps, planted host stalls, 64 MiB PCIe copies, 2 kHz GPU metrics) converted
once and tiled with :mod:`tile_real` — in time (each copy one profiler window, new steps and
collective instances) and across ranks (4 tensor-parallel groups of 2 for 8 ranks) — to the
requested total kernels. Cases:

* ``R ranks x N kernels`` for each ``--sizes`` (default 1M and 4M on 8 ranks);
* ``--single``: one GPU, 566k kernels, GPU-metrics counters kept in the first tiles only so that
  the trace has about as many PCIe-bound phases as the real trace of issue 16 (442).

Per case, each in its own process (peak = RSS of the process tree, sampled every 50 ms):

* ``tracekit analyze --json trace.parquet`` (optionally ``taskset`` to ``--cores`` cores);
* a lazy scan (``scan_trace`` → per-rank, per-category kernel time);
* on the same events written as Kineto JSON (``--hta-max``: cases up to that many kernels):
  ``tracekit convert`` + ``analyze`` of the JSON, and HolisticTraceAnalysis (``traceinsight``)
  loading it and running its temporal breakdown and idle-time breakdown on every rank.

``--synthetic`` keeps the older synthetic-Kineto cases (convert / analyze / scan).

Usage::

    python benchmarks/scale.py                                  # real: 1M, 4M x 8 ranks + the 566k single-GPU case
    python benchmarks/scale.py --sizes 1M --hta-max 1M --json scale.json
    python benchmarks/scale.py --sizes '' --hta-max 0             # the 566k single-GPU case alone, no HTA
    python benchmarks/scale.py --synthetic --sizes 250k,1M --ranks 8 --rank64 256k

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
from typing import Any

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


# ---- real-capture cases ------------------------------------------------------------------------

REAL_SRC = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "nsys" / "generated-h200"
if not REAL_SRC.exists():
    REAL_SRC = Path("/work/shared/traces/nsys/generated-h200")

_HTA = r"""
import json, logging, sys, time
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
t0 = time.perf_counter()
ta = TraceAnalysis(trace_dir=sys.argv[1])
t1 = time.perf_counter()
tb = ta.get_temporal_breakdown(visualize=False)
t2 = time.perf_counter()
ranks = sorted(ta.t.traces)
idle, _ = ta.get_idle_time_breakdown(ranks=ranks, visualize=False)
t3 = time.perf_counter()
tb = tb.set_index("rank")
print("RESULT " + json.dumps({"load_s": t1 - t0, "temporal_s": t2 - t1, "idle_s": t3 - t2,
      "idle_pct": {str(r): round(100 * float(tb.loc[r, "idle_time(us)"]) / float(tb.loc[r, "kernel_time(us)"]), 2) for r in ranks},
      "idle_categories": sorted(set(str(x) for x in idle["idle_category"]))}))
"""

_TK_JSON = r"""
import json, sys, time
import tracekit
tracekit.configure_env()  # the CLI's allocator setting, before polars loads (tracekit._memory)
from tracekit.ingest.convert import convert
from tracekit.api import analyze
t0 = time.perf_counter()
convert([sys.argv[1]], sys.argv[2], force=True)
t1 = time.perf_counter()
res = analyze(sys.argv[2])
t2 = time.perf_counter()
print("RESULT " + json.dumps({"convert_s": t1 - t0, "analyze_s": t2 - t1,
      "idle_pct": {str(r["rank"]): round(100 * r["time_ns"]["idle"] / r["window_ns"], 2) for r in res["ranks"]}}))
"""


@dataclass
class RealCase:
    label: str
    ranks: int
    kernels: int
    tiles: int = 0
    rows: int = 0
    steps_per_rank: int = 0
    collectives_per_rank: int = 0
    profiler_windows: int = 0
    pcie_phases: int = 0
    parquet_mb: float = 0.0
    kineto_mb: float = 0.0
    analyze_summary: dict[str, Any] = field(default_factory=dict)
    phases: dict[str, dict[str, Any]] = field(default_factory=dict)


def _result_line(stdout: Path) -> dict[str, Any] | None:
    try:
        for line in stdout.read_text().splitlines():
            if line.startswith("RESULT "):
                return json.loads(line[7:])
    except OSError:
        pass
    return None


def real_source(work: Path, timeout: float) -> Path:
    """The real 2-rank H200 capture converted once (the tiling source)."""
    out = work / "h200_tp2.parquet"
    if not out.exists():
        r = _measure([sys.executable, "-m", "tracekit.cli", "convert", str(REAL_SRC / "tp2_rank0.sqlite"),
                      str(REAL_SRC / "tp2_rank1.sqlite"), "-o", str(out), "-q", "--force"], timeout)
        if r["status"] != "ok":
            raise SystemExit(f"scale: converting {REAL_SRC} failed: {r['status']}")
    return out


def run_real_case(label: str, ranks: int, kernels: int, src: Path, work: Path, *, timeout: float, cores: int | None,
                  hta: bool, counter_tiles: int | None = None) -> RealCase:
    from tile_real import tile_trace, write_kineto

    c = RealCase(label, ranks, kernels)
    d = work / label.replace(" ", "_")
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    trace = d / "trace.parquet"
    info = tile_trace(src, trace, ranks=ranks, kernels=kernels, counter_tiles=counter_tiles)
    c.kernels, c.tiles, c.rows = info.kernels, info.tiles, info.rows
    c.steps_per_rank, c.collectives_per_rank, c.profiler_windows = info.steps_per_rank, info.collectives_per_rank, info.profiler_windows
    c.parquet_mb = round(trace.stat().st_size / 1e6, 1)
    pin = ["taskset", "-c", ",".join(str(i) for i in range(cores))] if cores else []
    tk = pin + [sys.executable, "-m", "tracekit.cli"]
    c.phases["analyze"] = _measure(tk + ["analyze", "--json", str(trace)], timeout, stdout=d / "analyze.json")
    if c.phases["analyze"]["status"] == "ok":
        res = json.loads((d / "analyze.json").read_text())
        c.pcie_phases = sum(1 for _ in res.get("pcie_phases") or [])
        st = res.get("steps") or {}
        c.analyze_summary = {
            "window_reason": res["window"]["reason"],
            "observed_ns_rank0": res["ranks"][0]["window_ns"] if res["ranks"] else None,
            "idle_pct": {str(r["rank"]): round(100 * r["time_ns"]["idle"] / r["window_ns"], 2) for r in res["ranks"] if r["window_ns"]},
            "steps": st.get("count"),
            "collective_instances": (res.get("collectives") or {}).get("instances"),
            "pcie_phase_findings": [f for f in res.get("findings", []) if "PCIe" in str(f)][:1],
        }
    c.phases["scan"] = _measure(pin + [sys.executable, "-c", _SCAN, str(trace)], timeout)
    if hta:
        kdir = d / "kineto"
        write_kineto(trace, kdir)
        c.kineto_mb = round(sum(p.stat().st_size for p in kdir.iterdir()) / 1e6, 1)
        c.phases["tracekit_json"] = _measure(pin + [sys.executable, "-c", _TK_JSON, str(kdir), str(d / "from_json.parquet")],
                                             timeout, stdout=d / "tk_json.out")
        c.phases["tracekit_json"]["result"] = _result_line(d / "tk_json.out")
        c.phases["hta"] = _measure(pin + [sys.executable, "-c", _HTA, str(kdir)], timeout, stdout=d / "hta.out")
        c.phases["hta"]["result"] = _result_line(d / "hta.out")
        shutil.rmtree(kdir, ignore_errors=True)
    return c


def _real_row(c: RealCase) -> str:
    def ph(n: str) -> str:
        p = c.phases.get(n)
        if not p:
            return f"{'-':>17}"
        if p["status"] != "ok":
            return f"{str(p['status'])[:17]:>17}"
        return f"{p['seconds']:>7.1f}s {p['peak_rss_mb']:>7.0f}M"

    return (f"{c.label:<22} {c.ranks:>5} {c.kernels:>10,} {c.rows:>11,} {c.tiles:>5} {c.pcie_phases:>6} {c.parquet_mb:>7.1f}  "
            f"{ph('analyze')}  {ph('scan')}  {ph('tracekit_json')}  {ph('hta')}")


def main_real(a: argparse.Namespace, work: Path) -> int:
    print(f"host: {os.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB; python {sys.version.split()[0]}"
          + (f"; analyze pinned to {a.cores} core(s)" if a.cores else ""))
    src = real_source(work, a.timeout)
    print(f"source: {REAL_SRC} (2 x H200, converted to {src})")
    plan: list[tuple[str, int, int, int | None]] = [(f"{a.ranks}x{s.strip()}", a.ranks, _parse_n(s), None)
                                                    for s in a.sizes.split(",") if s.strip()]
    if a.single:
        plan.append((f"1gpu_{a.single}", 1, _parse_n(a.single), a.single_counter_tiles))
    hta_max = _parse_n(a.hta_max) if a.hta_max else 0
    print(f"{'case':<22} {'ranks':>5} {'kernels':>10} {'rows':>11} {'tiles':>5} {'pcie':>6} {'pq MB':>7}  "
          f"{'analyze':>17}  {'lazy scan':>17}  {'tk convert+analyze':>17}  {'HTA load+tb+idle':>17}")
    results: list[RealCase] = []
    t_start = time.perf_counter()
    for label, ranks, kernels, ct in plan:
        if time.perf_counter() - t_start > a.budget:
            print(f"{label:<22} skipped (--budget {a.budget:.0f}s spent)")
            continue
        c = run_real_case(label, ranks, kernels, src, work, timeout=a.timeout, cores=a.cores, hta=kernels <= hta_max,
                          counter_tiles=ct)
        results.append(c)
        print(_real_row(c), flush=True)
        print(f"      steps/rank {c.steps_per_rank:,}, collectives/rank {c.collectives_per_rank:,}, profiler windows "
              f"{c.profiler_windows:,}; analyze: {json.dumps(c.analyze_summary)[:400]}", flush=True)
        for n in ("tracekit_json", "hta"):
            p = c.phases.get(n)
            if p and p.get("result"):
                print(f"      {n}: {json.dumps(p['result'])[:400]}", flush=True)
        if not a.keep:
            shutil.rmtree(work / label.replace(" ", "_"), ignore_errors=True)
    by = {c.label: c for c in results}
    big = [c for c in results if c.ranks == a.ranks and c.phases.get("analyze", {}).get("status") == "ok"]
    if len(big) >= 2:
        lo, hi = big[-2], big[-1]
        f = hi.kernels / lo.kernels
        t = float(hi.phases["analyze"]["seconds"]) / float(lo.phases["analyze"]["seconds"])
        m = float(hi.phases["analyze"]["peak_rss_mb"]) / float(lo.phases["analyze"]["peak_rss_mb"])
        print(f"growth {lo.label} -> {hi.label} ({f:.2f}x kernels): analyze time {t:.2f}x, peak memory {m:.2f}x")
    for c in results:
        p, h = c.phases.get("analyze"), c.phases.get("hta")
        if p and h and p["status"] == "ok" and h["status"] == "ok":
            tj = c.phases["tracekit_json"]
            print(f"{c.label}: HTA (load + temporal + idle) {h['seconds']:.1f} s / {h['peak_rss_mb']:.0f} MB; tracekit convert+analyze "
                  f"of the same JSON {tj['seconds']:.1f} s / {tj['peak_rss_mb']:.0f} MB ({h['seconds'] / tj['seconds']:.1f}x faster, "
                  f"{tj['peak_rss_mb'] / h['peak_rss_mb']:.2f}x the memory); analyze of trace.parquet {p['seconds']:.1f} s / "
                  f"{p['peak_rss_mb']:.0f} MB")
    if a.json:
        Path(a.json).write_text(json.dumps({"cases": [asdict(c) for c in results]}, indent=1, default=str))
    del by
    return 0



def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--synthetic", action="store_true", help="the older synthetic-Kineto cases instead of tiled real captures")
    ap.add_argument("--sizes", default=None, help="total kernels per case (k/M suffixes; default 1M,4M real, 1M,4M,16M synthetic)")
    ap.add_argument("--single", default="566k", help="real mode: kernels of the single-GPU case ('' to skip)")
    ap.add_argument("--single-counter-tiles", type=int, default=5,
                    help="real mode: tiles of the single-GPU case that keep GPU-metrics counters (about 90 PCIe phases each)")
    ap.add_argument("--cores", type=int, default=2, help="real mode: pin each measured process to this many cores (0: no pinning)")
    ap.add_argument("--hta-max", default="1M", help="real mode: run HTA and tracekit-on-JSON for cases up to this many kernels")
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--rank64", default=None, help="total kernels of the 64-rank case ('' to skip)")
    ap.add_argument("--workdir", default=None, help="scratch directory (default: a temp dir)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per phase")
    ap.add_argument("--budget", type=float, default=3600.0, help="seconds for the whole run; later cases are skipped")
    ap.add_argument("--keep", action="store_true", help="keep the generated JSON")
    ap.add_argument("--json", default=None, help="also write the results here")
    a = ap.parse_args(argv)
    work = Path(a.workdir) if a.workdir else Path(os.environ.get("TMPDIR", "/tmp")) / "tracekit-scale"
    work.mkdir(parents=True, exist_ok=True)
    if not a.synthetic:
        a.sizes = "1M,4M" if a.sizes is None else a.sizes  # --sizes '': the single-GPU case only
        a.cores = a.cores or None
        return main_real(a, work)
    a.sizes = a.sizes or "1M,4M,16M"
    a.rank64 = "1M" if a.rank64 is None else a.rank64
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
