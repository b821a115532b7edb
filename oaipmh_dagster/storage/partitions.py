"""The record table's layout on PostgreSQL: LIST partitions by harvester (migration 0010).

`oaipmh_record` is a partitioned table; each harvester's records live in a partition of
their own (`partition_name`), created before its first page is written (`ensure`), and
a DEFAULT partition (`DEFAULT_PARTITION`) takes the rows of any harvester whose
partition could not be created yet (its rows move into the partition when it is). So a
harvester's queries read its own table and indexes whatever the store holds besides, and
removing its records empties and drops one table (`remove`) instead of a DELETE of every
row.

Locks: a partition is made as a table of its own and then attached, which takes a SHARE
UPDATE EXCLUSIVE lock on `oaipmh_record` (reads and page writes of other harvesters go
on) and briefly an ACCESS EXCLUSIVE one on the DEFAULT partition, normally empty. Only
the final DROP of a removed harvester's (by then empty) partition takes an ACCESS
EXCLUSIVE lock on `oaipmh_record`: it is tried under a short `lock_timeout`, and an empty
partition that could not be dropped is harmless (reused if the id comes back).

SQLite keeps one table: nothing here applies there."""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections.abc import Callable

import sqlalchemy as sa
from sqlalchemy.engine import Engine

log = logging.getLogger(__name__)

TABLE = "oaipmh_record"
DEFAULT_PARTITION = "oaipmh_record__default"  # `__`: no valid harvester id makes it
# Storage parameters of every partition (PostgreSQL keeps none on a partitioned table):
# - toast_tuple_target 256: as migration 0009, records of one or two KiB are compressed.
# - fillfactor 85: room on each page for the new version of a rewritten record, so an
#   upsert that changes the content but not the datestamp is a HOT update (no index
#   entries) whose old version the next page access prunes without a VACUUM.
# - autovacuum_vacuum_scale_factor 0.05 (default 0.2) and insert scale factor 0.05: a
#   partition is one harvester, so a re-harvest that rewrites a twentieth of it is
#   vacuumed (and analyzed: analyze scale 0.05) instead of waiting for a fifth.
PARTITION_OPTIONS = (
    ("toast_tuple_target", "256"),
    ("fillfactor", "85"),
    ("autovacuum_vacuum_scale_factor", "0.05"),
    ("autovacuum_vacuum_insert_scale_factor", "0.05"),
    ("autovacuum_analyze_scale_factor", "0.05"),
)
_READABLE = re.compile(r"^[a-z0-9][a-z0-9_]{0,47}$")  # the registry's harvester ids
_ADVISORY = 7262013  # first key of the per-harvester advisory lock (db.py uses 7262012)
# The columns a first harvest's ANALYZE reads (`analyze_if_new`): keys, filters, orders.
ANALYZED = ("harvester_id", "oai_identifier", "datestamp", "deleted", "harvested_at", "errors")
VACUUM_SHARE = 0.2  # `vacuum`: rows replaced, as a share of the partition's rows
VACUUM_MIN_ROWS = 1000
LOCK_TIMEOUT_MS = 250  # how long the DROP of a removed partition waits for its lock
DROP_TRIES = 4  # at most about 1.5 s in all


def options_sql() -> str:
    """The WITH (...) clause of a partition."""
    return ", ".join(f"{k} = {v}" for k, v in PARTITION_OPTIONS)


def partition_name(harvester_id: str) -> str:
    """The partition's table name: `oaipmh_record_<id>` for a registry id (at most 62
    bytes), else `oaipmh_record__h` and a SHA-256 prefix (never one of the former)."""
    if _READABLE.match(harvester_id):
        return f"{TABLE}_{harvester_id}"
    return f"{TABLE}__h{hashlib.sha256(harvester_id.encode()).hexdigest()[:40]}"


def _quote(conn: sa.Connection, name: str) -> str:
    return conn.dialect.identifier_preparer.quote_identifier(name)


def is_partitioned(conn: sa.Connection) -> bool:
    """Whether `oaipmh_record` is the partitioned table (PostgreSQL at 0010 or later)."""
    if conn.dialect.name != "postgresql":
        return False
    kind = conn.execute(sa.text(
        "SELECT c.relkind FROM pg_class c WHERE c.oid = to_regclass(:t)"), {"t": TABLE}).scalar()
    return kind == "p"


