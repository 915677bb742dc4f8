"""``tracekit capture -- PROGRAM ...``: profile any PyTorch / torchrun program, like ``nsys profile``.

The program runs with ``TRACEKIT_CAPTURE_DIR`` and ``TRACEKIT_CAPTURE_SPEC`` set
and ``tracekit/capture/_boot`` first on ``PYTHONPATH``: each of its Python
processes that imports torch records the capture window described by a
:class:`~tracekit.capture.window.WindowSpec` (:mod:`tracekit.capture.program_hook`).
Meanwhile this process samples the local GPUs' telemetry.

Ending (``after``):

* ``"finish"``: the program runs to its end; the capture ends inside it.
* ``"stop"``: once every rank has written its last window (``rank{r}.done``),
  the program's process group gets SIGINT, then SIGTERM after ``grace_s``,
  then SIGKILL. No signal is sent before every rank's trace is on disk, so a
  stop never cuts an export; the hook itself holds SIGINT/SIGTERM during one.

Ctrl-C / SIGTERM to tracekit are passed on to the program (SIGINT, then
SIGINT, then SIGTERM; never SIGKILL): each rank closes and exports its open
window at exit, and every completed window is kept (``capture_interrupted``).
Then the window files, step records and counters become one ``trace.parquet``
(:func:`tracekit.capture.program_trace.assemble_program`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracekit import _env
from tracekit._errors import CaptureError, QualityLog
from tracekit.capture.stderr_relay import StderrRelay
from tracekit.capture.window import WindowSpec

__all__ = ["ProgramResult", "program_env", "ranks_done", "run_external"]

_BOOT = Path(__file__).with_name("_boot")
_PKG_PARENT = Path(__file__).resolve().parents[2]


@dataclass
class ProgramResult:
    out: Path
    returncode: int | None
    metadata: dict[str, Any] = field(default_factory=dict)
    stopped: bool = False  # tracekit stopped the program after the capture
    interrupted: str | None = None
    program_s: float = 0.0  # from start to the program's exit
    convert_s: float = 0.0


def program_env(run_dir: Path, spec: WindowSpec, step_re: list[str], base: dict[str, str] | None = None,
                module_context: bool = False) -> dict[str, str]:
    """The program's environment: capture dir and spec, boot dir first on PYTHONPATH; ``module_context``
    asks the hook for ``tk.mod[...]`` ranges around MoE/expert/router/attention modules."""
    env = _env.environ() if base is None else dict(base)
    if module_context:
        env[_env.MODULE_CONTEXT] = "1"
    else:
        env.pop(_env.MODULE_CONTEXT, None)
    env[_env.CAPTURE_DIR] = str(run_dir)
    env[_env.CAPTURE_SPEC] = json.dumps({"spec": spec.to_json(), "step_re": step_re})
    env[_env.PKG_PARENT] = str(_PKG_PARENT)
    env[_env.PYTHONPATH] = os.pathsep.join([str(_BOOT)] + ([env[_env.PYTHONPATH]] if env.get(_env.PYTHONPATH) else []))
    return env  # the program's own networking is left alone (tracekit's coordination is the file board)


def ranks_done(run_dir: Path) -> bool:
    """True when at least one rank started and every rank that started (or torchrun announced) is done."""
    started: set[int] = set()
    want: set[int] = set()
    for p in run_dir.glob("rank*.state.json"):
        try:
            st = json.loads(p.read_text())
        except (ValueError, OSError):
            return False  # being written
        started.add(int(st["rank"]))
        if st.get("launched"):  # torchrun: the world size says which ranks will come
            want |= set(range(int(st.get("world") or 1)))
    if not started:
        return False
    return all((run_dir / f"rank{r}.done").exists() for r in started | want)


def _exiting(run_dir: Path) -> bool:
    """True when a rank finished its capture because its process is exiting (nothing left to stop)."""
    for p in run_dir.glob("rank*.done"):
        try:
            if p.read_text().strip() in ("exit", "SIGTERM"):
                return True
        except OSError:
            continue
    return False


def _killpg(pid: int, sig: int) -> bool:
    try:
        os.killpg(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _supervise(proc: subprocess.Popen[bytes], run_dir: Path, res: ProgramResult, signals: list[int], relay: StderrRelay, *,
               after: str, grace_s: float, say: Callable[[str], None]) -> None:
    """Wait for the program: pass on the user's stop signals (SIGINT, SIGINT, then SIGTERM); with ``after="stop"``
    stop it once every rank's trace is on disk (SIGINT to its group, SIGTERM after ``grace_s``, SIGKILL 10 s later),
    muting what it writes from then on (its reaction to tracekit's stop, :mod:`~tracekit.capture.stderr_relay`)."""
    forwarded = 0
    stop_at: float | None = None
    stage = 0
    while True:
        try:
            res.returncode = proc.wait(timeout=0.1)
            break
        except subprocess.TimeoutExpired:
            pass
        while forwarded < len(signals):
            sig = signal.SIGINT if forwarded < 2 else signal.SIGTERM
            if forwarded == 0:
                res.interrupted = {int(signal.SIGINT): "Ctrl-C", int(signal.SIGTERM): "SIGTERM"}.get(signals[0], str(signals[0]))
                say(f"{res.interrupted}: stopping the program; every completed window is kept")
            _killpg(proc.pid, sig)
            forwarded += 1
        if after == "stop" and stop_at is None and not res.interrupted and ranks_done(run_dir) and not _exiting(run_dir):
            say("capture complete; stopping the program")
            res.stopped = True
            stop_at = time.monotonic()
            relay.mute()
            _killpg(proc.pid, signal.SIGINT)
            stage = 1
        if stop_at is not None:
            waited = time.monotonic() - stop_at
            if stage == 1 and waited > grace_s:
                _killpg(proc.pid, signal.SIGTERM)
                stage = 2
            elif stage == 2 and waited > grace_s + 10 and ranks_done(run_dir):
                _killpg(proc.pid, signal.SIGKILL)  # every trace is on disk
                stage = 3
    # the launcher exited; wait (briefly) for ranks that outlive it (their files are atomic either way)
    t_end = time.monotonic() + 10
    while not ranks_done(run_dir) and time.monotonic() < t_end and any(run_dir.glob("rank*.state.json")):
        time.sleep(0.1)


def _open_telemetry(telemetry: bool, nvml: Any, env: dict[str, str]) -> tuple[Any, dict[str, Any]]:
    """The local GPUs' sampler (started) and its info; ``(None, reason)`` with ``--no-telemetry``."""
    if not telemetry:
        return None, {"available": False, "reason": "disabled (--no-telemetry)"}
    from tracekit.capture.telemetry import LocalTelemetry

    tel = LocalTelemetry(nvml=nvml, env=env)
    if tel.open():
        tel.start()
    return tel, tel.info()


def _program_quality(res: ProgramResult, prog: str, quality: QualityLog) -> None:
    """How the program ended: interrupted by the user, stopped by tracekit (notes), or failed (a warning)."""
    if res.interrupted:
        quality.add("capture_interrupted", f"capture stopped early by {res.interrupted}; kept every completed window", severity="info")
    elif res.stopped:
        quality.add("capture_program_stopped", "program stopped after its capture was on disk (--after stop)", severity="info")
    elif res.returncode not in (0, None):
        quality.add("capture_program_failed", f"{prog} exited with code {res.returncode}")


def run_external(
    cmd: Sequence[str],
    out: Path,
    *,
    spec: WindowSpec,
    after: str = "stop",
    steps_from: str | None = None,
    force: bool = False,
    keep_raw: Path | None = None,
    telemetry: bool = True,
    module_context: bool = False,
    grace_s: float = 30.0,
    nvml: Any = None,
    say: Callable[[str], None] | None = None,
) -> ProgramResult:
    """Run ``cmd`` under the capture hook, then write ``out`` (see the module docstring)."""
    from tracekit.capture.program_trace import assemble_program, step_regex

    say = say or (lambda m: print(f"tracekit: {m}", file=sys.stderr, flush=True))
    if after not in ("stop", "finish"):
        raise CaptureError(f"--after {after!r}: choose stop or finish")
    out = Path(out)
    if out.exists() and not force:
        raise CaptureError(f"{out}: exists; pass --force to overwrite or -o another path")
    if not (out.parent if str(out.parent) else Path(".")).is_dir():
        raise CaptureError(f"{out}: directory {out.parent} does not exist; create it first")
    try:
        step_re = step_regex(steps_from)
    except re.error as e:
        raise CaptureError(f"--steps-from {steps_from!r}: not a regular expression ({e})") from None
    run_dir = Path(tempfile.mkdtemp(prefix="tracekit-ext-"))
    env = program_env(run_dir, spec, step_re, module_context=module_context)
    quality = QualityLog()
    tel, tel_info = _open_telemetry(telemetry, nvml, env)
    signals: list[int] = []

    def on_signal(sig: int, _f: Any) -> None:
        signals.append(sig)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    res = ProgramResult(out=out, returncode=None)
    t_start = time.monotonic()
    relay = StderrRelay()
    try:
        try:
            proc = subprocess.Popen(list(cmd), env=env, start_new_session=True, **relay.popen_kwargs())
        except OSError as e:
            raise CaptureError(f"{cmd[0]}: cannot start ({e}); check the command after --") from None
        finally:
            relay.started()
        _supervise(proc, run_dir, res, signals, relay, after=after, grace_s=grace_s, say=say)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if tel is not None:
            tel.stop()
        relay.close()
    res.program_s = time.monotonic() - t_start
    _program_quality(res, cmd[0], quality)
    opts = {**spec.to_json(), "after": after, "steps_from": steps_from, "module_context": module_context,
            "program_s": round(res.program_s, 3)}
    say(f"program ran {res.program_s:.1f} s; converting")
    t_conv = time.monotonic()
    try:
        res.metadata = assemble_program(run_dir, out, command=cmd, options=opts,
                                        samplers=tel.samplers if tel is not None else (), telemetry=tel_info,
                                        quality=quality, force=force)
        res.convert_s = time.monotonic() - t_conv
    finally:
        if keep_raw is not None:
            keep_raw.mkdir(parents=True, exist_ok=True)
            for f in run_dir.glob("rank*"):
                shutil.copy2(f, keep_raw / f.name)
            relay.save(keep_raw / "program.stderr-after-stop.log")
        shutil.rmtree(run_dir, ignore_errors=True)
    return res
