#!/usr/bin/env bash
# Capture an already running SGLang server (profile API) while driving N concurrent requests.
#   URL=http://127.0.0.1:30000 LOAD=256 ./capture_scripts/sglang_attach.sh
# Programmatic equivalent (works today, independent of the capture command's flags):
#   python -c "from tracekit.capture.sglang_client import capture_sglang as c; c('$URL', 30, 'trace.parquet', load='256')"
set -euo pipefail
URL=${URL:-http://127.0.0.1:30000}
DURATION=${DURATION:-30}
LOAD=${LOAD:-}
OUT=${OUT:-trace.parquet}
python - "$URL" "$DURATION" "$OUT" "$LOAD" <<'PY'
import sys
from tracekit.capture.sglang_client import capture_sglang
url, dur, out, load = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4] or None
res = capture_sglang(url, dur, out, load=load)
for lv in res.levels:
    print(lv.out, lv.load or "")
for q in res.quality:
    print(f"[{q.severity}] {q.code}: {q.message}")
PY
