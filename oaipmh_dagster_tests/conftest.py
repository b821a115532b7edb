"""Shared fixtures: databases (SQLite and PostgreSQL), a Dagster home, the loopback server."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from oaipmh_dagster import db

REPO_ROOT = Path(__file__).resolve().parents[1]
FIXTURES = REPO_ROOT.parent / "shared" / "oai-fixtures"
PG_URL = os.environ.get(
    "OAIPMH_TEST_POSTGRES_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432/test"
)
REQUIRE_PG = os.environ.get("OAIPMH_REQUIRE_POSTGRES") == "1"

_pg_checked: dict[str, str | None] = {}


def postgres_unavailable() -> str | None:
    """None when PostgreSQL answers, else the reason (cached)."""
    if "reason" not in _pg_checked:
        try:
            engine = sa.create_engine(PG_URL, connect_args={"connect_timeout": 3})
            with engine.connect() as conn:
                conn.execute(sa.text("SELECT 1"))
            engine.dispose()
            _pg_checked["reason"] = None
        except Exception as exc:  # noqa: BLE001 - any failure means unavailable
            _pg_checked["reason"] = f"PostgreSQL at {db.redact(PG_URL)} unreachable: " + (
                str(exc).strip().splitlines()[0]
            )
    return _pg_checked["reason"]


def require_postgres() -> None:
    """Skip (or fail in CI, where OAIPMH_REQUIRE_POSTGRES=1) without PostgreSQL."""
    reason = postgres_unavailable()
    if reason:
        if REQUIRE_PG:
            pytest.fail(f"{reason} (OAIPMH_REQUIRE_POSTGRES=1 makes it mandatory)")
        pytest.skip(reason)


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """A fresh PostgreSQL database for this test session (dropped at the end)."""
    require_postgres()
    name = f"oaipmh_test_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = sa.engine.make_url(PG_URL).set(database=name).render_as_string(hide_password=False)
    yield url
    db.dispose_all()
    drop_database(admin, name)


def drop_database(admin: sa.Engine, name: str) -> None:
    """End the connections to a test database and drop it."""
    with admin.connect() as conn:
        conn.execute(sa.text(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :n"
        ), {"n": name})
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}"'))
    admin.dispose()


def _clean_postgres(url: str) -> None:
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        for table in ("oaipmh_record", "oaipmh_harvest_state", "oaipmh_harvester",
                      "oaipmh_setting", "oaipmh_alembic_version"):
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {table} CASCADE"))
    engine.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path,
                 monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An empty database, SQLite and PostgreSQL, set as $OAIPMH_DATABASE_URL."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'oaipmh.sqlite'}"
    else:
        url = request.getfixturevalue("pg_database")
        db.dispose_all()
        _clean_postgres(url)
    monkeypatch.setenv(db.DATABASE_URL_ENV, url)
    yield url
    db.dispose_all()


@pytest.fixture
def sqlite_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An empty SQLite database only, set as $OAIPMH_DATABASE_URL."""
    url = f"sqlite:///{tmp_path / 'oaipmh.sqlite'}"
    monkeypatch.setenv(db.DATABASE_URL_ENV, url)
    yield url
    db.dispose_all()


def _forget_dagster_state_storage() -> None:
    """An earlier test's instance, gone since, would make the next definitions load fail."""
    from oaipmh_dagster.dagster_parts._private import forget_defs_state_storage

    forget_defs_state_storage()


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own $DAGSTER_HOME, and no webserver to reload."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    _forget_dagster_state_storage()
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("OAIPMH_DAGSTER_WEBSERVER", "http://127.0.0.1:9")
    return home


@pytest.fixture
def fixtures_dir() -> Path:
    """The third-party OAI-PMH responses, or a skip when the folder is absent."""
    if not FIXTURES.is_dir():
        pytest.skip(f"third-party fixtures not found at {FIXTURES}")
    return FIXTURES


# -- the command in this process --------------------------------------------------------

ERROR = "oaipmh-dagster: error: "


@dataclass
class Result:
    """Exit code, stdout and stderr of one command."""

    code: int
    out: str
    err: str

    @property
    def error_line(self) -> str:
        """The single error line (fails when stderr holds anything else)."""
        lines = self.err.splitlines()
        assert len(lines) == 1, f"expected one line on stderr, got {self.err!r}"
        assert lines[0].startswith(ERROR), lines[0]
        assert "Traceback" not in self.err
        return lines[0]


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str]) -> Callable[..., Result]:
    """The `oaipmh-dagster` command in this process."""
    from oaipmh_dagster import cli

    def call(*argv: str) -> Result:
        capsys.readouterr()
        with pytest.raises(SystemExit) as done:
            cli.main(list(argv))
        out = capsys.readouterr()
        code = done.value.code
        return Result(0 if code is None else int(code), out.out, out.err)

    return call


@pytest.fixture
def closed_port_url() -> str:
    """A loopback URL nothing listens on."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}/oai"


@pytest.fixture
def instance() -> Iterator[Any]:
    """A throwaway Dagster instance (in-process runs, sensor ticks)."""
    import dagster as dg

    with dg.instance_for_test() as inst:
        yield inst
