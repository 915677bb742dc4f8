#!/usr/bin/env python3
"""Run the built-in workload and keep the raw per-rank outputs (no polars needed).

For machines that have torch but not tracekit's analysis dependencies (e.g. a
bare GPU box): writes ``rank{r}.win{k}.trace.json.gz``, ``rank{r}.extra.json``,
``rank{r}.log`` and ``run.json`` into OUTDIR. Convert them anywhere with::

    python -c "from tracekit.capture.assemble import assemble_dir; assemble_dir('OUTDIR', 'trace.parquet')"

Usage: capture_raw.py OUTDIR [--duration 10] [--moe-impl grouped] [--ranks 2] [...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tracekit.capture.options import CaptureOptions  # noqa: E402
from tracekit.capture.orchestrate import resolve_device, run_builtin  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--ranks", type=int, default=None)
    ap.add_argument("--moe-impl", default="grouped")
    ap.add_argument("--host-sync", action="store_true")
    ap.add_argument("--cuda-graphs", action="store_true")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--max-batch", type=int, default=None)
    ap.add_argument("--delay-rank", type=int, default=None)
    ap.add_argument("--delay-ms", type=float, default=0.0)
    ap.add_argument("--delay-every", type=int, default=1)
    ap.add_argument("--unprofiled-steps", type=int, default=80)
    ap.add_argument("--profile-steps", type=int, default=5)
    ap.add_argument("--profile-every", type=int, default=200)
    ap.add_argument("--max-windows", type=int, default=0)
    ap.add_argument("--min-steps", type=int, default=0)
    ap.add_argument("--no-telemetry", action="store_true")
    a = ap.parse_args()
    dev, world = resolve_device(a.device, a.ranks)
    opts = CaptureOptions(
        duration_s=a.duration, device=dev, world=world, moe_impl=a.moe_impl, host_sync=a.host_sync,
        cuda_graphs=a.cuda_graphs, layers=a.layers, max_batch=a.max_batch, delay_rank=a.delay_rank,
        delay_ms=a.delay_ms, delay_every=a.delay_every, unprofiled_steps=a.unprofiled_steps,
        profile_steps=a.profile_steps, profile_every=a.profile_every, max_windows=a.max_windows,
        min_steps=a.min_steps, telemetry=not a.no_telemetry,
    )
    res = run_builtin(opts, a.outdir / "unused.parquet", keep_raw=a.outdir, progress=False, convert=False,
                      say=lambda m: print(m, file=sys.stderr, flush=True))
    print(f"{a.outdir}: {res.metadata.get('quality')}", flush=True)


if __name__ == "__main__":
    main()
