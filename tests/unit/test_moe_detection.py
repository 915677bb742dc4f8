"""Saying when unsure (issue 25): moe_detection on an unknown engine's trace, a dense model, an ambiguous block."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "golden"))
from kineto_doc import doc, kernel, runtime, write_doc  # noqa: E402

CORPUS = ROOT / "tests" / "corpus" / "fixtures"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tracekit.cli", *args], capture_output=True, text=True, cwd=ROOT, timeout=300)


def _analyze(src: Path, tmp: Path) -> tuple[dict, str]:
    out = tmp / "t.parquet"
    assert _cli("convert", str(src), "-o", str(out)).returncode == 0
    j = _cli("analyze", str(out), "--json")
    t = _cli("analyze", str(out))
    assert j.returncode == 0 and t.returncode == 0, (j.stderr, t.stderr)
    return json.loads(j.stdout), t.stdout


def test_unknown_engine_gets_a_full_report_with_moe_not_detected(tmp_path: Path) -> None:
    # fused kernels of an engine no rule knows: no MoE names, no router -> experts -> combine order, no layers
    names = ["fusion_12", "input_reduce_fusion_3", "loop_multiply_fusion_7", "custom_call_41", "wrapped_transpose_2"]
    evs = []
    for i in range(60):
        evs.append(runtime("cudaLaunchKernel", 10 * i, 2, corr=i + 1, tid=3))
        evs.append(kernel(names[i % len(names)], 10 * i + 5, 4, corr=i + 1))
    res, text = _analyze(write_doc(tmp_path / "x.json", doc(evs, rank=0)), tmp_path)
    md = res["moe_detection"]
    assert md["status"] == "not_detected" and md["sources"] == {}
    assert any(q["code"] == "moe_not_detected" for q in res["quality"])
    assert res["overall"]["gpu_busy_ns"] > 0  # the rest of the report is there
    assert "MoE split: not detected" in text


@pytest.mark.parametrize("case,status,source", [
    ("llama_dense_sdpa.json.gz", "dense", None),
    ("gptoss_eager_eagerattn.json.gz", "detected", "launch_pattern"),
    ("gptoss_grouped_eagerattn_twin.json.gz", "detected", "module_context"),
])
def test_status_and_sources_on_real_traces(case: str, status: str, source: str | None, tmp_path: Path) -> None:
    res, _ = _analyze(CORPUS / case, tmp_path)
    md = res["moe_detection"]
    assert md["status"] == status
    if source:
        assert md["sources"][source] > 10.0
    assert not any(q["code"] == "moe_not_detected" for q in res["quality"])


def test_shared_expert_inside_a_block_gives_a_range(tmp_path: Path) -> None:
    # Llama 4: the shared expert runs between the experts' bmm and their combine, launched by plain mm
    res, text = _analyze(CORPUS / "llama4_bmm_sdpa.json.gz", tmp_path)
    md = res["moe_detection"]
    lo, hi = md["moe_gemm_range_pct"]
    assert lo == md["moe_gemm_pct"] and hi > lo + 1.0
    assert any(q["code"] == "moe_ambiguous" for q in res["quality"])
    assert "MoE GEMM:" in text
