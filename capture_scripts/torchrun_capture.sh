#!/usr/bin/env bash
# Capture any torchrun / PyTorch program: every worker (RANK) runs under the torch profiler (CPU + CUDA, CUDA sync
# events) from start to exit, or until DURATION, then all ranks are converted into one trace.parquet.
# For step records and windows, wrap your forward with tracekit.capture.instrument.instrument_forward.
# Usage: capture_scripts/torchrun_capture.sh DURATION OUT -- torchrun --nproc-per-node 8 my_infer.py ...
set -eu
DUR=$1; OUT=$2; shift 2; [ "${1:-}" = "--" ] && shift
exec tracekit capture --duration "$DUR" -o "$OUT" -- "$@"
