""""Next win": the changes the analysis suggests, ranked by the step time replay predicts for each.

Only changes that can be made as stated are ranked. They come from the trace's structure
(:func:`structural_changes`, :func:`tracekit.replay.structural.structure`) and the analysis' verdicts
(:func:`candidates`):

* **grouped experts** — ``grouped-experts``, when the steps run a per-expert MoE loop;
* **host syncs removed** — ``no-host-sync``, when the steps make host syncs besides taking their result and outside
  a per-expert loop (a loop's syncs read its expert counts back: they go with grouped experts, not on their own);
* **CUDA graphs** — ``cuda-graph``, unless the capture already replays graphs. A graph cannot capture a host sync or
  a data-dependent loop, so it needs grouped experts and the syncs gone first: it is then replayed after them
  (``grouped-experts+cuda-graph``) and listed under them as ``then`` ("needs … first");
* **MoE GEMM at its roofline** — ``moe_gemm=<f>`` with f = the MoE GEMM verdict's roofline fraction (a bound, so the
  predicted gain is a lower bound); skipped when the bound already reaches the roofline;
* **allreduce at NVLink speed** — ``allreduce=bw:<B>,lat:8us`` when the interconnect verdict names a slower path;
  allreduce *fusion* is not a replay scenario: its saving comes from the interconnect verdict and is listed unreplayed.

:func:`next_win` replays them (:func:`tracekit.replay.api.replay`, calibrated to the unprofiled timing when the capture
has one) and ranks them by predicted gain, each with its predicted step time, tokens/s and the confidence of its kind
(:mod:`tracekit.replay.accuracy`: how far replay was from changes actually made); a scenario that predicts no gain is
listed under ``skipped`` with the reason. Replay needs GPU ops: on a CPU-mode trace the section says so.

**What is replayed** (:func:`replay_rows`): replay predicts the p50 step time, so a bounded sample of profiled steps
stands for the whole trace. A trace of up to :data:`REPLAY_ROWS` rows replays whole. A larger one replays ``k`` job
steps (the n-th profiled step of every rank), ``k`` = as many as fit in :data:`REPLAY_ROWS` rows at the trace's rows
per step, at most :data:`REPLAY_STEPS`, in up to :data:`REPLAY_SEGMENTS` stretches of consecutive steps spread evenly
over the trace. Each stretch is, per rank, the rows from the start of its first step to the start of the step after
its last (GPU ops by their launch time), read one rank at a time from the scan: memory is bounded by the sample, not
the trace. Each stretch after the first starts one step earlier with that step's marker left out: its calls and GPU
ops are replayed (the queue a stretch starts with) but it is not one of the steps measured. The unprofiled step
timings (calibration) are read whole; they are one row per forward. The section's ``baseline.replayed`` says what
was replayed.
"""

from __future__ import annotations

import math

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import polars as pl

from tracekit.analysis.findings import Finding
from tracekit.analysis.result import instances_in_input_time
from tracekit.analysis.stage.pipeline import FinishedRun, StageOutput, collect_trace
from tracekit.core.gpus import gpu_peaks
from tracekit.replay.accuracy import confidence

__all__ = ["Change", "candidates", "next_win", "next_win_finding", "next_win_stage", "replay_rows", "structural_changes",
           "MAX_ROWS", "REPLAY_ROWS", "REPLAY_STEPS", "REPLAY_SEGMENTS"]

#: traces without profiled steps on some rank (replay then replays each rank as one step) and more rows than this
#: are not replayed inside ``analyze`` (``tracekit replay`` does it)
MAX_ROWS = 3_000_000
#: a scenario must shorten the step by at least this fraction to be listed as a win (below: "no predicted gain")
MIN_GAIN = 0.01
#: traces of up to this many rows replay whole; larger ones replay a sample of steps of about this many rows
REPLAY_ROWS = 400_000
#: job steps replayed at most (a sample), and the number of stretches of consecutive steps they come in
REPLAY_STEPS = 128
REPLAY_SEGMENTS = 4


