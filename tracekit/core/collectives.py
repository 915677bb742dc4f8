"""Cross-rank collective matching: arrival, wait vs transfer, late rank, bus bandwidth.

A *collective instance* is the n-th collective of one group on every member rank
(replay_model.md §3):

* NCCL kernels with process-group metadata: group = ``pg_name``, n = ``coll_seq``
  (or the rank-local start order when ``coll_seq`` is missing).
* Kernels without metadata (custom allreduce families, graph-replayed NCCL):
  group = ``family``, n = rank-local start order within that family.

When ranks recorded different numbers of collectives in a group (unfenced
profiler start, dropped events), each rank's index is shifted by the offset
that makes its end times coincide with the reference rank's (collective kernels
end within microseconds of each other); the shift and the count mismatch become
quality flags, never an exception.

Per (instance, rank): ``arrival_ns`` = kernel start, ``wait_ns`` = min(last
arrival − own arrival, own duration − transfer) ≥ 0 (so wait + transfer never
exceeds the kernel), ``transfer_ns`` = min duration over the
instance's ranks, ``late_rank`` = the last to arrive, ``bus_bw_bytes_per_s`` by
the nccl-tests convention.
"""

from __future__ import annotations

import polars as pl

from tracekit._errors import Quality, QualityLog
from tracekit.core.window import cpu_device_expr, cpu_mode_ranks
from tracekit.dtypes import DTYPE_BYTES as _DTYPE_BYTES
from tracekit.dtypes import dtype_bytes_expr
from tracekit.core._num import as_int

__all__ = [
    "collective_ops",
    "match_collectives",
    "collective_summary",
    "collective_quality",
    "split_communication",
    "start_transient_end_ns",
    "DTYPE_BYTES",
    "INSTANCE_COLUMNS",
]

#: bytes per element (the one table: :mod:`tracekit.dtypes`)
DTYPE_BYTES = _DTYPE_BYTES

INSTANCE_COLUMNS = [
    "pg", "pg_name", "seq", "rank", "name", "family", "coll_name", "algo", "stream", "step_id",
    "arrival_ns", "end_ns", "dur_ns", "wait_ns", "transfer_ns", "late_rank", "n_ranks", "group_size",
    "bytes", "bus_bw_bytes_per_s", "end_spread_ns", "launch_ts_ns", "index_shift", "quality",
]

_COMM_FAMILY = r"^(allreduce|collective)\."


def collective_ops(df: pl.DataFrame, *, cpu_ranks: list[int] | None = None) -> pl.DataFrame:
    """GPU kernels that are collectives (category ``communication`` or an allreduce/collective family);
    in CPU mode gloo's one range per collective (docs/cpu_mode.md; the issuing ``c10d::`` op has no category).

    ``cpu_ranks``: the CPU-mode ranks of the whole trace when ``df`` holds only some of its rows
    (the small cross-rank rows of :class:`tracekit.core.window.Overview`); default: from ``df``.
    """
    fam = pl.col("family").cast(pl.String)
    is_coll = (pl.col("category") == "communication") | fam.str.contains(_COMM_FAMILY)
    if cpu_ranks is None:
        cpu_ranks = cpu_mode_ranks(df)
    mask = df.select((((pl.col("kind") == "kernel") | cpu_device_expr(cpu_ranks)) & is_coll.fill_null(False)).fill_null(False).alias("m"))["m"]
    return df if mask.all() else df.filter(mask)  # already collective rows only (the cross-rank pass): no copy


def _norm_coll_name() -> pl.Expr:
    raw = pl.col("coll_name").cast(pl.String).str.to_lowercase().str.replace_all(r"^_+", "")
    raw = raw.str.replace_all(r"(_base|_into_tensor|_coalesced|_tensor|_v2)$", "").str.replace_all("_", "")
    kname = pl.col("name").cast(pl.String)
    from_kernel = (
        pl.when(kname.str.contains(r"(?i)allreduce|all_reduce|cross_device_reduce")).then(pl.lit("allreduce"))
        .when(kname.str.contains(r"(?i)allgather|all_gather")).then(pl.lit("allgather"))
        .when(kname.str.contains(r"(?i)reducescatter|reduce_scatter")).then(pl.lit("reducescatter"))
        .when(kname.str.contains(r"(?i)alltoall|all_to_all")).then(pl.lit("alltoall"))
        .when(kname.str.contains(r"(?i)broadcast")).then(pl.lit("broadcast"))
        .when(kname.str.contains(r"(?i)sendrecv")).then(pl.lit("sendrecv"))
        .when(kname.str.contains(r"(?i)_send")).then(pl.lit("send"))
        .when(kname.str.contains(r"(?i)_recv")).then(pl.lit("recv"))
        .when(pl.col("family").cast(pl.String).str.starts_with("allreduce.")).then(pl.lit("allreduce"))
        .otherwise(pl.lit("collective"))
    )
    return pl.coalesce(raw, from_kernel).alias("coll_name")


