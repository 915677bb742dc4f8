"""The native scanner and module ranges: a chunk holding an event named ``nn.Module: ...`` is handed to the reader
that keeps module ranges (the scanner says so itself, instead of a text search of every chunk), with the rows the
exact decoder gives."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "golden"))
from kineto_doc import _ev, cpu_op, doc, kernel, runtime, write_doc  # noqa: E402

from tracekit.ingest import kineto, kscan  # noqa: E402
from tracekit.ingest.kineto import read_kineto  # noqa: E402

pytestmark = pytest.mark.skipif(not kscan.available(), reason=f"native scanner unavailable: {kscan.unavailable_reason()}")


def _events(module: str | None, *, cat: str = "python_function") -> list[dict]:
    evs = [cpu_op("aten::mm", 100, 20), runtime("cudaLaunchKernel", 105, 5, corr=1), kernel("gemm", 130, 40, corr=1)]
    if module is not None:
        evs.append(_ev(cat, module, 95, 60, 1, 1))
    return evs


def _chunk(evs: list[dict]) -> bytes:
    return json.dumps(evs).encode()


@pytest.mark.parametrize("cat", ["python_function", "user_annotation"])
def test_a_module_range_is_reported_not_scanned(cat: str) -> None:
    with pytest.raises(kscan.ModuleRange):
        kscan.scan(_chunk(_events("nn.Module: Linear_0", cat=cat)), kineto._TABLES)
    rows, _ = kscan.scan(_chunk(_events("nn.Modul: Linear_0")), kineto._TABLES)  # not the prefix: scanned
    assert rows == 3  # the python_function event is skipped by category
    rows, _ = kscan.scan(_chunk(_events(None)), kineto._TABLES)
    assert rows == 3
    # the prefix is the reader's (one owner): tables without one scan the chunk, the module event skipped by category
    bare = kscan.Tables(kineto.KINETO_KINDS, kineto._SKIP, kineto.KNOWN_PHASES)
    rows, _ = kscan.scan(_chunk(_events("nn.Module: Linear_0")), bare)
    assert rows == 3


def test_module_ranges_are_kept_as_the_exact_decoder_keeps_them(tmp_path: Path) -> None:
    evs = _events("nn.Module: Linear_0") + [_ev("python_function", "torch/nn/modules/linear.py(114): forward", 96, 50, 1, 1)]
    p = write_doc(tmp_path / "rank0.json", doc(evs, rank=0))
    fast, _ = read_kineto(p, exact=False)
    exact, _ = read_kineto(p, exact=True)
    assert_frame_equal(fast, exact, categorical_as_str=True)
    names = fast.filter(pl.col("kind") == "range").get_column("name").to_list()
    assert names == ["nn.Module: Linear_0"]  # the module range is a row; other Python frames are not
