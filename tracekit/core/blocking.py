"""Blocking host calls (CUDA driver/runtime and HIP): the one list every analysis and replay reads.

:data:`BLOCKING_CALLS` maps a call's base name to what it waits for (``stream``, ``device``,
``event``, or ``self`` for a synchronous copy). Recorded names may carry a version suffix
(``cudaStreamSynchronize_v3020``, ``cuMemcpyDtoH_v2``); :func:`blocking_kind_expr` and
:data:`SYNC_REGEX` accept it.
"""

from __future__ import annotations

import re

import polars as pl

__all__ = ["BLOCKING_CALLS", "SYNC_REGEX", "EVENT_RECORD_CALLS", "STREAM_WAIT_CALLS", "GRAPH_LAUNCH_CALLS", "blocking_kind_expr"]

BLOCKING_CALLS: dict[str, str] = {
    # CUDA runtime / driver
    "cudaStreamSynchronize": "stream", "cuStreamSynchronize": "stream",
    "cudaDeviceSynchronize": "device", "cudaThreadSynchronize": "device", "cuCtxSynchronize": "device",
    "cudaEventSynchronize": "event", "cuEventSynchronize": "event",
    "cudaMemcpy": "self", "cudaMemcpy2D": "self", "cudaMemcpy3D": "self",
    "cudaMemcpyFromSymbol": "self", "cudaMemcpyToSymbol": "self",
    "cuMemcpy": "self", "cuMemcpyDtoH": "self", "cuMemcpyHtoD": "self", "cuMemcpyDtoD": "self",
    "cuMemcpy2D": "self", "cuMemcpy3D": "self",
    # HIP (ROCm)
    "hipStreamSynchronize": "stream", "hipDeviceSynchronize": "device", "hipEventSynchronize": "event",
    "hipMemcpy": "self",
}
EVENT_RECORD_CALLS = ("cudaEventRecord", "cudaEventRecordWithFlags", "cuEventRecord", "hipEventRecord")
STREAM_WAIT_CALLS = ("cudaStreamWaitEvent", "cuStreamWaitEvent", "hipStreamWaitEvent")
GRAPH_LAUNCH_CALLS = ("cudaGraphLaunch", "cuGraphLaunch", "cudaGraphLaunch_v10000", "hipGraphLaunch")

_VERSION = r"(_v\d+)?"
#: regex of every blocking call name, with an optional version suffix
SYNC_REGEX = r"^(" + "|".join(re.escape(n) for n in sorted(BLOCKING_CALLS, key=len, reverse=True)) + r")" + _VERSION + "$"


def blocking_kind_expr(name: pl.Expr) -> pl.Expr:
    """What the call ``name`` (a string expression) waits for; ``""`` when it does not block."""
    base = name.str.replace(r"(_v\d+)$", "")
    return base.replace_strict(BLOCKING_CALLS, default="", return_dtype=pl.String)
