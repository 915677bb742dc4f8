"""The analyze report's tables after the breakdown: collectives (transfer vs wait), stalls, idle by cause, PCIe
phases, steps and the next win. Each function reads one section of the analyze JSON object (docs/analyze_json.md)
and returns what to print; none computes a figure the result does not hold (shares are of the rank's own window,
times are relative to the earliest analysis window)."""

from __future__ import annotations

from typing import Any, Callable

from rich.console import RenderableType
from rich.text import Text

from tracekit.report._fmt import Col, bullets, fit_tables

__all__ = ["sections"]

Fmt = Callable[[float | int | None], str]


def _t0(res: dict[str, Any]) -> int | None:
    starts = [r.get("window_start_ns") for r in res.get("ranks") or [] if r.get("window_start_ns") is not None]
    return min(starts) if starts else None


def _rel_s(ts: int | None, t0: int | None) -> str:
    return "—" if ts is None or t0 is None else f"{(ts - t0) / 1e9:.3f}"


def _bw(bps: float | None) -> str:
    return "—" if bps is None else f"{bps / 1e9:,.2f} GB/s"


def collectives(res: dict[str, Any], width: int, fmt: Fmt) -> list[RenderableType]:
    """Per process group and collective: calls, kernel time, transfer, wait (time before the last rank arrived)."""
    c = res.get("collectives") or {}
    groups = c.get("groups") or []
    if not groups:
        return []
    rows = [[str(g.get("pg") or "—"), str(g.get("coll_name") or "—"), str(g.get("count", 0)), fmt(g.get("kernel_ns")),
             fmt(g.get("transfer_ns")), fmt(g.get("wait_ns")), f"{100 * (g.get('wait_share') or 0):.0f}%",
             _bw(g.get("bus_bw_p50_bytes_per_s"))] for g in groups]
    cols = [Col("group", "text", key=True, min_width=6), Col("collective", "text", key=True, min_width=9), Col("calls"),
            Col("total"), Col("transfer"), Col("wait"), Col("wait %"), Col("bus bw p50")]
    out: list[RenderableType] = list(fit_tables("Collectives (all ranks): transfer vs wait for the last rank", cols, rows, width))
    ca = c.get("clock_alignment") or {}
    if ca.get("residual_ns") is not None:
        out.append(Text(f"clock alignment residual {fmt(ca['residual_ns'])} (waits below it are not meaningful)"))
    return out


def stalls(res: dict[str, Any], width: int, fmt: Fmt, top: int = 5) -> list[RenderableType]:
    """Who waits for whom: time lost per late rank and cause, then the worst single stalls."""
    c = res.get("collectives") or {}
    summ = c.get("stall_summary") or []
    worst = res.get("stalls") or []
    if not summ and not worst:
        return []
    out: list[RenderableType] = []
    if summ:
        rows = [[str(s.get("late_rank")), str(s.get("cause") or "—"), str(s.get("count", 0)), fmt(s.get("lost_ns")),
                 ", ".join(map(str, s.get("waiting_ranks") or [])) or "—", str(s.get("top_detail") or "—")]
                for s in summ[:top]]
        cols = [Col("late rank", key=True, min_width=4), Col("cause", "text", min_width=10), Col("stalls"),
                Col("others lost"), Col("waiting", "text", min_width=7), Col("detail", "text", min_width=10, max_width=48)]
        out += fit_tables(f"Synchronization stalls ({c.get('stall_count', len(worst))}): the late rank", cols, rows, width)
    if worst:
        t0 = _t0(res)
        rows = [[_rel_s(s.get("ts_ns"), t0), str(s.get("waiting_rank")), str(s.get("late_rank")), fmt(s.get("wait_ns")),
                 str(s.get("step") if s.get("step") is not None else "—"), str(s.get("collective") or "—"),
                 str(s.get("cause") or "—")] for s in worst[:top]]
        cols = [Col("t (s)", key=True, min_width=6), Col("waits"), Col("late"), Col("wait"), Col("step"),
                Col("collective", "text", min_width=10, max_width=32), Col("cause", "text", min_width=8)]
        out += fit_tables("Worst stalls", cols, rows, width)
    return out


_CAUSES = ("launch_bound", "host_sync", "host_idle", "between_steps", "waiting_on_peer", "other")


def idle_by_cause(res: dict[str, Any], width: int, fmt: Fmt) -> list[RenderableType]:
    """GPU idle per rank split by cause (docs/metrics.md), as time and as a share of the rank's window."""
    ic = res.get("idle_causes_ns") or {}
    if not ic or not any(any(v for v in c.values()) for c in ic.values()):
        return []
    win = {str(r["rank"]): r.get("window_ns") for r in res.get("ranks") or []}
    seen = [k for k in _CAUSES if any(c.get(k) for c in ic.values())]
    seen += sorted({k for c in ic.values() for k, v in c.items() if v and k not in _CAUSES})
    rows = []
    for rank in sorted(ic, key=lambda x: int(x) if str(x).lstrip("-").isdigit() else 0):
        c, w = ic[rank], win.get(str(rank))
        rows.append([str(rank)] + [fmt(c.get(k, 0)) + (f" ({100 * c.get(k, 0) / w:.0f}%)" if w else "") for k in seen])
    cols = [Col("rank", key=True, min_width=4)] + [Col(k.replace("_", " "), wrap_header=True) for k in seen]
    title = "Idle by cause (time, % of the rank's window)"
    if res.get("device_mode") == "cpu":
        title = "Forward-thread idle by cause (CPU mode; time, % of the rank's window)"
    return list(fit_tables(title, cols, rows, width))


