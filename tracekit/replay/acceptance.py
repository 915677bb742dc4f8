"""The acceptance protocol of replay_model.md §9 on a set of capture fixtures (pure; no IO).

:func:`acceptance_rows` takes the traces of the built-in workload's variants
(``loop``, ``grouped``, ``grouped_p2p_off``, ``straggler``, ``graphs``; any
subset) and returns one row per comparison:

* self-replay of every trace (uncalibrated replay vs the profiled step time, pass ≤ 1 %);
* base → target predictions against the target's **unprofiled** step time
  (matched to the baseline's replayed steps: same mode and token count, near
  the profiled windows — :func:`tracekit.replay.calibrate.matched_timing`):
  oracle substitution (``--durations-from``) and the knob (class scaling by the
  ratio measured between the two traces, or CUDA-graph emulation with the
  documented constants). Pass: |error| ≤ 5 % where the noise (max of the
  baseline's and the target's) is ≤ 2 %.

Every row that does not pass carries ``cause``: diagnostics computed from the
two traces (kernel counts of the scaled class, oracle match rate, host time per
step on the launching thread, noise), never a fitted constant.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from tracekit.core._num import as_float
from tracekit.replay.api import replay
from tracekit.replay.graph import ET_CPU, ReplayGraph, build_graph

__all__ = ["acceptance_rows", "class_ratio", "host_time_per_step", "SELF_TOL", "PRED_TOL", "NOISE_MAX", "CASES"]

SELF_TOL = 0.01
PRED_TOL = 0.05
NOISE_MAX = 0.02

#: (label, baseline, target, knob): knob is a category whose measured ratio is the scale, or a what-if spec
CASES = [
    ("loop → grouped", "loop", "grouped", "moe_gemm"),
    ("grouped → loop", "grouped", "loop", "moe_gemm"),
    ("NCCL default → host memory", "grouped", "grouped_p2p_off", "communication"),
    ("host memory → NCCL default", "grouped_p2p_off", "grouped", "communication"),
    ("eager → CUDA graph", "grouped", "graphs", "spec:cuda-graph"),
]


def _per_step(g: ReplayGraph, category: str) -> tuple[float, float]:
    """(median per rank-step summed duration, median per rank-step op count) of a category; transfers for comm."""
    if category == "communication":
        t = g.instances.get_column("transfer_ns")
        return as_float(t.median() or 0), float(g.instances.height)
    o = g.ops.filter((pl.col("category") == category) & (pl.col("step_ord") >= 0))
    if o.height == 0:
        return 0.0, 0.0
    a = o.group_by(["rank", "step_ord"]).agg(pl.col("dur").sum(), pl.len())
    return as_float(a.get_column("dur").median() or 0), as_float(a.get_column("len").median() or 0)


def class_ratio(base: ReplayGraph, target: ReplayGraph, category: str) -> float:
    """Target / base of the median per-step summed duration of ``category`` (median transfer for communication)."""
    b = _per_step(base, category)[0]
    return _per_step(target, category)[0] / b if b else 1.0


def host_time_per_step(g: ReplayGraph) -> float:
    """Median over (rank, step) of the launching thread's call time + gaps inside the step (profiled, ns)."""
    cpu = (g.etype == ET_CPU) & (g.vregion[g.edst] >= 0)
    if not cpu.any():
        return 0.0
    t = pl.DataFrame({"rank": g.vrank[g.edst[cpu]], "reg": g.vregion[g.edst[cpu]],
                      "w": g.egap[cpu] + g.vdur[g.esrc[cpu]]})
    return as_float(t.group_by(["rank", "reg"]).agg(pl.col("w").sum()).get_column("w").median() or 0)


def _ops_per_step(g: ReplayGraph) -> float:
    o = g.ops.filter(pl.col("step_ord") >= 0)
    return as_float(o.group_by(["rank", "step_ord"]).len().get_column("len").median() or 0) if o.height else 0.0


def _match_rate(notes: list[str]) -> float | None:
    import re

    for n in notes:
        m = re.search(r"(\d+)/(\d+) ops matched exactly", n)
        if m:
            return int(m.group(1)) / max(int(m.group(2)), 1)
    return None


def _status(err: float, noise: float | None, tol: float) -> str:
    if noise is not None and noise > NOISE_MAX:
        return "n/a (noise)"
    return "pass" if abs(err) <= tol else "FAIL"


