"""Timeline payload, part 1: capture bounds, window choice, binned overview, counters.

Pure functions over a trace frame; no IO. Everything here is *presentation*
(binning, decimation, picking what to draw); the numbers shown in the summary
come from the analysis dict, never from here.

Times in the payload are milliseconds since the capture start (float64 in
JSON scalars) or compact typed arrays (base64 of little-endian float32/uint8),
decoded by the page's script.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import polars as pl

from tracekit._errors import UsageError
from tracekit.core.intervals import covered_by, merge
from tracekit.core.window import cpu_mode_ranks, device_op_expr, observed_spans, trace_overview
from tracekit.schema import CATEGORIES, GPU_OP_KINDS
from tracekit.core.window import parse_time_spec
from tracekit.report.palette import CATEGORY_COLORS
from tracekit.report.palette import EXTRA_COLORS as _EXTRA_COLORS

__all__ = [
    "CATEGORY_COLORS",
    "Window",
    "b64",
    "esc",
    "esc_expr",
    "parse_window",
    "capture_bounds",
    "gpu_ops",
    "CPU_LANE",
    "profiled_spans",
    "profiler_windows",
    "views_analysis",
    "steps_in_spans",
    "chooser_entries",
    "category_list",
    "choose_window",
    "data_window",
    "overview_payload",
    "counter_payload",
    "counter_overview",
    "analysis_events",
]


_ESC = (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"), ('"', "&#34;"), ("'", "&#39;"))


def esc(s: object) -> str:
    """HTML-escape a trace string for page text *and* plotly labels (which render HTML).

    Uses only entities plotly's label renderer decodes (``&amp; &lt; &gt;`` and
    numeric ones), so the text shows verbatim and never becomes markup.
    """
    t = "" if s is None else str(s)
    for a, b in _ESC:
        t = t.replace(a, b)
    return t


def esc_expr(e: pl.Expr) -> pl.Expr:
    """Vectorized :func:`esc` on a string expression."""
    e = e.cast(pl.String)
    for a, b in _ESC:
        e = e.str.replace_all(a, b, literal=True)
    return e


def b64(a: np.ndarray, dtype: str) -> dict[str, Any]:
    """A typed array for the page: ``{"t": dtype, "b": base64 little-endian bytes, "n": len}``."""
    arr = np.ascontiguousarray(np.asarray(a).astype("<" + {"f4": "f4", "f8": "f8", "u1": "u1", "u2": "u2",
                                                           "u4": "u4", "i4": "i4"}[dtype]))
    return {"t": dtype, "b": base64.b64encode(arr.tobytes()).decode("ascii"), "n": int(arr.size)}


@dataclass(frozen=True)
class Window:
    """Detail window in absolute ns, and why it was chosen (shown on the page)."""

    start_ns: int
    end_ns: int
    reason: str


def parse_window(text: str) -> tuple[int, int]:
    """``"12.30s:12.45s"`` → (start, end) ns relative to capture start (:func:`tracekit.core.window.parse_time_spec`)."""
    return parse_time_spec(text)


def capture_bounds(df: pl.DataFrame, meta: Mapping[str, Any] | None) -> tuple[int, int]:
    """(start, end) ns of the capture: the footer's capture window when present, widened to the data."""
    lo = hi = None
    if df.height:
        r = df.select(pl.col("ts_ns").min().alias("lo"), (pl.col("ts_ns") + pl.col("dur_ns")).max().alias("hi")).row(0)
        lo, hi = r
    m = meta or {}
    win = (m.get("capture") or {}).get("window_ns") or m.get("window_ns")
    if isinstance(win, (list, tuple)) and len(win) == 2 and all(isinstance(v, (int, float)) for v in win):
        lo = int(win[0]) if lo is None else min(int(win[0]), lo)
        hi = int(win[1]) if hi is None else max(int(win[1]), hi)
    if lo is None or hi is None:
        return 0, 1
    return int(lo), int(max(hi, lo + 1))


