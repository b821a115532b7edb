"""The record store: one batch upsert per page, tombstones, errors, queries; and the
per-harvester harvest state (a lease so two harvests never interleave, and the
checkpoint of the last committed page)."""

from __future__ import annotations

import json
import os
import re
import socket
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Engine

from oaipmh_dagster import db

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

record_table = sa.Table(
    "oaipmh_record",
    db.metadata,
    sa.Column("harvester_id", sa.String(48), primary_key=True),
    sa.Column("oai_identifier", sa.String(1024), primary_key=True),
    sa.Column("datestamp", sa.String(32), nullable=False),
    sa.Column("deleted", sa.Boolean, nullable=False),
    sa.Column("sets", JSON, nullable=False),
    sa.Column("raw_xml", sa.Text, nullable=True),
    sa.Column("metadata", JSON, nullable=True),
    sa.Column("errors", JSON, nullable=False),
    sa.Column("harvested_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("run_id", sa.String(64), nullable=True),
    sa.Column("transformed_at", sa.DateTime(timezone=True), nullable=True),
)

# The same table for the write path: JSON columns typed as text, because the store
# serializes them itself (caching the few distinct set lists), which halves the cost of
# a page's upsert compared with per-value JSON processing.
_JSON_COLUMNS = ("sets", "metadata", "errors")
_record_write = sa.Table(
    "oaipmh_record",
    sa.MetaData(),
    *(sa.Column(c.name, sa.Text if c.name in _JSON_COLUMNS else c.type,
                primary_key=c.primary_key) for c in record_table.columns),
)
_UPDATED_COLUMNS = ("datestamp", "deleted", "sets", "raw_xml", "metadata", "errors",
                    "harvested_at", "run_id", "transformed_at")
_NO_ERRORS = "[]"

state_table = sa.Table(
    "oaipmh_harvest_state",
    db.metadata,
    sa.Column("harvester_id", sa.String(48), primary_key=True),
    sa.Column("run_id", sa.String(64), nullable=True),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("holder", sa.String(255), nullable=True),
    sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("checkpoint", JSON, nullable=True),
)

# A lease whose holder has not written for this long is taken over.
STALE_AFTER = timedelta(minutes=15)

# (raw XML, the already parsed element or None) -> transformed dict
Transform = Callable[[str, Any], dict[str, Any]]


class HarvestHeader(Protocol):
    identifier: str
    set_specs: tuple[str, ...]
    deleted: bool


class HarvestRecord(Protocol):
    """What the store needs of a harvested record (`oai.Record` fits)."""

    header: Any
    metadata: bytes | None


class StoreError(RuntimeError):
    """The store refused an operation."""


class HarvestInProgress(StoreError):
    """Another harvest of the same harvester holds the lease."""


@dataclass
class PageCounts:
    """What one upsert did."""

    new: int = 0
    updated: int = 0
    deleted: int = 0
    unchanged: int = 0
    failed: int = 0
    failed_ids: list[str] = field(default_factory=list)

    def add(self, other: PageCounts) -> None:
        """Accumulate `other` into this."""
        self.new += other.new
        self.updated += other.updated
        self.deleted += other.deleted
        self.unchanged += other.unchanged
        self.failed += other.failed
        self.failed_ids.extend(other.failed_ids[: max(0, 20 - len(self.failed_ids))])


def utc_datestamp(dt: datetime) -> str:
    """The store's datestamp form: ISO 8601 UTC to the second with a `Z`."""
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


_CANONICAL = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")


def _store_datestamp(header: Any) -> str:
    """The header's datestamp in the store's form (as sent when it already is)."""
    if _CANONICAL.fullmatch(header.datestamp):
        return header.datestamp
    when = header.datestamp_utc
    return utc_datestamp(when) if when is not None else header.datestamp


def _now() -> datetime:
    return datetime.now(UTC)


def _holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _aware(value: datetime | None) -> datetime | None:
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


def _apply_transform(
    transform: Transform | None, raw: str | None, element: Any = None
) -> tuple[Any, list[dict]]:
    if transform is None or raw is None:
        return None, []
    try:
        return transform(raw, element), []
    except Exception as exc:  # noqa: BLE001 - a bad record must not stop the run
        to_dict = getattr(exc, "to_dict", None)
        error = to_dict() if callable(to_dict) else {
            "type": type(exc).__name__,
            "message": str(exc),
            "location": "transform",
        }
        return None, [error]


class Store:
    """Records and harvest state of every harvester, on one engine."""

    def __init__(self, engine: Engine | None = None) -> None:
        self.engine = engine or db.get_engine()
        insert = postgresql.insert if self.engine.dialect.name == "postgresql" else sqlite.insert
        stmt = insert(_record_write)
        self._upsert = stmt.on_conflict_do_update(
            index_elements=[_record_write.c.harvester_id, _record_write.c.oai_identifier],
            set_={c: stmt.excluded[c] for c in _UPDATED_COLUMNS},
        )
        w = _record_write.c
        self._existing = sa.select(w.oai_identifier, w.datestamp, w.deleted, w.errors).where(
            w.harvester_id == sa.bindparam("h"),
            w.oai_identifier.in_(sa.bindparam("ids", expanding=True)),
        )
        self._sets_json: dict[tuple[str, ...], str] = {}

    # -- writes ---------------------------------------------------------------------

    def upsert_page(
        self,
        harvester_id: str,
        records: Sequence[HarvestRecord],
        *,
        run_id: str | None,
        transform: Transform | None = None,
        checkpoint: dict[str, Any] | None = None,
    ) -> PageCounts:
        """Write one page in one transaction: new and changed records are transformed and
        upserted, unchanged ones are left alone; `checkpoint` is saved in the same commit."""
        counts = PageCounts()
        latest: dict[str, HarvestRecord] = {}
        for rec in records:
            latest[rec.header.identifier] = rec  # a page may repeat an identifier
        now = _now()
        dumps = json.dumps
        with self.engine.begin() as conn:
            existing = {}
            if latest:
                rows = conn.execute(self._existing, {"h": harvester_id, "ids": list(latest)})
                existing = {r.oai_identifier: r for r in rows}
            values = []
            for identifier, rec in latest.items():
                header = rec.header
                datestamp = _store_datestamp(header)
                old = existing.get(identifier)
                if (
                    old is not None
                    and old.datestamp == datestamp
                    and bool(old.deleted) == header.deleted
                    and (not old.errors or old.errors == _NO_ERRORS)  # text, or JSON on PG
                ):
                    counts.unchanged += 1
                    continue
                if header.deleted:
                    counts.deleted += 1
                    raw, meta, errors = None, None, []
                else:
                    if old is None:
                        counts.new += 1
                    else:
                        counts.updated += 1
                    raw = rec.metadata.decode("utf-8") if rec.metadata is not None else None
                    meta, errors = _apply_transform(transform, raw,
                                                    getattr(rec, "element", None))
                    if errors:
                        counts.failed += 1
                        if len(counts.failed_ids) < 20:
                            counts.failed_ids.append(identifier)
                specs = tuple(header.set_specs)
                sets_json = self._sets_json.get(specs)
                if sets_json is None:
                    sets_json = self._sets_json[specs] = dumps(list(specs))
                values.append(
                    {
                        "harvester_id": harvester_id,
                        "oai_identifier": identifier,
                        "datestamp": datestamp,
                        "deleted": header.deleted,
                        "sets": sets_json,
                        "raw_xml": raw,
                        "metadata": None if meta is None else dumps(meta, ensure_ascii=False),
                        "errors": dumps(errors) if errors else _NO_ERRORS,
                        "harvested_at": now,
                        "run_id": run_id,
                        "transformed_at": now if transform is not None and raw else None,
                    }
                )
            if values:
                conn.execute(self._upsert, values)
            if checkpoint is not None:
                self._write_checkpoint(conn, harvester_id, run_id, checkpoint)
        return counts

    def retransform(
        self, harvester_id: str, transform: Transform, *, run_id: str | None, batch: int = 500
    ) -> PageCounts:
        """Transform every stored live record of a harvester again from its raw XML."""
        counts = PageCounts()
        last = ""
        while True:
            with self.engine.begin() as conn:
                rows = conn.execute(
                    sa.select(record_table.c.oai_identifier, record_table.c.raw_xml)
                    .where(
                        record_table.c.harvester_id == harvester_id,
                        record_table.c.deleted.is_(False),
                        record_table.c.oai_identifier > last,
                    )
                    .order_by(record_table.c.oai_identifier)
                    .limit(batch)
                ).all()
                if not rows:
                    return counts
                now = _now()
                updates = []
                for identifier, raw in rows:
                    meta, errors = _apply_transform(transform, raw)
                    if errors:
                        counts.failed += 1
                        if len(counts.failed_ids) < 20:
                            counts.failed_ids.append(identifier)
                    else:
                        counts.updated += 1
                    updates.append(
                        {"h": harvester_id, "i": identifier, "m": meta, "e": errors, "t": now}
                    )
                conn.execute(
                    record_table.update()
                    .where(
                        record_table.c.harvester_id == sa.bindparam("h"),
                        record_table.c.oai_identifier == sa.bindparam("i"),
                    )
                    .values(metadata=sa.bindparam("m"), errors=sa.bindparam("e"),
                            transformed_at=sa.bindparam("t")),
                    updates,
                )
                last = rows[-1][0]

    def delete_harvester_records(self, harvester_id: str) -> int:
        """Remove every record and the state of a harvester; returns the record count."""
        with self.engine.begin() as conn:
            n = conn.execute(
                record_table.delete().where(record_table.c.harvester_id == harvester_id)
            ).rowcount
            conn.execute(state_table.delete().where(state_table.c.harvester_id == harvester_id))
        return n

    # -- reads ----------------------------------------------------------------------

    def count(self, harvester_id: str, *, live_only: bool = True) -> int:
        """Number of records (live ones by default) of a harvester."""
        q = sa.select(sa.func.count()).select_from(record_table).where(
            record_table.c.harvester_id == harvester_id
        )
        if live_only:
            q = q.where(record_table.c.deleted.is_(False))
        with self.engine.connect() as conn:
            return int(conn.execute(q).scalar_one())

    def counts(self, harvester_id: str) -> dict[str, int]:
        """Live, deleted and failed record counts of a harvester."""
        c = record_table.c
        q = sa.select(
            sa.func.count(),
            sa.func.sum(sa.case((c.deleted.is_(True), 1), else_=0)),
        ).where(c.harvester_id == harvester_id)
        with self.engine.connect() as conn:
            total, deleted = conn.execute(q).one()
        deleted = int(deleted or 0)
        return {
            "total": int(total),
            "live": int(total) - deleted,
            "deleted": deleted,
            "failed": len(self.failed_identifiers(harvester_id, limit=None)),
        }

    def failed_identifiers(self, harvester_id: str, limit: int | None = 10) -> list[str]:
        """Identifiers of records that carry errors."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(record_table.c.oai_identifier, record_table.c.errors)
                .where(record_table.c.harvester_id == harvester_id,
                       record_table.c.deleted.is_(False))
                .order_by(record_table.c.oai_identifier)
            )
            out = []
            for identifier, errors in rows:
                if errors:
                    out.append(identifier)
                    if limit is not None and len(out) >= limit:
                        break
            return out

    def iter_records(
        self, harvester_id: str, *, errors_only: bool = False, with_raw: bool = False,
        batch: int = 1000,
    ) -> Iterator[dict[str, Any]]:
        """Every record of a harvester as the CLI's JSON objects, ordered by identifier,
        read in batches (constant memory)."""
        c = record_table.c
        cols = [c.oai_identifier, c.datestamp, c.deleted, c.sets, c.metadata, c.errors,
                c.harvested_at, c.run_id]
        if with_raw:
            cols.append(c.raw_xml)
        last = ""
        while True:
            q = (sa.select(*cols)
                 .where(c.harvester_id == harvester_id, c.oai_identifier > last)
                 .order_by(c.oai_identifier).limit(batch))
            with self.engine.connect() as conn:
                rows = conn.execute(q).mappings().all()
            if not rows:
                return
            for row in rows:
                if errors_only and not row["errors"]:
                    continue
                item = {
                    "oai_identifier": row["oai_identifier"],
                    "datestamp": row["datestamp"],
                    "deleted": bool(row["deleted"]),
                    "sets": list(row["sets"] or []),
                    "metadata": None if row["deleted"] else row["metadata"],
                    "errors": list(row["errors"] or []),
                    "harvested_at": utc_datestamp(_aware(row["harvested_at"])),
                    "run_id": row["run_id"],
                }
                if with_raw:
                    item["raw_xml"] = row["raw_xml"]
                yield item
            last = rows[-1]["oai_identifier"]

    def snapshot(self, harvester_id: str) -> dict[str, tuple[str, bool, tuple[str, ...]]]:
        """identifier -> (datestamp, deleted, sets): for comparing with a server's data."""
        c = record_table.c
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(c.oai_identifier, c.datestamp, c.deleted, c.sets).where(
                    c.harvester_id == harvester_id
                )
            )
            return {r[0]: (r[1], bool(r[2]), tuple(r[3] or ())) for r in rows}

    # -- lease and checkpoint ---------------------------------------------------------

    def acquire(
        self, harvester_id: str, run_id: str, *, is_stale: Callable[[str | None], bool] | None = None
    ) -> dict[str, Any] | None:
        """Take the harvester's lease for `run_id`; return the previous run's checkpoint
        (None when there is none). Raise `HarvestInProgress` while another live run holds
        it. A holder is dead when its process on this host is gone, when `is_stale(run_id)`
        says so (the orchestrator knows the run ended), or after `STALE_AFTER` silence."""
        now = _now()
        with self.engine.begin() as conn:
            if self.engine.dialect.name == "postgresql":
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(hashtext(:h))"),
                             {"h": harvester_id})
            row = conn.execute(
                sa.select(state_table).where(state_table.c.harvester_id == harvester_id)
            ).mappings().first()
            if row is None:
                try:
                    conn.execute(state_table.insert().values(
                        harvester_id=harvester_id, run_id=run_id, status="running",
                        holder=_holder(), started_at=now, heartbeat_at=now, checkpoint=None,
                    ))
                except sa.exc.IntegrityError as exc:
                    raise HarvestInProgress(
                        f"harvester {harvester_id!r} was taken by another harvest just now"
                    ) from exc
                return None
            if row["status"] == "running" and row["run_id"] != run_id and not self._dead(
                row, is_stale
            ):
                raise HarvestInProgress(
                    f"harvester {harvester_id!r} is being harvested by run {row['run_id']} "
                    f"({row['holder']}, since {utc_datestamp(_aware(row['started_at']))}); "
                    "one harvest per harvester at a time"
                )
            result = conn.execute(
                state_table.update()
                .where(state_table.c.harvester_id == harvester_id,
                       state_table.c.started_at == row["started_at"],
                       state_table.c.status == row["status"])
                .values(run_id=run_id, status="running", holder=_holder(),
                        started_at=now, heartbeat_at=now)
            )
            if result.rowcount != 1:
                raise HarvestInProgress(
                    f"harvester {harvester_id!r} was taken by another harvest just now"
                )
            return row["checkpoint"]

    @staticmethod
    def _dead(row: Any, is_stale: Callable[[str | None], bool] | None) -> bool:
        host, _, pid = (row["holder"] or "").rpartition(":")
        if host == socket.gethostname() and pid.isdigit():
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                return True
            except PermissionError:
                pass
        if is_stale is not None and is_stale(row["run_id"]):
            return True
        beat = _aware(row["heartbeat_at"])
        return beat is None or _now() - beat > STALE_AFTER

    def _write_checkpoint(
        self, conn: sa.Connection, harvester_id: str, run_id: str | None, checkpoint: dict
    ) -> None:
        conn.execute(
            state_table.update()
            .where(state_table.c.harvester_id == harvester_id, state_table.c.run_id == run_id)
            .values(checkpoint=checkpoint, heartbeat_at=_now())
        )

    def save_checkpoint(self, harvester_id: str, run_id: str, checkpoint: dict | None) -> None:
        """Record the position of the last committed page (None clears it)."""
        with self.engine.begin() as conn:
            self._write_checkpoint(conn, harvester_id, run_id, checkpoint)

    def release(self, harvester_id: str, run_id: str, *, succeeded: bool) -> None:
        """End the lease: a success clears the checkpoint, a failure keeps it."""
        values: dict[str, Any] = {"status": "succeeded" if succeeded else "failed",
                                  "heartbeat_at": _now()}
        if succeeded:
            values["checkpoint"] = None
        with self.engine.begin() as conn:
            conn.execute(
                state_table.update()
                .where(state_table.c.harvester_id == harvester_id,
                       state_table.c.run_id == run_id)
                .values(**values)
            )

    def state(self, harvester_id: str) -> dict[str, Any] | None:
        """The harvest state row of a harvester (None before its first harvest)."""
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(state_table).where(state_table.c.harvester_id == harvester_id)
            ).mappings().first()
        return dict(row) if row else None
