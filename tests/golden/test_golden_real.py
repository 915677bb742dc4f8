"""Real traces against checked-in expectations (``make_expected.py`` writes them, on purpose only)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_expected import CASES, EXPECTED, TRACES, compute  # noqa: E402

pytestmark = pytest.mark.skipif(not (TRACES / "hta").exists(), reason="shared traces not available")


@pytest.mark.parametrize("case", sorted(CASES))
def test_real_trace_matches_expectation(case: str, tmp_path: Path) -> None:
    want = json.loads((EXPECTED / f"{case}.json").read_text())
    got = json.loads(json.dumps(compute(case, tmp_path)))
    assert got["rows_by_kind"] == want["rows_by_kind"]
    assert got["ranks"] == want["ranks"]  # window, busy and every bucket, exact ns
    for r in got["ranks"]:
        assert sum(r["time_ns"].values()) == r["window_ns"]
        assert r["window_ns"] - r["time_ns"]["idle"] == r["gpu_busy_ns"]
