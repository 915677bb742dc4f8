"""The same bad inputs through the library: a TracekitError subclass (never another exception)."""

from __future__ import annotations

from pathlib import Path

import pytest

from corrupt._build import TF0, dump, load, need
from corrupt.test_bad_inputs_cli import CASES, PARQUET_CASES
from tracekit._errors import InputError, OutputError
from tracekit.api import analyze
from tracekit.ingest.convert import convert
from tracekit.ingest.kineto import read_kineto
from tracekit.schema import read_metadata, read_trace

#: cases whose file is readable but holds nothing: the reader returns an empty frame, convert refuses
_EMPTY = {"empty_trace", "only_metadata_events"}


@pytest.fixture(scope="module")
def tf0() -> dict:
    need(TF0)
    return load(TF0)


@pytest.fixture(scope="module")
def good(tmp_path_factory, tf0) -> Path:
    d = tmp_path_factory.mktemp("good")
    convert([dump(tf0, d / "rank0.json.gz")], d / "trace.parquet")
    return d / "trace.parquet"


@pytest.mark.parametrize("case", sorted(CASES))
def test_read_kineto(case: str, tmp_path: Path, tf0: dict) -> None:
    build, must = CASES[case]
    src = build(tmp_path, tf0)
    if case in _EMPTY:
        df, meta = read_kineto(src)
        assert df.height == 0 and meta["rank"] == 0
        return
    with pytest.raises(InputError) as ei:
        read_kineto(src)
    msg = str(ei.value)
    assert "\n" not in msg and src.name in msg
    for s in must:
        assert s.lower() in msg.lower(), (s, msg)


@pytest.mark.parametrize("case", sorted(CASES))
def test_convert(case: str, tmp_path: Path, tf0: dict) -> None:
    build, must = CASES[case]
    src = build(tmp_path, tf0)
    with pytest.raises(InputError) as ei:
        convert([src], tmp_path / "t.parquet")
    for s in must:
        assert s.lower() in str(ei.value).lower()
    assert not (tmp_path / "t.parquet").exists()


@pytest.mark.parametrize("case", sorted(PARQUET_CASES))
def test_read_trace_and_analyze(case: str, tmp_path: Path, good: Path) -> None:
    build, must = PARQUET_CASES[case]
    f = build(tmp_path, good)
    for fn in (read_trace, analyze):
        with pytest.raises(InputError) as ei:
            fn(f)
        msg = str(ei.value)
        assert "\n" not in msg
        for s in must:
            assert s.lower() in msg.lower(), (s, msg)


def test_newer_schema_refused_by_metadata_reader(tmp_path: Path, good: Path) -> None:
    build, _ = PARQUET_CASES["newer_schema"]
    with pytest.raises(InputError, match="upgrade tracekit"):
        read_metadata(build(tmp_path, good))


def test_output_errors(tmp_path: Path, tf0: dict) -> None:
    src = dump(tf0, tmp_path / "rank0.json.gz")
    out = tmp_path / "t.parquet"
    out.write_bytes(b"keep")
    with pytest.raises(OutputError, match="--force"):
        convert([src], out)
    assert out.read_bytes() == b"keep"
    with pytest.raises(OutputError, match="does not exist"):
        convert([src], tmp_path / "nodir" / "t.parquet")
    with pytest.raises(InputError, match="overwrite an input"):
        convert([src], src, force=True)
