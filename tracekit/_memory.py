"""Allocator settings that keep a long conversion's resident memory close to its live data.

tracekit frees large buffers all the time (one rank's decoded chunks, then one
rank's frames). Three allocators hold freed memory back by default:

* polars' jemalloc keeps freed pages for 10 s (``dirty_decay_ms``) in up to 4
  arenas per core; a conversion finishes ranks faster than that, so freed
  frames piled up. Here: 100 ms, one arena per 4 cores. Measured with the rank
  kept in chunks (docs/scale.md), 8 ranks x 125 k kernels / 2 ranks x 500 k
  kernels (452 MB of JSON each): 1 s gave 11.0 s, 540 MB / 12.7 s, 761 MB;
  300 ms 11.3 s, 550 MB / 13.1 s, 708 MB; 100 ms gives 11.4 s, 539 MB /
  13.0 s, 683 MB (1.5x the rank's JSON instead of 1.7x); 0 ms costs ~3 s more.
  It reads ``_RJEM_MALLOC_CONF`` when polars loads, so :func:`configure_env`
  runs from ``tracekit/__init__`` (before polars is imported, if it is not
  yet) and never overrides a value the user set.
* pyarrow's jemalloc pool (JSON parser, Parquet writer): decay set to 1 s at runtime
  (0 saved ~20 MB but cost ~2 s of page faults per 1M-kernel conversion).
* glibc malloc raises its mmap threshold after large frees, so later 4 MB text
  chunks land in arenas that are not trimmed: :func:`release_memory` trims
  them between ranks (pinning the threshold instead cost 0.5 s of page faults
  per 113 MB rank).

Measured effect (8 ranks × 125 k kernels, ``benchmarks/convert.py``): see docs/scale.md.
All of this is best effort; nothing fails if a platform lacks a knob.
"""

from __future__ import annotations

import os
import sys
from tracekit import _env

__all__ = ["configure_env", "tune_runtime", "release_memory"]

#: polars' jemalloc: return freed pages within ~100 ms instead of 10 s
POLARS_JEMALLOC_CONF = "dirty_decay_ms:100,muzzy_decay_ms:0"
#: pyarrow's jemalloc pool: decay of freed pages (ms)
ARROW_DECAY_MS = 1000
_tuned = False
_libc = None


def polars_jemalloc_conf() -> str:
    """:data:`POLARS_JEMALLOC_CONF` plus an arena count of one per 4 cores (jemalloc's default is 4 per core)."""
    try:
        ncpu = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        ncpu = os.cpu_count() or 1
    return f"{POLARS_JEMALLOC_CONF},narenas:{max(1, ncpu // 4)}"


def configure_env() -> None:
    """Set allocator environment defaults (no-op for a variable the user set)."""
    if "polars" not in sys.modules:
        os.environ.setdefault(_env.JEMALLOC_CONF, polars_jemalloc_conf())


def tune_runtime() -> None:
    """Runtime allocator knobs (idempotent): pyarrow's jemalloc returns freed pages promptly."""
    global _tuned
    if _tuned:
        return
    _tuned = True
    env = os.environ.get(_env.ARROW_DECAY_MS, "")
    try:
        import pyarrow as pa

        pa.jemalloc_set_decay_ms(int(env) if env.isdigit() else ARROW_DECAY_MS)
    except Exception:  # noqa: BLE001 - wheel without jemalloc, or a different default pool
        pass


def release_memory() -> None:
    """Hand freed heap memory back to the OS (glibc ``malloc_trim``); call between ranks."""
    global _libc
    if not sys.platform.startswith("linux"):
        return
    try:
        if _libc is None:
            import ctypes

            _libc = ctypes.CDLL(None)
        _libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass
