"""The registry of analyses (tracekit/analysis/registry.py): one module + one registration adds an analysis,
the scan's column list is the union of what every analysis declares, and every analysis reads only what it declares.

Real traces: the checked-in 2-rank GPU captures (tests/fixtures/gpu, README there), the 2xH200 nsys capture of the
shared traces and the OLMoE per-expert-loop corpus capture (recorded shapes: expert load, kernel efficiency) when present.
"""

from __future__ import annotations

import json
import os
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from tracekit._errors import UsageError
from tracekit.analysis import registry as reg
from tracekit.analysis.stage.crossrank import cross_rank_part, cross_rank_plan, cross_rank_sections, section_keys
from tracekit.analysis.findings import Finding
from tracekit.analysis.stage.pipeline import ScanSource, analysis_columns
from tracekit.core.window import cpu_mode_ranks
from tracekit.analysis.sections import Node
from tracekit.api import analyze, analyze_frame, analyze_result
from tracekit.schema import COLUMN_NAMES, read_trace, scan_trace

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "gpu"
TRACES = Path(os.environ.get("TRACEKIT_TRACES", "/work/shared/traces"))
H200 = TRACES / "nsys" / "generated-h200"
OLMOE = Path("/work/corpus_raw/olmoe_eager_sdpa.stack.json.gz")


@pytest.fixture(scope="module")
def real_traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {n: FIX / f"{n}.trace.parquet" for n in ("straggler", "loop", "graphs") if (FIX / f"{n}.trace.parquet").exists()}
    d = tmp_path_factory.mktemp("reg")
    from tracekit.ingest.convert import convert

    if (H200 / "tp2_rank0.sqlite").exists():  # PCIe phases, power counters, NCCL stalls
        out["h200_tp2"] = d / "h200_tp2.parquet"
        convert([H200 / "tp2_rank0.sqlite", H200 / "tp2_rank1.sqlite"], out["h200_tp2"])
    if OLMOE.exists():  # recorded shapes: expert load "ok", kernel efficiency rows
        out["olmoe"] = d / "olmoe.parquet"
        convert([OLMOE], out["olmoe"])
    if not out:
        pytest.skip("no real traces available")
    return out


def test_analysis_columns_are_the_union_of_declared_columns() -> None:
    listed = reg.analyses()
    want = set().union(*(a.columns for a in listed), *(u.columns for u in reg.column_uses()))
    cols = analysis_columns()
    assert cols == [c for c in COLUMN_NAMES if c in want]  # the schema's order, nothing else
    assert {u.name for u in reg.column_uses()} >= {"rows", "breakdown", "kernel_totals", "cross_rank"}
    from tracekit.analysis.stage import pipeline

    assert pipeline.ANALYSIS_COLUMNS == cols
    # sections: every analysis' own keys, in registry order, then the ranked findings
    assert section_keys() == (*(k for a in listed for k in a.sections), "findings")
    assert [a.name for a in listed][:1] == ["extents"] and "interconnect" in [a.name for a in listed]


def _rows(df: pl.DataFrame) -> pl.DataFrame:
    """The frame's rows in a canonical order (parts may list rows in any order: their finish sorts)."""
    if df.height < 2:
        return df
    key = [pl.col(c).list.eval(pl.element().cast(pl.String)).list.join("\x1f") if isinstance(t, pl.List) else pl.col(c)
           for c, t in df.schema.items()]
    return df.sort(key, nulls_last=True, maintain_order=True)


def _same(a: Any, b: Any) -> bool:
    """Exact equality of parts: frames (schema and rows, in any order), dataclasses, tuples/lists, dicts."""
    if isinstance(a, pl.DataFrame):
        return isinstance(b, pl.DataFrame) and a.schema == b.schema and _rows(a).equals(_rows(b), null_equal=True)
    if is_dataclass(a) and not isinstance(a, type):
        return type(a) is type(b) and all(_same(getattr(a, f.name), getattr(b, f.name)) for f in fields(a))
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


