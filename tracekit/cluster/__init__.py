"""Per-rank work on a Dask cluster (``--cluster ADDR``; the ``cluster`` extra: ``pip install 'tracekit[cluster]'``).

:mod:`tracekit.cluster.engine` connects (or starts a loopback ``LocalCluster``); ``convert --cluster`` runs each
source's parse, finalize and partition write as a task (:func:`tracekit.ingest.convert.convert` with the
client's executor); ``analyze --cluster`` runs the per-rank analyses as tasks (:mod:`tracekit.cluster.analyze`).
Nothing here imports Dask at import time.
"""
