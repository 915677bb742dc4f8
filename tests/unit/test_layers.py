"""The layers of tracekit point one way (docs/architecture.md, "Layers").

Every ``import`` of a tracekit module in ``tracekit/`` — at module level, inside a function or under
``TYPE_CHECKING`` — is an edge from the importing module's layer to the imported one's. An edge is allowed
when the target layer is the source's own or one the source stands on (:data:`BELOW`, transitively).
Read from the source with :mod:`ast` (nothing is imported), so the test is cheap and sees lazy imports too.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "tracekit"

#: module prefix -> layer (the longest matching prefix wins)
LAYER_OF = {
    "tracekit": "contract",  # the package itself, its top-level modules: schema, errors, env, dtypes, categories, ...
    "tracekit.workloads": "workloads",
    "tracekit.core": "core",
    "tracekit.ingest": "ingest",
    "tracekit.capture": "capture",
    "tracekit.analysis": "analysis.base",  # the package, findings, plan
    "tracekit.analysis.registry": "analysis.registry",
    "tracekit.analysis.passes": "analysis.passes",
    "tracekit.analysis.result": "analysis.result",
    "tracekit.analysis.stage": "analysis.stage",
    "tracekit.replay": "replay",
    "tracekit.compare": "compare",
    "tracekit.advice": "advice",
    "tracekit.api": "api",
    "tracekit.cluster": "cluster",
    "tracekit.report": "report",
    "tracekit.commands": "commands",
    "tracekit.cli": "cli",
}

#: layer -> the layers it stands on directly (it may import those and, transitively, what they stand on)
BELOW: dict[str, tuple[str, ...]] = {
    "contract": (),
    "workloads": (),  # the built-in workload imports nothing of tracekit (it runs in the capture's rank processes)
    "core": ("contract",),
    "ingest": ("core",),
    "capture": ("ingest", "workloads"),
    "analysis.base": ("core",),
    "analysis.registry": ("analysis.base",),
    "analysis.passes": ("analysis.registry",),
    "analysis.result": ("analysis.passes",),
    "analysis.stage": ("analysis.result",),
    "replay": ("analysis.stage",),
    "compare": ("analysis.stage",),
    "advice": ("replay",),
    "api": ("ingest", "advice"),
    "report": ("compare", "replay"),
    "cluster": ("api",),  # per-rank tasks on Dask: drives convert and the analysis stages
    "commands": ("api", "report", "capture", "cluster"),
    "cli": ("commands",),
}

#: the one upward edge by design: the registry discovers the passes (``registry.analyses()`` imports every module of
#: ``tracekit.analysis.passes`` once, as plug-ins), so that a new analysis is one new module and no list names it
DISCOVERY = {("tracekit.analysis.registry", "tracekit.analysis.passes")}


def layer_of(module: str) -> str:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        hit = LAYER_OF.get(".".join(parts[:n]))
        if hit is not None:
            return hit
    raise AssertionError(f"{module}: no layer; add its package to LAYER_OF")


@cache
def allowed(layer: str) -> frozenset[str]:
    """``layer`` and every layer it stands on."""
    out = {layer}
    for b in BELOW[layer]:
        out |= allowed(b)
    return frozenset(out)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _target(node: ast.ImportFrom, module: str, is_pkg: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_pkg else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(module: str, source: str, is_pkg: bool = False) -> list[tuple[str, int]]:
    """Every tracekit module that ``source`` (module ``module``) imports, with its line (``from a import b`` names
    ``a.b`` when ``b`` is a module)."""
    out: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(source, module)):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names if a.name.split(".")[0] == "tracekit"]
        elif isinstance(node, ast.ImportFrom):
            tgt = _target(node, module, is_pkg)
            if tgt.split(".")[0] != "tracekit":
                continue
            for a in node.names:
                sub = f"{tgt}.{a.name}"
                is_mod = (ROOT / (sub.replace(".", "/") + ".py")).exists() or (ROOT / sub.replace(".", "/")).is_dir()
                out.append((sub if is_mod else tgt, node.lineno))
    return out


def back_edges(module: str, source: str, is_pkg: bool = False) -> list[str]:
    """The imports of ``source`` (module ``module``) that point to a layer it does not stand on."""
    src = layer_of(module)
    return [f"{module}:{line}: {src} imports {tgt} ({layer_of(tgt)})"
            for tgt, line in imports(module, source, is_pkg) if layer_of(tgt) not in allowed(src) and (module, tgt) not in DISCOVERY]


def test_every_layer_is_declared() -> None:
    assert set(LAYER_OF.values()) == set(BELOW)
    for layer, below in BELOW.items():
        assert set(below) <= set(BELOW), layer
    # no layer stands on itself through others (the declared order is a DAG)
    for layer in BELOW:
        assert all(layer not in allowed(b) for b in BELOW[layer]), f"{layer} is part of a cycle"


def test_no_import_points_up() -> None:
    files = sorted(PKG.rglob("*.py"))
    assert len(files) > 100
    bad = [e for f in files for e in back_edges(module_name(f), f.read_text(), f.name == "__init__.py")]
    assert not bad, "imports against the layer order (docs/architecture.md, Layers):\n" + "\n".join(bad)


def test_the_check_sees_a_back_edge() -> None:
    """The check itself: an upward import under TYPE_CHECKING, and a relative one inside a function, are both found;
    a downward one is not."""
    src = ("from typing import TYPE_CHECKING\nfrom tracekit.schema import conform\nif TYPE_CHECKING:\n"
           "    from tracekit.analysis.result import AnalysisResult\ndef g():\n    from ..report import terminal\n")
    bad = back_edges("tracekit.core.probe", src)
    assert len(bad) == 2, bad
    assert "core imports tracekit.analysis.result (analysis.result)" in bad[0] and "tracekit.report.terminal (report)" in bad[1]


@pytest.mark.parametrize("module,layer", [("tracekit.schema", "contract"), ("tracekit.core.intervals", "core"),
                                          ("tracekit.analysis.passes.gaps", "analysis.passes"),
                                          ("tracekit.analysis.findings", "analysis.base"), ("tracekit.cli", "cli")])
def test_layer_of(module: str, layer: str) -> None:
    assert layer_of(module) == layer


def test_no_import_cycles() -> None:
    """No module reaches itself through imports, inside a layer too (lazy imports included: a cycle hidden in a
    function is still two modules that each need the other)."""
    graph = {module_name(f): {t for t, _ in imports(module_name(f), f.read_text(), f.name == "__init__.py")}
             for f in sorted(PKG.rglob("*.py"))}
    done: set[str] = set()

    def visit(m: str, path: list[str]) -> None:
        if m in path:
            raise AssertionError("import cycle: " + " -> ".join(path[path.index(m):] + [m]))
        if m in done or m not in graph:
            return
        for t in sorted(graph[m] - {m}):
            visit(t, path + [m])
        done.add(m)

    for m in sorted(graph):
        visit(m, [])
