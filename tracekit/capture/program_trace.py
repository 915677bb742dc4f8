"""Turn a ``tracekit capture -- PROGRAM`` run directory into one ``trace.parquet``.

Inputs, written by :mod:`tracekit.capture.program_hook` in each rank:
``rank{r}.win{k}.trace.json`` (one per completed profiler window) and
``rank{r}.extra.json`` (step records, windows, errors); plus the capturing
process's telemetry counters (one sampler per local GPU).

The trace holds the capture window only: profiler windows, the step records
that ran inside the capture span (profiled, and unprofiled ones between two
windows), and the counters in that span. Steps before the capture are only
summarized (their median is the unprofiled baseline for the profiler overhead).
Step fields (mode, batch size, tokens) come from the step-label grammar
(:mod:`tracekit.steplabels`, through :func:`tracekit.ingest.common.parse_steps`) applied to the
records' labels; ``step_id`` is the rank's own step count, ``profiled`` whether the step
ran inside a window.

:func:`step_rows`, :func:`window_table` and :func:`summarize` are pure.
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl

from tracekit._errors import CaptureError, QualityLog
from tracekit.capture.instrument import STEP_SRC
from tracekit.capture.window import union_windows
from tracekit.schema import conform, empty_frame, frame_from_rows, write_trace

__all__ = ["assemble_program", "counters_frame", "load_program_run", "step_regex", "step_rows", "summarize", "window_table"]

_WIN = re.compile(r"^rank(\d+)\.win(\d+)\.trace\.json$")


def step_regex(steps_from: str | None = None) -> list[str]:
    """The regexes the program hook tests record_function names against (a name is a step if one matches).

    The step-label grammar's families (:mod:`tracekit.steplabels`, the owner), or ``steps_from`` alone:
    as in ``convert --steps-from``, a user regex replaces the families.
    """
    from tracekit.steplabels import FAMILIES, compile_steps_from

    if steps_from is not None:
        return [str(compile_steps_from(steps_from))]
    return list(FAMILIES.values())


def load_program_run(run_dir: Path) -> tuple[list[Path], dict[int, dict[str, Any]]]:
    """Complete window files (sorted by rank, window) and the extras of ranks that wrote them."""
    files = sorted((p for p in Path(run_dir).iterdir() if _WIN.match(p.name)),
                   key=lambda p: tuple(int(x) for x in _WIN.match(p.name).groups()))  # type: ignore[union-attr]
    extras: dict[int, dict[str, Any]] = {}
    for p in sorted(Path(run_dir).glob("rank*.extra.json")):
        try:
            ex = json.loads(p.read_text())
            extras[int(ex["rank"])] = ex
        except (ValueError, OSError, KeyError):
            continue
    return files, extras


def _span(ex: dict[str, Any]) -> tuple[int, int] | None:
    w = [x for x in ex.get("windows") or [] if not x.get("failed")]
    if not w:
        return None
    return min(int(x["start_ns"]) for x in w), max(int(x["end_ns"]) for x in w)


def step_rows(extras: dict[int, dict[str, Any]], steps_from: str | None = None) -> pl.DataFrame:
    """Step rows (``src = tracekit.step``) of the records inside each rank's capture span."""
    rows: list[dict[str, Any]] = []
    for r, ex in sorted(extras.items()):
        sp = _span(ex)
        if sp is None:
            continue
        for i, (s, e, label, k) in enumerate(ex.get("records") or []):
            if s >= sp[0] and e <= sp[1]:
                rows.append({"rank": r, "kind": "range", "ts_ns": int(s), "dur_ns": max(0, int(e) - int(s)),
                             "name": str(label), "step_id": i, "profiled": int(k) >= 0, "src": STEP_SRC})
    if not rows:
        return empty_frame()
    from tracekit.ingest.common import parse_steps

    raw = frame_from_rows(rows)
    keep = raw.select("step_id", "profiled")
    parsed = parse_steps(raw, steps_from)  # the grammar gives mode / batch size / tokens; row order is kept
    return conform(parsed.with_columns(
        pl.lit("step").cast(parsed.schema["kind"]).alias("kind"),
        keep["step_id"].alias("step_id"),
        keep["profiled"].alias("profiled"),
    ))


def window_table(extras: dict[int, dict[str, Any]]) -> pl.DataFrame:
    """One row per (rank, window): start/end ns, steps, late steps, stop/export seconds, JSON bytes, and the
    signals that arrived during its stop/export (held, delivered after)."""
    rows = []
    for r, ex in sorted(extras.items()):
        for w in ex.get("windows") or []:
            rows.append({"rank": r, "window": int(w["k"]), "start_ns": int(w["start_ns"]), "end_ns": int(w["end_ns"]),
                         "steps": int(w.get("steps") or 0), "late_steps": int(w.get("late") or 0),
                         "stop_s": float(w.get("stop_s") or 0.0), "export_s": float(w.get("export_s") or 0.0),
                         "bytes": int(w.get("bytes") or 0), "signals_held": int(w.get("signals_held") or 0),
                         "cut_by": w.get("cut_by"), "failed": bool(w.get("failed"))})
    schema = {"rank": pl.Int32, "window": pl.Int32, "start_ns": pl.Int64, "end_ns": pl.Int64, "steps": pl.Int64,
              "late_steps": pl.Int64, "stop_s": pl.Float64, "export_s": pl.Float64, "bytes": pl.Int64, "signals_held": pl.Int64,
              "cut_by": pl.String, "failed": pl.Boolean}
    return pl.DataFrame(rows, schema=schema)


