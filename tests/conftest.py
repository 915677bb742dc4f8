"""Suite-wide setup: where the shared test traces are, and which tests run alone.

Tests read the real traces from ``shared/traces`` beside the checkout (the CI
layout) or ``/work/shared/traces``; ``TRACEKIT_TRACES`` overrides both. The
resolved path is exported so every test module sees the same one.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


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


#: tests that run in the serial pass (``-m serial``; README's test command): they time a live program (capture windows,
#: signals at points of a run, a 10 s scheduler deadline), spawn worker pools, or kill a convert mid-write; a second
#: test beside them on a 2-core machine moves what they measure. The rest run with ``-n auto`` (browser tests too:
#: Chromium runs them on a virtual clock).
_SERIAL_DIRS = frozenset({"capture", "faults", "cpu_mode", "cluster", "sglang"})
_SERIAL_FILES = frozenset({"test_atomic.py", "test_staging.py", "test_interrupts.py"})
_TESTS = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(str(item.path))
        top = path.relative_to(_TESTS).parts[0] if path.is_relative_to(_TESTS) else ""
        if top in _SERIAL_DIRS or path.name in _SERIAL_FILES:
            item.add_marker(pytest.mark.serial)
