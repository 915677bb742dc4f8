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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tracekit.capture.profiler import quiet_profiler_log
from tracekit.capture.window import FileBoard, WindowController, WindowSpec
from tracekit import _env

__all__ = ["ENV_DIR", "ENV_SPEC", "TICK_SIGNAL", "deferred_signals", "install"]

ENV_DIR = _env.CAPTURE_DIR
ENV_SPEC = _env.CAPTURE_SPEC
TICK_SIGNAL = int(getattr(signal, "SIGRTMAX", 64)) - 3  # never sent by the OS here; interrupt_main only
_MAX_RECORDS = 2_000_000
_STATE: dict[str, Any] = {}


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

        self.torch = torch
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


def install(t0_ns: int | None = None) -> bool:
    """Hook this process (see the module docstring); False when not asked to or already done."""
    out_s = _env.get(ENV_DIR)
    if not out_s or _STATE:
        return False
    out = Path(out_s)
    cfg = json.loads(_env.get(ENV_SPEC) or "{}")
    spec = WindowSpec.from_json(cfg.get("spec") or {})
    step_rxs = [re.compile(p) for p in (cfg.get("step_re") or [])]  # the grammar's families (one regex each)
    t0 = int(t0_ns or time.time_ns())
    launched = _env.is_set(_env.RANK)
    if launched:
        rank, world = int(_env.get(_env.RANK) or ""), int(_env.get(_env.WORLD_SIZE) or "1")
    else:
        rank, world = _claim_rank(out), 1
    leader = rank == 0 or not launched
    board = FileBoard(out / ("board.jsonl" if launched else f"board.rank{rank}.jsonl"))
    _write_json(out / f"rank{rank}.state.json", {"rank": rank, "world": world, "pid": os.getpid(), "t0_ns": t0,
                                                 "local_rank": _env.get(_env.LOCAL_RANK), "launched": launched})
    import torch
    from torch.autograd import profiler as _ap

    rf = _ap.record_function
    orig_enter, orig_exit = rf.__enter__, rf.__exit__
    records: list[list[Any]] = []
    st: dict[str, Any] = {"busy": False, "depth": 0, "written": False}
    main_ident = threading.main_thread().ident
    cache: dict[str, bool] = {}
    named = bool(spec.start_at) and spec.start_at != "step"

    def restore() -> None:
        if rf.__dict__.get("__enter__") is enter:
            rf.__enter__, rf.__exit__ = orig_enter, orig_exit  # type: ignore[method-assign]

    def write_out(c: WindowController) -> None:
        if st["written"]:
            return
        st["written"] = True
        restore()
        dev = None
        try:
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                dev = int(torch.cuda.current_device())
        except Exception:  # noqa: BLE001
            pass
        _write_json(out / f"rank{rank}.extra.json", {
            "rank": rank, "world": world, "pid": os.getpid(), "t0_ns": t0, "torch": torch.__version__,
            "cuda_device": dev, "cuda_visible_devices": _env.get(_env.CUDA_VISIBLE_DEVICES),
            "windows": c.windows, "errors": c.errors, "done_reason": c.done_reason,
            "capture_start_ns": c.capture_start_ns, "steps_seen": c.steps_seen,
            "records": records, "records_dropped": st.get("dropped", 0),
        })
        (out / f"rank{rank}.done").write_text(c.done_reason)

    try:
        backend = TorchBackend(out, rank)
    except Exception as e:  # noqa: BLE001
        _say(f"rank {rank}: no profiler ({type(e).__name__}: {e})")
        return False
    ctl = WindowController(spec, backend, board, time.time_ns, t0, leader=leader, world=world, on_done=write_out)

    def enter(self: Any) -> Any:
        if not st["busy"] and threading.get_ident() == main_ident:
            name = self.name
            hit = cache.get(name)
            if hit is None:
                hit = any(rx.search(name) for rx in step_rxs)
                if len(cache) < 100_000:
                    cache[name] = hit
            st["busy"] = True
            try:
                if hit and st["depth"] == 0:
                    st["depth"] = 1
                    self._tk_step = True
                    ctl.begin_step()
                    w = ctl._open
                    self._tk_rec = [time.time_ns(), 0, name, w["k"] if w is not None else -1]
                elif named and not hit:
                    ctl.range_enter(name)
            finally:
                st["busy"] = False
            if backend.held:
                _deliver(backend.held)  # a Ctrl-C held during an export lands here, as if it came now
        return orig_enter(self)

    def exit_(self: Any, *a: Any) -> Any:
        if "_tk_step" not in self.__dict__:
            return orig_exit(self, *a)
        # a step's range closes in the profiler and in the window's count together: a Ctrl-C between the two
        # left a whole step in the trace that its window did not count; held here, delivered right after
        with deferred_signals():
            return _exit_step(self, *a)

    def _exit_step(self: Any, *a: Any) -> Any:
        r = orig_exit(self, *a)
        rec = self.__dict__.pop("_tk_rec", None)
        if self.__dict__.pop("_tk_step", False):
            st["depth"] = 0
            if rec is not None:
                rec[1] = time.time_ns()
                if len(records) < _MAX_RECORDS:
                    records.append(rec)
                else:
                    st["dropped"] = st.get("dropped", 0) + 1
            st["busy"] = True
            try:
                ctl.end_step()
            finally:
                st["busy"] = False
            if backend.held:
                _deliver(backend.held)
        return r

    rf.__enter__, rf.__exit__ = enter, exit_  # type: ignore[method-assign]

    def finish(reason: str) -> None:
        st["busy"] = True
        try:
            if backend.prof is not None and not ctl.recording:  # started, but an interrupt came before the controller knew
                ctl.errors.append("a profiler window was interrupted as it opened; stopped without export")
                with deferred_signals(deliver=False), quiet_profiler_log():
                    try:
                        backend.prof.stop()
                    except Exception:  # noqa: BLE001
                        pass
                backend.prof = None
            ctl.finish(reason)
        except Exception as e:  # noqa: BLE001
            _say(f"rank {rank}: capture finish failed: {type(e).__name__}: {e}")
        finally:
            write_out(ctl)  # no-op when on_done already wrote

    atexit.register(finish, "exit")
    on_main = threading.current_thread() is threading.main_thread()
    if on_main:
        def on_tick(_s: int, _f: Any) -> None:
            st["tick_pending"] = False
            if not st["busy"]:
                st["busy"] = True
                try:
                    ctl.tick()
                finally:
                    st["busy"] = False
                if backend.held:
                    _deliver(backend.held)

        signal.signal(TICK_SIGNAL, on_tick)
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            def on_term(_s: int, _f: Any) -> None:
                finish("SIGTERM")
                os._exit(143)

            signal.signal(signal.SIGTERM, on_term)

        def ticker() -> None:
            while not ctl.done:
                time.sleep(0.01)
                if ctl.wants_tick() and not st.get("tick_pending"):
                    st["tick_pending"] = True
                    try:
                        _thread.interrupt_main(TICK_SIGNAL)  # type: ignore[arg-type]
                    except Exception:  # noqa: BLE001
                        return

        threading.Thread(target=ticker, name="tracekit-ticker", daemon=True).start()
    else:
        _say(f"rank {rank}: torch imported off the main thread; windows follow steps only")
    _STATE.update(ctl=ctl, records=records, finish=finish)
    if _env.flag(_env.MODULE_CONTEXT):
        try:  # opt-in (capture --module-context): its overhead is well above 1% of a fast step on a GPU
            from tracekit.capture import module_context

            module_context.install()
        except Exception as e:  # noqa: BLE001 - never break the program
            _say(f"rank {rank}: module context not installed: {type(e).__name__}: {e}")
    return True
