"""Module-level state that changes at run time is the short, justified list of docs/architecture.md ("Global state").

An ``ast`` read of ``tracekit/`` (no import): a module-level name that a function of the same module mutates
(``.append``, ``.update``, ``x[k] =``, ``x.attr =``, ...) or rebinds with ``global``. :data:`JUSTIFIED` lists the
ones there are today, each justified in the doc; a new one fails (make it an object passed in, or justify it there
and here), and an entry that is gone must be removed.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MUTATORS = {"append", "add", "update", "pop", "clear", "extend", "setdefault", "insert", "remove", "discard",
            "popitem", "appendleft", "popleft"}

JUSTIFIED = {
    "tracekit/analysis/registry.py::_REGISTRY",
    "tracekit/_inputs.py::_INPUTS",
    "tracekit/_inputs.py::_OUTPUTS",
    "tracekit/commands/_common.py::_REPORTED",
    "tracekit/capture/program_hook.py::_HOOK",
    "tracekit/capture/module_context.py::_state",
    "tracekit/capture/sglang_plugin.py::_STATE",
    "tracekit/capture/rank_worker.py::_TERM",
    "tracekit/ingest/kscan.py::_lib",
    "tracekit/ingest/kscan.py::_why",
    "tracekit/ingest/kscan.py::_scratch",
}


def _changed(fn: ast.AST, names: set[str]) -> set[str]:
    out: set[str] = set()
    for n in ast.walk(fn):
        if isinstance(n, ast.Global):
            out.update(g for g in n.names if g in names)
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in MUTATORS:
            if isinstance(n.func.value, ast.Name) and n.func.value.id in names:
                out.add(n.func.value.id)
        elif isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = n.targets if isinstance(n, (ast.Assign, ast.Delete)) else [n.target]
            for t in targets:
                if isinstance(t, (ast.Subscript, ast.Attribute)) and isinstance(t.value, ast.Name) and t.value.id in names:
                    out.add(t.value.id)
    return out


def changed_globals(source: str) -> set[str]:
    """Module-level names of ``source`` that one of its functions mutates or rebinds."""
    tree = ast.parse(source)
    names: set[str] = set()
    for n in tree.body:
        targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AnnAssign) else []
        names.update(t.id for t in targets if isinstance(t, ast.Name))
    out: set[str] = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out |= _changed(fn, names)
    return out


def _all() -> set[str]:
    return {f"{f.relative_to(ROOT).as_posix()}::{n}" for f in sorted((ROOT / "tracekit").rglob("*.py"))
            for n in changed_globals(f.read_text())}


def test_runtime_globals_are_the_justified_ones() -> None:
    found = _all()
    new = sorted(found - JUSTIFIED)
    gone = sorted(JUSTIFIED - found)
    assert not new, ("module-level state changed at run time: pass an object instead, or justify it in "
                     "docs/architecture.md and JUSTIFIED\n" + "\n".join(new))
    assert not gone, "no longer changed at run time: remove from JUSTIFIED\n" + "\n".join(gone)


def test_the_scan_sees_each_way_of_changing() -> None:
    src = ("A = []\nB = {}\nC = None\nD = object()\nE = [1]\n"
           "def f():\n    A.append(1)\n    B['k'] = 2\n    global C\n    C = 3\n    D.x = 4\n    return E[0]\n")
    assert changed_globals(src) == {"A", "B", "C", "D"}
