#!/bin/bash
# The cluster benchmark as run on the device for docs/scale.md §4a. The wheels travel in carried, git-ignored
# folders: the polars runtime wheel split in three (split -n 3) because the tracked tree leaves ~25 MB of a call's 64 MiB;
# two calls first copy .wa/ and .wb/ to /tmp/parts on the warm machine, the third carries .wc/ (third part, the other
# wheels, this script) and runs it. .wa/ also carries real40.json.gz: tile_real.cut_kineto_json(eager_217.json, 40 MB), gzipped.
set -u
# The last call: real220.json.gz (gzip of the whole eager_217.json) in a fourth folder .wd/, copied to /tmp/parts likewise.
cat /tmp/parts/rt.part00 /tmp/parts/rt.part01 .wc/rt.part02 > /tmp/polars_runtime_32-2.1.0-cp311-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl || exit 3
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wc/*.whl /tmp/polars_runtime_32-*.whl || exit 4
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -m compileall -q -j 8 /tmp/site tracekit benchmarks > /dev/null || exit 7
nproc; uptime
# A: 64 ranks, each a copy of a real 40 MB single-H100 Kineto JSON (a cut of the eager MoE decode capture of issue 28)
python3 benchmarks/cluster.py --kineto /tmp/parts/real40.json.gz --ranks 64 --matrix "64:1,8,2,4" --threads 2 --sim 0 \
  --budget 300 --work /tmp/ck --json $OUT/cluster_real.json 2>&1 | tee $OUT/cluster_real.log
# B: client memory, 8 vs 512 ranks of the grouped TP2 fixture (1 tile), as in the earlier calls
python3 benchmarks/cluster.py --ranks 8,512 --tiles 1,1 --matrix "8:8;512:8" --threads 2 --sim 0 \
  --work /tmp/cb --json $OUT/cluster_mem.json 2>&1 | tee $OUT/cluster_mem.log
# C: every rank a copy of the whole 220 MB capture (run as its own call, for the device time)
# python3 benchmarks/cluster.py --kineto /tmp/parts/real220.json.gz --ranks 64 --matrix "64:1,8" --threads 2 --sim 0 \
#   --work /tmp/ck --json $OUT/cluster_real220.json