def test_every_column_a_part_reads_is_declared(real_traces: dict[str, Path]) -> None:
    """Each part, on the rows restricted to its declared columns (+ the driver's), gives exactly its part on all columns."""
    driver = next(u.columns for u in reg.column_uses() if u.name == "cross_rank")
    checked: dict[str, int] = {}
    for name, path in real_traces.items():
        df, meta = read_trace(path)
        ranks = sorted(int(r) for r in df["rank"].unique().to_list())
        plan = cross_rank_plan(df, meta, {}, ranks=ranks, cpu_ranks=cpu_mode_ranks(df))
        full = cross_rank_part(df, plan).parts
        for a in reg.analyses():
            if a.part is None:
                assert not a.columns, f"{a.name}: no part, so no columns to read"
                continue
            cols = [c for c in df.columns if c in set(a.columns) | set(driver)]
            try:
                got = cross_rank_part(df.select(cols), plan, only=[a.name]).parts[a.name]
            except pl.exceptions.ColumnNotFoundError as e:
                raise AssertionError(f"{a.name} on {name}: reads an undeclared column ({e})") from None
            assert _same(got, full[a.name]), f"{a.name} on {name}: differs without its undeclared columns"
            checked[a.name] = checked.get(a.name, 0) + 1
    assert set(checked) == {a.name for a in reg.analyses() if a.part is not None}


def test_the_stages_outside_the_registry_read_only_what_they_declare(real_traces: dict[str, Path]) -> None:
    """Breakdown (with the communication split) and kernel totals, on rows cut to their declared columns, give the same tables."""
    from tracekit.analysis.passes.breakdown import compute_breakdown, kernel_totals
    from tracekit.core.window import select_window

    uses = {u.name: set(u.columns) for u in reg.column_uses()}
    for name, path in real_traces.items():
        df, meta = read_trace(path)
        win = select_window(df.lazy())
        plan = cross_rank_plan(df, meta, {"window": win}, ranks=sorted(df["rank"].unique().to_list()), cpu_ranks=cpu_mode_ranks(df))
        only = df.select([c for c in df.columns if c in uses["breakdown"]])
        want = compute_breakdown(df, win, comm_parts=plan.comm_parts(df), split=plan.split).table
        got = compute_breakdown(only, win, comm_parts=plan.comm_parts(only), split=plan.split).table
        assert _same(got, want), f"breakdown on {name}"
        only = df.select([c for c in df.columns if c in uses["kernel_totals"]])
        assert _same(kernel_totals(only, win), kernel_totals(df, win)), f"kernel totals on {name}"


def _streams_part(df: pl.DataFrame, ctx: reg.PartContext) -> pl.DataFrame:
    k = df.filter(pl.col("kind") == "kernel")
    return k.group_by(pl.col("rank").cast(pl.Int64)).agg(pl.col("registers_per_thread").max().alias("regs"), pl.len().alias("kernels"))


class ToyRegisters(Node, frozen=True, kw_only=True):
    """The toy's typed section (its node of the result tree)."""

    max_registers: dict[str, int]
    kernels: dict[str, int]
    steps: int
    min_kernels: int


def _streams_finish(parts: list[pl.DataFrame], ctx: reg.FinishContext) -> reg.Finished:
    t = reg.concat(parts).sort("rank")
    steps = ctx.results["steps"].value.steps
    v = ToyRegisters(max_registers={str(r): int(x) for r, x in zip(t["rank"], t["regs"])},
                     kernels={str(r): int(x) for r, x in zip(t["rank"], t["kernels"])},
                     steps=steps.height, min_kernels=ctx.options["min_kernels"])
    return reg.Finished({"toy_registers": v}, v)


def _streams_findings(ctx: reg.FindingsContext) -> list[Finding]:
    v = ctx.result.value
    return [Finding("toy", f"Toy: kernels use up to {max(v.max_registers.values())} registers per thread.", 0.01)]


TOY = reg.Analysis("toy_registers", ("toy_registers",), ("rank", "kind", "registers_per_thread"), _streams_part, _streams_finish,
                   _streams_findings, options={"min_kernels": 1}, needs=("steps",))


