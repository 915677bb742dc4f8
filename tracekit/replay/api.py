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

from tracekit._errors import Quality, QualityLog, UsageError
from tracekit.core._num import as_float
from tracekit.replay.calibrate import UnprofiledTiming, fit_gap_scale, job_step_series, matched_timing
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

__all__ = ["replay", "ReplayResult", "Prediction", "Replayer", "measure"]


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
    #: the target trace's own unprofiled timing (oracle scenarios): measured_step_ns_p50, noise, error
    measured: dict[str, Any] | None = None
    #: p50 per step shape (mode, tokens)
    by_shape: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        d = {"spec": self.spec, "step_ns_p50": self.step_ns_p50, "step_ns_mean": self.step_ns_mean,
             "tokens_per_s": self.tokens_per_s, "change_vs_baseline": self.change,
             "within_noise": self.within_noise, "critical_path_ns": self.critical_path_ns, "notes": self.notes}
        if self.measured is not None:
            d["measured"] = self.measured
        d["by_shape"] = self.by_shape
        return d


@dataclass
class ReplayResult:
    baseline: dict[str, Any]
    calibration_scale: float
    calibrated: bool
    noise: dict[str, Any] | None
    what_if: list[Prediction]
    graph: dict[str, Any]
    quality: list[Quality]
    #: replayed job steps (mode, tokens) that unprofiled timings are matched to (not in the JSON)
    reference: pl.DataFrame | None = None

    def measured(self, target_df: pl.DataFrame) -> dict[str, Any] | None:
        """Another trace's unprofiled timing matched to this replay's steps (see :func:`measure`)."""
        return measure(target_df, self.reference) if self.reference is not None else None

    def to_json(self) -> dict[str, Any]:
        return {"baseline": self.baseline, "calibration_scale": self.calibration_scale,
                "calibrated": self.calibrated, "noise": self.noise,
                "what_if": [p.to_json() for p in self.what_if], "graph": self.graph,
                "quality": [q.to_json() for q in self.quality]}


def measure(target_df: pl.DataFrame, ref: pl.DataFrame) -> dict[str, Any] | None:
    """Measured unprofiled timing of ``target_df`` for the reference steps ``ref`` (mode, tokens), or None."""
    t = matched_timing(target_df, ref)
    if t is None:
        return None
    return {"step_ns_p50": t.p50, "step_ns_mean": t.mean, "noise": t.noise,
            "halves_ns": list(t.halves_ns) if t.halves_ns else None, "matched": t.matched}


def _stats(x: np.ndarray) -> tuple[float, float]:
    return (float(np.median(x)), float(x.mean())) if x.size else (float("nan"), float("nan"))


class Replayer:
    """A built graph plus its schedule; runs scenarios. Build once, simulate many times."""

    def __init__(self, df: pl.DataFrame, graph: ReplayGraph | None = None, instances: pl.DataFrame | None = None) -> None:
        self.g = graph if graph is not None else build_graph(df, instances)
        self.sched: Schedule = make_schedule(self.g)
        modes = self.g.steps.get_column("step_mode").drop_nulls()
        #: steps compared are those of the dominant forward mode (DECODE in a serving trace) ...
        self.mode: str | None = modes.mode().sort().item(0) if modes.len() else None
        #: ... and, for the headline figures, its primary shape: the token count with most steps (ties: larger)
        self.tokens: int | None = None
        if self.mode is not None:
            job = (self.g.steps.filter(pl.col("step_mode") == self.mode).group_by("step_ord")
                   .agg(pl.col("tokens").max()))
            cnt = job.group_by("tokens").len().sort(["len", "tokens"], descending=True, nulls_last=True)
            self.tokens = cnt.item(0, "tokens") if cnt.height else None

    def _sel(self, st: pl.DataFrame, primary: bool = False) -> pl.DataFrame:
        if self.mode is None:
            return st
        m = pl.col("step_mode") == self.mode
        if primary:
            m = m & pl.col("tokens").eq_missing(self.tokens)
        keep = self.g.steps.filter(m).select("rank", "step_ord")
        return st.join(keep, on=["rank", "step_ord"], how="semi")

    def primary(self, st: pl.DataFrame) -> pl.DataFrame:
        """The steps of the primary shape (mode, tokens) in a step table."""
        return self._sel(st, primary=True)

    def step_series(self, inp: SimInputs) -> tuple[np.ndarray, pl.DataFrame, Any]:
        """(job step times of the primary shape, step table of every step of the mode, simulation result)."""
        res = simulate(self.g, inp, self.sched)
        st = self._sel(step_times(self.g, res.t, inp.vdur))
        return job_step_series(self.primary(st)), st, res

    def by_shape(self, st: pl.DataFrame) -> list[dict[str, Any]]:
        """Job step time p50 per (mode, tokens) of a :meth:`step_series` step table."""
        if st.height == 0:
            return []
        sh = self.g.steps.select("rank", "step_ord", "step_mode", "tokens")
        j = (st.join(sh, on=["rank", "step_ord"], how="left").group_by("step_ord")
             .agg(pl.col("dur_ns").max(), pl.col("step_mode").first(), pl.col("tokens").max()))
        out = j.group_by(["step_mode", "tokens"]).agg(pl.col("dur_ns").median().alias("p50"), pl.len().alias("n"))
        return [{"mode": m, "tokens": t, "step_ns_p50": float(p), "n_steps": int(n)}
                for m, t, p, n in out.sort(["step_mode", "tokens"], nulls_last=True).iter_rows()]

    def observed_series(self) -> np.ndarray:
        return job_step_series(self._sel(step_times(self.g, None), primary=True))

    def ref_steps(self) -> pl.DataFrame:
        """One row per replayed job step (``mode``, ``tokens``): what unprofiled timings are matched to."""
        st = self._sel(self.g.steps)
        return (st.group_by("step_ord").agg(pl.col("step_mode").first().alias("mode"),
                                            pl.col("tokens").max().alias("tokens")).sort("step_ord")
                .select("mode", "tokens"))

    def tokens_p50(self) -> float | None:
        tok = self._sel(self.g.steps).get_column("tokens").drop_nulls()
        return as_float(tok.median()) if tok.len() else None


