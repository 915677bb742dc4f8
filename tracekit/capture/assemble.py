"""Turn a capture run directory into one ``trace.parquet``.

Inputs (written by the ranks): ``rank{r}.win{k}.trace.json.gz`` Kineto files
and ``rank{r}.extra.json`` (step records, telemetry counters, ground-truth
markers, rank metadata). The step records, counters and markers become
schema frames passed as ``extra_frames`` to :func:`tracekit.ingest.convert.convert`;
capture facts (windows, ground truth, unprofiled step timings, tokens/s,
quality flags) go into the footer metadata.

:func:`summarize_steps` and :func:`build_metadata` are pure (tested on
hand-built records).

A kept run directory (``--keep-raw``, or the one a failed write names) converts
later with ``python -m tracekit.capture.assemble DIR -o trace.parquet``.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any, Sequence

import polars as pl

from tracekit._errors import CaptureError, InputError, QualityLog, TracekitError
from tracekit.capture.window import union_windows
from tracekit.schema import POLARS_SCHEMA, conform, empty_frame, frame_from_rows, write_trace

__all__ = ["load_run", "frames_from_extras", "summarize_steps", "build_metadata", "assemble", "assemble_dir", "main", "GROUND_TRUTH_SRC"]

GROUND_TRUTH_SRC = "tracekit.ground_truth"


def load_run(run_dir: Path, world: int) -> tuple[list[Path], dict[int, dict[str, Any]]]:
    """Kineto files (sorted by rank, window) and the per-rank extras that exist (ranks below ``world``)."""
    keyed = [(k, p) for p in run_dir.glob("rank*.win*.trace.json.gz") if (k := _file_key(p)) is not None]
    files = [p for _k, p in sorted(keyed)]
    extras: dict[int, dict[str, Any]] = {}
    for p in sorted(run_dir.glob("rank*.extra.json")):
        r = _rank_of(p)
        if r is None or r >= world:
            continue
        try:
            extras[r] = json.loads(p.read_text())
        except (ValueError, OSError):
            pass
    return files, extras


_WINDOW_RE = re.compile(r"^rank(\d+)\.win(\d+)\.trace\.json\.gz$")
_RANK_RE = re.compile(r"^rank(\d+)\.")


def _file_key(p: Path) -> tuple[int, int] | None:
    """(rank, window) of ``rank{r}.win{k}.trace.json.gz``; None for any other name."""
    m = _WINDOW_RE.match(p.name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _rank_of(p: Path) -> int | None:
    """The rank of ``rank{r}.<anything>``; None for any other name."""
    m = _RANK_RE.match(p.name)
    return int(m.group(1)) if m else None


def frames_from_extras(extras: dict[int, dict[str, Any]]) -> list[pl.DataFrame]:
    """Step rows, counter rows and ground-truth instant rows of all ranks."""
    step_rows: list[dict[str, Any]] = []
    marker_rows: list[dict[str, Any]] = []
    counter_frames: list[pl.DataFrame] = []
    for r, ex in sorted(extras.items()):
        step_rows.extend(ex.get("steps") or [])
        for m in ex.get("markers") or []:
            marker_rows.append(
                {
                    "rank": r,
                    "kind": "instant",
                    "ts_ns": int(m["ts_ns"]),
                    "dur_ns": 0,
                    "name": "tk.fault.delay",
                    "step_id": int(m["step_id"]),
                    "value": m["delay_ns"] / 1e6,  # ms actually slept
                    "src": GROUND_TRUTH_SRC,
                }
            )
        c = ex.get("counters") or {}
        if c.get("ts_ns"):
            counter_frames.append(
                conform(pl.DataFrame(c, schema_overrides={k: _plain(k) for k in c}, strict=False))
            )
    out = [frame_from_rows(step_rows) if step_rows else empty_frame()]
    out.append(frame_from_rows(marker_rows) if marker_rows else empty_frame())
    out.append(pl.concat(counter_frames) if counter_frames else empty_frame())
    return [f for f in out if f.height]


def _plain(col: str) -> Any:
    dt = POLARS_SCHEMA[col]
    return pl.String if isinstance(dt, pl.Categorical) else dt


def _median(xs: Sequence[int]) -> float | None:
    return float(statistics.median(xs)) if xs else None


def summarize_steps(steps: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Tokens/s and unprofiled step timings of one rank's step rows.

    ``blocks_median_ns``: medians of consecutive blocks of 40 unprofiled DECODE
    steps (replay calibrates its CPU-gap scale against these; 2 blocks minimum).
    ``profiler_overhead_pct``: median profiled DECODE step vs unprofiled, same rank.
    """
    if not steps:
        return {"steps": 0}
    unprof = [s for s in steps if not s.get("profiled")]
    prof = [s for s in steps if s.get("profiled")]
    dec_u = [int(s["dur_ns"]) for s in unprof if s.get("step_mode") == "DECODE"]
    dec_p = [int(s["dur_ns"]) for s in prof if s.get("step_mode") == "DECODE"]
    span = max(s["ts_ns"] + s["dur_ns"] for s in steps) - min(s["ts_ns"] for s in steps)
    tok = sum(int(s.get("tokens") or 0) for s in steps)
    busy_u = sum(int(s["dur_ns"]) for s in unprof)
    tok_u = sum(int(s.get("tokens") or 0) for s in unprof)
    by_mode: dict[str, float | None] = {}
    for mode in sorted({str(s["step_mode"]) for s in unprof if s.get("step_mode")}):
        by_mode[mode] = _median([int(s["dur_ns"]) for s in unprof if s.get("step_mode") == mode])
    blocks = [dec_u[i : i + 40] for i in range(0, len(dec_u) - 39, 40)]
    med_u, med_p = _median(dec_u), _median(dec_p)
    return {
        "steps": len(steps),
        "profiled_steps": len(prof),
        "tokens": tok,
        "tokens_per_s": tok / (span / 1e9) if span > 0 else None,
        "unprofiled_tokens_per_s": tok_u / (busy_u / 1e9) if busy_u > 0 else None,
        "unprofiled_median_ns": by_mode,
        "blocks_median_ns": [_median(b) for b in blocks],
        "decode_median_ns": {"unprofiled": med_u, "profiled": med_p},
        "profiler_overhead_pct": (100.0 * (med_p / med_u - 1.0)) if med_u and med_p else None,
    }


