"""What a harvested record becomes in the store: its row (datestamp in the store's form,
sets, raw XML, transformed metadata, errors), its content hash, and the counts of a write.

Records converge by content: each row keeps a hash of what was harvested (datestamp,
deletion, sets, raw metadata, and the metadata prefix and transformer that produced the
stored metadata), so a change that keeps its datestamp is still rewritten, and an
unchanged record is neither transformed nor written. One record's bad value costs only
that record: the same column limits hold on every database. The store persists the rows
(`RecordStore.page`, `storage/ports.py`); nothing here touches the database."""

from __future__ import annotations

import functools
import hashlib
import json
import re
import threading
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from oaipmh_dagster.storage.ports import (
    DATESTAMP_MAX,
    DATESTAMP_PLACEHOLDER,
    IDENTIFIER_MAX,
    IsStale,
    MetadataUpdate,
    RecordStore,
    utc_datestamp,
)
from oaipmh_dagster.transform import transformer_identity

if TYPE_CHECKING:
    from oaipmh_dagster.harvesting.delivered import Delivered

__all__ = ["Counts", "HarvestRecord", "PreparedPage", "Transform", "Validate", "commit_page",
           "commit_pages", "prepare_page", "retransform", "write_page"]

_SHOWN = 100  # characters of a bad value quoted in counts and errors
_NO_ERRORS = "[]"

# (raw XML, the already parsed element or None) -> transformed dict
Transform = Callable[[str, Any], dict[str, Any]]


class Validate(Protocol):
    """Checks a record's metadata against a schema: (raw XML, the already parsed element
    or None) -> errors of type `schema` ([] when valid). `token` names the schema and
    its content (part of what produced a row, so a change rewrites the records)."""

    @property
    def token(self) -> str: ...

    def __call__(self, raw: str | None, element: Any = None) -> list[dict[str, Any]]: ...


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
                  metadata: bytes | None, about: tuple[bytes, ...] = ()) -> str:
    """What a record's stored row was made from, in 32 hex digits (a record without
    about blocks hashes as before they were stored)."""
    h = hashlib.blake2b(produced, digest_size=16)
    h.update(b"\x1fD" if deleted else b"\x1fL")
    h.update(datestamp.encode())
    h.update(b"\x1f")
    h.update(sets)
    if metadata is not None:
        h.update(b"\x1f")
        h.update(metadata)
    for block in about:
        h.update(b"\x1fA")
        h.update(block)
    return h.hexdigest()


_MISSING = object()  # no stored row


def _error_of(exc: Exception) -> dict[str, Any]:
    """A transform's exception as a record's error."""
    to_dict = getattr(exc, "to_dict", None)
    return to_dict() if callable(to_dict) else {
        "type": type(exc).__name__,
        "message": str(exc),
        "location": "transform",
    }


def _apply_transform(
    transform: Transform | None, raw: str | None, element: Any = None
) -> tuple[Any, list[dict]]:
    if transform is None or raw is None:
        return None, []
    try:
        return transform(raw, element), []
    except Exception as exc:  # noqa: BLE001 - a bad record must not stop the run
        return None, [_error_of(exc)]


def _transform_all(transform: Transform, items: list[tuple[str | None, Any]]
                   ) -> list[tuple[Any, list[dict]]]:
    """(metadata, errors) of each (raw XML, element or None): in one call when the
    transform takes batches (its `many`: an ``xslt:`` stylesheet runs in a worker
    process, which a call per record would wait for each time)."""
    many = getattr(transform, "many", None)
    given = [i for i, (raw, _) in enumerate(items) if raw is not None]
    if many is None or len(given) < 2:
        return [_apply_transform(transform, raw, element) for raw, element in items]
    out: list[tuple[Any, list[dict]]] = [(None, [])] * len(items)
    try:
        outcomes = many([items[i] for i in given])
    except Exception as exc:  # noqa: BLE001 - the batch failed as a whole
        outcomes = [exc] * len(given)
    for i, o in zip(given, outcomes, strict=True):
        out[i] = (None, [_error_of(o)]) if isinstance(o, Exception) else (o, [])
    return out


