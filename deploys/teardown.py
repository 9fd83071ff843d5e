"""
Read the inventory's one-shot boxes back, then destroy them: the archive and the store must
both match each box's sha256 manifest first (see fleet/ops/teardown.py).

    pyinfra -y inventory.py --limit LABEL deploys/teardown.py        # = fleet teardown LABEL
    pyinfra -y inventory.py --limit LABEL deploys/teardown.py --data dry_run=1

A box whose outputs do not match is kept, says which file differs where, and fails here.
Standing boxes are refused.
"""

import logging

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.operations import python

from fleet.boxes import deploy_results as results
from fleet.boxes import deploy_support as support
from fleet.ops import teardown
from fleet.providers.factory import all_providers
from fleet.state.registry import Registry


class _ToPyinfra(logging.Handler):
    """The teardown's own lines, shown in pyinfra's output as they happen."""

    def emit(self, record: logging.LogRecord) -> None:
        logger.info(record.getMessage())


def read_back_and_destroy(label: str, dry_run: bool) -> None:
    cfg = support.config()
    said = logging.getLogger(teardown.__name__)
    handler, level = _ToPyinfra(), said.level
    said.addHandler(handler)
    said.setLevel(logging.INFO)
    try:
        out = teardown.teardown(cfg, Registry(cfg.registry), dict(all_providers()), label,
                                dry_run=dry_run)
    finally:
        said.removeHandler(handler)
        said.setLevel(level)
    for line in out.steps:
        logger.info("%s: %s", label, line)


@deploy("Teardown")
def teardown_deploy() -> None:
    if host.data.get("kind") != "oneshot":
        results.refuse(f"{host.name} is a {host.data.get('kind')} box; standing boxes are "
                       "replaced, never torn down", name="Refuse standing box")
        return
    python.call(name="Read back (archive, store), then destroy",
                function=read_back_and_destroy, label=host.name,
                dry_run=bool(host.data.get("dry_run")))


teardown_deploy()
