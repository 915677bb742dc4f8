"""Source-independent finishing of one rank's raw rows (Kineto, nsys, capture).

:func:`finalize_rank` is the single place where

1. step annotations become ``kind="step"`` rows (``tk.fwd[...]`` > SGLang
   ``step[...]`` > ``ProfilerStep#N``: the most specific kind present wins,
   the others stay ranges),
2. GPU ops are joined to their launching runtime call by ``correlation``
   (``launch_ts_ns``, ``launch_dur_ns``, ``launch_tid``, ``launch_name``; a
   ``cudaGraphLaunch`` shares its correlation with all the graph's kernels),
3. ``category``/``family`` are set by name rules, then context rules (ops
   launched inside e.g. a ``moe.experts`` range),
4. collective metadata from ``record_param_comms`` is attached to the GPU
   collective it launched, ``coll_name`` is inferred from kernel names when
   missing, and ``coll_seq`` numbers collectives within (rank, group),
5. ``step_id`` is set on runtime rows and GPU ops launched inside a step.

Everything is vectorized (joins, ``join_asof``); the function is pure.
"""

from __future__ import annotations

import polars as pl

from tracekit.analysis.intervals import covered_by
from tracekit.categories import RuleSet, default_rules
from tracekit.schema import conform

__all__ = ["finalize_rank", "STEP_PATTERNS", "parse_steps"]

GPU_KINDS = ["kernel", "memcpy", "memset"]

#: (source tag, regex) for step annotations; named groups mode, bs, tok, id.
STEP_PATTERNS = {
    "tk.fwd": r"^tk\.fwd\[(?P<mode>[A-Z_]+)(?: bs=(?P<bs>\d+))?(?: tok=(?P<tok>\d+))?(?P<draft> draft)?[^\]]*\]",
    "sglang.step": r"^step\[(?P<mode>[A-Z_]+)(?: bs=(?P<bs>\d+))?(?: toks=(?P<tok>\d+))?[^\]]*\]",
    "profiler_step": r"^ProfilerStep#(?P<id>\d+)$",
    "numbered_step": r"^(?:step|Step|STEP|iteration|iter)[ _#-]?(?P<id>\d+)$",
}


def parse_steps(df: pl.DataFrame) -> pl.DataFrame:
    """Turn step annotations (CPU ranges) into ``kind="step"`` rows.

    Only the most specific family present in the rank becomes steps. SGLang
    DECODE steps carry tokens = batch size; EXTEND steps their ``toks``.
    Steps without an explicit id are numbered in time order from 0.
    """
    is_range = pl.col("kind").cast(pl.String) == "range"
    name = pl.col("name").cast(pl.String)
    chosen = None
    for tag, rx in STEP_PATTERNS.items():
        if df.filter(is_range & name.str.contains(rx)).height:
            chosen = (tag, rx)
            break
    if chosen is None:
        return df
    tag, rx = chosen
    hit = is_range & name.str.contains(rx)
    ext = name.str.extract_groups(rx)
    fields = ext.struct
    numbered = tag in ("profiler_step", "numbered_step")
    mode = fields.field("mode") if not numbered else pl.lit(None, dtype=pl.String)
    bs = fields.field("bs").cast(pl.Int32, strict=False) if not numbered else pl.lit(None, dtype=pl.Int32)
    tok = fields.field("tok").cast(pl.Int64, strict=False) if not numbered else pl.lit(None, dtype=pl.Int64)
    sid = fields.field("id").cast(pl.Int64, strict=False) if numbered else pl.lit(None, dtype=pl.Int64)
    out = df.with_columns(
        pl.when(hit).then(pl.lit("step")).otherwise(pl.col("kind").cast(pl.String)).alias("kind"),
        pl.when(hit).then(mode).otherwise(pl.col("step_mode").cast(pl.String)).alias("step_mode"),
        pl.when(hit).then(bs).otherwise(pl.col("batch_size")).alias("batch_size"),
        pl.when(hit).then(tok).otherwise(pl.col("tokens")).alias("tokens"),
        pl.when(hit).then(sid).otherwise(pl.col("step_id")).alias("step_id"),
        pl.when(hit).then(pl.lit(True)).otherwise(pl.col("profiled")).alias("profiled"),
    )
    # DECODE: one token per request
    is_step = pl.col("kind") == "step"
    out = out.with_columns(
        pl.when(is_step & pl.col("tokens").is_null() & (pl.col("step_mode") == "DECODE"))
        .then(pl.col("batch_size").cast(pl.Int64))
        .otherwise(pl.col("tokens"))
        .alias("tokens")
    )
    if not numbered:
        out = out.with_columns(
            pl.when(is_step).then((pl.col("ts_ns").rank("ordinal").over(is_step) - 1).cast(pl.Int64)).otherwise(pl.col("step_id")).alias("step_id")
        )
    return conform(out)