# One encoder for every record (json.dumps builds one per call with these options). No
# cycle check: transformer output is checked to be a JSON tree before it gets here.
_ENCODE = json.JSONEncoder(ensure_ascii=False, check_circular=False).encode
# U+0000 in a JSON string (json.dumps escapes it), not preceded by an escaped backslash.
_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def _metadata_json(meta: Any) -> tuple[str | None, list[dict[str, Any]]]:
    """Transformed metadata as the JSON text to store, or None and an error when it holds
    U+0000: PostgreSQL's JSON cannot keep it, and one record must not fail its page."""
    if meta is None:
        return None, []
    text = _ENCODE(meta)
    if "\\u0000" in text and _NUL.search(text):
        return None, [{"type": "nul_character",
                       "message": "the transformed metadata holds U+0000 (NUL), which the "
                                  "store cannot keep; the record keeps its raw XML",
                       "location": "transform"}]
    return text, []


@dataclass
class PreparedPage:
    """A page's rows to upsert (new and changed records, transformed) and its counts."""

    rows: list[dict[str, Any]]
    counts: Counts
    rewrites: int = 0  # rows that replace stored ones


def prepare_page(
    store: RecordStore,
    harvester_id: str,
    records: Sequence[HarvestRecord],
    *,
    run_id: str | None,
    transform: Transform | None = None,
    metadata_prefix: str = "",
    transformer: str = "",
    existing: dict[str, str | None] | None = None,
    validate: Validate | None = None,
    delivered: Delivered | None = None,
) -> PreparedPage:
    """The rows of one page: records whose content hash is unchanged are left out, new
    and changed ones are transformed (and validated, with `validate`). `existing`
    (identifier -> stored hash) is read from the store when not given (through
    `delivered` when the store held none of the harvester's records at the start).
    `metadata_prefix`, `transformer` and `validate`'s schema name what produced the
    page's rows (a change of any rewrites every record)."""
    counts = Counts()
    latest: dict[str, HarvestRecord] = {}
    for rec in records:
        identifier = rec.header.identifier
        if len(identifier) > IDENTIFIER_MAX:  # enforced here on every database
            counts.fail(_shown(identifier))
            continue
        latest[identifier] = rec  # a page may repeat an identifier
    if existing is None:
        existing = (store.hashes(harvester_id, list(latest)) if delivered is None
                    else delivered.hashes(store, harvester_id, list(latest)))
    # An xslt: transformer's identity holds the stylesheet's digest: an edited crosswalk
    # rewrites records whose harvested content is unchanged.
    ident = transformer_identity(transformer) if transform and transformer else ""
    produced = f"{metadata_prefix}\x1f{ident}"
    if validate is not None:
        produced += f"\x1fschema={validate.token}"
    now = datetime.now(UTC)
    keys = {identifier: _key(rec, produced.encode()) for identifier, rec in latest.items()}
    done = _transform_page(transform, latest, keys, existing)
    rows = [v for identifier, rec in latest.items()
            if (v := _row(harvester_id, identifier, rec, keys[identifier], existing,
                          transform, done, validate, run_id, now, counts)) is not None]
    return PreparedPage(rows, counts, sum(1 for r in rows if r["oai_identifier"] in existing))


@dataclass(frozen=True)
class _Key:
    """What a record's content hash is made of, and the hash."""

    datestamp: str
    errors: list[dict[str, str]]
    sets_json: str
    digest: str
    about_json: str | None = None  # the about blocks as stored JSON; None: none


def _key(rec: HarvestRecord, produced: bytes) -> _Key:
    header = rec.header
    datestamp, errors = _store_datestamp(header)
    sets_json, sets_key = _sets(tuple(header.set_specs))
    metadata = None if header.deleted else rec.metadata
    about: tuple[bytes, ...] = () if header.deleted else tuple(getattr(rec, "about", ()) or ())
    about_json = json.dumps([b.decode("utf-8") for b in about],
                            ensure_ascii=False) if about else None
    return _Key(datestamp, errors, sets_json,
                _content_hash(produced, datestamp, header.deleted, sets_key, metadata, about),
                about_json)