def _runs(n_job: int, k: int, segments: int) -> list[tuple[int, int]]:
    """``segments`` stretches [a, b) of about k/segments consecutive job steps, spread evenly over 0..n_job."""
    s = max(1, min(segments, k))
    size = [k // s + (1 if i < k % s else 0) for i in range(s)]
    starts = np.linspace(0, n_job - max(size), s).round().astype(int) if s > 1 else np.array([0])
    pick = np.zeros(n_job, bool)
    for a, m in zip(starts.tolist(), size):
        pick[a:a + m] = True
    idx = np.flatnonzero(pick)
    cut = np.flatnonzero(np.diff(idx) > 1) + 1
    return [(int(g[0]), int(g[-1]) + 1) for g in np.split(idx, cut) if g.size]


def coupled_ranks(ranks: Sequence[int], instances: pl.DataFrame | None) -> list[list[int]]:
    """``ranks`` in groups that must replay together: ranks joined by a collective of one process group (through any
    chain of groups) are one group; a rank in no collective is its own. Groups in order of their lowest rank."""
    parent = {int(r): int(r) for r in ranks}

    def find(r: int) -> int:
        while parent[r] != r:
            parent[r] = parent[parent[r]]
            r = parent[r]
        return r

    if instances is not None and instances.height and {"pg", "rank"} <= set(instances.columns):
        for members in instances.group_by("pg").agg(pl.col("rank").unique()).get_column("rank").to_list():
            ms = [int(m) for m in members if int(m) in parent]
            for m in ms[1:]:
                parent[find(m)] = find(ms[0])
    out: dict[int, list[int]] = {}
    for r in sorted(parent):
        out.setdefault(find(r), []).append(r)
    return sorted(out.values(), key=lambda g: g[0])


def _bounded_ranks(groups: list[list[int]], rank_rows: Mapping[int, int], n_job: int) -> list[int]:
    """Whole coupled groups, in order, while one job step of them stays within :data:`REPLAY_ROWS` rows (the first
    group always): a sample bounded in ranks when one step of every rank is already over the budget."""
    keep: list[int] = []
    used = 0.0
    for g in groups:
        need = sum(rank_rows.get(r, 0) for r in g) / max(n_job, 1)
        if keep and used + need > REPLAY_ROWS:
            break
        keep += g
        used += need
    return keep


def replay_rows(lf: pl.LazyFrame, ranks: Sequence[int], rows: int, *, collect: Any = None,
                rank_rows: Mapping[int, int] | None = None,
                groups: list[list[int]] | None = None) -> tuple[pl.DataFrame | None, dict[str, Any]]:
    """The rows :func:`next_win` replays, and what they are (``whole``, ``steps``, ``of_steps``, ``stretches``, ``rows``;
    ``ranks`` / ``of_ranks`` when only some ranks replay).

    ``lf``: the trace (a scan or a frame's lazy view); ``ranks``: its ranks with GPU ops; ``rows``: its row count
    (all kinds: an upper bound of what replay reads). ``collect`` (LazyFrame → DataFrame) maps read errors.
    ``rank_rows`` (rows per rank) and ``groups`` (:func:`coupled_ranks`) bound the sample in ranks too: when a single
    job step of every rank is over :data:`REPLAY_ROWS`, whole coupled groups replay, in order, up to that budget (a
    job step is the slowest rank's; the groups left out are named in ``info``).
    Returns ``(None, info)`` when the trace cannot be sampled and is too large to replay whole.
    """
    from tracekit.replay.graph import REPLAY_COLUMNS, REPLAY_KINDS, replay_steps

    run = collect or (lambda q: q.collect())
    names = set(lf.collect_schema().names())
    cols = [c for c in REPLAY_COLUMNS if c in names]
    kind = pl.col("kind")
    base = lf.filter(kind.is_in(list(REPLAY_KINDS)))
    if rows <= REPLAY_ROWS:
        return run(base.select(cols)), {"whole": True, "rows": rows}
    st_cols = [c for c in ("rank", "kind", "ts_ns", "dur_ns", "profiled", "src") if c in names]
    st = run(lf.filter(kind == "step").select(st_cols))
    per: dict[int, np.ndarray] = {}
    for r in ranks:
        one = st.filter(pl.col("rank") == r)
        per[int(r)] = replay_steps(one).get_column("ts_ns").to_numpy() if one.height and "profiled" in names else np.zeros(0)
    n_job = min((a.size for a in per.values()), default=0)
    if n_job == 0:  # some rank replays as one synthetic step: only the whole trace will do
        if rows <= MAX_ROWS:
            return run(base.select(cols)), {"whole": True, "rows": rows}
        return None, {"whole": False, "why": f"a rank has no profiled steps and the trace has more than {MAX_ROWS:,} rows"}
    k = int(min(REPLAY_STEPS, n_job, max(1, REPLAY_ROWS * n_job // max(rows, 1))))
    if k >= n_job:
        return run(base.select(cols)), {"whole": True, "rows": rows}
    of_ranks = len(ranks)
    if rank_rows is not None and groups and rows > REPLAY_ROWS * n_job and len(groups) > 1:
        ranks = _bounded_ranks(groups, rank_rows, n_job)
    segs = max(1, min(REPLAY_SEGMENTS, k // 2))  # a stretch: one lead-in step and at least one measured step
    runs = _runs(n_job, k, segs)
    t = pl.coalesce(pl.col("launch_ts_ns"), pl.col("ts_ns")) if "launch_ts_ns" in names else pl.col("ts_ns")
    unprofiled = (kind == "step") & (pl.col("profiled") == False)  # noqa: E712 - calibration: every unprofiled step
    parts = []
    for r in ranks:
        ts = per[int(r)]
        span: pl.Expr | None = None
        for a, b in runs:
            lead = a + 1 if a > 0 else a  # the stretch's first step is its lead-in (not measured)
            m = (t >= int(ts[a])) & ~((kind == "step") & (pl.col("ts_ns") < int(ts[lead])))
            if b < ts.size:
                m = m & (t < int(ts[b]))
            span = m if span is None else (span | m)
        assert span is not None
        parts.append(run(base.filter((pl.col("rank") == r) & (span | unprofiled.fill_null(False))).select(cols)))
    df = pl.concat(parts, how="vertical_relaxed") if parts else None
    measured = sum(b - a - (1 if a > 0 else 0) for a, b in runs)
    info: dict[str, Any] = {"whole": False, "steps": measured, "of_steps": n_job, "stretches": [list(x) for x in runs],
                            "rows": int(df.height) if df is not None else 0}
    if len(ranks) < of_ranks:
        info.update(ranks=[int(r) for r in ranks], of_ranks=of_ranks)
    return df, info


@dataclass(frozen=True)
class Change:
    """One change next win can replay: its spec, what it is, and the changes it needs made first (their ``what``)."""

    spec: str
    what: str
    needs: tuple[str, ...] = ()


def candidates(res: Mapping[str, Any], meta: Mapping[str, Any] | None) -> tuple[list[tuple[str, str]], list[dict[str, str]]]:
    """(spec, what) of the verdict-based changes (MoE GEMM roofline, allreduce at NVLink speed), and skipped ideas with
    the reason. The structural ones (grouped experts, host syncs removed, CUDA graphs) come from the trace itself
    (:func:`structural_changes`)."""
    specs: list[tuple[str, str]] = []
    skipped: list[dict[str, str]] = []
    mg = res.get("moe_gemm") or {}
    if mg.get("status") == "ok":
        r = max(mg["ranks"], key=lambda x: x["gpu_ns"])
        f = (r.get("roofline_pct_max") or 100.0) / 100.0
        if f < 0.98:
            specs.append((f"moe_gemm={f:.3f}", "MoE GEMM at its roofline"))
        else:
            skipped.append({"what": "MoE GEMM at its roofline", "why": "its roofline bound is already reached (weight bytes are a bound)"})
    else:
        skipped.append({"what": "MoE GEMM at its roofline", "why": f"no MoE GEMM verdict ({mg.get('status', 'absent')})"})
    for row in res.get("interconnect") or []:
        if row.get("path") and row["path"] != "NVLink" and row.get("coll_name") == "allreduce":
            nv = (row.get("model_bus_bw_bytes_per_s") or {}).get("NVLink")
            p = gpu_peaks(((meta or {}).get("ranks") or [{}])[0].get("device_name")) if (meta or {}).get("ranks") else None
            b = p.nvlink_bytes_per_s if p and p.nvlink_bytes_per_s else None
            if nv and b:
                specs.append((f"allreduce=bw:{b / 1e9:.0f}GB/s,lat:8us", f"allreduce at NVLink speed (now {row['path']})"))
        if row.get("fusion_saving_ns_per_step"):
            skipped.append({"what": f"{row['coll_name']} fusion ({row.get('calls_per_step') or 0:.0f} calls per step)",
                            "why": f"not a replay scenario; the interconnect model saves ~{row['fusion_saving_ns_per_step'] / 1e3:.0f} µs per step"})
    return specs, skipped


GROUPED = "grouped experts"
NO_SYNC = "host syncs removed"
GRAPHS = "CUDA graphs"


def structural_changes(st: Any, meta: Mapping[str, Any] | None) -> tuple[list[Change], list[dict[str, str]]]:
    """The changes the trace's structure (:func:`tracekit.replay.structural.structure`) allows, each with what it
    needs first: a CUDA graph cannot capture a host sync or a loop whose shapes depend on data read back, so graphs
    need the per-expert loop grouped and the other syncs gone; a per-expert loop's syncs go with the loop."""
    out: list[Change] = []
    skipped: list[dict[str, str]] = []
    if st.loop_blocks:
        out.append(Change("grouped-experts", GROUPED))
    if st.other_syncs:
        out.append(Change("no-host-sync", NO_SYNC))
    elif st.loop_syncs:
        skipped.append({"what": NO_SYNC, "why": f"the {st.loop_syncs} host syncs in the steps are the per-expert loop's "
                                               "(it reads the expert counts back): grouped experts removes them"})
    else:
        skipped.append({"what": NO_SYNC, "why": "no host sync inside the steps besides each step's result"})
    cap = (meta or {}).get("capture") or {}
    graphs = bool((((cap.get("workload") or {}).get("serve") or {}).get("cuda_graphs"))) if isinstance(cap, Mapping) else False
    if graphs or st.graph_launches:
        skipped.append({"what": GRAPHS, "why": "the capture already replays CUDA graphs"})
    else:
        pre = [c for c in out if c.spec in ("grouped-experts", "no-host-sync")]
        out.append(Change("+".join([*(c.spec for c in pre), "cuda-graph"]), GRAPHS, tuple(c.what for c in pre)))
    return out, skipped


def _row(c: Change, p: Any) -> dict[str, Any]:
    acc = confidence(c.spec)
    return {"spec": c.spec, "what": c.what, "needs": list(c.needs), "step_ns_p50": p.step_ns_p50,
            "tokens_per_s": p.tokens_per_s, "change": p.change, "within_noise": p.within_noise,
            "confidence": {"kind": acc.kind, "error_median": acc.error_median, "error_max": acc.error_max,
                           "pairs": acc.pairs} if acc else None}


def _rank(changes: list[Change], preds: list[Any], skipped: list[dict[str, str]], top: int) -> list[dict[str, Any]]:
    """Rows of the changes that can be made as stated, by predicted gain; a change that needs others first is
    listed under the last of them as ``then`` (its prediction is of the whole sequence)."""
    rows: list[dict[str, Any]] = []
    dependent: list[dict[str, Any]] = []
    for c, p in zip(changes, preds):
        row = _row(c, p)
        if p.change > -MIN_GAIN or p.within_noise:
            why = ("inside the noise floor" if p.within_noise else f"replay predicts {p.change:+.1%}" if p.change < 0
                   else f"replay predicts {p.change:+.0%}")
            skipped.append({"what": c.what, "why": f"no predicted gain ({why})"})
        elif c.needs:
            dependent.append(row)
        else:
            rows.append(row)
    rows.sort(key=lambda x: x["change"])
    for d in dependent:
        host = next((r for r in rows if r["what"] in d["needs"]), None)
        if host is not None:  # under the best-ranked change it needs
            host.setdefault("then", []).append(d)
        else:  # none of what it needs helps on its own: the sequence is ranked as one row
            rows.append(d)
    rows.sort(key=lambda x: x["change"] if not x["needs"] else min(x["change"], 0.0))
    return rows[:top]


def next_win(df: pl.DataFrame | None, meta: Mapping[str, Any] | None, res: Mapping[str, Any], *, top: int = 4,
             replayed: Mapping[str, Any] | None = None, instances: pl.DataFrame | None = None) -> dict[str, Any]:
    """The ``next_win`` section: ``baseline``, ranked ``rows`` (spec, what, step_ns_p50, tokens_per_s, change,
    confidence, and ``then``: changes that need this one first), ``skipped`` (with the reason).

    ``df``: the rows to replay (:func:`replay_rows`), ``replayed`` its description; ``instances``: the analysis'
    matched collective instances on the trace's clock (:meth:`AnalysisResult.instances_in_input_time`), used by
    replay instead of matching again. ``baseline.profiled_step_ns_p50`` is the trace's step time
    (:mod:`tracekit.analysis.steptime`, as analyze's ``steps.step_time``); ``baseline.step_ns_p50`` the replay's
    calibrated one (on the program's own clock when the capture has unprofiled steps), which predictions compare to."""
    specs, skipped = candidates(res, meta)
    if res.get("device_mode") == "cpu":
        return {"status": "cpu_mode", "why": "replay models GPU streams and kernel launches; a CPU-mode trace has neither "
                                             "(its operators run on the host thread), so no change can be replayed", "rows": [],
                "skipped": skipped}
    if df is None:
        why = (replayed or {}).get("why") or f"trace larger than {MAX_ROWS:,} rows"
        return {"status": "not_replayed", "why": f"{why}: run `tracekit replay` with --what-if "
                + " ".join([*(s for s, _ in specs), "grouped-experts", "no-host-sync", "cuda-graph"]), "rows": [],
                "skipped": skipped}
    from tracekit._errors import TracekitError
    from tracekit.replay.api import replay
    from tracekit.replay.graph import build_graph
    from tracekit.replay.structural import structure

    try:
        g = build_graph(df, instances)
        changes, sk = structural_changes(structure(g), meta)
        changes = [*changes, *(Change(s, w) for s, w in specs)]
        skipped += sk
        if not changes:
            return {"status": "no_candidates", "rows": [], "skipped": skipped}
        # step times only: no critical-path walk (16 % of next win's time on the corpus, read by nothing here)
        r = replay(df, dict(meta or {}), [c.spec for c in changes], instances=instances, graph=g, critical_path_steps=0)
    except (TracekitError, ValueError, KeyError) as e:
        return {"status": "replay_failed", "why": f"{type(e).__name__}: {e}", "rows": [], "skipped": skipped}
    base = r.baseline
    if not math.isfinite(base.step_ns_p50):  # no job step of one shape to time: no figure to compare to
        return {"status": "no_steps", "why": "the replay found no job step of one shape to time (the trace's steps "
                "carry no mode or token count), so no change has a step time to compare", "rows": [], "skipped": skipped}
    rows = _rank(changes, r.what_if, skipped, top)
    return {"status": "ok", "baseline": {"step_ns_p50": base.step_ns_p50, "tokens_per_s": base.tokens_per_s,
                                         "calibrated": r.calibrated, "measured_step_ns_p50": base.measured_step_ns_p50,
                                         "profiled_step_ns_p50": base.profiled_step_ns_p50,
                                         "replayed": dict(replayed or {"whole": True, "rows": df.height})},
            "rows": rows, "skipped": skipped}


def _tps(x: float | None) -> str:
    return f", {x:,.0f} tokens/s" if x else ""


def _item(r: Mapping[str, Any]) -> str:
    c = r.get("confidence")
    conf = f"; {confidence_text(c)}" if c else ""
    return f"{r['what']}: step {r['step_ns_p50'] / 1e6:.2f} ms ({r['change']:+.0%}){_tps(r['tokens_per_s'])}{conf}"


def confidence_text(c: Mapping[str, Any]) -> str:
    """The accuracy-table row as words (``tracekit.replay.accuracy``)."""
    return (f"replay was within {c['error_max']:.0%} of {c['pairs']} measured change{'s' if c['pairs'] != 1 else ''} "
            f"of this kind (median {c['error_median']:.0%})")


def next_win_finding(nw: Mapping[str, Any]) -> str | None:
    """One sentence: the ranked changes that can be made as stated, with predicted step time, tokens/s and confidence;
    after each, the changes it makes possible (``then``); None when there is none (a CPU-mode trace is not replayed:
    the report's next-win section and ``next_win.why`` say so, but it is no finding: it would rank above what the
    trace does show)."""
    if nw.get("status") != "ok" or not nw.get("rows"):
        return None
    b = nw["baseline"]
    items = []
    for i, r in enumerate(nw["rows"], 1):
        then = "".join(f"; then {t['what']} (needs {' and '.join(t['needs'])} first): step {t['step_ns_p50'] / 1e6:.2f} ms "
                       f"({t['change']:+.0%}){_tps(t['tokens_per_s'])}" for t in r.get("then") or [])
        need = f" (after {' and '.join(r['needs'])}, which it needs)" if r.get("needs") else ""
        items.append(f"{i}. {_item(r).replace(': step', need + ': step', 1)}{then}")
    if b.get("calibrated"):  # one step time: the program's own clock, which the predictions are on
        now = f"now {b['step_ns_p50'] / 1e6:.2f} ms per step on the program's own clock{_tps(b.get('tokens_per_s'))}"
    else:
        now = (f"uncalibrated: no unprofiled step timing, so predictions include the profiler's overhead; now "
               f"{b['step_ns_p50'] / 1e6:.2f} ms per step{_tps(b.get('tokens_per_s'))}")
    none = [f"{x['what']} ({x['why'].removeprefix('no predicted gain (').removesuffix(')')})" for x in nw.get("skipped") or []
            if x["why"].startswith("no predicted gain")]
    tail = f" Not predicted to shorten the step: {'; '.join(none)}." if none else ""
    return f"Next win ({now}): " + " ".join(items) + "." + tail


def next_win_stage(run: FinishedRun) -> StageOutput:
    """The ``next_win`` section and its finding, as a stage after the cross-rank finish
    (:func:`tracekit.analysis.stage.pipeline.run_analysis` ``after``; the finding goes through the one ranker).

    Replay reads a bounded sample of the trace (:func:`replay_rows`: the whole trace up to ``REPLAY_ROWS`` rows, else
    stretches of steps), one rank at a time, from the scan or the in-memory frame alike, and takes the collective
    instances the analysis matched (``plan.view``, back on the trace's clock)."""
    ov, meta, plan = run.overview, run.meta, run.plan
    cpu = bool(ov.cpu_ranks) and not bool(ov.ranks["has_gpu"].any())
    view = {**run.sections, "device_mode": "cpu" if cpu else meta.get("device_mode", "gpu")}
    df, info = None, None
    if not cpu:
        gpu = [int(r) for r in ov.ranks.filter(pl.col("has_gpu"))["rank"].to_list()]
        path = getattr(run.source, "path", "trace")
        rank_rows = {int(r): int(n) for r, n in ov.ranks.select("rank", "rows").iter_rows()}
        df, info = replay_rows(run.source.lazy(), gpu, int(ov.ranks["rows"].sum()), collect=lambda q: collect_trace(q, path),
                               rank_rows=rank_rows, groups=coupled_ranks(gpu, plan.view))
    inst = None
    if df is not None and plan.view is not None and plan.view.height:
        inst = instances_in_input_time(plan.view, plan.align.offsets_ns if plan.align.applied else {})
    nw = next_win(df, meta, view, replayed=info, instances=inst)
    del df, inst
    s = next_win_finding(nw)
    return StageOutput({"next_win": nw}, [Finding("next_win", s, 1e15)] if s else [])


#: the finished sections :func:`next_win_stage` reads (:func:`candidates`): a cluster ships only these to its task
next_win_stage.sections_read = ("moe_gemm", "interconnect")  # type: ignore[attr-defined]
