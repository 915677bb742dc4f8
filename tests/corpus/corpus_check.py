"""Measure one corpus trace against its expectation: category shares, other_compute, steps, decode step time.

Used by ``test_corpus.py`` (asserts) and runnable on its own for the table:
``python tests/corpus/corpus_check.py`` prints every trace.

Shares are of summed GPU-op time (kernels, copies, memsets) over the steps the fixture holds, the
same definition as the truth (``truth.py``). Truth is either the with_stack twin's module chain
(``truth_method: with_stack``, shares stored) or, for shared traces captured without stacks, a
hand-labelled family table (``truth_method: hand_labels``: ordered ``[regex, category, why]`` rows
written from the kernel names by hand, independent of ``schemas/categories_v1.json``; every kernel
must match one row).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import polars as pl

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from tracekit.analysis.passes.steps import step_stats
from tracekit.ingest.common import finalize_rank  # noqa: E402
from tracekit.ingest.convert import convert
from tracekit.schema import CATEGORIES, read_trace

TOL_PP = 3.0
OTHER_MAX_PCT = 10.0
#: attention above this share (%) must be within this ratio of its truth
ATTN_RATIO_FROM_PCT = 0.3
ATTN_RATIO = (0.8, 1.25)
#: dense controls: MoE GEMM + routing below this share (%)
DENSE_FAMILIES = ("llama", "mistral")
DENSE_MOE_MAX_PCT = 0.5
TRACES = Path(os.environ.get("TRACEKIT_TRACES", "/work/shared/traces"))


def cases() -> list[str]:
    return sorted(p.stem for p in (HERE / "expect").glob("*.json"))


def load(case: str) -> dict[str, Any]:
    return json.loads((HERE / "expect" / f"{case}.json").read_text())


def trace_path(exp: dict[str, Any]) -> Path:
    return (TRACES / exp["shared_trace"]) if "shared_trace" in exp else (HERE / exp["trace"])


def _gpu(df: pl.DataFrame) -> pl.DataFrame:
    return df.filter(pl.col("kind").cast(pl.String).is_in(["kernel", "memcpy", "memset"]))


def shares(g: pl.DataFrame, col: str = "category") -> dict[str, float]:
    tot = g["dur_ns"].sum() or 1
    s = dict(g.group_by(pl.col(col).cast(pl.String)).agg(pl.col("dur_ns").sum()).iter_rows())
    return {c: 100.0 * s.get(c, 0) / tot for c in CATEGORIES}


def hand_truth(g: pl.DataFrame, labels: list[list[str]]) -> tuple[dict[str, float], list[str]]:
    """Truth shares from hand labels (first matching row wins; memcpy/memset are memory; a module label, column
    ``_mtruth`` of :func:`module_truth`, wins over the name labels)."""
    names = g.filter(pl.col("kind").cast(pl.String) == "kernel").select(pl.col("name").cast(pl.String).unique()).to_series().to_list()
    table, missing = {}, []
    for n in names:
        for rx, cat, *_ in labels:
            if re.search(rx, n):
                table[n] = cat
                break
        else:
            missing.append(n)
    by_name = pl.col("name").cast(pl.String).replace_strict(table, default=None)
    if "_mtruth" in g.columns:
        by_name = pl.coalesce(pl.col("_mtruth"), by_name)
    lab = g.with_columns(
        pl.when(pl.col("kind").cast(pl.String) != "kernel").then(pl.lit("memory")).otherwise(by_name).alias("_truth")
    )
    return shares(lab, "_truth"), missing


def module_truth(src: Path, g: pl.DataFrame, labels: list[list[str]]) -> pl.DataFrame:
    """Hand labels that depend on the launching module (``module_labels``: ``[module_regex, name_regex, category, why]``),
    for a trace that carries its stacks: the module chain of each kernel comes from truth.py's own stack reader (not
    tracekit's). Adds ``_mtruth`` (null where no row applies)."""
    import truth as T  # noqa: PLC0415 - the independent with_stack reader

    doc = T._load(src)
    ev = doc["traceEvents"] if isinstance(doc, dict) else doc
    cpu = [e for e in ev if e.get("ph") == "X" and e.get("cat") in ("python_function", "cpu_op", "user_annotation")]
    la = [e for e in ev if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver")
          and "correlation" in (e.get("args") or {}) and T.LAUNCH.search(e.get("name", ""))]
    stacks = T._stacks(cpu, la)
    rows = g.filter(pl.col("kind").cast(pl.String) == "kernel").select("correlation", pl.col("name").cast(pl.String)).unique()
    lab: dict[int, str] = {}
    for corr, name in rows.iter_rows():
        mods = stacks.get(int(corr), ([], []))[0] if corr is not None else []
        for mrx, nrx, cat, *_ in labels:
            if any(re.search(mrx, m) for m in mods) and re.search(nrx, name):
                lab[int(corr)] = cat
                break
    return g.with_columns(pl.col("correlation").replace_strict(lab, default=None, return_dtype=pl.String).alias("_mtruth"))


