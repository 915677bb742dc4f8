"""Power and utilization verdicts from telemetry counters (``power_w``, ``sm_active_pct``).

Per rank, inside its window (first → last GPU op): busy fraction (union of GPU ops
/ window), mean power over samples taken while the GPU was busy, that power as a
fraction of the power limit (metadata, else the GPU table), mean SM activity.
Verdict, first match wins:

* ``busy ≥ busy_frac`` and power < ``low_power_frac`` × limit → latency-bound or spin-waiting;
* power ≥ ``high_power_frac`` × limit → power-bound;
* ``busy < busy_frac`` → GPU mostly idle: host/launch-bound;
* otherwise → busy at moderate power.

Spin-waits: collective kernels ≥ ``spin_min_ns`` whose in-kernel mean power is
< ``low_power_frac`` × limit (spinning on peer flags draws little power while
counting as "utilized").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import polars as pl

from tracekit.core import intervals as iv
from tracekit.core._num import fdiv, seq_mean
from tracekit.core.collectives import collective_ops
from tracekit.analysis.findings import power_candidates
from tracekit.analysis.passes.gaps import gpu_ops
from tracekit.core.gpus import rank_gpu_info
from tracekit.analysis.registry import Analysis, FinishContext, Finished, PartContext, keyword_defaults, register
from tracekit.schema import TraceMeta

__all__ = ["PowerResult", "power_verdicts", "power_part", "power_finish"]


@dataclass
class PowerResult:
    """``per_rank`` (rank, busy_frac, power_busy_w, power_mean_w, power_limit_w, power_frac, sm_active_pct,
    samples, verdict_code, verdict); ``spin_waits`` (rank, start_ns, dur_ns, name, power_w, power_frac)."""

    per_rank: pl.DataFrame
    spin_waits: pl.DataFrame
    verdicts: list[str] = field(default_factory=list)
    has_counters: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "has_counters": self.has_counters,
            "per_rank": self.per_rank.to_dicts(),
            "spin_waits": {"count": self.spin_waits.height, "total_ns": int(self.spin_waits["dur_ns"].sum() or 0),
                           "largest": self.spin_waits.sort("dur_ns", descending=True, maintain_order=True).head(10).to_dicts()},
            "verdicts": list(self.verdicts),
        }


_EMPTY_SPIN = pl.DataFrame(schema={"rank": pl.Int64, "start_ns": pl.Int64, "dur_ns": pl.Int64, "name": pl.String,
                                   "power_w": pl.Float64, "power_frac": pl.Float64})


def _samples(df: pl.DataFrame, name: str) -> pl.DataFrame:
    return df.filter((pl.col("kind") == "counter") & (pl.col("name").cast(pl.String) == name)).select(
        pl.col("rank").cast(pl.Int64), pl.col("ts_ns").alias("ts"), "value"
    )


def power_part(
    df: pl.DataFrame,
    meta: TraceMeta | None = None,
    *,
    low_power_frac: float = 0.35,
    high_power_frac: float = 0.9,
    busy_frac: float = 0.5,
    spin_min_ns: int = 1_000_000,
    observed_ns: Mapping[int, int] | None = None,
) -> PowerResult:
    """Per-rank half of :func:`power_verdicts` for the ranks in ``df``: ``per_rank`` and ``spin_waits``
    rows, no ``verdicts`` (see :func:`power_finish`)."""
    pw = _samples(df, "power_w")
    if pw.height == 0:
        return PowerResult(pl.DataFrame(), _EMPTY_SPIN, [], False)
    ranks = sorted(set(pw["rank"].to_list()))
    lim = pl.DataFrame({"rank": ranks, "power_limit_w": [rank_gpu_info(meta, r)["power_limit_w"] for r in ranks]},
                       schema={"rank": pl.Int64, "power_limit_w": pl.Float64})
    per = _rank_figures(df, pw, lim, observed_ns)
    per = _with_verdicts(per, low_power_frac=low_power_frac, high_power_frac=high_power_frac, busy_frac=busy_frac)
    return PowerResult(per, _spin_waits(df, pw, lim, low_power_frac=low_power_frac, spin_min_ns=spin_min_ns), [], True)


def _rank_figures(df: pl.DataFrame, pw: pl.DataFrame, lim: pl.DataFrame, observed_ns: Mapping[int, int] | None) -> pl.DataFrame:
    """Per rank, inside its window (first → last GPU op): busy fraction, mean power while busy and overall, that
    power as a fraction of the limit, mean SM activity."""
    ops = gpu_ops(df, []).select("rank", "start", "end")
    win = ops.group_by("rank").agg(pl.col("start").min().alias("lo"), pl.col("end").max().alias("hi"))
    busy = iv.merge(ops, by="rank")
    busy_len = busy.group_by("rank").agg((pl.col("end") - pl.col("start")).sum().alias("busy"))
    in_win = pl.col("lo").is_null() | ((pl.col("ts") >= pl.col("lo")) & (pl.col("ts") < pl.col("hi")))
    pw_w = pw.join(win, on="rank", how="left").filter(in_win).drop(["lo", "hi"])
    inb = iv.covered_by(pw_w, busy.with_columns(pl.lit(True).alias("in_busy")), by="rank", at="ts", payload=["in_busy"])
    agg = inb.group_by("rank").agg(
        seq_mean(pl.col("value").filter(pl.col("in_busy").fill_null(False))).alias("power_busy_w"),
        seq_mean(pl.col("value")).alias("power_mean_w"),
        pl.len().alias("samples"),
    )
    smm = _samples(df, "sm_active_pct").join(win, on="rank", how="left").filter(in_win).group_by("rank").agg(
        seq_mean(pl.col("value")).alias("sm_active_pct"))
    recorded = (pl.col("rank").replace_strict({int(k): int(v) for k, v in observed_ns.items()}, default=None, return_dtype=pl.Int64)
                if observed_ns else (pl.col("hi") - pl.col("lo")))
    return (
        agg.join(lim, on="rank", how="left").join(win, on="rank", how="left").join(busy_len, on="rank", how="left")
        .join(smm, on="rank", how="left")
        .with_columns(
            fdiv(pl.col("busy"), recorded).alias("busy_frac"),
            fdiv(pl.coalesce("power_busy_w", "power_mean_w"), pl.col("power_limit_w")).alias("power_frac"),
        )
    )


def _with_verdicts(per: pl.DataFrame, *, low_power_frac: float, high_power_frac: float, busy_frac: float) -> pl.DataFrame:
    """Each rank's verdict code (first match wins: module doc) and its sentence."""
    pct = (pl.col("power_frac") * 100).round(0).cast(pl.Int64).cast(pl.String)
    bpct = (pl.col("busy_frac") * 100).round(0).cast(pl.Int64).cast(pl.String)
    code = (
        pl.when(pl.col("power_frac").is_null() | pl.col("busy_frac").is_null()).then(pl.lit("unknown"))
        .when((pl.col("busy_frac") >= busy_frac) & (pl.col("power_frac") < low_power_frac)).then(pl.lit("latency_or_spin"))
        .when(pl.col("power_frac") >= high_power_frac).then(pl.lit("power_bound"))
        .when(pl.col("busy_frac") < busy_frac).then(pl.lit("mostly_idle"))
        .otherwise(pl.lit("busy_moderate_power"))
    )
    text = (
        pl.when(pl.col("verdict_code") == "latency_or_spin").then(
            pl.lit("GPU at ") + pct + pl.lit("% of its power limit while ") + bpct
            + pl.lit("% busy: kernels are latency-bound or spin-waiting"))
        .when(pl.col("verdict_code") == "power_bound").then(
            pl.lit("GPU at ") + pct + pl.lit("% of its power limit: power-bound, clocks may throttle"))
        .when(pl.col("verdict_code") == "mostly_idle").then(
            pl.lit("GPU busy only ") + bpct + pl.lit("% of the time (at ") + pct
            + pl.lit("% of its power limit): host- or launch-bound"))
        .when(pl.col("verdict_code") == "busy_moderate_power").then(
            pl.lit("GPU ") + bpct + pl.lit("% busy at ") + pct + pl.lit("% of its power limit"))
        .otherwise(pl.lit("power limit or GPU activity unknown"))
    )
    return per.with_columns(code.alias("verdict_code")).with_columns(
        (pl.lit("rank ") + pl.col("rank").cast(pl.String) + pl.lit(": ") + text).alias("verdict")
    ).select("rank", "busy_frac", "power_busy_w", "power_mean_w", "power_limit_w", "power_frac", "sm_active_pct",
             "samples", "verdict_code", "verdict").sort("rank")


