"""Analyze CPU time on the corpus fixtures: this tree against an earlier revision, in one run.

Each version converts every fixture of ``tests/corpus/fixtures`` with its own code, then analyzes it in-process
(CPU seconds of the process, best of ``--reps`` per fixture); the two versions run alternately ``--rounds`` times so
a load change on the machine hits both. Printed: the total of the per-fixture minima per version and their ratio,
for the analysis alone (no next-win replay) and for the whole analyze (with it).

    python benchmarks/corpus_time.py --base c78c18e            # the last landed revision before issues 25-31
    python benchmarks/corpus_time.py --base c78c18e --only dbrx,gptoss --rounds 1

The base revision is checked out with ``git worktree`` into a temporary folder and imported from there
(``PYTHONPATH``); its API may be older: both the stage pipeline (``after=``) and the older ``next_win=`` flag work.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "corpus" / "fixtures"

CHILD = r'''
import glob, json, sys, time
from pathlib import Path
import tracekit
fixtures, work, reps, only = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
from tracekit.ingest.convert import convert
from tracekit import api
try:
    from tracekit.analysis.stage.pipeline import ScanSource, run_analysis
    from tracekit.schema import open_trace
    def passes(p):
        lf, meta = open_trace(p)
        return run_analysis(ScanSource(p, lf), meta, after=())
except ImportError:  # before the stage pipeline: next win was a flag of run_analysis
    from tracekit.analysis.pipeline import ScanSource, run_analysis
    from tracekit.schema import read_metadata, scan_trace
    def passes(p):
        return run_analysis(ScanSource(p, scan_trace(p)), read_metadata(p), next_win=False)
work.mkdir(parents=True, exist_ok=True)
out = {"passes": {}, "analyze": {}}
for f in sorted(glob.glob(fixtures + "/*.json.gz")):
    name = Path(f).name[: -len(".json.gz")]
    if only and not any(name.startswith(o) for o in only.split(",")):
        continue
    p = work / (name + ".parquet")
    if not p.exists():
        convert([Path(f)], p)
    for key, fn in (("passes", passes), ("analyze", api.analyze)):
        fn(p)
        best = 1e9
        for _ in range(reps):
            t = time.process_time(); fn(p); best = min(best, time.process_time() - t)
        out[key][name] = best
print("RESULT " + json.dumps(out))
'''


def _run(pythonpath: str, work: Path, reps: int, only: str) -> dict[str, dict[str, float]]:
    r = subprocess.run([sys.executable, "-c", CHILD, str(FIXTURES), str(work), str(reps), only],
                       env={**os.environ, "PYTHONPATH": pythonpath}, capture_output=True, text=True, check=True)
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="git revision to compare against")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--only", default="", help="fixture name prefixes, comma-separated")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tk-corpus-time-") as tmp:
        base_dir = Path(tmp) / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(base_dir), a.base], check=True)
        try:
            runs: dict[str, list[dict[str, dict[str, float]]]] = {"this": [], "base": []}
            for _ in range(a.rounds):
                runs["this"].append(_run(str(ROOT), Path(tmp) / "this", a.reps, a.only))
                runs["base"].append(_run(str(base_dir), Path(tmp) / "base_out", a.reps, a.only))
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base_dir)], check=False)
    for key, what in (("passes", "analysis passes (no next win)"), ("analyze", "whole analyze (with next win)")):
        tot = {v: sum(min(r[key][k] for r in runs[v]) for k in runs[v][0][key]) for v in runs}
        print(f"{what}: this {tot['this']:.3f} CPU-s, {a.base} {tot['base']:.3f} CPU-s, "
              f"ratio {tot['this'] / tot['base']:.3f} ({len(runs['this'][0][key])} fixtures, min of {a.rounds} x {a.reps})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
