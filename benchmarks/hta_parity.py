"""Idle and communication fractions: tracekit vs HolisticTraceAnalysis (traceinsight) on the same traces and window.

For every case HTA loads the trace (``TraceAnalysis(trace_dir=...)``, its defaults: the
last ProfilerStep is dropped, ns timestamps are floored to µs). Per rank we take HTA's
own window — first GPU op start to last GPU op end among the ops it kept — and:

* ``idle_pct``: HTA ``get_temporal_breakdown`` idle_time / kernel_time;
* ``comm_exposed_pct``: time where only communication kernels run (HTA's kernel-type
  overlap state ``COMMUNICATION``, from the same routine ``get_gpu_kernel_breakdown``
  uses) / kernel_time — the definition of tracekit's exclusive ``communication``
  bucket (compute and memory win over communication);
* ``comm_any_pct``: every state containing COMMUNICATION / kernel_time (HTA's
  inclusive view; for the record).

tracekit converts the same files, then ``tracekit.api.analyze(trace, ranks=[r],
window=<HTA's window>, trim_transient=False, cross_rank=False)`` gives ``idle`` and
``communication`` over exactly that window. Two more tracekit columns explain any gap:
"µs-rounded" applies HTA's rounding of ns timestamps (start ceiled, end floored to µs) to
tracekit's ops, "HTA-emulated" also keeps only the ops HTA keeps (launched by a runtime call
present in the trace, before the last ProfilerStep). With ``--record`` the HTA side is stored in
``tests/golden/expected/hta_<case>.json`` so the golden test needs no traceinsight.

    python benchmarks/hta_parity.py              # compare, print a table
    python benchmarks/hta_parity.py --record     # also (re)write the HTA expectations
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["CASES", "hta_side", "tracekit_side", "main"]

HTA_DIR = Path("/work/shared/traces/hta")
EXPECTED = Path(__file__).resolve().parents[1] / "tests" / "golden" / "expected"

#: case name -> directory (relative to the HTA traces) holding one capture
CASES = {
    "trace_filter": "trace_filter",
    "nccl_parser_config": "nccl_parser_config",
    "df_index_resolver": "df_index_resolver",
    "negative_queue_length": "negative_queue_length_values_check",
    "ns_resolution_trace": "ns_resolution_trace",
    "trace_diff_control": "trace_diff/control",
    "trace_diff_test": "trace_diff/test",
}


def hta_side(trace_dir: Path) -> dict[str, Any]:
    """Run HTA on one capture directory; per-rank window (absolute ns) and fractions."""
    logging.disable(logging.WARNING)
    from hta.analyzers.breakdown_analysis import BreakdownAnalysis
    from hta.trace_analysis import TraceAnalysis
    from hta.utils.utils import get_kernel_type

    from tracekit.ingest.kineto import read_kineto

    t0 = time.perf_counter()
    ta = TraceAnalysis(trace_dir=str(trace_dir))
    load_s = time.perf_counter() - t0
    tb = ta.get_temporal_breakdown(visualize=False).set_index("rank")
    sym = ta.t.symbol_table.get_sym_table()
    out: dict[str, Any] = {}
    for rank, df in sorted(ta.t.traces.items()):
        g = df[df["stream"].ne(-1)].copy()
        g["kernel_type"] = [get_kernel_type(sym[n]) for n in g["name"]]
        lo, hi = int(g["ts"].min()), int((g["ts"] + g["dur"]).max())
        states = BreakdownAnalysis._get_gpu_kernel_type_time(g, ["COMMUNICATION", "COMPUTATION", "MEMORY"])
        st = dict(zip(states["kernel_type"], (int(x) for x in states["sum"])))
        kt = float(tb.loc[rank, "kernel_time(us)"])
        assert kt == hi - lo, (kt, lo, hi)
        # HTA times are µs relative to the earliest event of all ranks; tracekit's are
        # baseTimeNanoseconds + ts*1000 ns: map HTA's window back to absolute ns
        src = ta.t.trace_files[rank]
        base = read_kineto(src)[1].get("base_time_ns") or 0
        out[str(rank)] = {
            "source": str(Path(src).relative_to(HTA_DIR)),
            "hta_window_ns": [int(base + (lo + int(ta.t.min_ts)) * 1000), int(base + (hi + int(ta.t.min_ts)) * 1000)],
            "base_time_ns": base,
            "hta_gpu_ops": int(len(g)),
            "idle_pct": round(100 * float(tb.loc[rank, "idle_time(us)"]) / kt, 4),
            "comm_exposed_pct": round(100 * st.get("COMMUNICATION", 0) / kt, 4),
            "comm_any_pct": round(100 * sum(v for k, v in st.items() if "COMMUNICATION" in k) / kt, 4),
            "non_compute_pct": round(100 * float(tb.loc[rank, "non_compute_time(us)"]) / kt, 4),
            "kernel_type_states_us": st,
        }
    return {"hta_load_s": round(load_s, 2), "ranks": out}


def tracekit_side(trace_parquet: Path, hta: dict[str, Any]) -> dict[str, Any]:
    """tracekit fractions over HTA's per-rank windows, plus its own full-extent numbers."""
    from tracekit.api import analyze
    from tracekit.schema import read_metadata

    origin = read_metadata(trace_parquet)["window_ns"][0]
    full = {r["rank"]: r for r in analyze(trace_parquet, trim_transient=False, cross_rank=False)["ranks"]}
    out: dict[str, Any] = {}
    for rank_s, h in hta["ranks"].items():
        r = int(rank_s)
        lo, hi = h["hta_window_ns"]
        res = analyze(trace_parquet, ranks=[r], window=f"{lo - origin}ns:{hi - origin}ns", trim_transient=False, cross_rank=False)
        row = res["ranks"][0]
        w = row["window_ns"]
        f = full[r]
        us = _hta_rounded_fractions(trace_parquet, r, h)
        emu = _hta_rounded_fractions(trace_parquet, r, h, hta_ops=True)
        out[rank_s] = {
            "window_ns": w,
            "idle_pct": 100 * row["time_ns"]["idle"] / w,
            "comm_pct": 100 * row["time_ns"]["communication"] / w,
            "memory_pct": 100 * row["time_ns"]["memory"] / w,
            "idle_pct_us_rounded": us[0],
            "comm_pct_us_rounded": us[1],
            "idle_pct_hta_emulated": emu[0],
            "comm_pct_hta_emulated": emu[1],
            "full_window_ns": f["window_ns"],
            "full_idle_pct": 100 * f["time_ns"]["idle"] / f["window_ns"],
            "full_comm_pct": 100 * f["time_ns"]["communication"] / f["window_ns"],
        }
    return out