def _spin_waits(df: pl.DataFrame, pw: pl.DataFrame, lim: pl.DataFrame, *, low_power_frac: float, spin_min_ns: int) -> pl.DataFrame:
    """Long collective kernels (≥ ``spin_min_ns``) during which the GPU drew under ``low_power_frac`` of its limit."""
    coll = collective_ops(df).filter(pl.col("dur_ns") >= spin_min_ns).select(
        pl.col("rank").cast(pl.Int64), pl.col("ts_ns").alias("start"), (pl.col("ts_ns") + pl.col("dur_ns")).alias("end"),
        pl.col("name").cast(pl.String).alias("name"),
    ).with_row_index("_k")
    if not coll.height:
        return _EMPTY_SPIN
    inside = iv.covered_by(pw, coll, by="rank", at="ts", payload=["_k"]).filter(pl.col("_k").is_not_null())
    kp = inside.group_by("_k").agg(seq_mean(pl.col("value")).alias("power_w"))
    return (
        coll.join(kp, on="_k", how="inner").join(lim, on="rank", how="left")
        .with_columns(fdiv(pl.col("power_w"), pl.col("power_limit_w")).alias("power_frac"))
        .filter(pl.col("power_frac") < low_power_frac)
        .select("rank", pl.col("start").alias("start_ns"), (pl.col("end") - pl.col("start")).alias("dur_ns"), "name", "power_w", "power_frac")
        .sort(["rank", "start_ns"], maintain_order=True)
    )


