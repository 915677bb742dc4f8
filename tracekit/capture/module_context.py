"""Cheap module context: one ``record_function`` range per forward of the nn.Modules that matter.

Categories need the launching module to tell a loop-MoE expert GEMM from a dense one; ``with_stack``
gives it but costs a Python frame record per call. This adds a range only around modules whose class
name marks a role (experts, router, MoE block, attention), named ``tk.mod[<role> <Class>]``, e.g.
``tk.mod[experts Qwen3MoeExperts]``, ``tk.mod[router GlmMoeDsaTopkRouter]``,
``tk.mod[moe OlmoeSparseMoeBlock]``, ``tk.mod[attention Qwen3MoeAttention]``. The context rules of
``schemas/categories_v1.json`` (``ctx.moe_experts``, ``ctx.moe_router``, ``ctx.moe_block``,
``ctx.attention``) read these ranges at convert time.

Cost: per-instance hooks only on the matching modules (a few per layer); no global module hook stays
installed (a global hook would put every module call on PyTorch's slow path). :func:`install` with a
model hooks it directly; without one it arms a one-shot global pre-hook that hooks the first model
that runs a forward, then removes itself. Overhead measured by ``benchmarks/module_context_overhead.py``.

Capture wiring (for ``tracekit capture``): call ``install()`` in the profiled process before the model
runs, e.g. from the capture boot (``tracekit/capture/_boot/sitecustomize.py``) when
``TRACEKIT_MODULE_CONTEXT`` is not ``0``; ``uninstall()`` removes every hook.
"""

from __future__ import annotations

from typing import Any

from tracekit.modroles import ROLES, class_role, moe_block_roles
from tracekit.modroles import range_name as _range_name

__all__ = ["ROLES", "install", "range_name", "role_of", "uninstall"]

_state: dict[str, Any] = {"handles": [], "global": None, "cache": {}, "hooked": set(), "extra": {}}


def role_of(cls: type) -> str | None:
    """Role of a module class by its name (cached per class), None when it has none."""
    cache: dict[type, str | None] = _state["cache"]
    if cls in cache:
        return cache[cls]
    role = _state["extra"].get(cls.__name__) or class_role(cls.__name__)
    cache[cls] = role
    return role


def range_name(module: Any) -> str | None:
    role = role_of(type(module))
    return None if role is None else _range_name(role, type(module).__name__)


def _hook_module(m: Any) -> None:
    import torch

    name = range_name(m)
    if name is None or id(m) in _state["hooked"]:
        return
    stack: list[Any] = []
    enabled = torch._C._autograd._profiler_enabled
    enter = torch.ops.profiler._record_function_enter_new
    leave = torch.ops.profiler._record_function_exit._RecordFunction

    def pre(_mod: Any, _args: Any) -> None:
        # no profiler running: nothing to record (one C call), so an idle process pays ~1 us per hooked call
        stack.append(enter(name, None) if enabled() else None)

    def post(_mod: Any, _args: Any, _out: Any) -> None:
        if stack:
            h = stack.pop()
            if h is not None:
                leave(h)

    _state["handles"].append(m.register_forward_pre_hook(pre))
    _state["handles"].append(m.register_forward_hook(post, always_call=True))
    _state["hooked"].add(id(m))


def _tree_roles(root: Any) -> None:
    """Roles the module tree gives (an MoE block by the router or experts it holds: :func:`moe_block_roles`)."""
    parent_of: dict[str, set[str]] = {}
    for m in root.modules():
        for c in m.children():
            parent_of.setdefault(type(c).__name__, set()).add(type(m).__name__)
    _state["extra"].update(moe_block_roles(parent_of))
    _state["cache"].clear()


def install(model: Any | None = None) -> int:
    """Hook ``model``'s matching submodules; without a model, the first model that runs a forward.

    Returns the number of modules hooked now (0 when armed for the first forward)."""
    import torch

    if model is not None:
        before = len(_state["handles"])
        _tree_roles(model)
        for m in model.modules():
            _hook_module(m)
        return (len(_state["handles"]) - before) // 2
    if _state["global"] is None:
        def first(mod: Any, _args: Any) -> None:
            h = _state["global"]
            _state["global"] = None
            if h is not None:
                h.remove()
            _tree_roles(mod)
            for m in mod.modules():  # submodules run after this hook: their ranges open on this forward
                _hook_module(m)

        _state["global"] = torch.nn.modules.module.register_module_forward_pre_hook(first)
    return 0


def uninstall() -> None:
    """Remove every hook this module added."""
    for h in _state["handles"]:
        h.remove()
    _state["handles"].clear()
    _state["hooked"].clear()
    if _state["global"] is not None:
        _state["global"].remove()
        _state["global"] = None