def gpu_ops(df: pl.DataFrame) -> pl.DataFrame:
    """Device work with a non-null ``category`` and lane keys ``device`` / ``stream``.

    Device work is what the analysis counts (:func:`tracekit.core.window.device_ops`):
    GPU ops, or on a CPU-mode rank its categorized forward-thread operators and gloo
    collective ranges (docs/cpu_mode.md). GPU memcpy/memset default to memory, kernels to
    other_compute. CPU-mode rows get ``device = CPU_LANE`` and ``stream = tid`` (one lane
    per thread).
    """
    kind = pl.col("kind").cast(pl.String)
    cpu = cpu_mode_ranks(df) if df.height else []
    g = df.filter(device_op_expr(cpu))
    on_cpu = ~kind.is_in(list(GPU_OP_KINDS))
    tid = pl.col("tid") if "tid" in g.columns else pl.lit(None, pl.Int64)
    return g.with_columns(
        pl.coalesce(
            pl.col("category").cast(pl.String),
            pl.when(kind == "kernel").then(pl.lit("other_compute")).otherwise(pl.lit("memory")),
        ).alias("category"),
        pl.when(on_cpu).then(tid.cast(pl.Int64).fill_null(-1)).otherwise(pl.col("stream").cast(pl.Int64).fill_null(-1))
        .alias("stream"),
        pl.when(on_cpu).then(pl.lit(CPU_LANE)).otherwise(pl.col("device").cast(pl.Int32).fill_null(-1))
        .cast(pl.Int32).alias("device"),
    )


#: ``device`` of CPU-mode lanes (their ``stream`` is the thread id)
CPU_LANE = -2


def profiled_spans(df: pl.DataFrame, meta: Mapping[str, Any] | None) -> list[tuple[int, int]]:
    """The stretches that were profiled, absolute ns, sorted and disjoint.

    The analysis' window owner decides (:func:`tracekit.core.window.observed_spans`):
    the profiler windows of a windowed capture, each extended to the end of the work
    launched inside it; with at most one window, the extent of the device work.
    """
    cap = (meta or {}).get("capture")
    pw = cap.get("profiler_windows") if isinstance(cap, Mapping) else None
    ov = trace_overview(df, small=False)
    spans = observed_spans(df, pw, cpu_ranks=ov.cpu_ranks) if df.height else None
    if spans:
        return [(int(a), int(b)) for a, b in spans]
    ext = ov.extents
    if ext.height == 0:
        return []
    return [(int(ext["lo"].min()), int(ext["hi"].max()))]  # type: ignore[arg-type]


def views_analysis(result: Any) -> dict[str, Any]:
    """What the timeline and the Perfetto export read from an :class:`~tracekit.analysis.result.AnalysisResult`:
    its ``analyze --json`` sections, plus ``collective_instances`` (the matched instances on the trace's
    own clock) and ``profiled_spans`` (the observed stretches the analysis decided)."""
    out = dict(result.to_json())
    out["collective_instances"] = result.instances_in_input_time()
    out["profiled_spans"] = [(int(a), int(b)) for a, b in result.spans]
    return out


def profiler_windows(meta: Mapping[str, Any] | None) -> list[tuple[int, int]]:
    """The capture's profiler windows as recorded (absolute ns), empty when not a windowed capture."""
    cap = (meta or {}).get("capture")
    pw = cap.get("profiler_windows") if isinstance(cap, Mapping) else None
    out = []
    for x in pw or []:
        if isinstance(x, (list, tuple)) and len(x) == 2 and all(isinstance(v, (int, float)) for v in x):
            out.append((int(x[0]), int(x[1])))
    return sorted(out)


def category_list(ops: pl.DataFrame) -> list[str]:
    """Categories present, in schema order, then unknown ones sorted."""
    seen = set(ops.get_column("category").unique().to_list()) if ops.height else set()
    return [c for c in CATEGORIES if c in seen] + sorted(c for c in seen if c not in CATEGORIES)


def colors_for(cats: Sequence[str]) -> list[str]:
    out, k = [], 0
    for c in cats:
        if c in CATEGORY_COLORS:
            out.append(CATEGORY_COLORS[c])
        else:
            out.append(_EXTRA_COLORS[k % len(_EXTRA_COLORS)])
            k += 1
    return out


# ---------------------------------------------------------------- analysis events
_START_KEYS = ("ts_ns", "start_ns", "t0_ns", "begin_ns", "arrival_ns")
_END_KEYS = ("end_ns", "t1_ns")
_DUR_KEYS = ("dur_ns", "wait_ns", "duration_ns", "lost_ns")
_LABEL_KEYS = ("cause", "kind", "reason", "type", "name", "coll_name", "collective", "direction")


