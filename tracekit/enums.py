"""The closed vocabularies of trace.parquet: row kinds and breakdown categories.

Their own module, below :mod:`tracekit.schema` (which re-exports them) and :mod:`tracekit.categories`, so that
the read-time validation (:mod:`tracekit.trace_check`) can use the categorizer without an import cycle.
"""

from __future__ import annotations

__all__ = ["KINDS", "GPU_OP_KINDS", "CATEGORIES"]

#: Row kinds. GPU ops are ``kernel``, ``memcpy`` and ``memset``.
KINDS = (
    "kernel",  # GPU kernel (CUPTI)
    "memcpy",  # GPU copy; memcpy_kind and bytes set
    "memset",  # GPU memset; bytes set
    "cpu_op",  # CPU operator (aten::*, record_param_comms, python functions)
    "runtime",  # CUDA runtime / driver API call (cudaLaunchKernel, cudaStreamSynchronize, ...)
    "sync",  # CUDA sync record (stream wait event, event sync, stream sync, context sync)
    "range",  # CPU-side user range (record_function / user_annotation / NVTX push-pop or start-end)
    "gpu_range",  # GPU-side projection of a user range (Kineto gpu_user_annotation)
    "step",  # one forward/step: SGLang step[...], tracekit tk.fwd[...], ProfilerStep#N, unprofiled step records
    "counter",  # telemetry sample; name carries the unit (power_w, sm_active_pct, pcie_rx_bytes_per_s)
    "instant",  # zero-length marker (NVTX mark, Kineto instant, injected fault marker)
)
GPU_OP_KINDS = ("kernel", "memcpy", "memset")

#: Breakdown categories of GPU ops (``category`` column). ``idle`` is never a row value:
#: it is the part of the window no GPU op covers.
CATEGORIES = (
    "moe_gemm",
    "moe_routing",
    "attention",
    "communication",
    "dense_gemm",
    "other_compute",
    "memory",
)
