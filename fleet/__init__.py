"""fleet: the operator's library and CLI for rented GPU boxes."""

__version__ = "0.1.0"
