"""Build the what-if truth set from the raw outputs of ``capture_scripts/whatif_pairs.py`` (run here, not on the GPU).

``python tests/replay/truth/make_truth.py RAWDIR [--cases a,b]`` writes, per case, into this folder:

* ``<case>.trace.parquet``: the profiled decode steps converted by tracekit, plus the program's own unprofiled
  step ranges of blocks ``u1``… as ``kind="step"``, ``profiled=false``, ``src="tracekit.step"`` rows
  (what ``tracekit capture`` records; replay calibrates on them). ``cpu_op`` rows are dropped except GEMM ops
  with recorded shapes (kept where the case recorded them: the loop → grouped what-if reads them).
* ``clock.json``: per case the program clock: per block the median ``step_ns`` and ``host_ns`` (unprofiled blocks
  ``u1``…, ``profiled``), the unprofiled p50 over every unprofiled step, the same-run noise of the baseline repeat
  |median(first half of the blocks) − median(second half)| / median, and the case's config.

The predictions and their errors are not written here: ``tests/replay/truth/pairs.py`` computes them from
these files with the current code (``python tests/replay/truth/pairs.py`` prints the accuracy table).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import polars as pl  # noqa: E402

from tracekit.capture.instrument import STEP_SRC  # noqa: E402
from tracekit.schema import conform, frame_from_rows, read_trace, write_trace  # noqa: E402

HERE = Path(__file__).resolve().parent
_GEMM_OPS = ("aten::linear", "aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::_grouped_mm")


def unprofiled_rows(rec: dict[str, Any]) -> pl.DataFrame:
    """The program clock's unprofiled blocks as step records (rank 0): the labelled range's duration (``host_ns``:
    the range closes before the step's synchronize), what ``tracekit capture`` records for the same range."""
    bs = int(rec["bs"])
    rows = [{"rank": 0, "kind": "range", "ts_ns": int(s["wall_ns"]), "dur_ns": int(s["host_ns"]),
             "name": f"forward#{s['fwd']}:decode:bs={bs}", "step_id": int(s["fwd"]), "profiled": False, "src": STEP_SRC}
            for b in _ublocks(rec) for s in rec["blocks"][b]]
    from tracekit.ingest.common import parse_steps

    raw = frame_from_rows(rows)
    keep = raw.select("step_id", "profiled")
    parsed = parse_steps(raw, None)
    return conform(parsed.with_columns(pl.lit("step").cast(parsed.schema["kind"]).alias("kind"),
                                       keep["step_id"].alias("step_id"), keep["profiled"].alias("profiled")))


def _ublocks(rec: dict[str, Any]) -> list[str]:
    """The unprofiled blocks ``u1``, ``u2``… in run order."""
    return sorted((b for b in rec["blocks"] if b[:1] == "u" and b[1:].isdigit()), key=lambda b: int(b[1:]))


def _med(xs: list[int]) -> float | None:
    return float(statistics.median(xs)) if xs else None


def clock_summary(rec: dict[str, Any]) -> dict[str, Any]:
    """Medians per block and the same-run noise of the program's own clock."""
    b = rec["blocks"]
    ub = _ublocks(rec)
    out: dict[str, Any] = {"blocks": {}}
    for blk in [*ub, "profiled"]:
        xs = b.get(blk, [])
        out["blocks"][blk] = {"n": len(xs), "step_ns_p50": _med([x["step_ns"] for x in xs]),
                              "host_ns_p50": _med([x["host_ns"] for x in xs])}
    both = [x["step_ns"] for k in ub for x in b[k]]
    out["unprofiled_step_ns_p50"] = _med(both)
    h = len(ub) // 2
    early = _med([x["step_ns"] for k in ub[:h] for x in b[k]])
    late = _med([x["step_ns"] for k in ub[h:] for x in b[k]])
    out["noise"] = abs(early - late) / out["unprofiled_step_ns_p50"] if early and late else None
    out["config"] = {k: rec.get(k) for k in ("kind", "model", "cfg", "experts", "bs", "prof_steps", "shapes", "graph",
                                               "device", "torch", "transformers", "prompt", "group", "rounds")}
    return out


def build_case(raw: Path, name: str) -> dict[str, Any]:
    from tracekit.ingest.convert import convert

    rec = json.loads((raw / f"{name}.json").read_text())
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td) / "t.parquet"
        convert([raw / f"{name}.trace.json.gz"], tmp, extra_frames=[unprofiled_rows(rec)],
                metadata={"whatif_truth": {"case": name}})
        df, meta = read_trace(tmp)
    keep_ops = pl.col("name").cast(pl.String).is_in(list(_GEMM_OPS)) & pl.col("input_dims").is_not_null()
    df = df.filter((pl.col("kind") != "cpu_op") | (keep_ops if rec.get("shapes") else pl.lit(False)))
    write_trace(df, HERE / f"{name}.trace.parquet", meta, force=True)
    return clock_summary(rec)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("raw", type=Path)
    ap.add_argument("--cases", default=None)
    a = ap.parse_args()
    names = a.cases.split(",") if a.cases else sorted(p.name[:-5] for p in a.raw.glob("*.json") if ".trace" not in p.name)
    cpath = HERE / "clock.json"
    clock = json.loads(cpath.read_text()) if cpath.exists() else {}
    for n in names:
        clock[n] = build_case(a.raw, n)
        c = clock[n]
        print(f"{n}: unprofiled {c['unprofiled_step_ns_p50'] / 1e6:.3f} ms (noise {c['noise']:.2%}), "
              f"profiled {c['blocks']['profiled']['step_ns_p50'] / 1e6:.3f} ms, "
              f"{(HERE / f'{n}.trace.parquet').stat().st_size / 1e6:.2f} MB", flush=True)
    cpath.write_text(json.dumps(dict(sorted(clock.items())), indent=1) + "\n")


if __name__ == "__main__":
    main()
