"""Inputs of the cluster and dataset tests: real ranks tiled to many (``benchmarks/tile_real.py``), as Kineto JSON.

The source is the 2 x H200 straggler capture (``tests/fixtures/gpu/straggler.trace.parquet``: real NCCL
all-reduces every step, a planted straggler on rank 0): tiled to N ranks (1 tile each: ~1.2k kernels, ~60
collectives per rank), written as one Kineto JSON per rank, the input ``convert`` reads.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "tests" / "fixtures" / "gpu" / "straggler.trace.parquet"
sys.path.insert(0, str(ROOT / "benchmarks"))


def tiled_kineto(outdir: Path, ranks: int) -> list[Path]:
    """``ranks`` real ranks as Kineto JSON files ``rank<r>.trace.json`` in ``outdir``."""
    from tile_real import tile_trace, write_kineto

    tiled = outdir / "tiled.parquet"
    tile_trace(SRC, tiled, ranks=ranks, kernels=ranks * 1000)
    files = write_kineto(tiled, outdir / "kineto")
    tiled.unlink()
    return files


@pytest.fixture(scope="session")
def kineto8(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return tiled_kineto(tmp_path_factory.mktemp("k8"), 8)


@pytest.fixture(scope="session")
def kineto64(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return tiled_kineto(tmp_path_factory.mktemp("k64"), 64)


def corrupt_copy(files: list[Path], rank: int, dest: Path) -> list[Path]:
    """Symlinks to ``files`` in ``dest``, with rank ``rank``'s file replaced by its first half (truncated JSON)."""
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for f in files:
        d = dest / f.name
        if f.name == f"rank{rank}.trace.json":
            data = f.read_bytes()
            d.write_bytes(data[: len(data) // 2])
        else:
            d.symlink_to(f)
        out.append(d)
    return out