def _hta_rounded_fractions(trace_parquet: Path, rank: int, h: dict[str, Any], *, hta_ops: bool = False) -> tuple[float, float]:
    """tracekit's breakdown after HTA's µs rounding of ns traces (start ceiled, end floored, in raw trace µs).

    ``hta_ops``: also keep only the GPU ops HTA keeps — those whose launching runtime call is in
    the trace and starts before the last ProfilerStep (HTA's default ``include_last_profiler_step=False``).
    """
    import polars as pl

    from tracekit.analysis.passes.breakdown import compute_breakdown
    from tracekit.core.window import Window
    from tracekit.schema import read_trace

    df, _ = read_trace(trace_parquet, ranks=[rank])
    if hta_ops:
        steps = df.filter((pl.col("kind").cast(pl.String) == "step") & pl.col("name").cast(pl.String).str.starts_with("ProfilerStep"))
        gpu = pl.col("kind").cast(pl.String).is_in(["kernel", "memcpy", "memset"])
        keep = pl.col("launch_ts_ns").is_not_null()
        if steps.height:
            keep = keep & (pl.col("launch_ts_ns") < steps["ts_ns"].max())
        df = df.filter(~gpu | keep)
    base = h["base_time_ns"]
    rel = pl.col("ts_ns") - base
    # HTA parses ts/dur as float64 µs (absolute-epoch µs keep only ~0.25 µs there), then ceils the
    # start and floors the end: reproduce the float64 value of the decimal text, then round as HTA
    ts_f = (rel // 1000).cast(pl.Float64) + (rel % 1000).cast(pl.Float64) / 1000.0
    end_f = ts_f + pl.col("dur_ns").cast(pl.Float64) / 1000.0
    start = ts_f.ceil().cast(pl.Int64) * 1000
    end = end_f.floor().cast(pl.Int64) * 1000
    df = df.with_columns((start + base).alias("ts_ns"), pl.max_horizontal(end - start, pl.lit(0)).alias("dur_ns"))
    lo, hi = h["hta_window_ns"]
    t = compute_breakdown(df, Window(lo, hi)).table.row(0, named=True)
    return 100 * t["idle"] / t["window_ns"], 100 * t["communication"] / t["window_ns"]


def _convert(trace_dir: Path, out: Path) -> None:
    from tracekit.ingest.convert import convert

    convert([trace_dir], out, force=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", action="store_true", help="write tests/golden/expected/hta_<case>.json")
    ap.add_argument("--from-recorded", action="store_true", help="use the HTA numbers in tests/golden/expected (no traceinsight)")
    ap.add_argument("cases", nargs="*", default=list(CASES))
    a = ap.parse_args(argv)
    if a.from_recorded:
        import types

        hta = types.SimpleNamespace(version=types.SimpleNamespace(__version__="recorded"))
    else:
        import hta.version

    cmd = "python benchmarks/hta_parity.py --record " + " ".join(a.cases)
    print(f"traceinsight {hta.version.get_version() if hasattr(hta.version, 'get_version') else getattr(hta.version, '__version__', '?')}")
    hdr = (f"{'case':<24}{'rank':>5} {'HTA idle%':>10}{'tk idle%':>10}{'Δ':>7} {'HTA comm%':>10}{'tk comm%':>10}{'Δ':>7} "
           f"{'Δ idle/comm, µs-rounded':>24} {'Δ idle/comm, HTA-emulated':>26} {'HTA comm∪%':>11} {'tk full-extent idle/comm%':>26}")
    print(hdr)
    with tempfile.TemporaryDirectory() as tmp:
        for case in a.cases:
            d = HTA_DIR / CASES[case]
            h = json.loads((EXPECTED / f"hta_{case}.json").read_text()) if a.from_recorded else hta_side(d)
            pq = Path(tmp) / f"{case}.parquet"
            _convert(d, pq)
            t = tracekit_side(pq, h)
            for rank_s, hr in h["ranks"].items():
                tr = t[rank_s]
                print(f"{case:<24}{rank_s:>5} {hr['idle_pct']:>10.2f}{tr['idle_pct']:>10.2f}{tr['idle_pct'] - hr['idle_pct']:>7.2f} "
                      f"{hr['comm_exposed_pct']:>10.2f}{tr['comm_pct']:>10.2f}{tr['comm_pct'] - hr['comm_exposed_pct']:>7.2f} "
                      f"{tr['idle_pct_us_rounded'] - hr['idle_pct']:>12.2f}/{tr['comm_pct_us_rounded'] - hr['comm_exposed_pct']:<11.2f} "
                      f"{tr['idle_pct_hta_emulated'] - hr['idle_pct']:>13.2f}/{tr['comm_pct_hta_emulated'] - hr['comm_exposed_pct']:<12.2f} "
                      f"{hr['comm_any_pct']:>11.2f} {tr['full_idle_pct']:>13.2f}/{tr['full_comm_pct']:<12.2f}", flush=True)
            if a.record and not a.from_recorded:
                EXPECTED.mkdir(parents=True, exist_ok=True)
                doc = {"case": case, "trace_dir": CASES[case], "command": cmd,
                       "tool": "traceinsight (HTA) TraceAnalysis(trace_dir=...) defaults: last ProfilerStep dropped, ts floored to µs",
                       **h}
                (EXPECTED / f"hta_{case}.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
