"""Functions fit on a screen: none in tracekit/ is longer than 80 lines (issue 27 item 6).

Counted from the ``def`` line to the last line of the body, nested functions inside their parent too (a closure
is part of the function that holds it). :data:`NOT_YET` lists the functions still being split, at most at their
current length: the list only shrinks (an entry whose function now fits, or is gone, must be removed).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 80

#: path::qualified name -> its length today (it may shrink, not grow)
NOT_YET: dict[str, int] = {
}


def function_lengths(source: str) -> dict[str, int]:
    """Qualified name (``outer.inner``, ``Class.method``) -> lines of every function in ``source``."""
    out: dict[str, int] = {}

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    out[name] = (child.end_lineno or child.lineno) - child.lineno + 1
                walk(child, name + ".")
            else:
                walk(child, prefix)

    walk(ast.parse(source), "")
    return out


def _all() -> dict[str, int]:
    return {f"{f.relative_to(ROOT).as_posix()}::{n}": ln for f in sorted((ROOT / "tracekit").rglob("*.py"))
            for n, ln in function_lengths(f.read_text()).items()}


def test_no_function_over_80_lines() -> None:
    lengths = _all()
    long = {k: v for k, v in lengths.items() if v > LIMIT}
    new = sorted(f"{k}: {v} lines" for k, v in long.items() if k not in NOT_YET)
    grown = sorted(f"{k}: {v} lines (was {NOT_YET[k]})" for k, v in long.items() if k in NOT_YET and v > NOT_YET[k])
    assert not new, f"functions over {LIMIT} lines: split them by concept\n" + "\n".join(new)
    assert not grown, "functions still to be split grew: split them instead\n" + "\n".join(grown)


def test_the_not_yet_list_only_shrinks() -> None:
    lengths = _all()
    stale = sorted(k for k in NOT_YET if lengths.get(k, 0) <= LIMIT)
    assert not stale, "these fit now (or are gone): remove them from NOT_YET\n" + "\n".join(stale)


def test_lengths_are_counted_with_nesting() -> None:
    src = "def f():\n    def g():\n        return 1\n    return g\n\nclass C:\n    def m(self):\n        pass\n"
    assert function_lengths(src) == {"f": 4, "f.g": 2, "C.m": 2}
