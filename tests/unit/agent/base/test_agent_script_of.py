"""Which file a process under an interpreter runs: the script, read from its command line
after argv[0] (never argv[0], which its caller sets at will), and, while the process is still
`env` (a `#!/usr/bin/env python3` script in the moment before env execs python3), after the
interpreter env was asked for. Reading `python3` there as the script made the agent stop a
node it had just started, as a crash, whenever it looked in that moment."""

from __future__ import annotations

import pytest

from agent.base.procs import script_index

SCRIPT = "/root/fleet/releases/aaaa/igneumd"


@pytest.mark.parametrize(("argv", "under_env", "index"), [
    # the kernel's argv for a shebang `#!/usr/bin/env python3`, while env still runs
    (["/usr/bin/env", "python3", SCRIPT, "--datadir", "/d"], True, 2),
    (["/usr/bin/env", "-i", "A=1", "python3", "-u", SCRIPT], True, 5),
    # once env has exec'd python3, and a script under any interpreter
    (["python3", SCRIPT, "--datadir", "/d"], False, 1),
    (["/usr/bin/python3", "-u", SCRIPT], False, 2),
    # argv[0] never names the script, whatever it says
    ([SCRIPT, "/root/fleet/releases/bbbb/igneumd", "--p2p-port", "1"], False, 1),
    (["python3"], False, None),
])
def test_the_script_is_read_after_the_interpreter(argv: list[str], under_env: bool,
                                                  index: int | None) -> None:
    assert script_index(argv, under_env) == index
