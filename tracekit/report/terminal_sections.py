"""The analyze report's tables after the breakdown: collectives (transfer vs wait), stalls, idle by cause, PCIe
phases, steps and the next win. Each function reads one section of the typed result tree
(:class:`tracekit.analysis.sections.Sections`, the object ``analyze --json`` encodes; docs/analyze_json.md) and returns
what to print, nothing where the tree leaves the section unset or empty; none computes a figure the result does not
hold (shares are of the rank's own window, times are relative to the earliest analysis window)."""

from __future__ import annotations

from typing import Callable

import msgspec
from rich.console import RenderableType
from rich.text import Text

from tracekit.analysis.sections import Collectives, IdleCauses, NextWin, NextWinRow, Sections, Stall, UnsetType
from tracekit.report._fmt import Col, bullets, fit_tables

__all__ = ["sections"]

Fmt = Callable[[float | int | None], str]


def _t0(s: Sections) -> int | None:
    """The earliest rank's window start (absolute ns), or None without ranks."""
    return min((r.window_start_ns for r in s.ranks), default=None)


def _rel_s(ts: int | None, t0: int | None) -> str:
    return "—" if ts is None or t0 is None else f"{(ts - t0) / 1e9:.3f}"


def _bw(bps: float | None) -> str:
    return "—" if bps is None else f"{bps / 1e9:,.2f} GB/s"


def collectives(s: Sections, width: int, fmt: Fmt) -> list[RenderableType]:
    """Per process group and collective: calls, kernel time, transfer, wait (time before the last rank arrived)."""
    c = s.collectives
    if isinstance(c, UnsetType) or not c.groups:
        return []
    rows = [[g.pg or "—", g.coll_name or "—", str(g.count), fmt(g.kernel_ns), fmt(g.transfer_ns), fmt(g.wait_ns),
             f"{100 * (g.wait_share or 0):.0f}%", _bw(g.bus_bw_p50_bytes_per_s)] for g in c.groups]
    cols = [Col("group", "text", key=True, min_width=6), Col("collective", "text", key=True, min_width=9), Col("calls"),
            Col("total"), Col("transfer"), Col("wait"), Col("wait %"), Col("bus bw p50")]
    out: list[RenderableType] = list(fit_tables("Collectives (all ranks): transfer vs wait for the last rank", cols, rows, width))
    residual = c.clock_alignment.residual_ns
    if residual is not None:
        out.append(Text(f"clock alignment residual {fmt(residual)} (waits below it are not meaningful)"))
    return out


def _stall_summary(c: Collectives, width: int, fmt: Fmt, top: int) -> list[RenderableType]:
    """Time the others lost per late rank and cause (``collectives.stall_summary``, its first ``top`` rows)."""
    rows = [[str(x.late_rank), x.cause or "—", str(x.count), fmt(x.lost_ns), ", ".join(map(str, x.waiting_ranks)) or "—",
             x.top_detail or "—"] for x in c.stall_summary[:top]]
    cols = [Col("late rank", key=True, min_width=4), Col("cause", "text", min_width=10), Col("stalls"),
            Col("others lost"), Col("waiting", "text", min_width=7), Col("detail", "text", min_width=10, max_width=48)]
    return list(fit_tables(f"Synchronization stalls ({c.stall_count}): the late rank", cols, rows, width))


def _worst_stalls(worst: tuple[Stall, ...], t0: int | None, width: int, fmt: Fmt) -> list[RenderableType]:
    """The given single stalls (``stalls``), one row each, times relative to ``t0``."""
    rows = [[_rel_s(x.ts_ns, t0), str(x.waiting_rank), str(x.late_rank), fmt(x.wait_ns),
             "—" if x.step is None else str(x.step), x.collective or "—", x.cause or "—"] for x in worst]
    cols = [Col("t (s)", key=True, min_width=6), Col("waits"), Col("late"), Col("wait"), Col("step"),
            Col("collective", "text", min_width=10, max_width=32), Col("cause", "text", min_width=8)]
    return list(fit_tables("Worst stalls", cols, rows, width))


def stalls(s: Sections, width: int, fmt: Fmt, top: int = 5) -> list[RenderableType]:
    """Who waits for whom: time lost per late rank and cause, then the worst single stalls."""
    c = s.collectives
    worst = () if isinstance(s.stalls, UnsetType) else s.stalls
    out: list[RenderableType] = []
    if not isinstance(c, UnsetType) and c.stall_summary:
        out += _stall_summary(c, width, fmt, top)
    if worst:
        out += _worst_stalls(worst[:top], _t0(s), width, fmt)
    return out


_CAUSES = ("launch_bound", "host_sync", "host_idle", "between_steps", "waiting_on_peer", "other")


def _cause_ns(c: IdleCauses) -> dict[str, int]:
    """A rank's idle ns by cause: every field of :class:`IdleCauses` (a cause added there is shown too)."""
    return msgspec.structs.asdict(c)


