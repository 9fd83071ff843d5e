"""The fleet page: one static HTML file and its JSON, both built from an allow-list of fields.

`build` (data.py) turns the registry's rows, `fleet check`'s verdicts and the meter watchdog's
into the page's data (the `fleet.json` document); `render` (html.py) turns that data into
`index.html`; `write` puts both in place, each by temporary file and rename, so a reader never
sees half a page.

Without a provider's key (`PageInputs(..., keyless=..., last_tick=...)`), that provider's standing
boxes show the verdicts of the loop's last tick (`fleet.state.last_tick`), dated by it, and the
data's `sources` (the page's notice) says which parts are live and which are not.

The page needs no JavaScript and makes no request of its own: its CSS is inline, its chart is an
SVG step line drawn by chart.py, and a Content-Security-Policy forbids anything else. It never
carries a key, an SSH endpoint, an IP address or a host key: the data is assembled field by
field from the rows (never by copying a row), and every free text (problems, refusals, reasons)
is scrubbed of the registry's endpoints and of anything that reads as an address or a key.
The HTML and the CSS are package files under templates/.

Example:

    data = page.build(page.PageInputs(cfg, reg.rows(), health, watched, datetime.now(UTC)))
    page.write(Path("state/page"), data)
"""

from fleet.page.chart import CHART_DAYS, chart_data, chart_points, chart_svg
from fleet.page.data import (
    RULE,
    SCHEMA,
    VERDICT_SOURCES,
    PageInputs,
    Scrubber,
    build,
    verdicts_from,
)
from fleet.page.html import FILES, prepare, render, write

__all__ = [
    "CHART_DAYS", "FILES", "RULE", "SCHEMA", "VERDICT_SOURCES", "PageInputs", "Scrubber", "build",
    "chart_data", "chart_points", "chart_svg", "prepare", "render", "verdicts_from", "write",
]