def _launch_join(df: pl.DataFrame) -> pl.DataFrame:
    rt = (
        df.filter((pl.col("kind").cast(pl.String) == "runtime") & pl.col("correlation").is_not_null() & (pl.col("correlation") != 0))
        .select(
            "correlation",
            pl.col("ts_ns").alias("_lts"),
            pl.col("dur_ns").alias("_ldur"),
            pl.col("tid").alias("_ltid"),
            pl.col("name").cast(pl.String).alias("_lname"),
        )
        .unique("correlation", keep="first", maintain_order=True)
    )
    if rt.height == 0:
        return df
    is_gpu = pl.col("kind").cast(pl.String).is_in(GPU_KINDS)
    j = df.join(rt, on="correlation", how="left", maintain_order="left")
    return j.with_columns(
        pl.when(is_gpu).then(pl.coalesce("launch_ts_ns", "_lts")).otherwise(pl.col("launch_ts_ns")).alias("launch_ts_ns"),
        pl.when(is_gpu).then(pl.coalesce("launch_dur_ns", "_ldur")).otherwise(pl.col("launch_dur_ns")).alias("launch_dur_ns"),
        pl.when(is_gpu).then(pl.coalesce("launch_tid", "_ltid")).otherwise(pl.col("launch_tid")).alias("launch_tid"),
        pl.when(is_gpu)
        .then(pl.coalesce(pl.col("launch_name").cast(pl.String), pl.col("_lname")))
        .otherwise(pl.col("launch_name").cast(pl.String))
        .cast(pl.Categorical)
        .alias("launch_name"),
    ).drop(["_lts", "_ldur", "_ltid", "_lname"])


def _context_rules(df: pl.DataFrame, rules: RuleSet) -> pl.DataFrame:
    if not rules.context:
        return df
    ranges = df.filter(pl.col("kind").cast(pl.String) == "range").select(
        "tid", "ts_ns", (pl.col("ts_ns") + pl.col("dur_ns")).alias("end_ns"), pl.col("name").cast(pl.String).alias("rname")
    )
    if ranges.height == 0:
        return df
    # which context rule (first match) each distinct range name triggers
    rnames = ranges.get_column("rname").unique().to_list()
    rule_of = {}
    for n in rnames:
        for i, r in enumerate(rules.context):
            if r.range_regex.search(n):
                rule_of[n] = i
                break
    if not rule_of:
        return df
    ranges = ranges.filter(pl.col("rname").is_in(list(rule_of))).with_columns(
        pl.col("rname").replace_strict(rule_of, return_dtype=pl.Int32).alias("_rule")
    )
    gpu = df.with_row_index("_row").filter(pl.col("kind").cast(pl.String).is_in(GPU_KINDS) & pl.col("launch_ts_ns").is_not_null())
    if gpu.height == 0:
        return df
    hit = covered_by(
        gpu.select("_row", pl.col("launch_tid").alias("tid"), pl.col("launch_ts_ns").alias("ts")),
        ranges.rename({"ts_ns": "start", "end_ns": "end"}),
        by="tid",
        at="ts",
        payload=["_rule"],
    ).filter(pl.col("_rule").is_not_null())
    if hit.height == 0:
        return df
    gpu = gpu.join(hit.select("_row", "_rule"), on="_row", how="inner")
    new_cat = []
    for i, r in enumerate(rules.context):
        sel = gpu.filter(pl.col("_rule") == i)
        if sel.height == 0:
            continue
        cond = pl.col("category").cast(pl.String).is_in(list(r.from_categories))
        if r.name_regex is not None:
            cond = cond & pl.col("name").cast(pl.String).str.contains(r.name_regex.pattern)
        sel = sel.filter(cond).select("_row", pl.lit(r.category).alias("_c"), pl.lit(r.id).alias("_f"))
        new_cat.append(sel)
    if not new_cat:
        return df
    upd = pl.concat(new_cat)
    out = df.with_row_index("_row").join(upd, on="_row", how="left")
    return out.with_columns(
        pl.coalesce(pl.col("_c"), pl.col("category").cast(pl.String)).cast(pl.Categorical).alias("category"),
        pl.coalesce(pl.col("_f"), pl.col("family").cast(pl.String)).cast(pl.Categorical).alias("family"),
    ).drop(["_row", "_c", "_f"])


_COLL_FROM_NAME = [
    (r"(?i)allreduce|all_reduce|cross_device_reduce|allreduce_fusion|one_shot|two_shot|multimem_all_reduce|quickreduce", "allreduce"),
    (r"(?i)allgather|all_gather", "allgather"),
    (r"(?i)reducescatter|reduce_scatter", "reduce_scatter"),
    (r"(?i)alltoall|all_to_all", "all_to_all"),
    (r"(?i)broadcast", "broadcast"),
    (r"(?i)sendrecv|send_recv", "sendrecv"),
]
_COLL_COLS = ["coll_name", "coll_in_nelems", "coll_out_nelems", "coll_dtype", "coll_group_size", "pg_name", "pg_desc", "pg_ranks"]


