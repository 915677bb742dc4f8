"""Module roles: which ``nn.Module`` classes decide a GPU op's category, by their class name (standard library only).

One table for both sources of module context: ``tracekit capture --module-context`` (ranges
``tk.mod[<role> <Class>]`` around the forwards of these modules, :mod:`tracekit.capture.module_context`) and a
``with_stack``/``with_modules`` torch.profiler trace (its ``nn.Module: <Class>_<n>`` ranges, read by
:mod:`tracekit.ingest.modules`). The context rules of ``schemas/categories_v1.json`` read the ``tk.mod[...]``
names. Roles, first match wins (``...MoeAttention`` is attention, ``...MoeExperts`` experts, ``...SparseMoeBlock``
the MoE block):

* ``router``: ``…Router``, ``…TopK``, ``…Gate`` of an MoE (``…MoeGate``; a bare ``…Gate`` is a router only as the
  child of an MoE block, see :func:`moe_block_roles`);
* ``experts``: ``…Experts``, ``FusedMoE``;
* ``attention``: ``…Attention``, ``…Attn``, ``…Indexer`` (the DSA indexer);
* ``moe``: ``…SparseMoeBlock``, ``…MoE``, ``…MoeLayer``, and any module that directly holds a router or an experts
  module whatever its name (``GptOssMLP``, ``Llama4TextMoe``, ``DbrxFFN``);
* ``mlp``: ``…MLP`` directly inside an MoE block (a shared expert: dense, like any MLP) and ``norm``: ``…Norm``
  directly inside an MoE block (vLLM's ``MLPBlock`` holds its RMSNorm): their kernels keep their own categories;
  stack traces only (:data:`INNER_ROLES`).
"""

from __future__ import annotations

import re

__all__ = ["ROLES", "INNER_ROLES", "class_role", "moe_block_roles", "range_name"]

ROLES: list[tuple[str, re.Pattern[str]]] = [
    ("router", re.compile(r"(Router|TopK|Topk|MoeGate|MoEGate)$")),
    ("experts", re.compile(r"(Experts|FusedMoE|MoeExperts|ExpertsGroup)$")),
    ("attention", re.compile(r"(Attention|Attn|Indexer)$")),
    ("moe", re.compile(r"(SparseMoeBlock|MoeBlock|MoE|MoELayer|MoeLayer)$")),
]
#: modules that keep their own context when an MoE block holds them (a shared expert's MLP, a norm)
INNER_ROLES: list[tuple[str, re.Pattern[str]]] = [
    ("mlp", re.compile(r"(MLP|Mlp)$")),
    ("norm", re.compile(r"(Norm|RMSNorm|LayerNorm)$")),
]
_CHILD_ROUTER = re.compile(r"Gate$")


def class_role(name: str) -> str | None:
    """Role of a module class by its name (:data:`ROLES`), None when it has none."""
    return next((r for r, rx in ROLES if rx.search(name)), None)


def moe_block_roles(parent_of: dict[str, set[str]]) -> dict[str, str]:
    """Roles found from the module tree: ``parent_of`` maps a class name to the class names of its direct parents.

    A module holding a router or an experts module is an MoE block; a ``…Gate`` child of an MoE block is its router
    (``HunYuanMoEV1Gate``). Returns class name -> role for the classes this adds."""
    out: dict[str, str] = {}
    for child, parents in parent_of.items():
        if class_role(child) in ("router", "experts"):
            for p in parents:
                if class_role(p) is None:
                    out[p] = "moe"
    for child, parents in parent_of.items():
        if class_role(child) is None and _CHILD_ROUTER.search(child) and any(
                class_role(p) == "moe" or out.get(p) == "moe" for p in parents):
            out[child] = "router"
    return out


def range_name(role: str, cls: str) -> str:
    """The range name of a module with a role: ``tk.mod[<role> <Class>]``."""
    return f"tk.mod[{role} {cls}]"
