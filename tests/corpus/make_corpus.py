"""(Re)build the GPU corpus fixtures and their expectations from the lead's raw captures. Run on purpose only.

    python tests/corpus/make_corpus.py [/work/corpus_raw] [RUN ...]

For each run NAME of the raw folder (``NAME.plain.json.gz`` as users profile, ``NAME.stack.json.gz`` its
``with_stack=True`` twin, ``NAME.plain.truth.json`` the program's metadata and own step clock; runs of the newer
protocol also have ``NAME.post.json``, the steps the device kept, and may be twins only, ``NAME_twin``):

* ``fixtures/NAME.json.gz``: the plain trace cut to its first ``STEPS[NAME]`` steps (:mod:`cut`);
* ``expect/NAME.json``: the truth of the twin over the same steps (:mod:`truth`: category of each kernel
  from its launching nn.Module), the steps the program ran in that window (labels), and the program's own
  per-step clock (``host_ns`` = perf_counter around the step, ``gpu_ms`` = CUDA events around it);
* (newer protocol) ``fixtures/NAME_twin.json.gz`` + ``expect/NAME_twin.json``: the twin itself as a fixture
  (:func:`build_twin`), so that tracekit is checked on the with_stack trace (module context) as well.

The corpus test (``test_corpus.py``) never reads the raw folder: only these two files per run.

``program_capture/`` holds a trace made *through* ``tracekit capture -- capture_scripts/moe_decode.py`` (its
``trace.parquet``, the program's own clock ``captured.json``) and a with_stack twin of the same program and config
(``moe_decode.py --stack-trace``): :func:`build_capture` writes ``fixtures/qwen3moe_grouped_capture.parquet`` (the
capture as it came out, under 3 MB) and its expectation (truth from the twin, steps = the ``--steps`` the capture
was asked for, program clock of those steps).
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


#: twin fixtures larger than this lose their record_shapes arguments, then their decode steps
TWIN_BYTES = 1_300_000


def _device_steps(raw: Path, run: str, tag: str) -> int | None:
    """Steps the device kept of a run's trace (``RUN.post.json`` of capture_scripts/transformers_corpus_capture.py)."""
    p = raw / f"{run}.post.json"
    if not p.exists():
        return None
    info = json.loads(p.read_text()).get(tag)
    return len(info["steps"]) if info else None


def _write_expect(case: str, exp: dict) -> dict:
    out = HERE / "expect" / f"{case}.json"
    if out.exists():  # documented deviations are written by hand: keep them
        old = json.loads(out.read_text())
        if "known_gaps" in old:
            exp["known_gaps"] = old["known_gaps"]
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(exp, indent=1) + "\n")
    tmp.replace(out)
    return exp


def _model(meta: dict) -> dict:
    return {k: meta.get(k) for k in ("family", "model_type", "experts_implementation", "attn_implementation", "torch", "transformers", "gpu")}


def build(raw: Path, run: str) -> dict:
    plain, stack = _device_steps(raw, run, "plain"), _device_steps(raw, run, "stack")
    steps = min(plain, stack) if plain and stack else STEPS.get(run, STEPS_DEFAULT)
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
        "model": _model(meta),
        "shares_pct": t["shares_pct"],
        "truth_busy_ns": t["busy_ns"],
        "truth_top": t["by_name"][:25],
        "steps": {"count": steps, "labels": info["steps"]},
        "program_clock": prog,
        "fixture_bytes": info["bytes"],
    }
    return _write_expect(run, exp)


def twin_case(run: str) -> str:
    return run if run.endswith("_twin") else f"{run}_twin"


def build_twin(raw: Path, run: str) -> dict:
    """``fixtures/<run>_twin.json.gz``: the with_stack twin itself as a fixture (its ``nn.Module`` ranges kept, the
    other Python frames dropped), at most :data:`TWIN_BYTES`; its truth is its own module chain (truth.py)."""
    case = twin_case(run)
    src = raw / f"{run}.stack.json.gz"
    fx = HERE / "fixtures" / f"{case}.json.gz"
    steps = _device_steps(raw, run, "stack") or STEPS_DEFAULT
    how = []
    info = cut(src, fx, steps, modules_only=True)
    if info["bytes"] > TWIN_BYTES:
        how.append("record_shapes arguments dropped")
        info = cut(src, fx, steps, modules_only=True, strip_shapes=True)
    if info["bytes"] > TWIN_BYTES and steps > 1:
        steps, how = 1, how + ["prefill step only"]
        info = cut(src, fx, steps, modules_only=True, strip_shapes=True)
    t = truth(fx)
    meta = json.loads((raw / f"{run}.plain.truth.json").read_text())
    prog = (meta.get("steps_profiled_stack") or meta["steps_profiled"])[:steps]
    assert [p["label"] for p in prog] == info["steps"], (case, info["steps"])
    exp = {
        "trace": f"fixtures/{case}.json.gz",
        "source": f"{run}.stack.json.gz (with_stack=True, with_modules=True, record_shapes=True; nn.Module ranges kept, other Python "
                  f"frames dropped{'; ' + '; '.join(how) if how else ''}; {steps} steps)",
        "truth_method": "with_stack",
        "twin_of": run.removesuffix("_twin"),
        "model": _model(meta),
        "shares_pct": t["shares_pct"],
        "truth_busy_ns": t["busy_ns"],
        "truth_top": t["by_name"][:25],
        "steps": {"count": steps, "labels": info["steps"]},
        "program_clock": prog,
        "fixture_bytes": info["bytes"],
    }
    return _write_expect(case, exp)


