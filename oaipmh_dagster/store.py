"""The record store: one batch upsert per page, tombstones, errors, queries; and the
per-harvester harvest state (a lease so two harvests never interleave, and the
checkpoint of the last committed page: see `lease`).

Records converge by content: each row keeps a hash of what was harvested (datestamp,
deletion, sets, raw metadata, and the metadata prefix and transformer that produced the
stored metadata), so a change that keeps its datestamp is still rewritten. One record's
bad value costs only that record: the same column limits hold on every database."""

from __future__ import annotations

import hashlib
import json
import re
import threading
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Engine

from oaipmh_dagster import db
from oaipmh_dagster.lease import (
    HEARTBEAT_EVERY,
    KEEP,
    POLL_EVERY,
    STALE_AFTER,
    HarvestInProgress,
    IsStale,
    Lease,
    LeaseLost,
    Leases,
    LeaseWaitCancelled,
    StoreError,
    state_table,
)

__all__ = [
    "DATESTAMP_PLACEHOLDER", "IDENTIFIER_MAX", "STALE_AFTER", "HarvestInProgress",
    "Counts", "LeaseLost", "LeaseWaitCancelled", "Store", "StoreError", "record_table",
    "state_table", "utc_datestamp",
]

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

IDENTIFIER_MAX = 1024  # characters of oai_identifier
DATESTAMP_MAX = 32  # characters of datestamp
# Stored for a datestamp that cannot be read: it sorts before every real datestamp.
DATESTAMP_PLACEHOLDER = "0000-01-01T00:00:00Z"
_SHOWN = 100  # characters of a bad value quoted in counts and errors