def _collectives(df: pl.DataFrame) -> pl.DataFrame:
    is_comm = pl.col("kind").cast(pl.String).is_in(GPU_KINDS) & (pl.col("category").cast(pl.String) == "communication")
    if df.filter(is_comm).height == 0:
        return df
    # 1. record_param_comms enclosing the launching runtime call on the same thread
    rpc = df.filter((pl.col("kind").cast(pl.String) == "cpu_op") & (pl.col("name").cast(pl.String) == "record_param_comms"))
    d = df.with_row_index("_row")
    if rpc.height:
        need = d.filter(is_comm & pl.col("coll_name").is_null() & pl.col("launch_ts_ns").is_not_null())
        if need.height:
            iv = rpc.select(
                "tid", pl.col("ts_ns").alias("start"), (pl.col("ts_ns") + pl.col("dur_ns")).alias("end"),
                *[pl.col(c).cast(pl.String) if c in ("coll_name", "coll_dtype", "pg_name", "pg_desc", "pg_ranks") else pl.col(c) for c in _COLL_COLS],
            ).rename({c: f"_{c}" for c in _COLL_COLS})
            hit = covered_by(
                need.select("_row", pl.col("launch_tid").alias("tid"), pl.col("launch_ts_ns").alias("ts")),
                iv, by="tid", at="ts", payload=[f"_{c}" for c in _COLL_COLS],
            )
            d = d.join(hit.drop(["tid", "ts"]), on="_row", how="left")
            d = d.with_columns(
                [pl.coalesce(pl.col(c).cast(pl.String) if c in ("coll_name", "coll_dtype", "pg_name", "pg_desc", "pg_ranks") else pl.col(c), pl.col(f"_{c}")).alias(c) for c in _COLL_COLS]
            ).drop([f"_{c}" for c in _COLL_COLS])
    # 2. infer the collective from the kernel name
    name = pl.col("name").cast(pl.String)
    inferred = pl.lit(None, dtype=pl.String)
    for rx, cname in reversed(_COLL_FROM_NAME):
        inferred = pl.when(name.str.contains(rx)).then(pl.lit(cname)).otherwise(inferred)
    d = d.with_columns(
        pl.when(is_comm).then(pl.coalesce(pl.col("coll_name").cast(pl.String).str.to_lowercase(), inferred)).otherwise(pl.col("coll_name").cast(pl.String)).alias("coll_name")
    )
    # 3. sequence within (process group or family); recorded Seq wins when present
    key = pl.coalesce(pl.col("pg_name").cast(pl.String), pl.lit("fam:") + pl.col("family").cast(pl.String))
    comm = d.filter(is_comm).select("_row", "ts_ns", key.alias("_k")).sort("ts_ns")
    comm = comm.with_columns((pl.col("ts_ns").rank("ordinal").over("_k") - 1).cast(pl.Int64).alias("_seq"))
    d = d.join(comm.select("_row", "_seq"), on="_row", how="left")
    d = d.with_columns(pl.coalesce("coll_seq", "_seq").alias("coll_seq")).drop(["_seq", "_row"])
    return conform(d)


def _assign_steps(df: pl.DataFrame) -> pl.DataFrame:
    steps = df.filter(pl.col("kind").cast(pl.String) == "step").select(
        "tid", pl.col("ts_ns").alias("start"), (pl.col("ts_ns") + pl.col("dur_ns")).alias("end"), pl.col("step_id").alias("_sid")
    )
    if steps.height == 0:
        return df
    d = df.with_row_index("_row")
    is_gpu = pl.col("kind").cast(pl.String).is_in(GPU_KINDS)
    pts = d.filter((is_gpu & pl.col("launch_ts_ns").is_not_null()) | (pl.col("kind").cast(pl.String) == "runtime")).select(
        "_row",
        pl.when(is_gpu).then(pl.col("launch_tid")).otherwise(pl.col("tid")).alias("tid"),
        pl.when(is_gpu).then(pl.col("launch_ts_ns")).otherwise(pl.col("ts_ns")).alias("ts"),
    )
    if pts.height == 0:
        return df
    has_tid = steps.get_column("tid").null_count() < steps.height
    if has_tid:
        hit = covered_by(pts.filter(pl.col("tid").is_not_null()), steps.filter(pl.col("tid").is_not_null()), by="tid", at="ts", payload=["_sid"])
    else:
        hit = covered_by(pts, steps.drop("tid"), at="ts", payload=["_sid"])
    d = d.join(hit.select("_row", "_sid"), on="_row", how="left")
    return d.with_columns(pl.coalesce("step_id", "_sid").alias("step_id")).drop(["_row", "_sid"])


def finalize_rank(raw: pl.DataFrame, rules: RuleSet | None = None) -> pl.DataFrame:
    """Finish one rank's raw rows (see module docstring); returns a conformed frame sorted by ts."""
    rules = rules or default_rules()
    df = conform(raw)
    df = parse_steps(df)
    df = _launch_join(df)
    df = rules.categorize(df)
    df = _context_rules(df, rules)
    df = _collectives(df)
    df = _assign_steps(df)
    return conform(df).sort("ts_ns", maintain_order=True)
