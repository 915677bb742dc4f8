"""Source-independent finishing of one rank's raw rows (Kineto, nsys, capture).

:func:`finalize_rank` is the single place where

1. step annotations become ``kind="step"`` rows (grammar and precedence in
   :mod:`tracekit.steplabels`: ``tk.fwd[...]`` > SGLang ``step[...]`` > vLLM
   ``execute_…`` > user labels such as ``forward#i:decode:bs=N`` > ``ProfilerStep#N``;
   the most specific kind present wins, the others stay ranges; ``RuleSet.steps_from``
   replaces the grammar by one regex),
2. GPU ops are joined to their launching runtime call by ``correlation``
   (``launch_ts_ns``, ``launch_dur_ns``, ``launch_tid``, ``launch_name``; a
   ``cudaGraphLaunch`` shares its correlation with all the graph's kernels),
3. ``category``/``family`` are set by name rules, then context rules (ops
   launched inside e.g. a ``moe.experts`` range), then the MoE launch-pattern
   pass (:mod:`tracekit.ingest.moe_structure`: routers, expert loops, eager attention),
4. collective metadata from ``record_param_comms`` is attached to the GPU
   collective it launched, ``coll_name`` is inferred from kernel names when
   missing, and ``coll_seq`` numbers collectives within (rank, group),
5. ``step_id`` is set on runtime rows and GPU ops launched inside a step,
6. CPU mode: a rank with no GPU op gets categories on the rows that stand in
   for device work — top-level operators on the forward thread and gloo's
   per-collective ranges (:func:`_cpu_mode`, docs/cpu_mode.md); steps 3-5 then
   treat them like GPU ops.

Everything is vectorized (joins, ``join_asof``); the function is pure.
"""

from __future__ import annotations

import polars as pl

from tracekit import _interrupt
from tracekit._frames import NAME_CODE, aligned, attach, attach_rows, distinct_names, row_index  # noqa: F401
from tracekit.core.intervals import covered_by
from tracekit.categories import RuleSet, default_rules
from tracekit.ingest.modules import module_ranges
from tracekit.ingest.moe_structure import apply_moe_structure
from tracekit.schema import conform
from tracekit.steplabels import FAMILIES, NUMBERED, choose_family, label_fields

__all__ = ["CPU_ATTENTION_REGEX", "CPU_GEMM_REGEX", "CPU_SYNC_REGEX", "GLOO_REGEX", "STEP_PATTERNS", "finalize_rank", "forward_tids", "parse_steps",
           "resteps"]

GPU_KINDS = ["kernel", "memcpy", "memset"]

#: step-label families (owned by :mod:`tracekit.steplabels`; kept here under the old name for importers)
STEP_PATTERNS = FAMILIES