def pcie_phases(res: dict[str, Any], width: int, fmt: Fmt, top: int = 8) -> list[RenderableType]:
    """The PCIe-bound phases, longest first."""
    ph = res.get("pcie_phases") or []
    if not ph:
        return []
    t0 = _t0(res)
    rows = [[str(p.get("rank")), _rel_s(p.get("start_ns"), t0), fmt(p.get("dur_ns")), str(p.get("direction") or "—"),
             _bw(p.get("achieved_bytes_per_s")), f"{p['pct_of_link']:.0f}%" if p.get("pct_of_link") is not None else "—",
             ", ".join(p.get("during") or []) or "—"]
            for p in sorted(ph, key=lambda p: -(p.get("dur_ns") or 0))[:top]]
    cols = [Col("rank", key=True, min_width=4), Col("t (s)"), Col("length"), Col("dir", "text", min_width=3), Col("rate"),
            Col("of link"), Col("during", "text", min_width=8, max_width=40)]
    more = f" ({len(ph)}; longest {top})" if len(ph) > top else f" ({len(ph)})"
    return list(fit_tables("PCIe-bound phases" + more, cols, rows, width))


def steps(res: dict[str, Any], width: int, fmt: Fmt) -> list[RenderableType]:
    """The step time (``steps.step_time``, the one every view prints) and the job steps by mode and batch size."""
    s = res.get("steps") or {}
    summ = s.get("summary") or []
    if not summ:
        return []
    rows = [[str(r.get("mode") or "—"), "—" if r.get("batch_size") is None else str(r["batch_size"]), str(r.get("steps", 0)),
             fmt(r.get("step_p50_ns")), fmt(r.get("step_p90_ns")) if (r.get("steps") or 0) >= 3 else "—",
             fmt(r.get("p50_ns")), "—" if r.get("tokens_per_s") is None else f"{r['tokens_per_s']:,.0f}"] for r in summ]
    cols = [Col("mode", "text", key=True, min_width=6), Col("batch"), Col("steps"), Col("step p50"), Col("step p90"),
            Col("host p50"), Col("tokens/s")]
    out: list[RenderableType] = list(fit_tables("Steps (job steps: the slowest rank's; p90 from 3 steps)", cols, rows, width))
    un = s.get("unprofiled")
    if un and un.get("step_ns_p50"):
        tps = f", {un['tokens_per_s']:,.0f} tokens/s" if un.get("tokens_per_s") else ""
        out.append(Text(f"unprofiled steps (the program's clock): p50 {fmt(un['step_ns_p50'])} over {un.get('n_steps')} "
                        f"step(s){tps}"))
    return out


def next_win(res: dict[str, Any], width: int, fmt: Fmt) -> list[RenderableType]:
    """The changes next win replayed, by predicted gain, with what each needs first and its confidence."""
    nw = res.get("next_win") or {}
    rows_in = nw.get("rows") or []
    if not nw:
        return []
    if not rows_in:
        why = ("not replayed — " + str(nw["why"]) if nw.get("why") else str(nw.get("status"))) \
            if nw.get("status") not in (None, "ok") else "no change predicted a gain"
        skipped = [f"{k.get('what')}: {k.get('why')}" for k in nw.get("skipped") or []]
        return [Text("Next win: " + str(why)), *([bullets(skipped, marker="-")] if skipped else [])]
    base = nw.get("baseline") or {}
    rows: list[list[object]] = []

    def add(r: dict[str, Any], indent: str) -> None:
        conf = r.get("confidence") or {}
        err = f"±{100 * conf['error_max']:.0f}%" if conf.get("error_max") is not None else "—"
        rows.append([indent + str(r.get("what")), fmt(r.get("step_ns_p50")), f"{100 * (r.get('change') or 0):+.0f}%",
                     "—" if r.get("tokens_per_s") is None else f"{r['tokens_per_s']:,.0f}", err])

    for r in rows_in:
        add(r, "")
        for t in r.get("then") or []:
            add(t, "then ")
    cols = [Col("change", "text", key=True, min_width=12, max_width=40), Col("step p50"), Col("Δ step"), Col("tokens/s"),
            Col("error")]
    title = f"Next win (replayed; baseline step p50 {fmt(base.get('step_ns_p50'))})"
    return list(fit_tables(title, cols, rows, width))


def sections(res: dict[str, Any], width: int, fmt: Fmt) -> list[RenderableType]:
    """Every section in the order a reader looks for them."""
    out: list[RenderableType] = []
    for f in (collectives, stalls, idle_by_cause, pcie_phases, steps, next_win):
        out += f(res, width, fmt)
    return out
