"""One step time (issue 26): analyze, replay, next win and diff report the same step time and tokens/s on every
corpus trace (tests/corpus: GPU captures and the shared TraceLens/HTA/nsys traces) — the definition of
:mod:`tracekit.analysis.steptime`, computed by the steps analysis and by replay's own step table."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "corpus"))
from corpus_check import cases, load, trace_path  # noqa: E402

from tracekit.api import analyze_frame_result  # noqa: E402
from tracekit.compare.diff import summarize_result  # noqa: E402
from tracekit.replay import replay  # noqa: E402
from tracekit.schema import read_trace  # noqa: E402

CASES = [c for c in cases() if trace_path(load(c)).exists()]


@pytest.fixture(scope="module")
def frames(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tracekit.ingest.convert import convert

    d = tmp_path_factory.mktemp("steptime")
    out = {}
    for c in CASES:
        p = trace_path(load(c))
        if p.suffix != ".parquet":
            q = d / f"{c}.parquet"
            convert([p], q)
            p = q
        out[c] = p
    return out


def test_corpus_is_there() -> None:
    assert len(CASES) >= 10


@pytest.mark.parametrize("case", CASES)
def test_replay_baseline_is_analyze_step_p50(frames: dict[str, Path], case: str) -> None:
    df, meta = read_trace(frames[case])
    res = analyze_frame_result(df, meta, next_win=False)
    st = res.to_json()["steps"]["step_time"]
    assert st is not None and st["step_ns_p50"] > 0
    r = replay(df, meta)
    b = r.baseline
    # the replay's baseline over the captured steps is analyze's step p50: observed exactly, and the (uncalibrated:
    # the corpus has no unprofiled timings) replayed baseline too
    assert b.profiled_step_ns_p50 == st["step_ns_p50"]
    assert not r.calibrated and b.step_ns_p50 == pytest.approx(st["step_ns_p50"], rel=1e-9)
    assert b.step_mode == st["mode"] and b.step_tokens == st["tokens"] and b.n_steps == st["n_steps"]
    assert b.tokens_per_s == pytest.approx(st["tokens_per_s"]) if st["tokens_per_s"] else b.tokens_per_s is None
    # diff's summary reads the same value; so does the steps finding
    s = summarize_result(res)
    assert s.step_p50_ns == st["step_ns_p50"] and s.tokens_per_s == st["tokens_per_s"]
    finding = next(f for f in res.to_json()["findings"] if "step time p50" in f)
    assert f"{st['step_ns_p50'] / 1e6:.1f} ms" in finding or f"{st['step_ns_p50'] / 1e3:.0f} µs" in finding


def test_next_win_baseline_is_analyze_step_time(frames: dict[str, Path]) -> None:
    from tracekit.api import analyze

    out = analyze(frames["qwen3moe_grouped_eagerattn"])
    nw, st = out["next_win"], out["steps"]["step_time"]
    assert nw["status"] == "ok" and nw["baseline"]["profiled_step_ns_p50"] == st["step_ns_p50"]
    f = next(x for x in out["findings"] if x.startswith("Next win"))
    assert f"{st['step_ns_p50'] / 1e6:.2f} ms per step" in f
