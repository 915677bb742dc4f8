"""Speed and memory on REAL traces (issue 28), every figure from one run on the same input.

Input: one real Kineto trace (``--trace``, .json or .json.gz; e.g. the 218 MB transformers MoE decode
loop with eager experts, cut from a device capture by ``tile_real.cut_kineto_json``). Prints:

1. **floors**: inflating the .gz (ISA-L, as tracekit reads it, and zlib), and reading the plain text;
2. per input (the real rank; ``--ranks N``: the same file as N ranks, rank<N>.json links):
   tracekit ``convert`` and ``analyze`` (each a fresh process, as a user runs them), HTA
   (``traceinsight``: load + temporal breakdown + idle time breakdown, the issue's baseline) —
   CPU seconds (user+sys of the process tree), wall seconds, peak RSS of the process tree (sampled
   every 20 ms); convert MB of JSON per CPU-second, in-process too (imports excluded); the ratios; and
   the one command a user can run instead, ``tracekit analyze DIR`` on the JSON files themselves
   (converted in the same process, ``tracekit.commands._source``);
3. **analyze memory by rank count**: the converted real rank copied to 1, 2, 4, 8 (and ``--many``)
   ranks (``tile_real.tile_trace``: one copy per rank, collectives grouped), analyze peak RSS and CPU.

The box is shared: CPU seconds are the figure to compare (wall times grow with other load; the load
average is printed).

    python benchmarks/real.py --trace /work/bigtraces/eager_217.json.gz --ranks 8 --many 64
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
import zlib
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from convert import measure_child  # noqa: E402 - the benchmarks' child runner (process-tree RSS sampler)

__all__ = ["main"]


# ---- child side (a fresh process per measurement) ------------------------------------------------


#: the CLI command each tracekit child stands for (its allocator setting: tracekit._memory.configure_env)
_AS_CLI = {"convert": "convert", "analyze": "analyze", "analyze-json": "analyze", "analyze-core": "analyze", "read": "convert"}


def _child(argv: list[str]) -> int:
    what, t0 = argv[0], time.perf_counter()
    if what in _AS_CLI:  # before polars loads, as `tracekit <command> <input>` sets it
        from tracekit._memory import configure_env

        configure_env(["tracekit", _AS_CLI[what], argv[-1]])  # the input is the last argument of every child
    c0 = time.process_time()
    info: dict[str, Any] = {}
    if what == "convert":
        from tracekit.ingest.convert import convert

        c1 = time.process_time()
        res = convert(argv[2:], argv[1], force=True)
        info = {"rows": res.rows, "ranks": len(res.ranks), "inproc_cpu_s": time.process_time() - c1, "import_cpu_s": c1 - c0}
    elif what == "analyze":
        from tracekit.api import analyze

        c1 = time.process_time()
        res = analyze(argv[1])
        info = {"ranks": len(res["ranks"]), "inproc_cpu_s": time.process_time() - c1, "import_cpu_s": c1 - c0,
                "idle_pct": [round(100 * r["time_ns"].get("idle", 0) / max(r["window_ns"], 1), 2) for r in res["ranks"]][:2]}
    elif what == "analyze-json":  # one command on the profiler's files: `tracekit analyze DIR` converts them in-process
        from tracekit.api import analyze
        from tracekit.commands._source import trace_source

        c1 = time.process_time()
        with trace_source(Path(argv[1])) as parquet:
            res = analyze(parquet)
        info = {"ranks": len(res["ranks"]), "inproc_cpu_s": time.process_time() - c1, "import_cpu_s": c1 - c0}
    elif what == "analyze-core":  # the same analyses without the next-win replay (advice layer), for the breakdown
        from tracekit.analysis.stage.pipeline import ScanSource, run_analysis
        from tracekit.schema import read_metadata, scan_trace

        c1 = time.process_time()
        res = run_analysis(ScanSource(argv[1], scan_trace(argv[1])), read_metadata(argv[1])).to_json()
        info = {"ranks": len(res["ranks"]), "inproc_cpu_s": time.process_time() - c1, "import_cpu_s": c1 - c0}
    elif what == "read":
        from tracekit.ingest import kscan
        from tracekit.ingest.kineto import read_kineto

        kscan.available()  # loaded (built on the first use ever) before the clock starts
        c1, w1 = time.process_time(), time.perf_counter()
        df, _ = read_kineto(argv[1])
        info = {"rows": df.height, "inproc_cpu_s": time.process_time() - c1, "inproc_wall_s": time.perf_counter() - w1}
    elif what == "hta":
        import logging

        logging.disable(logging.WARNING)
        from hta.trace_analysis import TraceAnalysis

        ta = TraceAnalysis(trace_dir=argv[1])
        tb = ta.get_temporal_breakdown(visualize=False)
        ta.get_idle_time_breakdown(visualize=False)
        info = {"ranks": len(ta.t.traces), "idle_pct": [round(float(x), 2) for x in tb["idle_time_pctg"].tolist()][:2]}
    me, ch = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    info.update(wall_s=time.perf_counter() - t0, cpu_s=me.ru_utime + me.ru_stime + ch.ru_utime + ch.ru_stime)
    print("RESULT " + json.dumps(info))
    return 0


def _measure(args: list[str], timeout: float, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run one child, sampling the RSS of its whole process tree; its RESULT line plus the peak."""
    return measure_child(Path(__file__).resolve(), args, timeout, env, peak_key="peak_mb")