CAPTURE_CASE = "qwen3moe_grouped_capture"


def build_capture(raw: Path) -> dict:
    import shutil

    import polars as pl

    sys.path.insert(0, str(HERE.parents[1]))
    from tracekit.schema import read_trace

    src = raw / "program_capture"
    fx = HERE / "fixtures" / f"{CAPTURE_CASE}.parquet"
    shutil.copyfile(src / "moe_program.parquet", fx)
    df, meta = read_trace(fx)
    labels = df.filter(pl.col("kind") == "step").sort("ts_ns")["name"].cast(pl.String).to_list()
    prog_run = json.loads((src / "captured.json").read_text())
    first = prog_run["warmup_steps"] + 1  # step_ns[0] is forward#<warmup + 1>
    prog = []
    for lab in labels:
        i = int(lab.split("#", 1)[1].split(":", 1)[0])
        # the program syncs at every step end, so its host clock spans the step's GPU work too
        prog.append({"label": lab, "host_ns": prog_run["step_ns"][i - first], "gpu_ms": 0.0})
    t = truth(src / "moe_program.stack.json.gz")
    twin = json.loads((src / "twin.json").read_text())
    asked = int(meta["capture"]["options"]["steps"])
    exp = {
        "trace": f"fixtures/{CAPTURE_CASE}.parquet",
        "source": "tracekit capture --delay 36.1s --steps 60 --window 1s -- capture_scripts/moe_decode.py (as it came out); "
                  "truth from moe_decode.py --stack-trace (same program and config, 5 decode steps after the warm-up)",
        "truth_method": "with_stack",
        "model": {"family": "qwen3moe", "model_type": prog_run["arch"], "experts_implementation": "grouped_mm (transformers default)",
                  "attn_implementation": "sdpa", "torch": prog_run["torch"], "transformers": "5.17.0", "gpu": prog_run["device"],
                  "config": {k: prog_run[k] for k in ("layers", "experts", "hidden", "bs")}, "twin_steps": twin["stack_trace"]},
        "shares_pct": t["shares_pct"],
        "truth_busy_ns": t["busy_ns"],
        "truth_top": t["by_name"][:25],
        "steps": {"count": asked, "labels": labels, "modes": ["DECODE"], "batch_size": prog_run["bs"]},
        "program_clock": prog,
        "fixture_bytes": fx.stat().st_size,
    }
    assert len(labels) == asked, (len(labels), asked)
    out = HERE / "expect" / f"{CAPTURE_CASE}.json"
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(exp, indent=1) + "\n")
    tmp.replace(out)
    return exp


def main(argv: list[str]) -> int:
    raw = Path(argv[0]) if argv else Path("/work/corpus_raw")
    runs = argv[1:] or sorted(p.name[: -len(".stack.json.gz")] for p in raw.glob("*.stack.json.gz"))
    for r in runs:
        if not (raw / f"{r}.stack.json.gz").exists():
            print(f"{r}: no with_stack twin, skipped")
            continue
        made = [build(raw, r)] if (raw / f"{r}.plain.json.gz").exists() else []
        if _device_steps(raw, r, "stack"):  # the newer protocol: the twin is a fixture too
            made.append(build_twin(raw, r))
        for e in made:
            print(f"{e['trace']}: {e['fixture_bytes'] / 1e6:.2f} MB, " + " ".join(f"{k}={v:.1f}" for k, v in e["shares_pct"].items()))
    if not argv[1:] and (raw / "program_capture" / "moe_program.stack.json.gz").exists():
        e = build_capture(raw)
        print(f"{CAPTURE_CASE}: {e['fixture_bytes'] / 1e6:.2f} MB, " + " ".join(f"{k}={v:.1f}" for k, v in e["shares_pct"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