def build_metadata(
    opts: dict[str, Any],
    extras: dict[int, dict[str, Any]],
    world: int,
    quality: QualityLog,
    *,
    stopped_by: str | None = None,
) -> dict[str, Any]:
    """Footer metadata: world, ranks[i], capture{...}, quality.

    ``stopped_by``: what interrupted the capture (``"Ctrl-C"``, ``"SIGTERM"``), named in the
    ``capture_interrupted`` flag added when a rank reports it stopped early.
    """
    ranks = []
    for r in range(world):
        m = dict((extras.get(r) or {}).get("meta") or {})
        m.pop("model", None)
        m.pop("serve", None)
        m["rank"] = r
        ranks.append(m)
        if r not in extras:
            quality.add("capture_rank_missing", f"rank {r} wrote no records (crashed or killed)", rank=r)
        for err in (extras.get(r) or {}).get("errors") or []:
            quality.add("capture_rank_error", f"rank {r}: {err}", rank=r)
    m0 = (extras.get(min(extras)) if extras else {}) or {}
    meta0 = m0.get("meta") or {}
    starts = [e["meta"]["loop_start_ns"] for e in extras.values() if "loop_start_ns" in e.get("meta", {})]
    ends = [e["meta"]["loop_end_ns"] for e in extras.values() if "loop_end_ns" in e.get("meta", {})]
    reasons = {e.get("meta", {}).get("stop_reason") for e in extras.values()}
    if "interrupted" in reasons:
        by = stopped_by or "a stop request (Ctrl-C or SIGTERM)"
        quality.add("capture_interrupted", f"capture stopped early by {by}; kept what was collected", severity="info")
    gt: dict[str, Any] = {}
    if opts.get("delay_rank") is not None and opts.get("delay_ms"):
        ev = ((extras.get(opts["delay_rank"]) or {}).get("markers")) or []
        gt = {
            "straggler": {
                "rank": opts["delay_rank"],
                "delay_ms": opts["delay_ms"],
                "every": opts.get("delay_every", 1),
                "where": "host sleep at the start of the forward, inside tk.fwd",
                "injected": len(ev),
                "steps": [e["step_id"] for e in ev][:10000],
            }
        }
    capture = {
        "target": "builtin",
        "workload": {"model": meta0.get("model"), "serve": meta0.get("serve"), "options": opts},
        "window_ns": [min(starts), max(ends)] if starts and ends else None,
        "duration_s": opts.get("duration_s"),
        "profiler_windows": union_windows({i: (w[0], w[1]) for i, w in enumerate(e.get("meta", {}).get("profiler_windows") or [])}
                                          for e in extras.values()),
        "ground_truth": gt,
        "summary": summarize_steps((m0.get("steps") or [])),
        # the cores the ranks shared (builtin ranks run on this host): findings detect CPU oversubscription with it
        "host": {"cpus": _host_cpus()},
    }
    return {"world_size": world, "ranks": ranks, "capture": capture, "quality": [q.to_json() for q in quality]}


