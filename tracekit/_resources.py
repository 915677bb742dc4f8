"""Locate data files shipped from ``schemas/`` (repo checkout or installed wheel)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["schema_file"]

_PKG = Path(__file__).resolve().parent


def schema_file(name: str) -> Path:
    """Path of ``schemas/<name>``: ``tracekit/_schemas`` in a wheel, ``../schemas`` in a checkout."""
    for base in (_PKG / "_schemas", _PKG.parent / "schemas"):
        p = base / name
        if p.exists():
            return p
    raise FileNotFoundError(f"schemas/{name} not found next to the tracekit package; reinstall tracekit")
