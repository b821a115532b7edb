"""The command says which database and Dagster instance it reads when it finds nothing,
creates no state where it only reads, and a deployment never falls back to SQLite."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from oaipmh_dagster.storage import db
from oaipmh_dagster_tests.conftest import Result


@pytest.fixture
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory with no DAGSTER_HOME and no database URL set."""
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    monkeypatch.chdir(folder)
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    monkeypatch.delenv(db.DATABASE_URL_ENV, raising=False)
    monkeypatch.delenv(db.REQUIRE_URL_ENV, raising=False)
    return folder


def test_list_names_what_it_read_and_creates_nothing(
        elsewhere: Path, run: Callable[..., Result]) -> None:
    r = run("harvester", "list")
    assert r.code == 0
    assert "no harvesters in database" in r.out
    assert str(elsewhere / ".dagster_home" / "oaipmh.sqlite") in r.out
    assert "$DAGSTER_HOME is not set" in r.out
    assert not (elsewhere / ".dagster_home").exists()
    assert run("harvester", "list", "--json").out.strip() == "[]"
    assert not (elsewhere / ".dagster_home").exists()


def test_unknown_harvester_names_the_database(
        elsewhere: Path, run: Callable[..., Result]) -> None:
    for argv in (("harvester", "show", "nope"), ("since", "show", "nope"),
                 ("harvest", "nope")):
        r = run(*argv)
        assert r.code == 1, argv
        line = r.error_line
        assert "no harvester 'nope' in database" in line, line
        assert str(elsewhere / ".dagster_home") in line
    assert not (elsewhere / ".dagster_home").exists()


def test_list_verbose_says_where(sqlite_url: str, run: Callable[..., Result]) -> None:
    r = run("harvester", "list", "--verbose")
    assert r.out.splitlines()[0] == f"reading {db.where()}"
    assert sqlite_url.removeprefix("sqlite:///") in r.out.splitlines()[0]


def test_a_deployment_refuses_the_sqlite_fallback(
        elsewhere: Path, run: Callable[..., Result], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(db.REQUIRE_URL_ENV, "1")
    monkeypatch.setenv("DAGSTER_HOME", str(elsewhere / "home"))
    for argv in (("init",), ("harvester", "add", "x", "--url", "http://127.0.0.1:9/oai",
                             "--prefix", "oai_dc", "--no-check")):
        r = run(*argv)
        assert r.code == 1, argv
        assert "OAIPMH_DATABASE_URL is not set" in r.error_line
    assert not (elsewhere / "home" / "oaipmh.sqlite").exists()
    with pytest.raises(db.DatabaseUnavailable, match="OAIPMH_REQUIRE_DATABASE_URL"):
        db.database_url()
    monkeypatch.setenv(db.DATABASE_URL_ENV, f"sqlite:///{elsewhere / 'given.sqlite'}")
    assert db.database_url().endswith("given.sqlite")


def test_the_image_requires_the_database_url() -> None:
    dockerfile = (Path(__file__).resolve().parents[2] / "Dockerfile").read_text()
    assert f"{db.REQUIRE_URL_ENV}=1" in dockerfile
