"""Weight bytes of the GEMM kernels a trace recorded shapes for (``record_shapes``): what a structural what-if
needs to re-cost a loop of small GEMMs as one grouped GEMM (:mod:`tracekit.replay.structural`).

A kernel belongs to the innermost GEMM operator (``cpu_op`` row with ``input_dims``: ``aten::linear``,
``aten::mm``, ``aten::matmul``, ``aten::addmm``, ``aten::bmm``) whose CPU range contains the kernel's launch call
on the same thread (as :func:`tracekit.analysis.passes.efficiency.kernel_efficiency` maps them). Its weight
operand is the second matrix (``linear``: ``[out, in]``; ``mm``/``matmul``: ``[k, n]``; ``addmm``: the third
input; ``bmm``: ``[b, k, n]``); bytes = elements × the dtype's size. Traces without shapes give no rows.
"""

from __future__ import annotations

import math

import polars as pl

from tracekit.analysis.passes.efficiency import record_shapes
from tracekit.core import intervals as iv
from tracekit.dtypes import dtype_bytes

__all__ = ["GEMM_WEIGHT_OPS", "SHAPE_COLUMNS", "gemm_weight_bytes", "weight_bytes"]

#: operators whose second matrix is a weight read once per call
GEMM_WEIGHT_OPS = ("aten::linear", "aten::mm", "aten::matmul", "aten::addmm", "aten::bmm")
#: the trace columns :func:`gemm_weight_bytes` reads (callers that stream a trace add them)
SHAPE_COLUMNS = ("rank", "kind", "name", "ts_ns", "dur_ns", "tid", "input_dims", "input_types", "launch_tid",
                 "launch_ts_ns")


def weight_bytes(op: str, dims_json: str | None, types_json: str | None) -> float | None:
    """Bytes of one GEMM operator's weight operand from its record_shapes strings; None when unknown."""
    rs = record_shapes(dims_json, types_json)
    if rs is None:
        return None
    dims, types = rs
    shapes = [d for d in dims if isinstance(d, list) and d]
    idx = 1 if op != "aten::addmm" else 2
    if len(shapes) <= idx or not all(isinstance(v, int) for v in shapes[idx]):
        return None
    es = next((dtype_bytes(t) for t in types if isinstance(t, str) and t and t != "Scalar" and dtype_bytes(t)), None)
    return float(math.prod(shapes[idx]) * (es or 2))


def gemm_weight_bytes(df: pl.DataFrame) -> pl.DataFrame:
    """``rank, ts_ns, w_bytes`` per GPU kernel launched inside a GEMM operator with recorded shapes (empty without)."""
    empty = pl.DataFrame(schema={"rank": pl.Int64, "ts_ns": pl.Int64, "w_bytes": pl.Float64})
    if "input_dims" not in df.columns or "launch_ts_ns" not in df.columns:
        return empty
    kind = pl.col("kind").cast(pl.String)
    ops = df.filter((kind == "cpu_op") & pl.col("input_dims").is_not_null()
                    & pl.col("name").cast(pl.String).is_in(list(GEMM_WEIGHT_OPS)))
    if ops.height == 0:
        return empty
    types = pl.col("input_types") if "input_types" in ops.columns else pl.lit(None, pl.String)
    sig = ops.select(pl.col("name").cast(pl.String).alias("op"), "input_dims", types.alias("input_types")).unique()
    sig = sig.with_columns(pl.Series("w_bytes", [weight_bytes(o, d, t) for o, d, t in sig.iter_rows()], dtype=pl.Float64))
    ops = (ops.select(pl.col("rank").cast(pl.Int64), "tid", pl.col("ts_ns").alias("start"),
                      (pl.col("ts_ns") + pl.col("dur_ns")).alias("end"), pl.col("name").cast(pl.String).alias("op"),
                      "input_dims", types.alias("input_types"))
           .join(sig, on=["op", "input_dims", "input_types"], how="left", nulls_equal=True)
           .filter(pl.col("w_bytes").is_not_null()).with_row_index("op_id"))
    ker = df.filter((kind == "kernel") & pl.col("launch_ts_ns").is_not_null()).select(
        pl.col("rank").cast(pl.Int64), pl.col("launch_tid").alias("tid"), "launch_ts_ns", "ts_ns")
    j = iv.covered_by(ker, ops.select("rank", "tid", "start", "end", "op_id"), by=["rank", "tid"], at="launch_ts_ns",
                      payload=["op_id"])
    j = j.filter(pl.col("op_id").is_not_null()).join(ops.select("op_id", "w_bytes"), on="op_id")
    # an operator with several kernels (split-K reduce): its weight bytes go to its first kernel only
    return j.sort("ts_ns").unique("op_id", keep="first").select("rank", "ts_ns", "w_bytes")
