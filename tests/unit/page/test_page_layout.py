"""The fleet page's tables whole in a real headless Chromium, on a laptop (1280 px) and on a
phone (420 px): no cell's text clipped or past its card's edge, no table scrolled sideways
to be read, and the page never wider than the screen. Measured, not looked at: for each
visible cell `scrollWidth <= clientWidth`, and its box inside its table's container and the
viewport. The fixture fleet carries a box with a label as long as the fleet makes them and a
verdict with long reasons, the cells that cut the table at the card's edge before."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import page_fixture as F
import pytest
from headless_chromium import Chromium, executable

from fleet import page
from fleet.core.verdicts import Health

LONG = "live-3f9c2a-runpod-7d41e0-r2"  # <role>-<fleet id>-<provider>-<6 hex>-r<n>

# every visible cell, caption and table container that hides some of its text
CLIPPED_JS = """(() => {
  const out = [];
  const vw = document.documentElement.clientWidth;
  if (document.documentElement.scrollWidth > vw)
    out.push({page: document.documentElement.scrollWidth, viewport: vw});
  for (const w of document.querySelectorAll('.table-wrap'))
    if (w.scrollWidth > w.clientWidth)
      out.push({table: w.querySelector('table').id, scroll: w.scrollWidth, room: w.clientWidth});
  for (const c of document.querySelectorAll('td, th, caption')) {
    if (!c.getClientRects().length) continue;  // not shown
    const head = c.closest('thead');  // a card layout's headers: kept for readers, not shown
    if (head && getComputedStyle(head).position === 'absolute') continue;
    const r = c.getBoundingClientRect();
    const room = (c.closest('.table-wrap') || c.closest('section')).getBoundingClientRect();
    if (c.scrollWidth > c.clientWidth || r.right > room.right + 0.5 || r.left < room.left - 0.5
        || r.right > vw)
      out.push({cell: c.innerText.slice(0, 60), table: c.closest('table').id,
                scroll: c.scrollWidth, width: c.clientWidth, right: r.right,
                room: room.right});
  }
  return out;
})()"""


def data() -> dict[str, Any]:
    """The fixture fleet, and a standing box with a full-length label that is unwell twice."""
    rows = [*F.rows(), F.row(LONG, 0.69, timedelta(hours=5), provider="runpod",
                              place="runpod data center EU-RO-1")]
    health = [*F.health(), Health(
        LONG, "runpod", ssh=True, agent=True, synced=False, blocks=1_284_100,
        node_sha16=F.OLD, wanted_sha16=F.WANTED,
        problems=["node: not synced",
                  "admission refused: driver 575.57.08 is not the admitted 580.95.05"])]
    return page.build(page.PageInputs(cfg=F.config(), rows=rows, health=health,
                                      watched=F.watched(), now=F.NOW, owed=F.owed()))


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Any:
    if executable() is None:
        pytest.fail("chromium is missing: install Debian's `chromium` package "
                    "(./run.sh setup does); the page is tested in a real browser")
    with Chromium(tmp_path_factory.mktemp("chromium")) as c:
        yield c


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("page")
    page.write(out, data())
    return (out / "index.html").as_uri()


@pytest.mark.parametrize("width", [1280, 420])
def test_no_cell_of_any_table_is_clipped(browser: Chromium, url: str, tmp_path: Path,
                                         width: int) -> None:
    start = len(browser.events)
    browser.viewport(width, 900)
    browser.open(url)
    assert browser.console(start) == []
    shown = browser.evaluate("[...document.querySelectorAll('#boxes tbody th')]"
                             ".map(th => th.innerText.replace(/\\s+/g, ''))")
    assert LONG in shown and len(shown) == 6
    assert browser.evaluate(CLIPPED_JS) == []
    shot = browser.screenshot(tmp_path / f"fleet-page-{width}.png")  # kept to look at
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_check_sees_a_clipped_cell(browser: Chromium, tmp_path: Path) -> None:
    """The measure itself: a table wider than its card is found, cell by cell."""
    bad = tmp_path / "bad.html"
    bad.write_text('<!doctype html><html lang="en"><body><section style="width:300px">'
                   '<div class="table-wrap" style="overflow-x:auto"><table id="t"><tr>'
                   '<td style="white-space:nowrap">' + "a-very-long-reason " * 20 +
                   "</td></tr></table></div></section></body></html>")
    browser.viewport(1280, 900)
    browser.open(bad.as_uri())
    found = browser.evaluate(CLIPPED_JS)
    assert {"table": "t", "scroll": found[0]["scroll"], "room": found[0]["room"]} in found
    assert any(f.get("cell", "").startswith("a-very-long-reason") for f in found)
