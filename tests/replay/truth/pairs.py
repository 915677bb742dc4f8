"""The what-if truth set: predicted vs measured step ratios (``python tests/replay/truth/pairs.py`` prints the table).

Each pair is a baseline and a variant of the same program, captured together by
``capture_scripts/whatif_pairs.py`` (one GPU; the group's unprofiled blocks interleaved) and converted by
``make_truth.py`` into ``<case>.trace.parquet`` and ``clock.json``. For each pair:

* **measured ratio**: the variant's over the baseline's unprofiled step time on the program's own clock, per
  round (the two cases' blocks of one round ran back to back), median over the rounds;
* **same-run noise**: the baseline's repeat, |median(first half of its blocks) − median(second half)| / median
  (``clock.json``), and the spread of the per-round ratios, (max − min) / 2 / median (for the 2 x H200 fixture
  pair, captured in separate runs: the matched unprofiled noise of each run, tracekit.replay.calibrate);
* **predicted ratio**: ``tracekit.replay.replay`` of the baseline trace alone (calibrated to its own unprofiled
  steps), the what-if's p50 over the baseline's;
* **error** = predicted / measured − 1.

Knob what-ifs scale a kernel class by the factor *measured between the two traces* (the median per-step summed
time of that class, variant / baseline: what the user of a knob would state, e.g. "MoE GEMMs 0.53×");
``knob:all`` scales every category by its own factor (a batch-size change). Structural what-ifs take no factor.
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import polars as pl  # noqa: E402

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Pair:
    what: str  # what-if kind, as in the accuracy table
    model: str
    baseline: str
    variant: str
    spec: str  # what-if spec, or knob:<category>[,<category>] / knob:all


def _builtin(prefix: str, where: str) -> list[Pair]:
    """The built-in decoder's four structural pairs of one run (cases ``<prefix>tk_*``)."""
    m = f"built-in MoE decoder{where}"
    return [
        Pair("CUDA graphs", m, f"{prefix}tk_grouped", f"{prefix}tk_grouped_graph", "cuda-graph"),
        Pair("host syncs removed", m, f"{prefix}tk_grouped_sync", f"{prefix}tk_grouped", "no-host-sync"),
        Pair("host syncs removed, then CUDA graphs", m, f"{prefix}tk_grouped_sync", f"{prefix}tk_grouped_graph",
             "no-host-sync+cuda-graph"),
        Pair("loop → grouped experts", m, f"{prefix}tk_loop", f"{prefix}tk_grouped", "grouped-experts"),
    ]


def _loops(prefix: str, where: str, models: tuple[str, ...] = ("qwen3w", "olmoew")) -> list[Pair]:
    """The transformers models' loop → grouped pairs of one run (cases ``<prefix><model>_eager/_grouped``)."""
    label = {"qwen3w": "Qwen3-30B widths (transformers)", "olmoew": "OLMoE widths (transformers)"}
    return [Pair("loop → grouped experts", label[m] + where, f"{prefix}{m}_eager", f"{prefix}{m}_grouped", "grouped-experts")
            for m in models]


