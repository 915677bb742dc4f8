"""Element sizes of the dtype names traces record (record_param_comms, NCCL, torch.profiler shapes).

One table for collectives (message bytes), kernel efficiency (GEMM bytes) and replay.
Names are matched lower-cased and without a ``c10::`` / ``torch.`` prefix.
"""

from __future__ import annotations

import polars as pl

__all__ = ["DTYPE_BYTES", "dtype_bytes", "dtype_bytes_expr"]

DTYPE_BYTES: dict[str, int] = {
    "float": 4, "float32": 4, "fp32": 4, "int": 4, "int32": 4, "uint32": 4,
    "bfloat16": 2, "bf16": 2, "half": 2, "float16": 2, "fp16": 2, "short": 2, "int16": 2,
    "double": 8, "float64": 8, "long": 8, "int64": 8, "uint64": 8,
    "byte": 1, "char": 1, "bool": 1, "int8": 1, "uint8": 1,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1, "fp8": 1,
}


def _norm(name: str) -> str:
    n = name.strip().lower()
    for p in ("c10::", "torch."):
        n = n.removeprefix(p)
    return n


def dtype_bytes(name: str | None) -> int | None:
    """Bytes per element of ``name``; None when unknown."""
    return DTYPE_BYTES.get(_norm(name)) if name else None


def dtype_bytes_expr(col: pl.Expr) -> pl.Expr:
    """:func:`dtype_bytes` as a polars expression over a string column (null when unknown)."""
    n = col.str.strip_chars().str.to_lowercase().str.replace(r"^(c10::|torch\.)", "")
    return n.replace_strict(DTYPE_BYTES, default=None, return_dtype=pl.Int64)