# ---- floors ----------------------------------------------------------------------------------------


def floors(trace: Path) -> dict[str, float]:
    """MB of JSON per CPU-second: inflating the .gz with ISA-L (tracekit's inflater) and zlib, reading the text."""
    from tracekit.ingest.kineto_stream import iter_text

    out: dict[str, float] = {}
    t = time.process_time()
    n = sum(len(p) for p in iter_text(trace))
    out["json_mb"] = n / 1e6
    if trace.name.endswith(".gz"):
        out["isal_inflate_mb_per_cpu_s"] = n / 1e6 / (time.process_time() - t)
        t = time.process_time()
        d = zlib.decompressobj(31)
        with open(trace, "rb") as f:
            while b := f.read(1 << 20):
                d.decompress(b)
        out["zlib_inflate_mb_per_cpu_s"] = n / 1e6 / (time.process_time() - t)
    return out


def _plain(trace: Path, work: Path) -> Path:
    """The trace's text as a plain .json (HTA and the N-rank links read it; tracekit reads either)."""
    if not trace.name.endswith(".gz"):
        return trace
    from tracekit.ingest.kineto_stream import iter_text

    out = work / trace.name[:-3]
    if not out.exists():
        with open(out.with_suffix(".tmp"), "wb") as f:
            for p in iter_text(trace):
                f.write(p)
        os.replace(out.with_suffix(".tmp"), out)
    return out


def _rank_dir(plain: Path, work: Path, ranks: int) -> Path:
    """``ranks`` copies of one real rank, each with its own ``distributedInfo.rank`` (HTA keys ranks on it)."""
    from tile_real import tile_kineto_json

    d = work / f"{plain.stem}-x{ranks}"
    d.mkdir(parents=True, exist_ok=True)
    for r in range(ranks):
        p = d / f"rank{r}.json"
        if not p.exists():
            tile_kineto_json(plain, p.with_suffix(".tmp"), copies=1, rank=r, world_size=ranks)
            os.replace(p.with_suffix(".tmp"), p)
    return d


def _fmt(r: dict[str, Any]) -> str:
    if "error" in r:
        return f"FAILED: {r['error']}"
    return f"{r['cpu_s']:7.2f} CPU-s  {r['proc_wall_s']:7.2f} s wall  {r['peak_mb']:6.0f} MB peak"


#: environment of the HTA child only (``--hta-path``: HTA installed with ``pip install --target``, so its pandas and
#: numpy never enter tracekit's processes)
_HTA_ENV: dict[str, str] | None = None


