"""`python -m fleet.cli`: the `fleet` command."""

from fleet.cli.main import main

main()
