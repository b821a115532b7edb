"""A harvester's stored records, selected in the database: by datestamp, set, deleted or
live, identifier, errors; read in batches ordered by identifier (constant memory)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Engine

from oaipmh_dagster.storage.store import Store, record_table, utc_datestamp

__all__ = ["Selection", "has_records", "select_records"]


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


def _has_set(engine: Engine, spec: str) -> sa.ColumnElement[bool]:
    c = record_table.c
    if engine.dialect.name == "postgresql":
        return c.sets.op("@>")(sa.cast(sa.literal(json.dumps([spec])), postgresql.JSONB))
    each = sa.func.json_each(c.sets).table_valued("value")
    return sa.exists().select_from(each).where(each.c.value == spec)


def _where(engine: Engine, sel: Selection) -> list[sa.ColumnElement[bool]]:
    """The selection's conditions beyond the harvester."""
    c = record_table.c
    where: list[sa.ColumnElement[bool]] = []
    if sel.since is not None:
        where.append(c.datestamp >= utc_datestamp(sel.since))  # the stored form sorts
    if sel.set_spec is not None:
        where.append(_has_set(engine, sel.set_spec))
    if sel.deleted is not None:
        where.append(c.deleted.is_(sel.deleted))
    if sel.oai_id is not None:
        where.append(c.oai_identifier == sel.oai_id)
    return where


def select_records(engine: Engine, harvester_id: str, selection: Selection = Selection(), *,
                   with_raw: bool = False, batch: int = 1000) -> Iterator[dict[str, Any]]:
    """The selected records as the CLI's JSON objects (with `raw_xml` when asked)."""
    return Store(engine).iter_records(
        harvester_id, errors_only=selection.errors_only, with_raw=with_raw, batch=batch,
        where=_where(engine, selection))


def has_records(engine: Engine, harvester_id: str) -> bool:
    """Whether any record (live or deleted) is stored under `harvester_id`."""
    query = sa.select(sa.literal(1)).select_from(record_table).where(
        record_table.c.harvester_id == harvester_id).limit(1)
    with engine.connect() as conn:
        return conn.execute(query).first() is not None
