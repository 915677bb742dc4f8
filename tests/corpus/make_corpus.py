"""(Re)build the GPU corpus fixtures and their expectations from the lead's raw captures. Run on purpose only.

    python tests/corpus/make_corpus.py [/work/corpus_raw] [RUN ...]

For each run NAME of the raw folder (``NAME.plain.json.gz`` as users profile, ``NAME.stack.json.gz`` its
``with_stack=True`` twin, ``NAME.plain.truth.json`` the program's metadata and own step clock):

* ``fixtures/NAME.json.gz``: the plain trace cut to its first ``STEPS[NAME]`` steps (:mod:`cut`);
* ``expect/NAME.json``: the truth of the twin over the same steps (:mod:`truth`: category of each kernel
  from its launching nn.Module), the steps the program ran in that window (labels), and the program's own
  per-step clock (``host_ns`` = perf_counter around the step, ``gpu_ms`` = CUDA events around it).

The corpus test (``test_corpus.py``) never reads the raw folder: only these two files per run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from cut import cut
from truth import truth

#: steps kept per run (prefill + decode steps); fewer where the eager loop makes the trace large
STEPS_DEFAULT = 4
STEPS = {"glm5_eager_sdpa": 2}


def build(raw: Path, run: str) -> dict:
    steps = STEPS.get(run, STEPS_DEFAULT)
    fx = HERE / "fixtures" / f"{run}.json.gz"
    info = cut(raw / f"{run}.plain.json.gz", fx, steps)
    t = truth(raw / f"{run}.stack.json.gz", steps)
    meta = json.loads((raw / f"{run}.plain.truth.json").read_text())
    prog = meta["steps_profiled"][:steps]
    assert [p["label"] for p in prog] == info["steps"], (run, info["steps"])
    exp = {
        "trace": f"fixtures/{run}.json.gz",
        "source": f"{run}.plain.json.gz (cut to {steps} steps); truth from {run}.stack.json.gz over the same steps",
        "truth_method": "with_stack",
        "model": {k: meta.get(k) for k in ("family", "model_type", "experts_implementation", "attn_implementation", "torch", "transformers", "gpu")},
        "shares_pct": t["shares_pct"],
        "truth_busy_ns": t["busy_ns"],
        "truth_top": t["by_name"][:25],
        "steps": {"count": steps, "labels": info["steps"]},
        "program_clock": prog,
        "fixture_bytes": info["bytes"],
    }
    out = HERE / "expect" / f"{run}.json"
    if out.exists():  # documented deviations are written by hand: keep them
        old = json.loads(out.read_text())
        if "known_gaps" in old:
            exp["known_gaps"] = old["known_gaps"]
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(exp, indent=1) + "\n")
    tmp.replace(out)
    return exp


def main(argv: list[str]) -> int:
    raw = Path(argv[0]) if argv else Path("/work/corpus_raw")
    runs = argv[1:] or sorted(p.name[: -len(".plain.json.gz")] for p in raw.glob("*.plain.json.gz"))
    for r in runs:
        if not (raw / f"{r}.stack.json.gz").exists():
            print(f"{r}: no with_stack twin, skipped")
            continue
        e = build(raw, r)
        print(f"{r}: {e['fixture_bytes'] / 1e6:.2f} MB, " + " ".join(f"{k}={v:.1f}" for k, v in e["shares_pct"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
