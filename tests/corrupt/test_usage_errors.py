"""click/typer's own parse errors (issue 20): one line naming the option and the remedy, exit 2, no usage box.

For every command of the CLI (found by introspection, so a new command is covered without editing
this file): an unknown option, a missing required argument, an option that needs a value given
none, and a value click cannot parse for each of its integer and number options. The same through
the installed console script for a sample (a fresh process: what a user sees).
"""

from __future__ import annotations

import re
import typing

import pytest

from corrupt._build import cli, cli_inproc

BOX = re.compile(r"[╭╮╰╯│─]")


def _commands() -> dict[str, object]:
    from typer.main import get_command

    from tracekit.cli import app

    group = get_command(app)
    return dict(group.commands)  # type: ignore[attr-defined]


COMMANDS = sorted(_commands())


def _params(cmd: str) -> list[object]:
    return list(_commands()[cmd].params)  # type: ignore[attr-defined]


def _required_args(cmd: str) -> list[str]:
    return [p.name for p in _params(cmd) if p.param_type_name == "argument" and p.required]  # type: ignore[attr-defined]


def _numeric(p: object) -> bool:
    """Whether the option's value is an int or a float (typer >= 0.2x: its annotation; older: click's type)."""
    td = getattr(p, "type_descriptor", None)
    if td is not None:
        ann = td.annotation
        return ann in (int, float) or any(a in (int, float) for a in typing.get_args(ann))
    return type(getattr(p, "type", None)).__name__ in ("IntParamType", "FloatParamType", "IntRange", "FloatRange")


def _value_options(cmd: str) -> list[tuple[str, bool]]:
    """(option, numeric) of the options that take a value (not flags, not --help)."""
    out = []
    for p in _params(cmd):
        if p.param_type_name != "option" or getattr(p, "is_flag", False) or not p.opts:  # type: ignore[attr-defined]
            continue
        out.append((max(p.opts, key=len), _numeric(p)))  # type: ignore[attr-defined]
    return out


def _valid_args(cmd: str) -> list[str]:
    """Placeholders for the required arguments (parsing fails before they are read)."""
    return ["x.parquet"] * len(_required_args(cmd))


def _check(p, cmd: str, *must: str) -> str:  # type: ignore[no-untyped-def]
    assert p.returncode == 2, (p.args, p.returncode, p.stderr)
    assert not BOX.search(p.stderr) and "Usage:" not in p.stderr and "Traceback" not in p.stderr, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, p.stderr
    line = lines[0]
    assert line.startswith(f"tracekit: error: {cmd}: "), line
    assert line.endswith(f"see `tracekit {cmd} --help`"), line  # the remedy
    for m in must:
        assert m in line, (m, line)
    return line


def test_every_command_is_covered() -> None:
    assert {"convert", "analyze", "timeline", "export", "replay", "diff", "capture", "launch"} <= set(COMMANDS)


def _passes_unknown_options(cmd: str) -> bool:
    """`launch` hands unknown options to the program it starts (sglang's own flags): not an error there."""
    c = _commands()[cmd]
    return bool(getattr(c, "context_settings", {}).get("ignore_unknown_options") or getattr(c, "ignore_unknown_options", False))


@pytest.mark.parametrize("cmd", [c for c in COMMANDS if not _passes_unknown_options(c)])
def test_unknown_option_is_one_line(cmd: str) -> None:
    line = _check(cli_inproc(cmd, *_valid_args(cmd), "--no-such-option"), cmd, "--no-such-option")
    assert "no such option" in line


@pytest.mark.parametrize("cmd", [c for c in COMMANDS if _required_args(c)])
def test_missing_argument_is_one_line(cmd: str) -> None:
    line = _check(cli_inproc(cmd), cmd, "missing argument")
    assert _required_args(cmd)[0] in line.lower()


@pytest.mark.parametrize("cmd", [c for c in COMMANDS if _value_options(c)])
def test_option_without_its_value_is_one_line(cmd: str) -> None:
    opt, _t = _value_options(cmd)[0]
    line = _check(cli_inproc(cmd, *_valid_args(cmd), opt), cmd, opt)
    assert "requires an argument" in line


NUMERIC = [(c, o) for c in COMMANDS for o, num in _value_options(c) if num]


@pytest.mark.parametrize("cmd,opt", NUMERIC, ids=[f"{c}{o}" for c, o in NUMERIC])
def test_unparsable_number_is_one_line(cmd: str, opt: str) -> None:
    """`--top inf`, `--ranks x`, ...: click cannot parse the value (before: its usage box)."""
    line = _check(cli_inproc(cmd, *_valid_args(cmd), opt, "inf-x"), cmd, opt)
    assert "invalid value" in line


def test_numeric_options_exist() -> None:
    """The parametrized test above is not empty: analyze --top, capture --ranks, timeline --max-segments, ..."""
    assert ("analyze", "--top") in NUMERIC and ("capture", "--ranks") in NUMERIC and len(NUMERIC) >= 10


def test_unknown_command_is_one_line() -> None:
    p = cli_inproc("bogus")
    assert p.returncode == 2 and not BOX.search(p.stderr), p.stderr
    assert p.stderr.strip() == "tracekit: error: no such command 'bogus'; see `tracekit --help`"


def test_top_inf_from_the_real_console_script(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The example of the issue, in a fresh process."""
    p = cli("analyze", tmp_path / "x.parquet", "--top", "inf")
    line = _check(p, "analyze", "--top")
    assert "invalid value for '--top'" in line


def test_help_and_no_arguments_still_show_help() -> None:
    p = cli_inproc("analyze", "--help")
    assert p.returncode == 0 and "--top" in p.stdout
    p = cli_inproc()
    assert p.returncode == 2 and "analyze" in (p.stdout + p.stderr)
