"""A `RecordStore` (with its `HarvestState`) in dicts, for tests that need no database.

The same semantics as the SQL store (`storage/store.py`), checked by
`storage/test_store_contract.py` against both: content hashes, whole-row upserts, a page
committed whole or not at all with its checkpoint, tombstones, counts, selections in
identifier order; a lease per harvester that fences writes (`LeaseLost`), waits while a
live run holds it (`HarvestInProgress`, `LeaseWaitCancelled`) and is taken over from a
run the orchestrator says has ended (`is_stale`). Holders live in this process, so a
holder is dead only by `is_stale`. `MemoryStore.sharing(other)` is another store on the
same data (another process, as the SQL store's second `Store(engine)` is).
"""

from __future__ import annotations

import json
import threading
import time
import types
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from oaipmh_dagster.storage.ports import (
    VALIDATION_ERRORS,
    WRITE_COLUMNS,
    HarvestInProgress,
    IsStale,
    LeaseLost,
    LeaseWaitCancelled,
    MetadataUpdate,
    SchemaInvalid,
    Selection,
    failures,
    utc_datestamp,
)

__all__ = ["MemoryStore"]

_KEEP: Any = object()


@dataclass
class _Data:
    """What every store sharing it sees: records by harvester, state rows, one lock."""

    records: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    states: dict[str, dict[str, Any]] = field(default_factory=dict)
    lock: threading.Condition = field(default_factory=threading.Condition)


def _decoded(row: dict[str, Any]) -> dict[str, Any]:
    """An upserted row as stored: its JSON text columns decoded."""
    out = dict(row)
    for name in WRITE_COLUMNS:
        value = out.get(name)
        out[name] = json.loads(value) if isinstance(value, str) else value
    return out


class _Page:
    """The writes of one page: applied to the store only when the page commits."""

    def __init__(self, store: MemoryStore, harvester_id: str) -> None:
        self.store, self.harvester_id = store, harvester_id
        self.pending: dict[str, dict[str, Any]] = {}

    def _row(self, identifier: str) -> dict[str, Any] | None:
        if identifier in self.pending:
            return self.pending[identifier]
        return self.store._rows(self.harvester_id).get(identifier)

    def hashes(self, identifiers: Sequence[str]) -> dict[str, str | None]:
        with self.store._data.lock:
            return {i: row["content_hash"] for i in identifiers
                    if (row := self._row(i)) is not None}

    def upsert(self, rows: Sequence[dict[str, Any]], *, replacing: int | None = None) -> None:
        for row in rows:
            self.pending[row["oai_identifier"]] = _decoded(row)

    def live_raw(self, after: str, limit: int) -> list[tuple[str, str | None]]:
        with self.store._data.lock:
            ids = sorted(set(self.store._rows(self.harvester_id)) | set(self.pending))
            rows = [(i, row) for i in ids if i > after
                    and (row := self._row(i)) is not None and not row["deleted"]]
        return [(i, row["raw_xml"]) for i, row in rows[:limit]]

    def set_metadata(self, updates: Sequence[MetadataUpdate]) -> None:
        with self.store._data.lock:
            for u in updates:
                row = self._row(u.identifier)
                if row is None:
                    continue
                self.pending[u.identifier] = {
                    **row, "metadata": u.metadata, "errors": u.errors,
                    "transformed_at": u.transformed_at,
                    "content_hash": None if failures(u.errors) else row["content_hash"]}


@dataclass
class _Lease:
    harvester_id: str
    run_id: str
    token: str
    previous_status: str | None
    lost: bool = False


