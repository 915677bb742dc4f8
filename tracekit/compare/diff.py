"""Compare two captures: time per category, steps, tokens/s, collectives, power, kernels, verdict.

:func:`summarize_result` reduces one analysis result (:class:`tracekit.analysis.result.AnalysisResult`,
what ``tracekit analyze`` computes: its window, exclusive breakdown with communication split into
wait/transfer, collective matching, step table and tokens/s) to a :class:`RunSummary`;
:func:`diff_runs` compares two of them into a :class:`DiffResult`. Both are pure functions.

Normalization. Captures rarely have the same length, so times are compared on a
common *basis*: ``per_step`` (ms per step, mean over ranks) when both runs have
step rows, else ``per_window`` (ms in the analysis window, mean over ranks;
a quality flag says when the windows differ by more than 10 %).

Kernel matching: per-basis kernel time is matched by exact name first; the time
of names present in only one run is then pooled per category and compared as a
``category`` row (e.g. a MoE GEMM kernel renamed by a new backend).

Steps, like with like (:func:`match_steps`): the step times compared are those of the steps both runs hold —
matched by the program's step number (``ProfilerStep#N``, ``forward#i``) when at least half of the smaller run's
steps share one with the other run, else by ordinal (the n-th step of each run) — of the before run's primary
shape (:mod:`tracekit.analysis.steptime`). The change must exceed a noise band: the larger of ``noise_frac`` and
twice the standard error of the two medians (1.25 × 1.4826 × MAD / √n each, relative to the before p50), so a
diff of a run with itself, or of two runs with the same steps, reads "no significant change".

Verdict: short sentences, most important first — headline change (matched step time
p50, else GPU busy time), the categories that explain it, tokens/s,
collective wait vs transfer, the kernel that changed most, power. Changes
below ``noise_frac`` (default 2 %) read as "no significant change".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import polars as pl

from tracekit._errors import Quality, QualityLog
from tracekit.analysis.result import AnalysisResult
from tracekit.analysis.sections import UnsetType
from tracekit.analysis.steptime import job_steps, of_shape, p50, primary_shape, quantile

__all__ = ["RunSummary", "DiffResult", "StepMatch", "summarize_result", "summarize_run", "diff_runs", "match_steps", "NOISE_FRAC"]

NOISE_FRAC = 0.02


@dataclass
class RunSummary:
    """One run reduced to the numbers a diff needs. Times in ns; per-rank means unless stated."""

    label: str
    ranks: list[int]
    window_ns: float
    steps_per_rank: float
    step_p50_ns: float | None
    step_p90_ns: float | None
    tokens_per_s: float | None
    buckets: dict[str, float]  # exclusive time per bucket (categories, comm_wait/comm_transfer, idle), ns
    busy_ns: float
    collectives: pl.DataFrame  # coll_name, count, kernel_ns, transfer_ns, wait_ns (per-rank means)
    kernels: pl.DataFrame  # name, category, count, total_ns (per-rank means)
    power: dict[str, Any]
    quality: list[Quality] = field(default_factory=list)
    #: the job steps that count (:func:`tracekit.analysis.steptime.job_steps`: job, step_id, mode, tokens, step_ns)
    jobs: pl.DataFrame = field(default_factory=lambda: job_steps(pl.DataFrame()))

    @property
    def has_steps(self) -> bool:
        return self.steps_per_rank > 0

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.label, "ranks": self.ranks, "window_ns": self.window_ns,
            "steps_per_rank": self.steps_per_rank, "step_p50_ns": self.step_p50_ns, "step_p90_ns": self.step_p90_ns,
            "tokens_per_s": self.tokens_per_s, "busy_ns": self.busy_ns, "buckets_ns": self.buckets,
            "collectives": self.collectives.to_dicts(), "power": self.power,
            "quality": [q.to_json() for q in self.quality],
        }


@dataclass(frozen=True)
class StepMatch:
    """The steps a diff compares (module doc): how they were paired, how many, their p50/p90 on each side and the
    noise band a change must exceed (a fraction of the before p50)."""

    by: str  # "label" (the program's step numbers) | "ordinal" | "none"
    n: int  # paired steps of the before run's primary shape
    mode: str | None
    tokens: int | None
    before_p50_ns: float | None
    after_p50_ns: float | None
    before_p90_ns: float | None
    after_p90_ns: float | None
    noise_frac: float
    unpaired_before: int  # job steps of either run left out (not in the other run, or of another shape)
    unpaired_after: int

    @property
    def rel(self) -> float | None:
        if not self.before_p50_ns or self.after_p50_ns is None:
            return None
        return (self.after_p50_ns - self.before_p50_ns) / self.before_p50_ns

    def to_json(self) -> dict[str, Any]:
        return {"by": self.by, "n": self.n, "mode": self.mode, "tokens": self.tokens,
                "before_p50_ns": self.before_p50_ns, "after_p50_ns": self.after_p50_ns,
                "before_p90_ns": self.before_p90_ns, "after_p90_ns": self.after_p90_ns, "rel": self.rel,
                "noise_frac": self.noise_frac, "unpaired_before": self.unpaired_before,
                "unpaired_after": self.unpaired_after}


def _se_median(x: pl.Series) -> float:
    """Standard error of a median from the MAD (normal errors): 1.2533 × 1.4826 × MAD / √n; 0 for one value."""
    n = x.len()
    if n < 2:
        return 0.0
    med = p50(x)
    mad = p50((x.cast(pl.Float64) - med).abs())
    return float(1.2533 * 1.4826 * mad / n ** 0.5)


def match_steps(b: pl.DataFrame, a: pl.DataFrame, noise_frac: float = 0.02) -> StepMatch:
    """Pair the job steps of two runs (module doc) and compare their step times; ``b``/``a``: :func:`job_steps`
    tables of the before and after run."""
    none = StepMatch("none", 0, None, None, None, None, None, None, noise_frac, b.height, a.height)
    if b.height == 0 or a.height == 0:
        return none
    ib, ia = set(b["step_id"].drop_nulls().to_list()), set(a["step_id"].drop_nulls().to_list())
    common = ib & ia
    cols = ["job", "step_id", "mode", "tokens", "step_ns"]
    if common and len(common) >= 0.5 * min(b.height, a.height):
        by = "label"
        pairs = (b.select(cols).filter(pl.col("step_id").is_in(list(common))).unique("step_id", keep="first")
                 .join(a.select("step_id", pl.col("step_ns").alias("after_ns")).unique("step_id", keep="first"), on="step_id"))
    else:
        by, n = "ordinal", min(b.height, a.height)
        pairs = b.select(cols).sort("job").head(n).with_columns(a.sort("job").head(n)["step_ns"].alias("after_ns"))
    mode, tokens = primary_shape(pairs)
    shaped = of_shape(pairs, mode, tokens)
    xb, xa = shaped["step_ns"].cast(pl.Float64), shaped["after_ns"].cast(pl.Float64)
    pb, pa = p50(xb), p50(xa)
    band = 2.0 * (_se_median(xb) ** 2 + _se_median(xa) ** 2) ** 0.5 / pb if pb > 0 else 0.0
    return StepMatch(by, shaped.height, mode, tokens, pb, pa, quantile(xb, 0.9), quantile(xa, 0.9),
                     max(noise_frac, band), b.height - shaped.height, a.height - shaped.height)


@dataclass
class DiffResult:
    """``categories``/``kernels``/``collectives`` tables with before, after, delta (ns on ``basis``)."""

    before: RunSummary
    after: RunSummary
    basis: str  # "per_step" | "per_window"
    scalars: pl.DataFrame  # metric, unit, before, after, delta, rel
    categories: pl.DataFrame  # bucket, before_ns, after_ns, delta_ns, rel, before_share, after_share
    collectives: pl.DataFrame  # coll_name, count_*, transfer_*_ns, wait_*_ns, delta columns
    kernels: pl.DataFrame  # match, name, category, count_before, count_after, before_ns, after_ns, delta_ns, rel
    verdict: list[str]
    quality: list[Quality] = field(default_factory=list)
    steps: StepMatch | None = None

    def notes(self) -> list[tuple[Quality, str]]:
        """Every note once, with whose it is: the comparison's (``""``), one run's (its label), or ``"both runs"``
        when the two analyses flag the same thing in the same words (each view prints this list, never the three
        lists one after another)."""
        out: list[tuple[Quality, str]] = [(q, "") for q in self.quality]
        seen_b = {(q.code, q.message, q.rank) for q in self.before.quality}
        seen_a = {(q.code, q.message, q.rank) for q in self.after.quality}
        for q in self.before.quality:
            out.append((q, "both runs" if (q.code, q.message, q.rank) in seen_a else self.before.label))
        out += [(q, self.after.label) for q in self.after.quality if (q.code, q.message, q.rank) not in seen_b]
        keep: list[tuple[Quality, str]] = []
        for q, who in out:  # a run that flags the same thing twice (two ranks' identical words) shows it once
            if not any(k.code == q.code and k.message == q.message and kw == who for k, kw in keep):
                keep.append((q, who))
        return keep

    def to_json(self) -> dict[str, Any]:
        return {
            "basis": self.basis,
            "steps": self.steps.to_json() if self.steps is not None else None,
            "before": self.before.to_json(),
            "after": self.after.to_json(),
            "scalars": self.scalars.to_dicts(),
            "categories": self.categories.to_dicts(),
            "collectives": self.collectives.to_dicts(),
            "kernels": self.kernels.to_dicts(),
            "verdict": list(self.verdict),
            "quality": [q.to_json() for q in self.quality],
        }


# --------------------------------------------------------------------------------------------- one run
# A run is its analysis result (tracekit.analysis.result.AnalysisResult): the same window (profiler
# windows, transient trim), the same collective matching (wait/transfer as defined in
# tracekit.core.collectives), the same step table and tokens/s as `tracekit analyze`.


def _buckets(res: AnalysisResult) -> tuple[dict[str, float], float, float]:
    t = res.breakdown
    if t.height == 0:
        return {}, 0.0, 0.0
    cols = list(res.buckets) + ["idle"]
    means = t.select([pl.col(c).cast(pl.Float64).mean().alias(c) for c in cols + ["window_ns", "gpu_busy_ns"]]).row(0, named=True)
    return {c: float(means[c] or 0.0) for c in cols}, float(means["window_ns"] or 0.0), float(means["gpu_busy_ns"] or 0.0)


def _steps(res: AnalysisResult) -> tuple[float, float | None, float | None, float | None]:
    """Steps per rank and the one step time (:meth:`AnalysisResult.step_time`: p50, p90, tokens/s), as analyze."""
    st = res.step_time()
    if st is None:
        return res.steps_per_rank(), None, None, None
    return res.steps_per_rank(), st.p50_ns, st.p90_ns, st.tokens_per_s


def _in_spans(df: pl.DataFrame, spans: tuple[tuple[int, int], ...]) -> pl.DataFrame:
    if not spans:
        return df
    inside = pl.lit(False)
    for a, b in spans:
        inside = inside | ((pl.col("ts_ns") >= a) & (pl.col("ts_ns") < b))
    return df.filter(inside)


def _power(counters: pl.DataFrame | None, res: AnalysisResult) -> dict[str, Any]:
    """Counter means inside the analysis window (its profiler windows); busy power and verdicts from the result."""
    out: dict[str, Any] = {}
    if counters is not None and counters.height:
        c = _in_spans(counters.filter(pl.col("kind").cast(pl.String) == "counter"), res.spans)
        for name in ("power_w", "sm_active_pct", "tensor_active_pct", "gpc_clock_mhz", "pcie_rx_pct", "pcie_tx_pct"):
            s = c.filter(pl.col("name").cast(pl.String) == name)
            if s.height:
                out[name] = float(s.group_by("rank").agg(pl.col("value").mean())["value"].mean())  # type: ignore[arg-type]
    pw = res.sections.power
    per = pw.per_rank if not isinstance(pw, UnsetType) else ()
    if "power_w" in out and per:
        busy = [r.power_busy_w for r in per if r.power_busy_w is not None]
        if busy:
            out["power_busy_w"] = float(sum(busy) / len(busy))
        out["verdict_codes"] = sorted({str(r.verdict_code) for r in per if r.verdict_code})
    return out


def _kernels(res: AnalysisResult) -> pl.DataFrame:
    t = res.kernel_totals
    n_ranks = max(len(res.ranks), 1)
    if t.height == 0:
        return pl.DataFrame(schema={"name": pl.String, "category": pl.String, "count": pl.Float64, "total_ns": pl.Float64})
    return (
        t.group_by(pl.col("name").cast(pl.String), pl.col("category").cast(pl.String).fill_null("other_compute"))
        .agg(pl.col("count").sum(), pl.col("total_ns").sum())
        .with_columns((pl.col("count") / n_ranks).alias("count"), (pl.col("total_ns") / n_ranks).alias("total_ns"))
    )


def _coll_summary(inst: pl.DataFrame | None, n_ranks: int) -> pl.DataFrame:
    """Per collective name, per-rank means of count, kernel, transfer and wait time (the matching's own definitions)."""
    empty = pl.DataFrame(schema={"coll_name": pl.String, "count": pl.Float64, "kernel_ns": pl.Float64,
                                 "transfer_ns": pl.Float64, "wait_ns": pl.Float64})
    if inst is None or inst.height == 0:
        return empty
    n_ranks = max(n_ranks, 1)
    return (
        inst.group_by(pl.col("coll_name").cast(pl.String).fill_null("collective"))
        .agg(pl.len().alias("count"), pl.col("dur_ns").sum().alias("kernel_ns"), pl.col("transfer_ns").sum().alias("transfer_ns"),
             pl.col("wait_ns").sum().alias("wait_ns"))
        .with_columns([(pl.col(c).cast(pl.Float64) / n_ranks).alias(c) for c in ("count", "kernel_ns", "transfer_ns", "wait_ns")])
        .sort("kernel_ns", descending=True)
    )


def summarize_result(res: AnalysisResult, *, label: str = "run", counters: pl.DataFrame | None = None) -> RunSummary:
    """Reduce one :class:`~tracekit.analysis.result.AnalysisResult` to a :class:`RunSummary`.

    ``counters``: the trace's counter rows (power, SM activity; read only inside the result's window)."""
    q = QualityLog()
    for d in res.sections.quality:
        q.add(d.code, d.message, severity=d.severity, rank=None if isinstance(d.rank, UnsetType) else d.rank)
    buckets, window_ns, busy = _buckets(res)
    steps, p50, p90, tps = _steps(res)
    if res.kernel_totals.height == 0:
        q.add("diff_no_gpu_ops", f"{label}: no GPU ops; nothing to compare")
    return RunSummary(
        label=label, ranks=res.ranks, window_ns=window_ns, steps_per_rank=steps, step_p50_ns=p50, step_p90_ns=p90,
        tokens_per_s=tps, buckets=buckets, busy_ns=busy, collectives=_coll_summary(res.instances, len(res.ranks)),
        kernels=_kernels(res), power=_power(counters, res), quality=list(q), jobs=res.job_steps(),
    )


def summarize_run(df: pl.DataFrame, meta: Mapping[str, Any] | None = None, *, label: str = "run") -> RunSummary:
    """Analyze one finalized trace frame (all ranks) and reduce it to a :class:`RunSummary`."""
    from tracekit.analysis.stage.pipeline import FrameSource, run_analysis
    from tracekit.schema import as_trace_meta

    res = run_analysis(FrameSource(df), as_trace_meta(meta))  # a summary reads no advice: no next-win replay
    return summarize_result(res, label=label, counters=df.filter(pl.col("kind").cast(pl.String) == "counter"))


# --------------------------------------------------------------------------------------------- two runs
def _rel(b: float | None, a: float | None) -> float | None:
    if b is None or a is None or b == 0:
        return None
    return (a - b) / b


def _scale(s: RunSummary, basis: str) -> float:
    return 1.0 / s.steps_per_rank if basis == "per_step" and s.steps_per_rank else 1.0


def _match_kernels(b: RunSummary, a: RunSummary, sb: float, sa: float, top: int, min_rel: float) -> pl.DataFrame:
    """Top changes (|delta| first); rows changing by less than ``min_rel`` of their before time are left out."""
    kb = b.kernels.select("name", "category", pl.col("count").alias("count_before"), (pl.col("total_ns") * sb).alias("before_ns"))
    ka = a.kernels.select("name", "category", pl.col("count").alias("count_after"), (pl.col("total_ns") * sa).alias("after_ns"))
    # a name's category can differ between runs only through rules; match on name, keep the before category
    nb = kb.group_by("name").agg(pl.col("category").first(), pl.col("count_before").sum(), pl.col("before_ns").sum())
    na = ka.group_by("name").agg(pl.col("category").first().alias("category_a"), pl.col("count_after").sum(),
                                 pl.col("after_ns").sum())
    j = nb.join(na, on="name", how="full", coalesce=True)
    both = j.filter(pl.col("before_ns").is_not_null() & pl.col("after_ns").is_not_null()).select(
        pl.lit("name").alias("match"), "name", "category", "count_before", "count_after", "before_ns", "after_ns")
    only = j.filter(pl.col("before_ns").is_null() | pl.col("after_ns").is_null()).with_columns(
        pl.coalesce("category", "category_a").alias("category"))
    by_cat = only.group_by("category").agg(
        pl.col("count_before").sum(), pl.col("count_after").sum(),
        pl.col("before_ns").sum(), pl.col("after_ns").sum(),
        pl.col("name").filter(pl.col("before_ns").is_not_null()).n_unique().alias("_nb"),
        pl.col("name").filter(pl.col("after_ns").is_not_null()).n_unique().alias("_na"),
    ).select(
        pl.lit("category").alias("match"),
        pl.format("[{} kernels: {} name(s) only before, {} only after]", pl.col("category"), pl.col("_nb"), pl.col("_na")).alias("name"),
        "category", "count_before", "count_after", "before_ns", "after_ns",
    )
    out = pl.concat([both, by_cat], how="vertical_relaxed").with_columns(
        pl.col("before_ns").fill_null(0.0), pl.col("after_ns").fill_null(0.0),
        pl.col("count_before").fill_null(0).cast(pl.Float64), pl.col("count_after").fill_null(0).cast(pl.Float64),
    ).with_columns(
        (pl.col("after_ns") - pl.col("before_ns")).alias("delta_ns"),
        pl.when(pl.col("before_ns") > 0).then((pl.col("after_ns") - pl.col("before_ns")) / pl.col("before_ns")).alias("rel"),
    )
    changed = (pl.col("before_ns") == 0) | (pl.col("delta_ns").abs() >= min_rel * pl.col("before_ns"))
    out = out.filter((pl.col("delta_ns") != 0) & changed)
    return out.sort([pl.col("delta_ns").abs(), pl.col("name")], descending=[True, False]).head(top)


def _categories(b: RunSummary, a: RunSummary, sb: float, sa: float) -> pl.DataFrame:
    order = list(dict.fromkeys(list(b.buckets) + list(a.buckets)))
    rows = []
    for k in order:
        vb, va = b.buckets.get(k, 0.0) * sb, a.buckets.get(k, 0.0) * sa
        rows.append({
            "bucket": k, "before_ns": vb, "after_ns": va, "delta_ns": va - vb, "rel": _rel(vb, va),
            "before_share": b.buckets.get(k, 0.0) / b.window_ns if b.window_ns else None,
            "after_share": a.buckets.get(k, 0.0) / a.window_ns if a.window_ns else None,
        })
    schema = {"bucket": pl.String, "before_ns": pl.Float64, "after_ns": pl.Float64, "delta_ns": pl.Float64,
              "rel": pl.Float64, "before_share": pl.Float64, "after_share": pl.Float64}
    return pl.DataFrame(rows, schema=schema)


def _collectives(b: RunSummary, a: RunSummary, sb: float, sa: float) -> pl.DataFrame:
    cols = ("count", "kernel_ns", "transfer_ns", "wait_ns")
    cb = b.collectives.select("coll_name", *[(pl.col(c) * (1.0 if c == "count" else sb)).alias(f"{c}_before") for c in cols])
    ca = a.collectives.select("coll_name", *[(pl.col(c) * (1.0 if c == "count" else sa)).alias(f"{c}_after") for c in cols])
    j = cb.join(ca, on="coll_name", how="full", coalesce=True)
    return j.with_columns(
        [pl.col(f"{c}_{s}").fill_null(0.0) for c in cols for s in ("before", "after")]
    ).with_columns(
        [(pl.col(f"{c}_after") - pl.col(f"{c}_before")).alias(f"{c}_delta") for c in cols[1:]]
    ).sort("kernel_ns_before", descending=True)


def _scalars(b: RunSummary, a: RunSummary, m: StepMatch) -> pl.DataFrame:
    """The summary table; step p50/p90 are the paired steps' (:func:`match_steps`), the figures the verdict reads."""
    paired = m.n > 0
    rows = [
        ("window", "ms", b.window_ns / 1e6, a.window_ns / 1e6),
        ("gpu_busy", "ms", b.busy_ns / 1e6, a.busy_ns / 1e6),
        ("steps_per_rank", "", b.steps_per_rank or None, a.steps_per_rank or None),
        ("steps_compared", "", float(m.n) if paired else None, float(m.n) if paired else None),
        ("step_p50", "ms", _ms(m.before_p50_ns if paired else b.step_p50_ns), _ms(m.after_p50_ns if paired else a.step_p50_ns)),
        ("step_p90", "ms", _ms(m.before_p90_ns if paired else b.step_p90_ns), _ms(m.after_p90_ns if paired else a.step_p90_ns)),
        ("tokens_per_s", "tok/s", b.tokens_per_s, a.tokens_per_s),
    ]
    for k, unit in (("power_w", "W"), ("power_busy_w", "W"), ("sm_active_pct", "%"), ("tensor_active_pct", "%"),
                    ("gpc_clock_mhz", "MHz"), ("pcie_rx_pct", "%"), ("pcie_tx_pct", "%")):
        if k in b.power or k in a.power:
            rows.append((k, unit, b.power.get(k), a.power.get(k)))
    if b.tokens_per_s and a.tokens_per_s and "power_w" in b.power and "power_w" in a.power:
        rows.append(("energy_per_token", "mJ/tok", b.power["power_w"] / b.tokens_per_s * 1e3,
                     a.power["power_w"] / a.tokens_per_s * 1e3))
    out = [{"metric": m, "unit": u, "before": vb, "after": va,
            "delta": (va - vb) if vb is not None and va is not None else None, "rel": _rel(vb, va)}
           for m, u, vb, va in rows]
    return pl.DataFrame(out, schema={"metric": pl.String, "unit": pl.String, "before": pl.Float64, "after": pl.Float64,
                                     "delta": pl.Float64, "rel": pl.Float64})


def _ms(ns: float | None) -> float | None:
    return None if ns is None else ns / 1e6


def _times(before: float, after: float, better: str = "faster", worse: str = "slower") -> str:
    """A change of a cost (time, energy) as a factor: ``3.06× faster`` for 3.06× less, ``1.25× slower`` for 1.25× more."""
    if after <= 0 or before <= 0:
        return "unchanged"
    return f"{before / after:.2f}× {better}" if after < before else f"{after / before:.2f}× {worse}"


def _pct(r: float) -> str:
    return f"{r * 100:+.1f}%"


def _verdict(d: DiffResult, noise: float) -> list[str]:
    b, a, unit = d.before, d.after, ("ms/step" if d.basis == "per_step" else "ms")
    out: list[str] = []
    m = d.steps
    if m is not None and m.before_p50_ns and m.after_p50_ns:
        r = m.rel or 0.0
        what = (f"p50 {m.before_p50_ns / 1e6:.3f} → {m.after_p50_ns / 1e6:.3f} ms over {m.n} step{'s' if m.n != 1 else ''} "
                f"paired by {'step number' if m.by == 'label' else 'order'}; noise band ±{m.noise_frac * 100:.1f}%")
        head = (f"no significant change in step time ({what})" if abs(r) < m.noise_frac else
                f"{a.label} is {_times(m.before_p50_ns, m.after_p50_ns)} per step (step {r * 100:+.0f}%: {what})")
    else:
        sb, sa = _scale(b, d.basis), _scale(a, d.basis)
        vb, va = b.busy_ns * sb, a.busy_ns * sa
        r = _rel(vb, va) or 0.0
        head = (f"no significant change in GPU busy time ({vb / 1e6:.2f} → {va / 1e6:.2f} {unit})" if abs(r) < noise else
                f"GPU busy time {'down' if r < 0 else 'up'} {abs(r) * 100:.1f}% in {a.label} "
                f"({vb / 1e6:.2f} → {va / 1e6:.2f} {unit})")
    out.append(head)
    cats = d.categories.filter(pl.col("bucket") != "idle")
    total = float(cats["delta_ns"].abs().sum() or 0.0)
    sig = cats.filter(pl.col("delta_ns").abs() >= max(noise * float(cats["before_ns"].sum() or 0.0), 1.0)).sort(
        pl.col("delta_ns").abs(), descending=True).head(3)
    if sig.height and total > 0:
        parts = [f"{r['bucket']} {r['delta_ns'] / 1e6:+.3f} {unit}" + (f" ({_pct(r['rel'])})" if r["rel"] is not None else "")
                 for r in sig.to_dicts()]
        out.append("largest changes by category: " + ", ".join(parts))
    idle = d.categories.filter(pl.col("bucket") == "idle")
    if idle.height:
        r0 = idle.row(0, named=True)
        if r0["before_ns"] and abs(r0["delta_ns"]) >= noise * max(r0["before_ns"], 1.0) and abs(r0["delta_ns"]) > 0.1 * total:
            out.append(f"GPU idle time {r0['delta_ns'] / 1e6:+.3f} {unit}: host/launch-side change")
    if b.tokens_per_s and a.tokens_per_s:
        r = (a.tokens_per_s - b.tokens_per_s) / b.tokens_per_s
        if abs(r) >= noise:
            out.append(f"throughput {b.tokens_per_s:,.0f} → {a.tokens_per_s:,.0f} tokens/s ({a.tokens_per_s / b.tokens_per_s:.2f}×, {_pct(r)})")
        pb, pa = b.power.get("power_w"), a.power.get("power_w")
        if pb and pa:  # energy per token from the same windows' power and tokens/s as analyze
            eb, ea = pb / b.tokens_per_s * 1e3, pa / a.tokens_per_s * 1e3
            if abs(ea - eb) >= noise * eb:
                out.append(f"energy per token {eb:,.1f} → {ea:,.1f} mJ/token ({_times(eb, ea, 'less', 'more')} energy)")
    if d.collectives.height:
        tw = d.collectives.select(pl.col("wait_ns_delta").sum(), pl.col("transfer_ns_delta").sum()).row(0)
        kb = float(d.collectives["kernel_ns_before"].sum() or 0.0)
        if kb and (abs(tw[0]) >= noise * kb or abs(tw[1]) >= noise * kb):
            out.append(f"collectives: transfer {tw[1] / 1e6:+.3f} {unit}, wait {tw[0] / 1e6:+.3f} {unit}"
                       + (" (waiting on slower ranks changed more than the transfers)" if abs(tw[0]) > abs(tw[1]) else ""))
    if d.kernels.height:
        k = d.kernels.row(0, named=True)
        if abs(k["delta_ns"]) > 0 and (k["before_ns"] == 0 or abs(k["delta_ns"]) >= noise * k["before_ns"]):
            nm = k["name"] if len(k["name"]) <= 80 else k["name"][:77] + "..."
            out.append(f"kernel that changed most: {nm} {k['delta_ns'] / 1e6:+.3f} {unit}"
                       + (f" ({_pct(k['rel'])})" if k["rel"] is not None else ""))
    pb, pa = b.power.get("power_w"), a.power.get("power_w")
    if pb and pa and abs(pa - pb) / pb >= noise:
        out.append(f"mean power {pb:.0f} → {pa:.0f} W ({_pct((pa - pb) / pb)})")
    return out


def diff_runs(
    before: pl.DataFrame | RunSummary | AnalysisResult,
    after: pl.DataFrame | RunSummary | AnalysisResult,
    *,
    before_meta: Mapping[str, Any] | None = None,
    after_meta: Mapping[str, Any] | None = None,
    labels: tuple[str, str] = ("before", "after"),
    top: int = 15,
    noise_frac: float = NOISE_FRAC,
) -> DiffResult:
    """Compare two runs (analysis results, frames or summaries); see the module docstring."""

    def one(x: pl.DataFrame | RunSummary | AnalysisResult, meta: Mapping[str, Any] | None, label: str) -> RunSummary:
        if isinstance(x, RunSummary):
            return x
        if isinstance(x, AnalysisResult):
            return summarize_result(x, label=label)
        return summarize_run(x, meta, label=label)

    b = one(before, before_meta, labels[0])
    a = one(after, after_meta, labels[1])
    q = QualityLog()
    basis = "per_step" if b.has_steps and a.has_steps else "per_window"
    if basis == "per_window" and b.window_ns and a.window_ns and abs(a.window_ns - b.window_ns) > 0.1 * b.window_ns:
        q.add("diff_windows_differ", f"analysis windows differ ({b.window_ns / 1e6:.1f} vs {a.window_ns / 1e6:.1f} ms) "
              "and there are no steps to normalize by; compare shares rather than times")
    if b.has_steps != a.has_steps:
        q.add("diff_steps_one_side", "only one run has step rows; times compared per window, not per step")
    if b.ranks and a.ranks and len(b.ranks) != len(a.ranks):
        q.add("diff_rank_count", f"runs have different rank counts ({len(b.ranks)} vs {len(a.ranks)}); times are per-rank means")
    from tracekit.compare.comparable import comparability_notes

    for code, msg in comparability_notes(before_meta, after_meta, before_kernels=b.kernels, after_kernels=a.kernels, labels=labels):
        q.add(code, msg)  # device / source format / workload shape differ: say what the comparison still means
    sb, sa = _scale(b, basis), _scale(a, basis)
    m = match_steps(b.jobs, a.jobs, noise_frac)
    if m.n and (m.unpaired_before or m.unpaired_after):
        q.add("diff_steps_unpaired", f"step time compared over the {m.n} step(s) both runs hold "
              f"(paired by {'step number' if m.by == 'label' else 'order'}); left out: {m.unpaired_before} of "
              f"{b.label}'s, {m.unpaired_after} of {a.label}'s (in one run only, or of another shape)", severity="info")
    res = DiffResult(
        before=b, after=a, basis=basis, scalars=_scalars(b, a, m), categories=_categories(b, a, sb, sa),
        collectives=_collectives(b, a, sb, sa), kernels=_match_kernels(b, a, sb, sa, top, noise_frac / 2), verdict=[], quality=list(q),
        steps=m,
    )
    res.verdict = _verdict(res, noise_frac)
    return res
