"""Cut a Kineto JSON to its first N steps (a fixture well under 3 MB compressed).

``python tests/corpus/cut.py IN.json.gz OUT.json.gz --steps 4 [--strip-stack]``: keeps the
trace's metadata, every CPU event that starts inside the first ``N`` step ranges (the
``forward#i``/``ProfilerStep#i``... ranges of :mod:`tracekit.steplabels`, in time order) and the
GPU events launched by the kept runtime calls (by correlation) or starting inside those steps.
``--strip-stack`` drops ``python_function`` events (a with_stack twin becomes a plain trace); ``--modules-only``
keeps only its ``nn.Module: <Class>_<n>`` ranges (all of the stack that truth.py and tracekit read: a twin
fixture); ``--strip-shapes`` drops the ``record_shapes`` arguments of CPU ops (Input Dims, strides, types).
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tracekit.steplabels import FAMILIES

GPU = ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation")


SHAPE_ARGS = ("Input Dims", "Input Strides", "Input type", "Concrete Inputs")


def _drop(e: dict, strip_stack: bool, modules_only: bool) -> bool:
    if e.get("cat") != "python_function":
        return False
    return strip_stack or (modules_only and not str(e.get("name", "")).startswith("nn.Module: "))


def cut(src: Path, dst: Path, steps: int, strip_stack: bool = False, modules_only: bool = False,
        strip_shapes: bool = False) -> dict:
    with gzip.open(src, "rt") as f:
        doc = json.load(f)
    ev = doc["traceEvents"]
    rx = [re.compile(r) for r in FAMILIES.values()]
    ranges = sorted((e for e in ev if e.get("ph") == "X" and e.get("cat") == "user_annotation"
                     and any(r.search(e.get("name", "")) for r in rx)), key=lambda e: e["ts"])
    if len(ranges) < steps:
        raise SystemExit(f"{src}: {len(ranges)} step ranges, fewer than --steps {steps}")
    t0, t1 = ranges[0]["ts"], ranges[steps - 1]["ts"] + ranges[steps - 1]["dur"]
    keep, corr = [], set()
    for e in ev:
        if e.get("ph") == "M" or e.get("cat") in GPU:
            continue
        if _drop(e, strip_stack, modules_only):
            continue
        if strip_shapes and e.get("cat") == "cpu_op" and e.get("args"):
            e["args"] = {k: v for k, v in e["args"].items() if k not in SHAPE_ARGS}
        if e.get("ph") in ("X", "i", "I") and t0 <= float(e.get("ts", -1)) <= t1:
            keep.append(e)
            c = (e.get("args") or {}).get("correlation")
            if c is not None:
                corr.add(c)
    for e in ev:
        if e.get("cat") in GPU:
            c = (e.get("args") or {}).get("correlation")
            if (c is not None and c in corr) or (c is None and t0 <= float(e.get("ts", -1)) <= t1):
                keep.append(e)
    meta = [e for e in ev if e.get("ph") == "M"]
    doc["traceEvents"] = meta + keep
    tmp = dst.with_name(dst.name + ".tmp")
    with gzip.open(tmp, "wt", compresslevel=9) as f:
        json.dump(doc, f, separators=(",", ":"))
    tmp.replace(dst)
    return {"steps": [r["name"] for r in ranges[:steps]], "events": len(keep), "bytes": dst.stat().st_size}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("dst", type=Path)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--strip-stack", action="store_true")
    ap.add_argument("--modules-only", action="store_true")
    ap.add_argument("--strip-shapes", action="store_true")
    a = ap.parse_args()
    print(json.dumps(cut(a.src, a.dst, a.steps, a.strip_stack, a.modules_only, a.strip_shapes)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
