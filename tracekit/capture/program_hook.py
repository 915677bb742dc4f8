"""Runs inside a program captured by ``tracekit capture -- PROGRAM`` (standard library + torch only).

``_boot/sitecustomize.py`` calls :func:`install` once the program has imported
torch. From then on, in this process (one torchrun worker, one rank):

* ``torch.autograd.profiler.record_function`` (also ``torch.profiler.record_function``)
  tells a :class:`~tracekit.capture.window.WindowController` when a step range
  (a name matching one of ``step_re``: the step-label grammar's families) opens and closes on
  the main thread, and keeps one record per step ``[start_ns, end_ns, label, window]``
  for the whole capture, profiled or not (~1 us per range);
* a ticker thread asks the main thread (``_thread.interrupt_main`` with a
  private real-time signal number: no OS signal is sent) to run the controller's
  time-based boundaries when the program marks no steps;
* profiler windows start and stop on the main thread (Kineto's profiler belongs
  to the thread that started it) and export ``rank{r}.win{k}.trace.json``
  through a ``.part`` name, with SIGINT/SIGTERM deferred until the file is
  complete: no signal interrupts a stop or an export;
* when the capture is complete (or the program exits, or SIGTERM arrives) the
  open window is closed and exported, ``rank{r}.extra.json`` (step records,
  windows, errors) and then ``rank{r}.done`` are written, and record_function
  is restored: after the capture the program runs unhooked.

Ranks come from ``RANK``/``WORLD_SIZE`` (torchrun); rank 0 leads the window
boundaries through a file board in the capture directory. Processes without
``RANK`` take the next free rank by an exclusive file claim and lead themselves.
"""

from __future__ import annotations

import _thread
import atexit
import contextlib
import json
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from tracekit.capture.profiler import quiet_profiler_log
from tracekit.capture.window import FileBoard, WindowController, WindowSpec
from tracekit import _env

__all__ = ["ENV_DIR", "ENV_SPEC", "TICK_SIGNAL", "deferred_signals", "install"]

ENV_DIR = _env.CAPTURE_DIR
ENV_SPEC = _env.CAPTURE_SPEC
TICK_SIGNAL = int(getattr(signal, "SIGRTMAX", 64)) - 3  # never sent by the OS here; interrupt_main only
_MAX_RECORDS = 2_000_000


