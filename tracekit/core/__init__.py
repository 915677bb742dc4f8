"""Core: the time algebra and the one definitions that ingest, capture, analysis, replay and report share.

The interval primitive (:mod:`.intervals`), the window (:mod:`.window`), the collective matching
(:mod:`.collectives`), clock alignment (:mod:`.align`), the blocking host calls (:mod:`.blocking`), the GPU
peaks table (:mod:`.gpus`). Imports only the contract modules (``tracekit.schema``, ``_errors``, ``dtypes`` ...);
docs/architecture.md has the layer order.
"""
