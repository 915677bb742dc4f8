"""Thin typer CLI: each command lives in ``tracekit/commands/<name>.py``.

A command validates options, calls the library, hands the result to a
reporter and maps :class:`~tracekit._errors.TracekitError` to a one-line
message and a non-zero exit code (no traceback).
"""

from __future__ import annotations

import os
import re
import signal
import sys
from typing import Any, Sequence


def _interrupted_while_starting(signum: int, frame: object) -> None:
    """Ctrl-C while the commands are imported: nothing has been written yet; one line, exit 130."""
    sys.stderr.write("tracekit: interrupted\n")
    sys.stderr.flush()
    os._exit(130)


try:  # restored at the end of this module; main() then installs the command-time handler
    _PREV_SIGINT = signal.signal(signal.SIGINT, _interrupted_while_starting)
except ValueError:  # imported from a thread
    _PREV_SIGINT = None

import importlib  # noqa: E402
import inspect  # noqa: E402

import typer  # noqa: E402
from typer.core import TyperCommand, TyperGroup  # noqa: E402

try:  # typer >= 0.2x vendors click
    from typer._click import exceptions as _cx  # noqa: E402
except ImportError:  # pragma: no cover - older typer: click itself
    from click import exceptions as _cx  # type: ignore[no-redef]  # noqa: E402

from tracekit._errors import TracekitError  # noqa: E402
from tracekit._memory import configure_env  # noqa: E402
from tracekit.commands import _common, _ranges  # noqa: E402
from tracekit import _env  # noqa: E402

__all__ = ["app", "main"]


def _flags_read_as_flags(params: list[Any]) -> None:
    """Boolean flags show no value placeholder in help (typer prints ``<bool>`` as if they took one)."""
    for p in params:
        if getattr(p, "is_flag", False) and getattr(p, "metavar", None) is None:
            p.metavar = ""


class _Command(TyperCommand):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _flags_read_as_flags(self.params)
        _ranges.install(self, str(self.name))  # every numeric option: finite and in its range, shown in --help

    def get_help_option(self, ctx: Any) -> Any:
        opt = super().get_help_option(ctx)
        _flags_read_as_flags([opt] if opt is not None else [])
        return opt


class _Group(TyperGroup):
    def get_help_option(self, ctx: Any) -> Any:
        opt = super().get_help_option(ctx)
        _flags_read_as_flags([opt] if opt is not None else [])
        return opt

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, windows_expand_args: bool = True, **extra: Any) -> Any:
        """click's own parse errors (a value it cannot parse, an unknown option, a missing argument, an
        unknown command) as one line naming the option and the remedy, exit 2, instead of its usage box."""
        prog_name = prog_name or "tracekit"
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, windows_expand_args, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, False, windows_expand_args, **extra)
        except _cx.UsageError as e:
            if type(e).__name__ == "NoArgsIsHelpError":  # `tracekit` or a group alone: its help, as before
                e.show()
                sys.exit(e.exit_code)
            _common.say(usage_line(e, sys.argv[1:] if args is None else list(args), set(self.commands)))
            sys.exit(2)
        except _cx.ClickException as e:
            e.show()
            sys.exit(e.exit_code)
        except _ABORT:
            print("tracekit: interrupted", file=sys.stderr)
            sys.exit(130)
        sys.exit(rv if isinstance(rv, int) else 0)


_ABORT = tuple({typer.Abort, getattr(_cx, "Abort", typer.Abort)})


def usage_line(e: Any, argv: list[str], commands: set[str]) -> str:
    """``tracekit: error: <command>: <click's message>; see `tracekit <command> --help``` on one line."""
    ctx = getattr(e, "ctx", None)
    names = []
    while ctx is not None and ctx.parent is not None:  # the command's words below the root (not the program's name)
        names.append(str(ctx.info_name))
        ctx = ctx.parent
    path = " ".join(["tracekit", *reversed(names)])
    if not names:  # raised by the parser without the command's context: the command is the first word given
        cmd = next((a for a in argv if not a.startswith("-")), None)
        if cmd in commands:
            path = f"tracekit {cmd}"
    cmd = path.split(" ", 1)[1] if " " in path else ""
    msg = " ".join(str(e.format_message()).split()).rstrip(".")
    if msg:
        msg = msg[0].lower() + msg[1:] if not msg[:2].isupper() else msg
    where = f"{cmd}: " if cmd else ""
    return f"tracekit: error: {where}{msg}; see `{path} --help`"


app = typer.Typer(
    name="tracekit",
    help="Trace capture and replay analyzer for multi-GPU LLM inference. Each command's help names the docs page "
         "that explains its output; `tracekit COMMAND --help` for details.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=_Group,
)

_COMMANDS = ("convert", "analyze", "capture", "launch", "timeline", "export", "replay", "diff")

