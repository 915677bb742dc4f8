"""Replay speed on a synthetic trace: ``python benchmarks/replay.py [--ops 1000000] [--ranks 2]``.

Builds a schema-conformant frame (vectorized) of R ranks × (ops/R) GPU ops: one
launch call per op, a stream-synchronize and a step range every 1,000 ops, an
allreduce every 20 ops (matched across ranks), then times graph build,
scheduling and one simulation (the what-if cost), and prints the figures.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import polars as pl

from tracekit.replay.api import Replayer
from tracekit.replay.simulate import inputs_from_graph
from tracekit.schema import conform


def synth(n_ops: int, ranks: int, per_step: int = 1000, coll_every: int = 20) -> pl.DataFrame:
    frames = []
    n = n_ops // ranks
    t0 = 1_700_000_000_000_000_000
    for r in range(ranks):
        i = np.arange(n)
        step = i // per_step
        # host: one launch every 6 µs (+ a sync per step), kernels 5 µs (balanced)
        launch_ts = t0 + i * 6_000 + step * 20_000 + r * 500
        k_ts = launch_ts + 4_000
        k_dur = np.full(n, 5_000)
        is_coll = (i % coll_every) == coll_every - 1
        corr = i + 1
        kern = pl.DataFrame({
            "rank": r, "kind": "kernel", "ts_ns": k_ts, "dur_ns": k_dur, "stream": 7, "device": r,
            "name": np.where(is_coll, "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "gemm_kernel"),
            "category": np.where(is_coll, "communication", "dense_gemm"),
            "family": np.where(is_coll, "allreduce.nccl", "gemm.dense"),
            "correlation": corr, "launch_ts_ns": launch_ts, "launch_dur_ns": 3_000, "launch_tid": 1,
            "launch_name": "cudaLaunchKernel", "step_id": step,
        }).with_columns(
            pl.when(pl.Series(is_coll)).then(pl.lit("allreduce")).alias("coll_name"),
            pl.when(pl.Series(is_coll)).then(pl.lit(4096)).alias("coll_in_nelems"),
            pl.when(pl.Series(is_coll)).then(pl.lit("BFloat16")).alias("coll_dtype"),
            pl.when(pl.Series(is_coll)).then(pl.lit(ranks)).alias("coll_group_size"),
        )
        rt = pl.DataFrame({"rank": r, "kind": "runtime", "ts_ns": launch_ts, "dur_ns": 3_000, "tid": 1,
                           "name": "cudaLaunchKernel", "correlation": corr, "step_id": step})
        n_steps = int(step.max()) + 1
        s_start = t0 + np.arange(n_steps) * (per_step * 6_000 + 20_000) + r * 500 - 1_000
        last_k = k_ts[np.minimum((np.arange(n_steps) + 1) * per_step - 1, n - 1)] + 5_000
        sync_ts = launch_ts[np.minimum((np.arange(n_steps) + 1) * per_step - 1, n - 1)] + 3_500
        sync_dur = np.maximum(last_k + 2_000 - sync_ts, 2_000)
        sy = pl.DataFrame({"rank": r, "kind": "runtime", "ts_ns": sync_ts, "dur_ns": sync_dur, "tid": 1,
                           "name": "cudaStreamSynchronize", "correlation": 10_000_000 + np.arange(n_steps)})
        st = pl.DataFrame({"rank": r, "kind": "step", "ts_ns": s_start, "dur_ns": sync_ts + sync_dur + 1_000 - s_start,
                           "tid": 1, "name": "tk.fwd[DECODE bs=64 tok=64]", "step_id": np.arange(n_steps),
                           "step_mode": "DECODE", "tokens": 64, "profiled": True, "src": "user_annotation"})
        frames += [conform(kern), conform(rt), conform(sy), conform(st)]
    return pl.concat(frames).sort(["rank", "ts_ns"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", type=int, default=1_000_000)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--acceptance", help="folder of capture fixtures (loop, grouped, ...): run the §9 protocol")
    a = ap.parse_args()
    if a.acceptance:
        rows = acceptance(a.acceptance)
        print_table(rows)
        return
    df = synth(a.ops, a.ranks)
    t = time.perf_counter()
    rp = Replayer(df)
    t_build = time.perf_counter() - t
    g = rp.g
    t = time.perf_counter()
    x, _st, _res = rp.step_series(inputs_from_graph(g, 1.0))
    t_sim = time.perf_counter() - t
    obs = rp.observed_series()
    err = abs(np.median(x) - np.median(obs)) / np.median(obs)
    print(f"{g.ops.height:,} GPU ops, {g.n_vertices:,} vertices, {g.n_edges:,} edges, {g.instances.height:,} "
          f"collective instances, {a.ranks} ranks")
    print(f"graph build + schedule: {t_build:.2f} s; one replay (simulate + step times): {t_sim:.2f} s "
          f"({t_sim / g.n_edges * 1e9:.0f} ns/edge); self-replay error {err:.2e}")



# ----------------------------------------------------------------------------- acceptance protocol

VARIANTS = ("loop", "grouped", "grouped_p2p_off", "straggler", "graphs")


def acceptance(folder: str) -> list[dict]:
    """Run replay_model.md §9 (:mod:`tracekit.replay.acceptance`) on a folder of capture fixtures."""
    from pathlib import Path

    from tracekit.replay.acceptance import acceptance_rows
    from tracekit.schema import read_trace

    traces = {}
    for n in VARIANTS:
        p = Path(folder) / f"{n}.trace.parquet"
        if p.exists():
            traces[n] = read_trace(p)
    return acceptance_rows(traces)


def print_table(rows: list[dict]) -> None:
    def pct(x):
        return "-" if x is None or x != x else f"{x:+.2f} %"

    print("| what-if | predicted ms | measured ms | error | noise | result |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        noise = "-" if r.get("noise") is None else f"{r['noise']:.2%}"
        meas = f"{r['measured_ns'] / 1e6:.3f} ({r['measured_is']})"
        print(f"| {r['what_if']} | {r['predicted_ns'] / 1e6:.3f} | {meas} | {pct(r['error'] * 100)} | {noise} | "
              f"{r['status']} |")
    print()
    for r in rows:
        if r["kind"] == "self":
            print(f"  {r['what_if']}: calibration scale {r['scale']:.3f}, calibrated replay vs unprofiled "
                  f"{pct((r['calibrated_error'] or 0) * 100)} (unprofiled {r['measured_unprofiled_ns'] / 1e6:.3f} ms)")
    for r in rows:
        if r["kind"] != "self":
            sh = ", ".join(f"{s['tokens']} tok {s['predicted_ns'] / 1e6:.3f}/{s['measured_ns'] / 1e6:.3f} ms "
                           f"{s['error']:+.1%}" for s in r.get("by_shape", []))
            print(f"  {r['what_if']}: predicted change {r['predicted_change']:+.1%}, measured change "
                  f"{r['measured_change']:+.1%}; per shape {sh}")
            for n in r.get("notes", []):
                print(f"      note: {n}")
            if r.get("cause"):
                print(f"      cause: {r['cause']}")


if __name__ == "__main__":
    main()