record_table = sa.Table(
    "oaipmh_record",
    db.metadata,
    sa.Column("harvester_id", sa.String(48), primary_key=True),
    sa.Column("oai_identifier", sa.String(IDENTIFIER_MAX), primary_key=True),
    sa.Column("datestamp", sa.String(DATESTAMP_MAX), nullable=False),
    sa.Column("deleted", sa.Boolean, nullable=False),
    sa.Column("sets", JSON, nullable=False),
    sa.Column("raw_xml", sa.Text, nullable=True),
    sa.Column("metadata", JSON, nullable=True),
    sa.Column("errors", JSON, nullable=False),
    sa.Column("harvested_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("run_id", sa.String(64), nullable=True),
    sa.Column("transformed_at", sa.DateTime(timezone=True), nullable=True),
    # NULL: unknown (rows from before 0004, failed transforms): rewritten next time.
    sa.Column("content_hash", sa.String(32), nullable=True),
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
                    "harvested_at", "run_id", "transformed_at", "content_hash")
_NO_ERRORS = "[]"

# (raw XML, the already parsed element or None) -> transformed dict
Transform = Callable[[str, Any], dict[str, Any]]


class HarvestRecord(Protocol):
    """What the store needs of a harvested record (`oai.Record` fits)."""

    header: Any
    metadata: bytes | None


@dataclass
class Counts:
    """What writes did to records: of a page, a re-transform or a whole harvest."""

    new: int = 0
    updated: int = 0
    deleted: int = 0
    unchanged: int = 0
    failed: int = 0
    failed_ids: list[str] = field(default_factory=list)  # the first 20

    @property
    def records(self) -> int:
        """Records written or found unchanged."""
        return self.new + self.updated + self.deleted + self.unchanged

    def add(self, other: Counts) -> None:
        """Accumulate `other` into this."""
        self.new += other.new
        self.updated += other.updated
        self.deleted += other.deleted
        self.unchanged += other.unchanged
        self.failed += other.failed
        self.failed_ids.extend(other.failed_ids[: max(0, 20 - len(self.failed_ids))])

    def fail(self, identifier: str) -> None:
        """Count one failed record and name it (the first 20)."""
        self.failed += 1
        if len(self.failed_ids) < 20:
            self.failed_ids.append(identifier)


def utc_datestamp(dt: datetime) -> str:
    """The store's datestamp form: ISO 8601 UTC to the second with a `Z`."""
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


_CANONICAL = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")


def _shown(value: str) -> str:
    """A value short enough to quote in counts and messages."""
    if len(value) <= _SHOWN:
        return value
    return f"{value[:_SHOWN]}... ({len(value)} characters)"


def _store_datestamp(header: Any) -> tuple[str, list[dict[str, str]]]:
    """The header's datestamp in the store's form (as sent when it already is), or the
    placeholder and an error when it cannot be read."""
    raw = header.datestamp or ""
    if _CANONICAL.fullmatch(raw):
        return raw, []
    when = header.datestamp_utc
    if when is not None:
        value = utc_datestamp(when)
        if len(value) <= DATESTAMP_MAX:
            return value, []
    return DATESTAMP_PLACEHOLDER, [{
        "type": "datestamp",
        "message": f"unreadable datestamp {_shown(raw)!r}; stored as {DATESTAMP_PLACEHOLDER}",
        "location": "header",
    }]


def _parse_error(rec: Any) -> list[dict[str, Any]]:
    """The error the page parse attached to a record whose metadata it could not read."""
    error = getattr(rec, "parse_error", None)
    if error is None:
        return []
    if isinstance(error, dict):
        return [error]
    to_dict = getattr(error, "to_dict", None)
    if callable(to_dict):
        return [to_dict()]
    kind = type(error).__name__ if isinstance(error, BaseException) else "metadata"
    return [{"type": kind, "message": str(error), "location": "metadata"}]


def _content_hash(produced: bytes, datestamp: str, deleted: bool, sets: bytes,
                  metadata: bytes | None) -> str:
    """What a record's stored row was made from, in 32 hex digits."""
    h = hashlib.blake2b(produced, digest_size=16)
    h.update(b"\x1fD" if deleted else b"\x1fL")
    h.update(datestamp.encode())
    h.update(b"\x1f")
    h.update(sets)
    if metadata is not None:
        h.update(b"\x1f")
        h.update(metadata)
    return h.hexdigest()


_MISSING = object()  # no stored row


def _now() -> datetime:
    return datetime.now(UTC)


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
    """Records and harvest state of every harvester, on one engine.

    `wait_limit` is the default of `acquire`: None waits as long as a live holder has the
    lease, 0 never waits, a number waits at most that many seconds."""

    def __init__(
        self, engine: Engine | None = None, *, wait_limit: float | None = None,
        poll_every: float = POLL_EVERY, heartbeat_every: float = HEARTBEAT_EVERY,
    ) -> None:
        self.engine = engine or db.get_engine()
        self.leases = Leases(self.engine, heartbeat_every=heartbeat_every,
                             poll_every=poll_every, wait_limit=wait_limit)
        insert = postgresql.insert if self.engine.dialect.name == "postgresql" else sqlite.insert
        stmt = insert(_record_write)
        self._upsert = stmt.on_conflict_do_update(
            index_elements=[_record_write.c.harvester_id, _record_write.c.oai_identifier],
            set_={c: stmt.excluded[c] for c in _UPDATED_COLUMNS},
        )
        w = _record_write.c
        self._existing = sa.select(w.oai_identifier, w.content_hash).where(
            w.harvester_id == sa.bindparam("h"),
            w.oai_identifier.in_(sa.bindparam("ids", expanding=True)),
        )
        self._sets_json: dict[tuple[str, ...], tuple[str, bytes]] = {}

    # -- writes ---------------------------------------------------------------------

    def upsert_page(
        self,
        harvester_id: str,
        records: Sequence[HarvestRecord],
        *,
        run_id: str | None,
        transform: Transform | None = None,
        checkpoint: dict[str, Any] | None = None,
        metadata_prefix: str = "",
        transformer: str = "",
    ) -> Counts:
        """Write one page in one transaction: new and changed records are transformed and
        upserted, records whose content hash is unchanged are left alone; `checkpoint` is
        saved in the same commit. `metadata_prefix` and `transformer` name what produced
        the page's metadata (a change of either rewrites every record). While this store
        holds `run_id`'s lease the write is fenced: `LeaseLost` when another run took it
        over, and nothing is written."""
        counts = Counts()
        latest: dict[str, HarvestRecord] = {}
        for rec in records:
            identifier = rec.header.identifier
            if len(identifier) > IDENTIFIER_MAX:  # enforced here on every database
                counts.fail(_shown(identifier))
                continue
            latest[identifier] = rec  # a page may repeat an identifier
        produced = f"{metadata_prefix}\x1f{transformer if transform else ''}".encode()
        lease = self.leases.held(harvester_id, run_id)
        now = _now()
        with self.engine.begin() as conn:
            if lease is not None:
                self.leases.fence(conn, lease, KEEP if checkpoint is None else checkpoint)
            elif checkpoint is not None:
                self.leases.save_checkpoint_in(conn, harvester_id, run_id, checkpoint)
            existing = {}
            if latest:
                found = conn.execute(self._existing, {"h": harvester_id, "ids": list(latest)})
                existing = {identifier: digest for identifier, digest in found}
            values = [
                v for identifier, rec in latest.items()
                if (v := self._row(harvester_id, identifier, rec, existing, produced,
                                   transform, run_id, now, counts)) is not None
            ]
            if values:
                conn.execute(self._upsert, values)
        return counts

    def _sets(self, specs: tuple[str, ...]) -> tuple[str, bytes]:
        """A set list as stored JSON and as hashed bytes (cached: few distinct lists)."""
        cached = self._sets_json.get(specs)
        if cached is None:
            cached = self._sets_json[specs] = (json.dumps(list(specs)),
                                               "\x1f".join(specs).encode())
        return cached

    def _row(
        self, harvester_id: str, identifier: str, rec: HarvestRecord, existing: dict,
        produced: bytes, transform: Transform | None, run_id: str | None, now: datetime,
        counts: Counts,
    ) -> dict[str, Any] | None:
        """The row to upsert for one record (None when its content is unchanged)."""
        header = rec.header
        deleted = header.deleted
        datestamp, errors = _store_datestamp(header)
        sets_json, sets_key = self._sets(tuple(header.set_specs))
        metadata = None if deleted else rec.metadata
        digest = _content_hash(produced, datestamp, deleted, sets_key, metadata)
        old = existing.get(identifier, _MISSING)
        if old == digest:
            counts.unchanged += 1
            return None
        raw = meta = transformed_at = None
        if deleted:
            counts.deleted += 1
            errors = []
        else:
            if old is _MISSING:
                counts.new += 1
            else:
                counts.updated += 1
            raw = metadata.decode("utf-8") if metadata is not None else None
            parsed = _parse_error(rec)
            if parsed:
                errors = errors + parsed
            else:
                meta, failed = _apply_transform(transform, raw, getattr(rec, "element", None))
                if transform is not None and raw:
                    transformed_at = now
                if failed:
                    errors = errors + failed
                    digest = None  # a failed transform is tried again next time
            if errors:
                counts.fail(identifier)
        return {
            "harvester_id": harvester_id,
            "oai_identifier": identifier,
            "datestamp": datestamp,
            "deleted": deleted,
            "sets": sets_json,
            "raw_xml": raw,
            "metadata": None if meta is None else json.dumps(meta, ensure_ascii=False),
            "errors": json.dumps(errors) if errors else _NO_ERRORS,
            "harvested_at": now,
            "run_id": run_id,
            "transformed_at": transformed_at,
            "content_hash": digest,
        }

    def retransform(
        self, harvester_id: str, transform: Transform, *, run_id: str, batch: int = 500,
        is_stale: IsStale | None = None, wait: bool = True,
        wait_limit: float | None | types.EllipsisType = ...,
        cancel: threading.Event | None = None, logger: Any = None,
    ) -> Counts:
        """Transform every stored live record of a harvester again from its raw XML, under
        the harvester's lease (taken as `acquire` does, released at the end; the harvest
        state's status and checkpoint stay as they were)."""
        lease, _ = self.leases.acquire(harvester_id, run_id, is_stale=is_stale, wait=wait,
                                       wait_limit=wait_limit, cancel=cancel, logger=logger)
        try:
            return self._retransform(lease, transform, batch)
        finally:
            self.leases.release(harvester_id, run_id, status=lease.previous_status or "idle",
                                clear_checkpoint=False)

    def _retransform(self, lease: Lease, transform: Transform, batch: int) -> Counts:
        counts = Counts()
        c = record_table.c
        last = ""
        while True:
            with self.engine.begin() as conn:
                self.leases.fence(conn, lease)
                rows = conn.execute(
                    sa.select(c.oai_identifier, c.raw_xml)
                    .where(c.harvester_id == lease.harvester_id, c.deleted.is_(False),
                           c.oai_identifier > last)
                    .order_by(c.oai_identifier)
                    .limit(batch)
                ).all()
                if not rows:
                    return counts
                now = _now()
                updates = []
                for identifier, raw in rows:
                    meta, errors = _apply_transform(transform, raw)
                    if errors:
                        counts.fail(identifier)
                    else:
                        counts.updated += 1
                    updates.append({"h": lease.harvester_id, "i": identifier, "m": meta,
                                    "e": errors, "t": now, "ok": not errors})
                conn.execute(
                    record_table.update()
                    .where(c.harvester_id == sa.bindparam("h"),
                           c.oai_identifier == sa.bindparam("i"))
                    .values(metadata=sa.bindparam("m"), errors=sa.bindparam("e"),
                            transformed_at=sa.bindparam("t"),
                            # a failure is tried again by the next harvest
                            content_hash=sa.case((sa.bindparam("ok", type_=sa.Boolean),
                                                  c.content_hash), else_=sa.null())),
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

    # -- reconciliation ---------------------------------------------------------------

    def tombstone_unlisted(
        self, harvester_id: str, identifiers: Sequence[str], *, reason: str,
        run_id: str | None, batch: int = 500,
    ) -> int:
        """Turn these live records into tombstones whose error says why (`reason`, e.g.
        the server no longer lists them); returns how many changed. Each batch is one
        transaction, fenced like a page write under `run_id`'s lease. The content hash is
        cleared, so a record the server lists again is rewritten."""
        c = record_table.c
        lease = self.leases.held(harvester_id, run_id)
        error = [{"type": "not_listed", "message": reason, "location": "reconcile"}]
        ids = list(dict.fromkeys(identifiers))
        changed = 0
        for i in range(0, len(ids), batch):
            with self.engine.begin() as conn:
                if lease is not None:
                    self.leases.fence(conn, lease)
                changed += conn.execute(
                    record_table.update()
                    .where(c.harvester_id == harvester_id, c.deleted.is_(False),
                           c.oai_identifier.in_(ids[i:i + batch]))
                    .values(deleted=True, raw_xml=None, metadata=sa.null(), errors=error,
                            harvested_at=_now(), run_id=run_id, transformed_at=None,
                            content_hash=None)
                ).rowcount
        return changed

    # -- lease and checkpoint ---------------------------------------------------------

    def acquire(
        self, harvester_id: str, run_id: str, *, is_stale: IsStale | None = None,
        wait: bool = True, wait_limit: float | None | types.EllipsisType = ...,
        cancel: threading.Event | None = None, logger: Any = None,
    ) -> dict[str, Any] | None:
        """Take the harvester's lease for `run_id`; return the previous run's checkpoint
        (None when there is none). While another live run holds it, wait (logging who
        holds it) until it is released or its holder is proven dead: its process on this
        host is gone, `is_stale(run_id)` says the orchestrator saw the run end, or a holder
        on another host has not heartbeaten for `STALE_AFTER`. `wait=False`, or a
        `wait_limit` (seconds; default the store's) that runs out, raises
        `HarvestInProgress`; setting `cancel` raises `LeaseWaitCancelled`. The lease
        heartbeats from a thread of its own until `release`."""
        _, checkpoint = self.leases.acquire(harvester_id, run_id, is_stale=is_stale, wait=wait,
                                            wait_limit=wait_limit, cancel=cancel, logger=logger)
        return checkpoint

    def save_checkpoint(self, harvester_id: str, run_id: str, checkpoint: dict | None) -> None:
        """Record the position of the last committed page (None clears it); `LeaseLost`
        when this store held the run's lease and lost it."""
        self.leases.save_checkpoint(harvester_id, run_id, checkpoint)

    def release(self, harvester_id: str, run_id: str, *, succeeded: bool) -> None:
        """End the lease: a success clears the checkpoint, a failure keeps it. A run that
        lost its lease changes nothing."""
        self.leases.release(harvester_id, run_id, status="succeeded" if succeeded else "failed",
                            clear_checkpoint=succeeded)

    def state(self, harvester_id: str) -> dict[str, Any] | None:
        """The harvest state row of a harvester (None before its first harvest)."""
        return self.leases.state(harvester_id)
