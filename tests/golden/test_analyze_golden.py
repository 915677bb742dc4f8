"""Every real trace's ``analyze --json`` against its golden copy (``analyze_golden.py`` regenerates on purpose)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from analyze_golden import CASES, GOLDEN, TRACES, compare, compute, load  # noqa: E402


def _available(case: str) -> bool:
    return any(not p.startswith("corpus:") for p in CASES[case][0]) is False or (TRACES / "hta").exists()


@pytest.mark.parametrize("case", sorted(CASES))
def test_analyze_json_unchanged(case: str, tmp_path: Path) -> None:
    if not _available(case):
        pytest.skip("shared traces not available")
    assert (GOLDEN / f"{case}.json.gz").exists(), f"no golden output for {case}: run tests/golden/analyze_golden.py {case}"
    diffs = compare(load(case), compute(case, tmp_path))
    assert not diffs, f"{case}: {len(diffs)} fields differ from tests/golden/analyze/{case}.json.gz:\n" + "\n".join(diffs[:30])
