"""Reliability round three (issue 31): every numeric option is finite and in its range, with the range in --help;
``-w`` takes a regex with ``+``; what-if factors and fabrics are bounded (``-w X=1e308`` overflowed int64).

The ranges live in one table (``tracekit/commands/_ranges.py``); these tests read the real click commands, so an
option added without a range fails here.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from corrupt._build import TF0, small_rank, assert_clean_error, cli_inproc, dump, load, need
from tracekit.commands._ranges import RANGES, _name, help_range, numeric_options

pytestmark = pytest.mark.filterwarnings("ignore")


def _commands() -> dict[str, object]:
    import typer.main

    from tracekit.cli import app

    group = typer.main.get_command(app)
    return dict(group.commands)  # type: ignore[attr-defined]


def test_every_numeric_option_has_a_range() -> None:
    have = {(name, _name(p)) for name, cmd in _commands().items() for p in numeric_options(cmd)}
    assert have, "no numeric option found: the introspection is broken"
    assert have <= set(RANGES), f"numeric options without a range: {sorted(have - set(RANGES))}"
    assert set(RANGES) <= have, f"ranges of options that do not exist: {sorted(set(RANGES) - have)}"


def _argv(cmd: str, option: str, value: str) -> list[str]:
    """A command line that reaches the option check (it runs while options are parsed, before any file is read)."""
    pos = {"analyze": ["t.parquet"], "diff": ["a.parquet", "b.parquet"], "timeline": ["t.parquet", "-o", "x.html"],
           "convert": ["x.json"], "replay": ["t.parquet"], "capture": [], "launch": ["--", "true"]}[cmd]
    return [cmd, option, value, *pos] if cmd == "launch" else [cmd, *pos, option, value]


CASES = []
for (cmd, opt), (lo, hi) in sorted(RANGES.items()):
    is_float = isinstance(lo, float)
    below = f"{lo - 1:g}" if is_float else str(int(lo) - 1)
    above = f"{hi * 10 + 1:g}" if is_float else str(int(hi) * 10 + 1)
    CASES += [(cmd, opt, below, "at least"), (cmd, opt, above, "at most")]
    if is_float:
        CASES += [(cmd, opt, "nan", "finite"), (cmd, opt, "inf", "finite"), (cmd, opt, "1e308", "at most")]


@pytest.mark.parametrize("cmd, opt, value, words", CASES, ids=[f"{c}{o}={v}" for c, o, v, _ in CASES])
def test_a_numeric_option_outside_its_range_is_one_line(cmd: str, opt: str, value: str, words: str) -> None:
    p = cli_inproc(*_argv(cmd, opt, value))
    assert_clean_error(p, opt, words, "range", code=64)


@pytest.mark.parametrize("cmd, opt", sorted(RANGES))
def test_the_range_is_in_help(cmd: str, opt: str) -> None:
    lo, hi = RANGES[(cmd, opt)]
    p = cli_inproc(cmd, "--help")
    assert p.returncode == 0
    text = " ".join(p.stdout.replace("│", " ").split())
    assert help_range(lo, hi) in text, (opt, text[:3000])


def test_top_0_is_refused_alike_by_analyze_and_diff() -> None:
    a = assert_clean_error(cli_inproc("analyze", "t.parquet", "--top", "0"), code=64)  # before: accepted
    d = assert_clean_error(cli_inproc("diff", "a.parquet", "b.parquet", "--top", "0"), code=64)
    assert a == d == "tracekit: error: --top 0: must be at least 1 (range 1..100000)"


# ---- replay -w / --gap-scale ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    need(TF0)
    doc = small_rank(load(TF0))
    d = tmp_path_factory.mktemp("opt3")
    out = d / "trace.parquet"
    assert cli_inproc("convert", dump(doc, d / "rank0.json"), "-o", out, "-q").returncode == 0
    return out


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "1e308"])
def test_gap_scale_must_be_finite_and_in_range(small: Path, value: str) -> None:
    assert_clean_error(cli_inproc("replay", small, "--gap-scale", value), "--gap-scale", code=64)  # before: accepted


@pytest.mark.parametrize("spec, words", [
    ("dense_gemm=1e308", ["factor", "0..1000"]),  # before: int64 overflow, nonsense predictions, numpy warnings
    ("dense_gemm=1001", ["0..1000"]),
    ("allreduce=bw:1e-300GB/s", ["bandwidth"]),
    ("allreduce=bw:400GB/s,lat:1e12us", ["latency"]),
    ("cuda-graph:node=5000ms", ["above 1 s"]),
    ("re:'unclosed=0.5", ["not closed"]),
])
def test_what_if_values_are_bounded(small: Path, spec: str, words: list[str]) -> None:
    assert_clean_error(cli_inproc("replay", small, "-w", spec), "what-if", *words, code=64)


def test_a_regex_with_plus_is_quoted(small: Path) -> None:
    p = cli_inproc("replay", small, "--json", "-w", "re:'void.+Kernel'=0.5+no-host-sync")
    assert p.returncode == 0, p.stderr  # before: cut at '+' into "re:'void." and "Kernel'=0.5"
    notes = json.loads(p.stdout)["what_if"][0]["notes"]
    assert any("re:'void.+Kernel'=0.5" in n and "scaled" in n and "matched no" not in n for n in notes), notes
    assert any(n.startswith("no-host-sync") for n in notes), notes


def test_split_edits() -> None:
    from tracekit.replay.whatif import split_edits

    assert split_edits("re:'a+b'=0.5+no-host-sync") == ["re:a+b=0.5", "no-host-sync"]
    assert split_edits('re:"x+"=2') == ["re:x+=2"]
    assert split_edits(r"re:a\+b=0.5+moe_gemm=0.3") == [r"re:a\+b=0.5", "moe_gemm=0.3"]  # \+ is the regex's literal plus
    assert split_edits("a=1 + b=2") == ["a=1", "b=2"]


def test_ranges_are_finite() -> None:
    assert all(math.isfinite(lo) and math.isfinite(hi) and lo <= hi for lo, hi in RANGES.values())
