"""The record store as a port: what the harvesting, Dagster and operations layers ask of
it, whatever keeps the records (the SQL `store.Store`, an in-memory one in the tests).

- `HarvestState`: one harvest per harvester at a time (a lease), the checkpoint of the
  last committed page, the selection whose records the store holds; its errors.
- `RecordStore`: the records of every harvester, written a page per transaction
  (`PageWrite`: stored hashes, then the upsert) fenced by the lease of the same store;
  tombstones; counts; the records of a `Selection`, in identifier order.
- The values both speak: the stored datestamp form, column limits, `MetadataUpdate`,
  `SchemaInvalid`, which errors mean a record failed.

A row handed to `PageWrite.upsert` holds every column of a record, its JSON columns
(`WRITE_COLUMNS`) already serialized as JSON text. No Dagster and no SQL here.
"""

from __future__ import annotations

import threading
import types
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from oaipmh_dagster.contracts import SCHEMA_ERROR, SCHEMATRON_ERROR
from oaipmh_dagster.errors import OAIPMHDagsterError

__all__ = [
    "DATESTAMP_MAX", "DATESTAMP_PLACEHOLDER", "IDENTIFIER_MAX", "SCHEMA_ERROR",
    "SCHEMATRON_ERROR", "VALIDATION_ERRORS",
    "WRITE_COLUMNS", "HarvestInProgress", "HarvestState", "IsStale", "LeaseLost",
    "LeaseWaitCancelled", "MetadataUpdate", "PageWrite", "RecordStore", "SchemaInvalid",
    "Selection", "StoreError", "failures", "utc_datestamp",
]

IDENTIFIER_MAX = 1024  # characters of oai_identifier
DATESTAMP_MAX = 32  # characters of datestamp
# Stored for a datestamp that cannot be read: it sorts before every real datestamp.
DATESTAMP_PLACEHOLDER = "0000-01-01T00:00:00Z"
WRITE_COLUMNS = ("sets", "metadata", "errors", "about")  # JSON columns an upsert gets as JSON text
# The error types of a schema violation and of a failed Schematron assertion (the record
# is kept: no failure).
VALIDATION_ERRORS = (SCHEMA_ERROR, SCHEMATRON_ERROR)

# run id of a lease holder -> whether the orchestrator saw that run end
IsStale = Callable[[str | None], bool]


class StoreError(OAIPMHDagsterError, RuntimeError):
    """The store refused an operation."""


class HarvestInProgress(StoreError):
    """Another live harvest of the same harvester holds the lease."""


class LeaseWaitCancelled(HarvestInProgress):
    """The caller cancelled the wait for another harvest's lease."""


class LeaseLost(StoreError):
    """This run's lease was taken over by another run: it must stop without writing."""