def parse_steps(df: pl.DataFrame, steps_from: str | None = None) -> pl.DataFrame:
    """Turn step annotations (CPU ranges) into ``kind="step"`` rows (grammar: :mod:`tracekit.steplabels`).

    Only the most specific family present in the rank becomes steps (``steps_from``: only ranges
    matching that regex). DECODE steps without a token count carry tokens = batch size. Steps are
    numbered by their label's id when every step has one and the ids are unique (``ProfilerStep#N``,
    ``forward#N``), else in time order from 0.
    """
    is_range = pl.col("kind") == "range"
    # regexes run on the distinct range names only; rows find theirs by the name's dictionary code
    names = distinct_names(df, is_range).rename({"name": "_sn"})
    if names.height == 0:
        return df
    chosen = choose_family(names.get_column("_sn"), steps_from)
    if chosen is None:
        return df
    tag, rx = chosen
    table = label_fields(names, tag, rx).join(names, on="_sn", how="left").select(
        "_code", pl.col("mode").cast(pl.Categorical).alias("_mode"), pl.col("bs").alias("_bs"),
        pl.col("tok").alias("_tok"), pl.col("id").alias("_sid"),
    )
    # the step rows (new ones and any the rank already had), by row number: the fields are computed on them only
    is_hit = is_range & NAME_CODE.is_in(table.get_column("_code").implode())
    cols = ["step_mode", "batch_size", "tokens", "step_id", "profiled"]
    steps = (
        df.lazy().with_row_index("_row").filter(is_hit | (pl.col("kind") == "step"))
        .select("_row", "ts_ns", is_hit.alias("_hit"), NAME_CODE.alias("_code"), *cols).collect()
        .join(table, on="_code", how="left", maintain_order="left")
    )
    hit = pl.col("_hit")
    hits = steps.filter(hit)
    numbered = tag in NUMBERED or (
        tag in ("user.label", "steps_from") and hits.height > 0 and hits["_sid"].null_count() == 0 and hits["_sid"].n_unique() == hits.height
    )
    steps = steps.select(
        "_row", "ts_ns",
        pl.when(hit).then(pl.col("_mode")).otherwise(pl.col("step_mode").cast(pl.Categorical)).alias("step_mode"),
        pl.when(hit).then(pl.col("_bs")).otherwise(pl.col("batch_size")).alias("batch_size"),
        pl.when(hit).then(pl.col("_tok")).otherwise(pl.col("tokens")).alias("tokens"),
        pl.when(hit).then(pl.col("_sid") if numbered else pl.lit(None, dtype=pl.Int64)).otherwise(pl.col("step_id")).alias("step_id"),
        pl.when(hit).then(pl.lit(True)).otherwise(pl.col("profiled")).alias("profiled"),
    ).with_columns(  # DECODE: one token per request
        pl.when(pl.col("tokens").is_null() & (pl.col("step_mode") == "DECODE")).then(pl.col("batch_size").cast(pl.Int64))
        .otherwise(pl.col("tokens")).alias("tokens")
    )
    if not numbered:  # steps numbered in time order (ties: row order)
        steps = steps.with_columns((pl.col("ts_ns").rank("ordinal") - 1).cast(pl.Int64).alias("step_id"))
    out = attach_rows(df, steps.select("_row", pl.lit(True).alias("_st"), *[pl.col(c).alias(f"_{c}") for c in cols]), "_row")
    st = pl.col("_st").fill_null(False)
    out = out.with_columns(
        pl.when(st).then(pl.lit("step").cast(pl.Categorical)).otherwise(pl.col("kind").cast(pl.Categorical)).alias("kind"),
        *[pl.when(st).then(pl.col(f"_{c}")).otherwise(pl.col(c)).alias(c) for c in cols],
    ).drop(["_st", *[f"_{c}" for c in cols]])
    return conform(out)


def _launch_join(df: pl.DataFrame) -> pl.DataFrame:
    """GPU ops get their launching runtime call by ``correlation`` (joined on the GPU rows only, attached by row number)."""
    rt = (
        df.lazy().filter((pl.col("kind") == "runtime") & pl.col("correlation").is_not_null() & (pl.col("correlation") != 0))
        .select(
            "correlation",
            pl.col("ts_ns").alias("_lts"),
            pl.col("dur_ns").alias("_ldur"),
            pl.col("tid").alias("_ltid"),
            pl.col("name").alias("_lname"),  # categorical throughout: no text column the length of the rank
        )
        .unique("correlation", keep="first", maintain_order=True)
        .collect()
    )
    if rt.height == 0:
        return df
    gpu = (
        df.lazy().with_row_index("_row").filter(pl.col("kind").is_in(GPU_KINDS) & pl.col("correlation").is_not_null())
        .select("_row", "correlation").collect()
        .join(rt, on="correlation", how="inner").drop("correlation")
    )
    pairs = {"launch_ts_ns": "_lts", "launch_dur_ns": "_ldur", "launch_tid": "_ltid", "launch_name": "_lname"}
    # a launch column with no value yet (Kineto) simply becomes the looked-up one: no second full column
    has = df.select([pl.col(c).is_not_null().any().alias(c) for c in pairs]).row(0, named=True)
    j = attach_rows(df, gpu, "_row")
    return j.with_columns(
        [(pl.coalesce(c, p) if has[c] else pl.col(p)).alias(c) for c, p in pairs.items()]
    ).drop(list(pairs.values()))


# -- CPU mode -----------------------------------------------------------------
# A rank with no GPU op (a CPU/gloo run) has no device timeline. Its stand-in is
# the work on the thread that runs the steps, plus gloo's collectives (see
# docs/cpu_mode.md). Only these rows get a category; everything else stays as read.

