"""Tables that stay readable in an 80-column terminal.

A table shows its essential columns by default and the rest with ``--wide``.
Identifiers, times and numbers are never folded mid-word: only the free-text
columns wrap, so a narrow terminal costs lines, not legibility.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from rich import box
from rich.table import Table

WIDE_HELP = "Show every column (needs a wide terminal)."


@dataclass(frozen=True)
class Column:
    header: str
    wide_only: bool = False
    free_text: bool = False  # wraps at word boundaries; every other column stays whole


class NarrowTable:
    """A rich table of ``columns``; rows give a value for every column, shown or not."""

    def __init__(self, columns: list[Column], wide: bool, title: str | None = None):
        self._shown = [wide or not column.wide_only for column in columns]
        self.table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1))
        for column, shown in zip(columns, self._shown):
            if shown:
                self.table.add_column(
                    column.header,
                    no_wrap=not column.free_text,
                    overflow="fold" if column.free_text else "ellipsis",
                )

    def add(self, *values: object) -> None:
        if len(values) != len(self._shown):
            raise ValueError(f"{len(values)} values for {len(self._shown)} columns")
        self.table.add_row(
            *("" if v is None else str(v) for v, shown in zip(values, self._shown) if shown)
        )


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
