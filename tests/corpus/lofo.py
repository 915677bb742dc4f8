"""Leave-one-family-out evaluation of the launch-pattern thresholds (issue 25): right on a family no threshold was fit to.

The rules of :mod:`tracekit.ingest.moe_structure` name no model family; what could still carry one family's
shape is a threshold (how many ops may sit between a gate GEMM and its top-k, ...). So, per corpus case, each
threshold's *need* is measured: the smallest value at which the case is categorized exactly as with the shipped
value (bisection, all other thresholds shipped; 0 = the case does not use the rule). For each family F, every
threshold is then set to the largest need among the *other* families' cases (what a corpus without F would have
chosen), and F's cases are categorized again with those values and compared with their truth: the table of
MoE GEMM / routing / attention error per family. A threshold that no other family uses cannot be fit without F
(the DSA indexer's, GLM-5 only): it stays as shipped and the row names it, so that row tests nothing about it.

``python tests/corpus/corpus_check.py --lofo`` prints the table (minutes: each case is finalized a few dozen
times); ``--lofo-needs FILE`` also writes the measured needs.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import polars as pl

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from tracekit.ingest import moe_structure as ms  # noqa: E402
from tracekit.ingest.common import finalize_rank  # noqa: E402

#: threshold -> the values bisected (shipped value last)
THRESHOLDS: dict[str, list[int]] = {
    "MAX_GEMM_TO_PROBS": [0, 1, 2, 3],
    "MAX_PROBS_TO_TOPK": [0, 1, 2, 3, 4],
    "MAX_ATTN_GAP": [0, 1, 2, 3, 4],
    "MAX_INDEXER_TO_ATTN": [0, 4, 8, 12, 16, 20, 24],
    "MAX_INDEXER_SPAN": [0, 4, 8, 12, 16],
    "MAX_INDEXER_GAP": [0, 1, 2, 3, 4],
}
CATS = ("moe_gemm", "moe_routing", "attention")


def family(exp: dict[str, Any], case: str) -> str:
    """The model family of a case (the shared traces: their source and engine)."""
    fam = (exp.get("model") or {}).get("family")
    return str(fam) if fam else "_".join(case.split("_")[:2])


@contextmanager
def thresholds(values: dict[str, int]) -> Iterator[None]:
    old = {k: getattr(ms, k) for k in values}
    try:
        for k, v in values.items():
            setattr(ms, k, v)
        yield
    finally:
        for k, v in old.items():
            setattr(ms, k, v)


def refinalize(df: pl.DataFrame) -> pl.DataFrame:
    """The rows categorized again from scratch (every rank), with the thresholds now set."""
    bare = df.with_columns(pl.lit(None, dtype=pl.String).alias("category"), pl.lit(None, dtype=pl.String).alias("family"))
    return pl.concat([finalize_rank(g) for _, g in bare.group_by("rank", maintain_order=True)], how="vertical_relaxed")


def need(df: pl.DataFrame, shares_of: Callable[[pl.DataFrame], dict[str, float]], name: str) -> int:
    """Smallest value of threshold ``name`` that categorizes ``df`` as the shipped value does (bisection)."""
    grid = THRESHOLDS[name]
    want = shares_of(refinalize(df))

    def same_at(v: int) -> bool:
        with thresholds({name: v}):
            return all(abs(a - b) < 1e-9 for a, b in zip(shares_of(refinalize(df)).values(), want.values()))

    if same_at(grid[0]):  # the case does not use the rule
        return grid[0]
    lo, hi = 1, len(grid) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if same_at(grid[mid]):
            hi = mid
        else:
            lo = mid + 1
    return grid[lo]


def fitted(needs: dict[str, dict[str, int]], fams: dict[str, str], held_out: str) -> tuple[dict[str, int], list[str]]:
    """Each threshold at the largest need among the cases of the other families; a threshold that only the held-out
    family uses cannot be fit without it: it stays as shipped, and is listed (its row is no test of that rule)."""
    fit, unfit = {}, []
    for t in THRESHOLDS:
        others = max([n[t] for c, n in needs.items() if fams[c] != held_out] or [0])
        own = max([n[t] for c, n in needs.items() if fams[c] == held_out] or [0])
        if others == 0 and own > 0:
            fit[t], unfit = getattr(ms, t), unfit + [t]
        else:
            fit[t] = others
    return fit, unfit


def lofo_table(rows: list[dict[str, Any]]) -> str:
    """Markdown: family × (MoE GEMM / routing / attention) worst error over its cases, pp, with the fitted thresholds."""
    out = ["| family | cases | MoE GEMM err | routing err | attention err | attention ours/truth | thresholds fit without it | only this family uses |",
           "|---|---:|---:|---:|---:|---:|---|---|"]
    for r in rows:
        err = " | ".join(f"{r['err'][c]:.2f} pp" for c in CATS)
        ratio = "—" if r["ratio"] is None else f"{r['ratio'][0]:.2f}–{r['ratio'][1]:.2f}×"
        th = ", ".join(f"{k}={v}" for k, v in r["fit"].items() if v != getattr(ms, k))
        out.append(f"| {r['family']} | {r['cases']} | {err} | {ratio} | {th or 'as shipped'} | {', '.join(r['unfit']) or '—'} |")
    return "\n".join(out)


def write_needs(path: Path, needs: dict[str, dict[str, int]]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(needs, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)
