"""Suite-wide setup: where the shared test traces are.

Tests read the real traces from ``shared/traces`` beside the checkout (the CI
layout) or ``/work/shared/traces``; ``TRACEKIT_TRACES`` overrides both. The
resolved path is exported so every test module sees the same one.
"""

from __future__ import annotations

import os
from pathlib import Path


def _traces_root() -> str:
    env = os.environ.get("TRACEKIT_TRACES")
    if env:
        return env
    here = Path(__file__).resolve().parent.parent
    for cand in (here.parent / "shared" / "traces", Path("/work/shared/traces")):
        if cand.is_dir():
            return str(cand)
    return "/work/shared/traces"


TRACES_ROOT = _traces_root()
os.environ["TRACEKIT_TRACES"] = TRACES_ROOT

try:  # CI runs property tests with a fixed seed per test, so a landing never depends on luck
    from hypothesis import settings as _hsettings

    _hsettings.register_profile("ci", derandomize=True, database=None, deadline=None)
    if os.environ.get("CI"):
        _hsettings.load_profile("ci")
except ImportError:  # pragma: no cover - hypothesis is a dev dependency
    pass
