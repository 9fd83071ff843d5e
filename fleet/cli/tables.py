"""How the CLI prints a table: whole where it fits the console, folded into one block per row
where it does not, the way a web page folds its table into cards on a narrow screen.

A Rich table squeezed into too few columns cuts its cells (`live-v…`) or folds them into
slivers ("SSH / did / not / ans…"); a folded table keeps every word and figure of every cell,
each row's key (its first cell: the box's label) on a line of its own, never cut or wrapped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from rich.console import Console, OverflowMethod, RenderableType
from rich.measure import Measurement
from rich.padding import Padding
from rich.style import StyleType
from rich.styled import Styled
from rich.table import Table
from rich.text import Text

from fleet.core.verdicts import UNKNOWN, known  # noqa: F401  (known: what every table cell of an unknown reads)

# wide enough that measuring a table at it squeezes no column: its natural width
UNBOUNDED = 1 << 16
INDENT = 2  # a folded row's `column: value` lines, under its key
MISSING = "-"  # what a row given as a dict shows in a column it does not name
def build(title: str, columns: Sequence[str], rows: Iterable[Mapping[str, str | None]],
          caption: str | None = None) -> Table:
    """A table of `columns`, each row a dict by column name (a column a row leaves out reads
    `MISSING`, a cell of None `UNKNOWN`), so a table gains a column with one name here and one
    key where rows are made. A row naming a column the table lacks is a mistake, not a cell
    to drop quietly."""
    # flush left, unpadded: no line of the table ends in spaces
    t = Table(title=Text(title), caption=None if caption is None else Text(caption),
              title_justify="default", caption_justify="default")
    for col in columns:
        t.add_column(col)
    named = set(columns)
    for row in rows:
        unknown = set(row) - named
        if unknown:
            raise ValueError(f"row names columns the table {title!r} lacks: {sorted(unknown)}")
        add(t, *(known(row.get(col, MISSING)) for col in columns))
    return t


def add(table: Table, *cells: str) -> None:
    """A row of plain text: a label, a problem or a path is printed as it is, never read as
    Rich markup (`[nvidia-smi]` is no style, `[/tmp]` no closing tag, `:fire:` no emoji)."""
    table.add_row(*(Text(c) for c in cells))


def natural_width(console: Console, table: Table) -> int:
    """The width `table` takes with no cell wrapped or cut (Rich caps a measure at the width
    it is given, so it is measured against a width no table reaches)."""
    return Measurement.get(console, console.options.update_width(UNBOUNDED), table).maximum


def fits(console: Console, table: Table) -> bool:
    return natural_width(console, table) <= console.width


def keep_key(table: Table) -> Table:
    """The key column never wraps and, should anything squeeze it, folds rather than ending in
    an ellipsis: a label is read whole or not at all."""
    if table.columns:
        table.columns[0].no_wrap = True
        table.columns[0].overflow = "fold"
    return table


def show(console: Console, table: Table) -> None:
    """Print `table` whole where its natural width fits the console, otherwise folded. A
    whole table's title or caption wider than the table itself is printed on a line of its
    own above or below it: Rich would wrap it to the table's width, breaking a label."""
    keep_key(table)
    if not fits(console, table):
        fold(console, table)
        return
    width = natural_width(console, table)
    title, caption = table.title, table.caption
    above = title if _wider(console, title, width) else None
    below = caption if _wider(console, caption, width) else None
    if above is not None:
        _line(console, above, table.title_style or "table.title")
    table.title = None if above is not None else title
    table.caption = None if below is not None else caption
    try:
        console.print(table)
    finally:  # the table as it was given
        table.title, table.caption = title, caption
    if below is not None:
        _line(console, below, table.caption_style or "table.caption")


def fold(console: Console, table: Table) -> None:
    """The title; then per row its key on a line of its own (printed unwrapped, whatever the
    width: the terminal may break it, Rich never cuts it) and one `column: value` line per
    other non-empty cell, values wrapping under themselves; rows apart by a blank line; then
    the caption. A table without a header is a list of `key: value` lines already: it folds
    into those, under its title. No line ends in a space."""
    sections: list[Callable[[], None]] = []
    if table.title:
        title = table.title
        sections.append(lambda: _line(console, title, table.title_style or "table.title"))
    if not table.show_header:
        sections.extend(_headerless(console, table))
    else:
        sections.extend(_blocks(console, table))
    if table.caption:
        caption = table.caption
        sections.append(lambda: _line(console, caption,
                                      table.caption_style or "table.caption"))
    for i, section in enumerate(sections):
        if i:  # one blank line between the title, the blocks and the caption
            console.print()
        section()