def _transform_page(transform: Transform | None, latest: dict[str, HarvestRecord],
                    keys: dict[str, _Key], existing: dict[str, str | None]
                    ) -> dict[str, tuple[Any, list[dict]]]:
    """The transformed records of a page whose transform takes batches (else none:
    each record is transformed as its row is made)."""
    if transform is None or getattr(transform, "many", None) is None:
        return {}
    todo = [(identifier, rec) for identifier, rec in latest.items()
            if not rec.header.deleted and rec.metadata
            and existing.get(identifier, _MISSING) != keys[identifier].digest
            and not _parse_error(rec)]
    items: list[tuple[str | None, Any]] = [
        (rec.metadata.decode("utf-8") if rec.metadata else None, getattr(rec, "element", None))
        for _, rec in todo]
    outcomes = _transform_all(transform, items)
    return {identifier: outcome for (identifier, _), outcome in zip(todo, outcomes, strict=True)}


def commit_page(
    store: RecordStore, harvester_id: str, prepared: PreparedPage, *, run_id: str | None,
    checkpoint: dict[str, Any] | None = None,
) -> None:
    """Upsert a prepared page's rows and save `checkpoint` in one transaction (fenced
    under `run_id`'s lease: see `RecordStore.page`)."""
    commit_pages(store, harvester_id, [prepared], run_id=run_id, checkpoint=checkpoint)


def commit_pages(
    store: RecordStore, harvester_id: str, pages: Sequence[PreparedPage], *,
    run_id: str | None, checkpoint: dict[str, Any] | None = None,
) -> None:
    """`commit_page` of several pages in one transaction (one upsert each, so a record
    that two of them hold is written twice, in order)."""
    with store.page(harvester_id, run_id, checkpoint) as page:
        for prepared in pages:
            page.upsert(prepared.rows, replacing=prepared.rewrites)


def write_page(
    store: RecordStore,
    harvester_id: str,
    records: Sequence[HarvestRecord],
    *,
    run_id: str | None,
    transform: Transform | None = None,
    checkpoint: dict[str, Any] | None = None,
    metadata_prefix: str = "",
    transformer: str = "",
    validate: Validate | None = None,
) -> Counts:
    """Write one page in one transaction: `prepare_page` with the hashes read in that
    transaction, then the upsert and `checkpoint` in the same commit."""
    with store.page(harvester_id, run_id, checkpoint) as page:
        ids = [r.header.identifier for r in records
               if len(r.header.identifier) <= IDENTIFIER_MAX]
        prepared = prepare_page(store, harvester_id, records, run_id=run_id,
                                transform=transform, metadata_prefix=metadata_prefix,
                                transformer=transformer, existing=page.hashes(ids),
                                validate=validate)
        page.upsert(prepared.rows)
    return prepared.counts


@functools.lru_cache(maxsize=1024)
def _sets(specs: tuple[str, ...]) -> tuple[str, bytes]:
    """A set list as stored JSON and as hashed bytes (cached: few distinct lists)."""
    return json.dumps(list(specs)), "\x1f".join(specs).encode()


