"""How the MoE split was found, and how sure it is: ``moe_detection`` (docs/breakdown.md, "Saying when unsure").

The MoE categories come from three sources, read back from each GPU op's ``family``: kernel names (a fused MoE
or grouped GEMM kernel, a named router), the launch pattern (:mod:`tracekit.ingest.moe_structure`: ``moe_gemm.structure``,
``moe_routing.gate``, ``moe_routing.dispatch``) and module context (``ctx.*``, from ``--module-context`` or a stack
trace). ``status``:

* ``detected``: some GPU time is MoE, ``sources`` says by which source (% of GPU-op time each);
* ``dense``: no MoE anywhere, and the trace shows the layers of a model (norm kernels, and attention or GEMMs): a
  measured 0 %;
* ``not_detected``: no MoE, and nothing recognizable either (an unknown engine's fused kernels): the MoE split is
  unknown, not 0 % (a quality note ``moe_not_detected`` says so).

``ambiguous_pct``: GEMMs the launch pattern could not attribute — a plain GEMM inside an MoE block that does not loop
over experts (a shared expert, or an expert GEMM the pattern cannot tell from one: family ``gemm.moe_block``), or GEMMs
of a loop shaped like a per-expert loop that no router precedes (``gemm.moe_loop``). They stay dense_gemm;
``moe_gemm_range_pct`` gives the MoE GEMM share with none and with all of them, and a quality note ``moe_ambiguous``
says so when they reach :data:`AMBIGUOUS_NOTE_PCT`.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
import polars as pl

from tracekit.analysis.registry import Analysis, FinishContext, Finished, register
from tracekit.analysis.sections import MoeDetection

__all__ = ["AMBIGUOUS_FAMILIES", "AMBIGUOUS_NOTE_PCT", "moe_detection_part", "moe_detection_finish"]

#: dense GEMMs the launch pattern leaves open (tracekit.ingest.moe_structure)
AMBIGUOUS_FAMILIES = ("gemm.moe_block", "gemm.moe_loop")
#: a quality note when the ambiguous GEMMs reach this share of GPU-op time (%)
AMBIGUOUS_NOTE_PCT = 0.5
_STRUCTURE = ("moe_gemm.structure", "moe_routing.gate", "moe_routing.dispatch")
_NORM = r"MeanOps|(?i:rms_?norm|layer_?norm)"


@dataclass(frozen=True)
class DetectionPart:
    """One rank's GPU-op ns: all, MoE by source, MoE GEMM, ambiguous GEMMs; and whether layers are recognizable."""

    gpu_ns: int
    named_ns: int
    pattern_ns: int
    module_ns: int
    moe_gemm_ns: int
    ambiguous_ns: int
    layers: bool


def moe_detection_part(df: pl.DataFrame) -> DetectionPart:
    g = df.lazy().filter(pl.col("kind").is_in(["kernel", "memcpy", "memset"])).select(
        "dur_ns", pl.col("category").cast(pl.String).alias("c"), pl.col("family").cast(pl.String).fill_null("").alias("f"),
        pl.col("name").cast(pl.String).alias("n"))
    moe = pl.col("c").is_in(["moe_gemm", "moe_routing"])
    ctx = pl.col("f").str.starts_with("ctx.")
    pat = pl.col("f").is_in(list(_STRUCTURE))
    d = pl.col("dur_ns")
    r = g.select(
        d.sum().alias("gpu"), d.filter(moe & ~ctx & ~pat).sum().alias("named"), d.filter(moe & pat).sum().alias("pattern"),
        d.filter(moe & ctx).sum().alias("module"), d.filter(pl.col("c") == "moe_gemm").sum().alias("gemm"),
        d.filter(pl.col("f").is_in(list(AMBIGUOUS_FAMILIES))).sum().alias("amb"),
        ((pl.col("f") == "norm") | pl.col("n").str.contains(_NORM)).any().alias("norm"),
        pl.col("c").is_in(["attention", "dense_gemm"]).any().alias("work"),
    ).collect().row(0, named=True)
    return DetectionPart(int(r["gpu"] or 0), int(r["named"] or 0), int(r["pattern"] or 0), int(r["module"] or 0),
                         int(r["gemm"] or 0), int(r["amb"] or 0), bool(r["norm"]) and bool(r["work"]))


def _pct(ns: int, tot: int) -> float:
    return round(100.0 * ns / tot, 3) if tot else 0.0


def moe_detection_finish(parts: list[DetectionPart], ctx: FinishContext) -> Finished:
    tot = sum(p.gpu_ns for p in parts)
    if tot == 0:
        return Finished({})
    named, pattern, module = (sum(getattr(p, k) for p in parts) for k in ("named_ns", "pattern_ns", "module_ns"))
    gemm, amb = sum(p.moe_gemm_ns for p in parts), sum(p.ambiguous_ns for p in parts)
    status = "detected" if named + pattern + module else ("dense" if any(p.layers for p in parts) else "not_detected")
    sources = {k: _pct(v, tot) for k, v in (("kernel_names", named), ("launch_pattern", pattern), ("module_context", module)) if v}
    node = MoeDetection(status=status, sources=sources, moe_gemm_pct=_pct(gemm, tot), ambiguous_pct=_pct(amb, tot),
                        moe_gemm_range_pct=(_pct(gemm, tot), _pct(gemm + amb, tot)) if amb else None)
    if status == "not_detected":
        ctx.quality.add("moe_not_detected", "no MoE structure recognized (no MoE kernel names, no router -> experts -> combine "
                        "launch pattern, no module context) and no layer structure either: the MoE split is not detected, "
                        "not 0 %; run with --module-context or a with_stack trace, or name the kernels with --rules",
                        severity="info")
    elif _pct(amb, tot) >= AMBIGUOUS_NOTE_PCT:
        ctx.quality.add("moe_ambiguous", f"{_pct(amb, tot):.1f}% of GPU-op time are GEMMs inside an MoE block (or a loop shaped "
                        "like one) that the launch pattern cannot attribute to experts (a shared expert, or experts it cannot "
                        f"tell apart); they count as dense: MoE GEMM is {_pct(gemm, tot):.1f}-{_pct(gemm + amb, tot):.1f}%",
                        severity="info", low_pct=_pct(gemm, tot), high_pct=_pct(gemm + amb, tot))
    return Finished({"moe_detection": msgspec.to_builtins(node)}, node)  # sections are JSON-ready, as every pass's


ANALYSIS = register(Analysis("moe_detection", ("moe_detection",), ("kind", "dur_ns", "category", "family", "name"),
                             lambda df, ctx: moe_detection_part(df), moe_detection_finish, order=85))