#: CPU operator names that are GEMMs (category dense_gemm, family ``gemm.cpu``)
CPU_GEMM_REGEX = r"^aten::(mm|bmm|addmm|matmul|linear|_grouped_mm|grouped_mm|baddbmm|addbmm|mv|addmv)$"
#: CPU attention operators (category attention, family ``attention.cpu``)
CPU_ATTENTION_REGEX = r"^aten::(scaled_dot_product_attention|_scaled_dot_product_\w*attention\w*)$"
#: host readbacks (``.item()``, ``.tolist()``, ``if t:``): left without category, family ``host_sync.cpu``
CPU_SYNC_REGEX = r"^aten::(item|_local_scalar_dense|is_nonzero)$"
#: gloo's own range for one collective, on its worker thread: the op that spans the transfer and the wait
GLOO_REGEX = r"^gloo:"
_CPU_OP = r"^[A-Za-z_][A-Za-z0-9_]*::"
_CPU_NOT_WORK = r"^(c10d|_c10d_functional|c10d_functional|profiler|autograd)::"
#: collective type from a c10d op / gloo range name, letters only (longest names first)
_COLL_TYPES = ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "barrier", "gather", "scatter", "reduce", "send", "recv")
CPU_KINDS = ["cpu_op", "range"]


def forward_tids(df: pl.DataFrame) -> list[int]:
    """Threads that run the steps (``tid`` of step rows); else the thread with the most ``cpu_op`` rows."""
    kind = pl.col("kind")
    tids = df.filter((kind == "step") & pl.col("tid").is_not_null()).get_column("tid").unique().sort().to_list()
    if tids:
        return [int(t) for t in tids]
    busiest = df.filter((kind == "cpu_op") & pl.col("tid").is_not_null()).group_by("tid").len().sort(["len", "tid"], descending=[True, False])
    return [int(busiest["tid"][0])] if busiest.height else []


def _cpu_device_row() -> pl.Expr:
    """CPU rows that stand in for device work (only :func:`_cpu_mode` gives them a category)."""
    return pl.col("kind").is_in(CPU_KINDS) & pl.col("category").is_not_null()


def _coll_type(name: pl.Expr) -> pl.Expr:
    letters = name.str.to_lowercase().str.replace(r"^[a-z0-9_]*::|^gloo:", "").str.replace_all(r"[^a-z]", "")
    out = pl.lit(None, dtype=pl.String)
    for t in reversed(_COLL_TYPES):
        out = pl.when(letters.str.contains(t)).then(pl.lit(t)).otherwise(out)
    return out


