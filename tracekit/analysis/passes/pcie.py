"""PCIe-bound phases: stretches where a rank's PCIe link runs near capacity.

Sources, in order (telemetry.md §5):

1. counters ``pcie_rx_bytes_per_s`` / ``pcie_tx_bytes_per_s`` (bytes/s, compared with
   the link's per-direction capacity) or ``pcie_rx_pct`` / ``pcie_tx_pct`` (percent
   of link, e.g. nsys ``PCIe RX Throughput``): a phase is ≥ ``min_samples``
   consecutive samples at ≥ ``threshold`` of the link;
2. otherwise memcpy events (HtoD, DtoH, PtoP): copies of one direction merged when
   less than ``merge_gap_ns`` apart, a phase when the merged throughput is
   ≥ ``threshold`` of the link and it lasts ≥ ``min_phase_ns``;
3. on PCIe-only GPUs (no NVLink, from metadata or the GPU table) also collective
   kernels whose bus bandwidth is ≥ ``threshold`` of the link (their traffic
   crosses PCIe).

Each phase: rank, start_ns, dur_ns, direction, achieved_bytes_per_s, pct_of_link,
source, during (the kernels/copies that overlapped it most, by overlapped time).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from tracekit.core import intervals as iv
from tracekit.core._num import fdiv, seq_mean
from tracekit.analysis.findings import pcie_candidates
from tracekit.analysis.passes.gaps import gpu_ops
from tracekit.core.gpus import rank_gpu_info
from tracekit.analysis.registry import Analysis, FinishContext, Finished, PartContext, keyword_defaults, records, register
from tracekit.schema import TraceMeta

__all__ = ["pcie_phases", "pcie_part", "pcie_finish", "PciePart", "PHASE_COLUMNS"]

PHASE_COLUMNS: dict[Any, Any] = {
    "rank": pl.Int64, "start_ns": pl.Int64, "dur_ns": pl.Int64, "direction": pl.String,
    "achieved_bytes_per_s": pl.Float64, "pct_of_link": pl.Float64, "source": pl.String, "during": pl.List(pl.String),
}

_DIR = {"HtoD": "rx", "DtoH": "tx", "PtoP": "p2p"}


def _link_table(df: pl.DataFrame, meta: TraceMeta | None) -> pl.DataFrame:
    ranks = sorted(int(r) for r in df.get_column("rank").unique().to_list())
    info = [rank_gpu_info(meta, r) for r in ranks]
    return pl.DataFrame(
        {"rank": ranks, "link": [i["pcie_bw_bytes_per_s"] for i in info], "nvlink": [i["has_nvlink"] for i in info]},
        schema={"rank": pl.Int64, "link": pl.Float64, "nvlink": pl.Boolean},
    )


def _from_counters(df: pl.DataFrame, links: pl.DataFrame, threshold: float, min_samples: int) -> pl.DataFrame:
    c = df.filter(pl.col("kind") == "counter").with_columns(pl.col("name").cast(pl.String).alias("_n")).filter(
        pl.col("_n").str.contains(r"^pcie_(rx|tx)_(bytes_per_s|pct)$")
    )
    if c.height == 0:
        return pl.DataFrame(schema=PHASE_COLUMNS)
    c = c.select(
        pl.col("rank").cast(pl.Int64), "ts_ns", "value",
        pl.col("_n").str.extract(r"^pcie_(rx|tx)_", 1).alias("direction"),
        pl.col("_n").str.ends_with("_pct").alias("is_pct"),
    ).join(links, on="rank", how="left")
    frac = pl.when(pl.col("is_pct")).then(pl.col("value") / 100.0).otherwise(fdiv(pl.col("value"), pl.col("link")))
    rate = pl.when(pl.col("is_pct")).then(pl.col("value") / 100.0 * pl.col("link")).otherwise(pl.col("value"))
    rate = pl.when(pl.col("link").is_not_null() & (rate > pl.col("link"))).then(pl.col("link")).otherwise(rate)  # never above the link
    c = c.with_columns(frac.alias("frac"), rate.alias("rate")).filter(pl.col("frac").is_not_null()).sort(["rank", "direction", "ts_ns"])
    key = ["rank", "direction"]
    c = c.with_columns(
        (pl.col("frac") >= threshold).alias("hi"),
        pl.col("ts_ns").diff().over(key).median().over(key).round(0).cast(pl.Int64).alias("period"),
    ).with_columns((pl.col("hi") != pl.col("hi").shift(1).over(key)).fill_null(True).cum_sum().over(key).alias("run"))
    runs = c.filter(pl.col("hi")).group_by(key + ["run"]).agg(
        pl.col("ts_ns").min().alias("start_ns"),
        (pl.col("ts_ns").max() + pl.col("period").first().fill_null(0)).alias("end_ns"),
        pl.len().alias("n"),
        seq_mean(pl.col("rate")).alias("achieved_bytes_per_s"),
        (seq_mean(pl.col("frac")) * 100).alias("pct_of_link"),
    ).filter(pl.col("n") >= min_samples)
    return runs.select(
        "rank", "start_ns", (pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns"), "direction",
        "achieved_bytes_per_s", pl.col("pct_of_link").cast(pl.Float64), pl.lit("counter").alias("source"),
    )


def _from_memcpy(df: pl.DataFrame, links: pl.DataFrame, threshold: float, merge_gap_ns: int, min_phase_ns: int) -> pl.DataFrame:
    m = df.filter((pl.col("kind") == "memcpy") & pl.col("bytes").is_not_null() & (pl.col("dur_ns") > 0))
    m = m.with_columns(pl.col("memcpy_kind").cast(pl.String).replace_strict(_DIR, default=None).alias("direction")).filter(
        pl.col("direction").is_not_null()
    )
    if m.height == 0:
        return pl.DataFrame(schema=PHASE_COLUMNS)
    key = ["rank", "direction"]
    m = m.select(pl.col("rank").cast(pl.Int64), "direction", pl.col("ts_ns").alias("s"), (pl.col("ts_ns") + pl.col("dur_ns")).alias("e"), "bytes")
    m = m.sort(key + ["s"]).with_columns(pl.col("e").cum_max().shift(1).over(key).alias("_pe"))
    m = m.with_columns((pl.col("_pe").is_null() | (pl.col("s") > pl.col("_pe") + merge_gap_ns)).cum_sum().over(key).alias("grp"))
    ph = m.group_by(key + ["grp"]).agg(pl.col("s").min().alias("start_ns"), pl.col("e").max().alias("end_ns"), pl.col("bytes").sum())
    ph = ph.with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns")).join(links, on="rank", how="left")
    # merged copies can measure above the link model (copies of one direction overlapping on two engines, or a
    # link generation the metadata got wrong): never report more than the link carries
    raw = pl.col("bytes") / (pl.col("dur_ns") * 1e-9)
    ph = ph.with_columns(
        pl.when(pl.col("link").is_not_null() & (raw > pl.col("link"))).then(pl.col("link")).otherwise(raw).alias("achieved_bytes_per_s")
    ).with_columns((fdiv(pl.col("achieved_bytes_per_s"), pl.col("link")) * 100).alias("pct_of_link"))
    ph = ph.filter((pl.col("pct_of_link") >= threshold * 100) & (pl.col("dur_ns") >= min_phase_ns))
    return ph.select("rank", "start_ns", "dur_ns", "direction", "achieved_bytes_per_s", "pct_of_link", pl.lit("memcpy").alias("source"))


def _from_collectives(instances: pl.DataFrame | None, links: pl.DataFrame, threshold: float, min_phase_ns: int) -> pl.DataFrame:
    if instances is None or instances.height == 0:
        return pl.DataFrame(schema=PHASE_COLUMNS)
    pc = links.filter(pl.col("nvlink") == False)  # noqa: E712 - polars expression
    i = instances.join(pc, on="rank", how="inner").filter(pl.col("bus_bw_bytes_per_s").is_not_null())
    i = i.with_columns((fdiv(pl.col("bus_bw_bytes_per_s"), pl.col("link")) * 100).alias("pct_of_link")).filter(
        (pl.col("pct_of_link") >= threshold * 100) & (pl.col("transfer_ns") >= min_phase_ns)
    )
    return i.select(
        "rank", (pl.col("end_ns") - pl.col("transfer_ns")).alias("start_ns"), pl.col("transfer_ns").alias("dur_ns"),
        pl.lit("collective").alias("direction"), pl.col("bus_bw_bytes_per_s").alias("achieved_bytes_per_s"), "pct_of_link",
        pl.lit("collective").alias("source"),
    )


def _during(phases: pl.DataFrame, df: pl.DataFrame, top: int = 3) -> pl.DataFrame:
    if phases.height == 0:
        return phases.with_columns(pl.lit(None, pl.List(pl.String)).alias("during"))
    ops = gpu_ops(df, ["name"]).select("rank", "start", "end", pl.col("name").cast(pl.String).alias("op"))
    p = phases.with_row_index("_pid")
    ph = p.select("_pid", "rank", "start_ns", (pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns"))
    j = iv.intersect(ops, ph, by="rank", span_start="start_ns", span_end="end_ns")
    top_ops = (
        j.group_by(["_pid", "op"]).agg((pl.col("end") - pl.col("start")).sum().alias("ov"))
        .sort(["_pid", "ov", "op"], descending=[False, True, False])
        .group_by("_pid", maintain_order=True).agg(pl.col("op").head(top).alias("during"))
    )
    return p.join(top_ops, on="_pid", how="left").drop("_pid")


def _typed(p: pl.DataFrame) -> pl.DataFrame:
    """The phase columns, typed; ``pct_of_link`` never above 100 (no figure beyond what the link carries)."""
    p = p.select([c for c in PHASE_COLUMNS if c != "during"]).cast({c: t for c, t in PHASE_COLUMNS.items() if c != "during"})
    return p.with_columns(pl.col("pct_of_link").clip(upper_bound=100.0))


@dataclass
class PciePart:
    """Phases of some ranks, each source apart (``during`` filled): the counter/memcpy choice is global."""

    counters: pl.DataFrame
    memcpy: pl.DataFrame
    collectives: pl.DataFrame


def pcie_part(
    df: pl.DataFrame,
    meta: TraceMeta | None = None,
    *,
    instances: pl.DataFrame | None = None,
    threshold: float = 0.8,
    min_samples: int = 2,
    merge_gap_ns: int = 10_000,
    min_phase_ns: int = 100_000,
) -> PciePart:
    """Per-rank half of :func:`pcie_phases` for the ranks in ``df`` (one rank, or a whole frame)."""
    links = _link_table(df, meta)
    c = _typed(_from_counters(df, links, threshold, min_samples))
    m = _typed(_from_memcpy(df, links, threshold, merge_gap_ns, min_phase_ns)) if c.height == 0 else _typed(pl.DataFrame(schema=PHASE_COLUMNS))
    k = _typed(_from_collectives(instances, links, threshold, min_phase_ns))
    return PciePart(_during(c, df), _during(m, df), _during(k, df))


def pcie_finish(parts: list[PciePart]) -> pl.DataFrame:
    """Phases of all ranks: counter phases where any rank has them, else memcpy phases; plus collective phases."""
    cnt = [p.counters for p in parts if p.counters.height]
    use = cnt if cnt else [p.memcpy for p in parts if p.memcpy.height]
    ph = [*use, *[p.collectives for p in parts if p.collectives.height]]
    if not ph:
        return _during(_typed(pl.DataFrame(schema=PHASE_COLUMNS)), pl.DataFrame()).select(list(PHASE_COLUMNS)).cast(PHASE_COLUMNS)
    out = pl.concat([p.select(list(PHASE_COLUMNS)).cast(PHASE_COLUMNS) for p in ph])
    return out.sort(["rank", "start_ns", "source", "direction", "dur_ns"], maintain_order=True)


def pcie_phases(
    df: pl.DataFrame,
    meta: TraceMeta | None = None,
    *,
    instances: pl.DataFrame | None = None,
    threshold: float = 0.8,
    min_samples: int = 2,
    merge_gap_ns: int = 10_000,
    min_phase_ns: int = 100_000,
) -> pl.DataFrame:
    """PCIe-bound phases (module doc), sorted by rank and start; empty frame when none.

    :func:`pcie_part` (per rank) → :func:`pcie_finish`; here both on the whole frame.
    """
    return pcie_finish([pcie_part(df, meta, instances=instances, threshold=threshold, min_samples=min_samples,
                                  merge_gap_ns=merge_gap_ns, min_phase_ns=min_phase_ns)])


# --- the ``pcie`` analysis (tracekit.analysis.registry) -------------------------------------------------------------

def _part(df: pl.DataFrame, ctx: PartContext) -> PciePart:
    return pcie_part(df, ctx.meta, instances=ctx.instances, **ctx.options)


def _finish(parts: list[PciePart], ctx: FinishContext) -> Finished:
    ph = pcie_finish(parts)
    return Finished({"pcie_phases": records(ph, ctx.plan.max_items)}, ph)


ANALYSIS = register(Analysis(
    "pcie", ("pcie_phases",), ("rank", "kind", "ts_ns", "dur_ns", "name", "category", "bytes", "memcpy_kind", "value"),
    _part, _finish, lambda ctx: pcie_candidates(ctx.result.value),
    options=keyword_defaults(pcie_part, exclude=("instances",)), order=30))
