"""Plain-text number formatting shared by the diff reporters (terminal and HTML)."""

from __future__ import annotations

from typing import Any

__all__ = ["num", "ms"]


def num(v: Any, digits: int = 3) -> str:
    """``—`` for None, thousands-separated fixed digits for floats, ``str`` otherwise."""
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return str(v)


def ms(ns: float | None) -> str:
    """Nanoseconds as milliseconds with three decimals, ``—`` for None."""
    return "—" if ns is None else f"{ns / 1e6:,.3f}"