ROLE_TRUTH = {"router": "moe_routing", "moe_gemm": "moe_gemm", "attn": "attention"}


def nvtx_truth(df: pl.DataFrame) -> dict[str, float]:
    """Truth from the program's own NVTX role ranges (``router``, ``moe_gemm``, ``attn``) around the ops
    that launched each kernel, with the with_stack rules of truth.py inside them: in ``moe_gemm`` GEMMs
    are moe_gemm, the activation other_compute, the rest (index, nonzero, index_add) moe_routing; in
    ``attn`` GEMMs and softmax are attention; outside any role range GEMMs are dense_gemm."""
    rng = df.filter((pl.col("kind").cast(pl.String) == "range") & pl.col("name").cast(pl.String).is_in(list(ROLE_TRUTH))).select(
        "tid", pl.col("ts_ns").alias("_rs"), (pl.col("ts_ns") + pl.col("dur_ns")).alias("_re"), pl.col("name").cast(pl.String).alias("_role")
    ).sort("_rs")
    g = _gpu(df).with_columns(pl.coalesce("launch_ts_ns", "ts_ns").alias("_t"), pl.coalesce("launch_tid", "tid").alias("_tid")).sort("_t")
    g = g.join_asof(rng.rename({"tid": "_tid"}), left_on="_t", right_on="_rs", by="_tid", strategy="backward", check_sortedness=False).with_columns(
        pl.when(pl.col("_t") < pl.col("_re")).then(pl.col("_role")).alias("_role"))
    n = pl.col("name").cast(pl.String)
    gemm = n.str.contains(r"(?i)gemm|gemv|nvjet|cutlass|splitKreduce")
    act = n.str.contains(r"(?i)silu|gelu")
    role = pl.col("_role")
    t = (
        pl.when(pl.col("kind").cast(pl.String) != "kernel").then(pl.lit("memory"))
        .when(role == "router").then(pl.lit("moe_routing"))
        .when(role == "moe_gemm").then(pl.when(gemm).then(pl.lit("moe_gemm")).when(act).then(pl.lit("other_compute")).otherwise(pl.lit("moe_routing")))
        .when(role == "attn").then(pl.when(gemm | n.str.contains(r"(?i)softmax")).then(pl.lit("attention")).otherwise(pl.lit("other_compute")))
        .when(n.str.contains(r"(?i)^nccl")).then(pl.lit("communication"))
        .when(gemm).then(pl.lit("dense_gemm"))
        .otherwise(pl.lit("other_compute"))
    )
    return shares(g.with_columns(t.alias("_truth")), "_truth")


def frame(case: str, workdir: Path) -> pl.DataFrame:
    """The case's trace as tracekit converts it (a capture's parquet as it came out)."""
    src = trace_path(load(case))
    if src.suffix == ".parquet":  # a trace made by `tracekit capture`: read as it came out
        df, _ = read_trace(src)
        return df
    out = workdir / f"{case}.parquet"
    if not out.exists():
        convert([src], out, force=True)
    df, _ = read_trace(out)
    return df


