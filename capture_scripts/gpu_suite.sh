#!/usr/bin/env bash
# 2-GPU fixture suite of the built-in GLM-5-shaped workload (full widths, few layers, decode-heavy).
# Writes raw per-rank outputs (Kineto JSON per window, step/counter records) under OUTDIR/<variant>/,
# plus instrumentation-overhead benchmarks. Convert each variant with
#   python -c "from tracekit.capture.assemble import assemble_dir; assemble_dir('OUTDIR/loop', 'loop.trace.parquet')"
# Usage: capture_scripts/gpu_suite.sh OUTDIR [LAYERS] [VARIANTS...]
set -u
# NVLink multicast stays off (shared hosts); keep these set for every run.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${1:-gpu_suite_out}; L=${2:-2}; shift $(( $# > 2 ? 2 : $# ))
VARIANTS=${*:-"loop grouped grouped_p2p_off straggler graphs overhead"}
HERE=$(cd "$(dirname "$0")" && pwd)
COMMON="--ranks 2 --layers $L --duration 6 --unprofiled-steps 80 --profile-every 40 --max-windows 2 --min-steps 130"
run() {  # run NAME ENV... -- ARGS...
  local name=$1; shift; local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  echo "== $name $(date +%T)"
  env "${envs[@]}" timeout 300 python3 "$HERE/capture_raw.py" "$OUT/$name" $COMMON "$@" 2>&1 | tail -8
}
for v in $VARIANTS; do case $v in
  loop)            run loop            -- --moe-impl loop --profile-steps 3 ;;
  grouped)         run grouped         -- --moe-impl grouped --profile-steps 5 ;;
  grouped_p2p_off) run grouped_p2p_off NCCL_P2P_DISABLE=1 -- --moe-impl grouped --profile-steps 5 ;;
  straggler)       run straggler       -- --moe-impl grouped --profile-steps 5 --delay-rank 0 --delay-ms 5 --delay-every 4 ;;
  graphs)          run graphs          -- --moe-impl grouped --cuda-graphs --profile-steps 5 ;;
  overhead)
    echo "== overhead $(date +%T)"
    python3 "$HERE/../benchmarks/instrument_overhead.py" --device cuda --layers "$L" > "$OUT/overhead_grouped.json" 2>&1
    python3 "$HERE/../benchmarks/instrument_overhead.py" --device cuda --layers "$L" --moe-impl loop --steps 60 > "$OUT/overhead_loop.json" 2>&1
    cat "$OUT"/overhead_*.json ;;
esac; done