def acceptance_rows(traces: dict[str, tuple[pl.DataFrame, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Run the protocol on the given traces (name → (frame, metadata)); see the module doc."""
    rows: list[dict[str, Any]] = []
    graphs: dict[str, ReplayGraph] = {}
    results = {}
    for name, (df, meta) in traces.items():
        r = replay(df, meta)
        results[name] = r
        graphs[name] = build_graph(df)  # (built again: cheap at fixture sizes)
        b = r.baseline
        noise = r.noise.relative if r.noise is not None else None
        err = b.self_replay_error
        rows.append({"what_if": f"self-replay {name}", "kind": "self", "base": name, "target": name,
                     "predicted_ns": b.self_replay_step_ns_p50, "measured_ns": b.profiled_step_ns_p50,
                     "measured_is": "profiled", "error": err, "noise": noise,
                     "status": "pass" if abs(err) <= SELF_TOL else "FAIL", "scale": r.calibration_scale,
                     "calibrated_error": b.calibrated_error, "measured_unprofiled_ns": b.measured_step_ns_p50,
                     "cause": None})
    for label, base, tgt, knob in CASES:
        if base not in traces or tgt not in traces:
            continue
        bdf, bmeta = traces[base]
        tdf, _tmeta = traces[tgt]
        gb, gt = graphs[base], graphs[tgt]
        if knob.startswith("spec:"):
            specs = [knob[5:], "oracle+" + knob[5:]]
            cat = None
        else:
            cat = knob
            specs = [f"{cat}={class_ratio(gb, gt, cat):.4f}"]
        r = replay(bdf, bmeta, specs, durations_from=tdf)
        base_noise = r.noise.relative if r.noise is not None else None
        host_b, host_t = host_time_per_step(gb), host_time_per_step(gt)
        diag: dict[str, Any] = {
            "host_time_change": (host_t / host_b - 1) if host_b else None,
            "gpu_ops_per_step": (_ops_per_step(gb), _ops_per_step(gt)),
        }
        if cat is not None:
            diag["class_ops_per_step"] = (_per_step(gb, cat)[1], _per_step(gt, cat)[1])
        for p in r.what_if:
            m = p.measured
            if m is None or (cat is None and p.spec == "oracle"):
                continue  # (durations alone say nothing about a structural knob such as CUDA graphs)
            measured = m["step_ns_p50"]
            noise = max((x for x in (m["noise"], base_noise) if x is not None), default=None)
            err = p.step_ns_p50 / measured - 1
            kind = "oracle" if p.spec.startswith("oracle") else "knob"
            status = _status(err, noise, PRED_TOL)
            shapes = _shape_errors(p.by_shape, m["matched"])
            cause = None if status == "pass" else _cause(p, r, m, diag, cat, noise, shapes)
            rows.append({"what_if": f"{label}: {p.spec}", "kind": kind, "base": base, "target": tgt,
                         "predicted_ns": p.step_ns_p50, "measured_ns": measured, "measured_is": "unprofiled",
                         "error": err, "noise": noise, "status": status, "scale": r.calibration_scale,
                         "predicted_change": p.change,
                         "measured_change": measured / r.baseline.measured_step_ns_p50 - 1,
                         "by_shape": shapes, "diagnostics": diag, "notes": p.notes, "cause": cause})
    return rows


def _shape_errors(pred: list[dict[str, Any]], matched: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    mm = {(d["mode"], d["tokens"]): d for d in (matched or [])}
    out = []
    for d in pred:
        m = mm.get((d["mode"], d["tokens"]))
        if m is None:
            continue
        out.append({"mode": d["mode"], "tokens": d["tokens"], "predicted_ns": d["step_ns_p50"],
                    "measured_ns": m["p50_ns"], "error": d["step_ns_p50"] / m["p50_ns"] - 1, "noise": m.get("noise")})
    return out


def _cause(p: Any, r: Any, m: dict[str, Any], diag: dict[str, Any], cat: str | None, noise: float | None,
           shapes: list[dict[str, Any]]) -> str:
    """Name what the diagnostics show (several causes may apply)."""
    out: list[str] = []
    if noise is not None and noise > NOISE_MAX:
        out.append(f"run-to-run noise {noise:.1%} > {NOISE_MAX:.0%}")
    mr = _match_rate(p.notes)
    if cat is not None and "class_ops_per_step" in diag:
        a, b = diag["class_ops_per_step"]
        if a and b and max(a, b) / min(a, b) > 1.5:
            out.append(f"different kernels: {cat} has {a:.0f} vs {b:.0f} kernels per rank-step "
                       f"(GPU ops {diag['gpu_ops_per_step'][0]:.0f} vs {diag['gpu_ops_per_step'][1]:.0f}); "
                       "class scaling by the duration ratio is ill-posed (the knob changes launches and host "
                       "syncs, not kernel time)")
    if mr is not None and mr < 0.5:
        out.append(f"oracle matched only {mr:.0%} of the baseline's ops by name (kernel structure differs)")
    hc = diag.get("host_time_change")
    mc = m["step_ns_p50"] / r.baseline.measured_step_ns_p50 - 1
    if hc is not None and abs(hc) > abs(p.change) and np.sign(hc) == np.sign(mc) and abs(hc) > 0.01:
        out.append(f"the knob changed host time: launching-thread time per profiled step {hc:+.1%} between the "
                   f"captures (measured change {mc:+.1%}, predicted {p.change:+.1%}); the what-if edits GPU "
                   "durations and transfers only")
    bad = [s for s in shapes if abs(s["error"]) > PRED_TOL]
    if shapes and len(bad) < len(shapes):
        out.append("per shape: " + ", ".join(f"{s['tokens']} tok {s['error']:+.1%}" for s in shapes))
    return "; ".join(out) or "unexplained"