def _algo() -> pl.Expr:
    k = pl.col("name").cast(pl.String)
    nccl = k.str.extract(r"_((?:RING|TREE|NVLS|NVLSTREE|COLLNET\w*?|PAT)_(?:LL128|LL|SIMPLE))", 1)
    custom = k.str.extract(r"(1stage|2stage|1shot|2shot|oneshot|twoshot|one_shot|two_shot)", 1)
    fam = pl.col("family").cast(pl.String).str.replace(r"^(allreduce|collective)\.", "")
    return pl.coalesce(nccl, pl.when(custom.is_not_null()).then(fam + "_" + custom), fam).alias("algo")


def _busbw_factor(n: pl.Expr) -> pl.Expr:
    c = pl.col("coll_name")
    nf = n.cast(pl.Float64)
    return (
        pl.when(c == "allreduce").then(2.0 * (nf - 1.0) / nf)
        .when(c.is_in(["allgather", "reducescatter", "alltoall", "alltoallv"])).then((nf - 1.0) / nf)
        .otherwise(1.0)
    )


def _ranks_count(s: pl.Expr) -> pl.Expr:
    """Number of ranks in a JSON list string like ``[0, 1]`` (null when empty or not a list), vectorized."""
    n = s.str.count_matches(r"-?\d+").cast(pl.Int64)
    return pl.when(s.str.contains(r"^\s*\[") & (n > 0)).then(n).otherwise(None)


def _assign_groups(ops: pl.DataFrame) -> pl.DataFrame:
    pg = pl.col("pg_name").cast(pl.String)
    ops = ops.with_columns(
        pl.when(pg.is_not_null()).then(pl.lit("pg:") + pg)
        .otherwise(pl.lit("fam:") + pl.col("family").cast(pl.String).fill_null("unknown")).alias("pg")
    ).sort(["rank", "pg", "ts_ns"], maintain_order=True)
    ordinal = pl.int_range(pl.len()).over(["rank", "pg"]).cast(pl.Int64)
    # recorded sequence numbers are used only when complete and unique per (rank, group); traces assembled
    # from several profiler windows by older converters restart them per window
    seq_ok = (
        pl.col("coll_seq").is_not_null().all().over(["rank", "pg"])
        & (pl.col("coll_seq").n_unique().over(["rank", "pg"]) == pl.len().over(["rank", "pg"]))
        & pl.col("pg").str.starts_with("pg:")
    )
    return ops.with_columns(pl.when(seq_ok).then(pl.col("coll_seq")).otherwise(ordinal).alias("seq"))


