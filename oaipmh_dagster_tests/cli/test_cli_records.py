"""`records`: filters, the stored raw XML and a labelled table (both databases)."""

from __future__ import annotations

import json

import pytest

from oaipmh_dagster.harvesting.rows import write_page
from oaipmh_dagster.storage import db
from oaipmh_dagster.storage.store import Store
from oaipmh_dagster_tests.conftest import Result
from oaipmh_dagster_tests.storage.test_store import rec, title_of


def _fail_on_e(raw: str, element: object = None) -> dict:
    if ">oai:x:5<" in raw:
        raise ValueError("cannot read 5")
    return title_of(raw)


@pytest.fixture
def stored(database_url: str) -> Store:
    """Harvester `h`: five records over three sets and dates, a tombstone, a failure."""
    store = Store(db.get_engine(database_url))
    write_page(store, "h", [
        rec("oai:x:1", "2023-05-01T00:00:00Z", sets=("a",)),
        rec("oai:x:2", "2024-01-01T00:00:00Z", sets=("a", "a:b")),
        rec("oai:x:3", "2024-01-01T12:00:00Z", sets=("c",), deleted=True),
        rec("oai:x:4", "2024-06-30T23:59:59Z", sets=("ab",)),
        rec("oai:x:5", "2024-07-01T00:00:00Z", sets=("a:b",)),
    ], run_id="r1", transform=_fail_on_e)
    write_page(store, "other", [rec("oai:x:1", sets=("a",))], run_id="r1", transform=title_of)
    return store


def ids(r: Result) -> list[str]:
    assert r.code == 0, r.err
    return [i["oai_identifier"] for i in json.loads(r.out)]


@pytest.mark.parametrize(("argv", "expected"), [
    ([], ["1", "2", "3", "4", "5"]),
    (["--since", "2024-01-01"], ["2", "3", "4", "5"]),
    (["--since", "2024-01-01T12:00:00Z"], ["3", "4", "5"]),
    (["--since", "2024-07-01T02:00:00+02:00"], ["5"]),
    (["--since", "2030-01-01"], []),
    (["--set", "a"], ["1", "2"]),
    (["--set", "a:b"], ["2", "5"]),
    (["--set", "ab"], ["4"]),
    (["--set", "nosuch"], []),
    (["--deleted"], ["3"]),
    (["--live"], ["1", "2", "4", "5"]),
    (["--id", "oai:x:4"], ["4"]),
    (["--errors"], ["5"]),
    (["--set", "a", "--since", "2024-01-01", "--live"], ["2"]),
    (["--live", "--limit", "2"], ["1", "2"]),
])
def test_filters(run, stored: Store, argv: list[str], expected: list[str]) -> None:
    assert ids(run("records", "h", "--json", *argv)) == [f"oai:x:{n}" for n in expected]


def test_filters_apply_to_the_table(run, stored: Store) -> None:
    r = run("records", "h", "--set", "a:b", "--since", "2024-02-01")
    assert r.code == 0, r.err
    assert "oai:x:5" in r.out and "oai:x:2" not in r.out


def test_every_table_column_has_a_header(run, stored: Store) -> None:
    r = run("records", "h")
    assert r.code == 0, r.err
    header, rule, *rows = r.out.splitlines()
    names = header.split()
    assert names == ["oai_identifier", "datestamp", "status", "sets", "title", "errors"]
    assert len(rule.split()) == len(names)
    by_id = {row.split()[0]: row for row in rows}
    assert "deleted" in by_id["oai:x:3"] and "live" in by_id["oai:x:1"]
    assert "cannot read 5" in by_id["oai:x:5"]


def test_raw(run, stored: Store) -> None:
    r = run("records", "h", "--raw")
    assert r.code == 0, r.err
    for n in (1, 2, 4, 5):
        assert f"<!-- oai:x:{n} " in r.out
        assert f"<dc:title>oai:x:{n}</dc:title>" in r.out
    assert "<!-- oai:x:3 2024-01-01T12:00:00Z deleted: no XML stored -->" in r.out
    assert r.out.index("oai:x:1 ") < r.out.index("oai:x:2 ") < r.out.index("oai:x:4 ")
    r = run("records", "h", "--raw", "--live", "--set", "a:b")
    assert "oai:x:2" in r.out and "oai:x:5" in r.out and "oai:x:1" not in r.out


def test_raw_one_record_is_its_xml_only(run, stored: Store) -> None:
    r = run("records", "h", "--raw", "--id", "oai:x:2")
    assert r.code == 0, r.err
    assert r.out.startswith("<") and "<!--" not in r.out
    assert "<dc:title>oai:x:2</dc:title>" in r.out
    assert r.out.count("<dc:title>") == 1


def test_raw_json_carries_the_xml(run, stored: Store) -> None:
    r = run("records", "h", "--raw", "--json", "--id", "oai:x:1")
    assert r.code == 0, r.err
    [item] = json.loads(r.out)
    assert "<dc:title>oai:x:1</dc:title>" in item["raw_xml"]
    assert "raw_xml" not in json.loads(run("records", "h", "--json").out)[0]


@pytest.mark.parametrize(("argv", "code", "needle"), [
    (["--id", "oai:x:nosuch"], 1, "oai:x:nosuch"),
    (["--id", "oai:x:nosuch", "--json"], 1, "oai:x:nosuch"),
    (["--raw", "--id", "oai:x:nosuch"], 1, "oai:x:nosuch"),
    (["--raw", "--id", "oai:x:3"], 1, "deleted"),
    (["--id", "oai:x:1", "--deleted"], 1, "oai:x:1"),
    (["--since", "2024-02-30"], 2, "--since"),
    (["--since", "yesterday"], 2, "--since"),
    (["--set", "a b"], 2, "--set"),
    (["--id", ""], 2, "--id"),
    (["--deleted", "--errors"], 0, ""),
])
def test_bad_input(run, stored: Store, argv: list[str], code: int, needle: str) -> None:
    r = run("records", "h", *argv)
    assert r.code == code
    if code:
        assert needle in r.error_line
        assert r.out == ""


@pytest.mark.parametrize("command", [
    ["records", "nope"], ["records", "nope", "--json"], ["records", "nope", "--raw"],
    ["profile", "nope"], ["profile", "nope", "--json"],
    ["export", "nope", "--format", "jsonl", "--output", "-"],
])
def test_an_unknown_harvester_is_an_error(run, stored: Store, command: list[str]) -> None:
    """An id that is neither registered nor holds stored records: one line, exit 1 (as
    `harvester show`), no empty result on stdout."""
    r = run(*command)
    assert r.code == 1
    assert r.error_line.startswith("oaipmh-dagster: error: no harvester 'nope'")
    assert r.out == ""


def test_a_removed_harvester_shows_its_kept_records(run, stored: Store) -> None:
    """`harvester remove` keeps the records: they stay readable under their id (`h` has
    records and no row)."""
    r = run("records", "h", "--json")
    assert (r.code, len(json.loads(r.out)), r.err) == (0, 5, "")
    r = run("profile", "h", "--json")
    assert r.code == 0 and json.loads(r.out)["live"] == 4
