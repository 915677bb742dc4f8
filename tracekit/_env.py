"""Every environment variable tracekit reads or sets, in one place.

Names only plus small typed accessors; no third-party imports (the SGLang hook and the
capture's program hook import this inside the target process).

| variable | read by | meaning |
|---|---|---|
| ``TRACEKIT_DEBUG`` | cli | ``1``: show the traceback of an internal error |
| ``TRACEKIT_PARSE_THREADS`` | ingest.kineto (set by ingest._workers) | threads decoding one file's JSON chunks |
| ``POLARS_MAX_THREADS`` | polars (set by ingest._workers) | polars threads of a ``convert --jobs`` worker |
| ``TRACEKIT_ARROW_DECAY_MS`` | _memory | pyarrow jemalloc decay (ms) |
| ``_RJEM_MALLOC_CONF`` | polars' jemalloc (set by _memory) | allocator decay / arenas |
| ``TRACEKIT_SGLANG_HOOK`` | capture.sglang_plugin, capture.sglang_autopatch | ``1``: the forward hook is active in SGLang |
| ``TRACEKIT_STEP_DIR`` | capture.sglang_plugin | where the hook writes step timings |
| ``TRACEKIT_CAPTURE_DIR`` / ``TRACEKIT_CAPTURE_SPEC`` | capture.program_hook | capture output dir / JSON spec |
| ``TRACEKIT_TEST_SIGINT_AT`` | _interrupt | fault injection for the tests: ``<label>[:<n>]`` sends this process SIGINT at the n-th interrupt check of that label |
| ``TRACEKIT_MODULE_CONTEXT`` | capture.program_hook (set by ``capture --module-context``) | ``1``: add ``tk.mod[...]`` ranges around MoE/expert/router/attention modules |
"""

from __future__ import annotations

import os

__all__ = ["DEBUG", "PARSE_THREADS", "POLARS_MAX_THREADS", "ARROW_DECAY_MS", "JEMALLOC_CONF", "SGLANG_HOOK", "STEP_DIR",
           "CAPTURE_DIR", "CAPTURE_SPEC", "MODULE_CONTEXT", "TEST_SIGINT_AT", "debug", "positive_int"]

DEBUG = "TRACEKIT_DEBUG"
PARSE_THREADS = "TRACEKIT_PARSE_THREADS"
POLARS_MAX_THREADS = "POLARS_MAX_THREADS"
ARROW_DECAY_MS = "TRACEKIT_ARROW_DECAY_MS"
JEMALLOC_CONF = "_RJEM_MALLOC_CONF"
SGLANG_HOOK = "TRACEKIT_SGLANG_HOOK"
STEP_DIR = "TRACEKIT_STEP_DIR"
CAPTURE_DIR = "TRACEKIT_CAPTURE_DIR"
CAPTURE_SPEC = "TRACEKIT_CAPTURE_SPEC"
MODULE_CONTEXT = "TRACEKIT_MODULE_CONTEXT"
TEST_SIGINT_AT = "TRACEKIT_TEST_SIGINT_AT"


def debug() -> bool:
    """Whether internal errors show their traceback."""
    return bool(os.environ.get(DEBUG))


def positive_int(name: str) -> int | None:
    """The variable as a positive integer; None when unset or not one."""
    v = os.environ.get(name, "")
    return int(v) if v.isdigit() and int(v) > 0 else None
