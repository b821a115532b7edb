"""Resources: access to the registry and the record store, swapped per deployment."""

from __future__ import annotations

import dagster as dg
from pydantic import Field
from sqlalchemy.engine import Engine

from oaipmh_dagster.storage import db, open_store
from oaipmh_dagster.storage.ports import RecordStore
from oaipmh_dagster.storage.registry import Harvester, HarvesterNotFound, Registry


class OAIPMHDatabase(dg.ConfigurableResource):
    """The database holding the harvester registry and the harvested records."""

    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL; empty: $OAIPMH_DATABASE_URL or the SQLite default.",
    )

    def engine(self) -> Engine:
        """The shared engine, schema up to date."""
        return db.get_engine(self.database_url or None)

    def record_store(self) -> RecordStore:
        """The record store with its harvest state: one per op, whose lease fences its
        own writes."""
        return open_store(self.engine())

    def harvester(self, harvester_id: str) -> Harvester:
        """The harvester's current row: URL, prefix and sets may have changed since the
        code location was loaded. A removed row fails the run clearly."""
        try:
            return Registry(self.engine()).get(harvester_id)
        except HarvesterNotFound as exc:
            raise dg.Failure(
                f"harvester {harvester_id!r} was removed from the registry after this run's "
                "code location was loaded; nothing was harvested"
            ) from exc
