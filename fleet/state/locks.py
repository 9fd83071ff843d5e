"""PostgreSQL advisory locks of the fleet's state. Each is a pair of keys: the lock's own number
(a "fleet" prefix no other program of the database is likely to use), and the hash of the
schema the session works in, so that fleets in different schemas of one database (each its
own `search_path`, `?options=-csearch_path%3Dname` in the URL) never hold each other's locks."""

from __future__ import annotations

WRITE = 0x666C0001  # every write transaction: one writer at a time
MIGRATE = 0x666C0002  # each migration's transaction
LEADER = 0x666C0003  # the leader's session (`fleet.state.leader`)

SCHEMA_KEY = "hashtext(current_schema())"  # the second key, as SQL
