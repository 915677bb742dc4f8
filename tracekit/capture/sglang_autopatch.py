"""Import-hook fallback for SGLang without the plugin system (<= 0.5.10).

:func:`install` puts a ``sys.meta_path`` finder in front that, when
``sglang.srt.model_executor.model_runner`` is imported, lets the real loader run and then wraps
``ModelRunner.forward`` with :func:`tracekit.capture.sglang_plugin.forward_hook` (the same hook
the plugin registers). If the module is already imported it is patched at once. The patch is
idempotent and coexists with the plugin path (the hook passes through when nested).

:func:`write_bootstrap` writes a directory holding a ``sitecustomize.py`` that calls
:func:`install` when ``TRACEKIT_SGLANG_HOOK=1`` and then chains to any other ``sitecustomize`` on
the path. ``tracekit launch`` puts that directory first on ``PYTHONPATH``; SGLang spawns its
scheduler ranks with the ``spawn`` start method, so every rank is a fresh interpreter that runs
``sitecustomize`` and installs the hook.

Standard library only at import time.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Sequence

__all__ = ["MODULE", "install", "uninstall", "patch_module", "write_bootstrap", "is_patched"]

MODULE = "sglang.srt.model_executor.model_runner"
_MARK = "__tracekit_forward_hook__"


def is_patched(module: ModuleType) -> bool:
    """True when ``module.ModelRunner.forward`` already carries tracekit's wrapper."""
    cls = getattr(module, "ModelRunner", None)
    fn = getattr(cls, "__dict__", {}).get("forward") if cls is not None else None
    return bool(getattr(fn, _MARK, False))


def patch_module(module: ModuleType) -> bool:
    """Wrap ``module.ModelRunner.forward`` once; returns True when it patched now."""
    from tracekit.capture.sglang_plugin import forward_hook

    cls = getattr(module, "ModelRunner", None)
    if cls is None or is_patched(module):
        return False
    original = cls.__dict__.get("forward")
    if original is None:
        return False

    @functools.wraps(original)
    def forward(*args: Any, **kwargs: Any) -> Any:
        return forward_hook(original, *args, **kwargs)

    setattr(forward, _MARK, True)
    cls.forward = forward
    return True


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader) -> None:
        self._inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        try:
            patch_module(module)
        except Exception as e:  # noqa: BLE001 - never break the server's import
            print(f"tracekit: could not hook ModelRunner.forward ({type(e).__name__}: {e})", file=sys.stderr)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself; for :data:`MODULE` it wraps the spec the other finders return."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self or isinstance(finder, _PostImportFinder):
                continue
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec: importlib.machinery.ModuleSpec | None = find(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchingLoader(spec.loader)
                return spec
        return None


def install() -> str:
    """Install the post-import hook; returns "patched" (module already loaded) or "armed"."""
    mod = sys.modules.get(MODULE)
    if mod is not None:
        patch_module(mod)
        return "patched"
    if not any(isinstance(f, _PostImportFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _PostImportFinder())
    return "armed"


def uninstall() -> None:
    """Remove the finder (tests). Already-patched classes stay patched."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _PostImportFinder)]


_SITECUSTOMIZE = '''\
"""Written by tracekit launch: hooks SGLang's ModelRunner.forward in every process (gated)."""
import os as _os
import sys as _sys

_here = _os.path.dirname(_os.path.abspath(__file__))
if _os.environ.get("TRACEKIT_SGLANG_HOOK") == "1":
    try:
        try:
            import tracekit.capture.sglang_autopatch as _tk
        except ImportError:
            _sys.path.append({pkg_parent!r})
            import tracekit.capture.sglang_autopatch as _tk
        _tk.install()
    except Exception as _e:  # never break the program being launched
        print("tracekit: import hook not installed: %s: %s" % (type(_e).__name__, _e), file=_sys.stderr)


def _chain():
    import importlib.machinery as _m
    import importlib.util as _u
    rest = [p for p in _sys.path if _os.path.abspath(p or ".") != _here]
    spec = _m.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        mod = _u.module_from_spec(spec)
        spec.loader.exec_module(mod)


try:
    _chain()
except Exception as _e:
    print("tracekit: chained sitecustomize failed: %s: %s" % (type(_e).__name__, _e), file=_sys.stderr)
'''


def write_bootstrap(directory: str | Path) -> Path:
    """Write ``<directory>/sitecustomize.py`` (see module doc); returns the directory."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    pkg_parent = str(Path(__file__).resolve().parents[2])
    (d / "sitecustomize.py").write_text(_SITECUSTOMIZE.format(pkg_parent=pkg_parent), encoding="utf-8")
    return d