def replay(
    df: pl.DataFrame,
    meta: dict[str, Any] | None = None,
    what_ifs: Sequence[str | WhatIf] = (),
    *,
    durations_from: pl.DataFrame | ReplayGraph | None = None,
    calibrate: bool = True,
    gap_scale: float | None = None,
    critical_path_steps: int = 64,
    instances: pl.DataFrame | None = None,
) -> ReplayResult:
    """Replay a trace and predict what-ifs.

    ``what_ifs`` are spec strings (see :mod:`tracekit.replay.whatif`) or parsed
    :class:`WhatIf` objects; ``durations_from`` (a trace frame of the same
    workload) adds an ``oracle`` scenario. ``gap_scale`` fixes the CPU-gap scale
    instead of fitting it. Step times are job-level (max over ranks per step). ``instances``: the analysis'
    matched collective instances on the trace's clock (:meth:`AnalysisResult.instances_in_input_time`), used
    instead of matching again (:func:`tracekit.replay.graph.build_graph`).
    """
    q = QualityLog()
    combos: list[tuple[int, str]] = []  # "oracle+<spec>": oracle durations, then the spec's edits
    wis: list[WhatIf] = []
    for w in what_ifs:
        if isinstance(w, str) and "oracle" in [x.strip().lower() for x in w.split("+")]:
            if durations_from is None:
                raise UsageError(f"what-if {w!r}: 'oracle' needs --durations-from (the trace whose durations to use)")
            rest = "+".join(x for x in w.split("+") if x.strip().lower() != "oracle")
            combos.append((len(wis), w))
            wis.append(parse_whatif(rest) if rest.strip() else WhatIf(spec=w))
        else:
            wis.append(parse_whatif(w) if isinstance(w, str) else w)  # fail fast on bad specs
    rp = Replayer(df, instances=instances)
    g = rp.g
    q.extend(g.quality)
    obs = rp.observed_series()
    obs_p50, obs_mean = _stats(obs)
    base_in = inputs_from_graph(g, 1.0)
    self_x, _st, _res = rp.step_series(base_in)
    self_p50, _ = _stats(self_x)
    self_err = (self_p50 - obs_p50) / obs_p50 if obs_p50 else float("nan")
    ref = rp.ref_steps()
    unp: UnprofiledTiming | None = matched_timing(df, ref)
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
        "critical_path_ns": critical_path_breakdown(g, bres, rp.primary(bst), critical_path_steps),
        "n_steps": int(bx.size),
        "by_shape": rp.by_shape(bst),
        "step_mode": rp.mode,
        "step_tokens": rp.tokens,
    }
    scen: list[WhatIf] = list(wis)
    oracle_w: WhatIf | None = None
    if durations_from is not None:
        tg = durations_from if isinstance(durations_from, ReplayGraph) else build_graph(durations_from)
        oracle_w = oracle_whatif(g, tg)
        for i, spec in combos:  # the oracle's substitutions first, then the spec's own edits
            scen[i] = WhatIf(spec=spec, edits=[*oracle_w.edits, *scen[i].edits], notes=[*oracle_w.notes,
                                                                                      *scen[i].notes])
        if not any(w.spec == "oracle" for w in scen):
            scen.append(oracle_w)
    preds: list[Prediction] = []
    tgt_measured = measure(durations_from, ref) if isinstance(durations_from, pl.DataFrame) else None
    for w in scen:
        inp, notes = w.apply(g, base_in)
        x, st, res = rp.step_series(inp)
        p50, mean = _stats(x)
        change = (p50 - b_p50) / b_p50 if b_p50 else float("nan")
        within = (abs(change) <= noise) if noise is not None else None
        if within:
            notes = [*notes, f"predicted change {change:+.1%} lies inside the noise floor ({noise:.1%})"]
        meas = None
        if tgt_measured is not None:  # --durations-from is the target run: every scenario is compared with it
            meas = {**tgt_measured, "error": p50 / tgt_measured["step_ns_p50"] - 1}
        preds.append(Prediction(w.spec, p50, mean, (tok / p50 * 1e9) if tok and p50 else None,
                                critical_path_breakdown(g, res, rp.primary(st), critical_path_steps), change, within, notes,
                                meas, rp.by_shape(st)))
    noise_d = None
    if unp is not None:
        noise_d = {"relative": unp.noise, "halves_ns": list(unp.halves_ns) if unp.halves_ns else None,
                   "n_steps": int(unp.step_ns.size), "matched": unp.matched}
    graph_info = {"vertices": g.n_vertices, "edges": g.n_edges, "gpu_ops": g.ops.height,
                  "collective_instances": g.instances.height, "ranks": g.ranks,
                  "typical": {str(k): v for k, v in g.typical.items()}}
    return ReplayResult(baseline, scale, calibrated, noise_d, preds, graph_info, list(q), ref)
