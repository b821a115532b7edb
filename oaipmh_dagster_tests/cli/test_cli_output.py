"""Human output reads as words: no Python reprs, plurals right, day datestamps as dates,
identifiers left-aligned. `--json` is left as it is."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from oaipmh_dagster.harvesting.rows import write_page
from oaipmh_dagster.storage import db
from oaipmh_dagster.storage.registry import Harvester, Registry
from oaipmh_dagster.storage.store import Store
from oaipmh_dagster.words import count, datestamp, human
from oaipmh_dagster_tests.conftest import Result
from oaipmh_dagster_tests.storage.test_store import rec, title_of


def test_words() -> None:
    assert count(1, "record") == "1 record"
    assert count(0, "record") == "0 records"
    assert count(2, "retry", "retries") == "2 retries"
    assert human(["datasets", "theses"]) == "datasets, theses"
    assert human(()) == human(None) == human("") == "-"
    assert human(False) == "no" and human(True) == "yes"
    assert human(0) == "0" and human(60.0) == "60.0"
    assert datestamp("2024-01-02T00:00:00Z") == "2024-01-02"
    assert datestamp("2024-01-02T10:00:00Z") == "2024-01-02T10:00:00Z"


@pytest.fixture
def registered(sqlite_url: str) -> Store:
    """Harvester `h` (one set, schedule off by default) with two stored records whose
    identifiers are numbers, one with a day datestamp."""
    engine = db.get_engine(sqlite_url)
    Registry(engine).add(Harvester(id="h", base_url="http://127.0.0.1:9/oai",
                                   metadata_prefix="oai_dc", sets=("datasets",),
                                   cron="0 3 * * *", enabled=False))
    store = Store(engine)
    write_page(store, "h", [rec("7", "2024-01-02T00:00:00Z"),
                            rec("12345", "2024-01-03T10:11:12Z", deleted=True)],
               run_id="r1", transform=title_of)
    return store


def test_show_has_no_python_reprs(registered: Store, run: Callable[..., Result]) -> None:
    out = run("harvester", "show", "h").out
    assert "['" not in out and "False" not in out and "True" not in out, out
    assert "            sets: datasets" in out
    assert "         enabled: no" in out
    data = json.loads(run("harvester", "show", "h", "--json").out)
    assert data["sets"] == ["datasets"] and data["enabled"] is False


def test_records_table(registered: Store, run: Callable[..., Result]) -> None:
    _header, _rule, *rows = run("records", "h").out.splitlines()
    assert rows[0].startswith("12345 ") and rows[1].startswith("7 "), rows
    assert " 2024-01-02 " in rows[1] and "T00:00:00Z" not in rows[1]
    assert " 2024-01-03T10:11:12Z " in rows[0]
    assert json.loads(run("records", "h", "--json").out)[1]["datestamp"] == (
        "2024-01-02T00:00:00Z")


def test_export_csv_flags_and_plural(registered: Store, run: Callable[..., Result],
                                     tmp_path: Path) -> None:
    out = tmp_path / "h.csv"
    r = run("export", "h", "--format", "csv", "--output", str(out))
    assert r.out.strip() == f"wrote 2 records of h to {out}"
    deleted = [line.split(",")[2] for line in out.read_text().splitlines()[1:]]
    assert deleted == ["true", "false"]
    write_page(registered, "one", [rec("oai:x:1")], run_id="r2", transform=title_of)
    Registry(db.get_engine()).add(Harvester(id="one", base_url="http://127.0.0.1:9/oai",
                                            metadata_prefix="oai_dc"))
    r = run("export", "one", "--format", "jsonl", "--output", str(tmp_path / "one.jsonl"))
    assert r.out.startswith("wrote 1 record of one to ")
