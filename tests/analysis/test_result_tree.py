"""The typed result tree (tracekit/analysis/sections.py): ``analyze --json`` is one encoder of it, its schema is
``schemas/analyze_v1.json``, every real trace's golden JSON is exactly a tree, and a key the tree does not declare
fails at once instead of vanishing."""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path

import msgspec
import pytest

from tracekit.analysis.result import encode
from tracekit.analysis.sections import SCHEMA_VERSION, Sections, StepSummary, WindowInfo, build, schema_doc

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = sorted((ROOT / "tests" / "golden" / "analyze").glob("*.json.gz"))
FIX = ROOT / "tests" / "fixtures" / "gpu"


def test_schema_file_is_the_tree() -> None:
    want = json.loads((ROOT / "schemas" / "analyze_v1.json").read_text())
    assert want == json.loads(json.dumps(schema_doc())), (
        "schemas/analyze_v1.json is stale: regenerate it (see tracekit.analysis.sections.schema_doc)")
    assert want["version"] == SCHEMA_VERSION == 1


@pytest.mark.parametrize("path", GOLDEN, ids=[p.name.split(".")[0] for p in GOLDEN])
def test_every_golden_json_is_exactly_a_tree(path: Path) -> None:
    """Each real trace's analyze --json decodes as the tree (strict types, no unknown key) and encodes back to the same
    bytes: the schema describes every output we have, to the leaves."""
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    if doc["stage"] != "ok":
        pytest.skip("a refused input (its one-line error is the golden output)")
    d = doc["analyze"]
    tree = build(d, Sections)
    assert json.dumps(encode(tree), sort_keys=True) == json.dumps(d, sort_keys=True)  # golden files are key-sorted
    assert msgspec.json.decode(msgspec.json.encode(tree), type=Sections) == tree


def test_an_undeclared_key_fails_naming_its_path() -> None:
    row = {"mode": None, "batch_size": None, "steps": 3, "p50_ns": 1.0, "p90_ns": 2.0, "max_ns": 3, "gpu_span_p50_ns": 1.0,
           "step_p50_ns": 1.0, "step_p90_ns": 2.0, "tokens_per_s": None}
    assert build(row, StepSummary).steps == 3
    with pytest.raises(msgspec.ValidationError, match="unknown field `step_mean_ns`"):
        build({**row, "step_mean_ns": 1.0}, StepSummary)
    with pytest.raises(msgspec.ValidationError, match=r"Expected `int \| null`, got `float` - at `\$.max_ns`"):
        build({**row, "max_ns": 3.5}, StepSummary)  # an int stays an int: the JSON never changes type silently


def test_nodes_and_result_are_frozen() -> None:
    w = WindowInfo(start_ns=None, end_ns=None, reason="extent", trimmed_transient_ns=0, skipped_steps=0)
    with pytest.raises(AttributeError):
        w.reason = "x"  # type: ignore[misc]
    path = FIX / "straggler.trace.parquet"
    if not path.exists():
        pytest.skip("GPU fixtures absent")
    from tracekit.api import analyze_result

    res = analyze_result(path)
    with pytest.raises(dataclasses.FrozenInstanceError):
        res.sections = res.sections  # type: ignore[misc]
    assert res.to_json() == res.to_json() and res.to_json() is not res.to_json()  # a fresh object: nothing pops keys from the result
    assert res.to_json()["trace"] == str(path)
