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
        for r in rows:
            for n in r.get("notes", []):
                print(f"  {r['what_if']}: {n}")
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


def _class_ratio(base_df: pl.DataFrame, tgt_df: pl.DataFrame, category: str) -> float:
    """Ratio of the median per-step summed duration of a category (target / base); transfers for communication."""
    from tracekit.replay.graph import build_graph

    def per_step(df: pl.DataFrame) -> float:
        g = build_graph(df)
        if category == "communication":
            return float(g.instances.get_column("transfer_ns").median() or 0)
        o = g.ops.filter((pl.col("category") == category) & (pl.col("step_ord") >= 0))
        return float(o.group_by(["rank", "step_ord"]).agg(pl.col("dur").sum()).get_column("dur").median() or 0)

    b = per_step(base_df)
    return per_step(tgt_df) / b if b else 1.0


def acceptance(folder: str) -> list[dict]:
    """Run replay_model.md §9 on the capture helper's fixtures; returns table rows."""
    from pathlib import Path

    from tracekit.replay import replay
    from tracekit.replay.calibrate import unprofiled_timing
    from tracekit.schema import read_trace

    files = {p.stem: p for p in sorted(Path(folder).glob("*.parquet"))}

    def find(name: str):
        hits = [p for s, p in files.items() if s == name or s.endswith(name) or s.startswith(name + ".")]
        return read_trace(hits[0]) if hits else None

    traces = {n: find(n) for n in ("loop", "grouped", "grouped_p2p_off", "straggler", "graphs")}
    rows: list[dict] = []
    for n, t in traces.items():
        if t is None:
            continue
        r = replay(t[0], t[1])
        b = r.baseline
        rows.append({"what_if": f"self-replay {n}", "predicted_ms": b["self_replay_step_ns_p50"] / 1e6,
                     "measured_ms": b["profiled_step_ns_p50"] / 1e6, "error": b["self_replay_error"],
                     "noise": r.noise["relative"] if r.noise else None, "scale": r.calibration_scale,
                     "calibrated_error": b["calibrated_error"]})

    def case(label: str, base: str, tgt: str, specs: list[str], oracle: bool) -> None:
        if traces.get(base) is None or traces.get(tgt) is None:
            return
        bdf, bmeta = traces[base]
        tdf, tmeta = traces[tgt]
        r = replay(bdf, bmeta, specs, durations_from=tdf if oracle else None)
        mode = r.baseline["step_mode"]
        unp = unprofiled_timing(tdf, tmeta, mode)
        measured = unp.p50 if unp else float("nan")
        noise = max(x for x in (unp.noise if unp else None, r.noise["relative"] if r.noise else None, 0.0)
                    if x is not None)
        for p in r.what_if:
            rows.append({"what_if": f"{label}: {p.spec}", "predicted_ms": p.step_ns_p50 / 1e6,
                         "measured_ms": measured / 1e6, "error": p.step_ns_p50 / measured - 1,
                         "noise": noise, "baseline_ms": r.baseline["step_ns_p50"] / 1e6,
                         "measured_baseline_ms": r.baseline["measured_step_ns_p50"] / 1e6, "scale": r.calibration_scale,
                         "notes": p.notes})

    if traces.get("loop") and traces.get("grouped"):
        ratio = _class_ratio(traces["loop"][0], traces["grouped"][0], "moe_gemm")
        case("loop → grouped", "loop", "grouped", [f"moe_gemm={ratio:.4f}"], True)
        ratio = _class_ratio(traces["grouped"][0], traces["loop"][0], "moe_gemm")
        case("grouped → loop", "grouped", "loop", [f"moe_gemm={ratio:.4f}"], True)
    if traces.get("grouped") and traces.get("grouped_p2p_off"):
        ratio = _class_ratio(traces["grouped"][0], traces["grouped_p2p_off"][0], "communication")
        case("NCCL default → host memory", "grouped", "grouped_p2p_off", [f"communication={ratio:.4f}"], True)
        ratio = _class_ratio(traces["grouped_p2p_off"][0], traces["grouped"][0], "communication")
        case("host memory → NCCL default", "grouped_p2p_off", "grouped", [f"communication={ratio:.4f}"], True)
    if traces.get("grouped") and traces.get("graphs"):
        case("eager → CUDA graph", "grouped", "graphs", ["cuda-graph"], False)
    return rows


def print_table(rows: list[dict]) -> None:
    def f(x, pct=False):
        if x is None or x != x:
            return "-"
        return f"{x:+.2%}" if pct else f"{x:.3f}"

    print("| what-if | predicted ms | measured ms | error | noise |")
    print("|---|---|---|---|---|")
    for r in rows:
        noise = "-" if r.get("noise") is None else f"{r['noise']:.2%}"
        print(f"| {r['what_if']} | {f(r['predicted_ms'])} | {f(r['measured_ms'])} | {f(r['error'], True)} | {noise} |")


if __name__ == "__main__":
    main()