def exists(conn: sa.Connection, harvester_id: str) -> bool:
    """Whether the harvester's partition is attached to `oaipmh_record`."""
    return conn.execute(sa.text(
        "SELECT EXISTS (SELECT 1 FROM pg_inherits WHERE inhparent = to_regclass(:t) "
        "AND inhrelid = to_regclass(:p))"),
        {"t": TABLE, "p": _quote(conn, partition_name(harvester_id))}).scalar_one()


def columns(conn: sa.Connection, table: str = TABLE) -> list[str]:
    """The table's column names in order."""
    return list(conn.execute(sa.text(
        "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(:t) AND attnum > 0 "
        "AND NOT attisdropped ORDER BY attnum"), {"t": table}).scalars())


def create_default_in(conn: sa.Connection) -> None:
    """The DEFAULT partition (in the caller's transaction)."""
    conn.exec_driver_sql(
        f"CREATE TABLE IF NOT EXISTS {DEFAULT_PARTITION} PARTITION OF {TABLE} DEFAULT "
        f"WITH ({options_sql()})")


def create_in(conn: sa.Connection, harvester_id: str, *, copy_from: str | None = None) -> None:
    """Make and attach the harvester's partition in the caller's transaction, filled
    with its rows of `copy_from` (a table like `oaipmh_record`; migration 0010) and any
    of the DEFAULT partition (moved). The caller holds `lock`; the partition is absent.

    The rows go into a bare table, its indexes are built when it is attached (faster than
    maintaining them row by row), and a CHECK constraint of the partition's bound spares
    the attach a scan of it."""
    name = _quote(conn, partition_name(harvester_id))
    cols = ", ".join(_quote(conn, c) for c in columns(conn))
    conn.exec_driver_sql(
        f"CREATE TABLE {name} (LIKE {TABLE} INCLUDING DEFAULTS INCLUDING STORAGE "
        f"INCLUDING COMPRESSION) WITH ({options_sql()})")
    if copy_from is not None:
        conn.execute(sa.text(
            f"INSERT INTO {name} ({cols}) SELECT {cols} FROM {copy_from} "  # noqa: S608
            "WHERE harvester_id = :h"), {"h": harvester_id})
    if conn.execute(sa.text(
            f"SELECT EXISTS (SELECT 1 FROM {DEFAULT_PARTITION} "  # noqa: S608 - constants
            "WHERE harvester_id = :h)"), {"h": harvester_id}).scalar_one():
        conn.execute(sa.text(
            f"WITH moved AS (DELETE FROM {DEFAULT_PARTITION} WHERE harvester_id = :h "  # noqa: S608
            f"RETURNING {cols}) INSERT INTO {name} ({cols}) SELECT {cols} FROM moved"),
            {"h": harvester_id})
    bound = conn.execute(sa.text("SELECT quote_literal(CAST(:h AS text))"),
                         {"h": harvester_id}).scalar_one()
    check = _quote(conn, f"{TABLE}_bound_{hashlib.sha256(name.encode()).hexdigest()[:16]}")
    conn.exec_driver_sql(f"ALTER TABLE {name} ADD CONSTRAINT {check} CHECK "
                         f"(harvester_id IS NOT NULL AND harvester_id = {bound})")
    conn.exec_driver_sql(f"ALTER TABLE {TABLE} ATTACH PARTITION {name} FOR VALUES IN ({bound})")
    conn.exec_driver_sql(f"ALTER TABLE {name} DROP CONSTRAINT {check}")


def lock(conn: sa.Connection, harvester_id: str) -> None:
    """Serialize the making and dropping of one harvester's partition (until the end of
    the transaction)."""
    conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k, hashtext(:h))"),
                 {"k": _ADVISORY, "h": harvester_id})


def ensure(engine: Engine, harvester_id: str) -> bool:
    """Make the harvester's partition unless it exists (a transaction of its own, safe
    against concurrent callers); True when it exists afterwards. False when a lock could
    not be had within `lock_timeout`: its rows go to the DEFAULT partition meanwhile."""
    with engine.connect() as conn:
        if exists(conn, harvester_id):
            return True
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{4 * LOCK_TIMEOUT_MS}ms'")
            lock(conn, harvester_id)
            if not exists(conn, harvester_id):
                create_in(conn, harvester_id)
        return True
    except sa.exc.OperationalError as exc:
        if getattr(exc.orig, "pgcode", None) != "55P03":  # lock_not_available
            raise
        log.warning("partition of harvester %s not created now (%s): its rows go to %s",
                    harvester_id, str(exc.orig).strip(), DEFAULT_PARTITION)
        return False