def test_a_new_analysis_is_one_registration(tmp_path: Path) -> None:
    """A toy analysis (one registration, here in the test): its section appears in analyze's JSON on a real trace,
    its column is projected into the scan, its finding is ranked; unregistering restores the output byte for byte."""
    path = FIX / "straggler.trace.parquet"
    if not path.exists():
        pytest.skip("GPU fixtures absent")
    before = json.dumps(analyze(path))
    assert "registers_per_thread" not in analysis_columns()
    reg.register(TOY)
    try:
        assert "registers_per_thread" in analysis_columns()
        src = ScanSource(path, scan_trace(path))
        _, part = next(src.parts([0]))
        assert "registers_per_thread" in part.columns  # projected for it
        res = analyze(path)
        toy = res["toy_registers"]
        df, meta = read_trace(path)
        raw = df.filter(pl.col("kind") == "kernel").group_by("rank").agg(pl.col("registers_per_thread").max(), pl.len())
        assert set(toy["max_registers"]) == {str(r) for r in raw["rank"]}
        for r, regs, n in raw.iter_rows():  # inside the window: at most the trace's, and real kernels
            assert 0 < toy["max_registers"][str(r)] <= regs and 0 < toy["kernels"][str(r)] <= n
        assert toy["steps"] == len(res["steps"]["steps"]) > 0  # its declared need, the finished steps
        assert any(f.startswith("Toy: kernels use up to") for f in res["findings"])
        assert list(res).index("toy_registers") == list(res).index("interconnect") + 1  # after the built-in sections
        assert analyze_frame(df, meta)["toy_registers"] == toy  # the whole-frame path agrees with the scan
        typed = analyze_result(path)
        assert isinstance(typed.extra["toy_registers"], ToyRegisters)  # views read the typed node
        assert typed.extra["toy_registers"].max_registers == toy["max_registers"]
        with pytest.raises(UsageError, match="already registered"):
            reg.register(TOY)
    finally:
        assert reg.unregister("toy_registers") is TOY
    assert "registers_per_thread" not in analysis_columns()
    assert json.dumps(analyze(path)) == before


def test_a_section_must_be_a_typed_node() -> None:
    """A section handed as a plain dict is refused with a message naming it (it would be an untyped hole in the tree)."""
    path = FIX / "straggler.trace.parquet"
    if not path.exists():
        pytest.skip("GPU fixtures absent")
    reg.register(reg.Analysis("untyped", ("untyped",), (), None, lambda p, c: reg.Finished({"untyped": {"a": 1}})))
    try:
        with pytest.raises(TypeError, match="section 'untyped': a dict, not a typed node"):
            analyze(path)
    finally:
        reg.unregister("untyped")


def test_registration_errors_name_the_analysis() -> None:
    with pytest.raises(UsageError, match="'bad'.*not in the trace schema: nope"):
        reg.register(reg.Analysis("bad", ("bad",), ("rank", "nope"), None, lambda p, c: reg.Finished({})))
    with pytest.raises(UsageError, match="section 'power' is already filled by 'power'"):
        reg.register(reg.Analysis("bad", ("power",), (), None, lambda p, c: reg.Finished({})))
    with pytest.raises(UsageError, match="section 'ranks' is already filled by 'the pipeline'"):
        reg.register(reg.Analysis("bad", ("ranks",), (), None, lambda p, c: reg.Finished({})))
    reg.register(reg.Analysis("bad", ("bad",), (), None, lambda p, c: reg.Finished({}), needs=("later",)))
    reg.register(reg.Analysis("later", ("later",), (), None, lambda p, c: reg.Finished({}), order=1000))
    try:
        with pytest.raises(UsageError, match="'bad' needs 'later'"):
            reg.analyses()
    finally:
        reg.unregister("bad")
        reg.unregister("later")
    assert "bad" not in [a.name for a in reg.analyses()]


def test_options_have_defaults_and_are_checked() -> None:
    from .synth import build

    df, meta = build(ranks=2, steps=6, delay={1: (1, 1_000_000)})
    out = cross_rank_sections(df, meta, {"options": {"idle": {"top_n": 2}}})
    assert out["idle_gaps"] and all(len(g) <= 2 for g in out["idle_gaps"].values())
    assert max(len(g) for g in cross_rank_sections(df, meta, {})["idle_gaps"].values()) > 2  # the default is 10
    with pytest.raises(UsageError, match="'pcie' has no option 'treshold'"):
        cross_rank_sections(df, meta, {"options": {"pcie": {"treshold": 0.5}}})
