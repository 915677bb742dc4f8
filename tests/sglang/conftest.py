"""Fixtures for the SGLang integration tests: the fake ``sglang`` tree goes on sys.path only here."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

FAKE_PKGS = Path(__file__).parent / "fake_pkgs"


def _purge_sglang() -> None:
    for name in [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]:
        del sys.modules[name]


@pytest.fixture
def fake_sglang(monkeypatch):
    """Fresh import of the fake ``sglang`` package and a fresh tracekit hook state."""
    from tracekit.capture import sglang_autopatch, sglang_plugin

    _purge_sglang()
    monkeypatch.syspath_prepend(str(FAKE_PKGS))
    monkeypatch.setattr(sglang_plugin, "_STATE", sglang_plugin._State())
    yield FAKE_PKGS
    sglang_autopatch.uninstall()
    try:
        from sglang.srt.plugins import _reset_for_tests

        _reset_for_tests()
    except ImportError:
        pass
    _purge_sglang()
