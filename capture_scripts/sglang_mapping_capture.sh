#!/usr/bin/env bash
# "Mapping" capture: CUDA graphs off + SGLang's layer-wise NVTX, so kernels can be attributed to layers/modules.
# Pair it with a production capture (graphs on) of the same model and batch sizes.
#   MODEL=zai-org/GLM-5 TP=8 ./capture_scripts/sglang_mapping_capture.sh
set -euo pipefail
MODEL=${MODEL:?set MODEL to a model path}
TP=${TP:-8}
OUT=${OUT:-trace-mapping.parquet}
exec tracekit launch --capture-duration "${DURATION:-20s}" --load "${LOAD:-64}" -o "$OUT" --exit-after-capture -- \
  python -m sglang.launch_server --model-path "$MODEL" --tp-size "$TP" \
  --cuda-graph-backend-decode=disabled --cuda-graph-backend-prefill=disabled --enable-layerwise-nvtx-marker "$@"
