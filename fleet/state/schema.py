"""The state database's schema, as numbered migrations.

Each migration runs in its own transaction (`fleet.state.db.migrate`) under the migration lock (SQLite: the one writer's
lock, `BEGIN IMMEDIATE`; PostgreSQL: an advisory lock held to the transaction's end), reads the
version again under it and records itself in `schema_migrations`, so two processes starting at
once apply each migration once, and a failed one leaves the database at the one before. A
database a newer fleet migrated further is refused: this fleet cannot know its rows.

The uniqueness the fleet relies on is the schema's own, so a second writer the code could not
see is refused by the database:
- one row per label (the primary key) and per provider box id (`boxes_provider_id`);
- one live box per roster slot (`boxes_live_slot`): a second rent for a slot fails;
- one live replacement per dead box (`boxes_live_rerent`) and one live move per box moved
  (`boxes_live_move`).
A row's `live` is written with it (`Row.live`), so the indexes can ask it.
"""

from __future__ import annotations

MIGRATIONS: tuple[tuple[int, str, tuple[str, ...]], ...] = (
    (1, "boxes", (
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        """CREATE TABLE boxes (
            label TEXT PRIMARY KEY,
            seq INTEGER NOT NULL,
            provider TEXT NOT NULL,
            provider_id TEXT,
            slot TEXT,
            rerent_of TEXT,
            move_of TEXT,
            live INTEGER NOT NULL,
            doc TEXT NOT NULL)""",
        "CREATE UNIQUE INDEX boxes_seq ON boxes (seq)",
        "CREATE UNIQUE INDEX boxes_provider_id ON boxes (provider, provider_id) "
        "WHERE provider_id IS NOT NULL",
        "CREATE UNIQUE INDEX boxes_live_slot ON boxes (slot) "
        "WHERE live = 1 AND slot IS NOT NULL",
        "CREATE UNIQUE INDEX boxes_live_rerent ON boxes (rerent_of) "
        "WHERE live = 1 AND rerent_of IS NOT NULL",
        "CREATE UNIQUE INDEX boxes_live_move ON boxes (move_of) "
        "WHERE live = 1 AND move_of IS NOT NULL",
    )),
    (2, "documents and ticks", (
        # the loop's memory and the last bills read: one small document each
        "CREATE TABLE docs (name TEXT PRIMARY KEY, doc TEXT NOT NULL, "
        "updated_at TEXT NOT NULL)",
        # what `fleet check` remembers of each box between two checks
        "CREATE TABLE check_history (label TEXT PRIMARY KEY, doc TEXT NOT NULL)",
        # the loop's last tick, a row per box it judged: no size cap
        "CREATE TABLE ticks (number INTEGER PRIMARY KEY, at TEXT NOT NULL, "
        "saved_at TEXT NOT NULL, owed TEXT NOT NULL, provider_errors TEXT NOT NULL)",
        "CREATE TABLE tick_health (number INTEGER NOT NULL, pos INTEGER NOT NULL, "
        "label TEXT NOT NULL, doc TEXT NOT NULL, PRIMARY KEY (number, pos))",
    )),
    (3, "leader and shared checks", (
        "CREATE TABLE leader (id INTEGER PRIMARY KEY, epoch INTEGER NOT NULL, "
        "holder TEXT NOT NULL, since TEXT NOT NULL, seen_at TEXT NOT NULL)",
        # a tick's checks, each claimed by one operator machine at a time (`fleet.state.claims`)
        "CREATE TABLE check_claims (tick INTEGER NOT NULL, label TEXT NOT NULL, "
        "token TEXT, claimed_until DOUBLE PRECISION, result TEXT, "
        "PRIMARY KEY (tick, label))",
    )),
    (4, "what a shared check reaches", (
        # the leader's inventory entry of the box (`fleet.boxes.inventory.host_data`): what the
        # operator machine that claims it connects to
        "ALTER TABLE check_claims ADD COLUMN host TEXT NOT NULL DEFAULT '{}'",
    )),
)

LATEST = MIGRATIONS[-1][0]
