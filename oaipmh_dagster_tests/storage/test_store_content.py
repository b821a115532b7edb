"""The store converges by content (a hash per record), and one record's bad value costs
only that record: over-long identifiers, unreadable or over-long datestamps, metadata that
could not be parsed. SQLite and PostgreSQL."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import sqlalchemy as sa

from oaipmh_dagster.demo.dataset import DAY, make_dataset
from oaipmh_dagster.demo.server import OAIServer
from oaipmh_dagster.harvesting.harvest import RunOptions, harvest
from oaipmh_dagster.harvesting.rows import write_page
from oaipmh_dagster.oai import ClientOptions
from oaipmh_dagster.storage.registry import Harvester
from oaipmh_dagster.storage.store import (
    DATESTAMP_PLACEHOLDER,
    IDENTIFIER_MAX,
    Store,
    record_table,
)
from oaipmh_dagster_tests.storage.test_store import FakeRecord, counts, rec, rows, title_of

DC = {"metadata_prefix": "oai_dc", "transformer": "oai_dc"}
FAST = ClientOptions(max_retries=1, backoff_base=0.01, backoff_max=0.05, read_timeout=5)
FULL = RunOptions(full=True)


@pytest.fixture
def store(database_url: str) -> Store:
    return Store()


# -- convergence by content --------------------------------------------------------------


def test_changed_content_with_the_same_datestamp_is_rewritten(store: Store) -> None:
    write_page(store, "h", [rec("a", title="v1"), rec("b")], run_id="r1", transform=title_of,
                      **DC)
    second = write_page(store, "h", [rec("a", title="v2"), rec("b")], run_id="r2",
                               transform=title_of, **DC)
    assert counts(second) == (0, 1, 0, 1, 0)
    stored = rows(store)
    assert stored["a"]["metadata"] == {"title": "v2"} and stored["a"]["run_id"] == "r2"
    assert stored["b"]["run_id"] == "r1"
    third = write_page(store, "h", [rec("a", title="v2"), rec("b")], run_id="r3",
                              transform=title_of, **DC)
    assert counts(third) == (0, 0, 0, 2, 0)


def test_changed_sets_or_deletion_with_the_same_datestamp(store: Store) -> None:
    write_page(store, "h", [rec("a", sets=("s1",)), rec("b")], run_id="r1", **DC)
    c = write_page(store, "h", [rec("a", sets=("s1", "s2")), rec("b", deleted=True)],
                          run_id="r2", **DC)
    assert counts(c) == (0, 1, 1, 0, 0)
    assert rows(store)["a"]["sets"] == ["s1", "s2"]
    assert rows(store)["b"]["deleted"]


def test_another_prefix_or_transformer_rewrites(store: Store) -> None:
    write_page(store, "h", [rec("a")], run_id="r1", transform=title_of, **DC)
    same_bytes = [rec("a")]
    c = write_page(store, "h", same_bytes, run_id="r2", transform=title_of,
                          metadata_prefix="datacite", transformer="oai_dc")
    assert c.updated == 1
    c = write_page(store, "h", same_bytes, run_id="r3", transform=title_of,
                          metadata_prefix="datacite", transformer="datacite")
    assert c.updated == 1
    c = write_page(store, "h", same_bytes, run_id="r4", transform=title_of,
                          metadata_prefix="datacite", transformer="datacite")
    assert c.unchanged == 1
    assert rows(store)["a"]["run_id"] == "r3"


def test_rows_without_a_hash_count_as_changed_once(store: Store) -> None:
    write_page(store, "h", [rec("a"), rec("b")], run_id="r1", transform=title_of, **DC)
    with store.engine.begin() as conn:  # as left by the migration from an older schema
        conn.execute(record_table.update().values(content_hash=None))
    c = write_page(store, "h", [rec("a"), rec("b")], run_id="r2", transform=title_of, **DC)
    assert counts(c) == (0, 2, 0, 0, 0)
    c = write_page(store, "h", [rec("a"), rec("b")], run_id="r3", transform=title_of, **DC)
    assert counts(c) == (0, 0, 0, 2, 0)


def test_a_page_costs_a_constant_number_of_statements(store: Store) -> None:
    """One SELECT of the page's hashes and one batch upsert, however many records."""
    statements: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith(("SELECT", "INSERT", "UPDATE")):
            statements.append(statement)

    page = [rec(f"id{i:03d}", title=f"t{i}") for i in range(200)]
    write_page(store, "h", page[:1], run_id="warm", transform=title_of, **DC)
    sa.event.listen(store.engine, "before_cursor_execute", count)
    try:
        write_page(store, "h", page, run_id="r1", transform=title_of, **DC)
        first = len(statements)
        statements.clear()
        write_page(store, "h", page, run_id="r2", transform=title_of, **DC)
        again = len(statements)
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", count)
    assert first <= 2, statements
    assert again == 1, statements


