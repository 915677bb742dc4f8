"""The what-if truth set (tests/replay/truth): predictions against changes actually made on one GPU (H200, H100).

Recomputes every pair with the current code (``truth/pairs.py``; ~30 s) and checks the accuracy table that next
win prints (:mod:`tracekit.replay.accuracy`) is the one measured here, plus the issue's targets where they are met.
Errors and noise are in docs/replay.md ("Accuracy").
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent / "truth"
sys.path.insert(0, str(HERE))
import pairs as P  # noqa: E402

from tracekit.replay.accuracy import ACCURACY, kind_of  # noqa: E402


@pytest.fixture(scope="module")
def rows() -> list[dict[str, Any]]:
    return P.rows()


def _by_kind(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault(kind_of(r["predicted"]["spec"]), []).append(r)
    return out


def test_fixtures_are_small() -> None:
    files = list(HERE.glob("*.trace.parquet"))
    assert len(files) >= 20
    assert all(p.stat().st_size < 3_000_000 for p in files)
    assert sum(p.stat().st_size for p in files) < 8_000_000  # 57 cases from five GPU hosts


def test_accuracy_table_is_the_measured_one(rows: list[dict[str, Any]]) -> None:
    for kind, rs in _by_kind(rows).items():
        a = ACCURACY[kind]
        errs = [abs(r["error"]) for r in rs]
        assert a.pairs == len(rs), kind
        assert a.error_max == pytest.approx(max(errs), abs=0.006), kind
        assert a.error_median == pytest.approx(statistics.median(errs), abs=0.006), kind
        assert a.noise_max == pytest.approx(max(r["measured"]["noise"] for r in rs), abs=0.006), kind


def _row(rows: list[dict[str, Any]], baseline: str, variant: str) -> dict[str, Any]:
    return next(r for r in rows if r["baseline"] == baseline and r["variant"] == variant)


def test_knob_within_3pct_where_the_ratio_is_repeatable(rows: list[dict[str, Any]]) -> None:
    # the target: within 3 % of the measured step ratio on three models, MoE and dense, counting pairs whose
    # per-round ratio repeats within 3 % (DeepSeek-V3 eager; Qwen3-235B and Llama-3-70B widths replayed from a graph)
    good = [r for r in _by_kind(rows)["knob"] if r["measured"]["ratio_spread"] < 0.03 and abs(r["error"]) <= 0.03]
    models = {r["model"].split(" (")[0] for r in good}
    assert len(models) >= 3, models
    assert any("dense" in r["model"] for r in good) and any("MoE" in r["model"] for r in good)
    r = _row(rows, "llama70w_g", "llama70w_halfw_g")  # dense, MLP width halved: the GPU-side calibration's case
    assert abs(r["error"]) <= 0.03
    # every knob pair: within 4 % or inside its own ratio spread (the noisy hosts of docs/replay.md)
    for r in _by_kind(rows)["knob"]:
        assert abs(r["error"]) <= max(0.04, 1.5 * r["measured"]["ratio_spread"]), (r["baseline"], r["variant"], r["error"])


def _repeats(r: dict[str, Any], bound: float) -> bool:
    """The pair's measurement repeats within ``bound``: its baseline repeat and per-round ratio spread."""
    return r["measured"]["noise"] < bound and r["measured"]["ratio_spread"] < bound


def test_structural_targets(rows: list[dict[str, Any]]) -> None:
    k = _by_kind(rows)
    graphs = k["cuda-graph"] + k["no-host-sync+cuda-graph"]
    assert all(abs(r["error"]) <= 0.10 for r in graphs if _repeats(r, 0.10))
    assert sum(_repeats(r, 0.10) for r in graphs) >= 8  # H200, host A and the two H100 runs profiled last
    # the H100 run's eager rounds drifted 25-45 % across its profiler window: within 1.5 x its ratio spread
    assert all(abs(r["error"]) <= max(0.10, 1.5 * r["measured"]["ratio_spread"]) for r in graphs)
    assert all(abs(r["error"]) <= 0.15 for r in k["no-host-sync"])
    grouped = k["grouped-experts"]
    assert len(grouped) >= 13 and sum(abs(r["error"]) <= 0.20 for r in grouped) >= 11
    assert all(abs(r["error"]) <= 0.24 for r in grouped)  # the known gap: docs/replay.md ("loop → grouped")
    assert all(r["predicted"]["ratio"] < 0.25 and r["measured"]["ratio"] < 0.25 for r in grouped)  # a 4-14x change


def test_runs_profiled_last_meet_every_structural_target(rows: list[dict[str, Any]]) -> None:
    """The runs whose unprofiled rounds all ran before any profiler window (``whatif_pairs.py --profile-at end``,
    two H100 hosts; not used to fit anything): CUDA graphs within 10 %, syncs removed within 15 %, loop → grouped
    within 20 %, the knobs within 3 %."""
    last = [r for r in rows if "profiled last" in r["model"]]
    k = _by_kind(last)
    assert len(k["grouped-experts"]) >= 6 and len(k["cuda-graph"]) >= 2 and len(k["no-host-sync"]) >= 2
    assert all(abs(r["error"]) <= 0.10 for r in k["cuda-graph"] + k["no-host-sync+cuda-graph"])
    assert all(abs(r["error"]) <= 0.15 for r in k["no-host-sync"])
    assert all(abs(r["error"]) <= 0.20 for r in k["grouped-experts"])
    assert k["knob"] and all(abs(r["error"]) <= 0.03 for r in k["knob"])