def utc_datestamp(dt: datetime) -> str:
    """The store's datestamp form: ISO 8601 UTC to the second with a `Z`."""
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def failures(errors: Sequence[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The errors that mean a record failed: all but schema and Schematron violations."""
    return [e for e in errors or () if not (isinstance(e, dict)
                                             and e.get("type") in VALIDATION_ERRORS)]


@dataclass(frozen=True)
class MetadataUpdate:
    """New metadata (or the errors of a failed transform) of one stored record."""

    identifier: str
    metadata: Any
    errors: list[dict[str, Any]]
    transformed_at: datetime


@dataclass(frozen=True)
class SchemaInvalid:
    """Live records with a schema error: how many, and (identifier, first message) of
    the first few."""

    count: int
    sample: list[tuple[str, str]]


@dataclass(frozen=True)
class Selection:
    """Which records: every given condition must hold (None: any)."""

    since: datetime | None = None
    """Datestamp on or after this instant."""
    set_spec: str | None = None
    """The record's header lists exactly this set."""
    deleted: bool | None = None
    oai_id: str | None = None
    errors_only: bool = False
    """Only records that carry errors (schema violations included)."""


class PageWrite(Protocol):
    """The record writes of one transaction (`RecordStore.page`), stored as given."""

    def hashes(self, identifiers: Sequence[str]) -> dict[str, str | None]:
        """identifier -> stored content hash, for those of `identifiers` that are stored."""
        ...

    def upsert(self, rows: Sequence[dict[str, Any]], *, replacing: int | None = None) -> None:
        """Insert or replace whole rows (JSON columns as text: `WRITE_COLUMNS`);
        `replacing`: how many replace stored rows (None: the rows `hashes` found)."""
        ...

    def live_raw(self, after: str, limit: int) -> list[tuple[str, str | None]]:
        """(identifier, raw XML) of up to `limit` live records after `after`, in order."""
        ...

    def set_metadata(self, updates: Sequence[MetadataUpdate]) -> None:
        """Replace the metadata of stored records; a failed one (errors other than schema
        violations) loses its content hash, so the next harvest writes it again."""
        ...


class HarvestState(Protocol):
    """Per harvester: the lease (one harvest at a time), the checkpoint of the last
    committed page, the selection whose records the store holds. A state row is a dict
    with at least `run_id`, `status`, `checkpoint` and `selection`."""

    def acquire(
        self, harvester_id: str, run_id: str, *, is_stale: IsStale | None = None,
        wait: bool = True, wait_limit: float | None | types.EllipsisType = ...,
        cancel: threading.Event | None = None, logger: Any = None,
    ) -> dict[str, Any] | None:
        """Take the lease for `run_id`, waiting while another live run holds it; return
        the previous run's checkpoint. `HarvestInProgress` when not waiting (or the
        limit runs out), `LeaseWaitCancelled` when `cancel` is set."""
        ...

    def holding(
        self, harvester_id: str, run_id: str, *, is_stale: IsStale | None = None,
        wait: bool = True, wait_limit: float | None | types.EllipsisType = ...,
        cancel: threading.Event | None = None, logger: Any = None,
    ) -> AbstractContextManager[None]:
        """Hold the lease (taken as `acquire` does) for a rewrite of stored records; the
        status and checkpoint stay as they were."""
        ...

    def save_checkpoint(self, harvester_id: str, run_id: str, checkpoint: dict | None) -> None:
        """Record the position of the last committed page (None clears it); `LeaseLost`
        when this store held the run's lease and lost it."""
        ...

    def release(self, harvester_id: str, run_id: str, *, succeeded: bool,
                keep: dict[str, Any] | None = None, selection: str | None = None) -> None:
        """End the lease: a success clears the checkpoint (or leaves `keep`), a failure
        keeps it; `selection` (when given) is recorded. A lost lease changes nothing."""
        ...

    def state(self, harvester_id: str) -> dict[str, Any] | None:
        """The harvest state of a harvester (None before its first harvest)."""
        ...

    def forget(self, harvester_id: str) -> None:
        """Drop the harvester's state: lease, checkpoint and recorded selection."""
        ...

    def selection_changed(self, harvester_id: str, held: str) -> None:
        """The harvester's selection changed: drop the lease (a running harvest stops at
        its next page) and the checkpoint, and record `held` as the selection whose
        records the store holds unless one is recorded already."""
        ...


class RecordStore(HarvestState, Protocol):
    """The records of every harvester; each write is fenced by this store's lease."""

    def page(
        self, harvester_id: str, run_id: str | None, checkpoint: dict[str, Any] | None = None,
    ) -> AbstractContextManager[PageWrite]:
        """One transaction of record writes, committed with `checkpoint` (None keeps the
        saved one); `LeaseLost` (nothing written) when another run took the lease."""
        ...

    def hashes(self, harvester_id: str, identifiers: Sequence[str]) -> dict[str, str | None]:
        """identifier -> stored content hash, for those of `identifiers` that are stored."""
        ...

    def tombstone_unlisted(
        self, harvester_id: str, identifiers: Sequence[str], *, reason: str,
        run_id: str | None, batch: int = 500, location: str = "reconcile",
    ) -> int:
        """Turn these live records into tombstones whose error says why; returns how many
        changed (fenced like a page write). The content hash is cleared."""
        ...

    def delete_harvester_records(self, harvester_id: str) -> int:
        """Remove every record and the state of a harvester; returns the record count."""
        ...

    def table_name(self) -> str:
        """Where the records are, as the data's own system names it."""
        ...

    def has_records(self, harvester_id: str) -> bool:
        """Whether any record (live or deleted) is stored under `harvester_id`."""
        ...

    def count(self, harvester_id: str, *, live_only: bool = True) -> int:
        """Number of records (live ones by default) of a harvester."""
        ...

    def counts(self, harvester_id: str) -> dict[str, int]:
        """`total`, `live`, `deleted` and `failed` record counts of a harvester."""
        ...

    def failed_identifiers(self, harvester_id: str, limit: int | None = 10) -> list[str]:
        """Identifiers of live records whose errors mean they failed (`failures`)."""
        ...

    def schema_invalid(self, harvester_id: str, sample: int = 10) -> SchemaInvalid:
        """Live records with a schema error: the count and the first `sample`."""
        ...

    def iter_records(
        self, harvester_id: str, selection: Selection | None = None, *,
        errors_only: bool = False, with_raw: bool = False, batch: int = 1000,
    ) -> Iterator[dict[str, Any]]:
        """The selected records as the CLI's JSON objects, ordered by identifier, read in
        batches (`errors_only`: as `Selection.errors_only`)."""
        ...

    def iter_live_metadata(self, harvester_id: str, batch: int = 1000) -> Iterator[Any]:
        """The transformed metadata of live records, by identifier."""
        ...

    def iter_live_metadata_every(self, harvester_id: str, step: int,
                                 batch: int = 1000) -> Iterator[Any]:
        """The transformed metadata of the live records among every `step`-th stored
        record by identifier (a systematic sample of about live/step records)."""
        ...

    def snapshot(self, harvester_id: str) -> dict[str, tuple[str, bool, tuple[str, ...]]]:
        """identifier -> (datestamp, deleted, sets) of every record."""
        ...

    def live_identifiers(self, harvester_id: str, batch: int = 5000) -> Iterator[str]:
        """The identifiers of a harvester's live records (streamed)."""
        ...