def power_finish(parts: list[PowerResult], *, low_power_frac: float = 0.35, spin_min_ns: int = 1_000_000) -> PowerResult:
    """All ranks' :func:`power_part` results → one :class:`PowerResult` with the verdict sentences."""
    have = [p for p in parts if p.has_counters]
    if not have:
        return PowerResult(pl.DataFrame(), _EMPTY_SPIN, [], False)
    per = pl.concat([p.per_rank for p in have], how="vertical_relaxed").sort("rank", maintain_order=True)
    spin = pl.concat([_EMPTY_SPIN, *[p.spin_waits for p in have]], how="vertical_relaxed").sort(["rank", "start_ns"], maintain_order=True)
    verdicts = per.filter(pl.col("verdict_code") != "unknown")["verdict"].to_list()
    if spin.height:
        verdicts.append(
            f"{spin.height} collective kernel(s) ≥ {spin_min_ns / 1e6:g} ms ran at < {low_power_frac:.0%} of the power limit "
            f"({float(spin['dur_ns'].sum()) / 1e6:.1f} ms in total): spin-waiting on peers, not transferring"
        )
    return PowerResult(per, spin, verdicts, True)


def power_verdicts(
    df: pl.DataFrame,
    meta: TraceMeta | None = None,
    *,
    low_power_frac: float = 0.35,
    high_power_frac: float = 0.9,
    busy_frac: float = 0.5,
    spin_min_ns: int = 1_000_000,
    observed_ns: Mapping[int, int] | None = None,
) -> PowerResult:
    """Verdicts per rank (module doc); ``has_counters`` False and empty frames when no ``power_w`` samples.

    ``observed_ns``: per-rank observed time (sum of profiler windows of a windowed capture) used as the
    denominator of ``busy_frac`` instead of first-op-to-last-op. :func:`power_part` (per rank) →
    :func:`power_finish`; here both on the whole frame.
    """
    part = power_part(df, meta, low_power_frac=low_power_frac, high_power_frac=high_power_frac, busy_frac=busy_frac,
                      spin_min_ns=spin_min_ns, observed_ns=observed_ns)
    return power_finish([part], low_power_frac=low_power_frac, spin_min_ns=spin_min_ns)


# --- the ``power`` analysis (tracekit.analysis.registry) ------------------------------------------------------------

def _part(df: pl.DataFrame, ctx: PartContext) -> PowerResult:
    return power_part(df, ctx.meta, observed_ns=ctx.observed, **ctx.options)


def _finish(parts: list[PowerResult], ctx: FinishContext) -> Finished:
    pw = power_finish(parts, low_power_frac=ctx.options["low_power_frac"], spin_min_ns=ctx.options["spin_min_ns"])
    return Finished({"power": pw.to_json()}, pw)


ANALYSIS = register(Analysis(
    "power", ("power",), ("rank", "kind", "ts_ns", "dur_ns", "name", "category", "family", "value"),
    _part, _finish, lambda ctx: power_candidates(ctx.result.value.verdicts),
    options=keyword_defaults(power_part, exclude=("observed_ns",)), order=40))
