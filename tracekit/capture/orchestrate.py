"""Parent side of a built-in workload capture: spawn ranks, show progress, assemble.

Ranks are spawned with ``torch.multiprocessing`` (spawn), rendezvous through a
``FileStore`` in a private temp dir (no TCP store listens anywhere) and use
loopback only for their own sockets (``GLOO_SOCKET_IFNAME`` /
``NCCL_SOCKET_IFNAME`` = ``lo`` unless set). Ctrl-C or SIGTERM sets a shared
stop event: the ranks agree to stop at the same step, close their profiler
windows and write what they have, and the parent assembles it into a valid
``trace.parquet`` flagged ``capture_interrupted`` (a second signal kills the
ranks). After SIGTERM the signal is delivered again once the trace is written,
so the process still ends as terminated (the CLI exits 143). If a rank dies, the
others are told to stop, given a grace period, then killed; whatever was written
is still assembled with quality flags. If writing ``trace.parquet`` fails (disk
full), the run directory is kept and the error names it and how to convert it
later (``python -m tracekit.capture.assemble DIR -o OUT``).
"""

from __future__ import annotations

import json
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tracekit import _env, _interrupt
from tracekit._errors import CaptureError, OutputError, QualityLog, TracekitError, require
from tracekit.capture.options import CaptureOptions, default_cpu_ranks, host_cores

__all__ = ["CaptureResult", "run_builtin", "resolve_device", "STOP_SIGNALS"]

#: Signals that stop a capture cleanly (profilers closed everywhere, what was collected written).
STOP_SIGNALS = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}


@dataclass
class CaptureResult:
    out: Path
    metadata: dict[str, Any]
    run_dir: Path | None = None
    quality: list[dict[str, Any]] = field(default_factory=list)
    #: what stopped the capture early ("Ctrl-C", "SIGTERM"), None when it ran its course
    stopped_by: str | None = None


def resolve_device(device: str, ranks: int | None) -> tuple[str, int]:
    """(device, world): ``auto`` picks all visible GPUs, else CPU ranks; the default rank count is every GPU,
    or on CPU one rank per 2 cores (:func:`~tracekit.capture.options.default_cpu_ranks`)."""
    if device not in ("auto", "cuda", "cpu"):
        raise CaptureError(f"--device {device!r}: choose auto, cuda or cpu")
    torch: Any = require("torch", "capture", "the built-in capture workload")

    n_gpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device == "auto":
        device = "cuda" if n_gpu else "cpu"
    if device == "cuda":
        if not n_gpu:
            raise CaptureError("--device cuda: no CUDA device visible; use --device cpu")
        world = ranks or n_gpu
        if world > n_gpu:
            raise CaptureError(f"--ranks {world}: only {n_gpu} GPUs visible; one rank per GPU")
        return device, world
    return device, ranks or default_cpu_ranks(host_cores())


def _env_loopback() -> None:
    _env.set_default(_env.GLOO_SOCKET_IFNAME, "lo")
    _env.set_default(_env.NCCL_SOCKET_IFNAME, "lo")
    _env.set_default(_env.MASTER_ADDR, "127.0.0.1")


def run_builtin(
    opts: CaptureOptions,
    out: Path,
    *,
    force: bool = False,
    keep_raw: Path | None = None,
    progress: bool = True,
    say: Callable[[str], None] = print,
    convert: bool = True,
) -> CaptureResult:
    """Run the built-in workload on ``opts.world`` ranks and write ``out``.

    ``convert=False`` only runs the ranks and copies their raw outputs to
    ``keep_raw`` (for machines without polars; convert elsewhere with
    :func:`tracekit.capture.assemble.assemble`).
    """
    opts.validate()
    out = Path(out)
    if convert:
        _check_out(out, force)
    _env_loopback()
    run_dir = Path(tempfile.mkdtemp(prefix="tracekit-capture-"))
    quality = QualityLog()
    signals, sigterm_handled = _run_ranks(opts, run_dir, quality, progress, say)
    stopped_by = STOP_SIGNALS.get(signals[0]) if signals else None  # type: ignore[call-overload]
    if len(signals) > 1:
        quality.add("capture_killed", f"stopped twice ({stopped_by}); ranks were killed, windows still open were lost")
    if stopped_by:
        say(f"tracekit: {stopped_by} received; writing what was collected")
    run_info = {"options": opts.to_json(), "quality": [q.to_json() for q in quality], "stopped_by": stopped_by}
    try:
        (run_dir / "run.json").write_text(json.dumps(run_info, default=str))
    except OSError:
        pass  # best effort: assemble_dir can infer the world size without it
    if convert:
        meta = _assemble_or_keep(run_dir, out, opts, quality, stopped_by, force=force, keep_raw=keep_raw, say=say)
    else:
        meta = run_info
    if keep_raw is not None:
        try:
            _copy_raw(run_dir, keep_raw)
        except OSError as e:
            raise OutputError(f"{keep_raw}: cannot copy the per-rank files ({e.strerror or e}); {out} was written and "
                              f"the per-rank files remain in {run_dir}") from None
    shutil.rmtree(run_dir, ignore_errors=True)
    if signals and signals[0] == signal.SIGTERM and sigterm_handled:
        say(f"tracekit: terminated; wrote what was collected to {out}")
        signal.raise_signal(signal.SIGTERM)  # the previous handler decides (the CLI: exit 143)
    return CaptureResult(out, meta, keep_raw, meta.get("quality", []), stopped_by)


