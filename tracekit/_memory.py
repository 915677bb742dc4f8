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
  runs first thing in the CLI entry (``tracekit.cli.main``, before any command
  imports polars) and never overrides a value the user set (a value made of polars' own defaults only is not the
  user's: a parent process that imported polars passes it on). Importing tracekit
  changes nothing; a program that uses the library calls
  ``tracekit.configure_env()`` before it imports polars to get the same setting.
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

import functools
import os
import sys
from typing import Any

from tracekit import _env

__all__ = ["configure_env", "cluster_client", "user_env", "tune_runtime", "release_memory"]

#: polars' jemalloc: return freed pages within ~100 ms instead of 10 s
POLARS_JEMALLOC_CONF = "dirty_decay_ms:100,muzzy_decay_ms:0"
#: ... and within 1 s for the commands that analyze a trace.parquet rank by rank: their per-rank frames are
#: freed and rebuilt every rank, and a 100 ms decay faults the same pages in again (8 x 4M kernels: 60.8 s wall,
#: 15.2 s system time at 100 ms; 34.4 s, 9.8 s at 1 s, for +0-17% peak; docs/scale.md §2a)
POLARS_JEMALLOC_CONF_ANALYZE = "dirty_decay_ms:1000,muzzy_decay_ms:0"
#: CLI commands that get :data:`POLARS_JEMALLOC_CONF_ANALYZE`
ANALYZE_COMMANDS = frozenset({"analyze", "diff", "timeline", "export", "replay"})
#: pyarrow's jemalloc pool: decay of freed pages (ms)
ARROW_DECAY_MS = 1000
#: a ``--cluster`` client's own polars: it plans and reduces small tables (every rank's collective and step rows,
#: then every rank's small part) while the workers read the trace, so two threads, and freed pages returned at
#: once: its peak is then its live tables, not the transient buffers of the last query (512 ranks: 555 -> 467 MB
#: with the decay alone, docs/scale.md §4); a local cluster's workers on the same cores keep them
CLUSTER_CLIENT_THREADS = 2
CLUSTER_CLIENT_JEMALLOC_CONF = "dirty_decay_ms:0,muzzy_decay_ms:0,narenas:1"


def cli_command(argv: list[str] | None = None) -> str | None:
    """The tracekit CLI command this process runs (``tracekit analyze ...``, ``python -m tracekit.cli analyze``), else None."""
    argv = sys.argv if argv is None else argv
    if not argv:
        return None
    prog = os.path.basename(argv[0])
    # "-m": python is still importing the module it was asked to run, and importing tracekit on the way to it
    # means that module is tracekit.cli (or tracekit)
    if not (prog in ("tracekit", "-m") or argv[0].endswith(("tracekit/cli.py", "tracekit/__main__.py"))):
        return None
    return next((a for a in argv[1:] if not a.startswith("-")), None)


def polars_jemalloc_conf(command: str | None = None, argv: list[str] | None = None) -> str:
    """The decay for ``command`` (:data:`POLARS_JEMALLOC_CONF`, or :data:`POLARS_JEMALLOC_CONF_ANALYZE` for the
    analysis commands reading a trace.parquet) plus an arena count of one per 4 cores (jemalloc's default is 4 per
    core). An analysis command given a profiler's trace (``argv``: :func:`converts_input`) converts it first: the
    conversion's decay, so that its freed pages do not add to the analysis' peak (the 220 MB real trace:
    ~500 -> ~420 MB for ~0.1 CPU-s of page faults, docs/scale.md §5)."""
    try:
        ncpu = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        ncpu = os.cpu_count() or 1
    analyze = command in ANALYZE_COMMANDS and not (argv is not None and converts_input(argv))
    conf = POLARS_JEMALLOC_CONF_ANALYZE if analyze else POLARS_JEMALLOC_CONF
    return f"{conf},narenas:{max(1, ncpu // 4)}"


def converts_input(argv: list[str]) -> bool:
    """Whether a command line names a profiler's trace where a trace.parquet is expected (``tracekit analyze
    trace.json.gz``): an argument after the command that :func:`tracekit._inputs.is_profiler_input` recognizes.
    Read before polars is imported, from the files' first bytes."""
    from pathlib import Path

    from tracekit._inputs import is_profiler_input

    cmd = cli_command(argv)
    args = argv[argv.index(cmd) + 1:] if cmd in argv else []
    return any(not a.startswith("-") and is_profiler_input(Path(a)) for a in args)


def cluster_client(argv: list[str] | None = None) -> bool:
    """Whether ``argv`` (default ``sys.argv``) runs a tracekit command as a ``--cluster`` client."""
    argv = sys.argv if argv is None else argv
    return cli_command(argv) is not None and any(a == "--cluster" or a.startswith("--cluster=") for a in argv[1:])


def configure_env(argv: list[str] | None = None) -> bool:
    """Set polars' allocator default for the command ``argv`` runs (default ``sys.argv``: :func:`cli_command`), and
    for a ``--cluster`` client its thread count (:data:`CLUSTER_CLIENT_THREADS`, :data:`CLUSTER_CLIENT_JEMALLOC_CONF`);
    no-op for a variable the user set (:func:`user_env` keeps the user's values for the workers a local cluster
    starts). Returns False (and sets nothing) once polars is loaded: too late."""
    if "polars" in sys.modules:
        return False
    if _env.is_set(_env.JEMALLOC_CONF) and _users_jemalloc(_env.get(_env.JEMALLOC_CONF) or "") is None:
        # polars' own default, passed on by a parent process that imported polars (a notebook, a benchmark's
        # controller): not the user's choice, so it does not keep this command's setting
        _env.unset(_env.JEMALLOC_CONF)
    if cluster_client(argv):
        ours = [n for n in (_env.JEMALLOC_CONF, _env.POLARS_MAX_THREADS) if not _env.is_set(n)]
        _env.set_default(_env.JEMALLOC_CONF, CLUSTER_CLIENT_JEMALLOC_CONF)
        _env.set_default(_env.POLARS_MAX_THREADS, str(CLUSTER_CLIENT_THREADS))
        if ours:
            _env.set_default(_env.CLIENT_DEFAULTS, ",".join(ours))
    else:
        _env.set_default(_env.JEMALLOC_CONF, polars_jemalloc_conf(cli_command(argv), sys.argv if argv is None else argv))
    return True


#: what ``import polars`` writes at the front of ``_RJEM_MALLOC_CONF`` (its defaults; the environment's own value
#: follows them), which child processes then inherit
_POLARS_OWN_JEMALLOC = frozenset({"dirty_decay_ms:500", "muzzy_decay_ms:1000", "thp:always", "metadata_thp:always"})


def _users_jemalloc(value: str) -> str | None:
    """``value`` of ``_RJEM_MALLOC_CONF`` without the defaults that ``import polars`` put in front of it; None when
    nothing else is left (the variable was set by polars in a parent process, not by the user)."""
    items = [x for x in value.split(",") if x]
    i = 0
    while i < len(items) and items[i] in _POLARS_OWN_JEMALLOC:
        i += 1
    return ",".join(items[i:]) or None


def user_env(name: str) -> str | None:
    """The user's own value of ``name`` (:data:`~tracekit._env.JEMALLOC_CONF`, :data:`~tracekit._env.POLARS_MAX_THREADS`):
    None where :func:`configure_env` set it as a ``--cluster`` client's default (``TRACEKIT_CLIENT_DEFAULTS``)."""
    ours = (_env.get(_env.CLIENT_DEFAULTS) or "").split(",")
    return None if name in ours else _env.get(name)


@functools.cache
def tune_runtime() -> None:
    """Runtime allocator knobs (once per process; later calls do nothing): pyarrow's jemalloc returns freed pages
    promptly (:data:`ARROW_DECAY_MS`, or ``TRACEKIT_ARROW_DECAY_MS``)."""
    env = _env.get(_env.ARROW_DECAY_MS) or ""
    try:
        import pyarrow as pa

        pa.jemalloc_set_decay_ms(int(env) if env.isdigit() else ARROW_DECAY_MS)
    except Exception:  # noqa: BLE001 - wheel without jemalloc, or a different default pool
        pass


@functools.cache
def _libc() -> Any:
    """The C library of this process (loaded once); None where there is no glibc to trim."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        return ctypes.CDLL(None)
    except OSError:
        return None


def release_memory(*, arrow: bool = False) -> None:
    """Hand freed heap memory back to the OS (glibc ``malloc_trim``); call between ranks. ``arrow``: also pyarrow's
    pool (mimalloc or jemalloc keep freed pages for reuse), e.g. between a conversion, which allocates through
    pyarrow, and an analysis in the same process, which allocates mostly through polars. (On the 220 MB real trace
    this changed nothing measurable: what a conversion leaves is polars' own dirty pages, which
    :func:`polars_jemalloc_conf`'s short decay returns.)"""
    if arrow and "pyarrow" in sys.modules:
        try:
            sys.modules["pyarrow"].default_memory_pool().release_unused()
        except Exception:  # noqa: BLE001 - an older pyarrow without release_unused
            pass
    lib = _libc()
    try:
        if lib is not None:
            lib.malloc_trim(0)
    except AttributeError:  # a C library without malloc_trim (musl)
        pass
