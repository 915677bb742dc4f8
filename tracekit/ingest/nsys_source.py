"""Table access for Nsight Systems exports: ``.sqlite`` files and ``parquetdir`` directories.

Both formats hold the same tables with the same column names; this module hides
the difference. :meth:`NsysSource.read` returns a polars frame with only the
requested columns that exist (schemas 3.20 .. 3.25 differ in columns; select by
presence), integer columns as ``Int64`` (unsigned Parquet columns reinterpreted)
and text as ``String``. A table that does not exist reads as ``None`` — nsys
creates tables lazily, so absence means "no events", never an error.

SQLite rows are fetched in chunks (``fetchmany``) and turned into columnar
frames chunk by chunk, so memory stays at the size of the result plus one chunk.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Sequence

import polars as pl

from tracekit._errors import InputError

__all__ = ["NsysSource", "open_source", "is_nsys_path", "SESSION_TABLE"]

SESSION_TABLE = "TARGET_INFO_SESSION_START_TIME"
_CHUNK_ROWS = 500_000


def is_nsys_path(path: str | Path) -> bool:
    """True for a ``.sqlite`` file or a directory holding ``TARGET_INFO_SESSION_START_TIME.parquet``."""
    p = Path(path)
    if p.is_dir():
        return (p / f"{SESSION_TABLE}.parquet").exists()
    return p.suffix.lower() in (".sqlite", ".sqlite3", ".db") and p.is_file()


def _normalize(df: pl.DataFrame) -> pl.DataFrame:
    exprs = []
    for name, dt in df.schema.items():
        if dt == pl.UInt64:
            exprs.append(pl.col(name).reinterpret(signed=True).alias(name))
        elif dt.is_integer() and dt != pl.Int64:
            exprs.append(pl.col(name).cast(pl.Int64).alias(name))
        elif dt in (pl.String, pl.Float64, pl.Int64):
            exprs.append(pl.col(name))
        elif dt == pl.Null:
            exprs.append(pl.col(name).cast(pl.Int64).alias(name))
        elif dt.is_float():
            exprs.append(pl.col(name).cast(pl.Float64).alias(name))
        else:
            exprs.append(pl.col(name))
    return df.select(exprs)


def _sql_type(decl: str) -> pl.DataType:
    d = (decl or "").upper()
    if "INT" in d:
        return pl.Int64()
    if "REAL" in d or "FLOA" in d or "DOUB" in d:
        return pl.Float64()
    if "TEXT" in d or "CHAR" in d:
        return pl.String()
    return pl.Int64()


class NsysSource:
    """One nsys export (SQLite file or parquetdir). Use :func:`open_source`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.kind = "parquetdir" if path.is_dir() else "sqlite"
        self._conn: sqlite3.Connection | None = None
        self._cols: dict[str, list[str]] = {}
        self._types: dict[str, dict[str, pl.DataType]] = {}
        if self.kind == "sqlite":
            try:
                self._conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
                rows = self._conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table','view')").fetchall()
            except sqlite3.DatabaseError as e:
                raise InputError(f"{path}: not a readable SQLite database ({e}); export it with `nsys export -t sqlite`") from None
            self._tables = {r[0] for r in rows}
        else:
            self._tables = {p.stem for p in path.glob("*.parquet")}
        if SESSION_TABLE not in self._tables:
            raise InputError(
                f"{path}: no {SESSION_TABLE} table; not an Nsight Systems export "
                "(use `nsys export -t sqlite` or `-t parquetdir`)"
            )

    def has(self, table: str) -> bool:
        return table in self._tables

    def columns(self, table: str) -> list[str]:
        if table not in self._tables:
            return []
        if table not in self._cols:
            if self._conn is not None:
                info = self._conn.execute(f'PRAGMA table_info("{table}")').fetchall()
                self._cols[table] = [r[1] for r in info]
                self._types[table] = {r[1]: _sql_type(r[2]) for r in info}
            else:
                self._cols[table] = list(pl.read_parquet_schema(self.path / f"{table}.parquet").keys())
        return self._cols[table]

    def read(self, table: str, cols: Sequence[str] | None = None, where: str | None = None) -> pl.DataFrame | None:
        """Requested columns that exist (all if ``cols`` is None); ``None`` if the table is absent.

        ``where`` is an SQL condition applied on SQLite only (an optimisation; callers filter again).
        """
        if table not in self._tables:
            return None
        have = self.columns(table)
        use = [c for c in (cols if cols is not None else have) if c in have]
        if not use:
            return pl.DataFrame()
        try:
            if self._conn is None:
                df = pl.read_parquet(self.path / f"{table}.parquet", columns=use)
            else:
                df = self._read_sqlite(table, use, where)
        except (sqlite3.DatabaseError, pl.exceptions.PolarsError, OSError) as e:
            raise InputError(f"{self.path}: table {table} unreadable ({type(e).__name__}: {e}); re-export the report") from None
        return _normalize(df)

    def _read_sqlite(self, table: str, use: list[str], where: str | None) -> pl.DataFrame:
        assert self._conn is not None
        q = "SELECT " + ", ".join(f'"{c}"' for c in use) + f' FROM "{table}"' + (f" WHERE {where}" if where else "")
        cur = self._conn.execute(q)
        parts: list[pl.DataFrame] = []
        while True:
            rows = cur.fetchmany(_CHUNK_ROWS)
            if not rows:
                break
            cols = list(zip(*rows))
            parts.append(pl.DataFrame({c: pl.Series(c, v, strict=False) for c, v in zip(use, cols)}))
        types = self._types.get(table, {})
        if not parts:
            return pl.DataFrame({c: pl.Series(c, [], dtype=types.get(c, pl.Int64)) for c in use})
        df = parts[0] if len(parts) == 1 else pl.concat(parts, how="vertical_relaxed")
        return df.with_columns(
            [pl.col(c).cast(types[c], strict=False) for c in use if c in types and df.schema[c] != types[c]]
        )

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> "NsysSource":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_source(path: str | Path) -> NsysSource:
    """Open an nsys export; raises :class:`InputError` naming the file and the remedy."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: no such file or directory; check the path")
    if p.is_dir() and not (p / f"{SESSION_TABLE}.parquet").exists():
        raise InputError(f"{p}: directory without {SESSION_TABLE}.parquet; not an nsys parquetdir export")
    return NsysSource(p)