def _check_out(out: Path, force: bool) -> None:
    if out.exists() and not force:
        raise CaptureError(f"{out}: exists; pass --force to overwrite or -o another path")
    if not (out.parent if str(out.parent) else Path(".")).exists():
        raise CaptureError(f"{out}: directory {out.parent} does not exist; create it first")


def _run_ranks(opts: CaptureOptions, run_dir: Path, quality: QualityLog, progress: bool,
               say: Callable[[str], None]) -> tuple[list[int], bool]:
    """Spawn one process per rank and watch them to the end (see :func:`_monitor`).

    Returns the stop signals received, in order (a second one kills the ranks), and whether SIGTERM had a
    handler of the caller's to hand back to.
    """
    import torch.multiprocessing as mp

    from tracekit.capture.rank_worker import rank_main

    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    queue = ctx.Queue()
    store = str(run_dir / "store")
    procs = [
        ctx.Process(target=rank_main, args=(r, opts, str(run_dir), store, stop, queue), daemon=False)
        for r in range(opts.world)
    ]
    signals: list[int] = []

    def on_signal(sig: int, _frm: Any) -> None:
        # only record it: _monitor sets the shared event from ordinary code (no lock taken in a handler)
        signals.append(sig)
        if len(signals) > 1:
            for p in procs:
                if p.is_alive():
                    p.kill()

    old = _install_handlers(on_signal)
    try:
        if _interrupt.pending():
            # a Ctrl-C while the workload was being set up (importing torch), before these handlers: the flag
            # handler only noted it, and nothing would act on it until after the whole run; no rank starts
            shutil.rmtree(run_dir, ignore_errors=True)
            _interrupt.check("capture")
            raise KeyboardInterrupt
        for p in procs:
            p.start()
        _monitor(procs, queue, stop, opts, quality, progress, say, run_dir, signals)
    finally:
        _restore_handlers(old)
        for p in procs:
            if p.pid is None:  # never started
                continue
            if p.is_alive():
                p.kill()
            p.join(timeout=5)
    return signals, signal.SIGTERM in old


def _assemble_or_keep(run_dir: Path, out: Path, opts: CaptureOptions, quality: QualityLog, stopped_by: str | None,
                      *, force: bool, keep_raw: Path | None, say: Callable[[str], None]) -> dict[str, Any]:
    """Assemble the ranks' outputs into ``out``; when that fails, keep what was collected and say how to retry."""
    try:
        from tracekit.capture.assemble import assemble  # inside: without polars the ranks' outputs are still kept

        return assemble(run_dir, out, opts.to_json(), opts.world, force=force, quality=quality, stopped_by=stopped_by)
    except BaseException as e:
        if not _collected(run_dir):  # nothing worth keeping: the error stands as it is
            shutil.rmtree(run_dir, ignore_errors=True)
            raise
        where = _keep_after_failure(run_dir, keep_raw)
        hint = (f"the collected per-rank traces are kept in {where}; convert them later with "
                f"`python -m tracekit.capture.assemble {where} -o {out}`")
        if isinstance(e, TracekitError):
            raise type(e)(f"{e}; {hint}") from None
        say(f"tracekit: {hint}")
        raise


def _install_handlers(handler: Callable[[int, Any], None]) -> dict[int, Any]:
    """Route the stop signals to ``handler``; returns the previous handlers (none outside the main thread)."""
    old: dict[int, Any] = {}
    for sig in STOP_SIGNALS:
        try:
            prev = signal.getsignal(sig)
            if prev is signal.SIG_IGN:
                continue  # somebody chose to ignore it (nohup-like): keep it that way
            signal.signal(sig, handler)
        except ValueError:  # not the main thread: signals are not ours to handle
            break
        old[sig] = prev
    return old


def _restore_handlers(old: dict[int, Any]) -> None:
    for sig, prev in old.items():
        signal.signal(sig, prev if prev is not None else signal.SIG_DFL)