def _say(msg: str) -> None:
    print(f"tracekit: {msg}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def deferred_signals(sigs: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM), deliver: bool = True) -> Iterator[list[int]]:
    """Hold SIGINT/SIGTERM while the block runs, then deliver them to the handlers that were there.

    With ``deliver=False`` the held signals are only listed (the caller delivers them once its
    bookkeeping is done, see :func:`deliver`). Only the main thread can change handlers;
    elsewhere the block runs unprotected.
    """
    got: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield got
        return
    old = {}
    for s in sigs:
        try:
            old[s] = signal.signal(s, lambda n, _f: got.append(n))
        except (ValueError, OSError):
            pass
    try:
        yield got
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if deliver:
            _deliver(got)


def _deliver(sigs: list[int]) -> None:
    """Raise each held signal once, in order, to its current handler."""
    pending = list(dict.fromkeys(sigs))
    sigs.clear()
    for s in pending:
        signal.raise_signal(s)


class TorchBackend:
    """The torch profiler, one object per window, exported to ``rank{r}.win{k}.trace.json``."""

    def __init__(self, out_dir: Path, rank: int) -> None:
        import torch

        from tracekit.capture.profiler import torch_profiler_factory

        self.torch: Any = torch
        self.cuda = bool(torch.cuda.is_available())
        self.factory = torch_profiler_factory(cuda=self.cuda)
        self.out_dir, self.rank = out_dir, rank
        self.prof: Any = None
        self.held: list[int] = []  # signals that arrived during a stop/export, delivered by the hook

    def _sync(self) -> None:
        if self.cuda and self.torch.cuda.is_initialized():
            self.torch.cuda.synchronize()

    def start(self) -> None:
        self._sync()
        p = self.factory()
        with quiet_profiler_log():
            p.start()
        self.prof = p

    def stop_export(self, k: int) -> dict[str, Any]:
        p, self.prof = self.prof, None
        final = self.out_dir / f"rank{self.rank}.win{k}.trace.json"
        part = self.out_dir / f".rank{self.rank}.win{k}.part.json"
        busy = self.out_dir / f"rank{self.rank}.exporting"  # says which window is stopping/exporting
        with deferred_signals(deliver=False) as held:
            busy.write_text(str(k))
            t0 = time.perf_counter()
            self._sync()
            with quiet_profiler_log():
                p.stop()
                t1 = time.perf_counter()
                p.export_chrome_trace(str(part))
            os.replace(part, final)
            t2 = time.perf_counter()
            busy.unlink(missing_ok=True)
            del p
        self.held.extend(held)
        return {"stop_s": round(t1 - t0, 4), "export_s": round(t2 - t1, 4), "bytes": final.stat().st_size,
                "file": final.name, "signals_held": len(held)}


def _claim_rank(out: Path) -> int:
    r = 0
    while True:
        try:
            fd = os.open(out / f"rank{r}.claim", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)
            return r
        except FileExistsError:
            r += 1


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name("." + path.name + ".tmp")
    tmp.write_text(json.dumps(obj, separators=(",", ":"), default=str))
    os.replace(tmp, path)


class _Run(NamedTuple):
    """Who this process is in the capture."""

    out: Path
    rank: int
    world: int
    t0_ns: int
    launched: bool  # by torchrun (RANK set): rank 0 leads the windows; else the process leads itself


def _identify(out: Path, t0_ns: int) -> _Run:
    launched = _env.is_set(_env.RANK)
    if launched:
        rank, world = int(_env.get(_env.RANK) or ""), int(_env.get(_env.WORLD_SIZE) or "1")
    else:
        rank, world = _claim_rank(out), 1
    return _Run(out, rank, world, t0_ns, launched)


class _Hook:
    """The live hook of one process: record_function's enter and exit, the tick, the finish.

    ``busy`` keeps the controller from being re-entered (a range opened by the profiler's own stop, a tick
    arriving inside a step's bookkeeping); a signal held during an export is delivered once it is clear.
    """

    def __init__(self, run: _Run, cfg: dict[str, Any], backend: TorchBackend, torch: Any, rf: Any) -> None:
        spec = WindowSpec.from_json(cfg.get("spec") or {})
        self.run, self.backend, self.torch, self.rf = run, backend, torch, rf
        self.step_rxs = [re.compile(p) for p in (cfg.get("step_re") or [])]  # the grammar's families
        self.named = bool(spec.start_at) and spec.start_at != "step"
        self.orig_enter, self.orig_exit = rf.__enter__, rf.__exit__
        self.records: list[list[Any]] = []
        self.dropped = 0
        self.busy = self.written = self.tick_pending = False
        self.depth = 0
        self.main_ident = threading.main_thread().ident
        self.cache: dict[str, bool] = {}
        board = FileBoard(run.out / ("board.jsonl" if run.launched else f"board.rank{run.rank}.jsonl"))
        leader = run.rank == 0 or not run.launched
        self.ctl = WindowController(spec, backend, board, time.time_ns, run.t0_ns, leader=leader, world=run.world,
                                    on_done=self.write_out)

        def enter(rf_self: Any) -> Any:
            return self.enter(rf_self)

        def exit_(rf_self: Any, *a: Any) -> Any:
            return self.exit_(rf_self, *a)

        self._enter, self._exit = enter, exit_

    def attach(self) -> None:
        self.rf.__enter__, self.rf.__exit__ = self._enter, self._exit

    def restore(self) -> None:
        if self.rf.__dict__.get("__enter__") is self._enter:
            self.rf.__enter__, self.rf.__exit__ = self.orig_enter, self.orig_exit

    def _guarded(self, step: Callable[[], None]) -> None:
        """Run one controller step with ``busy`` set, then deliver a Ctrl-C held during an export, as if it came now."""
        self.busy = True
        try:
            step()
        finally:
            self.busy = False
        if self.backend.held:
            _deliver(self.backend.held)

    def _is_step(self, name: str) -> bool:
        hit = self.cache.get(name)
        if hit is None:
            hit = any(rx.search(name) for rx in self.step_rxs)
            if len(self.cache) < 100_000:
                self.cache[name] = hit
        return hit

    def enter(self, rf_self: Any) -> Any:
        if not self.busy and threading.get_ident() == self.main_ident:
            name = rf_self.name
            hit = self._is_step(name)
            self._guarded(lambda: self._range_opens(rf_self, name, hit))
        return self.orig_enter(rf_self)

    def _range_opens(self, rf_self: Any, name: str, hit: bool) -> None:
        if hit and self.depth == 0:
            self.depth = 1
            rf_self._tk_step = True
            self.ctl.begin_step()
            w = self.ctl._open
            rf_self._tk_rec = [time.time_ns(), 0, name, w["k"] if w is not None else -1]
        elif self.named and not hit:
            self.ctl.range_enter(name)

    def exit_(self, rf_self: Any, *a: Any) -> Any:
        if "_tk_step" not in rf_self.__dict__:
            return self.orig_exit(rf_self, *a)
        # a step's range closes in the profiler and in the window's count together: a Ctrl-C between the two
        # left a whole step in the trace that its window did not count; held here, delivered right after
        with deferred_signals():
            return self._exit_step(rf_self, *a)

    def _exit_step(self, rf_self: Any, *a: Any) -> Any:
        r = self.orig_exit(rf_self, *a)
        rec = rf_self.__dict__.pop("_tk_rec", None)
        if rf_self.__dict__.pop("_tk_step", False):
            self.depth = 0
            if rec is not None:
                rec[1] = time.time_ns()
                if len(self.records) < _MAX_RECORDS:
                    self.records.append(rec)
                else:
                    self.dropped += 1
            self._guarded(self.ctl.end_step)
        return r

    def _cuda_device(self) -> int | None:
        try:
            if self.torch.cuda.is_available() and self.torch.cuda.is_initialized():
                return int(self.torch.cuda.current_device())
        except Exception:  # noqa: BLE001
            pass
        return None

    def write_out(self, c: WindowController) -> None:
        """Unhook, then write ``rank{r}.extra.json`` and ``rank{r}.done`` (once)."""
        if self.written:
            return
        self.written = True
        self.restore()
        run = self.run
        _write_json(run.out / f"rank{run.rank}.extra.json", {
            "rank": run.rank, "world": run.world, "pid": os.getpid(), "t0_ns": run.t0_ns,
            "torch": self.torch.__version__, "cuda_device": self._cuda_device(),
            "cuda_visible_devices": _env.get(_env.CUDA_VISIBLE_DEVICES),
            "windows": c.windows, "errors": c.errors, "done_reason": c.done_reason,
            "capture_start_ns": c.capture_start_ns, "steps_seen": c.steps_seen,
            "records": self.records, "records_dropped": self.dropped,
        })
        (run.out / f"rank{run.rank}.done").write_text(c.done_reason)

    def finish(self, reason: str) -> None:
        """Close the capture (exit, SIGTERM, or complete): the open window exported, the outputs written."""
        self.busy = True
        try:
            if self.backend.prof is not None and not self.ctl.recording:  # started; interrupted before the controller knew
                self.ctl.errors.append("a profiler window was interrupted as it opened; stopped without export")
                with deferred_signals(deliver=False), quiet_profiler_log():
                    try:
                        self.backend.prof.stop()
                    except Exception:  # noqa: BLE001
                        pass
                self.backend.prof = None
            self.ctl.finish(reason)
        except Exception as e:  # noqa: BLE001
            _say(f"rank {self.run.rank}: capture finish failed: {type(e).__name__}: {e}")
        finally:
            self.write_out(self.ctl)  # no-op when on_done already wrote

    def on_tick(self, _s: int, _f: Any) -> None:
        self.tick_pending = False
        if not self.busy:
            self._guarded(self.ctl.tick)

    def on_term(self, _s: int, _f: Any) -> None:
        self.finish("SIGTERM")
        os._exit(143)

    def ticker(self) -> None:
        """Ask the main thread to run the time-based boundaries (no OS signal: interrupt_main)."""
        while not self.ctl.done:
            time.sleep(0.01)
            if self.ctl.wants_tick() and not self.tick_pending:
                self.tick_pending = True
                try:
                    _thread.interrupt_main(TICK_SIGNAL)  # type: ignore[arg-type]
                except Exception:  # noqa: BLE001
                    return

    def arm_signals(self) -> None:
        """On the main thread: the tick handler, a SIGTERM that finishes first, and the ticker thread."""
        signal.signal(TICK_SIGNAL, self.on_tick)
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            signal.signal(signal.SIGTERM, self.on_term)
        threading.Thread(target=self.ticker, name="tracekit-ticker", daemon=True).start()


#: the one hook of this process (record_function, which it patches, is process-wide too); set once by install
_HOOK: list[_Hook] = []


def install(t0_ns: int | None = None) -> bool:
    """Hook this process (see the module docstring); False when not asked to or already done."""
    out_s = _env.get(ENV_DIR)
    if not out_s or _HOOK:
        return False
    out = Path(out_s)
    cfg = json.loads(_env.get(ENV_SPEC) or "{}")
    run = _identify(out, int(t0_ns or time.time_ns()))
    _write_json(out / f"rank{run.rank}.state.json", {
        "rank": run.rank, "world": run.world, "pid": os.getpid(), "t0_ns": run.t0_ns,
        "local_rank": _env.get(_env.LOCAL_RANK), "launched": run.launched})
    import torch
    from torch.autograd import profiler as _ap

    try:
        backend = TorchBackend(out, run.rank)
    except Exception as e:  # noqa: BLE001
        _say(f"rank {run.rank}: no profiler ({type(e).__name__}: {e})")
        return False
    hook = _Hook(run, cfg, backend, torch, _ap.record_function)
    hook.attach()
    atexit.register(hook.finish, "exit")
    if threading.current_thread() is threading.main_thread():
        hook.arm_signals()
    else:
        _say(f"rank {run.rank}: torch imported off the main thread; windows follow steps only")
    _HOOK.append(hook)
    _install_module_context(run.rank)
    return True


def _install_module_context(rank: int) -> None:
    if _env.flag(_env.MODULE_CONTEXT):
        try:  # opt-in (capture --module-context): its overhead is well above 1% of a fast step on a GPU
            from tracekit.capture import module_context

            module_context.install()
        except Exception as e:  # noqa: BLE001 - never break the program
            _say(f"rank {rank}: module context not installed: {type(e).__name__}: {e}")
