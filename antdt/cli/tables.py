"""Tables that stay readable in an 80-column terminal.

A table shows its essential columns by default and the rest with ``--wide``.
Identifiers, times and numbers are never folded mid-word: only the free-text
columns wrap. When the terminal leaves a free-text column too little room, each
row's free text goes on lines of its own under the row, as wide as the terminal,
so a narrow terminal costs lines, not legibility.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from rich import box
from rich.console import Console, Group
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

WIDE_HELP = "Show every column (needs a wide terminal)."
#: A free-text column narrower than this is unreadable: its text goes under the row instead.
MIN_FREE_TEXT = 30
_GAP = 2  # between two columns: the padding on either side


@dataclass(frozen=True)
class Column:
    header: str
    wide_only: bool = False
    free_text: bool = False  # wraps at word boundaries; every other column stays whole


class NarrowTable:
    """A table of ``columns``; rows give a value for every column, shown or not.

    Values are rich markup. :meth:`print` lays the table out for the console it prints on.
    """

    def __init__(self, columns: list[Column], wide: bool, title: str | None = None):
        self._columns = [column for column in columns if wide or not column.wide_only]
        self._shown = [wide or not column.wide_only for column in columns]
        self._title = title
        self._rows: list[list[str]] = []

    def add(self, *values: object) -> None:
        if len(values) != len(self._shown):
            raise ValueError(f"{len(values)} values for {len(self._shown)} columns")
        self._rows.append(
            ["" if v is None else str(v) for v, shown in zip(values, self._shown) if shown]
        )

    def print(self, console: Console) -> None:
        console.print(self.renderable(console.width))

    def renderable(self, width: int) -> Table | Group:
        """The table; with free text under each row if its column would get too little room."""
        fixed = [i for i, column in enumerate(self._columns) if not column.free_text]
        if len(fixed) == len(self._columns) or self._room_for_free_text(fixed, width):
            return self._table(range(len(self._columns)))
        return self._blocks(fixed, width)

    def _blocks(self, fixed: list[int], width: int) -> Group:
        """Aligned fixed columns, one line per row, each row's free text indented beneath it."""
        widths = {i: self._width(i) for i in fixed}
        free = [i for i in range(len(self._columns)) if i not in fixed]
        lines: list = [Text(self._title, justify="center")] if self._title else []
        lines.append(
            self._line([Text(self._columns[i].header, style="bold") for i in fixed], widths)
        )
        lines.append(Text("─" * min(width, sum(widths.values()) + _GAP * (len(fixed) - 1))))
        for row in self._rows:
            lines.append(self._line([Text.from_markup(row[i]) for i in fixed], widths))
            for i in free:
                if row[i]:
                    note = Text.from_markup(f"{self._columns[i].header}: {row[i]}")
                    lines.append(Padding(note, (0, 0, 0, 4)))
        return Group(*lines)

    @staticmethod
    def _line(cells: list[Text], widths: dict[int, int]) -> Text:
        line = Text(no_wrap=True, overflow="ellipsis")
        for n, (cell, cell_width) in enumerate(zip(cells, widths.values())):
            line.append_text(cell)
            if n < len(cells) - 1:
                line.append(" " * (cell_width - cell.cell_len + _GAP))
        return line

    def _room_for_free_text(self, fixed: list[int], width: int) -> bool:
        widths = [self._width(i) for i in fixed]
        used = sum(widths) + _GAP * len(self._columns)
        return width - used >= MIN_FREE_TEXT * (len(self._columns) - len(fixed))

    def _width(self, index: int) -> int:
        cells = [Text.from_markup(row[index]).cell_len for row in self._rows]
        return max([len(self._columns[index].header), *cells])

    def _table(self, indexes) -> Table:
        table = Table(title=self._title, box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1))
        for i in indexes:
            column = self._columns[i]
            table.add_column(
                column.header,
                no_wrap=not column.free_text,
                overflow="fold" if column.free_text else "ellipsis",
            )
        for row in self._rows:
            table.add_row(*(row[i] for i in indexes))
        return table


def clock(when: datetime, wide: bool) -> str:
    """The time of day to the millisecond; with ``wide``, the full ISO-8601 timestamp."""
    return when.isoformat(timespec="milliseconds") if wide else when.strftime("%H:%M:%S.%f")[:-3]


def day_span(times: list[datetime]) -> str:
    """The day (or first and last day) ``times`` fall on, for a title when the rows show only the
    clock."""
    if not times:
        return ""
    first, last = min(times).date(), max(times).date()
    return f"{first}" if first == last else f"{first} to {last}"
