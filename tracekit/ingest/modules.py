"""Module context from a stack trace: ``nn.Module: <Class>_<n>`` ranges become ``tk.mod[<role> <Class>]`` ranges.

A ``torch.profiler`` trace made with ``with_stack=True`` / ``with_modules=True`` records one ``python_function``
range per module call (kept by the Kineto reader as ``range`` rows). The modules that decide a category (routers,
experts, MoE blocks, attention: :mod:`tracekit.modroles`) are renamed to the ranges ``tracekit capture
--module-context`` records, so that the same context rules (``schemas/categories_v1.json``) read both. The module
tree adds what class names alone miss: a module that directly holds a router or experts is the MoE block
(``GptOssMLP``, ``Llama4TextMoe``, ``DbrxFFN``), a ``…Gate`` child of an MoE block its router, and an ``…MLP`` or
``…Norm`` directly inside an MoE block keeps its own categories (roles ``mlp``, ``norm``: a shared expert is dense
like any MLP). The other module ranges are dropped. Vectorized: regexes run on the distinct names; parents come from :func:`~tracekit.core.intervals.covered_by`
(innermost enclosing module range on the same thread), one call per child class.
"""

from __future__ import annotations

import re

import polars as pl

from tracekit.core.intervals import covered_by
from tracekit.modroles import INNER_ROLES, class_role, moe_block_roles, range_name

__all__ = ["MODULE_RANGE_PREFIX", "module_ranges"]

MODULE_RANGE_PREFIX = "nn.Module: "
_CLASS = re.compile(r"^nn\.Module: (?P<cls>[A-Za-z0-9_]+?)(_\d+)?$")


def _classes(df: pl.DataFrame) -> pl.DataFrame:
    """Module range rows: ``_row``, ``tid``, ``start``, ``end``, ``_cls``."""
    is_mod = (pl.col("kind") == "range") & pl.col("name").cast(pl.String).str.starts_with(MODULE_RANGE_PREFIX)
    mods = df.lazy().with_row_index("_row").filter(is_mod).select(
        "_row", "tid", pl.col("ts_ns").alias("start"), (pl.col("ts_ns") + pl.col("dur_ns")).alias("end"),
        pl.col("name").cast(pl.String).alias("_n")).collect()
    names = mods.get_column("_n").unique().to_list()
    cls = {n: (m.group("cls") if (m := _CLASS.match(n)) else n[len(MODULE_RANGE_PREFIX):]) for n in names}
    return mods.with_columns(pl.col("_n").replace_strict(cls, return_dtype=pl.String).alias("_cls")).drop("_n")


def _parents(mods: pl.DataFrame, children: list[str]) -> dict[str, set[str]]:
    """Class -> classes of the innermost module range enclosing its calls' starts, for the ``children`` classes."""
    out: dict[str, set[str]] = {}
    for c in children:
        pts = mods.filter(pl.col("_cls") == c).select("tid", pl.col("start").alias("ts"))
        iv = mods.filter(pl.col("_cls") != c)
        hit = covered_by(pts, iv, by="tid", at="ts", payload=["_cls"], keep_order=False)
        out[c] = {p for p in hit.get_column("_cls").unique().to_list() if p is not None}
    return out


def _roles(mods: pl.DataFrame) -> dict[str, str]:
    """Class -> role for the classes present (names, then the module tree)."""
    classes = mods.get_column("_cls").unique().to_list()
    roles = {c: r for c in classes if (r := class_role(c)) is not None}
    inner = {c: r for c in classes for r, rx in INNER_ROLES if c not in roles and rx.search(c)}
    asks = [c for c in classes if roles.get(c) in ("router", "experts") or re.search(r"Gate$", c) or c in inner]
    parent_of = _parents(mods, asks)
    roles.update(moe_block_roles(parent_of))
    for c, r in inner.items():  # a shared expert's MLP, a norm: directly inside an MoE block, they keep their own
        if c not in roles and any(roles.get(p) == "moe" for p in parent_of.get(c, ())):
            roles[c] = r
    return roles


def module_ranges(df: pl.DataFrame) -> pl.DataFrame:
    """Rename the role-bearing ``nn.Module`` ranges of a stack trace to ``tk.mod[...]`` and drop the others; one rank."""
    if "tid" not in df.columns:
        return df
    mods = _classes(df)
    if mods.height == 0:
        return df
    roles = _roles(mods)
    names = {c: range_name(r, c) for c, r in roles.items()}
    keep = mods.filter(pl.col("_cls").is_in(list(names))).select(
        "_row", pl.col("_cls").replace_strict(names, return_dtype=pl.String).alias("_tk"))
    drop = mods.filter(~pl.col("_cls").is_in(list(names))).select("_row")
    d = df.with_row_index("_row")
    d = d.join(drop, on="_row", how="anti") if drop.height else d
    d = d.join(keep, on="_row", how="left", maintain_order="left")
    return d.with_columns(pl.coalesce(pl.col("_tk"), pl.col("name").cast(pl.String)).cast(pl.Categorical).alias("name")).drop(
        ["_row", "_tk"])
