"""Build the "untuned vs tuned MoE" diff example from synthetic TP-2 captures.

Writes ``untuned.parquet`` and ``tuned.parquet`` (2 ranks, GLM-5-shaped decode
steps; the untuned run's MoE GEMMs take 1.6x as long, as with a default Triton
``fused_moe_kernel`` config against a tuned one) and runs ``tracekit diff`` on
them, writing ``diff.json`` and ``diff.html`` next to this file.

    python examples/diff_moe/make_example.py            # regenerate in place (--force)
    tracekit diff examples/diff_moe/untuned.parquet examples/diff_moe/tuned.parquet
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "benchmarks"))

from gen_synthetic import write_synthetic_kineto  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE)
    ap.add_argument("--kernels-per-rank", type=int, default=1_400)
    ap.add_argument("--layers", type=int, default=8)
    a = ap.parse_args()
    from tracekit.ingest.convert import convert

    runs = {"untuned": 1.6, "tuned": 1.0}
    with tempfile.TemporaryDirectory() as tmp:
        for name, scale in runs.items():
            raw = Path(tmp) / name
            write_synthetic_kineto(raw, 2, a.kernels_per_rank, seed=7, layers=a.layers, moe_gemm_scale=scale)
            convert([raw], a.out / f"{name}.parquet", force=True, jobs=1)
    tk = [sys.executable, "-m", "tracekit.cli", "diff", str(a.out / "untuned.parquet"), str(a.out / "tuned.parquet")]
    res = subprocess.run(tk + ["--json"], check=True, capture_output=True, text=True)
    (a.out / "diff.json").write_text(json.dumps(json.loads(res.stdout), indent=1) + "\n")
    subprocess.run(tk + ["--html", str(a.out / "diff.html"), "--force"], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