def compare(label: str, src: Path, json_mb: float, work: Path, timeout: float, hta: bool) -> dict[str, Any]:
    """convert + analyze (tracekit) and load + temporal + idle (HTA) on the same directory of rank files; prints the ratios."""
    out = work / f"{src.name}.parquet"
    conv = _measure(["convert", str(out), str(src)], timeout)
    an = _measure(["analyze", str(out)], timeout) if "error" not in conv else {"error": "no trace.parquet"}
    h = _measure(["hta", str(src)], timeout, env=_HTA_ENV) if hta else {"error": "skipped"}
    print(f"\n{label}: {json_mb:.1f} MB of JSON")
    print(f"  tracekit convert  {_fmt(conv)}")
    if "error" not in conv:
        print(f"                    {json_mb / conv['cpu_s']:.1f} MB/CPU-s (process), {json_mb / conv['inproc_cpu_s']:.1f} MB/CPU-s "
              f"in-process ({conv['import_cpu_s']:.2f} CPU-s of imports excluded); {conv['rows']:,} rows")
    core = _measure(["analyze-core", str(out)], timeout) if "error" not in conv else {"error": "no trace.parquet"}
    print(f"  tracekit analyze  {_fmt(an)}")
    print(f"    without next win {_fmt(core)} (the what-if replay of the advice layer left out)")
    one = _measure(["analyze-json", str(src)], timeout)
    print(f"  tracekit analyze DIR (one command: converted in-process, lz4 temporary) {_fmt(one)}")
    print(f"  HTA               {_fmt(h)}")
    row: dict[str, Any] = {"label": label, "json_mb": json_mb, "convert": conv, "analyze": an, "analyze_core": core,
                           "analyze_json": one, "hta": h}
    if "error" not in conv and "error" not in an and "error" not in h:
        cpu = conv["cpu_s"] + an["cpu_s"]
        wall = conv["proc_wall_s"] + an["proc_wall_s"]
        peak = max(conv["peak_mb"], an["peak_mb"])
        print(f"  ratio             HTA / tracekit: CPU {h['cpu_s'] / cpu:.1f}x, wall {h['proc_wall_s'] / wall:.1f}x; tracekit peak "
              f"= {peak / h['peak_mb']:.2f}x HTA's (targets: >= 10x CPU, <= 0.5x memory); idle % tracekit "
              f"{an.get('idle_pct')} HTA {h.get('idle_pct')}")
        row["ratios"] = {"cpu": h["cpu_s"] / cpu, "wall": h["proc_wall_s"] / wall, "memory": peak / h["peak_mb"]}
        if "error" not in core:
            c2 = conv["cpu_s"] + core["cpu_s"]
            print(f"                    without next win: CPU {h['cpu_s'] / c2:.1f}x, peak {max(conv['peak_mb'], core['peak_mb']) / h['peak_mb']:.2f}x")
            row["ratios"]["cpu_without_next_win"] = h["cpu_s"] / c2
        if "error" not in one:
            print(f"                    one command: CPU {h['cpu_s'] / one['cpu_s']:.1f}x, wall {h['proc_wall_s'] / one['proc_wall_s']:.1f}x, "
                  f"peak {one['peak_mb'] / h['peak_mb']:.2f}x HTA's")
            row["ratios"].update(cpu_one_command=h["cpu_s"] / one["cpu_s"], memory_one_command=one["peak_mb"] / h["peak_mb"])
    return row


