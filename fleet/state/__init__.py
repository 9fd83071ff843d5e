"""What the fleet remembers on the operator's disk: the registry, releases, bills, the archive."""