def _without_roles(df: pl.DataFrame) -> pl.DataFrame:
    """The nvtx case: its role ranges removed (ours comes from the launch pattern alone)."""
    return df.filter(~((pl.col("kind").cast(pl.String) == "range") & pl.col("name").cast(pl.String).is_in(list(ROLE_TRUTH))))


def truth_of(case: str, df: pl.DataFrame) -> tuple[dict[str, float], list[str]]:
    """The case's truth shares (and, for hand labels, the kernel names no label matched)."""
    exp = load(case)
    if exp["truth_method"] == "nvtx_ranges":
        return nvtx_truth(df), []
    if exp["truth_method"] == "hand_labels":
        g = _gpu(df)
        if exp.get("module_labels"):
            g = module_truth(trace_path(exp), g, exp["module_labels"])
        return hand_truth(g, exp["hand_labels"])
    return exp["shares_pct"], []


def measure(case: str, workdir: Path) -> dict[str, Any]:
    exp = load(case)
    df = frame(case, workdir)
    truth, missing = truth_of(case, df)
    if exp["truth_method"] == "nvtx_ranges":
        # ours from the launch pattern alone: the same rows finalized without the role ranges
        bare = _without_roles(df)
        df = finalize_rank(bare.with_columns(pl.lit(None, dtype=pl.String).alias("category"), pl.lit(None, dtype=pl.String).alias("family")))
    g = _gpu(df)
    ours = shares(g)
    tot = g["dur_ns"].sum() or 1
    unexplained = 100.0 * g.filter(pl.col("family").cast(pl.String) == "other")["dur_ns"].sum() / tot
    st = step_stats(df)
    steps = st.steps
    n_steps = steps.select(pl.struct("rank", "step_id").n_unique()).item() if steps.height else 0
    # decode steps; a run without decode (the CUDA-graph prefill loop): all its steps
    has_dec = steps.height > 0 and (steps["mode"] == "DECODE").any()
    dec = steps.filter(pl.col("mode") == "DECODE") if has_dec else steps
    ours_dec_ms = statistics.median((dec["step_ns"] / 1e6).to_list()) if dec.height else None
    prog = [p for p in exp.get("program_clock", []) if (":decode" in p["label"]) or not has_dec]
    # the program's step time: its host clock or its CUDA-event span, whichever is longer (a launch-bound step's
    # events only time the GPU's share; a GPU-bound step's host clock only the launches), as tracekit's step_ns
    prog_ms = statistics.median(max(p["host_ns"] / 1e6, p["gpu_ms"]) for p in prog) if prog else None
    return {
        "case": case, "ours": ours, "truth": truth, "other_compute": ours["other_compute"], "unexplained_other": unexplained,
        "steps_found": n_steps, "steps_truth": exp["steps"]["count"], "modes": sorted({str(m) for m in steps["mode"].to_list()}) if steps.height else [],
        "decode_ms": ours_dec_ms, "program_decode_ms": prog_ms, "known_gaps": exp.get("known_gaps", {}), "missing_labels": missing,
        "expect_steps": exp["steps"], "summary": st.summary.to_dicts() if st.summary.height else [],
    }


