#!/bin/bash
# The cluster benchmark as run on the device for docs/scale.md §4a-4b. What the device image lacks travels in
# carried, git-ignored folders: one tar of the wheels (polars + its runtime, Dask, distributed, msgspec, isal and
# their small deps; cp312 where not pure) and real220.json.gz (gzip of the whole 220 MB eager MoE capture of issue 28),
# split in three (split -n 3 -d) because the tracked tree leaves ~24.8 MB of a call's 64 MiB. Calls 1 and 2 carry
# .wa/ and .wb/ and copy p0, p1 to /tmp/parts on the warm machine (it goes back after 30 s idle: the calls follow
# each other at once); call 3 carries .wc/ (p2 and this script) and runs it; a fourth and fifth call run the commands
# under "then" with PYTHONPATH=/tmp/site:$PWD (the installed wheels stay on the warm machine).
set -u
mkdir -p /tmp/x && cat /tmp/parts/p0 /tmp/parts/p1 .wc/p2 > /tmp/x/pack.tar && (cd /tmp/x && tar xf pack.tar) || exit 3
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site /tmp/x/*.whl || exit 4
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# the image writes no bytecode and --no-compile left none: without this every client process compiles ~1,300 modules
python3 -m compileall -q -j 8 /tmp/site tracekit benchmarks > /dev/null || exit 7
nproc; uptime
# client memory, 8 vs 512 ranks of the grouped TP2 fixture (1 tile), 8 workers; twice (the repeat is the noise)
for i in 1 2; do
  python3 benchmarks/cluster.py --ranks 8,512 --tiles 1,1 --matrix "8:8;512:8" --threads 2 --sim 0 \
    --work /tmp/cb --json $OUT/cluster_mem$i.json 2>&1 | tee $OUT/cluster_mem$i.log
done
# then (call 4): 64 ranks, each a copy of the whole real 220 MB capture, 1 vs 8 workers
#   python3 benchmarks/cluster.py --kineto /tmp/x/real220.json.gz --ranks 64 --matrix "64:1,8" --threads 2 --sim 0 \
#     --work /tmp/ck --json $OUT/cluster_real220.json
# then (call 5): the 1,024-rank simulation with planted stragglers
#   python3 benchmarks/cluster.py --ranks 8 --tiles 1 --matrix "8:8" --threads 2 --sim 1024 --work /tmp/cs --json $OUT/cluster_sim.json
