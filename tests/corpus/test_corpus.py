"""The real-trace corpus: every trace's category shares against its truth (fail beyond 3 pp), other_compute,
steps against the truth, decode step time against the program's own clock, tokens/s from the GPU span.

Fixtures: ``tests/corpus/fixtures`` (GPU captures, cut) and the shared TraceLens traces; expectations in
``tests/corpus/expect`` (see README.md for how each truth was made). Run with ``-s`` to see the tables.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from corpus_check import ATTN_RATIO, ATTN_RATIO_FROM_PCT, DENSE_FAMILIES, DENSE_MOE_MAX_PCT, OTHER_MAX_PCT, TOL_PP, cases, load, measure, table, trace_path

CASES = cases()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("corpus")


_MEMO: dict[str, dict] = {}


def _measured(case: str, workdir: Path) -> dict:
    if case not in _MEMO:
        if not trace_path(load(case)).exists():
            pytest.skip(f"{case}: trace not available")
        _MEMO[case] = measure(case, workdir)
        print("\n" + table(_MEMO[case]))
    return _MEMO[case]


def test_corpus_is_there() -> None:
    assert len([c for c in CASES if "shared_trace" not in load(c)]) >= 7, "GPU fixtures missing"
    for c in CASES:
        e = load(c)
        if "trace" in e:
            assert trace_path(e).stat().st_size < 3_000_000, f"{c}: fixture over 3 MB"


@pytest.mark.parametrize("case", CASES)
def test_category_shares_match_truth(case: str, workdir: Path) -> None:
    m = _measured(case, workdir)
    assert not m["missing_labels"], f"{case}: kernels without a hand label: {m['missing_labels'][:5]}"
    assert abs(sum(m["truth"].values()) - 100.0) < 0.01
    bad = []
    for c, ours in m["ours"].items():
        d = abs(ours - m["truth"].get(c, 0.0))
        limit = m["known_gaps"].get(c, {}).get("max_pp", TOL_PP)
        if d > limit:
            bad.append(f"{c}: ours {ours:.2f}% truth {m['truth'].get(c, 0.0):.2f}% ({d:.2f} pp > {limit} pp)")
    assert not bad, f"{case}: " + "; ".join(bad)


@pytest.mark.parametrize("case", CASES)
def test_other_compute_is_explained(case: str, workdir: Path) -> None:
    m = _measured(case, workdir)
    # other_compute may be large only when it is elementwise work a rule names (norm, activation, rope, pointwise ...)
    assert m["unexplained_other"] < OTHER_MAX_PCT, f"{case}: {m['unexplained_other']:.1f}% of busy time matched no rule"
    if m["other_compute"] >= OTHER_MAX_PCT:  # above 10 % only when the trace truly is elementwise work, by its own truth
        assert m["truth"]["other_compute"] >= OTHER_MAX_PCT - TOL_PP, (
            f"{case}: other_compute {m['other_compute']:.1f}% but the truth has {m['truth']['other_compute']:.1f}%")


@pytest.mark.parametrize("case", CASES)
def test_steps_match_truth(case: str, workdir: Path) -> None:
    m = _measured(case, workdir)
    exp = m["expect_steps"]
    assert m["steps_found"] == exp["count"]
    if "modes" in exp:
        assert m["modes"] == sorted(exp["modes"])
    if "batch_size" in exp:
        assert {r["batch_size"] for r in m["summary"]} == {exp["batch_size"]}
    if "gpu_span_ms" in exp:  # tokens/s from the GPU span when the host range is shorter
        (row,) = m["summary"]
        assert row["step_p50_ns"] / 1e6 == pytest.approx(exp["gpu_span_ms"], rel=0.01)
        assert row["tokens_per_s"] == pytest.approx(exp["tokens"] / (exp["gpu_span_ms"] / 1e3), rel=0.01)


@pytest.mark.parametrize("case", [c for c in CASES if load(c).get("program_clock")])
def test_decode_step_time_matches_program_clock(case: str, workdir: Path) -> None:
    m = _measured(case, workdir)
    assert m["decode_ms"] == pytest.approx(m["program_decode_ms"], rel=0.05)


@pytest.mark.parametrize("case", CASES)
def test_attention_within_ratio_of_truth(case: str, workdir: Path) -> None:
    """Attention above 0.3 % of GPU-op time is within 0.8-1.25x of its truth (issue 25): small shares are checked as a
    ratio, not only in pp."""
    m = _measured(case, workdir)
    t = m["truth"].get("attention", 0.0)
    if t > ATTN_RATIO_FROM_PCT:
        assert ATTN_RATIO[0] <= m["ours"]["attention"] / t <= ATTN_RATIO[1], (case, m["ours"]["attention"], t)


@pytest.mark.parametrize("case", [c for c in CASES if load(c).get("model", {}).get("family") in DENSE_FAMILIES])
def test_dense_model_reports_no_moe(case: str, workdir: Path) -> None:
    m = _measured(case, workdir)
    assert m["ours"]["moe_gemm"] + m["ours"]["moe_routing"] < DENSE_MOE_MAX_PCT, (case, m["ours"])


NEEDS = Path(__file__).resolve().parent / "lofo_needs.json"


def test_leave_one_family_out_holds_the_bounds(workdir: Path) -> None:
    """Issue 25: each family categorized with the launch-pattern thresholds fit to the *other* families only (their
    measured needs, ``lofo_needs.json``: regenerate with ``corpus_check.py --lofo tests/corpus/lofo_needs.json`` when a
    rule changes) stays within the same bounds: 3 pp on MoE GEMM, routing, attention; attention within 0.8-1.25x."""
    import json

    import lofo as L
    from corpus_check import _gpu, _without_roles, frame, shares, truth_of

    needs = json.loads(NEEDS.read_text())
    have = [c for c in CASES if trace_path(load(c)).exists()]
    assert set(have) <= set(needs), f"cases without a measured need: {sorted(set(have) - set(needs))}"
    fams = {c: L.family(load(c), c) for c in needs}
    bad = []
    for fam in sorted({fams[c] for c in have}):
        fit, _ = L.fitted(needs, fams, fam)
        with L.thresholds(fit):
            for c in (c for c in have if fams[c] == fam):
                df = frame(c, workdir)
                truth, _ = truth_of(c, df)
                if load(c)["truth_method"] == "nvtx_ranges":
                    df = _without_roles(df)
                ours = shares(_gpu(L.refinalize(df)))
                for k in L.CATS:
                    if abs(ours[k] - truth.get(k, 0.0)) > TOL_PP:
                        bad.append(f"{fam}/{c} {k}: {ours[k]:.2f} vs {truth.get(k, 0.0):.2f}")
                t = truth.get("attention", 0.0)
                if t > ATTN_RATIO_FROM_PCT and not ATTN_RATIO[0] <= ours["attention"] / t <= ATTN_RATIO[1]:
                    bad.append(f"{fam}/{c} attention {ours['attention']:.2f} vs {t:.2f}")
    assert not bad, bad
