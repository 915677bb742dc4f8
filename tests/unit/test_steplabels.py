"""The step-label grammar (tracekit.steplabels) and its use in finalize_rank / analyze --steps-from."""

from __future__ import annotations

import polars as pl
import pytest

from tracekit._errors import UsageError
from tracekit.ingest.common import parse_steps, resteps
from tracekit.schema import frame_from_rows
from tracekit.steplabels import (
    FAMILIES,
    choose_family,
    compile_steps_from,
    label_fields,
)

LABELS = [
    ("tk.fwd[DECODE bs=32 tok=32]", "tk.fwd", "DECODE", 32, 32, None),
    ("step[EXTEND bs=15 toks=15360]", "sglang.step", "EXTEND", 15, 15360, None),
    ("execute_32_context_0(sq0sk0sqsq0sqsk0)_generation_32(sq32sk55086sqsq32sqsk55086)", "vllm.execute", "DECODE", 32, 32, None),
    ("execute_context_1(888_788544)_generation_0(0)", "vllm.execute", "PREFILL", 1, 888, None),
    ("forward#3:decode:bs=32", "user.label", "DECODE", 32, None, 3),
    ("forward#0:prefill:bs=32:tokens=4096", "user.label", "PREFILL", 32, 4096, 0),
    ("decode[bs=8]", "user.label", "DECODE", 8, None, None),
    ("step 4", "user.label", None, None, None, 4),
    ("iteration_7", "user.label", None, None, None, 7),
    ("ProfilerStep#12", "profiler_step", None, None, None, 12),
    ("forward", "user.bare", None, None, None, None),
]


@pytest.mark.parametrize("name, family, mode, bs, tok, sid", LABELS)
def test_label_fields(name: str, family: str, mode: str | None, bs: int | None, tok: int | None, sid: int | None) -> None:
    names = pl.DataFrame({"_sn": [name]})
    assert choose_family(names["_sn"]) == (family, FAMILIES[family])
    (row,) = label_fields(names, family, FAMILIES[family]).to_dicts()
    assert (row["mode"], row["bs"], row["tok"], row["id"]) == (mode, bs, tok, sid)


@pytest.mark.parametrize("name", ["step_size", "nn.Module: Linear_0", "aten::mm", "forwarded", "stepper 3"])
def test_not_a_step(name: str) -> None:
    assert choose_family(pl.Series([name])) is None


def _ranges(names: list[str]) -> pl.DataFrame:
    return frame_from_rows([{"rank": 0, "kind": "range", "ts_ns": 100 * i, "dur_ns": 50, "tid": 1, "name": n}
                            for i, n in enumerate(names)])


def test_most_specific_family_wins_and_ids_from_labels() -> None:
    df = parse_steps(_ranges(["ProfilerStep#5", "forward#0:prefill:tokens=64", "ProfilerStep#6", "forward#1:decode:bs=4"]))
    st = df.filter(pl.col("kind") == "step").sort("ts_ns")
    assert st["name"].cast(pl.String).to_list() == ["forward#0:prefill:tokens=64", "forward#1:decode:bs=4"]
    assert st["step_id"].to_list() == [0, 1]
    assert st["tokens"].to_list() == [64, 4]  # DECODE: tokens = bs
    assert df.filter(pl.col("kind") == "range").height == 2  # the profiler steps stay ranges


def test_duplicate_label_ids_fall_back_to_time_order() -> None:
    st = parse_steps(_ranges(["forward#0:decode:bs=2", "forward#0:decode:bs=2"])).filter(pl.col("kind") == "step")
    assert sorted(st["step_id"].to_list()) == [0, 1]


def test_steps_from_regex_and_resteps() -> None:
    df = _ranges(["my_iter A bs=3", "my_iter B bs=3", "ProfilerStep#1"])
    st = parse_steps(df, r"^my_iter (?P<mode>[A-Z])").filter(pl.col("kind") == "step")
    assert st["step_mode"].cast(pl.String).to_list() == ["A", "B"] and st["batch_size"].to_list() == [3, 3]
    again = resteps(parse_steps(df), r"^my_iter").filter(pl.col("kind") == "step")
    assert again["name"].cast(pl.String).to_list() == ["my_iter A bs=3", "my_iter B bs=3"]


def test_steps_from_errors() -> None:
    with pytest.raises(UsageError, match="invalid regex"):
        compile_steps_from("(")
    with pytest.raises(UsageError, match="unknown named group"):
        compile_steps_from("(?P<batch>\\d+)")