def _cpu_mode(df: pl.DataFrame) -> pl.DataFrame:
    """Categorize the device-like CPU rows of a rank without GPU ops (no-op when it has GPU ops).

    * top-level ``ns::op`` operators on the forward thread(s) (not nested in another
      operator, so exactly one is categorized at any instant): GEMMs → dense_gemm,
      SDPA → attention, others → other_compute (family ``other``); host readbacks get
      family ``host_sync.cpu`` and no category (their time is idle); ``c10d::`` ops
      and profiler internals stay uncategorized;
    * ``gloo:*`` ranges (one per collective, on gloo's worker thread) → communication,
      family ``allreduce.gloo`` / ``collective.gloo``, linked to the ``c10d::`` op that
      issued them as their launch (``launch_ts_ns``/``launch_dur_ns``/``launch_tid``/
      ``launch_name``), so steps and context rules see them on the forward thread.
    """
    kind = pl.col("kind")
    if df.select(kind.is_in(GPU_KINDS).any()).item():
        return df
    name = pl.col("name").cast(pl.String)
    d = row_index(df, "_row")
    upd = []
    tids = forward_tids(df)
    if tids:
        ops = d.filter((kind == "cpu_op") & pl.col("tid").is_in(tids) & (pl.col("dur_ns") >= 0)).select(
            "_row", "tid", "ts_ns", (pl.col("ts_ns") + pl.col("dur_ns")).alias("_end"), name.alias("_n")
        ).sort(["tid", "ts_ns", "_end"], descending=[False, False, True])
        prev_end = pl.col("_end").cum_max().shift(1).over("tid")
        top = ops.filter(prev_end.is_null() | (pl.col("ts_ns") >= prev_end))
        n = pl.col("_n")
        work = n.str.contains(_CPU_OP) & ~n.str.contains(_CPU_NOT_WORK) & ~n.str.contains(CPU_SYNC_REGEX)
        cat = (
            pl.when(~work).then(pl.lit(None, dtype=pl.String))
            .when(n.str.contains(CPU_GEMM_REGEX)).then(pl.lit("dense_gemm"))
            .when(n.str.contains(CPU_ATTENTION_REGEX)).then(pl.lit("attention"))
            .otherwise(pl.lit("other_compute"))
        )
        fam = (
            pl.when(n.str.contains(CPU_SYNC_REGEX)).then(pl.lit("host_sync.cpu"))
            .when(~work).then(pl.lit(None, dtype=pl.String))
            .when(n.str.contains(CPU_GEMM_REGEX)).then(pl.lit("gemm.cpu"))
            .when(n.str.contains(CPU_ATTENTION_REGEX)).then(pl.lit("attention.cpu"))
            .otherwise(pl.lit("other"))
        )
        top = top.select("_row", cat.alias("_c"), fam.alias("_f")).filter(pl.col("_f").is_not_null())
        upd.append(top.with_columns(*[pl.lit(None, dtype=t).alias(c) for c, t in _LAUNCH_T.items()]))
    gloo = d.filter(kind.is_in(CPU_KINDS) & name.str.contains(GLOO_REGEX) & (pl.col("dur_ns") >= 0)).select(
        "_row", "ts_ns", _coll_type(name).alias("_t"),
        pl.when(_coll_type(name) == "allreduce").then(pl.lit("allreduce.gloo")).otherwise(pl.lit("collective.gloo")).alias("_f"),
    )
    if gloo.height:
        issue = d.filter((kind == "cpu_op") & name.str.starts_with("c10d::")).select(
            pl.col("_row").alias("_irow"), pl.col("ts_ns").alias("_its"), _coll_type(name).alias("_t"),
            pl.col("dur_ns").alias("_ldur"), pl.col("tid").alias("_ltid"), name.alias("_lname"),
        ).filter(pl.col("_t").is_not_null()).sort("_its")
        g = gloo.with_columns(pl.col("_t").fill_null("?")).sort("ts_ns").join_asof(
            issue, left_on="ts_ns", right_on="_its", by="_t", strategy="backward", check_sortedness=False
        )
        # an issuing op launches one collective: a second gloo range on the same op is left unlinked
        first = pl.col("ts_ns") == pl.col("ts_ns").min().over("_irow")
        linked = pl.col("_irow").is_not_null() & first
        g = g.select(
            "_row", pl.lit("communication").alias("_c"), "_f",
            pl.when(linked).then(pl.col("_its")).alias("_lts"),
            pl.when(linked).then(pl.col("_ldur")).alias("_ldur"),
            pl.when(linked).then(pl.col("_ltid")).alias("_ltid"),
            pl.when(linked).then(pl.col("_lname")).alias("_lname"),
        )
        upd.append(g)
    if not upd:
        return df
    u = pl.concat(upd, how="vertical_relaxed")
    out = attach_rows(d, u, "_row")
    hit = pl.col("_f").is_not_null()
    return out.with_columns(
        pl.when(hit).then(pl.col("_c").cast(pl.Categorical)).otherwise(pl.col("category").cast(pl.Categorical)).alias("category"),
        pl.when(hit).then(pl.col("_f").cast(pl.Categorical)).otherwise(pl.col("family").cast(pl.Categorical)).alias("family"),
        pl.coalesce("launch_ts_ns", "_lts").alias("launch_ts_ns"),
        pl.coalesce("launch_dur_ns", "_ldur").alias("launch_dur_ns"),
        pl.coalesce("launch_tid", "_ltid").alias("launch_tid"),
        pl.coalesce(pl.col("launch_name").cast(pl.String), pl.col("_lname")).cast(pl.Categorical).alias("launch_name"),
    ).drop(["_row", "_c", "_f", "_lts", "_ldur", "_ltid", "_lname"])


_LAUNCH_T = {"_lts": pl.Int64, "_ldur": pl.Int64, "_ltid": pl.Int64, "_lname": pl.String}


