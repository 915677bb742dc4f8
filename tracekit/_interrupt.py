"""Ctrl-C without Rust panics: ``KeyboardInterrupt`` is raised only where no polars code is on the stack.

Why not Python's default handler (``KeyboardInterrupt`` raised wherever the main thread is): one
raised while polars calls back into Python (a categorical's ``_from_py_categories``, a UDF) becomes
a Rust ``PanicException``: a panic message and traceback on stderr, exit 1. Here the SIGINT handler
records the Ctrl-C (a flag) and raises only when the main thread is in plain Python code (tracekit,
the standard library: no polars frame on its stack, and no other library's code above the innermost
tracekit frame: an import of torch or numpy can swallow the exception in a bare ``except:``). Inside a
polars or library call it raises nothing; a profile hook on the main thread raises as that call returns
to tracekit's code. Besides, the
long loops (convert's per-chunk reading and per-batch writing, its per-rank loop, analyze's per-rank
work, timeline and export) call :func:`check` between chunks, batches and ranks, from any thread (a
worker's ``KeyboardInterrupt`` reaches the main thread like any other error). The CLI turns it into
``tracekit: interrupted`` and exit 130; the atomic writers remove their temp files on the way out.

The command's publish (the atomic rename of its output, :func:`committing`) ends that: a Ctrl-C after
it changes nothing (the command succeeded, its output is complete). Outside a command (option
parsing, after it) the handler only sets the flag; the command's start checks it. A second Ctrl-C
raises at once, wherever the program is (the user insists; inside polars that can still be a
panic, which :func:`is_interrupt` recognizes so the CLI still exits 130 with one line).

Fault injection for the tests: ``TRACEKIT_TEST_SIGINT_AT=<label>[:<n>]`` makes the process send
itself a real SIGINT at the ``n``-th (default first) ``check(label)``, so a test interrupts a
command at a named point deterministically (``tests/faults/test_interrupts.py``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Any, Callable, Iterable, Iterator, TypeVar

from tracekit import _env

__all__ = ["blocked", "check", "checked", "command", "committing", "deferred", "install", "is_interrupt", "pending", "reset", "restore", "wait_future",
           "TEST_SIGINT_AT"]

T = TypeVar("T")

#: environment variable of the fault-injection hook (see the module docstring)
TEST_SIGINT_AT = _env.TEST_SIGINT_AT


class _State:
    pending = False  # a SIGINT arrived and was not acted on yet
    count = 0  # SIGINTs received since install()/reset()
    running = False  # a command body runs (handle_errors); outside it a Ctrl-C only sets the flag
    committed = False  # the command's output was published: it is done, a late Ctrl-C changes nothing
    interrupted = False  # a KeyboardInterrupt was raised for this command: worker threads stop too
    deferred = 0  # depth of deferred() blocks: a resource is being created and recorded, raise after
    hook: tuple[str, int] | None = None
    hook_seen = 0
    lock = threading.Lock()


def _parse_hook(v: str | None) -> tuple[str, int] | None:
    if not v:
        return None
    label, _, n = v.partition(":")
    return label, int(n) if n.isdigit() and int(n) > 0 else 1


def _unsafe(f: Any) -> bool:
    """A frame in which an exception must not start: polars' Python code (its Rust code may be below,
    calling back into Python: the exception would become a panic), or ``Thread.join``'s wait on the
    thread's state lock (CPython 3.11 then marks a running thread as stopped, bpo-45274)."""
    mod = str(f.f_globals.get("__name__", ""))
    return mod.startswith("polars") or (mod == "threading" and f.f_code.co_name == "_wait_for_tstate_lock")


def _in_unsafe_call(frame: Any) -> bool:
    """Whether some frame of the main thread's stack is :func:`_unsafe` (under a polars call, in a join)."""
    f = frame
    while f is not None:
        if _unsafe(f):
            return True
        f = f.f_back
    return False


def _module_of(f: Any) -> str:
    return str(f.f_globals.get("__name__", ""))


def _is_tracekit(mod: str) -> bool:
    return mod == "tracekit" or mod.startswith("tracekit.")