#: the page that explains each command's output (named at the end of its help)
DOCS = {
    "convert": "schemas/trace_v1.md (the trace.parquet it writes)",
    "analyze": "docs/analyze_json.md (--json; the terms: docs/breakdown.md, docs/metrics.md)",
    "capture": "schemas/trace_v1.md (the trace.parquet it writes; CPU runs: docs/cpu_mode.md)",
    "launch": "docs/sglang_integration.md",
    "timeline": "docs/timeline.md",
    "export": "docs/timeline.md (section `tracekit export --perfetto`)",
    "replay": "docs/replay.md",
    "diff": "docs/diff.md",
}


def _help_text(doc: str, docs_page: str | None) -> str:
    """One paragraph per blank-line-separated block (hard line breaks of the docstring joined, so the
    help wraps at the terminal's width, never mid-sentence), then the docs page of the output."""
    paras = [" ".join(ln.strip() for ln in block.splitlines() if ln.strip())
             for block in re.split(r"\n\s*\n", inspect.cleandoc(doc or ""))]
    paras = [p for p in paras if p]
    if docs_page:
        paras.append(f"Output explained in {docs_page}.")
    return "\n\n".join(paras)


for _name in _COMMANDS:
    importlib.import_module(f"tracekit.commands.{_name}").register(app)

for _info in app.registered_commands:
    if _info.cls in (None, TyperCommand):
        _info.cls = _Command
    _cmd = _info.name or (_info.callback.__name__ if _info.callback else "")
    _info.help = _help_text(_info.help or inspect.getdoc(_info.callback) or "", DOCS.get(_cmd))


class _Terminated(BaseException):
    """Raised from the SIGTERM handler so ``finally``/atomic-write cleanup runs before exit."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise _Terminated()


def main() -> None:
    """Console entry point."""
    from tracekit import _interrupt

    configure_env()  # polars' allocator default for this command, before a command imports polars (tracekit._memory)

    try:
        prev = signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # not the main thread (embedded use): keep the defaults
        prev = None
    # Ctrl-C always stops a command (exit 130, outputs cleaned up), also when the shell started it with
    # SIGINT ignored (a background job of a script). The handler only sets a flag; the long loops stop
    # at their next _interrupt.check() (a KeyboardInterrupt raised inside a polars callback would
    # become a Rust panic). A second Ctrl-C raises at once.
    prev_int = _interrupt.install() if prev is not None else None
    from tracekit.commands import _stdout

    _stdout.reserve_closed_stdout()
    try:
        with _stdout.guarded():  # stdout that cannot be written (EPIPE, ENOSPC, closed): one line, exit 3
            _run()
    finally:
        if prev is not None:
            signal.signal(signal.SIGTERM, prev)
        _interrupt.restore(prev_int)
        if prev_int is not None and _is_console():
            # the command is over (its exit code decided): a Ctrl-C while the interpreter tears down a large
            # process (seconds) must not kill it by SIGINT with its output complete
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def _is_console() -> bool:
    """Whether this process is the ``tracekit`` console script or ``python -m tracekit.cli`` (not a caller's)."""
    m = sys.modules.get("__main__")
    spec = getattr(m, "__spec__", None)
    return os.path.basename(str(getattr(m, "__file__", "") or "")) == "tracekit" or getattr(spec, "name", "") == "tracekit.cli"


def _run() -> None:
    try:
        try:
            app(standalone_mode=True)
        finally:
            sys.stdout.flush()  # help or usage text that cannot be written fails here (an OutputError), not at exit
    except SystemExit as e:
        # typer turns a Ctrl-C outside the command body (while parsing options, importing) into a silent exit 130
        if e.code == 130 and not _common.interrupt_reported():
            print("tracekit: interrupted", file=sys.stderr)
        raise
    except _Terminated:
        print("tracekit: terminated", file=sys.stderr)
        sys.exit(143)
    except TracekitError as e:
        _common.say(f"tracekit: error: {e}")
        from tracekit.commands import _stdout

        _stdout.settle()
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        print("tracekit: interrupted", file=sys.stderr)
        sys.exit(130)
    except BaseException as e:  # noqa: BLE001 - last resort: a bug must not print a traceback to users
        from tracekit import _interrupt

        if _interrupt.is_interrupt(e):  # polars' PanicException from a Ctrl-C inside one of its callbacks
            if not _common.interrupt_reported():
                print("tracekit: interrupted", file=sys.stderr)
            sys.exit(130)
        if not isinstance(e, Exception) or _env.debug():
            raise
        msg = " ".join(f"{type(e).__name__}: {e}".split())[:500]
        _common.say(f"tracekit: internal error: {msg}; please report it (TRACEKIT_DEBUG=1 shows the traceback)")
        sys.exit(70)


if _PREV_SIGINT is not None:
    signal.signal(signal.SIGINT, _PREV_SIGINT)

if __name__ == "__main__":
    main()
