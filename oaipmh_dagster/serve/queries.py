"""The provider's reads: harvesters from the registry, records from the store, by SQL.

Records are listed in the order of (harvested_at, harvester_id, oai_identifier), the
hub's own change time first, and paged by keyset: a page starts after the last row of
the one before, so rows written elsewhere in the table never shift a list (migration
0011 indexes both orders the lists take: all harvesters, and one)."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Engine

from oaipmh_dagster.serve.tokens import Position
from oaipmh_dagster.storage.registry import harvester_table
from oaipmh_dagster.storage.store import record_table

_c = record_table.c
_AT = _c.harvested_at.type


@dataclass(frozen=True)
class Source:
    """A registered harvester as the provider sees it: a set, a metadata format."""

    id: str
    name: str
    prefix: str
    sets: tuple[str, ...]


class Row(NamedTuple):
    harvester_id: str
    identifier: str
    harvested_at: datetime
    deleted: bool
    sets: tuple[str, ...]
    raw_xml: str | None


def utc(value: datetime) -> datetime:
    """A datetime read from the database, aware and in UTC (SQLite's are naive UTC)."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def sources(engine: Engine) -> list[Source]:
    """Every registered harvester, ordered by id."""
    h = harvester_table.c
    with engine.connect() as conn:
        rows = conn.execute(sa.select(h.id, h.name, h.metadata_prefix, h.sets)
                            .order_by(h.id)).all()
    out = []
    for hid, name, prefix, sets in rows:
        if isinstance(sets, str):
            sets = json.loads(sets)
        out.append(Source(hid, name or hid, prefix, tuple(sets or ())))
    return out


def _sets(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = json.loads(value)
    return tuple(value or ())


def _has_set(postgres: bool, spec: str) -> sa.ColumnElement[bool]:
    if postgres:
        return _c.sets.op("@>")(sa.cast(sa.literal(json.dumps([spec])), postgresql.JSONB))
    each = sa.func.json_each(_c.sets).table_valued("value")
    return sa.exists().select_from(each).where(each.c.value == spec)


@dataclass(frozen=True)
class Selection:
    """The records of a list: harvesters `ids` (and their source set), changed in
    [lower, upper)."""

    ids: tuple[str, ...]
    source_set: str | None
    lower: datetime | None
    upper: datetime

    def where(self, engine: Engine) -> list[sa.ColumnElement[bool]]:
        if engine.dialect.name == "postgresql":  # one array parameter: see `_prepared`
            harvesters = _c.harvester_id == sa.any_(sa.bindparam(
                "ids", list(self.ids), type_=postgresql.ARRAY(sa.String)))
        elif len(self.ids) == 1:
            harvesters = _c.harvester_id == self.ids[0]
        else:
            harvesters = _c.harvester_id.in_(self.ids)
        where: list[sa.ColumnElement[bool]] = [
            harvesters,
            _c.harvested_at < sa.bindparam("upper", self.upper, type_=_AT)]
        if self.lower is not None:
            where.append(_c.harvested_at >= sa.bindparam("lower", self.lower, type_=_AT))
        if self.source_set is not None:
            where.append(_has_set(engine.dialect.name == "postgresql", self.source_set))
        return where


def _prepared(conn: sa.Connection, stmt: sa.Select) -> list[tuple[Any, ...]]:
    """The rows of `stmt` on PostgreSQL, as a prepared statement with a generic plan.

    With one partition per harvester, planning a list over thousands of harvesters
    costs seconds (2.8 s at 2,000 partitions, against 0.1 s to run it): the plan is
    made once per connection and statement shape, and each page only runs it, its
    partitions pruned when it starts (docs/storage.md, "Thousands of harvesters")."""
    compiled = stmt.compile(dialect=conn.dialect)
    values = compiled.construct_params()
    order: list[str] = []

    def number(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in order:
            order.append(name)
        return f"${order.index(name) + 1}"

    sql = _PLACEHOLDER.sub(number, compiled.string).replace("%%", "%")
    name = "oaipmh_serve_" + hashlib.sha1(sql.encode()).hexdigest()[:16]  # noqa: S324 - a name
    prepared: set[str] = conn.connection.info.setdefault("oaipmh_prepared", set())
    dbapi = conn.connection.driver_connection
    args = [values[n] for n in order]
    execute = f"EXECUTE {name} ({', '.join(['%s'] * len(order))})" if order \
        else f"EXECUTE {name}"
    for attempt in (1, 2):
        cursor = dbapi.cursor()  # type: ignore[union-attr]
        try:
            cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            if name not in prepared:
                cursor.execute(f"PREPARE {name} AS {sql}")
                prepared.add(name)
            cursor.execute(execute, args)
            return list(cursor.fetchall())
        except Exception as exc:
            # Behind a transaction pooler a session may not hold what this connection
            # prepared (26000), or hold it already (42P05): once more, knowing which.
            code = getattr(exc, "pgcode", None)
            if attempt == 2 or code not in ("26000", "42P05"):
                raise
            dbapi.rollback()  # type: ignore[union-attr]
            if code == "26000":
                prepared.discard(name)
            else:
                prepared.add(name)
        finally:
            cursor.close()
    raise AssertionError("unreachable")  # pragma: no cover


_PLACEHOLDER = re.compile(r"%\(([^)]+)\)s")


# From this many harvesters on, a list is read through a prepared statement on
# PostgreSQL. Below, the plain query is planned with only its harvesters' partitions
# (4-8 ms for one); a generic plan locks and starts every partition before it prunes
# (90 ms for one harvester among 2,000 partitions).
PREPARED_FROM = 100


def _rows(engine: Engine, stmt: sa.Select, sel: Selection) -> list[tuple[Any, ...]]:
    """The rows of `stmt` over `sel`: prepared on PostgreSQL when `sel` holds many
    harvesters (`_prepared`, `PREPARED_FROM`), plain otherwise."""
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql" and len(sel.ids) >= PREPARED_FROM:
            dbapi_error = conn.dialect.loaded_dbapi.Error
            try:
                return _prepared(conn, stmt)
            except dbapi_error as exc:
                # A connection whose statement failed forgets what it prepared (the
                # next use prepares again), and the error is SQLAlchemy's, as from any
                # other query (the provider answers 503).
                conn.connection.info.pop("oaipmh_prepared", None)
                raise sa.exc.DBAPIError.instance(str(stmt), None, exc, dbapi_error) from exc
        return [tuple(r) for r in conn.execute(stmt).all()]


def count(engine: Engine, sel: Selection) -> int:
    """How many records the selection holds now."""
    rows = _rows(engine, sa.select(sa.func.count()).select_from(record_table)
                 .where(*sel.where(engine)), sel)
    return int(rows[0][0])


def page(engine: Engine, sel: Selection, after: Position | None, limit: int, *,
         with_raw: bool) -> list[Row]:
    """Up to `limit` records of the selection after `after`, in list order."""
    columns: list[sa.ColumnElement[Any]] = [_c.harvester_id, _c.oai_identifier,
                                            _c.harvested_at, _c.deleted, _c.sets]
    columns.append(_c.raw_xml if with_raw else sa.null())
    where = sel.where(engine)
    if after is not None:
        at = sa.bindparam("after_at", after[0], type_=_AT)
        # The row comparison is the keyset; the plain bound lets the index of one
        # harvester's records (harvester_id, harvested_at, ...) start at the position too.
        where += [sa.tuple_(_c.harvested_at, _c.harvester_id, _c.oai_identifier)
                  > sa.tuple_(at, sa.literal(after[1]), sa.literal(after[2])),
                  _c.harvested_at >= at]
    stmt = (sa.select(*columns).where(*where)
            .order_by(_c.harvested_at, _c.harvester_id, _c.oai_identifier).limit(limit))
    rows = _rows(engine, stmt, sel)
    return [Row(h, i, utc(at_), bool(d), _sets(s), raw) for h, i, at_, d, s, raw in rows]


def record(engine: Engine, harvester_id: str, identifier: str) -> Row | None:
    """One record, None when not stored."""
    with engine.connect() as conn:
        found = conn.execute(
            sa.select(_c.harvester_id, _c.oai_identifier, _c.harvested_at, _c.deleted,
                      _c.sets, _c.raw_xml)
            .where(_c.harvester_id == harvester_id, _c.oai_identifier == identifier)
        ).first()
    if found is None:
        return None
    h, i, at, d, s, raw = found
    return Row(h, i, utc(at), bool(d), _sets(s), raw)


def earliest(engine: Engine) -> datetime | None:
    """The oldest change time in the store (None when it holds no record)."""
    with engine.connect() as conn:
        value = conn.execute(sa.select(sa.func.min(_c.harvested_at))).scalar_one()
    if isinstance(value, str):  # SQLite's min() bypasses the column's type
        value = datetime.fromisoformat(value)
    return None if value is None else utc(value)


def sample_xml(engine: Engine, harvester_ids: Sequence[str]) -> str | None:
    """The stored XML of one live record of the first of `harvester_ids` that has one."""
    with engine.connect() as conn:
        for hid in harvester_ids:
            raw = conn.execute(
                sa.select(_c.raw_xml)
                .where(_c.harvester_id == hid, _c.deleted.is_(False), _c.raw_xml.is_not(None))
                .limit(1)).scalar()
            if raw:
                return str(raw)
    return None