def _copy_raw(run_dir: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for f in list(run_dir.glob("rank*")) + list(run_dir.glob("run.json")):
        shutil.copy2(f, dest / f.name)


def _collected(run_dir: Path) -> bool:
    """True when a rank left a profiler window or its records in ``run_dir``."""
    return any(run_dir.glob("rank*.win*.trace.json.gz")) or any(run_dir.glob("rank*.extra.json"))


def _keep_after_failure(run_dir: Path, keep_raw: Path | None) -> Path:
    """After a failed write: the directory that now holds what was collected.

    ``keep_raw`` when given and the copy worked (the run directory is removed), else the
    run directory itself, which is then left in place.
    """
    if keep_raw is not None:
        try:
            _copy_raw(run_dir, keep_raw)
        except OSError:
            return run_dir
        shutil.rmtree(run_dir, ignore_errors=True)
        return keep_raw
    return run_dir


def _log_tail(run_dir: Path, rank: int, n: int = 6) -> str:
    try:
        lines = (run_dir / f"rank{rank}.log").read_text(errors="replace").splitlines()
    except OSError:
        return f"  (rank {rank} left no log)"
    keep = [ln for ln in lines if not ln.startswith(("USDT:", "INFO:", "STAGE:"))][-n:]
    return "\n".join(f"  rank {rank}: {ln}" for ln in keep) or f"  (rank {rank}: empty log)"


def _monitor(
    procs: list[Any],
    queue: Any,
    stop: Any,
    opts: CaptureOptions,
    quality: QualityLog,
    progress: bool,
    say: Callable[[str], None],
    run_dir: Path,
    signals: list[int] | None = None,
) -> None:
    """Show progress until every rank exits; stop everybody when one dies or a stop signal came."""
    import queue as _q

    bar = _Bar(opts.duration_s) if progress else None
    started: float | None = None
    t_spawn = time.monotonic()
    dead_at: float | None = None
    done_at: float | None = None
    timed_out = False
    grace = 30.0 if opts.device == "cuda" else 20.0
    try:
        while any(p.is_alive() for p in procs):
            try:
                msg = queue.get(timeout=0.2)
            except _q.Empty:
                msg = None
            if msg is not None:
                if msg[0] == "ready":
                    started = time.monotonic()
                    if bar:
                        bar.start()
                elif msg[0] == "progress" and bar:
                    bar.update(*msg[1:])
                elif msg[0] == "log":
                    say(f"tracekit: {msg[1]}")
            if signals and not stop.is_set():
                stop.set()
            if signals and len(signals) > 1:
                continue  # a second signal killed the ranks: not a crash
            for r, p in enumerate(procs):
                if not p.is_alive() and p.exitcode not in (0, None) and dead_at is None:
                    dead_at = time.monotonic()
                    stop.set()
                    quality.add("capture_rank_crashed", f"rank {r} exited with code {p.exitcode}; stopped the other ranks", rank=r)
                    say(f"tracekit: rank {r} exited with code {p.exitcode}; stopping the capture")
                    say(_log_tail(run_dir, r))
            now = time.monotonic()
            if dead_at is not None and now - dead_at > grace:
                for r, p in enumerate(procs):
                    if p.is_alive():
                        quality.add("capture_rank_killed", f"rank {r} did not stop within {grace:.0f}s after a peer died; killed", rank=r)
                        p.kill()
                break
            if done_at is None and all((run_dir / f"rank{r}.extra.json").exists() for r in range(len(procs))):
                done_at = now
            if done_at is not None and now - done_at > 15.0:
                for p in procs:  # every rank wrote its records; teardown is stuck (seen after CUDA graphs)
                    if p.is_alive():
                        p.kill()
                break
            limit = opts.duration_s * 3 + 120 if started else 600 + opts.duration_s
            if now - (started or t_spawn) > limit:
                if not stop.is_set() or not timed_out:
                    quality.add("capture_timeout", f"ranks still running {limit:.0f}s after start; stopped them")
                    timed_out = True
                stop.set()
                if now - (started or t_spawn) > limit + grace:
                    for p in procs:
                        p.kill()
                    break
    finally:
        if bar:
            bar.close()


class _Bar:
    """rich progress: elapsed, steps, tokens/s (rank 0's view)."""

    def __init__(self, duration_s: float) -> None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.p = Progress(
            TextColumn("capturing"),
            BarColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[steps]} steps  {task.fields[tps]} tok/s"),
            transient=False,
        )
        self.duration_s = duration_s
        self.task: Any = None

    def start(self) -> None:
        self.p.start()
        self.task = self.p.add_task("cap", total=self.duration_s, steps=0, tps="-")

    def update(self, elapsed: float, steps: int, tokens: int) -> None:
        if self.task is not None:
            tps = f"{tokens / elapsed:,.0f}" if elapsed > 0 else "-"
            self.p.update(self.task, completed=min(elapsed, self.duration_s), steps=steps, tps=tps)

    def close(self) -> None:
        if self.task is not None:
            self.p.stop()