def analysis_events(items: Any) -> list[dict[str, Any]]:
    """Normalize ``analysis['stalls']`` / ``['pcie_phases']`` entries (every key optional).

    Accepts a list of dicts or a polars frame; each item needs an absolute start
    (``ts_ns``/``start_ns``/…) and an end or duration. Returns dicts with
    ``rank`` (None = all ranks), ``start_ns``, ``end_ns``, ``label`` and ``detail`` (both
    escaped), ``dur_ns``. Items without usable times are skipped.
    """
    if items is None:
        return []
    if isinstance(items, pl.DataFrame):
        items = items.to_dicts()
    if isinstance(items, Mapping):
        items = items.get("items") or items.get("phases") or items.get("rows") or []
    out: list[dict[str, Any]] = []
    if not isinstance(items, (list, tuple)):
        return out
    for it in items:
        if not isinstance(it, Mapping):
            continue
        s = next((it[k] for k in _START_KEYS if isinstance(it.get(k), (int, float))), None)
        if s is None:
            continue
        e = next((it[k] for k in _END_KEYS if isinstance(it.get(k), (int, float))), None)
        if e is None:
            d = next((it[k] for k in _DUR_KEYS if isinstance(it.get(k), (int, float))), 0)
            e = s + d
        rank = it.get("rank", it.get("waiting_rank"))
        rank = int(rank) if isinstance(rank, (int, float)) else None
        label = next((str(it[k]) for k in _LABEL_KEYS if it.get(k) not in (None, "")), "")
        bits = []
        for k in ("late_rank", "collective", "coll_name", "pg", "seq", "step", "detail", "direction", "pct_of_link",
                  "achieved_bytes_per_s", "source", "during", "message"):
            v = it.get(k)
            if isinstance(v, float):
                v = f"{v:.3g}"
            elif isinstance(v, (list, tuple)):
                v = "; ".join(str(x) for x in v[:3]) + (" …" if len(v) > 3 else "")
            if v not in (None, "") and str(v) != label:
                bits.append(f"{k}={v}")
        out.append({"rank": rank, "start_ns": int(s), "end_ns": int(max(e, s)), "dur_ns": int(max(e - s, 0)),
                    "label": esc(label), "detail": esc(", ".join(bits))})
    return out