def _third_party(mod: str) -> bool:
    """A module of an installed library: neither tracekit, nor the standard library, nor the main script."""
    top = mod.partition(".")[0]
    return bool(top) and not _is_tracekit(mod) and top not in sys.stdlib_module_names and top != "__main__"


def _in_library_call(frame: Any) -> bool:
    """Whether the main thread is inside a library's code that tracekit called (a frame of an installed library
    between ``frame`` and the innermost tracekit frame): e.g. importing torch or numpy, which catch exceptions
    with bare ``except:`` on some paths and would swallow a ``KeyboardInterrupt`` raised there (a Ctrl-C while a
    capture started ran the whole capture before it stopped). Frames below the first tracekit frame (the CLI's
    typer and click) do not count."""
    f = frame
    while f is not None:
        mod = _module_of(f)
        if _is_tracekit(mod):
            return False
        if _third_party(mod):
            return True
        f = f.f_back
    return False


def _stoppable() -> bool:
    return _State.pending and _State.running and not _State.committed


def _unwinding() -> bool:
    """Whether the main thread is handling a Ctrl-C already (an ``except`` or ``finally`` block on its way out
    with a ``KeyboardInterrupt``): raising another there would cut its cleanup short. pyarrow's readers
    (``pyarrow.json.read_json``) catch SIGINT themselves, raise ``KeyboardInterrupt`` and send the signal again,
    so this handler first sees that Ctrl-C while their exception unwinds, e.g. in the ``finally`` that removes
    convert's part directory (a CI run found it left behind). A second Ctrl-C still raises at once."""
    e = sys.exc_info()[1]
    return e is not None and is_interrupt(e)


def _on_sigint(signum: int, frame: Any) -> None:
    _State.count += 1
    if not (_State.running and not _State.committed) or _State.deferred:
        _State.pending = True  # between commands, the output published, or a resource being recorded: not now
        return
    _State.pending = True
    if _State.count == 1 and _unwinding():
        return  # already stopping: the cleanup on the way out runs whole
    if _State.count > 1 or not (_in_unsafe_call(frame) or _in_library_call(frame)):
        # plain Python code (tracekit, the standard library): as safe as anywhere; or the second Ctrl-C: now
        _raise()
    _arm_unwind()


def _raise() -> None:
    _State.pending = False
    _State.interrupted = True
    raise KeyboardInterrupt


def _arm_unwind() -> None:
    """Inside a polars call: stop as soon as it returns to code outside polars (a profile hook on the main
    thread sees the return), so a command stops without waiting for its next check()."""
    if sys.getprofile() is None:  # never replace a profiler somebody runs
        sys.setprofile(_on_return)


def _on_return(frame: Any, event: str, arg: Any) -> None:
    if not _stoppable():
        sys.setprofile(None)
        return
    if _State.deferred or _unwinding():
        return  # held: deferred() raises on leaving; a cleanup on the way out of a Ctrl-C runs whole
    if event != "return" or not (_unsafe(frame) or _third_party(_module_of(frame))):
        return
    if not _in_unsafe_call(frame.f_back) and not _in_library_call(frame.f_back):
        sys.setprofile(None)
        _raise()  # reaches the caller of the polars or library function: tracekit code, no Rust frame on the stack


def install() -> Any:
    """Route SIGINT to the flag handler (also when it was inherited ignored); returns the previous
    handler, or None outside the main thread (then nothing changes)."""
    reset()
    try:
        return signal.signal(signal.SIGINT, _on_sigint)
    except ValueError:  # not the main thread (embedded use)
        return None


def restore(prev: Any) -> None:
    """Put back the handler :func:`install` returned."""
    _State.running = False
    if prev is not None:
        signal.signal(signal.SIGINT, prev)


def reset() -> None:
    """Forget an earlier Ctrl-C (a new command starts); read the fault-injection hook (``TRACEKIT_TEST_SIGINT_AT``)."""
    _State.hook = _parse_hook(_env.get(TEST_SIGINT_AT))
    _State.pending = False
    _State.count = 0
    _State.hook_seen = 0
    _State.committed = False
    _State.interrupted = False


def pending() -> bool:
    """Whether a Ctrl-C arrived that no :func:`check` has acted on yet."""
    return _State.pending


