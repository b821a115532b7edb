"""The identifiers a harvest delivered so far, for a harvest into a store that held none
of its harvester's records: only those may be stored, so a page's hash look-up asks the
store for them alone, and a first harvest's pages (all new) ask for nothing.

A Bloom filter (two probes) that grows in two steps: 1 MB for the first 400,000
identifiers, then 16 MB for the rest. Its false positives cost a look-up, never a record:
about 1 in 100 at 400,000 identifiers, 1 in 50 at ten million. Python's string hash
places the bits: a filter lives in one process, and a worker rebuilds its own from the
identifiers delivered before it took over.
"""

from __future__ import annotations

from collections.abc import Sequence

from oaipmh_dagster.storage.ports import RecordStore

__all__ = ["Delivered"]

SMALL, LARGE = 1 << 23, 1 << 27  # bits of the first filter and of the second
SMALL_HOLDS = 400_000  # identifiers the first filter takes before the second begins


class Delivered:
    """What a harvest into an empty store delivered so far (see the module)."""

    def __init__(self, identifiers: Sequence[str] = (), *, keep: int = 0) -> None:
        self._filters: list[bytearray] = []  # allocated on the first identifier
        self._added = 0
        self.asked = 0  # identifiers whose hash the store was asked for
        # the identifiers themselves while there are at most `keep` (a worker's start)
        self.kept: list[str] | None = [] if keep else None
        self._keep = keep
        self.add(identifiers)

    def add(self, identifiers: Sequence[str]) -> None:
        if not identifiers:
            return
        if self.kept is not None:
            self.kept.extend(identifiers)
            if len(self.kept) > self._keep:
                self.kept = None
        if not self._filters or (len(self._filters) == 1 and self._added >= SMALL_HOLDS):
            self._filters.append(bytearray((SMALL if not self._filters else LARGE) >> 3))
        self._added += len(identifiers)
        bits = self._filters[-1]
        mask = (len(bits) << 3) - 1
        for identifier in identifiers:
            h = hash(identifier)
            a, b = h & mask, (h >> 27) & mask
            bits[a >> 3] |= 1 << (a & 7)
            bits[b >> 3] |= 1 << (b & 7)

    def may_hold(self, identifier: str) -> bool:
        """False when this harvest surely did not deliver `identifier` before."""
        h = hash(identifier)
        for bits in self._filters:
            mask = (len(bits) << 3) - 1
            a, b = h & mask, (h >> 27) & mask
            if bits[a >> 3] & (1 << (a & 7)) and bits[b >> 3] & (1 << (b & 7)):
                return True
        return False

    def hashes(self, store: RecordStore, harvester_id: str, identifiers: Sequence[str]
               ) -> dict[str, str | None]:
        """`store.hashes` for a page's `identifiers`, asked only for those delivered
        before; then the page's identifiers count as delivered."""
        maybe = [i for i in identifiers if self.may_hold(i)]
        self.asked += len(maybe)
        found = store.hashes(harvester_id, maybe) if maybe else {}
        self.add(identifiers)
        return found
