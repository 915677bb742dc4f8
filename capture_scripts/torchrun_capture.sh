#!/usr/bin/env bash
# Capture any torchrun / PyTorch program like nsys --delay/--duration: every worker (RANK) records the same
# capture window (rank 0 leads the window boundaries through a file in the capture directory), as a series of
# short profiler windows; steps come from the program's own record_function labels (forward#i, ProfilerStep#N,
# ...). Then all ranks are converted into one trace.parquet with the local GPUs' telemetry.
# Usage: capture_scripts/torchrun_capture.sh DURATION OUT [DELAY] -- torchrun --nproc-per-node 8 my_infer.py ...
set -eu
DUR=$1; OUT=$2; shift 2; DELAY=0s
[ "${1:-}" != "--" ] && { DELAY=$1; shift; }
[ "${1:-}" = "--" ] && shift
exec tracekit capture --delay "$DELAY" --duration "$DUR" -o "$OUT" -- "$@"
