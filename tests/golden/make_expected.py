"""(Re)generate the checked-in expectations for real traces: ``tests/golden/expected/<case>.json``.

Run only on purpose (a deliberate change of conversion or breakdown), then review the diff:

    python tests/golden/make_expected.py            # all cases
    python tests/golden/make_expected.py nccl_parser_config

Each file holds, per rank: the window (start, length), GPU busy time and the exclusive
per-category split (ns) from ``tracekit.api.analyze(trace, trim_transient=False,
cross_rank=False)``, plus row counts per kind. ``test_golden_real.py`` recomputes and
compares exactly.
"""

from __future__ import annotations

import os

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["CASES", "compute", "main"]

TRACES = Path(os.environ.get("TRACEKIT_TRACES", "/work/shared/traces") + "")
EXPECTED = Path(__file__).resolve().parent / "expected"

#: case -> inputs (one capture)
CASES: dict[str, list[str]] = {
    "trace_filter": ["hta/trace_filter"],
    "nccl_parser_config": ["hta/nccl_parser_config/nccl_data.json.gz"],
    "ns_resolution_trace": ["hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"],
    "with_gpu_user_annotation": ["hta/with_gpu_user_annotation/step_based_trace_2543932.json.gz"],
    "sglang_qwen3_decode": ["tracelens/inference/sglang_decode/sglang_Qwen3-8B_decode.json.gz"],
    "vllm_b200_tp8_rank0": ["tracelens/b200/eager_trace.json.gz"],
}


def compute(case: str, workdir: Path) -> dict[str, Any]:
    import polars as pl

    from tracekit.api import analyze
    from tracekit.ingest.convert import convert
    from tracekit.schema import read_trace

    out = workdir / f"{case}.parquet"
    convert([TRACES / p for p in CASES[case]], out, force=True)
    res = analyze(out, trim_transient=False, cross_rank=False)
    df, _ = read_trace(out)
    kinds = df.group_by("rank", pl.col("kind").cast(pl.String)).len().sort("rank", "kind")
    counts: dict[str, dict[str, int]] = {}
    for r, k, n in kinds.iter_rows():
        counts.setdefault(str(r), {})[k] = int(n)
    return {
        "case": case,
        "inputs": CASES[case],
        "command": "python tests/golden/make_expected.py " + case,
        "ranks": res["ranks"],
        "rows_by_kind": counts,
    }


def main(argv: list[str] | None = None) -> int:
    cases = (argv if argv is not None else sys.argv[1:]) or list(CASES)
    EXPECTED.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            doc = compute(case, Path(tmp))
            (EXPECTED / f"{case}.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
            print(f"wrote {EXPECTED / (case + '.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
