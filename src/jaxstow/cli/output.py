"""Tables and lines for people, JSON for scripts: rich tables in a terminal, plain aligned text otherwise.

>>> from jaxstow.cli.output import Table
>>> table = Table(["path", "dtype", "size"], right=["size"])
>>> table.add("w", "float32", "24 B")
>>> table.add("layers/0/bias", "float32", "8 B")
>>> print(table.plain())
path           dtype    size
w              float32  24 B
layers/0/bias  float32   8 B

A cell's control characters (a name from an untrusted file may hold a terminal's escape sequences, or a line break
that would fake a row) are shown as escapes, and a cell is never read as rich's markup:

>>> print(printable("evil\\x1b[31m\\nrow"))
evil\\x1b[31m\\nrow
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["Table", "print_json", "printable", "styled_terminal"]

#: The C0 and C1 control characters and DEL, the marks that reorder or join text on a terminal (bidirectional
#: overrides, isolates and marks, zero-width characters): a key could else show as another; and lone surrogates (a
#: JSON escape can give a name one), which no terminal's encoding writes.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2066-\u2069\ufeff\ud800-\udfff]")
_CONTROL_OR_BACKSLASH = re.compile(f"[\\\\{_CONTROL.pattern[1:]}")


def printable(text: str, *, backslashes: bool = True) -> str:
    """``text`` with its control characters shown as Python's escapes (``\\x1b``, ``\\n``, ``\\u202e``), and its
    backslashes doubled, so that no text shows as another's escape (not with ``backslashes=False``, for a message
    whose names are quoted with their escapes already).

    >>> printable("a\\x1b[31mb"), printable("\\u202eevil")
    ('a\\\\x1b[31mb', '\\\\u202eevil')
    >>> print(printable("a\\nb"), printable("a\\\\nb"))  # a line break, and a backslash before an n
    a\\nb a\\\\nb
    """
    return (_CONTROL_OR_BACKSLASH if backslashes else _CONTROL).sub(lambda found: repr(found.group())[1:-1], text)


def styled_terminal() -> bool:
    """Whether standard output is a terminal that rich can draw on (rich is an optional dependency)."""
    if not sys.stdout.isatty():
        return False
    try:
        import rich  # noqa: F401
    except ImportError:
        return False
    return True


class Table:
    """Rows of text under named columns; ``right`` names the columns aligned to the right (numbers)."""

    def __init__(self, columns: Sequence[str], *, right: Sequence[str] = (), title: str | None = None) -> None:
        self.columns = list(columns)
        self.right = set(right)
        self.title = title
        self.rows: list[list[str]] = []

    def add(self, *cells: object) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"a row needs {len(self.columns)} cells, not {len(cells)}")
        self.rows.append(["" if cell is None else printable(str(cell)) for cell in cells])

    def plain(self) -> str:
        """The table as aligned text, two spaces between columns, no trailing spaces."""
        widths = [max([len(column), *(len(row[i]) for row in self.rows)]) for i, column in enumerate(self.columns)]
        lines = [] if self.title is None else [self.title]
        for row in [self.columns, *self.rows]:
            cells = [
                cell.rjust(width) if column in self.right and row is not self.columns else cell.ljust(width)
                for cell, width, column in zip(row, widths, self.columns, strict=True)
            ]
            lines.append("  ".join(cells).rstrip())
        return "\n".join(lines)

    def show(self) -> None:
        """Print the table: drawn by rich in a terminal, as plain text otherwise."""
        if not styled_terminal():
            print(self.plain())
            return
        from rich.console import Console
        from rich.table import Table as RichTable
        from rich.text import Text

        drawn = RichTable(title=self.title, title_justify="left", header_style="bold")
        for column in self.columns:
            drawn.add_column(column, justify="right" if column in self.right else "left", overflow="fold")
        for row in self.rows:
            drawn.add_row(*map(Text, row))  # as text, not markup
        Console().print(drawn)


def print_json(data: Any) -> None:
    """Print ``data`` as indented strict JSON: a float that is not finite (a file's metadata may hold one) as the
    string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``, which any parser reads.

    >>> print_json({"loss": float("nan"), "steps": [1, float("-inf")]})
    {
      "loss": "NaN",
      "steps": [
        1,
        "-Infinity"
      ]
    }
    """
    json.dump(_strict(data), sys.stdout, indent=2, allow_nan=False)
    sys.stdout.write("\n")


def _strict(data: Any) -> Any:
    if isinstance(data, float) and not math.isfinite(data):
        return "NaN" if math.isnan(data) else "Infinity" if data > 0 else "-Infinity"
    if isinstance(data, dict):
        return {key: _strict(value) for key, value in data.items()}
    if isinstance(data, list | tuple):
        return [_strict(value) for value in data]
    return data
