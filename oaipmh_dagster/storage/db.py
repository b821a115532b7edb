"""One SQLAlchemy engine per database URL, and the versioned schema (Alembic)."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from oaipmh_dagster.errors import OAIPMHDagsterError

log = logging.getLogger(__name__)

DATABASE_URL_ENV = "OAIPMH_DATABASE_URL"
# Set in deployment images: a missing $OAIPMH_DATABASE_URL is an error there, never a
# SQLite file that a container forgets on restart.
REQUIRE_URL_ENV = "OAIPMH_REQUIRE_DATABASE_URL"
VERSION_TABLE = "oaipmh_alembic_version"  # not Dagster's own `alembic_version`
# The newest revision under migrations/versions (a test holds it to alembic's head).
HEAD_REVISION = "0013"
MIGRATIONS_DIR = Path(__file__).with_name("migrations")

metadata = sa.MetaData()

_engines: dict[str, Engine] = {}
_migrated: set[str] = set()
_lock = threading.Lock()


class DatabaseUnavailable(OAIPMHDagsterError, RuntimeError):
    """The database cannot be used: its URL is invalid, it cannot be reached, or its
    schema cannot be brought up to date."""


def dagster_home() -> Path:
    """`$DAGSTER_HOME`, or `./.dagster_home` when unset."""
    return Path(os.environ.get("DAGSTER_HOME") or ".dagster_home").resolve()


def _url_from_env() -> str:
    return os.environ.get(DATABASE_URL_ENV, "").strip()


def default_sqlite_path() -> Path | None:
    """The SQLite file used when `$OAIPMH_DATABASE_URL` is unset (None when it is set)."""
    return None if _url_from_env() else dagster_home() / "oaipmh.sqlite"


def database_url() -> str:
    """`$OAIPMH_DATABASE_URL`, or a SQLite file under the Dagster home (an error where
    `$OAIPMH_REQUIRE_DATABASE_URL` is set, as in the deployment image)."""
    url = _url_from_env()
    if url:
        return url
    if os.environ.get(REQUIRE_URL_ENV, "").strip() not in ("", "0"):
        raise DatabaseUnavailable(
            f"${DATABASE_URL_ENV} is not set, and ${REQUIRE_URL_ENV} forbids the SQLite "
            f"fallback: set {DATABASE_URL_ENV} to the registry's database (see "
            "deploy/README.md)")
    home = dagster_home()
    home.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{home / 'oaipmh.sqlite'}"


def where() -> str:
    """Which database and Dagster instance this process reads, for messages that find
    nothing: a command run from another folder reads another `./.dagster_home`."""
    home = dagster_home()
    unset = "" if os.environ.get("DAGSTER_HOME") else (
        " ($DAGSTER_HOME is not set: ./.dagster_home of the working directory)")
    url = _url_from_env()
    database = redact(url) if url else str(home / "oaipmh.sqlite")
    return f"database {database}, Dagster instance {home}{unset}"


def redact(url: str) -> str:
    """The URL with any password hidden, for messages."""
    try:
        return sa.engine.make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - a malformed URL is shown as a placeholder
        return "<unparseable database URL>"


# A new SQLite store's page size: a record's row (raw XML, metadata) is a few KB, one to a
# 4 KB page; on 16 KB pages a 200,000 record harvest wrote a quarter of the pages (and
# the file was 25% smaller). An existing store keeps its page size (`VACUUM` in rollback
# journal mode changes it).
SQLITE_PAGE_SIZE = 16384
SQLITE_CACHE_KB = 16384  # each connection's page cache (SQLite's default: 2 MB)


def _sqlite_pragmas(dbapi_conn, _record) -> None:  # noqa: ANN001 - DB-API connection
    cur = dbapi_conn.cursor()
    cur.execute(f"PRAGMA page_size={SQLITE_PAGE_SIZE}")  # before WAL creates the file
    cur.execute(f"PRAGMA cache_size=-{SQLITE_CACHE_KB}")
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def get_engine(url: str | None = None, *, migrate: bool = True) -> Engine:
    """The process-wide engine for `url` (default `database_url()`), schema brought up to date."""
    url = url or database_url()
    with _lock:
        engine = _engines.get(url)
        if engine is None:
            try:
                sa_url = sa.engine.make_url(url)
            except Exception as exc:
                raise DatabaseUnavailable(f"invalid database URL {redact(url)!r}: {exc}") from exc
            kwargs: dict = {"future": True}
            if sa_url.get_backend_name() == "sqlite":
                kwargs["connect_args"] = {"timeout": 30, "check_same_thread": False}
            else:
                kwargs.update(pool_pre_ping=True, pool_size=5, max_overflow=5)
            try:
                if sa_url.get_driver_name() == "psycopg2":
                    # An executemany of the record upsert (INSERT ... ON CONFLICT) is
                    # otherwise a round trip per row: 55% of a harvest into PostgreSQL.
                    kwargs.update(executemany_mode="values_plus_batch",
                                  executemany_batch_page_size=500)
                engine = sa.create_engine(sa_url, **kwargs)
            except Exception as exc:
                raise DatabaseUnavailable(f"cannot use database {redact(url)}: {exc}") from exc
            if sa_url.get_backend_name() == "sqlite":
                sa.event.listen(engine, "connect", _sqlite_pragmas)
            _engines[url] = engine
    if migrate and url not in _migrated:
        upgrade(engine)
    return engine


def dispose_all() -> None:
    """Close every pooled connection (tests, forks)."""
    with _lock:
        for engine in _engines.values():
            engine.dispose()
        _engines.clear()
        _migrated.clear()


def _alembic_config(connection: sa.Connection):  # noqa: ANN202 - alembic type
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["connection"] = connection
    return cfg


def current_revision(engine: Engine) -> str | None:
    """The schema revision recorded in the database (None before `init`)."""
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
        return ctx.get_current_revision()


def head_revision() -> str:
    """The newest schema revision this code knows."""
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    head = ScriptDirectory.from_config(cfg).get_current_head()
    assert head is not None
    return head


def _at_head(engine: Engine) -> bool:
    """Whether the database records `HEAD_REVISION`: one query, no alembic import (0.15 s
    of every command and run). Any failure says only "ask alembic"."""
    try:
        with engine.connect() as conn:
            found: list[str] = list(conn.execute(sa.select(sa.column("version_num")).select_from(
                sa.table(VERSION_TABLE))).scalars())
    except sa.exc.DBAPIError:
        return False
    return found == [HEAD_REVISION]


def upgrade(engine: Engine, revision: str = "head") -> str | None:
    """Create or upgrade the tables (idempotent, safe against a concurrent upgrade)."""
    url = engine.url.render_as_string(hide_password=False)
    if revision == "head" and _at_head(engine):
        _migrated.add(url)
        return HEAD_REVISION
    from alembic import command
    from alembic.util import CommandError

    try:
        if revision == "head" and current_revision(engine) == head_revision():
            _migrated.add(url)
            return head_revision()
        with engine.begin() as conn:
            if engine.dialect.name == "postgresql":
                # Serialize concurrent upgrades from several processes.
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(7262012)"))
            command.upgrade(_alembic_config(conn), revision)
    except sa.exc.OperationalError as exc:
        raise DatabaseUnavailable(
            f"cannot reach database {redact(url)}: {str(exc.orig).strip().splitlines()[0]}"
        ) from exc
    except sa.exc.DBAPIError as exc:  # e.g. a file that is not a SQLite database
        raise DatabaseUnavailable(f"cannot use database {redact(url)}: {exc.orig}") from exc
    except CommandError as exc:  # e.g. a schema revision newer than this code
        raise DatabaseUnavailable(f"cannot upgrade database {redact(url)}: {exc}") from exc
    if revision == "head":
        _migrated.add(url)
    rev = current_revision(engine)
    log.info("database %s at schema revision %s", redact(url), rev)
    return rev


def table_exists(engine: Engine, name: str) -> bool:
    """Whether `name` exists, without creating anything."""
    try:
        return sa.inspect(engine).has_table(name)
    except sa.exc.OperationalError as exc:
        raise DatabaseUnavailable(
            f"cannot reach database {redact(str(engine.url))}: "
            f"{str(exc.orig).strip().splitlines()[0]}"
        ) from exc
