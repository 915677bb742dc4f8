"""``replay(df, meta, what_ifs=[...]) -> ReplayResult``: the public replay entry point.

Pipeline: build the dependency graph, self-replay it (uncalibrated) against the
profiled step times, fit the CPU-gap scale to the unprofiled timing when the
trace has one, then replay every what-if with that scale. Pure: no IO, no printing.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Sequence

import numpy as np
import polars as pl

from tracekit._errors import Quality, QualityLog, UsageError
from tracekit.analysis.steptime import p50, primary_shape
from tracekit.analysis.unprofiled import consecutive_periods
from tracekit.replay.calibrate import (
    UnprofiledTiming,
    fit_gap_scale,
    matched_period,
    matched_timing,
    with_gpu_gap_scale,
    with_host_call_scale,
)
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

__all__ = ["replay", "ReplayResult", "Prediction", "Baseline", "Noise", "GraphInfo", "Replayer", "measure"]


def _as_json(node: Any) -> dict[str, Any]:
    """A node's fields in declaration order, values as they are (the ``--json`` object's keys are the field names)."""
    return {f.name: getattr(node, f.name) for f in fields(node)}


@dataclass(frozen=True)
class Baseline:
    """The replayed baseline (``baseline`` in ``replay --json``; fields in its key order). Job step times (ns) of
    the primary shape: the calibrated replay's ``step_ns_p50``/``_mean`` (what the what-ifs compare to); ``measured_*``
    what calibration aimed at (the unprofiled timing; the profiled steps without one); ``profiled_*`` the trace's
    own steps (analyze's ``steps.step_time``); ``self_replay_*`` the uncalibrated replay against them;
    ``critical_path_ns`` per category per step; ``by_shape`` the p50 per (mode, tokens)."""

    step_ns_p50: float
    step_ns_mean: float
    measured_step_ns_p50: float
    measured_step_ns_mean: float
    measured_is_unprofiled: bool
    measured_host_range_ns_p50: float | None
    measured_is_host_range: bool
    profiled_step_ns_p50: float
    profiled_host_range_ns_p50: float
    self_replay_step_ns_p50: float
    self_replay_error: float
    calibrated_error: float | None
    tokens_per_s: float | None
    critical_path_ns: dict[str, float]
    n_steps: int
    by_shape: list[dict[str, Any]]
    step_mode: str | None
    step_tokens: int | None
    host_call_scale: float | None = None  # the calls' own-time scale (calibration past the CPU-gap floor), or None
    gpu_gap_scale: float | None = None  # the GPU's queued-op gap scale (GPU-bound steps, fitted to the period), or None

    def to_json(self) -> dict[str, Any]:
        return _as_json(self)


@dataclass(frozen=True)
class Noise:
    """The run-to-run noise of the matched unprofiled steps (``noise`` in ``replay --json``): ``relative`` spread of
    the two halves' medians (None with fewer than 4 steps), the halves, how many steps, the match per shape."""

    relative: float | None
    halves_ns: list[float] | None
    n_steps: int
    matched: list[dict[str, Any]] | None

    def to_json(self) -> dict[str, Any]:
        return _as_json(self)


@dataclass(frozen=True)
class GraphInfo:
    """The dependency graph replayed (``graph`` in ``replay --json``): its size, ranks, typical edge values by rank."""

    vertices: int
    edges: int
    gpu_ops: int
    collective_instances: int
    ranks: list[int]
    typical: dict[str, dict[str, int]]

    def to_json(self) -> dict[str, Any]:
        return _as_json(self)


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
    baseline: Baseline
    calibration_scale: float
    calibrated: bool
    noise: Noise | None
    what_if: list[Prediction]
    graph: GraphInfo
    quality: list[Quality]
    #: replayed job steps (mode, tokens) that unprofiled timings are matched to (not in the JSON)
    reference: pl.DataFrame | None = None

    def measured(self, target_df: pl.DataFrame) -> dict[str, Any] | None:
        """Another trace's unprofiled timing matched to this replay's steps (see :func:`measure`)."""
        return measure(target_df, self.reference) if self.reference is not None else None

    def to_json(self) -> dict[str, Any]:
        return {"baseline": self.baseline.to_json(), "calibration_scale": self.calibration_scale,
                "calibrated": self.calibrated, "noise": None if self.noise is None else self.noise.to_json(),
                "what_if": [p.to_json() for p in self.what_if], "graph": self.graph.to_json(),
                "quality": [q.to_json() for q in self.quality]}


def measure(target_df: pl.DataFrame, ref: pl.DataFrame) -> dict[str, Any] | None:
    """Measured unprofiled timing of ``target_df`` for the reference steps ``ref`` (mode, tokens), or None."""
    t = matched_timing(target_df, ref)
    if t is None:
        return None
    return {"step_ns_p50": t.p50, "step_ns_mean": t.mean, "noise": t.noise,
            "halves_ns": list(t.halves_ns) if t.halves_ns else None, "matched": t.matched}


def _stats(x: np.ndarray) -> tuple[float, float]:
    """(p50, mean) of job step times; p50 is the step-time median of :mod:`tracekit.analysis.steptime`."""
    return (p50(x), float(x.mean())) if x.size else (float("nan"), float("nan"))


class Replayer:
    """A built graph plus its schedule; runs scenarios. Build once, simulate many times."""

    def __init__(self, df: pl.DataFrame, graph: ReplayGraph | None = None, instances: pl.DataFrame | None = None) -> None:
        self.g = graph if graph is not None else build_graph(df, instances)
        self.sched: Schedule = make_schedule(self.g)
        # the steps that count and their job steps, by the one definition (tracekit.analysis.steptime): a rank's
        # profiled steps with GPU work, the n-th of every rank one job step
        #: the observed step table (:func:`step_times` at the trace's own times)
        self.obs_steps: pl.DataFrame = step_times(self.g, None)
        obs = self.obs_steps
        sh = self.g.steps.select("rank", "step_ord", "obs_ts", pl.col("step_mode").alias("mode"), "tokens")
        counted = obs.filter(pl.col("gpu_ops") > 0).select("rank", "step_ord").join(sh, on=["rank", "step_ord"])
        #: (rank, step_ord) -> job, with the job's mode and tokens
        self.jobs: pl.DataFrame = self._job_map(counted)
        job = self.jobs.unique("job").rename({"job_mode": "mode", "job_tokens": "tokens"})
        #: the primary shape (mode, tokens): the headline figures are its job steps'
        self.mode, self.tokens = primary_shape(job)

    @staticmethod
    def _job_map(counted: pl.DataFrame) -> pl.DataFrame:
        st = counted.sort(["rank", "obs_ts"]).with_columns(pl.int_range(pl.len()).over("rank").cast(pl.Int64).alias("job"))
        per = st.group_by("job").agg(pl.col("mode").drop_nulls().first().alias("job_mode"),
                                     pl.col("tokens").max().alias("job_tokens"))
        return st.select("rank", "step_ord", "job").join(per, on="job")

    def _jobs_of(self, st: pl.DataFrame, primary: bool = False, mode_only: bool = False) -> pl.DataFrame:
        """Job steps of a :func:`step_times` table: ``job, mode, tokens, dur_ns, host_ns`` (max over ranks), in job
        order."""
        j = st.join(self.jobs, on=["rank", "step_ord"])
        if primary or mode_only:
            m = pl.col("job_mode").eq_missing(self.mode)
            j = j.filter(m & pl.col("job_tokens").eq_missing(self.tokens) if primary else m)
        return (j.group_by("job").agg(pl.col("dur_ns").max(), pl.col("host_ns").max(), pl.col("job_mode").first().alias("mode"),
                                      pl.col("job_tokens").first().alias("tokens")).sort("job"))

    def host_series(self, st: pl.DataFrame) -> np.ndarray:
        """The primary shape's job host ranges (start marker → end marker, max over ranks) of a step table: what the
        program's own clock around each step measured (the unprofiled step records)."""
        return self._jobs_of(st, primary=True).get_column("host_ns").to_numpy().astype(float)

    def period_series(self, st: pl.DataFrame) -> np.ndarray:
        """The primary shape's job step periods of a step table: a job step's host start (earliest over ranks) to
        the next job step's, where the two are consecutive forwards (``step_id`` + 1) of the primary shape: what the
        program's clock measures between unprofiled steps (:func:`tracekit.analysis.unprofiled.matched_period`)."""
        j = st.join(self.jobs, on=["rank", "step_ord"])
        prim = pl.col("job_mode").eq_missing(self.mode) & pl.col("job_tokens").eq_missing(self.tokens)
        j = (j.group_by("job").agg(pl.col("host_start").min(), pl.col("step_id").min(), prim.all().alias("_p"))
             .sort("job"))
        return consecutive_periods(j, "host_start", "step_id", pl.col("_p")).get_column("period").to_numpy().astype(float)

    def primary(self, st: pl.DataFrame) -> pl.DataFrame:
        """The counted steps of the primary shape (mode, tokens) in a step table."""
        keep = self.jobs.filter(pl.col("job_mode").eq_missing(self.mode) & pl.col("job_tokens").eq_missing(self.tokens))
        return st.join(keep.select("rank", "step_ord"), on=["rank", "step_ord"], how="semi")

    def step_series(self, inp: SimInputs) -> tuple[np.ndarray, pl.DataFrame, Any]:
        """(job step times of the primary shape, step table of the counted steps, simulation result)."""
        res = simulate(self.g, inp, self.sched)
        st = step_times(self.g, res.t, inp.vdur).join(self.jobs.select("rank", "step_ord"), on=["rank", "step_ord"],
                                                       how="semi")
        return self._jobs_of(st, primary=True).get_column("dur_ns").to_numpy().astype(float), st, res

    def by_shape(self, st: pl.DataFrame) -> list[dict[str, Any]]:
        """Job step time p50 per (mode, tokens) of a :meth:`step_series` step table."""
        j = self._jobs_of(st)
        if j.height == 0:
            return []
        out = j.group_by(["mode", "tokens"]).agg(pl.col("dur_ns"), pl.len().alias("n"))
        return [{"mode": m, "tokens": t, "step_ns_p50": p50(d), "n_steps": int(n)}
                for m, t, d, n in out.sort(["mode", "tokens"], nulls_last=True).iter_rows()]

    def observed_series(self) -> np.ndarray:
        """The primary shape's job step times as observed: analyze's step time (``steps.step_time``)."""
        return self._jobs_of(self.obs_steps, primary=True).get_column("dur_ns").to_numpy().astype(float)

    def range_short_of_step(self) -> bool:
        """The observed steps' host range (p50) ends well before their step time: the program's range closes before
        the step's GPU work ends (GPU-bound, or synced after the range), so a range cannot time the whole step."""
        return p50(self.observed_series()) > 1.01 * p50(self.host_series(self.obs_steps))

    def ref_steps(self) -> pl.DataFrame:
        """One row per replayed job step of the primary mode (``mode``, ``tokens``): what unprofiled timings are
        matched to."""
        j = self.jobs.filter(pl.col("job_mode").eq_missing(self.mode)).unique("job").sort("job")
        return j.select(pl.col("job_mode").alias("mode"), pl.col("job_tokens").alias("tokens"))


def _scenarios(what_ifs: Sequence[str | WhatIf], durations_from: Any) -> tuple[list[WhatIf], list[tuple[int, str]]]:
    """Parsed scenarios (fail fast on bad specs) and the ``oracle+<spec>`` combinations (index, spec)."""
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
            wis.append(parse_whatif(w) if isinstance(w, str) else w)
    return wis, combos


def _fit(rp: Replayer, unp: UnprofiledTiming | None, calibrate: bool, gap_scale: float | None,
         q: QualityLog) -> tuple[float, bool]:
    """The CPU-gap scale: given, or fitted so that the replayed steps' *host range* p50 (start marker → end marker)
    equals the program clock's unprofiled p50 — like with like: an unprofiled step record is the same range on the
    program's clock. Where the range ends with the step's readback sync this is the step time; where the program
    syncs after the range, it is the host's launch time, which a GPU-bound step's time could not identify."""
    if gap_scale is not None:
        return float(gap_scale), False
    if not calibrate or unp is None:
        if unp is None:
            q.add("replay_uncalibrated", "trace has no unprofiled step timings (kind=step, profiled=false): replay is "
                  "uncalibrated and includes profiler overhead; capture with tracekit to record them")
        return 1.0, False

    def host_p50_at(s: float) -> float:
        _x, st, _r = rp.step_series(inputs_from_graph(rp.g, s))
        return p50(rp.host_series(st))

    scale, _v = fit_gap_scale(host_p50_at, unp.p50)
    if scale == 0.0:
        q.add("replay_calibration_floor", "even with zero CPU gaps the replay is slower than the unprofiled "
              "timing (GPU-bound, or kernels slowed by the profiler); calibration scale is 0", severity="info")
    return scale, True


def _fit_host_calls(rp: Replayer, unp: UnprofiledTiming | None, base_in: SimInputs, scale: float, calibrated: bool,
                    q: QualityLog) -> tuple[SimInputs, float | None]:
    """Where even zero CPU gaps leave the replayed host range above the unprofiled one (``scale`` 0), the scale on
    the launching thread's calls' own time (:func:`tracekit.replay.calibrate.with_host_call_scale`) that makes them
    equal; None where the CPU-gap scale sufficed."""
    if not calibrated or unp is None or scale > 0.0:
        return base_in, None

    def host_p50_at(h: float) -> float:
        _x, st, _r = rp.step_series(with_host_call_scale(rp.g, base_in, h))
        return p50(rp.host_series(st))

    h, _v = fit_gap_scale(host_p50_at, unp.p50, hi=1.0)
    if h < 1.0:
        q.add("replay_host_call_calibration", f"the launching thread's calls' own time scaled by {h:.3f} so the replayed "
              f"step range matches the unprofiled one ({unp.p50 / 1e6:.3f} ms; the profiler slows each call)",
              severity="info")
    return with_host_call_scale(rp.g, base_in, h), h


def _fit_gpu_gaps(rp: Replayer, df: pl.DataFrame, base_in: SimInputs, calibrated: bool,
                  q: QualityLog) -> tuple[SimInputs, float | None]:
    """Where the steps are GPU-bound (the host range closes before the step's GPU work ends, so the unprofiled ranges
    cannot time it), the scale on the GPU's gaps between queued ops that makes the replayed step period equal the
    program clock's unprofiled period (:func:`tracekit.analysis.unprofiled.matched_period`); None where it does not
    apply (uncalibrated, host-bound, or no consecutive unprofiled steps of the primary shape)."""
    if not calibrated or not rp.range_short_of_step():
        return base_in, None
    target = matched_period(df, rp.mode, rp.tokens)
    if target is None or rp.period_series(rp.obs_steps).size < 2:
        return base_in, None

    def period_at(s: float) -> float:
        _x, st, _r = rp.step_series(with_gpu_gap_scale(rp.g, base_in, s))
        return p50(rp.period_series(st))

    scale, _v = fit_gap_scale(period_at, target, hi=1.0)
    if scale < 1.0:
        q.add("replay_gpu_gap_calibration", f"GPU-bound steps: the gaps between queued GPU ops scaled by {scale:.3f} so the "
              f"replayed step period matches the program's unprofiled one ({target / 1e6:.3f} ms; the profiler widens "
              "those gaps)", severity="info")
    return with_gpu_gap_scale(rp.g, base_in, scale), scale


def _baseline(rp: Replayer, unp: UnprofiledTiming | None, base_in: SimInputs, cp_steps: int,
              scales: tuple[float | None, float | None] = (None, None)) -> tuple[Baseline, Any]:
    """The :class:`Baseline` and (its step table, simulation result); ``scales``: the calls' and the GPU gaps' fitted
    scales (None where not fitted)."""
    g = rp.g
    obs_st = rp.obs_steps
    obs_p50, obs_mean = _stats(rp._jobs_of(obs_st, primary=True).get_column("dur_ns").to_numpy().astype(float))
    host_obs = p50(rp.host_series(obs_st))
    self_x, _st, _res = rp.step_series(inputs_from_graph(g, 1.0))
    self_p50, _ = _stats(self_x)
    bx, bst, bres = rp.step_series(base_in)
    b_p50, b_mean = _stats(bx)
    b_host = p50(rp.host_series(bst))
    # the unprofiled records measure the step's range: its whole time only when the range holds the step's GPU work
    host_only = unp is not None and rp.range_short_of_step()
    tok = rp.tokens or (unp.tokens_p50 if unp else None)
    base = Baseline(
        step_ns_p50=b_p50, step_ns_mean=b_mean,
        measured_step_ns_p50=(b_p50 if host_only else unp.p50) if unp else obs_p50,
        measured_step_ns_mean=unp.mean if unp else obs_mean,
        measured_is_unprofiled=unp is not None, measured_host_range_ns_p50=unp.p50 if unp else None,
        measured_is_host_range=host_only,
        profiled_step_ns_p50=obs_p50, profiled_host_range_ns_p50=host_obs,
        self_replay_step_ns_p50=self_p50,
        self_replay_error=(self_p50 - obs_p50) / obs_p50 if obs_p50 else float("nan"),
        calibrated_error=((b_host - unp.p50) / unp.p50) if unp else None,
        tokens_per_s=(tok / b_p50 * 1e9) if tok and b_p50 else None,
        critical_path_ns=critical_path_breakdown(g, bres, rp.primary(bst), cp_steps),
        n_steps=int(bx.size), by_shape=rp.by_shape(bst), step_mode=rp.mode, step_tokens=rp.tokens,
        host_call_scale=scales[0], gpu_gap_scale=scales[1],
    )
    return base, (bst, bres)


def _with_oracle(rp: Replayer, wis: list[WhatIf], combos: list[tuple[int, str]], durations_from: Any) -> list[WhatIf]:
    scen: list[WhatIf] = list(wis)
    if durations_from is None:
        return scen
    tg = durations_from if isinstance(durations_from, ReplayGraph) else build_graph(durations_from)
    oracle_w = oracle_whatif(rp.g, tg)
    for i, spec in combos:  # the oracle's substitutions first, then the spec's own edits
        scen[i] = WhatIf(spec=spec, edits=[*oracle_w.edits, *scen[i].edits], notes=[*oracle_w.notes, *scen[i].notes])
    if not any(w.spec == "oracle" for w in scen):
        scen.append(oracle_w)
    return scen


def _predict(rp: Replayer, w: WhatIf, base_in: SimInputs, base: Baseline, noise: float | None,
             tgt: dict[str, Any] | None, cp_steps: int) -> Prediction:
    inp, notes = w.apply(rp.g, base_in)
    x, st, res = rp.step_series(inp)
    w_p50, mean = _stats(x)
    b_p50 = base.step_ns_p50
    change = (w_p50 - b_p50) / b_p50 if b_p50 else float("nan")
    within = (abs(change) <= noise) if noise is not None else None
    if within:
        notes = [*notes, f"predicted change {change:+.1%} lies inside the noise floor ({noise:.1%})"]
    meas = {**tgt, "error": w_p50 / tgt["step_ns_p50"] - 1} if tgt is not None else None  # --durations-from: target run
    tok = base.step_tokens
    return Prediction(w.spec, w_p50, mean, (tok / w_p50 * 1e9) if tok and w_p50 else None,
                      critical_path_breakdown(rp.g, res, rp.primary(st), cp_steps), change, within, notes, meas,
                      rp.by_shape(st))


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
    graph: ReplayGraph | None = None,
) -> ReplayResult:
    """Replay a trace and predict what-ifs.

    ``what_ifs`` are spec strings (see :mod:`tracekit.replay.whatif`) or parsed
    :class:`WhatIf` objects; ``durations_from`` (a trace frame of the same
    workload) adds an ``oracle`` scenario. ``gap_scale`` fixes the CPU-gap scale
    instead of fitting it. Step times are job-level (max over ranks per step), by the one definition of
    :mod:`tracekit.analysis.steptime` (``baseline.profiled_step_ns_p50`` is analyze's ``steps.step_time``). ``instances``:
    the analysis' matched collective instances on the trace's clock (:meth:`AnalysisResult.instances_in_input_time`),
    used instead of matching again (:func:`tracekit.replay.graph.build_graph`); ``graph``: the trace's graph when the
    caller built it already (next win reads its MoE structure first).
    """
    q = QualityLog()
    wis, combos = _scenarios(what_ifs, durations_from)
    rp = Replayer(df, graph=graph, instances=instances)
    q.extend(rp.g.quality)
    ref = rp.ref_steps()
    unp: UnprofiledTiming | None = matched_timing(df, ref)
    scale, calibrated = _fit(rp, unp, calibrate, gap_scale, q)
    base_in, call_scale = _fit_host_calls(rp, unp, inputs_from_graph(rp.g, scale), scale, calibrated, q)
    base_in, gpu_scale = _fit_gpu_gaps(rp, df, base_in, calibrated, q)
    baseline, _bsim = _baseline(rp, unp, base_in, critical_path_steps, (call_scale, gpu_scale))
    tgt = measure(durations_from, ref) if isinstance(durations_from, pl.DataFrame) else None
    noise = unp.noise if unp else None
    preds = [_predict(rp, w, base_in, baseline, noise, tgt, critical_path_steps)
             for w in _with_oracle(rp, wis, combos, durations_from)]
    noise_d = None
    if unp is not None:
        noise_d = Noise(relative=unp.noise, halves_ns=list(unp.halves_ns) if unp.halves_ns else None,
                        n_steps=int(unp.step_ns.size), matched=unp.matched)
    g = rp.g
    graph_info = GraphInfo(vertices=g.n_vertices, edges=g.n_edges, gpu_ops=g.ops.height,
                           collective_instances=g.instances.height, ranks=g.ranks,
                           typical={str(k): v for k, v in g.typical.items()})
    return ReplayResult(baseline, scale, calibrated, noise_d, preds, graph_info, list(q), ref)