def _fix_count_mismatch(ops: pl.DataFrame) -> pl.DataFrame:
    """Shift each rank's index so its end times line up with the reference rank's."""
    counts = ops.group_by(["pg", "rank"]).agg(pl.len().alias("n"), pl.col("seq").min().alias("s0"))
    ops = ops.with_columns(pl.lit(0, pl.Int64).alias("index_shift"))
    bad = counts.group_by("pg").agg(
        (pl.col("n").n_unique() > 1) | (pl.col("s0").n_unique() > 1)
    ).filter(pl.col("n")).get_column("pg").to_list()
    if not bad:
        return ops
    shifts: list[dict[str, object]] = []
    for g in bad:  # few groups × few ranks × few shifts; each step is a vectorized join
        c = counts.filter(pl.col("pg") == g).sort(["n", "rank"], descending=[True, False])
        ref_rank = int(c["rank"][0])
        ref = ops.filter((pl.col("pg") == g) & (pl.col("rank") == ref_rank)).select(
            "seq", (pl.col("ts_ns") + pl.col("dur_ns")).alias("_e_ref")
        )
        nmax = as_int(c["n"].max())
        for r, n in zip(c["rank"].to_list()[1:], c["n"].to_list()[1:]):
            mine = ops.filter((pl.col("pg") == g) & (pl.col("rank") == r)).select(
                "seq", (pl.col("ts_ns") + pl.col("dur_ns")).alias("_e")
            )
            lim = abs(nmax - int(n)) + 2
            best: tuple[float, int, int] | None = None
            for s in range(-lim, lim + 1):
                j = mine.with_columns((pl.col("seq") + s).alias("seq")).join(ref, on="seq", how="inner")
                if j.height == 0:
                    continue
                score = float(j.select((pl.col("_e") - pl.col("_e_ref")).abs().median()).item())
                cand = (score, abs(s), s)
                if best is None or cand < best:
                    best = cand
            if best is not None and best[2] != 0:
                shifts.append({"pg": g, "rank": r, "_shift": best[2]})
    if not shifts:
        return ops
    sh = pl.DataFrame(shifts, schema={"pg": pl.String, "rank": ops.schema["rank"], "_shift": pl.Int64})
    return (
        ops.join(sh, on=["pg", "rank"], how="left")
        .with_columns(pl.col("_shift").fill_null(0).alias("index_shift"))
        .with_columns((pl.col("seq") + pl.col("index_shift")).alias("seq"))
        .drop("_shift")
    )


def match_collectives(df: pl.DataFrame, *, cpu_ranks: list[int] | None = None) -> pl.DataFrame:
    """One row per (collective instance, rank); columns :data:`INSTANCE_COLUMNS`.

    ``quality`` is ``ok``, ``incomplete`` (fewer ranks than the group has) or
    ``mismatched`` (ranks disagree on collective name or message size). Wait and
    transfer are computed among the ranks present in every case.
    """
    ops = collective_ops(df, cpu_ranks=cpu_ranks)
    if ops.height == 0:
        return _empty_instances()
    ops = _assign_groups(ops)
    ops = _fix_count_mismatch(ops)
    dtype_b = dtype_bytes_expr(pl.col("coll_dtype").cast(pl.String))
    nel = pl.max_horizontal(pl.col("coll_in_nelems"), pl.col("coll_out_nelems"))
    # name-derived columns (regexes) once per distinct (name, family, coll_name, coll_dtype, pg_ranks), not per row
    sig = ["name", "family", "coll_name", "coll_dtype", "pg_ranks"]
    derived = ops.select(sig).unique().with_columns(
        _norm_coll_name().alias("_coll_name"),
        _algo(),
        dtype_b.alias("_dtype_b"),
        _ranks_count(pl.col("pg_ranks").cast(pl.String)).alias("_pgn"),
    )
    ops = ops.join(derived, on=sig, how="left", nulls_equal=True, maintain_order="left").with_columns(
        pl.col("_coll_name").alias("coll_name"),
        (nel * pl.col("_dtype_b")).alias("bytes"),
        (pl.col("ts_ns") + pl.col("dur_ns")).alias("end_ns"),
    )
    # ranks taking part in each group (when not stated by metadata)
    ops = ops.with_columns(pl.col("rank").n_unique().over("pg").alias("_seen"))
    key = ["pg", "seq"]
    ops = ops.with_columns(
        pl.col("ts_ns").max().over(key).alias("_last"),
        pl.col("dur_ns").min().over(key).alias("transfer_ns"),
        pl.col("rank").sort_by(["ts_ns", "rank"]).last().over(key).alias("late_rank"),  # ties: the higher rank
        pl.len().over(key).alias("n_ranks"),
        (pl.col("end_ns").max() - pl.col("end_ns").min()).over(key).alias("end_spread_ns"),
        (pl.col("coll_name").n_unique().over(key) > 1).alias("_mm_name"),
        (pl.col("bytes").drop_nulls().n_unique().over(key) > 1).alias("_mm_bytes"),
        pl.coalesce(pl.col("coll_group_size").cast(pl.Int64), pl.col("_pgn"), pl.col("_seen").cast(pl.Int64)).alias("group_size"),
    )
    wait = pl.min_horizontal(pl.col("_last") - pl.col("ts_ns"), pl.col("dur_ns") - pl.col("transfer_ns")).clip(lower_bound=0)
    factor = _busbw_factor(pl.col("group_size"))
    busbw = pl.when(pl.col("transfer_ns") > 0).then(
        pl.col("bytes").cast(pl.Float64) / (pl.col("transfer_ns").cast(pl.Float64) * 1e-9) * factor
    )
    quality = (
        pl.when(pl.col("_mm_name") | pl.col("_mm_bytes")).then(pl.lit("mismatched"))
        .when(pl.col("n_ranks") < pl.col("group_size")).then(pl.lit("incomplete"))
        .otherwise(pl.lit("ok"))
    )
    out = ops.with_columns(
        wait.alias("wait_ns"),
        busbw.alias("bus_bw_bytes_per_s"),
        quality.alias("quality"),
        pl.col("name").cast(pl.String),
        pl.col("family").cast(pl.String),
        pl.col("pg_name").cast(pl.String),
        pl.col("rank").cast(pl.Int64),
        pl.col("late_rank").cast(pl.Int64),
        pl.col("n_ranks").cast(pl.Int64),
        pl.col("group_size").cast(pl.Int64),
    ).rename({"ts_ns": "arrival_ns"})
    return out.select(INSTANCE_COLUMNS).sort(["pg", "seq", "rank"], maintain_order=True)


