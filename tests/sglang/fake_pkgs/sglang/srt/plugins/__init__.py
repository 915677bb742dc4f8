"""Fake ``sglang.srt.plugins``: entry-point discovery then ``HookRegistry.apply_hooks()``.

Mirrors the documented behaviour of SGLang 0.5.23 (group ``sglang.srt.plugins``, optional
``SGLANG_PLUGINS`` whitelist, one load per process); written for tests, not copied.
"""

from __future__ import annotations

import os
from importlib.metadata import entry_points

from sglang.srt.plugins.hook_registry import HookRegistry

GENERAL_PLUGINS_GROUP = "sglang.srt.plugins"
_loaded = False


def load_plugins() -> list[str]:
    global _loaded
    if _loaded:
        return []
    _loaded = True
    allowed = {x.strip() for x in os.environ.get("SGLANG_PLUGINS", "").split(",") if x.strip()} or None
    ran = []
    for ep in entry_points(group=GENERAL_PLUGINS_GROUP):
        if allowed is not None and ep.name not in allowed:
            continue
        ep.load()()
        ran.append(ep.name)
    HookRegistry.apply_hooks()
    return ran


def _reset_for_tests() -> None:
    global _loaded
    _loaded = False
    HookRegistry.reset()