def _day_server_harvester(server: OAIServer, **fields: Any) -> Harvester:
    return Harvester(id="c", base_url=server.base_url,
                     metadata_prefix=str(fields.pop("metadata_prefix", "oai_dc")), **fields)


def test_harvest_sees_a_second_change_on_the_same_day(database_url: str) -> None:
    """Day granularity: a record changed again on the day of its datestamp keeps that
    datestamp; a full harvest rewrites it, and only it."""
    ds = make_dataset(120, seed=5, granularity=DAY, deleted_ratio=0.0)
    with OAIServer(ds, page_size=50) as server:
        store = Store()
        h = _day_server_harvester(server)
        harvest(h, store, run_id="r1", options=FAST)
        target = next(iter(ds))
        changed = target.metadata["oai_dc"].replace("</dc:title>", " (second edition)</dc:title>",
                                                    1)
        assert changed != target.metadata["oai_dc"]
        ds.upsert(replace(target, metadata={**target.metadata, "oai_dc": changed}))
        stats = harvest(h, store, run_id="r2", run=FULL, options=FAST)
        assert (stats.updated, stats.unchanged) == (1, 119)
        item = next(i for i in store.iter_records("c") if i["oai_identifier"] == target.identifier)
        assert "(second edition)" in str(item["metadata"])


def test_full_harvest_after_a_prefix_change_rewrites_every_record(database_url: str) -> None:
    ds = make_dataset(60, seed=6, deleted_ratio=0.0)
    with OAIServer(ds, page_size=50) as server:
        store = Store()
        harvest(_day_server_harvester(server), store, run_id="r1", options=FAST)
        stats = harvest(_day_server_harvester(server, metadata_prefix="datacite"), store,
                        run_id="r2", run=FULL, options=FAST)
        assert (stats.updated, stats.unchanged) == (60, 0)
        raw = [i["raw_xml"] for i in store.iter_records("c", with_raw=True)]
        assert all("datacite" in x and "oai_dc" not in x for x in raw)


# -- one bad value costs one record ------------------------------------------------------


def test_overlong_identifier_costs_only_that_record(store: Store) -> None:
    long_id = "oai:x:" + "y" * IDENTIFIER_MAX
    c = write_page(store, "h", [rec("a"), rec(long_id), rec("b")], run_id="r1",
                          transform=title_of, **DC)
    assert counts(c) == (2, 0, 0, 0, 1)
    assert len(c.failed_ids) == 1
    named = c.failed_ids[0]
    assert named.startswith("oai:x:yyy") and len(named) < 200
    assert set(rows(store)) == {"a", "b"}
    # At the limit exactly it fits.
    limit = "z" * IDENTIFIER_MAX
    assert write_page(store, "h", [rec(limit)], run_id="r2", **DC).new == 1
    assert limit in rows(store)


@pytest.mark.parametrize("datestamp", ["not a date", "2024-01-02T03:04:05Z" + "9" * 40])
def test_unreadable_or_overlong_datestamp_is_stored_with_an_error(
    store: Store, datestamp: str
) -> None:
    c = write_page(store, "h", [rec("a", datestamp), rec("b")], run_id="r1",
                          transform=title_of, **DC)
    assert (c.new, c.failed, c.failed_ids) == (2, 1, ["a"])
    row = rows(store)["a"]
    assert row["datestamp"] == DATESTAMP_PLACEHOLDER
    assert row["metadata"] == {"title": "a"}
    [error] = row["errors"]
    assert (error["type"], error["location"]) == ("datestamp", "header")
    assert datestamp[:20] in error["message"]
    assert store.failed_identifiers("h") == ["a"]
    # The placeholder sorts before every real datestamp.
    assert DATESTAMP_PLACEHOLDER < "0001-01-01T00:00:00Z"
    # The same record again is unchanged (no rewrite on every harvest).
    again = write_page(store, "h", [rec("a", datestamp), rec("b")], run_id="r2",
                              transform=title_of, **DC)
    assert counts(again) == (0, 0, 0, 2, 0)


