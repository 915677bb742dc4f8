"""Timeline payload, part 2: the detail window (lanes, kernel segments, steps, ranges,
collectives, stall and PCIe marks).

Pure and vectorized. Segments are float32 µs offsets from the window start
(≈ 0.01 µs resolution over a 100 ms window) with integer codes into string
tables; every string that comes from the trace is HTML-escaped here, once.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import polars as pl

from tracekit.report.timeline_data import CPU_LANE, Window, b64, esc, esc_expr

__all__ = ["detail_payload", "collective_instances", "MAX_SEGMENTS", "MAX_RANGE_DEPTH"]

MAX_SEGMENTS = 100_000
MAX_RANGE_DEPTH = 4
MAX_LINKS = 2_000
MAX_WAITS = 5_000
_FOLD_BUDGET = 10_000


def _codes(s: pl.Series) -> tuple[np.ndarray, list[str]]:
    """Dense codes (0-based, nulls → 0 with table[0] = '') and the escaped string table."""
    s = s.cast(pl.String)
    uniq = s.drop_nulls().unique().sort()
    table = [""] + [esc(v) for v in uniq.to_list()]
    codes = s.rank("dense").fill_null(0).cast(pl.UInt32).to_numpy()  # rank starts at 1: slot 0 is ""
    return codes.astype(np.uint32), table


def _in_window(df: pl.DataFrame, w: Window) -> pl.DataFrame:
    return df.filter((pl.col("ts_ns") < w.end_ns) & ((pl.col("ts_ns") + pl.col("dur_ns")) > w.start_ns)
                     | ((pl.col("dur_ns") == 0) & (pl.col("ts_ns") >= w.start_ns) & (pl.col("ts_ns") < w.end_ns)))


def _range_depth(r: pl.DataFrame) -> pl.DataFrame:
    """Nesting depth of ranges per rank: ranges open at each start (vectorized search_sorted)."""
    r = r.sort(["rank", "ts_ns", "dur_ns"], descending=[False, False, True]).with_columns(
        (pl.col("ts_ns") + pl.col("dur_ns")).alias("_end"))
    r = r.with_columns(pl.int_range(pl.len()).over("rank").alias("_pos"))
    out = []
    for _rank, g in r.partition_by("rank", as_dict=True).items():
        ends = np.sort(g.get_column("_end").to_numpy())
        closed = np.searchsorted(ends, g.get_column("ts_ns").to_numpy(), side="right")
        depth = g.get_column("_pos").to_numpy() - closed
        out.append(g.with_columns(pl.Series("depth", np.clip(depth, 0, MAX_RANGE_DEPTH - 1).astype(np.int32))))
    return pl.concat(out).drop(["_end", "_pos"]) if out else r.with_columns(pl.lit(0, pl.Int32).alias("depth"))


def collective_instances(ops_all: pl.DataFrame, analysis: Mapping[str, Any] | None) -> pl.DataFrame:
    """Per collective kernel: rank, ts_ns, pg, seq, wait_ns, late_rank, n_ranks.

    From ``analysis['collective_instances']`` (list of dicts or frame with rank,
    arrival_ns, pg, seq, wait_ns, ...: the analysis result's matching) when given, else
    :func:`tracekit.core.collectives.match_collectives` on the frame (the one wait definition).
    """
    schema = {"rank": pl.Int64, "ts_ns": pl.Int64, "pg": pl.String, "seq": pl.Int64, "wait_ns": pl.Int64,
              "late_rank": pl.Int64, "n_ranks": pl.Int64}
    inst = (analysis or {}).get("collective_instances")
    if inst is not None:
        try:
            f = inst if isinstance(inst, pl.DataFrame) else pl.DataFrame(list(inst), infer_schema_length=None)
            if {"rank", "arrival_ns", "pg", "seq"} <= set(f.columns):
                f = f.with_columns(
                    *[pl.lit(None).alias(c) for c in ("wait_ns", "late_rank", "n_ranks") if c not in f.columns])
                return f.select(
                    pl.col("rank").cast(pl.Int64), pl.col("arrival_ns").cast(pl.Int64).alias("ts_ns"),
                    pl.col("pg").cast(pl.String), pl.col("seq").cast(pl.Int64), pl.col("wait_ns").cast(pl.Int64),
                    pl.col("late_rank").cast(pl.Int64), pl.col("n_ranks").cast(pl.Int64))
        except (TypeError, ValueError, pl.exceptions.PolarsError):
            pass
    # no analysis given: the one matching (tracekit.core.collectives), never a second definition of wait
    from tracekit.core.collectives import match_collectives

    if not {"rank", "kind", "ts_ns", "dur_ns", "category"} <= set(ops_all.columns):
        return pl.DataFrame(schema=schema)
    from tracekit.schema import POLARS_SCHEMA

    absent = [c for c in ("name", "family", "pg_name", "pg_ranks", "coll_seq", "coll_name", "coll_dtype", "coll_in_nelems",
                          "coll_out_nelems", "coll_group_size", "stream", "step_id", "launch_ts_ns") if c not in ops_all.columns]
    m = match_collectives(ops_all.with_columns([pl.lit(None, POLARS_SCHEMA[c]).alias(c) for c in absent]))
    if m.height == 0:
        return pl.DataFrame(schema=schema)
    return m.select(pl.col("rank").cast(pl.Int64), pl.col("arrival_ns").cast(pl.Int64).alias("ts_ns"), pl.col("pg").cast(pl.String),
                    pl.col("seq").cast(pl.Int64), pl.col("wait_ns").cast(pl.Int64), pl.col("late_rank").cast(pl.Int64),
                    pl.col("n_ranks").cast(pl.Int64))


def _off_us(col: pl.Expr, w0: int) -> pl.Expr:
    """µs from the window start ``w0`` (float64; the arrays are float32)."""
    return ((col - w0).cast(pl.Float64) / 1e3)


def _window_frames(df: pl.DataFrame, ops_all: pl.DataFrame, w: Window) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """The window's device ops, steps and ranges (with their nesting ``depth``)."""
    kind = pl.col("kind").cast(pl.String)
    ops = _in_window(ops_all, w)
    steps = _in_window(df.filter(kind == "step"), w)
    # ranges that are device work (CPU mode: gloo collectives) are drawn as ops on their thread's lane
    ranges = _in_window(df.filter(kind == "range").join(
        ops_all.filter(pl.col("kind").cast(pl.String) == "range").select("rank", "ts_ns", "tid").with_columns(
            pl.lit(True).alias("_dev")), on=["rank", "ts_ns", "tid"], how="left").filter(pl.col("_dev").is_null())
        .drop("_dev"), w)
    if ranges.height:
        ranges = _range_depth(ranges)
    return ops, steps, ranges


def _lanes(
    ops: pl.DataFrame, steps: pl.DataFrame, ranges: pl.DataFrame, stalls: Sequence[Mapping[str, Any]]
) -> tuple[list[dict[str, Any]], pl.DataFrame]:
    """Lanes per rank: steps row, range rows, one row per (device, stream); and the frame that keys them
    (rank, ``_lk`` lane kind, ``_k1``/``_k2`` keys → ``lane`` index) for :func:`_with_lane`."""
    ranks = sorted(set(ops.get_column("rank").to_list()) | set(steps.get_column("rank").to_list())
                   | set(ranges.get_column("rank").to_list()) | {s["rank"] for s in stalls if s["rank"] is not None})
    streams = ops.select("rank", "device", "stream").unique().sort(["rank", "device", "stream"])
    comm_threads = {(int(a), int(b)) for a, b in ops.filter(pl.col("device") == CPU_LANE).group_by(["rank", "stream"]).agg(
        (pl.col("category") == "communication").all().alias("c")).filter(pl.col("c")).select("rank", "stream").iter_rows()}
    depth_n = (ranges.group_by("rank").agg(pl.col("depth").max()) if ranges.height
               else pl.DataFrame(schema={"rank": pl.Int32, "depth": pl.Int32}))
    depth_of = dict(zip(depth_n.get_column("rank").to_list(), depth_n.get_column("depth").to_list()))
    has_steps = set(steps.get_column("rank").to_list())
    lanes: list[dict[str, Any]] = []
    lane_rows: list[tuple[int, str, int, int]] = []  # rank, kind, key1, key2 → lane index
    for r in ranks:
        first = len(lanes)
        if r in has_steps:
            lanes.append({"label": f"r{r} steps", "rank": int(r), "kind": "step"})
            lane_rows.append((r, "step", 0, 0))
        for d in range(int(depth_of[r]) + 1 if r in depth_of else 0):
            lanes.append({"label": f"r{r} ranges" + (f" d{d}" if d else ""), "rank": int(r), "kind": "range"})
            lane_rows.append((r, "range", d, 0))
        for dev, st in streams.filter(pl.col("rank") == r).select("device", "stream").iter_rows():
            if dev == CPU_LANE:  # CPU mode: one lane per thread (forward thread, gloo worker)
                label = f"r{r} {'gloo' if (int(r), int(st)) in comm_threads else 'fwd'} t{st}"
            else:
                label = f"r{r} dev{dev} s{st}" if dev >= 0 else f"r{r} s{st}"
            lanes.append({"label": label, "rank": int(r), "kind": "stream"})
            lane_rows.append((r, "stream", int(dev), int(st)))
        for ln in lanes[first:]:
            ln["first"] = first
            ln["last"] = len(lanes) - 1
    lane_df = pl.DataFrame(
        {"rank": [x[0] for x in lane_rows], "_lk": [x[1] for x in lane_rows], "_k1": [x[2] for x in lane_rows],
         "_k2": [x[3] for x in lane_rows], "lane": list(range(len(lane_rows)))},
        schema={"rank": pl.Int64, "_lk": pl.String, "_k1": pl.Int64, "_k2": pl.Int64, "lane": pl.Int64})
    return lanes, lane_df


def _with_lane(f: pl.DataFrame, lane_df: pl.DataFrame, lk: str, k1: pl.Expr, k2: pl.Expr) -> pl.DataFrame:
    """``f`` with its ``lane`` index (rows without a lane of kind ``lk`` keyed by ``k1``/``k2`` dropped)."""
    f = f.with_columns(pl.col("rank").cast(pl.Int64), pl.lit(lk).alias("_lk"), k1.cast(pl.Int64).alias("_k1"),
                       k2.cast(pl.Int64).alias("_k2"))
    return f.join(lane_df, on=["rank", "_lk", "_k1", "_k2"], how="inner").drop(["_lk", "_k1", "_k2"])


def _fold(ops: pl.DataFrame, max_segments: int, n_lanes: int, w: Window) -> tuple[pl.DataFrame, dict[str, Any]]:
    """Cap the segments: per lane its longest ops in proportion to ``max_segments``; the rest folded into
    per-lane time bins (count, busy time, extent). Returns the kept ops and the folded arrays."""
    n_all = ops.height
    quota = (pl.len().over("lane").cast(pl.Float64) * (max_segments / n_all)).ceil()
    ops = ops.with_columns(
        (pl.col("dur_ns").rank("ordinal", descending=True).over("lane") <= quota).alias("_keep"))
    rest = ops.filter(~pl.col("_keep"))
    ops = ops.filter(pl.col("_keep")).drop("_keep")
    nb = max(20, _FOLD_BUDGET // max(n_lanes, 1))
    span = max(w.end_ns - w.start_ns, 1)
    fb = rest.with_columns(((pl.col("ts_ns") - w.start_ns).clip(0, span - 1) * nb // span).alias("_b")).group_by(
        ["lane", "_b"]).agg(pl.len().alias("n"), pl.col("dur_ns").sum().alias("busy"),
                            pl.col("ts_ns").min().alias("s"), (pl.col("ts_ns") + pl.col("dur_ns")).max().alias("e")
                            ).sort(["lane", "s"])
    folded = {
        "n_ops": int(rest.height), "n": int(fb.height),
        "start": b64(fb.select(_off_us(pl.col("s"), w.start_ns)).to_series().to_numpy(), "f4"),
        "dur": b64(((fb.get_column("e") - fb.get_column("s")).cast(pl.Float64) / 1e3).to_numpy(), "f4"),
        "lane": b64(fb.get_column("lane").to_numpy(), "u2"),
        "count": b64(fb.get_column("n").to_numpy(), "u4"),
        "busy": b64((fb.get_column("busy").cast(pl.Float64) / 1e3).to_numpy(), "f4"),
    }
    return ops, folded


def _launch_config() -> pl.Expr:
    """The hover's launch-config text: grid/block, registers, shared memory, bytes, copy kind (null parts left out)."""
    return pl.concat_str([
        pl.when(pl.col("grid_x").is_not_null()).then(pl.format("grid ({},{},{}) block ({},{},{})",
                                                                pl.col("grid_x"), pl.col("grid_y").fill_null(1),
                                                                pl.col("grid_z").fill_null(1),
                                                                pl.col("block_x").fill_null(1), pl.col("block_y").fill_null(1),
                                                                pl.col("block_z").fill_null(1))),
        pl.when(pl.col("registers_per_thread").is_not_null()).then(pl.format("regs {}", pl.col("registers_per_thread"))),
        pl.when(pl.col("shared_mem_bytes").is_not_null() & (pl.col("shared_mem_bytes") > 0)).then(
            pl.format("smem {} B", pl.col("shared_mem_bytes"))),
        pl.when(pl.col("bytes").is_not_null()).then(pl.format("{} B", pl.col("bytes"))),
        pl.col("memcpy_kind").cast(pl.String),
    ], separator=" · ", ignore_nulls=True)


def _kernels(ops: pl.DataFrame, n_all: int, cats: Sequence[str], w0: int) -> tuple[dict[str, Any], list[str], list[str]]:
    """Kernel segments (``ops`` sorted by lane and start) and their name and launch-config string tables."""
    cat_idx = {c: i for i, c in enumerate(cats)}
    name_codes, names = _codes(ops.get_column("name"))
    cfg = _launch_config()
    cfg_codes, cfgs = _codes(ops.select(pl.when(cfg == "").then(None).otherwise(cfg)).to_series())
    kern: dict[str, Any] = {
        "n": int(ops.height), "n_all": int(n_all),
        "start": b64(ops.select(_off_us(pl.col("ts_ns"), w0)).to_series().to_numpy(), "f4"),
        "dur": b64((ops.get_column("dur_ns").cast(pl.Float64) / 1e3).to_numpy(), "f4"),
        "lane": b64(ops.get_column("lane").to_numpy(), "u2"),
        "cat": b64(ops.get_column("category").replace_strict(cat_idx, default=0, return_dtype=pl.UInt8).to_numpy(), "u1"),
        "name": b64(name_codes, "u4"),
        "cfg": b64(cfg_codes, "u4"),
        "step": b64(ops.get_column("step_id").fill_null(-1).clip(-1, 2**31 - 1).to_numpy(), "i4"),
        "kind": b64(ops.get_column("kind").cast(pl.String).replace_strict(
            {"kernel": 0, "memcpy": 1, "memset": 2}, default=0, return_dtype=pl.UInt8).to_numpy(), "u1"),
    }
    return kern, names, cfgs


def _collectives(ops: pl.DataFrame, ops_all: pl.DataFrame, analysis: Mapping[str, Any] | None,
                 w0: int) -> dict[str, Any] | None:
    """Collective wait overlay (per drawn kernel that is a matched instance) and instance links."""
    inst = collective_instances(ops_all, analysis)
    if not (inst.height and ops.height):
        return None
    k = ops.with_row_index("_i").select("_i", pl.col("rank").cast(pl.Int64), "ts_ns", "lane", "dur_ns").join(
        inst, on=["rank", "ts_ns"], how="inner").unique("_i").sort("_i")
    if not k.height:
        return None
    pg_codes, pgs = _codes(k.get_column("pg"))
    coll: dict[str, Any] = {
        "n": int(k.height), "max_waits": MAX_WAITS,
        "idx": b64(k.get_column("_i").to_numpy(), "u4"),
        "pg": b64(pg_codes, "u4"), "pgs": pgs,
        "seq": b64(k.get_column("seq").fill_null(-1).to_numpy(), "i4"),
        "wait": b64((k.get_column("wait_ns").fill_null(0).cast(pl.Float64) / 1e3).to_numpy(), "f4"),
        "late": b64(k.get_column("late_rank").fill_null(-1).to_numpy(), "i4"),
        "nr": b64(k.get_column("n_ranks").fill_null(0).to_numpy(), "u2"),
    }
    # links: one polyline per instance over its lanes at the release time (last arrival)
    links = k.with_columns((pl.col("ts_ns") + pl.col("wait_ns").fill_null(0)).alias("_rel")).group_by(
        ["pg", "seq"]).agg(pl.col("_rel").max(), pl.col("lane").sort(), pl.col("wait_ns").max().alias("_w")
                           ).filter(pl.col("lane").list.len() > 1)
    if links.height:
        # the MAX_LINKS instances with the longest wait (a link per instance costs GL points)
        links = links.sort("_w", descending=True, nulls_last=True).head(MAX_LINKS).sort("_rel")
        coll["link_x"] = b64(links.select(_off_us(pl.col("_rel"), w0)).to_series().to_numpy(), "f4")
        coll["link_lanes"] = b64(links.get_column("lane").list.explode().to_numpy(), "u2")
        coll["link_len"] = b64(links.get_column("lane").list.len().to_numpy(), "u2")
    return coll


def _steps(steps: pl.DataFrame, lane_df: pl.DataFrame, w0: int) -> dict[str, Any] | None:
    """Step bars on each rank's steps lane, with their labels (id, mode, batch, tokens, unprofiled)."""
    if not steps.height:
        return None
    steps = _with_lane(steps, lane_df, "step", pl.lit(0), pl.lit(0)).sort(["lane", "ts_ns"])
    label = pl.concat_str([
        pl.format("step {}", pl.col("step_id").cast(pl.String).fill_null("?")),
        esc_expr(pl.col("step_mode")), pl.format("bs={}", pl.col("batch_size")),
        pl.format("tokens={}", pl.col("tokens")),
        pl.when(pl.col("profiled") == False).then(pl.lit("(unprofiled)")),  # noqa: E712
    ], separator=" ", ignore_nulls=True)
    return {"n": int(steps.height),
            "start": b64(steps.select(_off_us(pl.col("ts_ns"), w0)).to_series().to_numpy(), "f4"),
            "dur": b64((steps.get_column("dur_ns").cast(pl.Float64) / 1e3).to_numpy(), "f4"),
            "lane": b64(steps.get_column("lane").to_numpy(), "u2"),
            "id": b64(steps.get_column("step_id").fill_null(-1).clip(-1, 2**31 - 1).to_numpy(), "i4"),
            "label": steps.select(label).to_series().to_list()}


def _ranges(ranges: pl.DataFrame, lane_df: pl.DataFrame, w0: int) -> dict[str, Any] | None:
    """Range bars on the range lane of their nesting depth, names as codes into an escaped table."""
    if not ranges.height:
        return None
    ranges = _with_lane(ranges, lane_df, "range", pl.col("depth"), pl.lit(0)).sort(["lane", "ts_ns"])
    rc, rnames = _codes(ranges.get_column("name"))
    return {"n": int(ranges.height), "names": rnames,
            "start": b64(ranges.select(_off_us(pl.col("ts_ns"), w0)).to_series().to_numpy(), "f4"),
            "dur": b64((ranges.get_column("dur_ns").cast(pl.Float64) / 1e3).to_numpy(), "f4"),
            "lane": b64(ranges.get_column("lane").to_numpy(), "u2"),
            "name": b64(rc, "u4")}


def _marks(items: Sequence[Mapping[str, Any]], w: Window) -> list[dict[str, Any]]:
    """Marks from the analysis (stalls, PCIe phases; already escaped) that touch the window, at most 5000."""
    out: list[dict[str, Any]] = []
    for it in items:
        if it["end_ns"] < w.start_ns or it["start_ns"] > w.end_ns:
            continue
        out.append({"rank": it["rank"], "s": (it["start_ns"] - w.start_ns) / 1e3, "d": it["dur_ns"] / 1e3,
                    "label": it["label"], "detail": it["detail"]})
        if len(out) >= 5000:
            break
    return out


def detail_payload(
    df: pl.DataFrame,
    ops_all: pl.DataFrame,
    cats: Sequence[str],
    base_ns: int,
    w: Window,
    *,
    analysis: Mapping[str, Any] | None = None,
    stalls: Sequence[Mapping[str, Any]] = (),
    pcie: Sequence[Mapping[str, Any]] = (),
    max_segments: int = MAX_SEGMENTS,
) -> dict[str, Any]:
    """Lanes and drawable items for the window; see the module docstring for units."""
    ops, steps, ranges = _window_frames(df, ops_all, w)
    lanes, lane_df = _lanes(ops, steps, ranges, stalls)
    ops = _with_lane(ops, lane_df, "stream", pl.col("device"), pl.col("stream"))
    n_all = ops.height
    folded: dict[str, Any] | None = None
    if n_all > max_segments:
        ops, folded = _fold(ops, max_segments, len(lanes), w)
    ops = ops.sort(["lane", "ts_ns"])
    kern, names, cfgs = _kernels(ops, n_all, cats, w.start_ns)
    return {
        "x0_ms": (w.start_ns - base_ns) / 1e6, "x1_ms": (w.end_ns - base_ns) / 1e6, "reason": esc(w.reason),
        "lanes": lanes, "kernels": kern, "names": names, "cfgs": cfgs, "folded": folded,
        "coll": _collectives(ops, ops_all, analysis, w.start_ns), "steps": _steps(steps, lane_df, w.start_ns),
        "ranges": _ranges(ranges, lane_df, w.start_ns), "stalls": _marks(stalls, w), "pcie": _marks(pcie, w),
    }