def memory_by_ranks(parquet: Path, counts: list[int], work: Path, timeout: float) -> list[dict[str, Any]]:
    """Analyze peak RSS and CPU for the real rank copied to each rank count (one copy per rank)."""
    import polars as pl
    from tile_real import tile_trace

    from tracekit.schema import scan_trace

    kernels = int(scan_trace(parquet).filter(pl.col("kind") == "kernel").select(pl.len()).collect().item())
    rows = []
    print("\nanalyze memory by rank count (the real rank copied per rank):")
    for n in counts:
        out = work / f"{parquet.stem}-r{n}.parquet"
        if not out.exists():
            tile_trace(parquet, out, ranks=n, kernels=n * kernels)
        r = _measure(["analyze", str(out)], timeout)
        rows.append({"ranks": n, **r})
        base = rows[0].get("peak_mb") if "error" not in rows[0] else None
        rel = f" = {r['peak_mb'] / base:.2f}x one rank's" if base and "error" not in r else ""
        print(f"  {n:4d} ranks  {_fmt(r)}{rel}")
    return rows


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return _child(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, required=True, help="a real Kineto trace (.json or .json.gz)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/tracekit-real"), help="scratch directory")
    ap.add_argument("--ranks", type=int, default=8, help="also compare on this many copies of the real rank (0: no)")
    ap.add_argument("--memory", default="1,2,4,8", help="rank counts for the analyze memory table ('' : skip)")
    ap.add_argument("--many", type=int, default=0, help="add this rank count to the memory table (e.g. 64)")
    ap.add_argument("--skip-hta", action="store_true")
    ap.add_argument("--hta-path", type=Path, help="a directory holding traceinsight (pip install --target DIR "
                    "traceinsight==0.6.1), put on PYTHONPATH for the HTA child alone")
    ap.add_argument("--timeout", type=float, default=1500.0, help="per measurement, seconds")
    ap.add_argument("--json", type=Path, help="write every figure here")
    a = ap.parse_args(argv)
    global _HTA_ENV
    if a.hta_path is not None:
        _HTA_ENV = {"PYTHONPATH": os.pathsep.join([str(a.hta_path), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    a.work.mkdir(parents=True, exist_ok=True)
    # tracekit's bytecode, as `pip install` writes it (HTA's and the libraries' were written when they were installed):
    # without it, a checkout run with PYTHONDONTWRITEBYTECODE=1 compiles every tracekit module in every process
    import compileall

    compileall.compile_dir(str(HERE.parent / "tracekit"), quiet=1)
    fl = floors(a.trace)
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; {a.trace} = {fl['json_mb']:.1f} MB of JSON")
    if "isal_inflate_mb_per_cpu_s" in fl:
        print(f"floor: inflating the .gz: ISA-L {fl['isal_inflate_mb_per_cpu_s']:.0f} MB/CPU-s, zlib {fl['zlib_inflate_mb_per_cpu_s']:.0f} MB/CPU-s")
    for t in (1, 2):  # one file split across cores: the parse threads (CPU stays, wall drops on an idle box)
        r = _measure(["read", str(a.trace)], a.timeout, env={"TRACEKIT_PARSE_THREADS": str(t)})
        if "error" not in r:
            print(f"read_kineto, {t} parse thread(s): {r['inproc_cpu_s']:.2f} CPU-s, {r['inproc_wall_s']:.2f} s wall in-process = "
                  f"{fl['json_mb'] / r['inproc_cpu_s']:.0f} MB/CPU-s, {fl['json_mb'] / r['inproc_wall_s']:.0f} MB/s; peak {r['peak_mb']:.0f} MB")
            fl[f"read_{t}_threads_cpu_s"], fl[f"read_{t}_threads_wall_s"] = r["inproc_cpu_s"], r["inproc_wall_s"]
    plain = _plain(a.trace, a.work)  # both tools read the same plain files, each with its distributedInfo.rank
    rows = [compare("real, 1 rank", _rank_dir(plain, a.work, 1), fl["json_mb"], a.work, a.timeout, not a.skip_hta)]
    if a.ranks > 1:
        rows.append(compare(f"real x {a.ranks} ranks", _rank_dir(plain, a.work, a.ranks), fl["json_mb"] * a.ranks, a.work, a.timeout,
                            not a.skip_hta))
    mem: list[dict[str, Any]] = []
    counts = [int(x) for x in a.memory.split(",") if x] + ([a.many] if a.many else [])
    one = a.work / f"{a.trace.name.split('.')[0]}-x1.parquet"
    if counts and one.exists():
        mem = memory_by_ranks(one, counts, a.work, a.timeout)
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (wall times include other load)")
    if a.json:
        a.json.write_text(json.dumps({"floors": fl, "compare": rows, "memory": mem}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
