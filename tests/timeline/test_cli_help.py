"""CLI help: boolean options read as flags, help text wraps at the terminal's width (never at the
docstring's line breaks), and every command names the docs page that explains its output."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tracekit.cli import DOCS, app

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = [c.name or c.callback.__name__.replace("_", "-") for c in app.registered_commands]


def help_of(*args: str, width: int = 100) -> str:
    r = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": str(width), "TERM": "dumb"})
    assert r.exit_code == 0, r.output
    return r.output


def test_every_command_is_documented():
    assert set(COMMANDS) == set(DOCS)


@pytest.mark.parametrize("cmd", [None, *COMMANDS])
def test_flags_read_as_flags(cmd):
    out = help_of(*([cmd] if cmd else []))
    assert "<bool>" not in out
    assert re.search(r"--help\s+Show this message", out)  # a flag: no value placeholder between


@pytest.mark.parametrize("cmd", COMMANDS)
def test_help_names_an_existing_docs_page(cmd):
    out = " ".join(help_of(cmd, width=200).split())
    m = re.search(r"Output explained in ((?:docs|schemas)/[\w./-]+\.md)", out)
    assert m, out[:400]
    assert (ROOT / m.group(1)).is_file(), m.group(1)


def _description_lines(out: str) -> dict[str, list[str]]:
    """Command panel of the top-level help: {command: its description's wrapped lines}."""
    rows: dict[str, list[str]] = {}
    cur = None
    for ln in out.splitlines():
        m = re.match(r"^│ (\w+)?\s+(.*?)\s*│$", ln)
        if not m or ln.startswith("│ --"):
            continue
        name, text = m.group(1), m.group(2)
        if name in COMMANDS:
            cur = name
            rows[cur] = [ln[ln.index(name) + len(name):].strip(" │")]
        elif cur is not None and text:
            rows[cur].append(ln.strip(" │"))
    return rows


@pytest.mark.parametrize("width", [80, 140])
def test_top_level_help_wraps_only_at_the_width(width):
    out = help_of(width=width)
    rows = _description_lines(out)
    assert set(rows) == set(COMMANDS)
    col = max(len(x) for lines in rows.values() for x in lines)
    for name, lines in rows.items():
        for a, b in zip(lines, lines[1:]):  # a line breaks only where the next word would not fit
            assert len(a) + 1 + len(b.split()[0]) > col - 2, (name, a, b)