def table(m: dict[str, Any]) -> str:
    rows = [f"== {m['case']}"]
    rows.append(f"   {'category':14s} {'ours %':>8s} {'truth %':>8s} {'diff pp':>8s}")
    for c in CATEGORIES:
        d = m["ours"][c] - m["truth"].get(c, 0.0)
        flag = " (known gap)" if c in m["known_gaps"] else (" <-- beyond 3 pp" if abs(d) > TOL_PP else "")
        rows.append(f"   {c:14s} {m['ours'][c]:8.2f} {m['truth'].get(c, 0.0):8.2f} {d:+8.2f}{flag}")
    rows.append(f"   other_compute {m['other_compute']:.1f}% (no rule matched: {m['unexplained_other']:.2f}%)")
    rows.append(f"   steps found {m['steps_found']} / truth {m['steps_truth']} modes {m['modes']}")
    if m["program_decode_ms"] is not None:
        rows.append(f"   decode step p50 {m['decode_ms']:.1f} ms / program clock max(host, CUDA events) {m['program_decode_ms']:.1f} ms")
    return "\n".join(rows)


def lofo(workdir: Path, needs_file: Path | None = None) -> list[dict[str, Any]]:
    """Leave-one-family-out (:mod:`lofo`): per family, the worst MoE GEMM / routing / attention error of its cases
    with every threshold fit to the other families only."""
    import lofo as L  # noqa: PLC0415

    data, needs, fams = {}, {}, {}
    for c in cases():
        if not trace_path(load(c)).exists():
            continue
        df = frame(c, workdir)
        truth, _ = truth_of(c, df)
        if load(c)["truth_method"] == "nvtx_ranges":
            df = _without_roles(df)
        data[c], fams[c] = (df, truth), L.family(load(c), c)
        needs[c] = {t: L.need(df, lambda d: shares(_gpu(d)), t) for t in L.THRESHOLDS}
        print(f"  needs {c}: {needs[c]}", file=sys.stderr, flush=True)
    if needs_file is not None:
        L.write_needs(needs_file, needs)
    rows = []
    for fam in sorted(set(fams.values())):
        fit, unfit = L.fitted(needs, fams, fam)
        err, lo_hi = dict.fromkeys(L.CATS, 0.0), None
        with L.thresholds(fit):
            for c in (c for c in data if fams[c] == fam):
                df, truth = data[c]
                ours = shares(_gpu(L.refinalize(df)))
                for k in L.CATS:
                    err[k] = max(err[k], abs(ours[k] - truth.get(k, 0.0)))
                if truth.get("attention", 0.0) > ATTN_RATIO_FROM_PCT:
                    r = ours["attention"] / truth["attention"]
                    lo_hi = (min(r, lo_hi[0]), max(r, lo_hi[1])) if lo_hi else (r, r)
        rows.append({"family": fam, "cases": sum(1 for c in data if fams[c] == fam), "err": err, "ratio": lo_hi, "fit": fit,
                     "unfit": unfit})
    return rows


def markdown(ms: list[dict[str, Any]]) -> str:
    """One row per case: ours / truth per category (% of GPU-op time), the largest difference, steps, decode step."""
    cats = ("moe_gemm", "moe_routing", "attention", "dense_gemm", "other_compute", "memory")
    out = ["| trace | MoE GEMM | routing | attention | dense GEMM | other | memory | max abs diff | steps | decode p50: ours / program |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for m in ms:
        cells = " | ".join(f"{m['ours'][c]:.1f} / {m['truth'].get(c, 0.0):.1f}" for c in cats)
        worst = max(abs(m["ours"][c] - m["truth"].get(c, 0.0)) for c in CATEGORIES)
        dec = f"{m['decode_ms']:.1f} / {m['program_decode_ms']:.1f} ms" if m["program_decode_ms"] is not None else "—"
        out.append(f"| `{m['case']}` | {cells} | {worst:.2f} pp | {m['steps_found']} / {m['steps_truth']} | {dec} |")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    with tempfile.TemporaryDirectory() as d:
        if argv and argv[0] == "--markdown":
            print(markdown([measure(c, Path(d)) for c in cases() if trace_path(load(c)).exists()]))
            return 0
        if argv and argv[0] == "--lofo":
            import lofo as L  # noqa: PLC0415

            print(L.lofo_table(lofo(Path(d), Path(argv[1]) if len(argv) > 1 else None)))
            return 0
        for c in cases():
            print(table(measure(c, Path(d))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
