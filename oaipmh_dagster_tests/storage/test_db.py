"""The engine and the versioned schema: automatic migration, the upgrade path, `init`."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from oaipmh_dagster.cli import commands as cli
from oaipmh_dagster.storage import db

TABLES = {"oaipmh_harvester", "oaipmh_record", "oaipmh_harvest_state", db.VERSION_TABLE}


def tables(url: str) -> set[str]:
    engine = sa.create_engine(url)
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def run_cli(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as done:
        cli.main(argv)
    return done.value.code


def test_version_table_name() -> None:
    assert db.VERSION_TABLE == "oaipmh_alembic_version"


def test_get_engine_migrates_an_empty_database(database_url: str) -> None:
    assert tables(database_url) == set()
    engine = db.get_engine(database_url)
    assert tables(database_url) >= TABLES
    # Dagster's own version table is left alone (both can live in one database).
    assert "alembic_version" not in tables(database_url)
    assert db.current_revision(engine) == db.head_revision()
    assert db.table_exists(engine, "oaipmh_record")
    assert db.get_engine(database_url) is engine


def test_get_engine_without_migrate(database_url: str) -> None:
    engine = db.get_engine(database_url, migrate=False)
    assert db.current_revision(engine) is None
    assert not db.table_exists(engine, "oaipmh_harvester")
    assert tables(database_url) == set()


def test_default_url_is_environment(database_url: str) -> None:
    assert db.database_url() == database_url
    db.get_engine()
    assert "oaipmh_harvester" in tables(database_url)


def test_default_url_without_environment(monkeypatch: pytest.MonkeyPatch,
                                         _isolated_home: Path) -> None:
    monkeypatch.delenv(db.DATABASE_URL_ENV, raising=False)
    assert db.database_url() == f"sqlite:///{_isolated_home.resolve() / 'oaipmh.sqlite'}"
    monkeypatch.delenv("DAGSTER_HOME")
    monkeypatch.chdir(_isolated_home)
    assert db.database_url().endswith(".dagster_home/oaipmh.sqlite")


def test_upgrade_path_from_0001(database_url: str) -> None:
    engine = db.get_engine(database_url, migrate=False)
    assert db.upgrade(engine, "0001") == "0001"
    assert db.current_revision(engine) == "0001"
    present = tables(database_url)
    assert "oaipmh_harvester" in present and "oaipmh_record" not in present
    # A row written under 0001 survives the upgrade to head.
    with engine.begin() as conn:
        conn.execute(sa.text(
            "INSERT INTO oaipmh_harvester (id, name, base_url, metadata_prefix, sets, "
            "transformer, created, updated) VALUES ('old', 'Old', 'https://x.org/oai', "
            "'oai_dc', '[]', 'oai_dc', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
        ))
    assert db.upgrade(engine) == db.head_revision()
    assert tables(database_url) >= TABLES
    from oaipmh_dagster.storage.registry import Registry

    h = Registry(engine).get("old")
    assert h.name == "Old" and h.timezone == "UTC" and h.max_retries == 5 and h.enabled


def test_upgrade_is_idempotent(database_url: str) -> None:
    engine = db.get_engine(database_url)
    assert db.upgrade(engine) == db.head_revision()
    assert db.upgrade(engine) == db.head_revision()
    engine2 = sa.create_engine(database_url)
    with engine2.connect() as conn:
        versions = conn.execute(sa.text(f"SELECT version_num FROM {db.VERSION_TABLE}")).all()  # noqa: S608
    engine2.dispose()
    assert versions == [(db.head_revision(),)]


def test_init_twice(database_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["init"]) == 0
    first = capsys.readouterr()
    assert db.head_revision() in first.out
    assert first.err == ""
    assert tables(database_url) >= TABLES
    db.dispose_all()
    assert run_cli(["init"]) == 0
    second = capsys.readouterr()
    assert db.head_revision() in second.out
    assert second.err == ""


def test_init_upgrades_an_old_schema(database_url: str,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    db.upgrade(db.get_engine(database_url, migrate=False), "0001")
    db.dispose_all()
    assert run_cli(["init"]) == 0
    assert db.head_revision() in capsys.readouterr().out
    assert tables(database_url) >= TABLES


def test_init_hides_password(monkeypatch: pytest.MonkeyPatch, database_url: str,
                             capsys: pytest.CaptureFixture[str]) -> None:
    if not database_url.startswith("postgresql"):
        pytest.skip("a password only matters on PostgreSQL")
    url = sa.engine.make_url(database_url).set(password="s3cret")
    monkeypatch.setenv(db.DATABASE_URL_ENV, url.render_as_string(hide_password=False))
    assert run_cli(["init"]) == 0  # trust auth ignores the password
    assert "s3cret" not in capsys.readouterr().out


UNREACHABLE = "postgresql+psycopg2://postgres:s3cret@127.0.0.1:1/x"


def test_unreachable_database_is_a_database_error() -> None:
    started = time.monotonic()
    with pytest.raises(db.DatabaseUnavailable) as err:
        db.get_engine(UNREACHABLE)
    assert time.monotonic() - started < 30
    message = str(err.value)
    assert "cannot reach database" in message
    assert "127.0.0.1:1" in message
    assert "s3cret" not in message
    db.dispose_all()


def test_invalid_database_url() -> None:
    with pytest.raises(db.DatabaseUnavailable, match="invalid database URL"):
        db.get_engine("not a url")
    with pytest.raises(db.DatabaseUnavailable):
        db.get_engine("nosuchdialect://x/y")
    db.dispose_all()


def test_init_unreachable_database(monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(db.DATABASE_URL_ENV, UNREACHABLE)
    assert run_cli(["init"]) == 1
    out = capsys.readouterr()
    lines = out.err.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("oaipmh-dagster: error: cannot reach database")
    assert "s3cret" not in out.err
    db.dispose_all()


def test_cli_unreachable_database_one_line(monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(db.DATABASE_URL_ENV, UNREACHABLE)
    assert run_cli(["harvester", "list"]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("oaipmh-dagster: error:")
    db.dispose_all()


def test_redact() -> None:
    assert "s3cret" not in db.redact(UNREACHABLE)
    assert "127.0.0.1:1" in db.redact(UNREACHABLE)
    assert db.redact("::::") == "<unparseable database URL>"


def test_errors_sit_under_the_package_root() -> None:
    from oaipmh_dagster.errors import OAIPMHDagsterError

    assert issubclass(db.DatabaseUnavailable, OAIPMHDagsterError)
    with pytest.raises(OAIPMHDagsterError, match="invalid database URL"):
        db.get_engine("no such scheme://")


def test_head_revision_constant_is_alembics_head() -> None:
    """`HEAD_REVISION` (the check without alembic) names the newest migration."""
    assert db.head_revision() == db.HEAD_REVISION


def test_an_older_schema_is_still_upgraded(sqlite_url: str) -> None:
    """The quick head check says "ask alembic" for anything but the head."""
    engine = db.get_engine(sqlite_url, migrate=False)
    assert db.upgrade(engine, "0005") == "0005"
    assert not db._at_head(engine)
    assert db.upgrade(engine) == db.HEAD_REVISION
    assert db._at_head(engine)
    assert db.current_revision(engine) == db.HEAD_REVISION


def _page_size(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("PRAGMA page_size").fetchone()[0]
    finally:
        conn.close()


def test_a_new_sqlite_store_has_large_pages(tmp_path: Path) -> None:
    """A record's row is a few KB: a new store lays rows on 16 KB pages."""
    path = tmp_path / "new.sqlite"
    db.get_engine(f"sqlite:///{path}")
    assert _page_size(path) == db.SQLITE_PAGE_SIZE == 16384
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_an_existing_sqlite_store_keeps_its_page_size(tmp_path: Path) -> None:
    """A store made with 4 KB pages (SQLite's default) opens, migrates and keeps them."""
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA page_size=4096")
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE kept (x INTEGER)")
        conn.execute("INSERT INTO kept VALUES (1)")
    engine = db.get_engine(f"sqlite:///{path}")
    assert db.current_revision(engine) == db.HEAD_REVISION
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT x FROM kept").scalar() == 1
    assert _page_size(path) == 4096