def _empty_instances() -> pl.DataFrame:
    s: dict[str, pl.DataType] = {c: pl.Int64() for c in INSTANCE_COLUMNS}
    for c in ("pg", "pg_name", "name", "family", "coll_name", "algo", "quality"):
        s[c] = pl.String()
    s["bus_bw_bytes_per_s"] = pl.Float64()
    return pl.DataFrame(schema=s)


def collective_summary(instances: pl.DataFrame) -> pl.DataFrame:
    """Per group (``pg``) and collective name: instance count, total kernel time, wait and transfer totals,
    wait share, median message bytes and bus bandwidth, algorithms seen."""
    if instances.height == 0:
        return pl.DataFrame(schema={"pg": pl.String, "coll_name": pl.String, "count": pl.Int64, "ranks": pl.List(pl.Int64),
                                    "kernel_ns": pl.Int64, "wait_ns": pl.Int64, "transfer_ns": pl.Int64,
                                    "wait_share": pl.Float64, "bytes_p50": pl.Float64, "bus_bw_p50_bytes_per_s": pl.Float64,
                                    "algos": pl.List(pl.String), "not_ok": pl.Int64})
    trans_part = (pl.col("dur_ns") - pl.col("wait_ns")).clip(lower_bound=0)
    inst_level = instances.unique(["pg", "seq"], keep="first")
    per = instances.group_by(["pg", "coll_name"]).agg(
        pl.struct("seq").n_unique().alias("count"),
        pl.col("rank").unique().sort().alias("ranks"),
        pl.col("dur_ns").sum().alias("kernel_ns"),
        pl.col("wait_ns").sum().alias("wait_ns"),
        trans_part.sum().alias("transfer_ns"),
        pl.col("algo").drop_nulls().unique().sort().alias("algos"),
        pl.struct("seq", "quality").filter(pl.col("quality") != "ok").n_unique().alias("not_ok"),
    )
    bw = inst_level.group_by(["pg", "coll_name"]).agg(
        pl.col("bytes").cast(pl.Float64).median().alias("bytes_p50"),
        pl.col("bus_bw_bytes_per_s").median().alias("bus_bw_p50_bytes_per_s"),
    )
    return (
        per.join(bw, on=["pg", "coll_name"], how="left")
        .with_columns(
            (pl.col("wait_ns") / pl.col("kernel_ns").cast(pl.Float64)).fill_nan(None).alias("wait_share"),
            pl.col("not_ok").cast(pl.Int64),
            pl.col("count").cast(pl.Int64),
        )
        .select(["pg", "coll_name", "count", "ranks", "kernel_ns", "wait_ns", "transfer_ns", "wait_share",
                 "bytes_p50", "bus_bw_p50_bytes_per_s", "algos", "not_ok"])
        .sort(["kernel_ns", "pg", "coll_name"], descending=[True, False, False], nulls_last=True)
    )


