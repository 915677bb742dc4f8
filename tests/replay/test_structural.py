"""Structural what-ifs (tracekit/replay/structural.py) and bad what-if input, on the real truth-set traces."""

from __future__ import annotations

import sys
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from tracekit._errors import UsageError
from tracekit.cli import app
from tracekit.replay import replay
from tracekit.replay import structural as S
from tracekit.replay.graph import build_graph
from tracekit.schema import read_trace

TRUTH = Path(__file__).resolve().parent / "truth"
sys.path.insert(0, str(TRUTH))


def _graph(case: str):
    return build_graph(read_trace(TRUTH / f"{case}.trace.parquet")[0])


def test_grouped_constants_are_the_corpus_measurement(tmp_path: Path) -> None:
    import grouped_cost

    m = grouped_cost.measure(tmp_path)
    assert S.GROUPED_BLOCK_OPS == round(m["GROUPED_BLOCK_OPS"])
    assert S.GROUPED_NS_PER_EXPERT == pytest.approx(m["GROUPED_NS_PER_EXPERT"], rel=0.02)
    assert S.GROUPED_BYTES_PER_S == pytest.approx(m["GROUPED_BYTES_PER_S"], rel=0.02)
    assert S.GROUPED_TIME_RATIO == pytest.approx(m["GROUPED_TIME_RATIO"], abs=0.005)


@pytest.mark.parametrize("case,loops,synced", [("tk_loop", 4, True), ("qwen3w_eager", 4, True), ("olmoew_eager", 4, True),
                                               ("tk_grouped", 0, False), ("qwen3w_grouped", 0, False),
                                               ("llama70w", 0, False)])
def test_moe_blocks_find_the_per_expert_loops(case: str, loops: int, synced: bool) -> None:
    g = _graph(case)
    mb = S.moe_blocks(g)
    per_step = mb.blocks.filter(pl.col("loop")).group_by("step_ord").len()
    assert (per_step.get_column("len").to_list() or [0]) == [loops] * max(per_step.height, 1)
    st = S.structure(g)
    assert (st.loop_syncs > 0) == synced and st.graph_launches == 0


def test_grouped_experts_uses_the_loops_own_shapes() -> None:
    df, meta = read_trace(TRUTH / "tk_loop.trace.parquet")
    r = replay(df, meta, ["grouped-experts"])
    note = " ".join(r.what_if[0].notes)
    assert "from recorded shapes in 12 of them" in note  # 4 loop blocks x 3 profiled steps, shapes recorded
    assert r.what_if[0].change < -0.8


def test_graph_trace_is_not_offered_graphs() -> None:
    assert S.structure(_graph("tk_grouped_graph")).graph_launches > 0


@pytest.mark.parametrize("spec,msg", [
    ("grouped-experts", "no per-expert MoE loop"),
    ("moe_gemm=0.5", "names no GPU op"),
    ("allreduce=nvlink-h200", "no collectives"),
    ("dense_gemm=0", "factor must be a finite number in"),
    ("dense_gemm=-2", "factor must be a finite number in"),
    ("dense_gemm=nan", "factor must be a finite number in"),
    ("dense_gemm=inf", "factor must be a finite number in"),
    ("dense_gemm=fast", "is not a number"),
    ("re:no_such_kernel=0.5", "names no GPU op"),
])
def test_bad_what_ifs_are_one_line_errors(spec: str, msg: str) -> None:
    # (a no-host-sync on a trace whose only syncs are each step's result: tests/replay/test_replay_golden.py)
    p = TRUTH / "llama70w.trace.parquet"  # dense, one GPU: no MoE, no collectives
    df, meta = read_trace(p)
    with pytest.raises(UsageError, match=msg):
        replay(df, meta, [spec])
    res = CliRunner().invoke(app, ["replay", str(p), "--what-if", spec])
    assert res.exit_code != 0 and "Traceback" not in res.output
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert len(lines) == 1 and msg in lines[0], res.output
