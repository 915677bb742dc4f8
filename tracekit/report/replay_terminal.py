"""Terminal rendering of a :class:`~tracekit.replay.api.ReplayResult` (rich): reads its typed fields (``baseline``,
``noise``, ``graph``, the predictions). Renders only; computes nothing."""

from __future__ import annotations

from rich.console import Console

from tracekit.replay.api import ReplayResult
from tracekit.report._fmt import Col, console_width, fit_tables

__all__ = ["render_replay"]


def _ms(ns: float | None) -> str:
    return "-" if ns is None or ns != ns else f"{ns / 1e6:.3f}"


def _pct(x: float | None) -> str:
    return "-" if x is None or x != x else f"{x:+.1%}"


def render_replay(res: ReplayResult, console: Console | None = None, *, width: int | None = None) -> None:
    """The replay's calibration lines, then the predicted step times and the critical path per category, as tables
    that fit ``width`` columns (default: the terminal's; 80 in a pipe or a file) and never cut a number."""
    c = console or console_width(width)
    _calibration(c, res)
    _predicted(c, res)
    _critical_path(c, res)
    for i, p in enumerate(res.what_if, 1):
        c.print(f"  #{i}: {p.spec}", markup=False)
    for p in res.what_if:
        for n in p.notes:
            c.print(f"  [dim]{n}[/dim]")
    for q in res.quality:
        c.print(f"[yellow]{q.severity}[/yellow] {q.code}: {q.message}" + (f" (rank {q.rank})" if q.rank is not None else ""))


def _calibration(c: Console, res: ReplayResult) -> None:
    """The graph replayed, self-replay against the profiled step, the calibration (or its absence), the noise floor
    and the step shape compared."""
    b, g = res.baseline, res.graph
    c.print("[bold]tracekit replay[/bold]: dependency-graph replay "
            f"({g.gpu_ops:,} GPU ops, {g.collective_instances:,} collective instances, ranks {g.ranks})")
    meas = "unprofiled" if b.measured_is_unprofiled else "profiled (no unprofiled timing)"
    c.print(f"self-replay vs profiled step: {_ms(b.self_replay_step_ns_p50)} ms vs "
            f"{_ms(b.profiled_step_ns_p50)} ms ({_pct(b.self_replay_error)})")
    if res.calibrated:
        c.print(f"CPU-gap calibration scale {res.calibration_scale:.3f}: baseline {_ms(b.step_ns_p50)} ms vs "
                f"measured {meas} {_ms(b.measured_step_ns_p50)} ms ({_pct(b.calibrated_error)})")
    else:
        c.print(f"[yellow]uncalibrated[/yellow] (scale {res.calibration_scale:.3f}); measured {meas} "
                f"{_ms(b.measured_step_ns_p50)} ms")
    if res.noise is not None and res.noise.relative is not None:
        c.print(f"noise floor (two halves of {res.noise.n_steps} matched unprofiled steps): {res.noise.relative:.1%}")
    else:
        c.print("noise floor: unknown (fewer than 4 matched unprofiled steps)" if res.noise is not None
                else "noise floor: unknown (no unprofiled timings)")
    if b.step_mode is not None:
        c.print(f"compared: {b.step_mode} steps of {b.step_tokens} tokens (the primary shape; every shape "
                "in --json by_shape)")
    if b.host_call_scale is not None or b.gpu_gap_scale is not None:
        parts = ([f"calls' own time ×{b.host_call_scale:.3f}"] if b.host_call_scale is not None else []) + \
                ([f"GPU gaps between queued ops ×{b.gpu_gap_scale:.3f} (fitted to the step period)"]
                 if b.gpu_gap_scale is not None else [])
        c.print("profiler distortion removed: " + ", ".join(parts))


def _predicted(c: Console, res: ReplayResult) -> None:
    """Baseline and each scenario: p50, mean, change, tokens/s (and, with ``--durations-from``, the target's measured
    step and the error), whether the change lies inside the noise."""
    b = res.baseline
    has_meas = any(p.measured for p in res.what_if)
    cols = [Col("scenario", "text", key=True, min_width=10, max_width=48), Col("p50 ms"), Col("mean ms"), Col("change"),
            Col("tokens/s")]
    if has_meas:
        cols += [Col("target measured ms", wrap_header=True), Col("error")]
    cols.append(Col("note", "text", min_width=12))
    tok = b.tokens_per_s
    rows: list[list[object]] = [["baseline", _ms(b.step_ns_p50), _ms(b.step_ns_mean), "", f"{tok:,.0f}" if tok else "-",
                                 *(["", ""] if has_meas else []), ""]]
    for p in res.what_if:
        extra = []
        if has_meas:
            m = p.measured or {}
            extra = [_ms(m.get("step_ns_p50")), _pct(m.get("error"))]
        rows.append([p.spec, _ms(p.step_ns_p50), _ms(p.step_ns_mean), _pct(p.change),
                     f"{p.tokens_per_s:,.0f}" if p.tokens_per_s else "-", *extra, "inside noise" if p.within_noise else ""])
    for tb in fit_tables("predicted step time", cols, rows, c.width):
        c.print(tb)


def _critical_path(c: Console, res: ReplayResult) -> None:
    """Critical path per step by category (ms): the baseline's and each scenario's (#i), the categories that are
    non-zero in one of them."""
    cp = res.baseline.critical_path_ns
    keys = [k for k in cp if abs(cp[k]) > 0 or any(abs(p.critical_path_ns.get(k, 0)) > 0 for p in res.what_if)]
    cols = [Col("category", "text", key=True, min_width=8), Col("baseline")] + [
        Col(f"#{i}", wrap_header=True) for i, _p in enumerate(res.what_if, 1)]
    rows: list[list[object]] = [[k, _ms(cp[k]), *[_ms(p.critical_path_ns.get(k, 0.0)) for p in res.what_if]] for k in keys]
    for tb in fit_tables("critical path per step by category (ms)", cols, rows, c.width):
        c.print(tb)
