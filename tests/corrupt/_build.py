"""Build bad inputs from the real traces in ``/work/shared/traces`` (in tmp dirs) and run the CLI.

Originals are only ever read. Every helper writes under a directory the test
passes in (``tmp_path``).
"""

from __future__ import annotations

import copy
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

__all__ = [
    "TRACES",
    "TF0",
    "TF1",
    "NCCL",
    "CPU_ONLY",
    "need",
    "load",
    "dump",
    "cli",
    "cli_inproc",
    "assert_clean_error",
    "gpu_kernels",
    "with_rank",
    "small_rank",
]

TRACES = Path(os.environ.get("TRACEKIT_TRACES", "/work/shared/traces"))
#: 2 ranks of one real job (A100, NCCL SendRecv kernels, ProfilerSteps)
TF0 = TRACES / "hta/trace_filter/sampled_rank-0.json.gz"
TF1 = TRACES / "hta/trace_filter/sampled_rank-1.json.gz"
#: rank 0 of 2, full record_param_comms metadata
NCCL = TRACES / "hta/nccl_parser_config/nccl_data.json.gz"
#: CPU-only rank (gloo), no GPU events at all
CPU_ONLY = TRACES / "hta/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"


def need(*paths: Path) -> None:
    """Skip when the shared trace set is not mounted (never fail for a missing fixture)."""
    for p in paths:
        if not p.exists():
            pytest.skip(f"shared trace {p} not available")


def load(path: Path) -> dict[str, Any]:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return json.loads(raw)


def dump(doc: dict[str, Any] | list[Any], path: Path) -> Path:
    """Write ``doc`` as JSON (gzip when the name ends in .gz); returns the path."""
    data = json.dumps(doc).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(data, 1) if path.name.endswith(".gz") else data)
    return path


def with_rank(doc: dict[str, Any], rank: int, world: int | None = None) -> dict[str, Any]:
    d = copy.copy(doc)
    di = dict(d.get("distributedInfo") or {})
    di["rank"] = rank
    if world is not None:
        di["world_size"] = world
    d["distributedInfo"] = di
    return d


def small_rank(doc: dict[str, Any], n: int = 1500) -> dict[str, Any]:
    """``doc`` cut to ``n`` events around its middle kernel (by ts) plus its metadata events: small and fast, yet
    with kernels and the runtime calls that launched them (replay needs both)."""
    timed = sorted((e for e in doc["traceEvents"] if isinstance(e.get("ts"), (int, float))), key=lambda e: e["ts"])
    kern = [i for i, e in enumerate(timed) if e.get("cat") in ("kernel", "Kernel")]
    lo = max(0, kern[len(kern) // 2] - n // 2) if kern else 0
    d = copy.copy(doc)
    d["traceEvents"] = [e for e in doc["traceEvents"] if not isinstance(e.get("ts"), (int, float))] + timed[lo: lo + n]
    return d


def gpu_kernels(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") in ("kernel", "Kernel")]


def _exe() -> list[str]:
    script = Path(sys.executable).with_name("tracekit")
    return [str(script)] if script.exists() else [sys.executable, "-m", "tracekit.cli"]


def cli(*args: str | Path, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run the real console script (a fresh process: exit code, stderr and all)."""
    env = dict(os.environ, COLUMNS="200", NO_COLOR="1", TERM="dumb")
    return subprocess.run(
        [*_exe(), *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=timeout, env=env
    )


def cli_inproc(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """Run ``tracekit.cli.main`` in this process (fast); same result shape as :func:`cli`.

    Any exception other than ``SystemExit`` escapes and fails the test, exactly
    like a traceback would in the real process.
    """
    import contextlib
    import io

    from tracekit.cli import main

    out, err = io.StringIO(), io.StringIO()
    argv = sys.argv
    sys.argv = ["tracekit", *map(str, args)]
    rc = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = argv
    return subprocess.CompletedProcess(["tracekit", *map(str, args)], rc, out.getvalue(), err.getvalue())


def assert_clean_error(p: subprocess.CompletedProcess[str], *must: str, code: int | None = None) -> str:
    """Non-zero exit, exactly one line on stderr starting ``tracekit: error:``, no traceback.

    ``must``: substrings the message has to contain (file, rank, field, remedy words).
    Returns the message.
    """
    assert p.returncode != 0, f"expected failure, got rc=0; stdout={p.stdout[-500:]!r}"
    if code is not None:
        assert p.returncode == code, (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr and "Traceback" not in p.stdout, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}: {p.stderr!r}"
    msg = lines[0]
    assert msg.startswith("tracekit: error: "), msg
    for s in must:
        assert s.lower() in msg.lower(), f"{s!r} not in {msg!r}"
    return msg
