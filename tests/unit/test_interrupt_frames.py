"""Where a Ctrl-C may raise (tracekit/_interrupt.py): not inside a library's code that tracekit called (an import
of torch or numpy can swallow the KeyboardInterrupt in a bare ``except:``: a capture interrupted while it started
then ran to its end), but in tracekit's or the standard library's code; frames below the innermost tracekit frame
(the CLI's typer and click) do not count."""

from __future__ import annotations

import sys
from typing import Any, Callable, Iterator

import pytest

from tracekit import _interrupt


def _fn(module: str, name: str, body: str, **names: Any) -> Callable[..., Any]:
    ns: dict[str, Any] = {"__name__": module, "sys": sys, **names}
    exec(f"def {name}(cb):\n    {body}\n", ns)  # noqa: S102 - a function whose frames claim to be that module's
    return ns[name]  # type: ignore[no-any-return]


def _probe(frame: Any) -> bool:
    return _interrupt._in_library_call(frame)


def test_inside_a_library_call_the_raise_waits() -> None:
    lib = _fn("numpy.fake", "lib_call", "return cb(sys._getframe())")
    tk = _fn("tracekit.fake", "tk_call", "return lib_call(cb)", lib_call=lib)
    assert tk(_probe) is True
    nested = _fn("torch.fake", "outer_lib", "return tk_call(cb)", tk_call=tk)  # a library that calls back into tracekit
    assert nested(_probe) is True  # still inside numpy's frame, above the innermost tracekit frame


def test_in_tracekit_or_the_standard_library_it_raises_at_once() -> None:
    std = _fn("json.fake", "std_call", "return cb(sys._getframe())")
    tk = _fn("tracekit.fake", "tk_call", "return std_call(cb)", std_call=std)
    assert tk(_probe) is False
    assert _fn("tracekit.fake", "here", "return cb(sys._getframe())")(_probe) is False
    below = _fn("typer.fake", "cli", "return tk_call(cb)", tk_call=tk)  # the CLI's frames under the command
    assert below(_probe) is False


def test_third_party_modules() -> None:
    assert _interrupt._third_party("numpy.lib._function_base_impl")
    assert _interrupt._third_party("torch._ops")
    assert not _interrupt._third_party("importlib._bootstrap")
    assert not _interrupt._third_party("tracekit.capture.orchestrate")
    assert not _interrupt._third_party("__main__")


#: a command's body and cleanup as tracekit code (frames of a ``tracekit.`` module: the handler raises there)
_COMMAND = """
def run(body, done):
    try:
        body()
    finally:
        os.kill(os.getpid(), signal.SIGINT)  # the handler runs here, in the finally, as the exception unwinds
        done.append("cleanup started")
        done.append("cleanup finished")
"""


@pytest.fixture(autouse=True)
def _fresh_state() -> Iterator[None]:
    """Each test's Ctrl-Cs end with it. A process ends after its command; this one runs other tests next, and a
    Ctrl-C held or a stop flag left here would stop the next analysis in it (an xdist worker then reports a
    keyboard interrupt in an unrelated test)."""
    _interrupt.reset()
    yield
    _interrupt.reset()


def _handler_run(body: Callable[[], None]) -> list[str]:
    """Run ``body`` as a command's body with tracekit's SIGINT handler installed: the steps its cleanup reached."""
    import os
    import signal

    ns: dict[str, Any] = {"__name__": "tracekit.fake_command", "os": os, "signal": signal}
    exec(_COMMAND, ns)  # noqa: S102
    done: list[str] = []
    prev = _interrupt.install()
    try:
        with _interrupt.command():
            ns["run"](body, done)
    except KeyboardInterrupt:
        done.append("interrupted")
    finally:
        _interrupt.restore(prev)
    return done


def test_a_ctrl_c_seen_while_an_interrupt_unwinds_does_not_cut_the_cleanup_short() -> None:
    """pyarrow's readers catch SIGINT themselves, raise KeyboardInterrupt, and send the signal again: tracekit's
    handler first sees that Ctrl-C in the ``finally`` that removes convert's part directory (a CI run found the
    directory left behind). It must not raise a second KeyboardInterrupt there."""
    def pyarrow_like() -> None:
        raise KeyboardInterrupt

    assert _handler_run(pyarrow_like) == ["cleanup started", "cleanup finished", "interrupted"]


def test_a_second_ctrl_c_during_a_cleanup_still_raises_at_once() -> None:
    import os
    import signal

    def first_ctrl_c() -> None:
        os.kill(os.getpid(), signal.SIGINT)  # tracekit's handler raises KeyboardInterrupt (count 1)

    # the second one (count 2), in the finally, stops the cleanup at once: the user insists
    assert _handler_run(first_ctrl_c) == ["interrupted"]


def test_without_an_exception_a_ctrl_c_in_the_cleanup_raises_at_once() -> None:
    """Holding is only for a cleanup on the way out: a body that ended normally meets the Ctrl-C at once."""
    assert _handler_run(lambda: None) == ["interrupted"]
