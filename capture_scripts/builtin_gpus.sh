#!/usr/bin/env bash
# Built-in GLM-5-shaped MoE workload on N GPUs (default: all visible), with or without planted faults.
# Usage: capture_scripts/builtin_gpus.sh [N] [clean|loop|straggler|p2p_off|graphs|host_sync] [DURATION] [OUT]
#   capture_scripts/builtin_gpus.sh 8 straggler 30s tp8_straggler.parquet
set -eu
N=${1:-}; CASE=${2:-clean}; DUR=${3:-30s}; OUT=${4:-trace_${CASE}.parquet}
# Keep NVLink multicast off on shared hosts (harmless elsewhere; remove for NVLS experiments on your own machine).
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}
ARGS=(capture --workload --device cuda --duration "$DUR" -o "$OUT" --layers 4)
[ -n "$N" ] && ARGS+=(--ranks "$N")
case $CASE in
  clean)     ARGS+=(--moe-impl grouped) ;;
  loop)      ARGS+=(--moe-impl loop) ;;
  straggler) ARGS+=(--moe-impl grouped --delay-rank 0 --delay-ms 5 --delay-every 4) ;;
  p2p_off)   export NCCL_P2P_DISABLE=1; ARGS+=(--moe-impl grouped) ;;
  graphs)    ARGS+=(--moe-impl grouped --cuda-graphs) ;;
  host_sync) ARGS+=(--moe-impl grouped --host-sync) ;;
  *) echo "unknown case $CASE" >&2; exit 64 ;;
esac
exec tracekit "${ARGS[@]}"
