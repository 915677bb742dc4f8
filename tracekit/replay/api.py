"""``replay(df, meta, what_ifs=[...]) -> ReplayResult``: the public replay entry point.

Pipeline: build the dependency graph, self-replay it (uncalibrated) against the
profiled step times, fit the CPU-gap scale to the unprofiled timing when the
trace has one, then replay every what-if with that scale. Pure: no IO, no printing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import polars as pl

from tracekit._errors import Quality, QualityLog
from tracekit.replay.calibrate import UnprofiledTiming, fit_gap_scale, job_step_series, unprofiled_timing
from tracekit.replay.graph import ReplayGraph, build_graph
from tracekit.replay.simulate import (
    Schedule,
    SimInputs,
    critical_path_breakdown,
    inputs_from_graph,
    make_schedule,
    simulate,
    step_times,
)
from tracekit.replay.whatif import WhatIf, oracle_whatif, parse_whatif

__all__ = ["replay", "ReplayResult", "Prediction", "Replayer"]


@dataclass
class Prediction:
    spec: str
    step_ns_p50: float
    step_ns_mean: float
    tokens_per_s: float | None
    critical_path_ns: dict[str, float]
    change: float  # relative to the (calibrated) baseline replay
    within_noise: bool | None
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"spec": self.spec, "step_ns_p50": self.step_ns_p50, "step_ns_mean": self.step_ns_mean,
                "tokens_per_s": self.tokens_per_s, "change_vs_baseline": self.change,
                "within_noise": self.within_noise, "critical_path_ns": self.critical_path_ns, "notes": self.notes}


@dataclass
class ReplayResult:
    baseline: dict[str, Any]
    calibration_scale: float
    calibrated: bool
    noise: dict[str, Any] | None
    what_if: list[Prediction]
    graph: dict[str, Any]
    quality: list[Quality]

    def to_json(self) -> dict[str, Any]:
        return {"baseline": self.baseline, "calibration_scale": self.calibration_scale,
                "calibrated": self.calibrated, "noise": self.noise,
                "what_if": [p.to_json() for p in self.what_if], "graph": self.graph,
                "quality": [q.to_json() for q in self.quality]}


def _stats(x: np.ndarray) -> tuple[float, float]:
    return (float(np.median(x)), float(x.mean())) if x.size else (float("nan"), float("nan"))


class Replayer:
    """A built graph plus its schedule; runs scenarios. Build once, simulate many times."""

    def __init__(self, df: pl.DataFrame, graph: ReplayGraph | None = None) -> None:
        self.g = graph if graph is not None else build_graph(df)
        self.sched: Schedule = make_schedule(self.g)
        modes = self.g.steps.get_column("step_mode").drop_nulls()
        #: steps compared are those of the dominant forward mode (DECODE in a serving trace)
        self.mode: str | None = modes.mode().sort().item(0) if modes.len() else None

    def _sel(self, st: pl.DataFrame) -> pl.DataFrame:
        if self.mode is None:
            return st
        keep = self.g.steps.filter(pl.col("step_mode") == self.mode).select("rank", "step_ord")
        return st.join(keep, on=["rank", "step_ord"], how="semi")

    def step_series(self, inp: SimInputs) -> tuple[np.ndarray, pl.DataFrame, Any]:
        res = simulate(self.g, inp, self.sched)
        st = self._sel(step_times(self.g, res.t, inp.vdur))
        return job_step_series(st), st, res

    def observed_series(self) -> np.ndarray:
        return job_step_series(self._sel(step_times(self.g, None)))

    def tokens_p50(self) -> float | None:
        tok = self._sel(self.g.steps).get_column("tokens").drop_nulls()
        return float(tok.median()) if tok.len() else None


def replay(
    df: pl.DataFrame,
    meta: dict[str, Any] | None = None,
    what_ifs: Sequence[str | WhatIf] = (),
    *,
    durations_from: pl.DataFrame | ReplayGraph | None = None,
    calibrate: bool = True,
    gap_scale: float | None = None,
    critical_path_steps: int = 64,
) -> ReplayResult:
    """Replay a trace and predict what-ifs.

    ``what_ifs`` are spec strings (see :mod:`tracekit.replay.whatif`) or parsed
    :class:`WhatIf` objects; ``durations_from`` (a trace frame of the same
    workload) adds an ``oracle`` scenario. ``gap_scale`` fixes the CPU-gap scale
    instead of fitting it. Step times are job-level (max over ranks per step).
    """
    q = QualityLog()
    wis = [parse_whatif(w) if isinstance(w, str) else w for w in what_ifs]  # fail fast on bad specs
    rp = Replayer(df)
    g = rp.g
    q.extend(g.quality)
    obs = rp.observed_series()
    obs_p50, obs_mean = _stats(obs)
    base_in = inputs_from_graph(g, 1.0)
    self_x, _st, _res = rp.step_series(base_in)
    self_p50, _ = _stats(self_x)
    self_err = (self_p50 - obs_p50) / obs_p50 if obs_p50 else float("nan")
    unp: UnprofiledTiming | None = unprofiled_timing(df, meta, rp.mode)
    scale, calibrated = 1.0, False
    if gap_scale is not None:
        scale = float(gap_scale)
    elif calibrate and unp is not None:

        def p50_at(s: float) -> float:
            x, _a, _b = rp.step_series(inputs_from_graph(g, s))
            return float(np.median(x))

        scale, _v = fit_gap_scale(p50_at, unp.p50)
        calibrated = True
        if scale == 0.0:
            q.add("replay_calibration_floor", "even with zero CPU gaps the replay is slower than the unprofiled "
                  "timing (GPU-bound, or kernels slowed by the profiler); calibration scale is 0", severity="info")
    elif unp is None:
        q.add("replay_uncalibrated", "trace has no unprofiled step timings (kind=step, profiled=false): replay is "
              "uncalibrated and includes profiler overhead; capture with tracekit to record them")
    base_in = inputs_from_graph(g, scale)
    bx, bst, bres = rp.step_series(base_in)
    b_p50, b_mean = _stats(bx)
    tok = rp.tokens_p50() or (unp.tokens_p50 if unp else None)
    noise = unp.noise if unp else None
    baseline = {
        "step_ns_p50": b_p50,
        "step_ns_mean": b_mean,
        "measured_step_ns_p50": unp.p50 if unp else obs_p50,
        "measured_step_ns_mean": unp.mean if unp else obs_mean,
        "measured_is_unprofiled": unp is not None,
        "profiled_step_ns_p50": obs_p50,
        "self_replay_step_ns_p50": self_p50,
        "self_replay_error": self_err,
        "calibrated_error": ((b_p50 - unp.p50) / unp.p50) if unp else None,
        "tokens_per_s": (tok / b_p50 * 1e9) if tok and b_p50 else None,
        "critical_path_ns": critical_path_breakdown(g, bres, bst, critical_path_steps),
        "n_steps": int(bx.size),
        "step_mode": rp.mode,
    }
    scen: list[WhatIf] = list(wis)
    if durations_from is not None:
        tg = durations_from if isinstance(durations_from, ReplayGraph) else build_graph(durations_from)
        scen.append(oracle_whatif(g, tg))
    preds: list[Prediction] = []
    for w in scen:
        inp, notes = w.apply(g, base_in)
        x, st, res = rp.step_series(inp)
        p50, mean = _stats(x)
        change = (p50 - b_p50) / b_p50 if b_p50 else float("nan")
        within = (abs(change) <= noise) if noise is not None else None
        if within:
            notes = [*notes, f"predicted change {change:+.1%} lies inside the noise floor ({noise:.1%})"]
        preds.append(Prediction(w.spec, p50, mean, (tok / p50 * 1e9) if tok and p50 else None,
                                critical_path_breakdown(g, res, st, critical_path_steps), change, within, notes))
    noise_d = None
    if unp is not None:
        noise_d = {"relative": unp.noise, "halves_ns": list(unp.halves_ns) if unp.halves_ns else None,
                   "n_steps": int(unp.step_ns.size)}
    graph_info = {"vertices": g.n_vertices, "edges": g.n_edges, "gpu_ops": g.ops.height,
                  "collective_instances": g.instances.height, "ranks": g.ranks,
                  "typical": {str(k): v for k, v in g.typical.items()}}
    return ReplayResult(baseline, scale, calibrated, noise_d, preds, graph_info, list(q))
