"""Global state: the environment is read and set only in tracekit/_env.py; a missing optional dependency is one
line naming the extra to install (tracekit._errors.require)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tracekit import _env
from tracekit._errors import MissingDependency, UsageError, require

PKG = Path(__file__).resolve().parents[2] / "tracekit"
#: runs in every interpreter of a captured program before tracekit is importable: it reads TRACEKIT_PKG_PARENT to
#: find tracekit and TRACEKIT_CAPTURE_DIR to decide whether to import it at all
BOOT = PKG / "capture" / "_boot" / "sitecustomize.py"


def environment_uses(source: str) -> list[int]:
    """Lines that touch the environment: ``os.environ``, ``os.getenv``/``putenv``/``unsetenv``, ``from os import environ``."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "environb", "getenv", "putenv", "unsetenv") and not (
                isinstance(node.value, ast.Name) and node.value.id == "_env"):
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "os" and any(
                a.name in ("environ", "getenv", "putenv") for a in node.names):
            lines.append(node.lineno)
    return sorted(lines)


def test_environment_only_in_env_module() -> None:
    bad = [f"{f.relative_to(PKG.parent)}:{n}" for f in sorted(PKG.rglob("*.py")) if f not in (PKG / "_env.py", BOOT)
           for n in environment_uses(f.read_text())]
    assert not bad, "read or set environment variables through tracekit._env:\n" + "\n".join(bad)


def test_the_check_sees_environment_reads() -> None:
    src = "import os\nfrom os import getenv\na = os.environ.get('X')\nb = __import__('os').environ\nos.putenv('A', 'b')\n"
    assert environment_uses(src) == [2, 3, 4, 5]
    assert environment_uses((PKG / "_env.py").read_text())  # and the module that owns them does


def test_accessors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEKIT_X_TEST", "1")
    assert _env.flag("TRACEKIT_X_TEST") and _env.is_set("TRACEKIT_X_TEST") and _env.int_value("TRACEKIT_X_TEST") == 1
    monkeypatch.setenv("TRACEKIT_X_TEST", "yes")
    assert not _env.flag("TRACEKIT_X_TEST") and _env.int_value("TRACEKIT_X_TEST") is None
    assert _env.positive_int("TRACEKIT_X_TEST") is None
    monkeypatch.delenv("TRACEKIT_X_TEST")
    assert _env.get("TRACEKIT_X_TEST") is None and not _env.is_set("TRACEKIT_X_TEST")
    _env.set_default("TRACEKIT_X_TEST", "a")
    _env.set_default("TRACEKIT_X_TEST", "b")  # the first (the user's) value wins
    assert _env.get("TRACEKIT_X_TEST") == "a" and _env.environ()["TRACEKIT_X_TEST"] == "a"
    monkeypatch.delenv("TRACEKIT_X_TEST")


def test_missing_dependency_names_the_extra() -> None:
    with pytest.raises(MissingDependency) as e:
        require("tracekit_no_such_package.sub", "capture", "the built-in capture workload")
    assert str(e.value) == ("the built-in capture workload needs tracekit_no_such_package, which is not installed: "
                            "pip install 'tracekit[capture]'")
    assert isinstance(e.value, UsageError) and "\n" not in str(e.value)
    assert require("json", "x", "y").dumps([1]) == "[1]"
    with pytest.raises(ModuleNotFoundError):  # a module missing inside an installed package is a bug, not a missing extra
        require("tracekit.no_such_module", "capture", "x")
