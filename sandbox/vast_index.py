"""The world's Vast instances by id, so `GET /api/v1/instances/` pages by position.

Vast pages its instance listing by keyset: `next_token` marks the last id a page returned and the
next page starts after it. The index keeps the live instances' ids ascending, with the instances
alongside, so a page in id order is a binary search for the cursor and a walk of `limit` steps:
the rows of a page cost O(limit + log n), whatever the size of the account, and paging is
stable when instances come and go between pages (a new instance gets a higher id and shows up
at the end; a destroyed one is no longer there to step on; no other row moves).

What is not O(page): the counts every page carries (`total_instances`, and `label_counts`, one
entry per distinct label, so a page's answer itself grows with the account). `summary` makes
them in one pass over the live instances' labels, with no row rendered and nothing sorted, and
encodes them again only when a label changed or an instance came or went.

It follows the world lazily, without hooks into it: `World.instances` only grows, in creation
order, so `sync` reads just the entries added since it last looked (nothing at all when none
were; it starts over should entries ever be removed). Destroying an instance changes its phase
in place; a walk steps over destroyed ones and `summary` drops them from the index.
"""

from __future__ import annotations

import json
from bisect import bisect_left, bisect_right
from collections import Counter
from itertools import islice

from sandbox.world import Instance, World

DESTROYED = "destroyed"


class VastIndex:
    """The live instances of one provider (Vast: integer ids) in ascending id order, of one
    account when `account` is given."""

    def __init__(self, world: World, provider: str = "vast", account: int | None = None) -> None:
        self.world = world
        self.provider = provider
        self.account = account
        self.ids: list[int] = []  # ascending
        self.insts: list[Instance] = []  # insts[i] has id ids[i]
        self._seen = 0  # how many entries of world.instances have been read
        self._last_key: str | None = None  # the last of them
        self.stepped = 0  # index entries walks have looked at (tests count the work)
        self._labels: list[str] = []  # the live labels in id order when last counted
        self._counts_json: dict[bool, str] = {}  # descending? -> label_counts, encoded

    def sync(self) -> None:
        """Take in the instances created since the last call. Call under the world's lock.

        O(1) when the world made no instance; else O(new) reads after a C-speed skip of the
        entries already read. Should entries ever leave `World.instances` (it does not remove
        any today), the entry last read is no longer where it was, and the index starts over."""
        instances = self.world.instances
        size = len(instances)
        if size == self._seen and (not size or next(reversed(instances)) == self._last_key):
            return
        fresh = islice(instances.items(), max(self._seen - 1, 0), None)
        if self._seen and next(fresh, (None, None))[0] != self._last_key:
            self.ids, self.insts, self._seen = [], [], 0  # entries were removed: start over
            fresh = islice(instances.items(), 0, None)
        for key, inst in fresh:
            if inst.provider == self.provider and inst.phase != DESTROYED \
                    and self.account in (None, inst.account):
                self._add(inst)
            self._last_key = key
        self._seen = size

    def _add(self, inst: Instance) -> None:
        iid = int(inst.id)
        if not self.ids or iid > self.ids[-1]:  # ids only grow: the usual case
            self.ids.append(iid)
            self.insts.append(inst)
            return
        at = bisect_left(self.ids, iid)
        if at < len(self.ids) and self.ids[at] == iid:
            self.insts[at] = inst
        else:
            self.ids.insert(at, iid)
            self.insts.insert(at, inst)

    def walk(self, after: int | None, desc: bool, count: int) -> list[Instance]:
        """Up to `count` live instances after id `after` (from the start when None), in
        ascending id order, or descending with `desc`: O(log n + count + destroyed stepped)."""
        ids, insts = self.ids, self.insts
        out: list[Instance] = []
        if desc:
            i = len(ids) - 1 if after is None else bisect_left(ids, after) - 1
            step = -1
        else:
            i = 0 if after is None else bisect_right(ids, after)
            step = 1
        while 0 <= i < len(ids) and len(out) < count:
            self.stepped += 1
            inst = insts[i]
            if inst.phase != DESTROYED:
                out.append(inst)
            i += step
        return out

    def summary(self, desc: bool) -> tuple[int, str]:
        """(live instances, `label_counts` as JSON text, labels in listing order), as every
        page of the listing carries them. One pass over the labels (no row rendered, nothing
        sorted), which also drops the destroyed instances it finds from the index; the counts
        are made and encoded again only when a label changed or an instance came or went (the
        encoding of a 10,000-label object is what a page would otherwise spend most on)."""
        insts = self.insts
        labels = [i.label or "" for i in insts if i.phase != DESTROYED]
        if len(labels) < len(insts):
            keep = [n for n, i in enumerate(insts) if i.phase != DESTROYED]
            self.ids = [self.ids[n] for n in keep]
            self.insts = [insts[n] for n in keep]
        if labels != self._labels:  # the counts, and their order, follow from this list alone
            self._labels = labels
            self._counts_json.clear()
        text = self._counts_json.get(desc)
        if text is None:
            counts = Counter(reversed(labels)) if desc else Counter(labels)
            text = self._counts_json[desc] = json.dumps(dict(counts))
        return len(labels), text
