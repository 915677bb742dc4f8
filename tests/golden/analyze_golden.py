"""Golden ``tracekit analyze --json`` outputs of every real trace we hold: the corpus fixtures and
``../shared/traces``. A refactor or a speed-up must leave them unchanged field for field; a deliberate fix
regenerates the cases it moves, and its commit message says why.

    python tests/golden/analyze_golden.py            # regenerate all (on purpose only), then review the diff
    python tests/golden/analyze_golden.py CASE ...   # regenerate some
    python tests/golden/analyze_golden.py --check    # compare, print every differing field

``test_analyze_golden.py`` runs the comparison in CI. An input that tracekit refuses is kept as its one-line
error (exit code and message), so a changed refusal shows up too. Floats compare to 1e-9 relative (thread
count may reorder sums); everything else exactly. ``trace`` (the temporary path) is dropped.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["CASES", "compute", "compare", "main"]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
GOLDEN = HERE / "analyze"
TRACES = Path(os.environ.get("TRACEKIT_TRACES", str(ROOT.parent / "shared" / "traces")))
CORPUS = ROOT / "tests" / "corpus" / "fixtures"

#: case -> (inputs relative to TRACES, or "corpus:<file>"; extra analyze args)
CASES: dict[str, tuple[list[str], list[str]]] = {
    **{f"corpus_{p.name.split('.')[0]}": ([f"corpus:{p.name}"], []) for p in sorted(CORPUS.glob("*")) if p.is_file()},
    "hta_amd_trace": (["hta/amd_trace"], []),
    "hta_call_stack": (["hta/call_stack"], []),
    "hta_cpu_only": (["hta/cpu_only"], []),
    "hta_critical_path_alexnet": (["hta/critical_path/alexnet"], []),
    "hta_critical_path_event_sync": (["hta/critical_path/cuda_event_sync"], []),
    "hta_critical_path_multi_stream": (["hta/critical_path/cuda_event_sync_multi_stream"], []),
    "hta_critical_path_simple_add": (["hta/critical_path/simple_add"], []),
    "hta_cupti_profiler": (["hta/cupti_profiler"], []),
    "hta_df_index_resolver": (["hta/df_index_resolver"], []),
    "hta_distributed_info_unavailable": (["hta/distributed_info_unavailable"], []),
    "hta_execution_trace": (["hta/execution_trace/benchmark_simple_add_trace.json.gz"], []),
    "hta_large_integer_trace": (["hta/large_integer_trace"], []),
    "hta_mixed_files": (["hta/mixed_files"], []),
    "hta_nccl_parser_config": (["hta/nccl_parser_config"], []),
    "hta_negative_queue_length": (["hta/negative_queue_length_values_check"], []),
    "hta_ns_resolution_trace": (["hta/ns_resolution_trace"], []),
    "hta_rank_non_gpu": (["hta/rank_non_gpu"], []),
    "hta_rank_unavailable": (["hta/rank_unavailable"], []),
    "hta_timeline_analysis": (["hta/timeline_analysis"], []),
    "hta_trace_compare_base": (["hta/trace_compare/base"], []),
    "hta_trace_compare_test": (["hta/trace_compare/test"], []),
    "hta_trace_diff_control": (["hta/trace_diff/control"], []),
    "hta_trace_diff_test": (["hta/trace_diff/test"], []),
    "hta_trace_file_list": (["hta/trace_file_list"], []),
    "hta_trace_filter": (["hta/trace_filter"], []),
    "hta_triton_example": (["hta/triton_example"], []),
    "hta_with_gpu_user_annotation": (["hta/with_gpu_user_annotation"], []),
    "nsys_h200_1gpu": (["nsys/generated-h200/h200_1gpu.sqlite"], []),
    "nsys_h200_tp2": (["nsys/generated-h200/tp2_rank0.sqlite", "nsys/generated-h200/tp2_rank1.sqlite"], []),
    "nsys_h200_tp2_rank0_pqtdir": (["nsys/generated-h200/tp2_rank0_pqtdir"], []),
    "nsysai_h100_2gpu_1s": (["nsys/nsys-ai/h100_2gpu_1s.sqlite"], []),
    "nsysai_mfu_2gpu_before": (["nsys/nsys-ai/mfu_2gpu_before.sqlite"], []),
    "nsysai_mfu_2gpu_after": (["nsys/nsys-ai/mfu_2gpu_after.sqlite"], []),
    "nsysai_mock": (["nsys/nsys-ai/mock.sqlite"], []),
    "tracelens_b200_tp8_rank0": (["tracelens/b200/eager_trace.json.gz"], []),
    "tracelens_sglang_decode": (["tracelens/inference/sglang_decode/sglang_Qwen3-8B_decode.json.gz"], []),
    "tracelens_sglang_prefilldecode": (["tracelens/inference/sglang_prefilldecode"], []),
    "tracelens_vllm_decode_full": (["tracelens/inference/vllm_decode_full"], []),
}


def _inputs(case: str) -> list[str]:
    out = []
    for p in CASES[case][0]:
        out.append(str(CORPUS / p.split(":", 1)[1]) if p.startswith("corpus:") else str(TRACES / p))
    return out


def _tracekit(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "120", "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "tracekit.cli", *args], capture_output=True, text=True, env=env, timeout=900)


def compute(case: str, workdir: Path) -> dict[str, Any]:
    """Convert (unless the input is already a trace.parquet) and analyze one case; its JSON or its refusal."""
    inputs = _inputs(case)
    if len(inputs) == 1 and inputs[0].endswith(".parquet"):
        trace = inputs[0]
    else:
        trace = str(workdir / f"{case}.parquet")
        r = _tracekit("convert", *inputs, "-o", trace, "--force")
        if r.returncode != 0:
            return {"case": case, "stage": "convert", "exit": r.returncode, "error": r.stderr.strip().splitlines()[-1:]}
    r = _tracekit("analyze", trace, "--json", *CASES[case][1])
    if r.returncode != 0:
        return {"case": case, "stage": "analyze", "exit": r.returncode, "error": r.stderr.strip().splitlines()[-1:]}
    doc = json.loads(r.stdout)
    doc.pop("trace", None)
    return {"case": case, "stage": "ok", "exit": 0, "analyze": doc}


def compare(want: Any, got: Any, path: str = "$", out: list[str] | None = None, rel: float = 1e-9) -> list[str]:
    """Every field where ``got`` differs from ``want`` (floats to ``rel``), as ``path: want -> got``."""
    out = [] if out is None else out
    if isinstance(want, dict) and isinstance(got, dict):
        for k in sorted(set(want) | set(got), key=str):
            if k not in got:
                out.append(f"{path}.{k}: missing")
            elif k not in want:
                out.append(f"{path}.{k}: new field {json.dumps(got[k])[:120]}")
            else:
                compare(want[k], got[k], f"{path}.{k}", out, rel)
    elif isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            out.append(f"{path}: length {len(want)} -> {len(got)}")
        for i, (a, b) in enumerate(zip(want, got)):
            compare(a, b, f"{path}[{i}]", out, rel)
    elif isinstance(want, float) or isinstance(got, float):
        ok = isinstance(want, (int, float)) and isinstance(got, (int, float)) and not isinstance(want, bool) and \
            (want == got or math.isclose(want, got, rel_tol=rel, abs_tol=1e-12))
        if not ok:
            out.append(f"{path}: {want!r} -> {got!r}")
    elif want != got:
        out.append(f"{path}: {json.dumps(want)[:120]} -> {json.dumps(got)[:120]}")
    return out


def load(case: str) -> dict[str, Any]:
    with gzip.open(GOLDEN / f"{case}.json.gz", "rt") as f:
        return json.load(f)  # type: ignore[no-any-return]


def write(case: str, doc: dict[str, Any]) -> None:
    GOLDEN.mkdir(exist_ok=True)
    tmp = GOLDEN / f".{case}.json.gz.tmp"
    with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as f:
        f.write(json.dumps(doc, indent=1, sort_keys=True).encode())
    tmp.replace(GOLDEN / f"{case}.json.gz")


def main(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        print((__doc__ or "").strip())
        return 0
    flags = [a for a in argv if a.startswith("-")]
    if set(flags) - {"--check"}:
        print(f"analyze_golden.py: unknown option {sorted(set(flags) - {'--check'})[0]} (only --check, or case names)", file=sys.stderr)
        return 2
    check = "--check" in argv
    names = [a for a in argv if not a.startswith("-")] or sorted(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        print(f"analyze_golden.py: no case {unknown[0]!r} (see CASES)", file=sys.stderr)
        return 2
    bad = 0
    with tempfile.TemporaryDirectory() as td:
        for case in names:
            doc = compute(case, Path(td))
            if check:
                diffs = compare(load(case), doc)
                bad += bool(diffs)
                print(f"{case}: {'ok' if not diffs else f'{len(diffs)} differences'}")
                for d in diffs[:40]:
                    print("   ", d)
            else:
                write(case, doc)
                print(f"{case}: {doc['stage']} (exit {doc['exit']})", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
