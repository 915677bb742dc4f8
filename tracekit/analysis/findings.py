"""The findings of ``tracekit analyze``: candidates from every analysis, one ranker.

Every analysis proposes :class:`Finding` candidates; :func:`rank_findings` is the only place that
orders, gates and words them, so two findings cannot contradict each other:

* **importance**: ``weight`` = the time (ns) the finding accounts for; a headline (``headline=True``,
  e.g. CPU oversubscription, which invalidates every other figure) comes first, then the overview
  (``lead=True``: what dominates the window, copies, compute, communication or idle), then the rest;
* **clock gate**: a cross-rank wait finding (``cross_rank=True``) whose typical single wait
  (``per_event_ns``) is below the clock alignment residual is withheld — the residual finding says
  how many were withheld instead; one whose wait is within 3× the residual is stated as tentative;
* **sample gate**: step-time percentiles need ≥ 3 steps (``samples``); fewer are stated without p90;
* **once**: identical sentences and repeated codes for the same subject are stated once.

The sentences' numbers are defined in ``docs/metrics.md``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import polars as pl

from tracekit.analysis.steptime import StepTime

__all__ = ["Finding", "rank_findings", "basic_candidates", "dominant_candidates", "stall_candidates", "clock_candidates", "idle_candidates",
           "pcie_candidates", "power_candidates", "step_candidates", "efficiency_candidates", "host_cpus", "is_collective_name",
           "RESIDUAL_WARN_NS"]

#: clock alignment residual above which cross-rank waits are gated
RESIDUAL_WARN_NS = 50_000
_COLL_RE = re.compile(r"(?i)nccl|gloo|rccl|all_?reduce|all_?gather|reduce_?scatter|broadcast|all_?to_?all|sendrecv|c10d::|cross_device_reduce")


def is_collective_name(name: str | None) -> bool:
    """A collective kernel or CPU-mode collective range (never a rank's "own" compute)."""
    return bool(name) and bool(_COLL_RE.search(name or ""))


@dataclass
class Finding:
    """One candidate sentence. ``code``: kind of finding; ``subject``: what it is about (rank, group);
    ``weight``: ns it accounts for; ``per_event_ns``: a typical single wait (cross-rank findings);
    ``samples``: how many observations it rests on; ``evidence``: appended in parentheses when set."""

    code: str
    text: str
    weight: float
    subject: str = ""
    cross_rank: bool = False
    per_event_ns: float | None = None
    samples: int | None = None
    headline: bool = False
    tentative_text: str | None = None
    #: the overview (what dominates the window): stated right after the headlines, before the ranked rest
    lead: bool = False


def rank_findings(cands: Iterable[Finding], *, residual_ns: int | None = None) -> list[str]:
    """Order, gate and deduplicate candidates (module doc); returns the sentences, most important first."""
    out: list[tuple[int, float, str]] = []
    withheld = 0
    seen_text: set[str] = set()
    seen_key: set[tuple[str, str]] = set()
    resid_f: Finding | None = None
    gate = residual_ns is not None and residual_ns > RESIDUAL_WARN_NS
    for f in cands:
        if f.code == "clock_residual":
            resid_f = f
            continue
        text = f.text
        if gate and f.cross_rank and f.per_event_ns is not None:
            assert residual_ns is not None
            if f.per_event_ns < residual_ns:
                withheld += 1
                continue
            if f.per_event_ns < 3 * residual_ns:
                text = f"Tentative (waits of ~{f.per_event_ns / 1e3:.0f} µs vs a {residual_ns / 1e3:.0f} µs clock residual): " + (
                    f.tentative_text or text[0].lower() + text[1:])
        key = (f.code, f.subject)
        if text in seen_text or (f.subject and key in seen_key):
            continue
        seen_text.add(text)
        if f.subject:
            seen_key.add(key)
        out.append((0 if f.headline else 1 if f.lead else 2, -f.weight, text))
    if gate:
        assert residual_ns is not None
        w = f" {withheld} cross-rank wait finding(s) with waits below it are withheld." if withheld else ""
        txt = resid_f.text if resid_f is not None else (
            f"Clock alignment residual is {residual_ns / 1e3:.0f} µs: cross-rank waits below that are not reliable.")
        # stated before the cross-rank findings it qualifies
        out.append((2, -math.inf, txt + w))
    out.sort(key=lambda t: (t[0], t[1]))
    return [t for _, _, t in out]


def host_cpus(meta: Mapping[str, Any] | None) -> int | None:
    """CPU cores available to the ranks of one host, from the capture metadata (None when unknown)."""
    if not meta:
        return None
    cap = meta.get("capture") if isinstance(meta.get("capture"), Mapping) else {}
    for src in ((cap or {}).get("host"), meta.get("host")):
        if isinstance(src, Mapping) and src.get("cpus"):
            return int(src["cpus"])
    v = meta.get("host_cpus")
    return int(v) if v else None


#: the four kinds of device time a dominant-share finding compares (breakdown buckets; CPU mode: docs/cpu_mode.md)
_COPY_BUCKETS = ("memory",)
_COMM_BUCKETS = ("communication", "comm_transfer", "comm_wait")


def _groups(t: Mapping[str, int]) -> dict[str, int]:
    """Window time by kind: copies (memcpy/memset), communication, idle, and compute (every other bucket)."""
    g = {"copies": 0, "communication": 0, "idle": int(t.get("idle", 0) or 0), "compute": 0}
    for k, v in t.items():
        if k == "idle":
            continue
        kind = "copies" if k in _COPY_BUCKETS else "communication" if k in _COMM_BUCKETS else "compute"
        g[kind] += int(v or 0)
    return g


def _top_op(res: Mapping[str, Any], cats: Iterable[str]) -> tuple[str, int, int] | None:
    """(name, total ns, count) of the longest op of these categories in the window (``top_kernels``)."""
    rows = [r for c in cats for r in (res.get("top_kernels") or {}).get(c) or []]
    if not rows:
        return None
    r = max(rows, key=lambda r: int(r.get("total_ns") or 0))
    return str(r["name"]), int(r.get("total_ns") or 0), int(r.get("count") or 0)


def _idle_causes(res: Mapping[str, Any]) -> list[tuple[str, int]]:
    """Idle causes with their time over all ranks (``idle_causes_ns``), largest first."""
    tot: dict[str, int] = {}
    for causes in (res.get("idle_causes_ns") or {}).values():
        for c, v in (causes or {}).items():
            tot[c] = tot.get(c, 0) + int(v or 0)
    return sorted(((c, v) for c, v in tot.items() if v > 0), key=lambda cv: -cv[1])


def dominant_candidates(res: Mapping[str, Any]) -> list[Finding]:
    """What dominates the window: copies, compute, communication or idle, whichever holds the most time over
    all ranks (on every input kind: a Kineto or nsys GPU trace, CPU mode, SGLang), with its largest part."""
    o = res.get("overall") or {}
    w = int(o.get("window_ns") or 0)
    if w <= 0:
        return []
    t = o.get("time_ns") or {}
    g = _groups(t)
    kind, v = max(g.items(), key=lambda kv: kv[1])
    if v <= 0:
        return []
    cpu = res.get("device_mode") == "cpu"
    of = "of the ranks' time" if cpu else "of GPU time"
    pct = f"{100 * v / w:.0f}%"
    if kind == "copies":
        top = _top_op(res, _COPY_BUCKETS)
        lead = f"; the largest is {_short(top[0])}: {_dur(top[1])} in {top[2]} op(s)" if top else ""
        text = f"Copies dominate: memory copies and sets take {pct} {of} over all ranks{lead}."
    elif kind == "communication":
        wait, xfer = int(t.get("comm_wait", 0) or 0), int(t.get("comm_transfer", 0) or 0)
        split = f" ({100 * xfer / w:.0f}% transfer, {100 * wait / w:.0f}% waiting for peers)" if wait or xfer else ""
        top = _top_op(res, ("communication",))
        lead = f"; the largest is {_short(top[0])}: {_dur(top[1])} in {top[2]} call(s)" if top else ""
        text = f"Communication dominates: collectives take {pct} {of} over all ranks{split}{lead}."
    elif kind == "idle":
        causes = ", ".join(f"{c} {100 * n / w:.0f}%" for c, n in _idle_causes(res)[:3] if n / w >= 0.005)
        lead = f"; by cause: {causes}" if causes else ""
        text = f"Idle dominates: {'the ranks run no operator' if cpu else 'the GPUs run nothing'} {pct} of the window over all ranks{lead}."
    else:
        comp = {k: int(x or 0) for k, x in t.items() if k != "idle" and k not in _COPY_BUCKETS and k not in _COMM_BUCKETS}
        cat, cv = max(comp.items(), key=lambda kv: kv[1])
        top = _top_op(res, (cat,))
        lead = f", led by {_short(top[0])} ({_dur(top[1])})" if top else ""
        text = f"Compute dominates: {'operators' if cpu else 'kernels'} take {pct} {of} over all ranks; the largest category is {cat} at {100 * cv / w:.0f}%{lead}."
    return [Finding("dominant", text, float(v), subject=kind, lead=True)]


def _dur(ns: float) -> str:
    """A duration in the unit that reads best: µs, ms or s."""
    if ns >= 1e9:
        return f"{ns / 1e9:.2f} s"
    return f"{ns / 1e6:.1f} ms" if ns >= 1e5 else f"{ns / 1e3:.0f} µs"


def basic_candidates(res: Mapping[str, Any], meta: Mapping[str, Any] | None = None) -> list[Finding]:
    """Candidates from the breakdown alone: CPU oversubscription (a headline) and what dominates the window."""
    o = res["overall"]
    w = o["window_ns"] or 1
    t = o["time_ns"]
    out: list[Finding] = []
    cpu = res.get("device_mode") == "cpu"
    ranks = len(res.get("ranks") or []) or int(res.get("world_size") or 0)
    cores = host_cpus(meta)
    if cpu and cores is not None and ranks > cores:
        comm = {k: v for k, v in t.items() if k.startswith("comm") or k == "communication"}
        top_comm = max(comm.items(), key=lambda kv: kv[1]) if comm else None
        share = f": {top_comm[0]} at {100 * top_comm[1] / w:.0f}% of the window is mostly ranks waiting for a core, not data movement" if top_comm and top_comm[1] / w >= 0.2 else ""
        out.append(Finding("cpu_oversubscribed", f"CPU oversubscribed: {ranks} ranks share {cores} CPU core(s){share}; "
                                                 f"rerun with at most {cores} rank(s) (--ranks {cores}) before reading other figures.",
                           float(w), headline=True))
    return out + dominant_candidates(res)


# --- cross-rank candidates -----------------------------------------------------------------------------------------

_CAUSE_WORDS = {
    "delayed_forward": "its forward step started late",
    "host_sync": "it was blocked in a host sync",
    "cpu_launch_gap": "its CPU launched late (GPU idle, no sync)",
    "preceding_kernels": "its own kernels ran longer",
}
#: CPU mode (docs/cpu_mode.md): the forward thread is the "device", so causes read differently
_CPU_WORDS = {
    "cpu_launch_gap": "its forward thread was busy elsewhere or sleeping (no operator, no readback)",
    "launch_bound": "in host overhead between operators (Python, dispatcher)",
    "host_sync": "around host readbacks (.item(), .tolist())",
    "host_idle": "with its forward thread inactive (no operator for ≥ 1 ms: sleeping, waiting for input, or descheduled)",
}
_IDLE_WORDS = {
    "between_steps": "between forward steps (scheduler/host)",
    "host_sync": "after host syncs",
    "launch_bound": "waiting for kernel launches (launch-bound: the host thread was busy issuing work)",
    "host_idle": "while the launching thread was inactive (no host call for ≥ 1 ms: sleep, waiting for input, untraced Python)",
    "other": "on queued work (dependencies)",
}


def _short(name: str | None, n: int = 60) -> str:
    """Readable kernel name: no ``void``, no arguments, no template arguments."""
    s = (name or "").removeprefix("void ")
    s = s.split("(", 1)[0] if not s.startswith("Memcpy") and not s.startswith("Memset") else s
    s = s.split("<", 1)[0] or s
    return s[:n]


def _ms(ns: float | None) -> str:
    return f"{(ns or 0) / 1e6:.1f} ms"


def stall_candidates(coll: Mapping[str, Any], cpu: bool, verdicts: Iterable[str] = ()) -> list[Finding]:
    """Candidates of the ``collectives`` section: who waited for whom and why, the wait share of each group and
    of each rank. ``cpu``: CPU mode (other words); ``verdicts``: the ``coll_name:pg`` subjects the interconnect
    verdict speaks about (its sentence replaces the generic wait share)."""
    found: list[Finding] = []
    for row in coll["stall_summary"][:5]:
        waiting = ", ".join(str(r) for r in row["waiting_ranks"])
        cause = row["cause"]
        det_name = row.get("top_detail")
        if cause == "preceding_kernels" and is_collective_name(det_name):
            why, det = "it was still in an earlier collective", f" ({_short(det_name)})"
        else:
            why = (_CPU_WORDS if cpu and cause == "cpu_launch_gap" else _CAUSE_WORDS).get(cause, cause)
            det = f" ({_short(det_name)})" if det_name and cause in ("host_sync", "preceding_kernels") else ""
        n = int(row["count"]) or 1
        found.append(Finding("stall", f"Rank(s) {waiting} lost {_ms(row['lost_ns'])} in {row['count']} collective wait(s) "
                                      f"for rank {row['late_rank']}: {why}{det}.", float(row["lost_ns"]),
                             subject=f"{row['late_rank']}:{cause}", cross_rank=True, per_event_ns=row["lost_ns"] / n, samples=n))
    have_ic = set(verdicts)
    n_inst = max(int(coll.get("instances") or 0), 1)
    for g in coll["groups"]:
        ws = g.get("wait_share")
        if ws is not None and g["kernel_ns"] > 0 and ws >= 0.3 and f"{g['coll_name']}:{g['pg']}" not in have_ic:
            if ws >= 0.7:
                tail = " — a faster interconnect would not help much."
            elif cpu:
                tail = " (on CPU, gloo's transfer time includes waiting for a core)."
            else:
                tail = "."
            found.append(Finding("wait_share", f"{g['coll_name']} ({g['pg']}): {ws:.0%} of its {_ms(g['kernel_ns'])} kernel time is "
                                               f"waiting for the last rank, {1 - ws:.0%} is transfer{tail}",
                                 float(g["wait_ns"]), subject=f"{g['coll_name']}:{g['pg']}", cross_rank=True,
                                 per_event_ns=g["wait_ns"] / n_inst))
    for r in coll["per_rank"]:
        if r["kernel_ns"] > 0 and r["wait_ns"] / r["kernel_ns"] >= 0.5:
            found.append(Finding("rank_waiting", f"Rank {r['rank']}: {r['wait_ns'] / r['kernel_ns']:.0%} of its collective time "
                                                 f"({_ms(r['wait_ns'])} of {_ms(r['kernel_ns'])}) is waiting on peers.",
                                 float(r["wait_ns"]) * 0.5, subject=str(r["rank"]), cross_rank=True, per_event_ns=r["wait_ns"] / n_inst))
    return found


def clock_candidates(residual: int | None) -> list[Finding]:
    """The clock alignment residual, when it gates cross-rank waits (:func:`rank_findings` states it first)."""
    if residual is not None and residual > RESIDUAL_WARN_NS:
        return [Finding("clock_residual", f"Clock alignment residual is {residual / 1e3:.0f} µs: cross-rank waits below that are not reliable.",
                        float(residual))]
    return []


def idle_candidates(totals: pl.DataFrame, wmap: Mapping[int, int], cpu: bool, observed: Mapping[int, int] | None = None) -> list[Finding]:
    """Idle causes of at least 5% of a rank's window (``wmap``: the extent of its device ops; ``observed``: its
    recorded time in a windowed capture, which caps it)."""
    found: list[Finding] = []
    if not totals.height:
        return found
    if observed:
        wmap = {r: min(w, observed.get(r, w)) for r, w in wmap.items()}
    tot = totals.filter(pl.col("cause") != "waiting_on_peer").sort(["total_ns", "rank", "cause"], descending=[True, False, False])
    for row in tot.head(6).iter_rows(named=True):
        w = wmap.get(int(row["rank"]), 0)
        if w and row["total_ns"] / w >= 0.05:
            c = row["cause"]
            words = _CPU_WORDS[c] if cpu and c in _CPU_WORDS else _IDLE_WORDS.get(c, c)
            found.append(Finding("idle", f"Rank {row['rank']} {'idle (CPU mode)' if cpu else 'GPU idle'} {_ms(row['total_ns'])} "
                                         f"({row['total_ns'] / w:.0%} of its window) {words}, {row['count']} gap(s).",
                                 float(row["total_ns"]), subject=f"{row['rank']}:{c}", samples=int(row["count"])))
    return found


def pcie_candidates(pcie: pl.DataFrame) -> list[Finding]:
    """One sentence for all PCIe-bound phases."""
    if not pcie.height:
        return []
    tot_ns = int(pcie["dur_ns"].sum())
    ranks = ", ".join(str(r) for r in sorted(set(pcie["rank"].to_list())))
    durs = pcie.explode("during")["during"].drop_nulls()
    top = durs.value_counts(sort=True).head(2)["during"].to_list() if durs.len() else []
    with_ = f"; meanwhile: {', '.join(_short(t) for t in top)}" if top else ""
    return [Finding("pcie", f"{pcie.height} PCIe-bound phase(s) on rank(s) {ranks}, {_ms(tot_ns)} in total, up to "
                            f"{min(float(pcie['pct_of_link'].cast(pl.Float64).fill_null(0.0).to_numpy().max()), 100.0):.0f}% of the link{with_}.",
                    float(tot_ns))]


def power_candidates(verdicts: Iterable[str]) -> list[Finding]:
    """The power verdicts, one candidate each."""
    return [Finding("power", v + ".", 1.0) for v in verdicts]


def step_candidates(summary: pl.DataFrame, steps: pl.DataFrame, headline: StepTime | None = None) -> list[Finding]:
    """The trace's step time (``headline``: :mod:`tracekit.analysis.steptime`, the one every view prints), the
    largest step group of another mode (percentiles need at least 3 steps), and steps without GPU ops."""
    found: list[Finding] = []
    if headline is not None:
        h = headline
        tps = f", {h.tokens_per_s:,.0f} tokens/s" if h.tokens_per_s else ""
        shape = f" ({h.tokens} tokens per step)" if h.tokens is not None else ""
        spread = f"p90 {_ms(h.p90_ns)}, " if h.n_steps >= 3 else ""
        found.append(Finding("steps", f"{h.mode or 'Steps'}{shape}: step time p50 {_ms(h.p50_ns)}, {spread}over "
                                      f"{h.n_steps} step(s){tps}.", 0.5, samples=h.n_steps))
    if summary.height:
        rows = summary.sort("steps", descending=True)
        if headline is not None:
            rows = rows.filter(pl.col("mode").cast(pl.String).ne_missing(headline.mode))
        for row in rows.head(2 if headline is None else 1).iter_rows(named=True):
            bs = f" bs={row['batch_size']}" if row.get("batch_size") is not None else ""
            n = int(row["steps"])
            # step time = host range or GPU span, whichever is longer (tracekit.analysis.steptime)
            p50, p90 = row.get("step_p50_ns", row["p50_ns"]), row.get("step_p90_ns", row["p90_ns"])
            host = f" (host {_ms(row['p50_ns'])})" if row["p50_ns"] and p50 and p50 > 1.2 * row["p50_ns"] else ""
            spread = f"p90 {_ms(p90)}, " if n >= 3 else ""  # a percentile needs at least 3 steps
            found.append(Finding("steps", f"{row['mode'] or 'Steps'}{bs}: step time p50 {_ms(p50)}{host}, {spread}"
                                          f"over {n} step(s).", 0.5, samples=n))
    if steps.height:
        n_no = int(steps.get_column("no_gpu").sum())
        if n_no:
            found.append(Finding("steps_without_gpu", f"{n_no} profiled step(s) have no GPU events attributed.", 0.4))
    return found


def efficiency_candidates(eff: pl.DataFrame) -> list[Finding]:
    """MoE GEMM shapes far below their roofline (from recorded shapes)."""
    if not eff.height:
        return []
    bad = eff.filter(pl.col("flag") == "moe_untuned")
    if not bad.height:
        return []
    worst = bad.sort("gpu_ns", descending=True).row(0, named=True)
    return [Finding("moe_untuned", f"{bad.height} MoE GEMM shape(s) run far below roofline (e.g. {worst['op']} "
                                   f"{worst['input_dims']} in {_short(worst['kernel'])}: {worst['efficiency']:.0%} of its ceiling): "
                                   "likely untuned kernel configs.", float(bad["gpu_ns"].sum()))]
