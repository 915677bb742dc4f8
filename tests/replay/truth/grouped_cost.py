"""The grouped-experts constants of :mod:`tracekit.replay.structural`, measured in the corpus (tests/corpus).

``python tests/replay/truth/grouped_cost.py`` prints them; ``tests/replay/test_structural.py`` checks that the
constants in the code are these. Inputs: the corpus' eager (per-expert loop) and grouped_mm captures of the
same models (GLM-5, OLMoE and Qwen3-MoE shapes, 3 layers, bs 32 decode; configs in
``capture_scripts/transformers_corpus_capture.py``) — not the truth set the what-if is judged on.

* launches per grouped MoE block: median over the grouped traces' decode MoE blocks (:func:`moe_blocks`);
* experts with tokens per block: the loop trace's expert GEMMs per block / 2 (gate/up and down per expert);
* weight bytes per grouped GEMM: experts × hidden × 2·intermediate × 2 B (gate/up), experts × intermediate ×
  hidden × 2 B (down), from the config;
* per grouped GEMM kernel ``t = ns_per_expert × experts + bytes / bytes_per_s``: least squares over the kernels'
  median durations per model and GEMM;
* without shapes: grouped GEMM time / the loop's expert GEMM kernel time per block, median over the models.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "capture_scripts"))

PAIRS = {"glm5": ("glm5_eager_sdpa", "glm5_grouped_sdpa"), "olmoe": ("olmoe_eager_sdpa", "olmoe_grouped_sdpa"),
         "qwen3moe": ("qwen3moe_eager_sdpa", "qwen3moe_grouped_eagerattn")}


def _graph(case: str, work: Path) -> Any:
    from tracekit.ingest.convert import convert
    from tracekit.replay.graph import build_graph
    from tracekit.schema import read_trace

    out = work / f"{case}.parquet"
    if not out.exists():
        convert([ROOT / "tests" / "corpus" / "fixtures" / f"{case}.json.gz"], out, force=True)
    df, _meta = read_trace(out)
    return build_graph(df)


def _decode_blocks(g: Any) -> tuple[pl.DataFrame, pl.DataFrame]:
    from tracekit.replay.structural import moe_blocks

    mb = moe_blocks(g)
    dec = g.steps.filter(pl.col("step_mode") == "DECODE").select("rank", "step_ord")
    blocks = mb.blocks.join(dec, on=["rank", "step_ord"], how="semi")
    return blocks, mb.ops.join(blocks.select("block"), on="block", how="semi")


def measure(work: Path) -> dict[str, Any]:
    """The constants (module doc) and the per-model points they come from."""
    from transformers_corpus_capture import FAMILIES

    n_ops: list[float] = []
    pts: list[tuple[float, float, float]] = []  # (experts, bytes, kernel ns)
    ratios: list[float] = []
    for fam, (loop, grouped) in PAIRS.items():
        cfg = FAMILIES[fam][1]
        h = cfg["hidden_size"]
        inter = cfg.get("moe_intermediate_size") or cfg["intermediate_size"]
        lb, lops = _decode_blocks(_graph(loop, work))
        gb, gops = _decode_blocks(_graph(grouped, work))
        n_ops.append(float(gb.get_column("n_ops").median()))
        experts = float(lb.get_column("n_gemm").median()) / 2
        gg = _graph(grouped, work)
        kern = gg.ops.filter(pl.col("family").str.contains("grouped") & ~pl.col("family").str.contains("prep"))
        kern = kern.join(gg.steps.filter(pl.col("step_mode") == "DECODE").select("rank", "step_ord"), on=["rank", "step_ord"],
                         how="semi").with_columns(pl.int_range(pl.len()).over(["rank", "step_ord"]).mod(2).alias("which"))
        for which, nbytes in ((0, experts * h * 2 * inter * 2), (1, experts * inter * h * 2)):
            pts.append((experts, nbytes, float(kern.filter(pl.col("which") == which).get_column("dur").median())))
        loop_gemm = lops.filter(pl.col("is_gemm")).group_by("block").agg(pl.col("dur").sum()).get_column("dur").median()
        grp = kern.group_by(["rank", "step_ord"]).agg(pl.col("dur").sum()).get_column("dur").median()
        per_block = float(grp) / max(1.0, float(gb.height) / max(1, gb.select("step_ord").n_unique()))
        ratios.append(per_block / float(loop_gemm))
    a = np.array([[e, b] for e, b, _ in pts])
    y = np.array([t for _, _, t in pts])
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    return {"GROUPED_BLOCK_OPS": float(np.median(n_ops)), "GROUPED_NS_PER_EXPERT": float(coef[0]),
            "GROUPED_BYTES_PER_S": float(1e9 / coef[1]), "GROUPED_TIME_RATIO": float(np.median(ratios)),
            "points": pts, "block_ops": n_ops, "ratios": ratios}


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        m = measure(Path(d))
    for k, v in m.items():
        print(k, v)
