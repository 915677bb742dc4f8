#!/usr/bin/env bash
# GPU acceptance of `tracekit capture -- PROGRAM` (issue 18) on one GPU: a transformers MoE decode loop
# (random weights, small Qwen3-MoE config, bf16; steps are record_function("forward#i:decode:bs=N")) captured
# with a --delay past its warm-up, compared with an unprofiled run of the same program on its own clock.
#
#   OUT=/path/to/out capture_scripts/gpu_program_capture.sh        (everything is written under $OUT)
#
# Prints: the capture window and profiler windows, the step count (and modes), power counter rows (and the
# other GPU counters), quality flags, and the capture overhead against the unprofiled run. ~3-4 minutes.
# Needs torch with CUDA, transformers (5.x) and, for telemetry, nvidia-ml-py (pynvml) importable by python3.
set -euo pipefail
OUT=${OUT:-$PWD/gpu_program_capture_out}
mkdir -p "$OUT"
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
[ -d /tmp/site ] && export PYTHONPATH="$PYTHONPATH:/tmp/site"
export PYTHONUNBUFFERED=1
ARCH=${ARCH:-qwen3_moe}
PROG=(python3 "$HERE/moe_decode.py" --arch "$ARCH" --layers "${LAYERS:-8}" --experts "${EXPERTS:-64}"
      --bs "${BS:-16}" --steps "${STEPS:-600}" --hidden "${HIDDEN:-1024}" --warmup "${WARMUP:-20}"
      --device "${DEVICE:-cuda}")  # DEVICE=cpu with small sizes: a smoke test of this script without a GPU
CAP_STEPS=${CAP_STEPS:-60}
{
  echo "== $(date -u +%T) environment"
  nvidia-smi --query-gpu=name,power.limit,driver_version --format=csv,noheader || true
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
  python3 -c "import pynvml; print('pynvml', getattr(pynvml, '__version__', 'present'))" \
    || echo "WARNING: pynvml (nvidia-ml-py) not importable: the trace will carry telemetry_unavailable, no power rows"

  echo "== $(date -u +%T) 1/2 unprofiled run"
  timeout 240 "${PROG[@]}" --report "$OUT/unprofiled.json" 2>&1 | tail -3
  DELAY=$(python3 -c "import json; print(f\"{json.load(open('$OUT/unprofiled.json'))['warmup_end_s'] + 5:.1f}s\")")

  echo "== $(date -u +%T) 2/2 captured run: --delay $DELAY (warm-up + 5 s) --steps $CAP_STEPS --window 1s"
  rm -f "$OUT/moe_program.parquet"
  timeout 300 python3 -m tracekit.cli capture --delay "$DELAY" --steps "$CAP_STEPS" --window 1s --after finish \
    -o "$OUT/moe_program.parquet" -- "${PROG[@]}" --report "$OUT/captured.json" 2>&1 | grep -v '^USDT' | tail -12

  echo "== $(date -u +%T) summary"
  python3 - "$OUT" <<'PY'
import json, statistics, sys
from pathlib import Path

import polars as pl

from tracekit.schema import read_trace

out = Path(sys.argv[1])
df, meta = read_trace(out / "moe_program.parquet")
cap = meta["capture"]
lo, hi = cap["window_ns"]
print(f"capture window: {(hi - lo) / 1e9:.3f} s of wall time, {len(cap['profiler_windows'])} profiler windows")
for w in cap["windows"]:
    print(f"  rank {w['rank']} window {w['window']}: {(w['end_ns'] - w['start_ns']) / 1e6:.0f} ms, {w['steps']} steps, "
          f"stop {w['stop_s']:.2f} s + export {w['export_s']:.2f} s, {w['bytes'] / 1e6:.1f} MB JSON")
t_min = df["ts_ns"].min()
steps = df.filter(pl.col("kind") == "step")
early = steps.filter(pl.col("ts_ns") < lo).height
print(f"trace rows: {df.height:,}; earliest row {(t_min - lo) / 1e3:+,.0f} us from the first window's start; "
      f"steps before it: {early} (the steady window only: {early == 0 and t_min >= lo - 50_000_000})")
s = cap["summary"]
print(f"steps before the capture (not in the trace): {s['steps_before_capture']}, "
      f"median {(s['step_median_ns']['before_capture'] or 0) / 1e6:.2f} ms")
prof = steps.filter(pl.col("profiled"))
print(f"steps in the trace: {steps.height} ({prof.height} profiled); by mode/batch:")
print(steps.group_by(["step_mode", "batch_size", "profiled"]).agg(pl.len().alias("steps"),
      (pl.col("dur_ns").median() / 1e6).alias("median_ms")).sort("steps", descending=True))
ctr = df.filter(pl.col("kind") == "counter")
pw = ctr.filter(pl.col("name") == "power_w").sort("ts_ns")
print(f"counter rows: {ctr.height:,} ({', '.join(sorted(set(ctr['name'].cast(pl.String).to_list())))})")
print(f"power_w rows: {pw.height}")
print(pw.select(((pl.col("ts_ns") - lo) / 1e9).alias("t_s"), pl.col("value").alias("power_w"), "rank", "device").head(8))
lim = ctr.filter(pl.col("name") == "power_limit_w")["value"]
if pw.height:
    print(f"power: mean {pw['value'].mean():.0f} W, max {pw['value'].max():.0f} W of a {lim.max() if lim.len() else float('nan'):.0f} W limit")
for t in cap.get("window_telemetry", []):
    print("  window", t["window"], {k: round(v, 1) for k, v in t.items() if k.startswith("mean_")})
print("telemetry:", {k: cap["telemetry"].get(k) for k in ("available", "reason", "gpu_of_rank")})
for q in meta["quality"]:
    print(f"quality: {q['code']}: {q['message']}")

u = json.loads((out / "unprofiled.json").read_text())
c = json.loads((out / "captured.json").read_text())
warm = 1 + int(u["warmup_steps"])  # hook step index of the first timed decode step (the prefill is step 0)
ids = set(prof.filter(pl.col("step_mode") == "DECODE")["step_id"].to_list())
inside = [d for j, d in enumerate(c["step_ns"]) if warm + j in ids]
same_u = [d for j, d in enumerate(u["step_ns"]) if warm + j in ids]
med = lambda xs: statistics.median(xs) / 1e6 if xs else float("nan")  # noqa: E731
print(f"program clock, unprofiled run: {u['decode_steps']} decode steps in {u['decode_loop_s']:.2f} s, median {med(u['step_ns']):.2f} ms")
print(f"program clock, captured run:   {c['decode_steps']} decode steps in {c['decode_loop_s']:.2f} s, median {med(c['step_ns']):.2f} ms")
print(f"capture overhead on the decode loop (profiler start, {len(cap['profiler_windows'])} windows, stop/export pauses): "
      f"{100 * (c['decode_loop_s'] / u['decode_loop_s'] - 1):+.1f} %")
print(f"profiled steps ({len(inside)} matched by step id): median {med(inside):.2f} ms vs {med(same_u):.2f} ms for the same steps "
      f"unprofiled: {100 * (med(inside) / med(same_u) - 1):+.1f} %")
outside = [d for j, d in enumerate(c["step_ns"]) if warm + j not in ids]
print(f"steps outside the windows (hook only): median {med(outside):.2f} ms vs {med(u['step_ns']):.2f} ms unprofiled: "
      f"{100 * (med(outside) / med(u['step_ns']) - 1):+.1f} %")
PY
  echo "== $(date -u +%T) done"
} 2>&1 | tee "$OUT/gpu_program_capture.log"