def truncate_in(conn: sa.Connection, harvester_id: str) -> int:
    """Empty the harvester's partition (a lock on it alone) in the caller's transaction;
    returns how many rows it held (0 without a partition)."""
    if not exists(conn, harvester_id):
        return 0
    name = _quote(conn, partition_name(harvester_id))
    n = int(conn.exec_driver_sql(f"SELECT count(*) FROM {name}").scalar_one())  # noqa: S608
    conn.exec_driver_sql(f"TRUNCATE {name}")
    return n


def drop(engine: Engine, harvester_id: str, *, tries: int = DROP_TRIES) -> bool:
    """Drop the harvester's partition if it is empty, waiting at most `LOCK_TIMEOUT_MS`
    per try for the brief ACCESS EXCLUSIVE lock on `oaipmh_record` (never queueing other
    harvesters' queries for longer); True when it is gone."""
    for attempt in range(tries):
        try:
            with engine.begin() as conn:
                conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT_MS}ms'")
                lock(conn, harvester_id)
                if not exists(conn, harvester_id):
                    return True
                name = _quote(conn, partition_name(harvester_id))
                if conn.exec_driver_sql(f"SELECT EXISTS (SELECT 1 FROM {name})").scalar_one():  # noqa: S608
                    return False  # written again since it was emptied: keep it
                conn.exec_driver_sql(f"DROP TABLE {name}")
            return True
        except sa.exc.OperationalError as exc:
            if getattr(exc.orig, "pgcode", None) != "55P03":
                raise
            time.sleep(0.05 * (attempt + 1))
    log.warning("the emptied partition of harvester %s stays (its lock was busy)",
                harvester_id)
    return False


def analyze_if_new(engine: Engine, harvester_id: str) -> bool:
    """ANALYZE the harvester's partition if it has never been analyzed nor vacuumed
    (`reltuples` < 0): after a first harvest, the planner would otherwise sort the whole
    partition for a page of its list (54 ms at 100,000 rows) until autovacuum gets to
    it. Only the columns that queries filter and order by (`ANALYZED`): at 500,000
    rows 0.2 s, where every column (the raw XML and metadata detoasted) took 0.8-2.7 s;
    autovacuum's own ANALYZE covers the rest later. Skipped when another maintenance
    holds the partition. True when it ran."""
    return _maintain(engine, harvester_id, lambda rows: rows < 0,
                     f"ANALYZE {{}} ({', '.join(ANALYZED)})")


def vacuum(engine: Engine, harvester_id: str, *, rewritten: int) -> bool:
    """VACUUM (and ANALYZE) the harvester's partition if `rewritten` rows (replaced since
    its last vacuum) are at least `VACUUM_SHARE` of it and `VACUUM_MIN_ROWS`: a lock that
    blocks neither reads nor writes, on that partition alone; skipped when another
    vacuum holds it. True when it ran."""
    if rewritten < VACUUM_MIN_ROWS:
        return False
    return _maintain(engine, harvester_id,
                     lambda rows: rewritten >= VACUUM_SHARE * max(rows, 0),
                     "VACUUM (ANALYZE) {}")


def _maintain(engine: Engine, harvester_id: str, due: Callable[[float], bool],
              statement: str) -> bool:
    """Run `statement` (`{}`: the partition's quoted name) outside a transaction on the
    harvester's partition when `due(reltuples)`, under a short lock_timeout; False when
    there is no such partition, it is not due, or its lock was busy."""
    with engine.connect() as conn:
        if not is_partitioned(conn) or not exists(conn, harvester_id):
            return False
        name = _quote(conn, partition_name(harvester_id))
        rows = conn.execute(sa.text("SELECT reltuples FROM pg_class WHERE oid = "
                                    "to_regclass(:p)"), {"p": name}).scalar_one()
        conn.rollback()
        if not due(rows):
            return False
        conn.execution_options(isolation_level="AUTOCOMMIT")
        try:
            conn.exec_driver_sql(f"SET lock_timeout = '{4 * LOCK_TIMEOUT_MS}ms'")
            conn.exec_driver_sql(statement.format(name))
        except sa.exc.OperationalError as exc:
            if getattr(exc.orig, "pgcode", None) != "55P03":
                raise
            return False
        finally:
            conn.exec_driver_sql("RESET lock_timeout")
    return True