def _headerless(console: Console, table: Table) -> list[Callable[[], None]]:
    """A table without a header as one grid of `key: value` lines (none without rows)."""
    rows = _rows(table)
    if not rows:
        return []
    grid = _grid(table, values=len(table.columns) - 1, key_wraps=False)
    for cells in rows:
        grid.add_row(_named(console, cells[0]), *cells[1:])
    return [lambda: _trimmed(console, grid)]


def _blocks(console: Console, table: Table) -> list[Callable[[], None]]:
    """One block per row: its key alone on a line, then its non-empty cells by name."""
    names = [_named(console, col.header) for col in table.columns[1:]]
    width = max((name.cell_len for name in names), default=0)  # the same in every block
    for name in names:  # padded, not a minimum width: Rich would crop the values by one
        name.pad_right(width - name.cell_len)

    def block(cells: list[RenderableType]) -> Callable[[], None]:
        grid = _grid(table, values=1, key_wraps=True)
        for name, cell in zip(names, cells[1:], strict=True):
            if not _empty(console, cell):
                grid.add_row(name, cell)

        def show_block() -> None:
            console.print(cells[0], style="bold", soft_wrap=True, highlight=table.highlight)
            if grid.row_count:
                _trimmed(console, Padding.indent(grid, INDENT))
        return show_block

    return [block(cells) for cells in _rows(table)]


def _wider(console: Console, text: RenderableType | None, width: int) -> bool:
    """Whether a title or caption is wider than `width` columns (a table's own width)."""
    if text is None:
        return False
    if isinstance(text, str):
        text = console.render_str(text, highlight=False)
    return not isinstance(text, Text) or text.cell_len > width


def _line(console: Console, text: RenderableType, style: StyleType) -> None:
    """A title or caption on lines of its own, wrapped between words at the console's width
    (a word longer than the console folds, never cut)."""
    if isinstance(text, str):
        text = console.render_str(text, highlight=False)
    _trimmed(console, Styled(text, style), overflow="fold")


def _trimmed(console: Console, renderable: RenderableType,
             overflow: OverflowMethod | None = None) -> None:
    """Print `renderable` with no line ending in spaces (a grid pads every cell to its
    column's width, and a wrapped line keeps the space it was broken at)."""
    options = console.options if overflow is None else console.options.update(
        overflow=overflow)
    for line in console.render_lines(renderable, options, pad=False):
        text = Text.assemble(*((seg.text, seg.style or "") for seg in line if not seg.control))
        text.rstrip()
        console.print(text, soft_wrap=True, highlight=False)


def _rows(table: Table) -> list[list[RenderableType]]:
    """Each row's cells, in column order (Rich keeps them by column)."""
    columns = [list(col.cells) for col in table.columns]
    return [[cells[i] for cells in columns] for i in range(table.row_count)]


def _grid(table: Table, values: int, key_wraps: bool) -> Table:
    """Borderless rows of a name (a header, or a headerless table's key) and `values` cells,
    each value folding where a word is longer than its room, never cut."""
    grid = Table.grid(padding=(0, 1))
    grid.highlight = table.highlight
    grid.add_column(no_wrap=not key_wraps, overflow="fold")
    for _ in range(values):
        grid.add_column(overflow="fold")
    return grid


def _named(console: Console, header: RenderableType) -> Text:
    """`header` as the name of a `name: value` line."""
    if isinstance(header, Text):
        text = header.copy()
    elif isinstance(header, str):
        text = console.render_str(header, highlight=False)
    else:
        text = Text(str(header))
    text.append(":")
    return text


def _empty(console: Console, cell: RenderableType) -> bool:
    """A cell with no text, left out of its row's block (a renderable is never empty)."""
    if isinstance(cell, Text):
        return not cell.plain.strip()
    if isinstance(cell, str):
        return not console.render_str(cell).plain.strip()
    return False
