"""A harvester's stored records, selected in the database: by datestamp, set, deleted or
live, identifier, errors; read in batches ordered by identifier (constant memory)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Engine

from oaipmh_dagster.store import record_table, utc_datestamp

__all__ = ["Selection", "select_records"]


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


def _where(engine: Engine, harvester_id: str, sel: Selection) -> list[sa.ColumnElement[bool]]:
    c = record_table.c
    where = [c.harvester_id == harvester_id]
    if sel.since is not None:
        where.append(c.datestamp >= utc_datestamp(sel.since))  # the stored form sorts
    if sel.set_spec is not None:
        where.append(_has_set(engine, sel.set_spec))
    if sel.deleted is not None:
        where.append(c.deleted.is_(sel.deleted))
    if sel.oai_id is not None:
        where.append(c.oai_identifier == sel.oai_id)
    return where


def _utc(value: datetime) -> str:
    return utc_datestamp(value.replace(tzinfo=UTC) if value.tzinfo is None else value)


def select_records(engine: Engine, harvester_id: str, selection: Selection = Selection(), *,
                   with_raw: bool = False, batch: int = 1000) -> Iterator[dict[str, Any]]:
    """The selected records as the CLI's JSON objects (with `raw_xml` when asked)."""
    c = record_table.c
    cols = [c.oai_identifier, c.datestamp, c.deleted, c.sets, c.metadata, c.errors,
            c.harvested_at, c.run_id]
    if with_raw:
        cols.append(c.raw_xml)
    where = _where(engine, harvester_id, selection)
    last = ""
    while True:
        q = (sa.select(*cols).where(*where, c.oai_identifier > last)
             .order_by(c.oai_identifier).limit(batch))
        with engine.connect() as conn:
            rows = conn.execute(q).mappings().all()
        if not rows:
            return
        for row in rows:
            if selection.errors_only and not row["errors"]:
                continue
            item = {
                "oai_identifier": row["oai_identifier"],
                "datestamp": row["datestamp"],
                "deleted": bool(row["deleted"]),
                "sets": list(row["sets"] or []),
                "metadata": None if row["deleted"] else row["metadata"],
                "errors": list(row["errors"] or []),
                "harvested_at": _utc(row["harvested_at"]),
                "run_id": row["run_id"],
            }
            if with_raw:
                item["raw_xml"] = row["raw_xml"]
            yield item
        last = rows[-1]["oai_identifier"]
