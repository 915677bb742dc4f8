"""Thread budget of ``convert --jobs N`` worker processes (imports nothing heavy: it runs before polars loads).

A worker sized its parse pool and polars' thread pool to every core, so N
workers ran N x cores threads on cores cores. :func:`init_worker` gives each
worker ``cores // N`` threads (at least one) unless the user chose a number.
"""

from __future__ import annotations

import os

from tracekit import _env

__all__ = ["init_worker", "worker_threads"]


def worker_threads(jobs: int) -> int:
    """Threads per worker when ``jobs`` workers share this host's cores."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        cores = os.cpu_count() or 1
    return max(1, cores // max(1, jobs))


def init_worker(threads: int) -> None:
    """Process-pool initializer: set the parse and polars thread counts (no-op for a variable the user set)."""
    import signal

    # Ctrl-C reaches the whole process group: the parent stops the pool and cleans up; a worker
    # must not die on its own with a KeyboardInterrupt traceback
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _env.set_default(_env.PARSE_THREADS, str(threads))
    _env.set_default(_env.POLARS_MAX_THREADS, str(threads))
