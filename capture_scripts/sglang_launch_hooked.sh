#!/usr/bin/env bash
# Launch an SGLang server with tracekit's per-forward hook (tk.fwd[...] NVTX + record_function, step records)
# and capture it for 30 s under a concurrency sweep. Needs tracekit installed in the same environment as SGLang
# (or at least importable: the sitecustomize bootstrap falls back to tracekit's source tree).
#   MODEL=zai-org/GLM-5 TP=8 ./capture_scripts/sglang_launch_hooked.sh
set -euo pipefail
MODEL=${MODEL:?set MODEL to a model path}
TP=${TP:-8}
PORT=${PORT:-30000}
OUT=${OUT:-trace.parquet}
LOAD=${LOAD:-256,512,1024}
DURATION=${DURATION:-30s}
exec tracekit launch --capture-duration "$DURATION" --load "$LOAD" -o "$OUT" --exit-after-capture -- \
  python -m sglang.launch_server --model-path "$MODEL" --tp-size "$TP" --port "$PORT" "$@"