# ---------------------------------------------------------------- window
def steps_in_spans(df: pl.DataFrame, spans: Sequence[tuple[int, int]]) -> pl.DataFrame:
    """Step rows (``dur_ns > 0``, not marked unprofiled) whose midpoint lies inside a profiled span.

    Adds ``span_i`` (index into ``spans``); the containment test is the interval
    primitive :func:`tracekit.core.intervals.covered_by`.
    """
    kind = pl.col("kind").cast(pl.String)
    st = df.filter((kind == "step") & (pl.col("dur_ns") > 0) & pl.col("profiled").fill_null(True))
    if st.height == 0 or not spans:
        return st.with_columns(pl.lit(None, pl.Int64).alias("span_i")).clear()
    iv = pl.DataFrame({"start": [int(x[0]) for x in spans], "end": [int(x[1]) for x in spans],
                       "span_i": list(range(len(spans)))}, schema={"start": pl.Int64, "end": pl.Int64, "span_i": pl.Int64})
    st = covered_by(st.with_columns((pl.col("ts_ns") + pl.col("dur_ns") // 2).cast(pl.Int64).alias("_mid")), iv, at="_mid",
                    payload=["span_i"])
    return st.filter(pl.col("span_i").is_not_null()).drop("_mid")


def _span_label(i: int, spans: Sequence[tuple[int, int]], windowed: bool) -> str:
    return f"profiler window {i + 1} of {len(spans)}" if windowed else "the profiled stretch"


def _steps_label(ids: Sequence[int], n_steps: int) -> str:
    """``step 7``, ``steps 7–9``, or ``3 steps`` when they carry no ids."""
    if not ids:
        return f"{n_steps} steps"
    lo, hi = min(ids), max(ids)
    return f"step {lo}" if lo == hi else f"steps {lo}–{hi}"


def choose_window(
    df: pl.DataFrame,
    ops: pl.DataFrame,
    base_ns: int,
    end_ns: int,
    *,
    window: tuple[int, int] | str | None = None,
    step: int | None = None,
    spans: Sequence[tuple[int, int]] | None = None,
    windowed: bool = False,
    n_steps: int = 3,
    fallback_ops: int = 20_000,
) -> Window:
    """The detail view: explicit ``window`` (relative ns or text) > ``step`` > a representative
    stretch of ``n_steps`` consecutive steps *inside one profiled span* (median-like duration,
    middle of the profiled steps; ``spans`` from :func:`profiled_spans`) > the central
    ``fallback_ops`` device ops > the whole capture. ``windowed``: the spans are profiler windows."""
    if window is not None:
        a, b = parse_window(window) if isinstance(window, str) else (int(window[0]), int(window[1]))
        if a >= end_ns - base_ns or b <= 0:
            raise UsageError(
                f"--window {a / 1e9:.6f}s:{b / 1e9:.6f}s is outside the capture (0s:{(end_ns - base_ns) / 1e9:.6f}s)"
            )
        return Window(base_ns + a, base_ns + b, f"window {a / 1e9:.6f}s–{b / 1e9:.6f}s")
    kind = pl.col("kind").cast(pl.String)
    steps = df.filter(kind == "step")
    if step is not None:
        hit = steps.filter(pl.col("step_id") == step)
        if hit.height == 0:
            hit = ops.filter(pl.col("step_id") == step)
        if hit.height == 0:
            all_ids: list[int] = steps.get_column("step_id").drop_nulls().to_list()
            have = f"steps {min(all_ids)}..{max(all_ids)}" if all_ids else "no step annotations"
            raise UsageError(f"--step {step}: not in the trace ({have}); pick another step")
        lo, hi = hit.select(pl.col("ts_ns").min().alias("lo"), (pl.col("ts_ns") + pl.col("dur_ns")).max().alias("hi")).row(0)
        return Window(int(lo), int(hi), f"step {step}")
    spans = list(spans or [])
    st = steps_in_spans(df, spans)
    if st.height:
        r0 = st.get_column("rank").min()
        s0 = st.filter(pl.col("rank") == r0).sort("ts_ns")
        n = s0.height
        lo_i, hi_i = n // 4, max(n // 4 + 1, (3 * n) // 4)
        mid = s0.slice(lo_i, hi_i - lo_i)
        med = float(s0.get_column("dur_ns").median())  # type: ignore[arg-type]
        i = lo_i + int((mid.get_column("dur_ns").cast(pl.Float64) - med).abs().arg_min() or 0)
        sp = s0.get_column("span_i").to_numpy()
        same = np.flatnonzero(sp == sp[i])
        j0, j1 = int(same.min()), int(same.max()) + 1  # steps of that span (sorted by start: contiguous)
        i = max(min(i, j1 - n_steps), j0)
        pick = s0.slice(i, min(n_steps, j1 - i))
        lo, hi = pick.select(pl.col("ts_ns").min().alias("lo"), (pl.col("ts_ns") + pl.col("dur_ns")).max().alias("hi")).row(0)
        ids = pick.get_column("step_id").drop_nulls()
        if ids.len():  # the same steps on every rank, unless ranks' step ids do not line up
            all_r = st.filter(pl.col("step_id").is_in(ids.implode()))
            lo2, hi2 = all_r.select(pl.col("ts_ns").min().alias("lo"), (pl.col("ts_ns") + pl.col("dur_ns")).max().alias("hi")).row(0)
            if hi2 - lo2 <= 3 * (hi - lo):
                lo, hi = lo2, hi2
        sa, sb = spans[int(sp[i])]
        lo, hi = max(int(lo), sa), min(int(hi), sb)  # inside the profiled span (a step may begin before it)
        label = _steps_label(ids.to_list(), pick.height)
        where = _span_label(int(sp[i]), spans, windowed)
        return Window(int(lo), int(hi), f"{label} in {where}: representative (median-length steps, mid-capture)")
    if ops.height:
        o = ops
        if spans:  # ops of the middle span
            a, b = spans[len(spans) // 2]
            mid_ops = ops.filter((pl.col("ts_ns") < b) & ((pl.col("ts_ns") + pl.col("dur_ns")) > a))
            o = mid_ops if mid_ops.height else ops
        ts = o.get_column("ts_ns").sort()
        ends = (o.get_column("ts_ns") + o.get_column("dur_ns")).sort()
        n = ts.len()
        k = min(fallback_ops, n)
        a0 = max((n - k) // 2, 0)
        lo, hi = int(ts[a0]), int(ends[min(a0 + k, n) - 1])
        return Window(lo, max(hi, lo + 1), f"the central {k} device ops" + (" of the middle profiled span" if spans else ""))
    return Window(base_ns, end_ns, "the whole capture: it holds no device work (no kernels, copies or CPU-mode "
                  "operators; a capture without a completed profiler window records only steps and counters)")


def data_window(ops: pl.DataFrame, spans: Sequence[tuple[int, int]], view: Window, max_segments: int) -> Window:
    """The stretch whose ops the page embeds: every profiled span when their ops fit in
    ``max_segments`` (the window chooser and zooming then reach all of them), else the view."""
    if not spans:
        return view
    lo, hi = min(min(a for a, _ in spans), view.start_ns), max(max(b for _, b in spans), view.end_ns)
    n = ops.filter((pl.col("ts_ns") < hi) & ((pl.col("ts_ns") + pl.col("dur_ns")) > lo)).height
    if n > max_segments:
        return view
    return Window(int(lo), int(hi), "every profiled span")


def chooser_entries(
    df: pl.DataFrame,
    spans: Sequence[tuple[int, int]],
    base_ns: int,
    data: Window,
    *,
    windowed: bool,
    stalls: Sequence[Mapping[str, Any]] = (),
    max_steps: int = 400,
) -> list[dict[str, Any]]:
    """What the page's window chooser lists: profiler windows, the profiled steps (per step id
    over all ranks; at most ``max_steps``, evenly spread), the 10 worst stalls. Each entry:
    ``kind``, escaped ``label``, ``t0``/``t1`` (ms since capture start), ``inside`` (its ops are
    embedded) and ``flag`` (the ``--window`` that centres a new page on it)."""

    def entry(kind: str, label: str, a: int, b: int) -> dict[str, Any]:
        return {"kind": kind, "label": esc(label), "t0": (a - base_ns) / 1e6, "t1": (b - base_ns) / 1e6,
                "inside": bool(a < data.end_ns and b > data.start_ns),
                "flag": f"--window {max(a - base_ns, 0) / 1e9:.6f}s:{(b - base_ns) / 1e9:.6f}s"}

    out = []
    for i, (a, b) in enumerate(spans):
        out.append(entry("window", f"{_span_label(i, spans, windowed)}: {(a - base_ns) / 1e9:.3f}–{(b - base_ns) / 1e9:.3f} s"
                         f" ({(b - a) / 1e6:,.1f} ms)", a, b))
    st = steps_in_spans(df, spans)
    if st.height:
        g = st.group_by(["span_i", pl.col("step_id").fill_null(-1)]).agg(
            pl.col("ts_ns").min().alias("a"), (pl.col("ts_ns") + pl.col("dur_ns")).max().alias("b"),
            pl.col("step_mode").cast(pl.String).drop_nulls().first().alias("mode"),
            pl.col("batch_size").drop_nulls().first().alias("bs")).sort("a")
        if g.height > max_steps:
            g = g.gather(np.linspace(0, g.height - 1, max_steps).round().astype(np.int64))
        for sp, sid, a, b, mode, bs in g.select("span_i", "step_id", "a", "b", "mode", "bs").iter_rows():
            bits = [f"step {sid}" if sid >= 0 else "step", mode, f"bs={bs}" if bs is not None else None,
                    f"{(b - a) / 1e6:,.2f} ms"]
            if windowed:
                bits.append(f"window {sp + 1}")
            out.append(entry("step", " · ".join(x for x in bits if x), int(a), int(b)))
    for s in sorted(stalls, key=lambda s: -s["dur_ns"])[:10]:
        pad = max(s["dur_ns"], 1_000_000)
        who = f"rank {s['rank']} " if s["rank"] is not None else ""
        out.append(entry("stall", f"stall: {who}waits {s['dur_ns'] / 1e6:,.3f} ms", s["start_ns"] - pad, s["end_ns"] + pad))
    return out


# ---------------------------------------------------------------- overview
def _binned_union(starts: np.ndarray, ends: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Covered length per bin for *disjoint sorted* intervals (float64, ns)."""
    if starts.size == 0:
        return np.zeros(edges.size - 1)
    cs = np.concatenate([[0.0], np.cumsum(ends - starts)])
    k = np.searchsorted(starts, edges, side="right")  # intervals starting at or before edge
    prev = np.clip(k - 1, 0, starts.size - 1)
    partial = np.where(k > 0, np.minimum(edges - starts[prev], ends[prev] - starts[prev]), 0.0)
    covered = cs[np.maximum(k - 1, 0)] * (k > 0) + np.clip(partial, 0, None)
    return np.diff(covered)


def overview_payload(ops: pl.DataFrame, cats: Sequence[str], ranks: Sequence[int], base_ns: int, end_ns: int,
                     *, bins: int = 3000) -> dict[str, Any]:
    """Busy fraction per (rank, category) row and time bin, quantized to uint8 (0 = idle).

    Each row is the union of that category's ops on that rank (streams merged), so
    a value is the share of the bin in which at least one such op ran.
    """
    span = max(end_ns - base_ns, 1)
    nb = int(max(1, min(bins, span // 1000)))  # bins no finer than 1 µs
    edges = base_ns + np.linspace(0.0, float(span), nb + 1)
    width = span / nb
    rows: list[tuple[int, int]] = []
    data: list[np.ndarray] = []
    if ops.height:
        iv = ops.select(pl.col("rank"), pl.col("category"), pl.col("ts_ns").alias("start"),
                        (pl.col("ts_ns") + pl.col("dur_ns")).alias("end"))
        m = merge(iv, by=["rank", "category"])
        parts = {(k[0], k[1]): g for k, g in m.partition_by(["rank", "category"], as_dict=True).items()}
    else:
        parts = {}
    for r in ranks:
        for ci, c in enumerate(cats):
            g = parts.get((r, c))
            if g is None:
                continue
            busy = _binned_union(g.get_column("start").to_numpy().astype(np.float64),
                                 g.get_column("end").to_numpy().astype(np.float64), edges)
            frac = np.clip(busy / width, 0.0, 1.0)
            q = np.where(frac > 0, np.maximum(1, np.rint(frac * 255)), 0).astype(np.uint8)
            rows.append((int(r), ci))
            data.append(q)
    z = np.concatenate(data) if data else np.zeros(0, np.uint8)
    return {
        "bin_ms": width / 1e6,
        "nbins": nb,
        "rows": [[r, c] for r, c in rows],
        "z": b64(z, "u1"),
    }


# ---------------------------------------------------------------- counters
_KEY_COUNTER = re.compile(r"^(.*power_w|sm_active_pct|tensor_active_pct|pcie_(rx|tx)_(bytes_per_s|pct))$")


def key_counter_expr() -> pl.Expr:
    """Counters shown by default: power, SM / tensor activity, PCIe throughput (others with ``all_counters``)."""
    return pl.col("name").cast(pl.String).str.contains(_KEY_COUNTER.pattern)


def counter_group(name: str) -> tuple[str, str, float]:
    """(group title, unit, scale) for a counter name by its unit suffix."""
    if name.startswith("pcie") and name.endswith("_pct"):
        return "PCIe % of link", "%", 1.0
    if name.endswith("bytes_per_s"):
        return ("PCIe / link GB/s" if "pcie" in name or "nvlink" in name else "bandwidth GB/s"), "GB/s", 1e-9
    if name.endswith("_w"):
        return "power W", "W", 1.0
    if name.endswith("_pct"):
        return "activity %", "%", 1.0
    if name.endswith("_mhz"):
        return "clock MHz", "MHz", 1.0
    if name.endswith("_c"):
        return "temperature °C", "°C", 1.0
    return "other counters", "", 1.0


_GROUP_ORDER = ("power W", "activity %", "PCIe / link GB/s", "PCIe % of link", "bandwidth GB/s", "clock MHz", "temperature °C",
                "other counters")


def counter_overview(df: pl.DataFrame, base_ns: int, end_ns: int, nbins: int) -> list[dict[str, Any]]:
    """Counters of the whole capture as heat strips: per group, one row per (rank, counter),
    the mean value per overview bin (float32, NaN before the first sample; bins without a
    sample hold the previous bin's value)."""
    c = df.filter((pl.col("kind").cast(pl.String) == "counter") & pl.col("value").is_not_null()
                  & pl.col("value").is_finite())
    if c.height == 0:
        return []
    span = max(end_ns - base_ns, 1)
    c = c.select(pl.col("rank"), pl.col("name").cast(pl.String),
                 ((pl.col("ts_ns") - base_ns).clip(0, span - 1) * nbins // span).cast(pl.Int64).alias("b"),
                 pl.col("value"))
    agg = c.group_by(["rank", "name", "b"]).agg(pl.col("value").mean())
    groups: dict[str, dict[str, Any]] = {}
    for (rank, name), g in sorted(agg.partition_by(["rank", "name"], as_dict=True).items()):
        title, unit, scale = counter_group(name)
        row = np.full(nbins, np.nan, np.float64)
        row[g.get_column("b").to_numpy()] = g.get_column("value").to_numpy() * scale
        have = ~np.isnan(row)
        idx = np.where(have, np.arange(nbins), -1)
        np.maximum.accumulate(idx, out=idx)
        filled = np.where(idx >= 0, row[np.maximum(idx, 0)], np.nan)
        grp = groups.setdefault(title, {"group": esc(title), "unit": esc(unit), "rows": [], "z": []})
        grp["rows"].append([int(rank), esc(name)])
        grp["z"].append(filled)
    out: list[dict[str, Any]] = []
    for title in sorted(groups, key=lambda t: _GROUP_ORDER.index(t) if t in _GROUP_ORDER else 99):
        gd = groups[title]
        z = np.vstack(gd.pop("z"))
        finite = z[np.isfinite(z)]
        lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
        if title in ("activity %", "PCIe % of link"):
            lo, hi = 0.0, max(100.0, hi)
        elif lo >= 0:
            lo = 0.0
        gd.update({"nbins": nbins, "zmin": lo, "zmax": hi if hi > lo else lo + 1, "z": b64(z.ravel(), "f4")})
        out.append(gd)
    return out


def counter_payload(df: pl.DataFrame, base_ns: int, lo_ns: int, hi_ns: int, *, points: int = 2000) -> list[dict[str, Any]]:
    """Counter series per (rank, name) inside ``[lo, hi)``, min/max-decimated to ≤ 2·points samples."""
    c = df.filter((pl.col("kind").cast(pl.String) == "counter") & pl.col("value").is_not_null()
                  & (pl.col("ts_ns") >= lo_ns) & (pl.col("ts_ns") < hi_ns))
    if c.height == 0:
        return []
    c = c.select(pl.col("rank"), pl.col("name").cast(pl.String), "ts_ns", "value")
    span = max(hi_ns - lo_ns, 1)
    c = c.with_columns(pl.len().over(["rank", "name"]).alias("_n"))
    small = c.filter(pl.col("_n") <= 2 * points).select("rank", "name", "ts_ns", "value")
    big = c.filter(pl.col("_n") > 2 * points)
    if big.height:
        b = big.with_columns(((pl.col("ts_ns") - lo_ns) * points // span).alias("_b"))
        lo = b.sort("value").group_by(["rank", "name", "_b"]).agg(pl.col("ts_ns").first(), pl.col("value").first())
        hi = b.sort("value").group_by(["rank", "name", "_b"]).agg(pl.col("ts_ns").last(), pl.col("value").last())
        big = pl.concat([lo, hi]).unique(["rank", "name", "ts_ns"]).drop("_b")
        small = pl.concat([small, big.select(small.columns)])
    out = []
    for (rank, name), g in sorted(small.sort("ts_ns").partition_by(["rank", "name"], as_dict=True).items()):
        title, unit, scale = counter_group(name)
        x = (g.get_column("ts_ns").to_numpy() - base_ns) / 1e6
        y = g.get_column("value").to_numpy() * scale
        out.append({"rank": int(rank), "name": esc(name), "group": esc(title), "unit": esc(unit),
                    "x": b64(x, "f8"), "y": b64(y, "f4")})
    return out