class MemoryStore:
    """Records and harvest state of every harvester, in dicts (see the module)."""

    def __init__(self, *, poll_every: float = 0.01, data: _Data | None = None) -> None:
        self._data = data or _Data()
        self.poll_every = poll_every
        self._held: dict[tuple[str, str], _Lease] = {}

    @classmethod
    def sharing(cls, other: MemoryStore, **kw: Any) -> MemoryStore:
        """Another store on `other`'s data, holding leases of its own."""
        return cls(data=other._data, **kw)

    def _rows(self, harvester_id: str) -> dict[str, dict[str, Any]]:
        return self._data.records.setdefault(harvester_id, {})

    def _sorted(self, harvester_id: str) -> list[dict[str, Any]]:
        with self._data.lock:
            rows = self._rows(harvester_id)
            return [rows[i] for i in sorted(rows)]

    def _live(self, harvester_id: str) -> list[dict[str, Any]]:
        return [r for r in self._sorted(harvester_id) if not r["deleted"]]

    # -- the lease ------------------------------------------------------------------------

    def _fence(self, lease: _Lease | None, harvester_id: str, run_id: str | None,
               checkpoint: Any) -> None:
        """Under the lock: confirm `lease` (saving `checkpoint` unless `_KEEP`), or save an
        unleased run's checkpoint; `LeaseLost` when the lease was taken over."""
        row = self._data.states.get(harvester_id)
        if lease is None:
            if checkpoint is not _KEEP and row is not None and row["run_id"] == run_id:
                row.update(checkpoint=checkpoint, heartbeat_at=datetime.now(UTC))
            return
        if (lease.lost or row is None or row["lease"] != lease.token
                or row["status"] != "running"):
            lease.lost = True
            by = f"run {row['run_id']}" if row else "nobody"
            raise LeaseLost(f"run {lease.run_id} no longer holds the lease of harvester "
                            f"{harvester_id!r} (now held by {by}): stopped without writing")
        row["heartbeat_at"] = datetime.now(UTC)
        if checkpoint is not _KEEP:
            row["checkpoint"] = checkpoint

    def _take(self, harvester_id: str, run_id: str, is_stale: IsStale | None
              ) -> tuple[_Lease, dict | None] | dict[str, Any]:
        """Under the lock: the lease taken (and the checkpoint), or the live holder's row."""
        row = self._data.states.get(harvester_id)
        if (row is not None and row["status"] == "running" and row["run_id"] != run_id
                and not (is_stale is not None and is_stale(row["run_id"]))):
            return row
        now, token = datetime.now(UTC), uuid.uuid4().hex
        previous = None if row is None else row["status"]
        if row is None:
            row = self._data.states[harvester_id] = {
                "harvester_id": harvester_id, "checkpoint": None, "selection": None}
        row.update(run_id=run_id, status="running", holder="memory", started_at=now,
                   heartbeat_at=now, lease=token)
        for key, other in list(self._held.items()):
            if key[0] == harvester_id:
                other.lost = True
        lease = _Lease(harvester_id, run_id, token, previous)
        self._held[(harvester_id, run_id)] = lease
        return lease, row["checkpoint"]

    def _acquire(self, harvester_id: str, run_id: str, is_stale: IsStale | None, wait: bool,
                 wait_limit: float | None | types.EllipsisType,
                 cancel: threading.Event | None) -> tuple[_Lease, dict | None]:
        limit = None if wait_limit is ... else wait_limit
        deadline = None if limit is None else time.monotonic() + limit
        with self._data.lock:
            while True:
                taken = self._take(harvester_id, run_id, is_stale)
                if isinstance(taken, tuple):
                    return taken
                if not wait or (deadline is not None and time.monotonic() >= deadline):
                    raise HarvestInProgress(
                        f"harvester {harvester_id!r} is being harvested by run "
                        f"{taken['run_id']}; one harvest per harvester at a time")
                if cancel is not None and cancel.is_set():
                    raise LeaseWaitCancelled(f"stopped waiting for the lease of harvester "
                                             f"{harvester_id!r}: cancelled")
                self._data.lock.wait(self.poll_every)

    def acquire(
        self, harvester_id: str, run_id: str, *, is_stale: IsStale | None = None,
        wait: bool = True, wait_limit: float | None | types.EllipsisType = ...,
        cancel: threading.Event | None = None, logger: Any = None,
    ) -> dict[str, Any] | None:
        return self._acquire(harvester_id, run_id, is_stale, wait, wait_limit, cancel)[1]

    @contextmanager
    def holding(
        self, harvester_id: str, run_id: str, *, is_stale: IsStale | None = None,
        wait: bool = True, wait_limit: float | None | types.EllipsisType = ...,
        cancel: threading.Event | None = None, logger: Any = None,
    ) -> Iterator[None]:
        lease, _ = self._acquire(harvester_id, run_id, is_stale, wait, wait_limit, cancel)
        try:
            yield
        finally:
            self._release(harvester_id, run_id, lease.previous_status or "idle",
                          clear=False)

    def save_checkpoint(self, harvester_id: str, run_id: str, checkpoint: dict | None) -> None:
        with self._data.lock:
            self._fence(self._held.get((harvester_id, run_id)), harvester_id, run_id,
                        checkpoint)

    def _release(self, harvester_id: str, run_id: str, status: str, *, clear: bool,
                 restore: dict[str, Any] | None = None, selection: str | None = None) -> None:
        with self._data.lock:
            lease = self._held.pop((harvester_id, run_id), None)
            row = self._data.states.get(harvester_id)
            if lease is not None and (lease.lost or row is None or row["lease"] != lease.token
                                      or row["status"] != "running"):
                return
            if row is None or (lease is None and row["run_id"] != run_id):
                return
            row.update(status=status, heartbeat_at=datetime.now(UTC))
            if clear:
                row["checkpoint"] = restore
            if selection is not None:
                row["selection"] = selection
            self._data.lock.notify_all()

    def release(self, harvester_id: str, run_id: str, *, succeeded: bool,
                keep: dict[str, Any] | None = None, selection: str | None = None) -> None:
        self._release(harvester_id, run_id, "succeeded" if succeeded else "failed",
                      clear=succeeded, restore=keep, selection=selection)

    def state(self, harvester_id: str) -> dict[str, Any] | None:
        with self._data.lock:
            row = self._data.states.get(harvester_id)
            return dict(row) if row is not None else None

    def forget(self, harvester_id: str) -> None:
        with self._data.lock:
            self._data.states.pop(harvester_id, None)
            self._data.lock.notify_all()

    def selection_changed(self, harvester_id: str, held: str) -> None:
        with self._data.lock:
            row = self._data.states.setdefault(
                harvester_id, {"harvester_id": harvester_id, "started_at": None,
                               "heartbeat_at": None, "selection": None})
            row.update(status="idle", lease=None, checkpoint=None, run_id=None, holder=None,
                       selection=row["selection"] or held)
            self._data.lock.notify_all()

    # -- writes ---------------------------------------------------------------------------

    @contextmanager
    def page(self, harvester_id: str, run_id: str | None,
             checkpoint: dict[str, Any] | None = None) -> Iterator[_Page]:
        lease = None if run_id is None else self._held.get((harvester_id, run_id))
        with self._data.lock:
            self._fence(lease, harvester_id, run_id, _KEEP)
        page = _Page(self, harvester_id)
        yield page
        with self._data.lock:
            self._fence(lease, harvester_id, run_id,
                        _KEEP if checkpoint is None else checkpoint)
            self._rows(harvester_id).update(page.pending)

    def hashes(self, harvester_id: str, identifiers: Sequence[str]) -> dict[str, str | None]:
        return _Page(self, harvester_id).hashes(identifiers)

    def tombstone_unlisted(
        self, harvester_id: str, identifiers: Sequence[str], *, reason: str,
        run_id: str | None, batch: int = 500, location: str = "reconcile",
    ) -> int:
        lease = None if run_id is None else self._held.get((harvester_id, run_id))
        error = [{"type": "not_listed", "message": reason, "location": location}]
        ids = list(dict.fromkeys(identifiers))
        changed = 0
        for i in range(0, len(ids), batch):
            with self._data.lock:
                self._fence(lease, harvester_id, run_id, _KEEP)
                rows = self._rows(harvester_id)
                for identifier in ids[i:i + batch]:
                    row = rows.get(identifier)
                    if row is None or row["deleted"]:
                        continue
                    row.update(deleted=True, raw_xml=None, metadata=None, about=None, errors=error,
                               harvested_at=datetime.now(UTC), run_id=run_id,
                               transformed_at=None, content_hash=None)
                    changed += 1
        return changed

    def delete_harvester_records(self, harvester_id: str) -> int:
        with self._data.lock:
            self._data.states.pop(harvester_id, None)
            return len(self._data.records.pop(harvester_id, {}))

    # -- reads ----------------------------------------------------------------------------

    def table_name(self) -> str:
        return "memory.oaipmh_record"

    def has_records(self, harvester_id: str) -> bool:
        with self._data.lock:
            return bool(self._data.records.get(harvester_id))

    def count(self, harvester_id: str, *, live_only: bool = True) -> int:
        rows = self._sorted(harvester_id)
        return sum(1 for r in rows if not (live_only and r["deleted"]))

    def counts(self, harvester_id: str) -> dict[str, int]:
        rows = self._sorted(harvester_id)
        deleted = sum(1 for r in rows if r["deleted"])
        return {"total": len(rows), "live": len(rows) - deleted, "deleted": deleted,
                "failed": len(self.failed_identifiers(harvester_id, limit=None))}

    def failed_identifiers(self, harvester_id: str, limit: int | None = 10) -> list[str]:
        out = [r["oai_identifier"] for r in self._live(harvester_id) if failures(r["errors"])]
        return out if limit is None else out[:limit]

    def schema_invalid(self, harvester_id: str, sample: int = 10) -> SchemaInvalid:
        invalid = [r for r in self._live(harvester_id)
                   if any(e.get("type") in VALIDATION_ERRORS for e in r["errors"] or ())]
        first = []
        for row in invalid[:sample]:
            error = next(e for e in row["errors"] if e.get("type") in VALIDATION_ERRORS)
            violations = error.get("violations") or []
            first.append((row["oai_identifier"], violations[0]["message"] if violations
                          else error.get("message", "")))
        return SchemaInvalid(len(invalid), first)

    def iter_records(
        self, harvester_id: str, selection: Selection | None = None, *,
        errors_only: bool = False, with_raw: bool = False, batch: int = 1000,
    ) -> Iterator[dict[str, Any]]:
        sel = selection or Selection()
        since = None if sel.since is None else utc_datestamp(sel.since)
        for row in self._sorted(harvester_id):
            if ((errors_only or sel.errors_only) and not row["errors"]
                    or since is not None and row["datestamp"] < since
                    or sel.set_spec is not None and sel.set_spec not in (row["sets"] or [])
                    or sel.deleted is not None and bool(row["deleted"]) != sel.deleted
                    or sel.oai_id is not None and row["oai_identifier"] != sel.oai_id):
                continue
            yield _item(row, with_raw)

    def iter_live_metadata(self, harvester_id: str, batch: int = 1000) -> Iterator[Any]:
        for row in self._live(harvester_id):
            yield row["metadata"]

    def iter_live_metadata_every(self, harvester_id: str, step: int,
                                 batch: int = 1000) -> Iterator[Any]:
        for row in self._sorted(harvester_id)[::step]:
            if not row["deleted"]:
                yield row["metadata"]

    def snapshot(self, harvester_id: str) -> dict[str, tuple[str, bool, tuple[str, ...]]]:
        return {r["oai_identifier"]: (r["datestamp"], bool(r["deleted"]), tuple(r["sets"] or ()))
                for r in self._sorted(harvester_id)}

    def live_identifiers(self, harvester_id: str, batch: int = 5000) -> Iterator[str]:
        for row in self._live(harvester_id):
            yield row["oai_identifier"]


def _item(row: dict[str, Any], with_raw: bool) -> dict[str, Any]:
    """A stored row as the CLI's JSON object."""
    item = {
        "oai_identifier": row["oai_identifier"],
        "datestamp": row["datestamp"],
        "deleted": bool(row["deleted"]),
        "sets": list(row["sets"] or []),
        "metadata": None if row["deleted"] else row["metadata"],
        "errors": list(row["errors"] or []),
        "harvested_at": utc_datestamp(row["harvested_at"]),
        "run_id": row["run_id"],
    }
    if with_raw:
        item["raw_xml"] = row["raw_xml"]
        item["about"] = list(row.get("about") or [])
    return item
