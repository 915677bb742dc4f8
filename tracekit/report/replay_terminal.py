"""Terminal rendering of a :class:`~tracekit.replay.api.ReplayResult` (rich). Renders only; computes nothing."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

__all__ = ["render_replay"]


def _ms(ns: float | None) -> str:
    return "-" if ns is None or ns != ns else f"{ns / 1e6:.3f}"


def _pct(x: float | None) -> str:
    return "-" if x is None or x != x else f"{x:+.1%}"


def render_replay(res: Any, console: Console | None = None) -> None:
    c = console or Console()
    b = res.baseline
    c.print("[bold]tracekit replay[/bold]: dependency-graph replay "
            f"({res.graph['gpu_ops']:,} GPU ops, {res.graph['collective_instances']:,} collective instances, "
            f"ranks {res.graph['ranks']})")
    meas = "unprofiled" if b["measured_is_unprofiled"] else "profiled (no unprofiled timing)"
    c.print(f"self-replay vs profiled step: {_ms(b['self_replay_step_ns_p50'])} ms vs "
            f"{_ms(b['profiled_step_ns_p50'])} ms ({_pct(b['self_replay_error'])})")
    if res.calibrated:
        c.print(f"CPU-gap calibration scale {res.calibration_scale:.3f}: baseline {_ms(b['step_ns_p50'])} ms vs "
                f"measured {meas} {_ms(b['measured_step_ns_p50'])} ms ({_pct(b['calibrated_error'])})")
    else:
        c.print(f"[yellow]uncalibrated[/yellow] (scale {res.calibration_scale:.3f}); measured {meas} "
                f"{_ms(b['measured_step_ns_p50'])} ms")
    if res.noise and res.noise.get("relative") is not None:
        c.print(f"noise floor (two halves of {res.noise['n_steps']} matched unprofiled steps): "
                f"{res.noise['relative']:.1%}")
    if b.get("step_mode") is not None:
        c.print(f"compared: {b['step_mode']} steps of {b.get('step_tokens')} tokens (the primary shape; every shape "
                "in --json by_shape)")
    else:
        c.print("noise floor: unknown (no unprofiled timings)")
    t = Table(title="predicted step time", show_lines=False)
    has_meas = any(p.measured for p in res.what_if)
    cols = ["scenario", "p50 ms", "mean ms", "change", "tokens/s"]
    if has_meas:
        cols += ["target measured ms", "error"]
    for col in (*cols, "note"):
        t.add_column(col, justify="left" if col in ("scenario", "note") else "right")
    tok = b.get("tokens_per_s")
    t.add_row("baseline", _ms(b["step_ns_p50"]), _ms(b["step_ns_mean"]), "", f"{tok:,.0f}" if tok else "-",
              *(["", ""] if has_meas else []), "")
    for p in res.what_if:
        note = "[yellow]inside noise[/yellow]" if p.within_noise else ""
        extra = []
        if has_meas:
            m = p.measured or {}
            extra = [_ms(m.get("step_ns_p50")), _pct(m.get("error"))]
        t.add_row(p.spec, _ms(p.step_ns_p50), _ms(p.step_ns_mean), _pct(p.change),
                  f"{p.tokens_per_s:,.0f}" if p.tokens_per_s else "-", *extra, note)
    c.print(t)
    cp = Table(title="critical path per step by category (ms)")
    cp.add_column("category")
    cp.add_column("baseline", justify="right")
    for p in res.what_if:
        cp.add_column(p.spec[:24], justify="right")
    keys = [k for k in b["critical_path_ns"]
            if abs(b["critical_path_ns"][k]) > 0 or any(abs(p.critical_path_ns.get(k, 0)) > 0 for p in res.what_if)]
    for k in keys:
        cp.add_row(k, _ms(b["critical_path_ns"][k]), *[_ms(p.critical_path_ns.get(k, 0.0)) for p in res.what_if])
    c.print(cp)
    for p in res.what_if:
        for n in p.notes:
            c.print(f"  [dim]{n}[/dim]")
    for q in res.quality:
        c.print(f"[yellow]{q.severity}[/yellow] {q.code}: {q.message}" + (f" (rank {q.rank})" if q.rank is not None else ""))