PAIRS = [
    Pair("knob: expert width ½", "DeepSeek-V3 widths (MoE)", "dsv3f", "dsv3f_halfw", "knob:moe_gemm"),
    Pair("knob: expert width ½", "Qwen3-235B widths (MoE)", "qwen3big", "qwen3big_halfw", "knob:moe_gemm"),
    Pair("knob: MLP width ½", "Llama-3-70B widths (dense)", "llama70w", "llama70w_halfw", "knob:dense_gemm"),
    Pair("knob: batch ×2", "DeepSeek-V3 widths (MoE)", "dsv3f", "dsv3f_bs64", "knob:all"),
    Pair("knob: batch ×2", "Qwen3-235B widths (MoE)", "qwen3big", "qwen3big_bs128", "knob:all"),
    Pair("knob: batch ×4", "Llama-3-70B widths (dense)", "llama70w", "llama70w_bs128", "knob:all"),
    # the same knobs with each decode step replayed from one CUDA graph (H100; the host out of the step)
    Pair("knob: expert width ½", "Qwen3-235B widths (MoE), CUDA graph", "qwen3big_g", "qwen3big_halfw_g", "knob:moe_gemm"),
    Pair("knob: expert width ½", "OLMoE widths (MoE), CUDA graph", "olmoew_g", "olmoew_halfw_g", "knob:moe_gemm"),
    Pair("knob: MLP width ½", "Llama-3-70B widths (dense), CUDA graph", "llama70w_g", "llama70w_halfw_g", "knob:dense_gemm"),
    Pair("knob: batch ×2", "Qwen3-235B widths (MoE), CUDA graph", "qwen3big_g", "qwen3big_bs128_g", "knob:all"),
    Pair("knob: batch ×4", "Llama-3-70B widths (dense), CUDA graph", "llama70w_g", "llama70w_bs128_g", "knob:all"),
    *_builtin("", ""),
    *_loops("", ""),
    # the same built-in pairs from the first run (another machine, 1.76x faster host; blocks not interleaved)
    *_builtin("a_", ", host A"),
    # the built-in and Qwen3-30B pairs again, on one H100 (a later run, blocks interleaved; the rounds after the
    # profiled block ran 25-45 % slower than those before it, baseline and variant alike)
    *_builtin("h_", ", H100"),
    *_loops("h_", ", H100", ("qwen3w",)),
    # the same and OLMoE widths on another H100 with every unprofiled round before the profiled blocks
    # (whatif_pairs.py --profile-at end; 2026-12-06): nothing ran after a profiler window
    *_builtin("e_", ", H100, profiled last"),
    *_loops("e_", ", H100, profiled last"),
    # a third H100 host, profiled last again (2026-12-06, 16:10 UTC), with the Qwen3-235B-width knobs run eager
    Pair("knob: expert width ½", "Qwen3-235B widths (MoE), H100 #3, profiled last", "f_qwen3big", "f_qwen3big_halfw", "knob:moe_gemm"),
    Pair("knob: batch ×2", "Qwen3-235B widths (MoE), H100 #3, profiled last", "f_qwen3big", "f_qwen3big_bs128", "knob:all"),
    *_builtin("f_", ", H100 #3, profiled last"),
    *_loops("f_", ", H100 #3, profiled last"),
    # the 2 x H200 acceptance captures (tests/fixtures/gpu: GLM-5-shaped built-in workload, TP 2, serving loop)
    Pair("loop → grouped experts", "built-in GLM-5 shape, TP 2 (2 x H200)", "gpu:loop", "gpu:grouped", "grouped-experts"),
]


def clock() -> dict[str, Any]:
    return json.loads((HERE / "clock.json").read_text())


GPU_FIXTURES = ROOT / "tests" / "fixtures" / "gpu"


def load(case: str) -> tuple[pl.DataFrame, dict[str, Any]]:
    from tracekit.schema import read_trace

    if case.startswith("gpu:"):
        return read_trace(GPU_FIXTURES / f"{case[4:]}.trace.parquet")
    return read_trace(HERE / f"{case}.trace.parquet")


def _measured_fixture(p: Pair) -> dict[str, Any]:
    """A 2 x H200 fixture pair (captured in separate runs, not interleaved): each run's unprofiled steps matched to
    the baseline's replayed steps (tracekit.replay.api.measure), as the acceptance protocol does."""
    from tracekit.replay.api import Replayer, measure

    bdf, _ = load(p.baseline)
    ref = Replayer(bdf).ref_steps()
    b, v = measure(bdf, ref), measure(load(p.variant)[0], ref)
    assert b is not None and v is not None
    return {"ratio": v["step_ns_p50"] / b["step_ns_p50"], "ratio_spread": max(b["noise"] or 0, v["noise"] or 0),
            "noise": b["noise"] or 0.0, "baseline_ms": b["step_ns_p50"] / 1e6, "variant_ms": v["step_ns_p50"] / 1e6,
            "rounds": 1}


