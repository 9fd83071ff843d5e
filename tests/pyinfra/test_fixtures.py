"""pyinfra-style fixture tests for the fleet's facts and operations.

Each folder under facts/ and operations/ is one fact or operation; each JSON file one case
(arguments, stubbed facts, the exact commands or noop expected). pyinfra-testing imports
pyinfra's CLI, which monkeypatches the process with gevent, so this suite runs in its own
pytest process (see run.sh), apart from the tests that start servers and threads.
"""

from pathlib import Path

from pyinfra_testing.facts import make_fact_tests
from pyinfra_testing.operations import make_operation_tests

HERE = Path(__file__).parent

for _d in sorted((HERE / "facts").iterdir()):
    locals()[f"TestFact_{_d.name}"] = make_fact_tests("facts", _d.name, _d)
for _d in sorted((HERE / "operations").iterdir()):
    locals()[f"TestOperation_{_d.name}"] = make_operation_tests("operations", _d.name, _d)
