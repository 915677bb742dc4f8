"""Every environment variable tracekit reads or sets, in one place: the only module that touches ``os.environ``.

Names plus small typed accessors; no third-party imports (the SGLang hook and the capture's program hook import
this inside the target process). Nothing is read at import time: each accessor reads when it is called.
``tests/unit/test_env.py`` fails on an ``os.environ`` / ``os.getenv`` anywhere else in ``tracekit/`` (the one
exception: the capture's ``_boot/sitecustomize.py`` reads ``TRACEKIT_PKG_PARENT`` to find this package).

| variable | read by | meaning |
|---|---|---|
| ``TRACEKIT_DEBUG`` | cli | ``1``: show the traceback of an internal error |
| ``TRACEKIT_PARSE_THREADS`` | ingest.kineto (set by ingest._workers) | threads decoding one file's JSON chunks |
| ``POLARS_MAX_THREADS`` | polars (set by ingest._workers) | polars threads of a ``convert --jobs`` worker |
| ``TRACEKIT_ARROW_DECAY_MS`` | _memory | pyarrow jemalloc decay (ms) |
| ``_RJEM_MALLOC_CONF`` | polars' jemalloc (set by _memory, from the CLI entry) | allocator decay / arenas |
| ``TRACEKIT_CLIENT_DEFAULTS`` | cluster.engine (set by _memory for a ``--cluster`` client) | the variables above that hold the client's own defaults, not the user's: a local cluster's workers get theirs |
| ``TRACEKIT_SGLANG_HOOK`` | capture.sglang_plugin, capture.sglang_autopatch | ``1``: the forward hook is active in SGLang |
| ``TRACEKIT_STEP_DIR`` | capture.sglang_plugin | where the hook writes step timings |
| ``TRACEKIT_CAPTURE_DIR`` / ``TRACEKIT_CAPTURE_SPEC`` | capture.program_hook | capture output dir / JSON spec |
| ``TRACEKIT_PKG_PARENT`` | capture/_boot/sitecustomize (set by capture.external) | where the target process finds tracekit |
| ``TRACEKIT_TEST_SIGINT_AT`` | _interrupt | fault injection for the tests: ``<label>[:<n>]`` sends this process SIGINT at the n-th interrupt check of that label |
| ``TRACEKIT_TEST_KILL_RANK`` | cluster.analyze | fault injection for the tests: ``<rank>:<marker file>`` kills (SIGKILL) the Dask worker analyzing that rank once (the marker records it), ``<rank>:always`` every time |
| ``TRACEKIT_CACHE_DIR`` / ``XDG_CACHE_HOME`` | ingest.kscan | where the native Kineto scanner is built when the package directory is read-only (default ``~/.cache/tracekit``) |
| ``TRACEKIT_MODULE_CONTEXT`` | capture.program_hook (set by ``capture --module-context``) | ``1``: add ``tk.mod[...]`` ranges around MoE/expert/router/attention modules |
| ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` | capture.program_hook, capture.sglang_plugin | the launcher's rank of the target process |
| ``CUDA_VISIBLE_DEVICES`` | capture.program_hook, capture.telemetry | the GPUs a process sees |
| ``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME`` / ``MASTER_ADDR`` | torch.distributed (set by capture.orchestrate) | the built-in workload's ranks talk over loopback only |
| ``PYTHONPATH`` | the target process (set by capture.external, capture.launcher) | the boot directory first |
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["DEBUG", "PARSE_THREADS", "POLARS_MAX_THREADS", "ARROW_DECAY_MS", "JEMALLOC_CONF", "CLIENT_DEFAULTS", "SGLANG_HOOK", "STEP_DIR",
           "CAPTURE_DIR", "CAPTURE_SPEC", "PKG_PARENT", "MODULE_CONTEXT", "TEST_SIGINT_AT", "TEST_KILL_RANK", "RANK", "WORLD_SIZE",
           "LOCAL_RANK", "CUDA_VISIBLE_DEVICES", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "MASTER_ADDR", "PYTHONPATH",
           "CACHE_DIR", "XDG_CACHE_HOME", "cache_dir", "debug", "get", "is_set", "flag", "int_value", "positive_int", "set_default", "unset",
           "environ"]

DEBUG = "TRACEKIT_DEBUG"
PARSE_THREADS = "TRACEKIT_PARSE_THREADS"
POLARS_MAX_THREADS = "POLARS_MAX_THREADS"
ARROW_DECAY_MS = "TRACEKIT_ARROW_DECAY_MS"
JEMALLOC_CONF = "_RJEM_MALLOC_CONF"
CLIENT_DEFAULTS = "TRACEKIT_CLIENT_DEFAULTS"
SGLANG_HOOK = "TRACEKIT_SGLANG_HOOK"
STEP_DIR = "TRACEKIT_STEP_DIR"
CAPTURE_DIR = "TRACEKIT_CAPTURE_DIR"
CAPTURE_SPEC = "TRACEKIT_CAPTURE_SPEC"
PKG_PARENT = "TRACEKIT_PKG_PARENT"
MODULE_CONTEXT = "TRACEKIT_MODULE_CONTEXT"
TEST_SIGINT_AT = "TRACEKIT_TEST_SIGINT_AT"
TEST_KILL_RANK = "TRACEKIT_TEST_KILL_RANK"
CACHE_DIR = "TRACEKIT_CACHE_DIR"
XDG_CACHE_HOME = "XDG_CACHE_HOME"
RANK = "RANK"
WORLD_SIZE = "WORLD_SIZE"
LOCAL_RANK = "LOCAL_RANK"
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
GLOO_SOCKET_IFNAME = "GLOO_SOCKET_IFNAME"
NCCL_SOCKET_IFNAME = "NCCL_SOCKET_IFNAME"
MASTER_ADDR = "MASTER_ADDR"
PYTHONPATH = "PYTHONPATH"


def get(name: str, default: str | None = None) -> str | None:
    """The variable's value (``default`` when unset)."""
    return os.environ.get(name, default)


def is_set(name: str) -> bool:
    """Whether the variable is set (to anything, the empty string included)."""
    return name in os.environ


def flag(name: str) -> bool:
    """Whether the variable is ``1`` (the gates: ``TRACEKIT_SGLANG_HOOK``, ``TRACEKIT_MODULE_CONTEXT``)."""
    return os.environ.get(name, "") == "1"


def debug() -> bool:
    """Whether internal errors show their traceback (``TRACEKIT_DEBUG`` set to anything non-empty)."""
    return bool(os.environ.get(DEBUG))


def int_value(name: str) -> int | None:
    """The variable as an integer; None when unset or not one."""
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def positive_int(name: str) -> int | None:
    """The variable as a positive integer; None when unset or not one."""
    v = os.environ.get(name, "")
    return int(v) if v.isdigit() and int(v) > 0 else None


def set_default(name: str, value: str) -> None:
    """Set the variable for this process and its children, unless the user set it."""
    os.environ.setdefault(name, value)


def unset(name: str) -> None:
    """Remove the variable from this process' environment (and its children's)."""
    os.environ.pop(name, None)


def environ() -> dict[str, str]:
    """A copy of this process' environment (the base of a child process' environment)."""
    return dict(os.environ)


def cache_dir() -> Path:
    """tracekit's user cache directory (``TRACEKIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/tracekit``, else ``~/.cache/tracekit``)."""
    own = os.environ.get(CACHE_DIR)
    if own:
        return Path(own)
    base = os.environ.get(XDG_CACHE_HOME)
    return (Path(base) if base else Path.home() / ".cache") / "tracekit"
