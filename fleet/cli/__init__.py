"""The `fleet` command line: `main` registers one module per command group."""
