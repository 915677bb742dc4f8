"""Loaded by ``tracekit capture -- PROGRAM`` through PYTHONPATH (nothing else imports it).

When ``TRACEKIT_CAPTURE_DIR`` is set, every Python process of the program (each
torchrun worker too, not the torchrun launcher) arms a post-import hook: once
the program has imported torch, :func:`tracekit.capture.program_hook.install`
runs (windows, step records, exports; see that module). Processes that never
import torch pay nothing beyond this file. A sitecustomize already on the path
is chained (run after this one).
"""

import os
import sys
import time
from typing import Any

_T0_NS = time.time_ns()
_HERE = os.path.dirname(os.path.abspath(__file__))


#: processes that run no step of the program: launchers and helper pools (multiprocessing's resource
#: tracker, inductor's compile workers); spawned multiprocessing workers are hooked (they may be ranks)
_SKIP = ("torch.distributed.run", "torchrun", "torch.distributed.launch", "multiprocessing.resource_tracker",
         "torch._inductor.compile_worker", "multiprocessing.forkserver")


def _launcher() -> bool:
    argv = " ".join(getattr(sys, "orig_argv", sys.argv) or [])
    return any(s in argv for s in _SKIP)


def _install_hook() -> None:
    try:
        try:
            import tracekit.capture.program_hook as hook
        except ImportError:
            extra = os.environ.get("TRACEKIT_PKG_PARENT")
            if not extra:
                raise
            sys.path.append(extra)
            import tracekit.capture.program_hook as hook
        hook.install(_T0_NS)
    except Exception as e:  # noqa: BLE001 - never break the program
        print(f"tracekit: capture hook not installed: {type(e).__name__}: {e}", file=sys.stderr)


def _arm() -> None:
    if not os.environ.get("TRACEKIT_CAPTURE_DIR") or _launcher():
        return
    if "torch" in sys.modules:
        _install_hook()
        return
    import importlib.abc

    class _Loader(importlib.abc.Loader):
        def __init__(self, inner: Any) -> None:
            self._inner = inner

        def create_module(self, spec: Any) -> Any:
            return self._inner.create_module(spec)

        def exec_module(self, module: Any) -> None:
            self._inner.exec_module(module)
            _install_hook()

    class _Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
            if fullname != "torch":
                return None
            sys.meta_path.remove(self)  # once
            for f in sys.meta_path:
                find = getattr(f, "find_spec", None)
                spec = find(fullname, path, target) if find else None
                if spec is not None:
                    if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                        spec.loader = _Loader(spec.loader)
                    return spec
            return None

    sys.meta_path.insert(0, _Finder())


def _chain() -> None:
    import importlib.machinery as _m
    import importlib.util as _u

    rest = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    spec = _m.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        mod = _u.module_from_spec(spec)
        spec.loader.exec_module(mod)


_arm()
try:
    _chain()
except Exception as _e:  # noqa: BLE001
    print(f"tracekit: chained sitecustomize failed: {type(_e).__name__}: {_e}", file=sys.stderr)
