"""A harvester's stored records, selected by the store: by datestamp, set, deleted or
live, identifier, errors; read in batches ordered by identifier (constant memory)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sqlalchemy.engine import Engine

from oaipmh_dagster.storage import open_store
from oaipmh_dagster.storage.ports import Selection

__all__ = ["Selection", "has_records", "select_records"]


def select_records(engine: Engine, harvester_id: str, selection: Selection | None = None,
                   *, with_raw: bool = False, batch: int = 1000) -> Iterator[dict[str, Any]]:
    """The selected records (every one without a selection) as the CLI's JSON objects
    (with `raw_xml` when asked)."""
    return open_store(engine).iter_records(harvester_id, selection, with_raw=with_raw,
                                           batch=batch)


def has_records(engine: Engine, harvester_id: str) -> bool:
    """Whether any record (live or deleted) is stored under `harvester_id`."""
    return open_store(engine).has_records(harvester_id)
