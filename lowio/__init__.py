"""Low-level code that both the product (`fleet`) and the local cloud (`sandbox`) use.

Imports nothing from fleet, sandbox or agent, so either side may import it without reaching
into the other (tests/unit/test_layers.py holds the line). Standard library only.

    directio.py   bulk bytes to and from disk past the page cache (O_DIRECT)
"""
