"""Where a Ctrl-C may raise (tracekit/_interrupt.py): not inside a library's code that tracekit called (an import
of torch or numpy can swallow the KeyboardInterrupt in a bare ``except:``: a capture interrupted while it started
then ran to its end), but in tracekit's or the standard library's code; frames below the innermost tracekit frame
(the CLI's typer and click) do not count."""

from __future__ import annotations

import sys
from typing import Any, Callable

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