def _row(
    harvester_id: str, identifier: str, rec: HarvestRecord, key: _Key,
    existing: dict[str, str | None], transform: Transform | None,
    done: dict[str, tuple[Any, list[dict]]], validate: Validate | None,
    run_id: str | None, now: datetime, counts: Counts,
) -> dict[str, Any] | None:
    """The row to upsert for one record (None when its content is unchanged); `done`
    holds its transform's outcome when the page was transformed in one batch."""
    deleted = rec.header.deleted
    old = existing.get(identifier, _MISSING)
    if old == key.digest:
        counts.unchanged += 1
        return None
    if deleted:
        counts.deleted += 1
        live = _Live(None, None, None, [], key.digest)
    else:
        if old is _MISSING:
            counts.new += 1
        else:
            counts.updated += 1
        live = _live(identifier, rec, key, transform, done, validate, now, counts)
    return {
        "harvester_id": harvester_id,
        "oai_identifier": identifier,
        "datestamp": key.datestamp,
        "deleted": deleted,
        "sets": key.sets_json,
        "raw_xml": live.raw,
        "metadata": live.meta_json,
        "errors": json.dumps(live.errors) if live.errors else _NO_ERRORS,
        "harvested_at": now,
        "run_id": run_id,
        "transformed_at": live.transformed_at,
        "content_hash": live.digest,
        "about": key.about_json,
    }


class _Live(NamedTuple):
    """What a live (not deleted) record's row holds besides its header."""

    raw: str | None
    meta_json: str | None
    transformed_at: datetime | None
    errors: list[dict[str, Any]]
    digest: str | None  # None: a failed transform is tried again next time


def _live(
    identifier: str, rec: HarvestRecord, key: _Key, transform: Transform | None,
    done: dict[str, tuple[Any, list[dict]]], validate: Validate | None, now: datetime,
    counts: Counts,
) -> _Live:
    """A new or changed live record's raw XML, transformed metadata and errors (a
    record with errors is counted as failed)."""
    metadata = rec.metadata
    raw = metadata.decode("utf-8") if metadata is not None else None
    errors: list[dict[str, Any]] = list(key.errors)
    digest: str | None = key.digest
    meta_json: str | None = None
    transformed_at: datetime | None = None
    parsed = _parse_error(rec)
    element = getattr(rec, "element", None)
    if parsed:
        errors = errors + parsed
    else:
        outcome = done.get(identifier)
        meta, failed = outcome or _apply_transform(transform, raw, element)
        meta_json, nul = _metadata_json(meta)
        failed = failed + nul
        if transform is not None and raw:
            transformed_at = now
        if failed:
            errors = errors + failed
            digest = None  # a failed transform is tried again next time
    if errors:
        counts.fail(identifier)
    if validate is not None and raw and not parsed:
        # Kept and not counted as failed: an invalid record is still stored, and
        # its hash stays (validating the same content again says the same).
        errors = errors + validate(raw, element)
    return _Live(raw, meta_json, transformed_at, errors, digest)


def retransform(
    store: RecordStore, harvester_id: str, transform: Transform, *, run_id: str, batch: int = 500,
    is_stale: IsStale | None = None, wait: bool = True,
    wait_limit: float | None | types.EllipsisType = ...,
    cancel: threading.Event | None = None, logger: Any = None,
    validate: Validate | None = None,
) -> Counts:
    """Transform every stored live record of a harvester again from its raw XML (and
    validate it again, with `validate`), under the harvester's lease (taken as
    `RecordStore.acquire` does, released at the end; the harvest state's status and
    checkpoint stay as they were), one transaction per batch."""
    counts = Counts()
    last = ""
    with store.holding(harvester_id, run_id, is_stale=is_stale, wait=wait,
                       wait_limit=wait_limit, cancel=cancel, logger=logger):
        while True:
            with store.page(harvester_id, run_id) as page:
                rows = page.live_raw(last, batch)
                if not rows:
                    return counts
                now = datetime.now(UTC)
                updates = []
                outcomes = _transform_all(transform, [(raw, None) for _, raw in rows])
                for (identifier, raw), (meta, errors) in zip(rows, outcomes, strict=True):
                    nul = _metadata_json(meta)[1]
                    if nul:
                        meta, errors = None, errors + nul
                    if errors:
                        counts.fail(identifier)
                    else:
                        counts.updated += 1
                    if validate is not None and raw:
                        errors = errors + validate(raw)
                    updates.append(MetadataUpdate(identifier, meta, errors, now))
                page.set_metadata(updates)
            last = rows[-1][0]