@contextlib.contextmanager
def command() -> Iterator[None]:
    """The body of one command: a Ctrl-C stops it (KeyboardInterrupt) until it commits its output."""
    _State.committed = False
    _State.interrupted = False
    _State.running = True
    try:
        check()  # a Ctrl-C while the options were parsed
        yield
    finally:
        _State.running = False
        _State.committed = False
        if sys.getprofile() is _on_return:
            sys.setprofile(None)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """No Ctrl-C raises inside (it is held, and raised on leaving): for creating a resource and recording
    it for its cleanup, e.g. ``with deferred(): tmp = mkdtemp()``, where an exception between the
    creation and the assignment would leak it (nothing would know to remove it)."""
    _State.deferred += 1
    try:
        yield
    finally:
        _State.deferred -= 1
    if not _State.deferred and threading.current_thread() is threading.main_thread() and _stoppable():
        _raise()


@contextlib.contextmanager
def blocked() -> Iterator[None]:
    """SIGINT blocked in this thread meanwhile (held, not lost: delivered on leaving). Child processes
    started inside inherit the blocked mask, so a Ctrl-C to the process group never reaches a worker
    while its interpreter starts (before it could ignore SIGINT itself, it would print a traceback)."""
    try:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    except (AttributeError, OSError, ValueError):  # pragma: no cover - no pthread_sigmask
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


@contextlib.contextmanager
def committing() -> Iterator[None]:
    """Publish an output (the atomic rename): a pending Ctrl-C stops the command before it; from here
    to the end of the command none does (the output is complete: the command succeeded)."""
    check()
    was = _State.committed
    _State.committed = True
    try:
        yield
    except BaseException:
        _State.committed = was  # the publish failed: the command did not succeed
        raise


def check(label: str = "") -> None:
    """Raise ``KeyboardInterrupt`` if Ctrl-C was pressed (call between chunks, batches, ranks; any thread).

    In the main thread it acts on a pending Ctrl-C once; in a worker thread it raises for as long as the
    command is being interrupted, so workers stop while the main thread cleans up."""
    if _State.hook is not None and label == _State.hook[0]:
        with _State.lock:
            _State.hook_seen += 1
            fire = _State.hook_seen == _State.hook[1]
        if fire:
            # a real signal, through the installed handler (in the main thread it has run when os.kill returns)
            os.kill(os.getpid(), signal.SIGINT)
    if _State.committed:
        return
    if threading.current_thread() is threading.main_thread():
        if _State.deferred:
            return  # held: deferred() raises on leaving
        if _State.pending:
            _raise()  # acted on; the exception carries it from here
    elif _State.pending or _State.interrupted:
        raise KeyboardInterrupt  # a worker thread: its error reaches the main thread


def checked(items: Iterable[T], label: str = "") -> Iterator[T]:
    """``items`` with a :func:`check` before each one (a loop over chunks, batches or ranks)."""
    for x in items:
        check(label)
        yield x


def wait_future(f: Any, label: str = "", step_s: float = 0.1) -> Any:
    """``f.result()`` in bounded waits with a :func:`check` between them (a blocked wait is not a loop)."""
    from concurrent.futures import TimeoutError as FutTimeout

    while True:
        check(label)
        try:
            return f.result(timeout=step_s)
        except FutTimeout:
            continue


def wait_until(done: Callable[[], bool], label: str = "", step_s: float = 0.05) -> None:
    """Poll ``done`` every ``step_s`` with a :func:`check` between polls."""
    while not done():
        check(label)
        threading.Event().wait(step_s)


def is_interrupt(e: BaseException) -> bool:
    """Whether ``e`` is a Ctrl-C: ``KeyboardInterrupt``, or polars' ``PanicException`` raised because a
    Python callback inside polars got one (a second Ctrl-C raises wherever it lands)."""
    if isinstance(e, KeyboardInterrupt):
        return True
    if type(e).__name__ != "PanicException":
        return False
    if "KeyboardInterrupt" in str(e):
        return True
    seen: set[int] = set()
    x = e.__cause__ or e.__context__
    while x is not None and id(x) not in seen:
        seen.add(id(x))
        if isinstance(x, KeyboardInterrupt):
            return True
        x = x.__cause__ or x.__context__
    return False