def _context_ranges(df: pl.DataFrame, rules: RuleSet) -> tuple[pl.DataFrame, dict[int, list[int]]]:
    """Ranges some context rule names (``_rid`` per distinct name) and, per rule, the ``_rid`` it applies to."""
    ranges = df.filter(pl.col("kind") == "range").select(
        "tid", "ts_ns", (pl.col("ts_ns") + pl.col("dur_ns")).alias("end_ns"), pl.col("name").cast(pl.String).alias("rname")
    )
    rid: dict[str, int] = {}
    of_rule: dict[int, list[int]] = {}
    for n in ranges.get_column("rname").unique().to_list():
        for i, r in enumerate(rules.context):
            if r.range_regex.search(n):
                of_rule.setdefault(i, []).append(rid.setdefault(n, len(rid)))
    ranges = ranges.filter(pl.col("rname").is_in(list(rid))).with_columns(
        pl.col("rname").replace_strict(rid, return_dtype=pl.Int32).alias("_rid"))
    return ranges, of_rule


def _context_rules(df: pl.DataFrame, rules: RuleSet) -> pl.DataFrame:
    """Context rules (``schemas/categories_v1.json`` ``context``): the innermost range that any rule names decides;
    of the rules naming it, the first whose ``from_categories`` and ``name_regex`` hold for the op applies."""
    if not rules.context:
        return df
    ranges, of_rule = _context_ranges(df, rules)
    if ranges.height == 0:
        return df
    is_gpu = pl.col("kind").is_in(GPU_KINDS)
    gpu = (
        df.lazy().with_row_index("_row")
        .filter((is_gpu & pl.col("launch_ts_ns").is_not_null()) | _cpu_device_row())
        .select("_row", "kind", "tid", "ts_ns", "launch_tid", "launch_ts_ns", "category", "family", "name")
        .collect()
    )
    if gpu.height == 0:
        return df
    hit = covered_by(
        gpu.select(
            "_row",
            pl.when(is_gpu).then(pl.col("launch_tid")).otherwise(pl.coalesce("launch_tid", "tid")).alias("tid"),
            pl.when(is_gpu).then(pl.col("launch_ts_ns")).otherwise(pl.coalesce("launch_ts_ns", "ts_ns")).alias("ts"),
        ),
        ranges.rename({"ts_ns": "start", "end_ns": "end"}),
        by="tid",
        at="ts",
        payload=["_rid"],
        keep_order=False,
    ).filter(pl.col("_rid").is_not_null())
    if hit.height == 0:
        return df
    gpu = gpu.join(hit.select("_row", "_rid"), on="_row", how="inner")
    new_cat = []
    for i, r in enumerate(rules.context):
        sel = gpu.filter(pl.col("_rid").is_in(of_rule.get(i, [])))
        if sel.height == 0:
            continue
        cond = pl.col("category").is_in(list(r.from_categories))
        if r.name_regex is not None:
            by_name = pl.col("name").cast(pl.String).str.contains(r.name_regex.pattern)
            # CPU operators (aten::mm, aten::_grouped_mm) name no kernel: their family (gemm.cpu) counts too
            by_fam = _cpu_device_row() & pl.col("family").cast(pl.String).str.contains(r.name_regex.pattern).fill_null(False)
            cond = cond & (by_name | by_fam)
        sel = sel.filter(cond)
        gpu = gpu.join(sel.select("_row"), on="_row", how="anti")  # the first rule that applies wins
        new_cat.append(sel.select("_row", pl.lit(r.category).cast(pl.Categorical).alias("_c"),
                                  pl.lit(r.id).cast(pl.Categorical).alias("_f")))
    if not new_cat:
        return df
    upd = pl.concat(new_cat)
    out = attach_rows(row_index(df, "_row"), upd, "_row")
    return out.with_columns(
        pl.coalesce("_c", pl.col("category").cast(pl.Categorical)).alias("category"),
        pl.coalesce("_f", pl.col("family").cast(pl.Categorical)).alias("family"),
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
    """Collective metadata on communication ops (see the module docstring, step 4).

    Works on the communication rows only and attaches the results by row
    number; text columns stay categorical (no column of strings the length of the rank).
    """
    is_comm = (pl.col("kind").is_in(GPU_KINDS) | _cpu_device_row()) & (pl.col("category") == "communication")
    if not df.select(is_comm.any()).item():
        return df
    d = row_index(df, "_row")
    # 1. record_param_comms enclosing the launching runtime call on the same thread
    rpc = d.lazy().filter((pl.col("kind") == "cpu_op") & (pl.col("name") == "record_param_comms")).select(
        "tid", pl.col("ts_ns").alias("start"), (pl.col("ts_ns") + pl.col("dur_ns")).alias("end"), *_COLL_COLS
    ).collect()
    if rpc.height:
        need = d.lazy().filter(is_comm & pl.col("coll_name").is_null() & pl.col("launch_ts_ns").is_not_null()).select(
            "_row", "launch_tid", "launch_ts_ns", "launch_dur_ns", _cpu_device_row().alias("_cpu")
        ).collect()
        if need.height:
            iv = rpc.rename({c: f"_{c}" for c in _COLL_COLS})
            hit = covered_by(
                need.select("_row", pl.col("launch_tid").alias("tid"), pl.col("launch_ts_ns").alias("ts")),
                iv, by="tid", at="ts", payload=[f"_{c}" for c in _COLL_COLS], keep_order=False,
            )
            if need.select(pl.col("_cpu").any()).item():
                # CPU mode: gloo records record_param_comms inside the issuing c10d op, after its start
                inner = need.filter(pl.col("_cpu")).select(
                    "_row", pl.col("launch_tid").alias("tid"), pl.col("launch_ts_ns").alias("_a"),
                    (pl.col("launch_ts_ns") + pl.col("launch_dur_ns").fill_null(0)).alias("_b"),
                ).sort("_a").join_asof(iv.sort("start"), left_on="_a", right_on="start", by="tid", strategy="forward",
                                       check_sortedness=False).filter(pl.col("start") <= pl.col("_b"))
                pay = [f"_{c}" for c in _COLL_COLS]
                miss = hit.filter(pl.col("_coll_name").is_null() & pl.col("_row").is_in(inner["_row"].implode()))
                hit = pl.concat([hit.filter(~pl.col("_row").is_in(miss["_row"].implode())),
                                 miss.drop(pay).join(inner.select("_row", *pay), on="_row", how="left")], how="vertical_relaxed")
            d = attach_rows(d, hit.drop(["tid", "ts"]), "_row")
            d = d.with_columns([pl.coalesce(c, f"_{c}").alias(c) for c in _COLL_COLS]).drop([f"_{c}" for c in _COLL_COLS])
    # 2. lower-case names; infer the collective from the kernel name (regexes on the distinct names only)
    comm = d.lazy().filter(is_comm).select(
        "_row", "ts_ns", NAME_CODE.alias("_code"), "name", "coll_name",
        pl.coalesce(pl.col("pg_name").cast(pl.String), pl.lit("fam:") + pl.col("family").cast(pl.String)).alias("_k"),
    ).collect()
    names = comm.select("_code", pl.col("name").cast(pl.String)).unique("_code")
    inferred = pl.lit(None, dtype=pl.String)
    for rx, cname in reversed(_COLL_FROM_NAME):
        inferred = pl.when(pl.col("name").str.contains(rx)).then(pl.lit(cname)).otherwise(inferred)
    comm = comm.join(names.select("_code", inferred.alias("_inf")), on="_code", how="left").with_columns(
        pl.coalesce(pl.col("coll_name").cast(pl.String).str.to_lowercase(), "_inf").cast(pl.Categorical).alias("_cn")
    )
    # 3. sequence within (process group or family); recorded Seq wins when present
    comm = comm.sort("ts_ns").with_columns((pl.col("ts_ns").rank("ordinal").over("_k") - 1).cast(pl.Int64).alias("_seq"))
    d = attach_rows(d, comm.select("_row", "_cn", "_seq"), "_row")
    d = d.with_columns(pl.coalesce("_cn", "coll_name").alias("coll_name"), pl.coalesce("coll_seq", "_seq").alias("coll_seq"))
    return conform(d.drop(["_cn", "_seq", "_row"]))


def _assign_steps(df: pl.DataFrame) -> pl.DataFrame:
    steps = df.lazy().filter(pl.col("kind") == "step").select(
        "tid", pl.col("ts_ns").alias("start"), (pl.col("ts_ns") + pl.col("dur_ns")).alias("end"), pl.col("step_id").alias("_sid")
    ).collect()
    if steps.height == 0:
        return df
    d = row_index(df, "_row")
    is_gpu = pl.col("kind").is_in(GPU_KINDS)
    launched = is_gpu | _cpu_device_row()  # CPU mode: a gloo collective is placed by the c10d op that issued it
    pts = d.lazy().filter((is_gpu & pl.col("launch_ts_ns").is_not_null()) | _cpu_device_row() | (pl.col("kind") == "runtime")).select(
        "_row",
        pl.when(launched).then(pl.coalesce("launch_tid", "tid")).otherwise(pl.col("tid")).alias("tid"),
        pl.when(launched).then(pl.coalesce("launch_ts_ns", "ts_ns")).otherwise(pl.col("ts_ns")).alias("ts"),
    ).collect()
    if pts.height == 0:
        return df
    has_tid = steps.get_column("tid").null_count() < steps.height
    if has_tid:
        hit = covered_by(pts.filter(pl.col("tid").is_not_null()), steps.filter(pl.col("tid").is_not_null()), by="tid", at="ts",
                         payload=["_sid"], keep_order=False)
    else:
        hit = covered_by(pts, steps.drop("tid"), at="ts", payload=["_sid"], keep_order=False)
    d = attach_rows(d, hit.select("_row", "_sid"), "_row")
    return d.with_columns(pl.coalesce("step_id", "_sid").alias("step_id")).drop(["_row", "_sid"])


def finalize_rank(raw: pl.DataFrame | list[pl.DataFrame], rules: RuleSet | None = None, *, sort: bool = True) -> pl.DataFrame:
    """Finish one rank's raw rows (see module docstring); returns a conformed frame sorted by ts.

    ``sort=False`` skips the final sort (a full copy of the rank): the caller
    then orders rows itself, e.g. slice by slice with ``ts_order`` while writing.
    ``raw`` may be handed over as a one-element list, which is emptied: then the
    columns each step replaces are freed as it goes instead of living on in
    the caller's frame (peak memory of a large rank).
    """
    rules = rules or default_rules()
    df = conform(raw.pop() if isinstance(raw, list) else raw)
    del raw
    df = module_ranges(df)  # a stack trace's nn.Module ranges -> module context (tk.mod[...])
    # a Ctrl-C stops between the steps (each is a few polars passes over the rank)
    df = parse_steps(df, rules.steps_from)
    _interrupt.check("finalize")
    df = _launch_join(df)
    _interrupt.check("finalize")
    df = rules.categorize(df)
    _interrupt.check("finalize")
    df = _cpu_mode(df)
    df = _context_rules(df, rules)
    _interrupt.check("finalize")
    df = apply_moe_structure(df)
    df = _collectives(df)
    _interrupt.check("finalize")
    df = _assign_steps(df)
    df = conform(df)
    _interrupt.check("finalize")
    return df.sort("ts_ns", maintain_order=True) if sort else df


def resteps(df: pl.DataFrame, steps_from: str) -> pl.DataFrame:
    """Re-derive the steps of a finalized frame (any ranks) from ``steps_from`` (``analyze --steps-from``).

    Step rows that came from ranges become ranges again, every ``step_id`` is cleared, then
    :func:`parse_steps` and the step assignment run per rank as in :func:`finalize_rank`.
    Capture-side step records without a range (``profiled`` false) are dropped: the regex decides.
    """
    kind = pl.col("kind").cast(pl.String)
    back = df.filter(~((kind == "step") & (pl.col("profiled") == False))).with_columns(  # noqa: E712
        pl.when(kind == "step").then(pl.lit("range")).otherwise(kind).cast(pl.Categorical).alias("kind"),
        pl.lit(None, dtype=pl.Int64).alias("step_id"),
        *[pl.when(kind == "step").then(pl.lit(None, dtype=t)).otherwise(pl.col(c)).alias(c)
          for c, t in (("step_mode", pl.String), ("batch_size", pl.Int32), ("tokens", pl.Int64))],
    )
    parts = [_assign_steps(parse_steps(conform(g), steps_from)) for _, g in back.group_by("rank", maintain_order=True)]
    out = conform(pl.concat(parts, how="vertical_relaxed")) if parts else conform(back)
    return out.sort(["rank", "ts_ns"], maintain_order=True)


def ts_order(df: pl.DataFrame) -> pl.Series:
    """Row indices that sort ``df`` by ``ts_ns`` (stable), as ``finalize_rank(sort=True)`` would order it."""
    return df.select(pl.int_range(pl.len(), dtype=pl.UInt32).sort_by("ts_ns", maintain_order=True)).to_series()