def class_ns(df: pl.DataFrame) -> dict[str, float]:
    """Median per profiled step of the summed kernel time of each category."""
    prof = df.filter((pl.col("kind") == "step") & pl.col("profiled").fill_null(True)).get_column("step_id")
    ops = df.filter(pl.col("kind").is_in(["kernel", "memcpy", "memset"]) & pl.col("step_id").is_in(prof.implode()))
    g = ops.group_by("step_id", "category").agg(pl.col("dur_ns").sum()).group_by("category").agg(pl.col("dur_ns").median())
    return {str(c): float(v) for c, v in g.iter_rows()}


def knob_spec(p: Pair) -> str:
    """The knob's spec with factors measured between the two traces."""
    cats = p.spec.removeprefix("knob:")
    b, v = class_ns(load(p.baseline)[0]), class_ns(load(p.variant)[0])
    names = sorted(b) if cats == "all" else cats.split(",")
    return "+".join(f"{c}={v.get(c, 0.0) / b[c]:.4f}" for c in names if b.get(c))


def measured(p: Pair, ck: dict[str, Any]) -> dict[str, Any]:
    """Measured ratio (median of per-round ratios), its spread, the baseline's repeat noise."""
    if p.baseline.startswith("gpu:"):
        return _measured_fixture(p)
    bb, vb = ck[p.baseline]["blocks"], ck[p.variant]["blocks"]
    rounds = sorted(k for k in bb if k[:1] == "u" and k in vb)
    rs = [vb[k]["step_ns_p50"] / bb[k]["step_ns_p50"] for k in rounds]
    med = statistics.median(rs)
    return {"ratio": med, "ratio_spread": (max(rs) - min(rs)) / 2 / med, "noise": ck[p.baseline]["noise"],
            "baseline_ms": ck[p.baseline]["unprofiled_step_ns_p50"] / 1e6, "variant_ms": ck[p.variant]["unprofiled_step_ns_p50"] / 1e6,
            "rounds": len(rs)}


def predicted(p: Pair) -> dict[str, Any]:
    from tracekit.replay import replay

    spec = knob_spec(p) if p.spec.startswith("knob:") else p.spec
    df, meta = load(p.baseline)
    r = replay(df, meta, [spec])
    b, w = r.baseline, r.what_if[0]
    return {"spec": spec, "ratio": w.step_ns_p50 / b.step_ns_p50, "baseline_ms": b.step_ns_p50 / 1e6,
            "predicted_ms": w.step_ns_p50 / 1e6, "scale": r.calibration_scale, "notes": w.notes}


def rows() -> list[dict[str, Any]]:
    ck = clock()
    out = []
    for p in PAIRS:
        m, pr = measured(p, ck), predicted(p)
        out.append({"what": p.what, "model": p.model, "baseline": p.baseline, "variant": p.variant, "measured": m,
                    "predicted": pr, "error": pr["ratio"] / m["ratio"] - 1})
    return out


def table(rs: list[dict[str, Any]]) -> str:
    lines = ["| what-if | model | measured ratio (ms) | predicted ratio (ms) | error | noise: baseline repeat / ratio spread |",
             "|---|---|---|---|---|---|"]
    for r in rs:
        m, p = r["measured"], r["predicted"]
        lines.append(f"| {r['what']} | {r['model']} | {m['ratio']:.3f} ({m['baseline_ms']:.2f} → {m['variant_ms']:.2f}) | "
                     f"{p['ratio']:.3f} ({p['baseline_ms']:.2f} → {p['predicted_ms']:.2f}) | {r['error']:+.1%} | "
                     f"{m['noise']:.1%} / {m['ratio_spread']:.1%} |")
    return "\n".join(lines)


if __name__ == "__main__":
    rs = rows()
    print(table(rs))
    for r in rs:
        print(r["baseline"], "->", r["variant"], r["predicted"]["spec"], "scale", round(r["predicted"]["scale"], 3),
              r["predicted"]["notes"])
