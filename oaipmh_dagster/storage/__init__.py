"""The database: engine and migrations, the harvester registry, the record store, the
lease and checkpoint (no Dagster import).

`ports` says what a record store is; `open_store` is the one place that picks the
implementation (the SQL `store.Store`), so no other module names it."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from oaipmh_dagster.storage.ports import RecordStore


def open_store(engine: Engine | None = None) -> RecordStore:
    """The record store (with its harvest state) on `engine` (None: the configured
    database). One per harvest: the lease it takes fences its own writes only."""
    from oaipmh_dagster.storage.store import Store

    return Store(engine)