class MetadataParseError(Exception):
    """Stands for the error the page parse attaches to a record it could not read."""


def test_record_with_a_metadata_parse_error_is_stored_with_it(store: Store) -> None:
    bad = rec("bad")
    bad_record = FakeRecord(bad.header, b"<oai_dc:dc><dc:title>broken")
    bad_record.parse_error = MetadataParseError("metadata is not well-formed XML")  # type: ignore[attr-defined]
    c = write_page(store, "h", [rec("good"), bad_record], run_id="r1", transform=title_of, **DC)
    assert (c.new, c.failed, c.failed_ids) == (2, 1, ["bad"])
    row = rows(store)["bad"]
    assert row["metadata"] is None
    assert row["raw_xml"] == "<oai_dc:dc><dc:title>broken"
    [error] = row["errors"]
    assert error["type"] == "MetadataParseError"
    assert "not well-formed" in error["message"] and error["location"] == "metadata"
    assert rows(store)["good"]["metadata"] == {"title": "good"}


def test_full_harvest_after_a_transformer_change_rewrites_every_record(
    database_url: str,
) -> None:
    ds = make_dataset(60, seed=8, deleted_ratio=0.0)
    with OAIServer(ds, page_size=50) as server:
        store = Store()
        harvest(_day_server_harvester(server), store, run_id="r1", options=FAST)
        before = {i["oai_identifier"]: i["metadata"] for i in store.iter_records("c")}
        stats = harvest(_day_server_harvester(server, transformer="xml"), store, run_id="r2",
                        run=FULL, options=FAST)
        assert (stats.updated, stats.unchanged) == (60, 0)
        after = {i["oai_identifier"]: i["metadata"] for i in store.iter_records("c")}
        assert after.keys() == before.keys()
        assert all(after[k] != before[k] for k in after)
        again = harvest(_day_server_harvester(server, transformer="xml"), store, run_id="r3",
                        run=FULL, options=FAST)
        assert (again.updated, again.unchanged) == (0, 60)


def test_a_nul_in_transformed_metadata_costs_only_its_record(store: Store) -> None:
    """PostgreSQL's JSON cannot hold U+0000: a transformer output with one fails that
    record (kept with its raw XML and an error), not the page, on every database."""
    def transform(raw: str, element: Any) -> dict[str, Any]:
        return {"title": "x\x00y"} if "NUL" in raw else {"title": "fine"}

    c = write_page(store, "h", [rec("a"), rec("b", title="NUL here")], run_id="r1",
                   transform=transform, metadata_prefix="oai_dc", transformer="p")
    assert (c.new, c.failed, c.failed_ids) == (2, 1, ["b"])
    by_id = {r["oai_identifier"]: r for r in store.iter_records("h")}
    assert by_id["a"]["metadata"] == {"title": "fine"} and not by_id["a"]["errors"]
    assert by_id["b"]["metadata"] is None
    assert [e["type"] for e in by_id["b"]["errors"]] == ["nul_character"]
    assert "U+0000" in by_id["b"]["errors"][0]["message"]


def test_a_re_transform_to_nul_costs_only_its_records(store: Store) -> None:
    from oaipmh_dagster.harvesting.rows import retransform

    write_page(store, "h", [rec("a"), rec("b", title="NUL here")], run_id="r1",
               transform=title_of, metadata_prefix="oai_dc", transformer="t")
    counts = retransform(store, "h", lambda raw, element=None: (
        {"title": "x\x00y"} if "NUL" in raw else {"title": "fine"}), run_id="r2")
    assert (counts.updated, counts.failed, counts.failed_ids) == (1, 1, ["b"])
    by_id = {r["oai_identifier"]: r for r in store.iter_records("h")}
    assert by_id["a"]["metadata"] == {"title": "fine"}
    assert by_id["b"]["metadata"] is None
    assert by_id["b"]["errors"][0]["type"] == "nul_character"