def idle_by_cause(s: Sections, width: int, fmt: Fmt) -> list[RenderableType]:
    """GPU idle per rank split by cause (docs/metrics.md), as time and as a share of the rank's window; the causes no
    rank has are left out (:data:`_CAUSES` order, then any other cause by name)."""
    if isinstance(s.idle_causes_ns, UnsetType):
        return []
    ic = {rank: _cause_ns(c) for rank, c in s.idle_causes_ns.items()}
    if not any(any(c.values()) for c in ic.values()):
        return []
    win = {str(r.rank): r.window_ns for r in s.ranks}
    seen = [k for k in _CAUSES if any(c[k] for c in ic.values())]
    seen += sorted({k for c in ic.values() for k, v in c.items() if v and k not in _CAUSES})
    rows = []
    for rank in sorted(ic, key=lambda x: int(x) if x.lstrip("-").isdigit() else 0):
        c, w = ic[rank], win.get(rank)
        rows.append([rank] + [fmt(c[k]) + (f" ({100 * c[k] / w:.0f}%)" if w else "") for k in seen])
    cols = [Col("rank", key=True, min_width=4)] + [Col(k.replace("_", " "), wrap_header=True) for k in seen]
    title = "Idle by cause (time, % of the rank's window)"
    if s.device_mode == "cpu":
        title = "Forward-thread idle by cause (CPU mode; time, % of the rank's window)"
    return list(fit_tables(title, cols, rows, width))


def pcie_phases(s: Sections, width: int, fmt: Fmt, top: int = 8) -> list[RenderableType]:
    """The PCIe-bound phases, longest first."""
    ph = s.pcie_phases
    if isinstance(ph, UnsetType) or not ph:
        return []
    t0 = _t0(s)
    rows = [[str(p.rank), _rel_s(p.start_ns, t0), fmt(p.dur_ns), p.direction or "—", _bw(p.achieved_bytes_per_s),
             "—" if p.pct_of_link is None else f"{p.pct_of_link:.0f}%", ", ".join(p.during or ()) or "—"]
            for p in sorted(ph, key=lambda p: -p.dur_ns)[:top]]
    cols = [Col("rank", key=True, min_width=4), Col("t (s)"), Col("length"), Col("dir", "text", min_width=3), Col("rate"),
            Col("of link"), Col("during", "text", min_width=8, max_width=40)]
    more = f" ({len(ph)}; longest {top})" if len(ph) > top else f" ({len(ph)})"
    return list(fit_tables("PCIe-bound phases" + more, cols, rows, width))


def steps(s: Sections, width: int, fmt: Fmt) -> list[RenderableType]:
    """The step time (``steps.step_time``, the one every view prints) and the job steps by mode and batch size."""
    st = s.steps
    if isinstance(st, UnsetType) or not st.summary:
        return []
    rows = [[r.mode or "—", "—" if r.batch_size is None else str(r.batch_size), str(r.steps), fmt(r.step_p50_ns),
             fmt(r.step_p90_ns) if r.steps >= 3 else "—", fmt(r.p50_ns),
             "—" if r.tokens_per_s is None else f"{r.tokens_per_s:,.0f}"] for r in st.summary]
    cols = [Col("mode", "text", key=True, min_width=6), Col("batch"), Col("steps"), Col("step p50"), Col("step p90"),
            Col("host p50"), Col("tokens/s")]
    out: list[RenderableType] = list(fit_tables("Steps (job steps: the slowest rank's; p90 from 3 steps)", cols, rows, width))
    un = st.unprofiled
    if un is not None and un.step_ns_p50:
        tps = f", {un.tokens_per_s:,.0f} tokens/s" if un.tokens_per_s else ""
        out.append(Text(f"unprofiled steps (the program's clock): p50 {fmt(un.step_ns_p50)} over {un.n_steps} "
                        f"step(s){tps}"))
    return out


def _next_win_none(nw: NextWin) -> list[RenderableType]:
    """Next win without a row: why nothing was replayed (``status``, ``why``) or that no change gained; the changes
    it skipped and why."""
    if nw.status == "ok":
        why = "no change predicted a gain"
    else:
        why = "not replayed — " + nw.why if isinstance(nw.why, str) and nw.why else nw.status
    skipped = [f"{k.what}: {k.why}" for k in nw.skipped]
    return [Text("Next win: " + why), *([bullets(skipped, marker="-")] if skipped else [])]


def _next_win_row(r: NextWinRow, indent: str, fmt: Fmt) -> list[object]:
    """One change's row: what, predicted step p50, change, tokens/s, the replay error of its kind."""
    err = "—" if r.confidence is None else f"±{100 * r.confidence.error_max:.0f}%"
    return [indent + r.what, fmt(r.step_ns_p50), f"{100 * (r.change or 0):+.0f}%",
            "—" if r.tokens_per_s is None else f"{r.tokens_per_s:,.0f}", err]


def next_win(s: Sections, width: int, fmt: Fmt) -> list[RenderableType]:
    """The changes next win replayed, by predicted gain (each followed by the changes that need it, ``then``), with
    their confidence; without a row, why."""
    nw = s.next_win
    if isinstance(nw, UnsetType):
        return []
    if not nw.rows:
        return _next_win_none(nw)
    rows: list[list[object]] = []
    for r in nw.rows:
        rows.append(_next_win_row(r, "", fmt))
        rows += [_next_win_row(t, "then ", fmt) for t in (() if isinstance(r.then, UnsetType) else r.then)]
    cols = [Col("change", "text", key=True, min_width=12, max_width=40), Col("step p50"), Col("Δ step"), Col("tokens/s"),
            Col("error")]
    base = None if isinstance(nw.baseline, UnsetType) else nw.baseline.step_ns_p50
    return list(fit_tables(f"Next win (replayed; baseline step p50 {fmt(base)})", cols, rows, width))


def sections(s: Sections, width: int, fmt: Fmt) -> list[RenderableType]:
    """Every section in the order a reader looks for them."""
    out: list[RenderableType] = []
    for f in (collectives, stalls, idle_by_cause, pcie_phases, steps, next_win):
        out += f(s, width, fmt)
    return out
