"""Plain-text number formatting shared by the reporters, and terminal tables that never cut a number."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from rich.cells import cell_len
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

__all__ = ["num", "ms", "Col", "fit_tables", "bullets", "console_width"]


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


# ---------------------------------------------------------------- tables that fit the console
@dataclass(frozen=True)
class Col:
    """A column of :func:`fit_tables`.

    ``kind``: ``"num"`` (numbers with units: never cut, never wrapped; a header longer than the
    numbers wraps onto more lines) or ``"text"`` (a name: shortened with an ellipsis to what the
    width leaves, down to ``min_width``). ``key``: repeated in every part when the table splits
    (rank, bucket, metric, kernel name). ``wrap_header``: a header wider than the numbers wraps
    onto more lines (long run labels) instead of widening the column. ``group``: consecutive
    columns of one group stay in the same part when the table splits (before / after / Δ).
    """

    header: str
    kind: str = "num"
    key: bool = False
    justify: str | None = None
    min_width: int = 12
    max_width: int | None = None
    wrap_header: bool = False
    group: str | None = None


def _w(cell: object) -> int:
    return cell_len(cell.plain if isinstance(cell, Text) else str(cell))


def fit_tables(title: str, cols: Sequence[Col], rows: Sequence[Sequence[object]], width: int,
               *, row_styles: Sequence[str | None] | None = None) -> list[Group]:
    """Titled rich tables showing every number of ``rows`` whole within ``width`` columns.

    Number columns keep the width of their widest cell. When the columns do not fit beside
    each other, they are split over several tables, each repeating the key columns
    ("title (2/3)"). Only text columns give up width (ellipsis), down to ``min_width``.
    """
    need, floor = _widths(cols, rows)
    parts = _parts(cols, floor, width)
    out: list[Any] = []
    for n, idx in enumerate(parts):
        widths = list(floor)
        spare = width - _total(idx, floor)
        for i in idx:  # text columns take back what is left, in order
            if cols[i].kind == "text" and spare > 0:
                add = min(need[i] - floor[i], spare)
                widths[i] += add
                spare -= add
        t = Table()
        for i in idx:
            c = cols[i]
            text = c.kind == "text"
            t.add_column(Text(c.header), justify=c.justify or ("left" if text else "right"),  # type: ignore[arg-type]
                         width=widths[i], no_wrap=text, overflow="ellipsis" if text else "fold")
        for j, r in enumerate(rows):
            row_cells: list[Text] = [c if isinstance(c, Text) else Text(str(c)) for c in (r[i] for i in idx)]
            t.add_row(*row_cells, style=(row_styles[j] if row_styles else None))
        head = Text(title if len(parts) == 1 else f"{title} ({n + 1}/{len(parts)})", style="italic")
        out.append(Group(head, t))  # the title wraps at the console width, not at a narrow table's
    return out


def _widths(cols: Sequence[Col], rows: Sequence[Sequence[object]]) -> tuple[list[int], list[int]]:
    """Each column's wanted width and the least it may take (text: ``min_width``; numbers: all of it)."""
    need, floor = [], []
    for i, c in enumerate(cols):
        cells = max((_w(r[i]) for r in rows), default=0)
        hdr = cell_len(c.header)
        if c.kind == "text":
            w = max(cells, hdr)
            if c.max_width:
                w = min(w, max(c.max_width, hdr))
            need.append(w)
            floor.append(min(w, max(c.min_width, hdr)))
        else:
            # a header longer than the numbers keeps its width unless it may wrap (a run label), never cut
            w = max(cells, min(hdr, max(cells, 8)) if c.wrap_header else hdr, 1)
            need.append(w)
            floor.append(w)
    return need, floor


def _total(idx: list[int], widths: list[int]) -> int:
    """A table's width: its columns, box chars and 1 padding each side per column."""
    return sum(widths[i] for i in idx) + 3 * len(idx) + 1


def _parts(cols: Sequence[Col], floor: list[int], width: int) -> list[list[int]]:
    """The columns of each table: the key columns plus the fewest balanced parts of the others that fit ``width``
    (consecutive columns of one group stay together unless the group alone is too wide)."""
    keys = [i for i, c in enumerate(cols) if c.key]
    units: list[list[int]] = []  # non-key columns, consecutive ones of a group together
    for i, c in enumerate(cols):
        if c.key:
            continue
        if units and c.group is not None and cols[units[-1][-1]].group == c.group:
            units[-1].append(i)
        else:
            units.append([i])
    rest = [i for u in units for i in u]

    def split(cap: float) -> list[list[int]]:  # greedy, in column order; a part holds at most `cap` of non-key width
        parts: list[list[int]] = []
        cur: list[int] = []
        for u in units:
            if cur and (_total(sorted(keys + cur + u), floor) > width or sum(floor[j] + 3 for j in cur + u) > cap):
                parts.append(cur)
                cur = []
            if len(u) > 1 and _total(sorted(keys + u), floor) > width:  # the group alone is too wide: split it
                for i in u:
                    if cur and _total(sorted(keys + cur + [i]), floor) > width:
                        parts.append(cur)
                        cur = []
                    cur.append(i)
                continue
            cur.extend(u)
        return [*parts, cur] if cur or not parts else parts

    k = len(split(float("inf")))
    cap = sum(floor[j] + 3 for j in rest) / max(k, 1)
    while len(split(cap)) > k:  # balance the parts: the smallest cap that needs no more parts than greedy
        cap += 1
    return [sorted(keys + p) for p in split(cap)]


def bullets(items: Sequence[object], marker: str = "•") -> Table:
    """Wrapped list items with a hanging indent (continuation lines start under the text)."""
    g = Table.grid(padding=(0, 1))
    g.add_column(no_wrap=True, width=cell_len(marker) + 2, justify="right")
    g.add_column(overflow="fold")
    for it in items:
        g.add_row(marker, it if isinstance(it, Text) else Text(str(it)))
    return g


def console_width(width: int | None, file: object = None) -> Console:
    """A console of ``width`` columns, else the real terminal's width (80 in a pipe or file, or ``$COLUMNS``)."""
    return Console(file=file, width=width, highlight=False, soft_wrap=False)  # type: ignore[arg-type]
