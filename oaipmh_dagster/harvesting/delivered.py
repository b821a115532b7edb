"""The identifiers a harvest delivered so far, for a harvest into a store that held none
of its harvester's records: only those may be stored, so a page's hash look-up asks the
store for them alone, and a first harvest's pages (all new) ask for nothing.

A Bloom filter of fixed size (16 MB, two probes): its false positives cost a look-up,
never a record; at a million identifiers they are about 1 in 5,000, at ten million 1 in
50. Python's string hash places the bits: a filter lives in one process, and a worker
rebuilds its own from the identifiers delivered before it took over.
"""

from __future__ import annotations

from collections.abc import Sequence

from oaipmh_dagster.storage.ports import RecordStore

__all__ = ["Delivered"]

BITS = 1 << 27
_MASK = BITS - 1


class Delivered:
    """What a harvest into an empty store delivered so far (see the module)."""

    def __init__(self, identifiers: Sequence[str] = (), *, keep: int = 0) -> None:
        self._bits = bytearray(BITS >> 3)
        self.asked = 0  # identifiers whose hash the store was asked for
        # the identifiers themselves while there are at most `keep` (a worker's start)
        self.kept: list[str] | None = [] if keep else None
        self._keep = keep
        self.add(identifiers)

    def add(self, identifiers: Sequence[str]) -> None:
        if self.kept is not None:
            self.kept.extend(identifiers)
            if len(self.kept) > self._keep:
                self.kept = None
        bits = self._bits
        for identifier in identifiers:
            h = hash(identifier)
            a, b = h & _MASK, (h >> 27) & _MASK
            bits[a >> 3] |= 1 << (a & 7)
            bits[b >> 3] |= 1 << (b & 7)

    def may_hold(self, identifier: str) -> bool:
        """False when this harvest surely did not deliver `identifier` before."""
        h = hash(identifier)
        a, b = h & _MASK, (h >> 27) & _MASK
        bits = self._bits
        return bool(bits[a >> 3] & (1 << (a & 7)) and bits[b >> 3] & (1 << (b & 7)))

    def hashes(self, store: RecordStore, harvester_id: str, identifiers: Sequence[str]
               ) -> dict[str, str | None]:
        """`store.hashes` for a page's `identifiers`, asked only for those delivered
        before; then the page's identifiers count as delivered."""
        maybe = [i for i in identifiers if self.may_hold(i)]
        self.asked += len(maybe)
        found = store.hashes(harvester_id, maybe) if maybe else {}
        self.add(identifiers)
        return found