def collective_quality(instances: pl.DataFrame) -> list[Quality]:
    """Quality flags of a matching: count mismatches, index shifts, incomplete and mismatched instances."""
    q = QualityLog()
    if instances.height == 0:
        return list(q)
    counts = instances.group_by(["pg", "rank"]).agg(pl.len().alias("n"), pl.col("index_shift").first().alias("shift"))
    for g, sub in counts.sort(["pg", "rank"]).group_by("pg", maintain_order=True):
        ns = dict(zip(sub["rank"].to_list(), sub["n"].to_list()))
        if len(set(ns.values())) > 1:
            q.add("collective_count_mismatch",
                  f"collective group {g[0]}: ranks recorded different counts {ns}; extra instances are left incomplete",
                  counts={str(k): int(v) for k, v in ns.items()})
        shifted = {int(r): int(s) for r, s in zip(sub["rank"].to_list(), sub["shift"].to_list()) if s}
        if shifted:
            q.add("collective_index_shifted",
                  f"collective group {g[0]}: rank index shifted by {shifted} to line up end times "
                  "(ranks started recording at different collectives)", severity="info", shifts=shifted)
    by_q = instances.unique(["pg", "seq"]).group_by("quality").len()
    for qual, n in zip(by_q["quality"].to_list(), by_q["len"].to_list()):
        if qual == "incomplete":
            q.add("collective_unmatched", f"{n} collective instance(s) missing on some rank(s); their waits use the ranks present")
        elif qual == "mismatched":
            q.add("collective_mismatched", f"{n} collective instance(s) whose ranks disagree on collective or message size")
    return list(q)


def split_communication(df: pl.DataFrame, instances: pl.DataFrame | None = None, *, cpu_ranks: list[int] | None = None) -> pl.DataFrame:
    """Per collective kernel: intervals ``rank, start, end, part`` with part ``comm_wait`` / ``comm_transfer``.

    For a matched kernel the first ``wait_ns`` of it is ``comm_wait`` and the rest
    ``comm_transfer``; collective kernels that were not matched (no instance row)
    are all ``comm_transfer``. The breakdown clips these with its own interval
    algebra for exclusive attribution.
    """
    if instances is None:
        instances = match_collectives(df, cpu_ranks=cpu_ranks)
    ops = collective_ops(df, cpu_ranks=cpu_ranks).select(
        pl.col("rank").cast(pl.Int64), pl.col("ts_ns").alias("start"), (pl.col("ts_ns") + pl.col("dur_ns")).alias("end")
    )
    w = instances.select(pl.col("rank"), pl.col("arrival_ns").alias("start"), pl.col("wait_ns"))
    j = ops.join(w, on=["rank", "start"], how="left").unique(["rank", "start", "end"], keep="first")
    mid = pl.min_horizontal(pl.col("start") + pl.col("wait_ns").fill_null(0), pl.col("end"))
    wait = j.select("rank", "start", mid.alias("end"), pl.lit("comm_wait").alias("part"))
    trans = j.select("rank", mid.alias("start"), "end", pl.lit("comm_transfer").alias("part"))
    return pl.concat([wait, trans]).filter(pl.col("end") > pl.col("start")).sort(["rank", "start"], maintain_order=True)


def start_transient_end_ns(df: pl.DataFrame, instances: pl.DataFrame | None = None) -> int | None:
    """End of the profiler-start transient (sglang.md §10), or None when nothing needs trimming.

    The end of the first collective instance all ranks entered (latest end over its
    ranks); without collectives, the start of the first step that begins after the
    latest rank's first event. Single-rank traces return None.
    """
    ranks = df.get_column("rank").unique()
    if ranks.len() < 2:
        return None
    if instances is None:
        instances = match_collectives(df)
    full = instances.filter(pl.col("n_ranks") >= pl.col("group_size")) if instances.height else instances
    if full.height:
        first = full.group_by(["pg", "seq"]).agg(pl.col("arrival_ns").max().alias("a"), pl.col("end_ns").max().alias("e")).sort("a")
        return int(first["e"][0])
    latest_first = as_int(df.group_by("rank").agg(pl.col("ts_ns").min()).get_column("ts_ns").max())
    steps = df.filter((pl.col("kind").cast(pl.String) == "step") & (pl.col("ts_ns") >= latest_first))
    if steps.height:
        return as_int(steps.get_column("ts_ns").min())
    return None
