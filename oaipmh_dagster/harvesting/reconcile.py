"""Reconciliation: compare the identifiers a server lists with the store and repair the
difference.

A harvest by datestamp never notices a record that a list skipped (offset-based tokens
over a list that changed mid-harvest), a record that vanished from a server that keeps
no tombstones (`deletedRecord` `no` or `transient`), or a record whose new datestamp is
older than the since. Listing every identifier of the harvester's selection
(ListIdentifiers over its sets, de-duplicated across sets) and comparing finds them:

- listed, but missing from the store, or stored with an older datestamp (or as a
  tombstone while the server lists it live): fetched with GetRecord, a deleted header
  is stored as the tombstone it is without a request. GetRecord, not a ListRecords from
  the oldest such datestamp: its cost follows the number of differences, while one old
  difference would make that ListRecords a full harvest;
- stored live but not listed: asked for with GetRecord first (a list that changed while
  it was read may have skipped it). Gone (`idDoesNotExist`, `cannotDisseminateFormat`)
  or outside the harvester's sets: a tombstone whose error says "not listed by the
  server"; a deleted record: its tombstone; still there: stored again and counted `kept`.

Before anything is written the number of stored live records the server did not list is
held against the harvester's `max_delete` (`sweep.check`): more than it allows, and the
reconcile writes nothing, unless the run confirms (`allow_mass_delete`); its statistics
then carry the hold (`held_back`). A server whose index broke (an empty or short list)
costs no GetRecord request and no tombstone.

No Dagster in here; a harvest with `RunOptions(reconcile=True)` calls it after its lists.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from oaipmh_dagster.harvesting.rows import Transform, Validate, write_page
from oaipmh_dagster.harvesting.sweep import HeldBack, check
from oaipmh_dagster.oai import CannotDisseminateFormat, IdDoesNotExist, OAIClient
from oaipmh_dagster.oai.models import Record
from oaipmh_dagster.storage.ports import RecordStore, utc_datestamp
from oaipmh_dagster.storage.registry import Harvester

NOT_LISTED = "not listed by the server"
BATCH = 100  # records per GetRecord batch (one store transaction each)


@dataclass
class ReconcileStats:
    """What one reconciliation found and did."""

    listed: int = 0  # distinct identifiers the server listed
    missing_fetched: int = 0  # listed, not in the store: stored now
    stale_fetched: int = 0  # listed as newer than (or live unlike) the stored row: stored now
    tombstoned: int = 0  # stored live, not listed, confirmed gone: now a tombstone
    kept: int = 0  # stored live, not listed, but still served in the selection: the list skipped it
    vanished: int = 0  # listed, then unknown to GetRecord (changed in between): left alone
    failed: int = 0  # fetched records stored with an error
    held_back: HeldBack | None = None  # too many to tombstone: nothing was written

    def summary(self) -> str:
        """The counts in a few words."""
        if self.held_back is not None:
            return (f"{self.listed} listed; held back: {self.held_back.would_tombstone} "
                    f"stored records not listed, more than max_delete "
                    f"{self.held_back.max_delete} allows ({self.held_back.limit})")
        return (f"{self.listed} listed, {self.missing_fetched} missing fetched, "
                f"{self.stale_fetched} stale fetched, {self.tombstoned} tombstoned"
                + (f", {self.kept} skipped by the list and kept" if self.kept else "")
                + (f", {self.vanished} gone before they were fetched" if self.vanished else ""))


def in_selection(specs: Iterable[str], sets: Sequence[str]) -> bool:
    """Whether a record in sets `specs` belongs to a harvester of `sets` (none: all)."""
    if not sets:
        return True
    return any(s == x or s.startswith(x + ":") for s in specs for x in sets)


def reconcile(
    client: OAIClient, h: Harvester, store: RecordStore, *, run_id: str,
    transform: Transform | None, logger: Any, validate: Validate | None = None,
    allow_mass_delete: bool = False,
) -> ReconcileStats:
    """List the identifiers of `h`'s selection, compare them with the store, and bring
    the store to the server (see the module's description); held back, it writes
    nothing."""
    stats = ReconcileStats()
    logger.info("reconcile: listing the identifiers of %s (sets %s)", h.id,
                list(h.sets) or "all")
    listed = _listed(client, h)
    stats.listed = len(listed)
    stored = store.snapshot(h.id)
    missing, stale, headers = [], [], []
    for identifier, (datestamp, tomb) in listed.items():
        have = stored.get(identifier)
        if tomb is not None:
            if have is None or not have[1]:
                headers.append((Record(header=tomb), have is None))
        elif have is None:
            missing.append(identifier)
        elif have[1] or (datestamp is not None and have[0] < datestamp):
            stale.append(identifier)
    unlisted = [i for i, (_, deleted, _) in stored.items() if not deleted and i not in listed]
    live = sum(1 for _, deleted, _ in stored.values() if not deleted)
    del stored, listed
    stats.held_back = check("reconcile", h, len(unlisted), live, "the server did not list "
                            "them", allow=allow_mass_delete)
    if stats.held_back is not None:
        logger.error(stats.held_back.message())
        return stats
    logger.info("reconcile: %d listed; %d missing and %d stale in the store, %d deleted "
                "headers to store, %d stored records not listed", stats.listed, len(missing),
                len(stale), len(headers), len(unlisted))
    write = _writer(store, h, run_id, transform, stats, validate)
    for i in range(0, len(headers), BATCH):
        chunk = headers[i:i + BATCH]
        write([r for r, _ in chunk])
        stats.missing_fetched += sum(1 for _, new in chunk if new)
        stats.stale_fetched += sum(1 for _, new in chunk if not new)
    for kind, identifiers in (("missing_fetched", missing), ("stale_fetched", stale)):
        for found, gone in _fetch(client, h, identifiers):
            write(found)
            setattr(stats, kind, getattr(stats, kind) + len(found))
            stats.vanished += len(gone)
    _verify_unlisted(client, h, store, unlisted, run_id, write, stats)
    logger.info("reconcile finished: %s", stats.summary())
    return stats


def _listed(client: OAIClient, h: Harvester) -> dict[str, tuple[str | None, Any]]:
    """identifier -> (datestamp in the store's form or None, the header when deleted)."""
    listed: dict[str, tuple[str | None, Any]] = {}
    for page in client.iter_record_pages(h.metadata_prefix, sets=h.sets,
                                         identifiers_only=True):
        for rec in page.records:
            header = rec.header
            when = header.datestamp_utc
            listed[header.identifier] = (utc_datestamp(when) if when else None,
                                         header if header.deleted else None)
    return listed


def _writer(store: RecordStore, h: Harvester, run_id: str, transform: Transform | None,
            stats: ReconcileStats, validate: Validate | None = None,
            ) -> Callable[[list[Record]], None]:
    def write(records: list[Record]) -> None:
        if records:
            counts = write_page(store, h.id, records, run_id=run_id, transform=transform,
                                metadata_prefix=h.metadata_prefix, transformer=h.transformer,
                                validate=validate)
            stats.failed += counts.failed
    return write


def _fetch(
    client: OAIClient, h: Harvester, identifiers: Sequence[str]
) -> Iterator[tuple[list[Record], list[str]]]:
    """GetRecord for `identifiers`, in batches: (records found, identifiers gone)."""
    found: list[Record] = []
    gone: list[str] = []
    for identifier in identifiers:
        try:
            found.append(client.get_record(identifier, h.metadata_prefix))
        except (IdDoesNotExist, CannotDisseminateFormat):
            gone.append(identifier)
        if len(found) + len(gone) >= BATCH:
            yield found, gone
            found, gone = [], []
    if found or gone:
        yield found, gone


def _verify_unlisted(
    client: OAIClient, h: Harvester, store: RecordStore, unlisted: list[str], run_id: str,
    write: Callable[[list[Record]], None], stats: ReconcileStats,
) -> None:
    """Ask for each stored record the list left out before tombstoning it."""
    for found, gone in _fetch(client, h, unlisted):
        kept = [r for r in found if not r.header.deleted
                and in_selection(r.header.set_specs, h.sets)]
        tombs = [r for r in found if r.header.deleted]
        outside = [r.header.identifier for r in found
                   if not r.header.deleted and not in_selection(r.header.set_specs, h.sets)]
        write(kept + tombs)
        stats.kept += len(kept)
        stats.tombstoned += len(tombs)
        if gone:
            stats.tombstoned += store.tombstone_unlisted(h.id, gone, reason=NOT_LISTED,
                                                         run_id=run_id)
        if outside:
            stats.tombstoned += store.tombstone_unlisted(
                h.id, outside, reason=f"{NOT_LISTED} (no longer in the harvester's sets)",
                run_id=run_id)
