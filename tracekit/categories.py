"""Kernel name -> (category, family), by ordered regex rules from a data file.

Rules live in ``schemas/categories_v1.json`` (``--rules FILE`` extends or
replaces them). The name pass runs once per *unique* name (a dictionary), so it
costs nothing per event. Context rules re-attribute ops launched inside CPU
ranges (e.g. GEMMs inside an ``experts`` range are MoE GEMMs); they are applied
by :func:`apply_context_rules` on a whole frame with vectorized joins.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import polars as pl

from tracekit._frames import NAME_CODE, attach, distinct_names

from tracekit._errors import InputError
from tracekit._resources import schema_file
from tracekit.enums import CATEGORIES

__all__ = ["Rule", "ContextRule", "RuleSet", "load_rules", "default_rules"]


@dataclass(frozen=True)
class Rule:
    id: str
    category: str
    regex: re.Pattern[str]


@dataclass(frozen=True)
class ContextRule:
    id: str
    category: str
    range_regex: re.Pattern[str]
    from_categories: tuple[str, ...]
    name_regex: re.Pattern[str] | None


@dataclass
class RuleSet:
    """Ordered name rules, a default, and context rules."""

    rules: list[Rule]
    default_id: str = "other"
    default_category: str = "other_compute"
    context: list[ContextRule] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    #: ``--steps-from REGEX``: ranges matching it are the steps (tracekit.steplabels); None = the built-in grammar
    steps_from: str | None = None
    _cache: dict[str, tuple[str, str]] = field(default_factory=dict, repr=False)

    def classify(self, name: str) -> tuple[str, str]:
        """(category, family) of one kernel/op name; first matching rule wins."""
        hit = self._cache.get(name)
        if hit is not None:
            return hit
        res = (self.default_category, self.default_id)
        for r in self.rules:
            if r.regex.search(name):
                res = (r.category, r.id)
                break
        self._cache[name] = res
        return res

    def classify_names(self, names: Iterable[str]) -> pl.DataFrame:
        """Frame ``name, category, family`` for unique names."""
        uniq = list(dict.fromkeys(n for n in names if n is not None))
        cats, fams = zip(*(self.classify(n) for n in uniq)) if uniq else ((), ())
        return pl.DataFrame(
            {"name": uniq, "category": list(cats), "family": list(fams)},
            schema={"name": pl.String, "category": pl.String, "family": pl.String},
        )

    def categorize(self, df: pl.DataFrame) -> pl.DataFrame:
        """Set ``category``/``family`` on GPU op rows (kernel, memcpy, memset) by name."""
        gpu = pl.col("kind").is_in(["kernel", "memcpy", "memset"])
        # rules run once per distinct name; rows find theirs by the name's dictionary code
        names = distinct_names(df, gpu)
        table = self.classify_names(names.get_column("name").to_list())
        table = names.join(table, on="name", how="left").select(
            "_code", pl.col("category").cast(pl.Categorical).alias("_c"), pl.col("family").cast(pl.Categorical).alias("_f")
        )
        # categorical throughout (no text column the length of the rank); non-GPU rows find nothing
        out = attach(df, table, "_code", key=pl.when(gpu).then(NAME_CODE))
        has = df.select(pl.col("category").is_not_null().any().alias("c"), pl.col("family").is_not_null().any().alias("f")).row(0)
        return out.with_columns(
            (pl.when(gpu).then(pl.col("_c")).otherwise(pl.col("category").cast(pl.Categorical)) if has[0] else pl.col("_c")).alias("category"),
            (pl.when(gpu).then(pl.col("_f")).otherwise(pl.col("family").cast(pl.Categorical)) if has[1] else pl.col("_f")).alias("family"),
        ).drop(["_c", "_f"])


def _compile(rx: str, where: str) -> re.Pattern[str]:
    try:
        return re.compile(rx)
    except (re.error, TypeError) as e:
        raise InputError(f"{where}: invalid regex {rx!r} ({e}); fix the rule") from None


def _parse(doc: dict[str, Any], where: str) -> tuple[list[Rule], list[ContextRule], dict[str, Any]]:
    if not isinstance(doc, dict) or "rules" not in doc or not isinstance(doc["rules"], list):
        raise InputError(f"{where}: a rules file is a JSON object with a 'rules' list; see schemas/categories_v1.json")
    rules = []
    for i, r in enumerate(doc["rules"]):
        if not isinstance(r, dict) or not {"id", "category", "regex"} <= set(r):
            raise InputError(f"{where}: rules[{i}] needs id, category and regex")
        if not all(isinstance(r[k], str) for k in ("id", "category", "regex")):
            raise InputError(f"{where}: rules[{i}]: id, category and regex must be text")
        if r["category"] not in CATEGORIES:
            raise InputError(f"{where}: rules[{i}] ({r['id']}): category {r['category']!r} is not one of {', '.join(CATEGORIES)}")
        rules.append(Rule(r["id"], r["category"], _compile(r["regex"], f"{where}: rules[{i}]")))
    ctx = []
    if not isinstance(doc.get("context", []) or [], list):
        raise InputError(f"{where}: 'context' must be a list; see schemas/categories_v1.json")
    if not isinstance(doc.get("default") or {}, dict):
        raise InputError(f"{where}: 'default' must be an object; see schemas/categories_v1.json")
    for i, r in enumerate(doc.get("context", []) or []):
        if not isinstance(r, dict) or not {"id", "category", "range_regex"} <= set(r):
            raise InputError(f"{where}: context[{i}] needs id, category and range_regex")
        if r.get("category") not in CATEGORIES:
            raise InputError(f"{where}: context[{i}]: category {r.get('category')!r} is not one of {', '.join(CATEGORIES)}")
        ctx.append(
            ContextRule(
                r["id"],
                r["category"],
                _compile(r["range_regex"], f"{where}: context[{i}]"),
                tuple(r.get("from_categories") or CATEGORIES),
                _compile(r["name_regex"], f"{where}: context[{i}]") if r.get("name_regex") else None,
            )
        )
    return rules, ctx, doc.get("default") or {}


def _mapping(data: Any, path: Path) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise InputError(f"{path}: a rules file is a JSON object with a 'rules' list; see schemas/categories_v1.json")
    return data


def _load_doc(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise InputError(f"{path}: cannot read rules file ({e.strerror}); check the path") from None
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: rules file is not UTF-8 text (byte {e.start}); write the rules as JSON or YAML text") from None
    if path.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise InputError(f"{path}: YAML rules need PyYAML (pip install pyyaml), or write the rules as JSON") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
            what = " ".join(str(getattr(e, "problem", None) or e).split())[:200]
            raise InputError(f"{path}: invalid YAML ({where}{what}); fix the rules file "
                             "(format: schemas/categories_v1.json)") from None
        if isinstance(data, list):  # bare list of rules, as in kernel_families.md
            data = {"rules": data}
        return _mapping(data, path)
    try:
        return _mapping(json.loads(text), path)
    except ValueError as e:
        raise InputError(f"{path}: not valid JSON ({e}); see schemas/categories_v1.json for the format") from None


@functools.cache
def default_rules() -> RuleSet:
    """The shipped rules (read once per process)."""
    p = schema_file("categories_v1.json")
    rules, ctx, dflt = _parse(_load_doc(p), str(p))
    return RuleSet(rules, dflt.get("id", "other"), dflt.get("category", "other_compute"), ctx, [str(p)])


def load_rules(path: str | Path | None = None, *, replace: bool = False) -> RuleSet:
    """Default rules, optionally extended (user rules first) or replaced by ``path``."""
    base = default_rules()
    if path is None:
        return base
    p = Path(path)
    doc = _load_doc(p)
    rules, ctx, dflt = _parse(doc, str(p))
    replace = replace or bool(doc.get("replace", False))
    if replace:
        return RuleSet(rules, dflt.get("id", "other"), dflt.get("category", "other_compute"), ctx, [str(p)])
    return RuleSet(
        rules + base.rules, base.default_id, base.default_category, ctx + base.context, [str(p)] + base.sources
    )
