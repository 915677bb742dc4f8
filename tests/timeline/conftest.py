"""Fixtures for tests/timeline (helpers live in _util.py)."""

from __future__ import annotations

import pytest

from tracekit.schema import frame_from_rows

from ._util import small_rows


@pytest.fixture
def small_df():
    return frame_from_rows(small_rows())