def _host_cpus() -> int:
    from tracekit.capture.options import host_cores

    return host_cores()


def assemble(
    run_dir: Path,
    out: Path,
    opts: dict[str, Any],
    world: int,
    *,
    force: bool = False,
    quality: QualityLog | None = None,
    stopped_by: str | None = None,
) -> dict[str, Any]:
    """Convert a run directory into ``out``; returns the metadata written."""
    quality = quality if quality is not None else QualityLog()
    files, extras = load_run(run_dir, world)
    if not files and not extras:
        raise CaptureError(f"{run_dir}: no rank wrote anything; see the rank errors above and retry with --ranks 1")
    if not files:
        quality.add("capture_no_profiler_windows", "no profiler window completed; the trace holds step records and counters only")
    frames = frames_from_extras(extras)
    meta = build_metadata(opts, extras, world, quality, stopped_by=stopped_by)
    meta["source_files"] = [f.name for f in files]
    if files:
        from tracekit.ingest.convert import convert

        convert(files, out, force=force, extra_frames=frames, metadata=meta)
    else:
        write_trace(pl.concat(frames) if frames else empty_frame(), out, meta, force=force)
    return meta


def assemble_dir(raw_dir: str | Path, out: str | Path, *, force: bool = False) -> dict[str, Any]:
    """Convert a kept run directory into ``out``.

    Accepts a ``--keep-raw`` directory, a run directory kept after a failed write
    (disk full) and a ``capture_scripts/capture_raw.py`` directory. ``run.json``
    (options, the parent's quality flags, what stopped the capture) is used when
    present; without it the world size is the highest rank seen in the files + 1.
    """
    raw = Path(raw_dir)
    if not raw.is_dir():
        raise InputError(f"{raw}: no such directory; pass the directory a capture kept (--keep-raw or the path its error named)")
    run = raw / "run.json"
    info: dict[str, Any] = {}
    if run.exists():
        try:
            info = json.loads(run.read_text())
        except (ValueError, OSError) as e:
            raise InputError(f"{run}: unreadable ({type(e).__name__}: {e}); delete it to assemble without the run options") from None
    opts: dict[str, Any] = info.get("options") or {}
    seen = [r for p in raw.glob("rank*") if (r := _rank_of(p)) is not None]
    if not seen:
        raise InputError(f"{raw}: no rank files (rank<N>.win<K>.trace.json.gz, rank<N>.extra.json); not a capture directory")
    world = max(int(opts.get("world") or 0), 1 + max(seen))
    q = QualityLog()
    for item in info.get("quality") or []:
        q.add(item["code"], item["message"], severity=item.get("severity", "warning"), rank=item.get("rank"))
    return assemble(raw, Path(out), opts, world, force=force, quality=q, stopped_by=info.get("stopped_by"))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tracekit.capture.assemble DIR [-o trace.parquet] [--force]``."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m tracekit.capture.assemble", description=(assemble_dir.__doc__ or "").splitlines()[0])
    ap.add_argument("dir", help="run directory kept by a capture (--keep-raw, or the one a failed write named)")
    ap.add_argument("-o", "--out", default="trace.parquet", help="output trace.parquet (default: %(default)s)")
    ap.add_argument("--force", action="store_true", help="overwrite the output")
    a = ap.parse_args(argv)
    try:
        meta = assemble_dir(a.dir, a.out, force=a.force)
    except TracekitError as e:
        print(f"tracekit: error: {e}", file=sys.stderr)
        return e.exit_code
    print(f"tracekit: wrote {a.out} ({len(meta.get('ranks', []))} rank(s), "
          f"{len(meta.get('capture', {}).get('profiler_windows', []))} profiler windows)")
    for item in meta.get("quality", []):
        print(f"tracekit: quality: {item['code']}: {item['message']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
