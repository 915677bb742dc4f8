"""Fake ``sglang.srt.plugins.hook_registry`` with SGLang 0.5.23's public API.

``HookRegistry.register(target, hook, hook_type=HookType.AFTER)``, ``apply_hooks()``, ``reset()``,
``HookType.{BEFORE,AFTER,AROUND,REPLACE}``, ``plugin_hook(target, type=...)``. AROUND hooks are
called as ``hook(original_fn, *args, **kwargs)``; the patch is a ``setattr`` on the owner.
A minimal test double written from the documented contract.
"""

from __future__ import annotations

import functools
import pkgutil
from collections import defaultdict
from enum import Enum
from typing import Any, Callable


class HookType(Enum):
    BEFORE = "before"
    AFTER = "after"
    AROUND = "around"
    REPLACE = "replace"


def _wrap(original: Callable[..., Any], hook: Callable[..., Any], kind: HookType) -> Callable[..., Any]:
    if kind is HookType.AROUND:
        def w(*a: Any, **k: Any) -> Any:
            return hook(original, *a, **k)
    elif kind is HookType.BEFORE:
        def w(*a: Any, **k: Any) -> Any:
            r = hook(*a, **k)
            if r is not None:
                a, k = r
            return original(*a, **k)
    elif kind is HookType.AFTER:
        def w(*a: Any, **k: Any) -> Any:
            res = original(*a, **k)
            new = hook(res, *a, **k)
            return res if new is None else new
    else:
        def w(*a: Any, **k: Any) -> Any:
            return hook(*a, **k)
    functools.update_wrapper(w, original)
    return w


class HookRegistry:
    _hooks: dict[str, list[tuple[HookType, Callable[..., Any]]]] = defaultdict(list)
    _patched: set[str] = set()

    @classmethod
    def register(cls, target: str, hook: Callable[..., Any], hook_type: HookType = HookType.AFTER, *, source: Any = None) -> None:
        if isinstance(hook, type) and hook_type is not HookType.REPLACE:
            raise TypeError("classes only with REPLACE")
        cls._hooks[target].append((hook_type, hook))

    @classmethod
    def apply_hooks(cls) -> None:
        for target, hooks in cls._hooks.items():
            if target in cls._patched:
                continue
            owner_path, attr = target.rsplit(".", 1)
            owner = pkgutil.resolve_name(owner_path)
            fn = getattr(owner, attr)
            for kind, hook in hooks:
                fn = _wrap(fn, hook, kind)
            setattr(owner, attr, fn)
            cls._patched.add(target)

    @classmethod
    def reset(cls) -> None:
        cls._hooks.clear()
        cls._patched.clear()


def plugin_hook(target: str, type: HookType = HookType.AFTER) -> Callable[[Any], Any]:  # noqa: A002 - SGLang's name
    def deco(fn: Any) -> Any:
        HookRegistry.register(target, fn, type)
        return fn

    return deco