def _median(xs: Sequence[int]) -> float | None:
    return float(statistics.median(xs)) if xs else None


def summarize(ex: dict[str, Any]) -> dict[str, Any]:
    """One rank's step timings: before the capture (unprofiled baseline), profiled, between windows."""
    sp = _span(ex)
    recs = ex.get("records") or []
    before = [e - s for s, e, _l, _k in recs if sp is None or e <= sp[0]]
    prof = [e - s for s, e, _l, k in recs if k >= 0]
    between = [e - s for s, e, _l, k in recs if k < 0 and sp is not None and s >= sp[0] and e <= sp[1]]
    mb, mp = _median(before[len(before) // 2:]), _median(prof)  # the later half: past the warm-up
    return {
        "steps_seen": int(ex.get("steps_seen") or 0),
        "steps_before_capture": len(before),
        "steps_profiled": len(prof),
        "steps_between_windows": len(between),
        "step_median_ns": {"before_capture": mb, "profiled": mp, "between_windows": _median(between)},
        "profiled_step_slowdown_pct": (100.0 * (mp / mb - 1.0)) if mb and mp else None,
        "done_reason": ex.get("done_reason"),
    }


def counters_frame(samplers: Sequence[Any], extras: dict[int, dict[str, Any]], lo: int | None, hi: int | None) -> tuple[pl.DataFrame, dict[int, int]]:
    """Counter rows of the GPUs the ranks used, in ``[lo, hi]``, with the rank that used each GPU.

    A rank's GPU: its CUDA ordinal (``cuda_device``) among the visible GPUs; a single rank that
    never initialised CUDA gets the first GPU. Returns (rows, {nvml index: rank}).
    """
    by_ordinal = {int(s.rank): s for s in samplers}
    owner: dict[int, int] = {}
    for r, ex in sorted(extras.items()):
        o = ex.get("cuda_device")
        if o is None and len(extras) == 1 and by_ordinal:
            o = min(by_ordinal)
        if o is not None and int(o) in by_ordinal:
            owner.setdefault(by_ordinal[int(o)].device, r)
    frames = []
    for s in samplers:
        rk = owner.get(s.device)
        rows = s.to_rows()
        if rk is None or not rows["ts_ns"]:
            continue
        f = pl.DataFrame({k: v for k, v in rows.items() if k != "rank"}).with_columns(pl.lit(rk, dtype=pl.Int32).alias("rank"))
        if lo is not None and hi is not None:
            # power_limit_w is read once at start: keep it, at the capture's start
            f = f.with_columns(pl.when(pl.col("name") == "power_limit_w").then(pl.lit(lo)).otherwise(pl.col("ts_ns")).alias("ts_ns"))
            f = f.filter(pl.col("ts_ns").is_between(lo, hi))
        frames.append(conform(f))
    return (pl.concat(frames, how="vertical_relaxed") if frames else empty_frame()), owner


def _window_telemetry(counters: pl.DataFrame, windows: pl.DataFrame) -> list[dict[str, Any]]:
    """Mean of each counter per (rank, window): counter samples located with the interval primitive."""
    if counters.height == 0 or windows.height == 0:
        return []
    from tracekit.core.intervals import covered_by

    pts = counters.select(pl.col("rank").cast(pl.Int32), "ts_ns", pl.col("name").cast(pl.String), "value")
    iv = windows.select(pl.col("rank").cast(pl.Int32), pl.col("start_ns").alias("start"), (pl.col("end_ns") + 1).alias("end"), "window")
    j = covered_by(pts, iv, by="rank", at="ts_ns", payload=["window"]).filter(pl.col("window").is_not_null())
    agg = j.group_by(["rank", "window", "name"]).agg(pl.col("value").mean().alias("mean")).sort(["rank", "window", "name"])
    out: dict[tuple[int, int], dict[str, Any]] = {}
    for r, k, n, m in agg.iter_rows():
        out.setdefault((r, k), {"rank": r, "window": k})[f"mean_{n}"] = m
    return list(out.values())


def assemble_program(
    run_dir: Path,
    out: Path,
    *,
    command: Sequence[str],
    options: dict[str, Any],
    samplers: Sequence[Any] = (),
    telemetry: dict[str, Any] | None = None,
    quality: QualityLog | None = None,
    force: bool = False,
) -> dict[str, Any]:
    """Write ``out`` from a program run directory; returns the footer metadata."""
    quality = quality if quality is not None else QualityLog()
    files, extras = load_program_run(run_dir)
    _rank_notes(run_dir, extras, command, quality)
    spans = [sp for ex in extras.values() if (sp := _span(ex)) is not None]
    lo, hi = (min(s for s, _ in spans), max(e for _, e in spans)) if spans else (None, None)
    wins = window_table(extras)
    steps_from = options.get("steps_from")
    steps = step_rows(extras, steps_from)
    counters, owner = counters_frame(samplers, extras, lo, hi)
    tel = dict(telemetry or {})
    tel["gpu_of_rank"] = {str(r): d for d, r in owner.items()}
    leader = extras.get(0) or extras[min(extras)]
    _capture_notes(options, leader, bool(files), tel, counters.height, quality)
    capture = {
        "target": "program",
        "command": list(command),
        "options": options,
        "window_ns": [lo, hi] if lo is not None else None,
        "duration_s": options.get("duration_s"),
        "profiler_windows": union_windows({int(w["k"]): (int(w["start_ns"]), int(w["end_ns"])) for w in ex.get("windows") or []
                                           if not w.get("failed")} for ex in extras.values()),
        "windows": wins.to_dicts(),
        "window_telemetry": _window_telemetry(counters, wins),
        "summary": summarize(leader),
        "ranks_summary": {str(r): summarize(ex) for r, ex in sorted(extras.items())},
        "telemetry": tel,
    }
    ranks = [{"rank": r, "pid": ex.get("pid"), "torch": ex.get("torch"), "cuda_device": ex.get("cuda_device")} for r, ex in sorted(extras.items())]
    meta = {"capture": capture, "ranks_capture": ranks, "quality": [q.to_json() for q in quality]}
    frames = [f for f in (steps, counters) if f.height]
    if files:
        from tracekit.ingest.convert import convert

        convert(files, out, force=force, extra_frames=frames, metadata=meta, steps_from=steps_from)
    else:
        write_trace(pl.concat(frames, how="vertical_relaxed") if frames else empty_frame(), out,
                    {"world_size": len(extras), **meta}, force=force)
    return meta


def _rank_notes(run_dir: Path, extras: dict[int, dict[str, Any]], command: Sequence[str], quality: QualityLog) -> None:
    """Flags of each rank's run (started but wrote nothing, errors, windows cut or late, records dropped); a
    :class:`CaptureError` when no rank finished its capture."""
    states = sorted(Path(run_dir).glob("rank*.state.json"))
    for p in states:
        try:
            r = int(json.loads(p.read_text())["rank"])
        except (ValueError, OSError, KeyError):
            continue
        if r not in extras:
            quality.add("capture_rank_missing", f"rank {r} started but wrote no records (killed before its capture ended?)", rank=r)
    if not extras:
        if not states:
            raise CaptureError(f"{' '.join(command)}: no process imported torch, so nothing was profiled; "
                               "check the command after -- (a Python program that imports torch)")
        raise CaptureError(f"{' '.join(command)}: no rank finished its capture; see the program's output above")
    for r, ex in sorted(extras.items()):
        for err in ex.get("errors") or []:
            quality.add("capture_rank_error", f"rank {r}: {err}", rank=r)
        for w in ex.get("windows") or []:
            if w.get("cut_by"):
                quality.add("capture_window_cut", f"rank {r}: window {w['k']} cut short by {w['cut_by']} (kept)", severity="info", rank=r)
            if w.get("late"):
                quality.add("capture_window_late", f"rank {r}: window {w['k']} boundary applied {w['late']} step(s) late", rank=r)
        if ex.get("records_dropped"):
            quality.add("capture_records_dropped", f"rank {r}: {ex['records_dropped']} step records beyond the cap were dropped", rank=r)


def _capture_notes(options: dict[str, Any], leader0: dict[str, Any], have_files: bool, tel: dict[str, Any], n_counters: int,
                   quality: QualityLog) -> None:
    """Flags of the capture as a whole: no telemetry, no step marked, no profiler window completed (and why)."""
    if not tel.get("available"):
        quality.add("telemetry_unavailable", f"no GPU telemetry: {tel.get('reason') or 'not sampled'}", severity="info")
    elif n_counters == 0:
        quality.add("telemetry_unavailable", "no GPU telemetry in the capture window (no rank used a sampled GPU)", severity="info")
    if options.get("steps") and not leader0.get("steps_seen"):
        quality.add("capture_no_steps", f"--steps {options['steps']}: the program marked no step (record_function labels such as "
                    "forward#i or ProfilerStep#N; or pass --steps-from REGEX), so windows followed the clock")
    if not have_files:
        why = ""
        if not leader0.get("windows"):
            sa = options.get("start_at")
            why = (f" (the start condition never came: --start-at {sa}" + (f" after --delay {options.get('delay_s'):g}s" if options.get("delay_s") else "") + ")"
                   if sa else f" (the program ended before --delay {options.get('delay_s') or 0:g}s, or before its first window closed)")
        quality.add("capture_no_profiler_windows", "no profiler window completed" + why + "; the trace holds step records and counters only")
