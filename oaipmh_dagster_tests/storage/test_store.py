"""The record store: page upserts, tombstones, errors, the lease and the checkpoint."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from oaipmh_dagster.harvesting.rows import Counts, retransform, write_page
from oaipmh_dagster.storage import db
from oaipmh_dagster.storage.pgcopy import copy_text
from oaipmh_dagster.storage.store import (
    STALE_AFTER,
    HarvestInProgress,
    LeaseLost,
    Store,
    record_table,
    state_table,
    utc_datestamp,
)

DC = (
    '<oai_dc:dc xmlns:oai_dc="http://www.openarchives.org/OAI/2.0/oai_dc/" '
    'xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:title>{title}</dc:title></oai_dc:dc>'
)


@dataclass
class FakeHeader:
    identifier: str
    datestamp: str
    set_specs: tuple[str, ...] = ()
    deleted: bool = False

    @property
    def datestamp_utc(self) -> datetime | None:
        try:
            value = datetime.fromisoformat(self.datestamp.replace("Z", "+00:00"))
        except ValueError:
            return None
        return value if value.tzinfo else value.replace(tzinfo=UTC)


@dataclass
class FakeRecord:
    header: FakeHeader
    metadata: bytes | None = None


def rec(identifier: str, datestamp: str = "2024-01-02T03:04:05Z", *, sets: tuple = (),
        deleted: bool = False, title: str | None = None) -> FakeRecord:
    """A record as the store sees it: a header and the metadata XML bytes."""
    metadata = None if deleted else DC.format(title=title or identifier).encode()
    return FakeRecord(FakeHeader(identifier, datestamp, tuple(sets), deleted), metadata)


def title_of(raw: str, element: Any = None) -> dict[str, Any]:
    """A tiny transform: the text between the title tags."""
    return {"title": raw.split("<dc:title>")[1].split("</dc:title>")[0]}


def broken(raw: str, element: Any = None) -> dict[str, Any]:
    raise KeyError("no title here")


@pytest.fixture
def store(database_url: str) -> Store:
    return Store(db.get_engine(database_url))


def rows(store: Store, harvester_id: str = "h") -> dict[str, dict[str, Any]]:
    with store.engine.connect() as conn:
        result = conn.execute(
            sa.select(record_table).where(record_table.c.harvester_id == harvester_id)
        ).mappings()
        return {r["oai_identifier"]: dict(r) for r in result}


def counts(c: Counts) -> tuple[int, int, int, int, int]:
    return (c.new, c.updated, c.deleted, c.unchanged, c.failed)


# -- upserts ------------------------------------------------------------------------


def test_upsert_counts(store: Store) -> None:
    first = write_page(store, "h", [rec("a"), rec("b"), rec("c", deleted=True)], run_id="r1",
                              transform=title_of)
    assert counts(first) == (2, 0, 1, 0, 0)
    second = write_page(store,
        "h",
        [rec("a"),                                    # same datestamp: unchanged
         rec("b", "2024-02-01T00:00:00Z", title="B2"),  # newer: updated
         rec("c", deleted=True),                      # still deleted: unchanged
         rec("d"),                                    # new
         rec("a", deleted=True, datestamp="2024-03-01T00:00:00Z")],  # repeated id: last wins
        run_id="r2", transform=title_of,
    )
    assert counts(second) == (1, 1, 1, 1, 0)
    stored = rows(store)
    assert stored["a"]["deleted"] and stored["a"]["metadata"] is None
    assert stored["b"]["metadata"] == {"title": "B2"}
    assert stored["b"]["datestamp"] == "2024-02-01T00:00:00Z"
    assert store.count("h") == 2 and store.count("h", live_only=False) == 4
    assert store.counts("h") == {"total": 4, "live": 2, "deleted": 2, "failed": 0}



def test_the_drivers_upsert_stores_what_sqlalchemys_does(store: Store) -> None:
    """The page upsert runs on the driver (SQLite's executemany, psycopg2's
    execute_values); what it stores reads back as the same statement through SQLAlchemy
    stores it: datetimes (a shared one and distinct ones), booleans, NULLs, a row dict
    without the optional keys, a replaced row."""
    shared = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    base = {"harvester_id": "h", "datestamp": "2024-01-02T03:04:05Z", "sets": "[]",
            "errors": "[]", "harvested_at": shared}
    # COPY's specials (PostgreSQL writes new rows with COPY: `pgcopy`) and their look-alikes.
    awkward = "<x a='\\N'>\u00e9\t\\t\n\\n\r\n\\.\n\\\\ \U0001f600</x>"
    meta = json.dumps({"t": ["\u00e9", "\\N", "a\tb\nc", "\\"]}, ensure_ascii=False)
    given = [
        {**base, "oai_identifier": "a", "deleted": False, "raw_xml": awkward,
         "metadata": meta, "run_id": "r1", "transformed_at": shared,
         "content_hash": "0" * 32, "about": None},
        {**base, "oai_identifier": "b", "deleted": True, "run_id": None,
         "transformed_at": datetime(2025, 12, 31, 23, 59, 59, tzinfo=UTC)},
        {**base, "oai_identifier": "c", "deleted": False,
         "harvested_at": datetime(2020, 2, 29, tzinfo=UTC)},
    ]
    postgres = store.engine.dialect.name == "postgresql"
    with store.page("h", None) as page:
        page.upsert(given[:1])
    assert page.copied == (1 if postgres else 0)
    with store.page("h", None) as page:
        page.upsert(given)  # "a" again: replaced (the COPY fails, the upsert runs)
    assert page.copied == 0
    with store.engine.begin() as conn:  # the same rows through SQLAlchemy, for reference
        conn.execute(record_table.insert(), [
            {**{c.name: None for c in record_table.columns},
             **{k: v for k, v in r.items() if k not in ("sets", "errors", "metadata")},
             "harvester_id": "ref", "sets": [], "errors": [],
             "metadata": None if r.get("metadata") is None else json.loads(meta)}
            for r in given])
    ours, ref = rows(store, "h"), rows(store, "ref")
    assert set(ours) == {"a", "b", "c"} and set(ref) == set(ours)
    for key in ours:
        assert {**ours[key], "harvester_id": "ref"} == ref[key]
    a = ours["a"]
    assert a["deleted"] is False and ours["b"]["deleted"] is True
    assert a["harvested_at"].replace(tzinfo=UTC) == shared
    assert a["metadata"] == json.loads(meta) and a["raw_xml"] == awkward
    assert ours["c"]["transformed_at"] is None and ours["c"]["raw_xml"] is None
    with store.page("h", None) as page:
        page.upsert([{**given[2], "oai_identifier": "d", "raw_xml": awkward}])
    assert page.copied == (1 if postgres else 0)
    assert rows(store)["d"]["raw_xml"] == awkward


def test_a_stored_row_in_a_page_of_new_ones_is_upserted(store: Store) -> None:
    """A page the writer holds for new (`replacing=0`) may repeat a record an earlier
    page of the same transaction wrote: on PostgreSQL its COPY fails on the primary key,
    and only that page is undone and upserted; the earlier page stays."""
    at = datetime(2026, 1, 2, tzinfo=UTC)

    def row(identifier: str, title: str) -> dict[str, Any]:
        return {"harvester_id": "h", "oai_identifier": identifier, "datestamp": "2024-01-02",
                "deleted": False, "sets": "[]", "errors": "[]", "harvested_at": at,
                "raw_xml": DC.format(title=title), "metadata": json.dumps({"title": title}),
                "content_hash": title}

    postgres = store.engine.dialect.name == "postgresql"
    with store.page("h", None) as page:
        page.upsert([row("a", "a1"), row("b", "b1")], replacing=0)
        page.upsert([row("b", "b2"), row("c", "c1")], replacing=0)  # "b": stored already
        page.upsert([row("d", "d1")], replacing=0)
    assert page.copied == (3 if postgres else 0)
    assert {k: r["content_hash"] for k, r in rows(store).items()} == {
        "a": "a1", "b": "b2", "c": "c1", "d": "d1"}
    assert rows(store)["b"]["metadata"] == {"title": "b2"}


def test_copy_text_leaves_unknown_types_to_the_insert() -> None:
    """A value COPY would have to guess at (a dict) makes the page an INSERT's, which
    adapts it or refuses it as before; the specials are escaped."""
    assert copy_text([{"a": {"x": 1}}], ["a"]) is None
    assert copy_text([{"a": b"x"}], ["a"]) is None
    assert copy_text([{"a": "x\\y\tz\n\r", "b": None, "c": True}, {"a": ""}],
                     ["a", "b", "c"]) == "x\\\\y\\tz\\n\\r\t\\N\tt\n\t\\N\t\\N\n"

def test_unchanged_records_are_not_rewritten(store: Store) -> None:
    write_page(store, "h", [rec("a"), rec("b")], run_id="old", transform=title_of)
    before = rows(store)
    again = write_page(store, "h", [rec("a"), rec("b", "2024-05-05T00:00:00Z")], run_id="new",
                              transform=title_of)
    assert counts(again) == (0, 1, 0, 1, 0)
    after = rows(store)
    assert after["a"]["run_id"] == "old"
    assert after["a"]["harvested_at"] == before["a"]["harvested_at"]
    assert after["b"]["run_id"] == "new"


def test_datestamps_are_normalized_to_utc(store: Store) -> None:
    write_page(store, "h", [rec("a", "2024-01-02T04:04:05+01:00"), rec("d", "2024-01-02")],
                      run_id="r")
    stored = rows(store)
    assert stored["a"]["datestamp"] == "2024-01-02T03:04:05Z"
    assert stored["d"]["datestamp"] == "2024-01-02T00:00:00Z"
    # The same instant written differently is unchanged.
    again = write_page(store, "h", [rec("a", "2024-01-02T03:04:05Z")], run_id="r2")
    assert again.unchanged == 1
    assert utc_datestamp(datetime(2024, 1, 1, 1, tzinfo=UTC) + timedelta(seconds=1)) == (
        "2024-01-01T01:00:01Z")


def test_deleted_header_becomes_tombstone(store: Store) -> None:
    write_page(store, "h", [rec("a", sets=("s1",))], run_id="r1", transform=title_of)
    assert rows(store)["a"]["raw_xml"] is not None
    c = write_page(store, "h", [rec("a", "2024-06-01T00:00:00Z", deleted=True)], run_id="r2",
                          transform=title_of)
    assert counts(c) == (0, 0, 1, 0, 0)
    row = rows(store)["a"]
    assert row["deleted"] is True or row["deleted"] == 1
    assert row["raw_xml"] is None and row["metadata"] is None and row["errors"] == []
    assert row["datestamp"] == "2024-06-01T00:00:00Z"
    item = next(store.iter_records("h"))
    assert item["deleted"] is True and item["metadata"] is None
    # Reappearing later makes it live again.
    c = write_page(store, "h", [rec("a", "2024-07-01T00:00:00Z", title="back")], run_id="r3",
                          transform=title_of)
    assert c.updated == 1
    assert rows(store)["a"]["metadata"] == {"title": "back"}


def test_same_identifier_under_two_harvesters(store: Store) -> None:
    write_page(store, "one", [rec("oai:x:1", title="first")], run_id="r1", transform=title_of)
    c = write_page(store, "two", [rec("oai:x:1", title="second")], run_id="r2",
                          transform=title_of)
    assert c.new == 1
    assert rows(store, "one")["oai:x:1"]["metadata"] == {"title": "first"}
    assert rows(store, "two")["oai:x:1"]["metadata"] == {"title": "second"}
    assert store.delete_harvester_records("one") == 1
    assert rows(store, "one") == {}
    assert len(rows(store, "two")) == 1


def test_transform_failure_is_stored(store: Store) -> None:
    c = write_page(store, "h", [rec("good"), rec("bad")], run_id="r1",
                          transform=lambda raw, el: broken(raw) if ">bad<" in raw else title_of(raw))
    assert counts(c) == (2, 0, 0, 0, 1)
    assert c.failed_ids == ["bad"]
    bad = rows(store)["bad"]
    assert bad["metadata"] is None
    assert bad["raw_xml"] is not None and ">bad<" in bad["raw_xml"]  # raw is kept
    assert len(bad["errors"]) == 1
    error = bad["errors"][0]
    assert error["type"] == "KeyError"
    assert "no title here" in error["message"]
    assert error["location"]
    assert store.failed_identifiers("h") == ["bad"]
    assert store.counts("h")["failed"] == 1
    assert [i["oai_identifier"] for i in store.iter_records("h", errors_only=True)] == ["bad"]
    # The same datestamp again: an errored record is not 'unchanged', so it is rewritten.
    again = write_page(store, "h", [rec("good"), rec("bad")], run_id="r2", transform=title_of)
    assert counts(again) == (0, 1, 0, 1, 0)
    fixed = rows(store)["bad"]
    assert fixed["errors"] == [] and fixed["metadata"] == {"title": "bad"}
    assert fixed["run_id"] == "r2"
    assert store.failed_identifiers("h") == []


def test_counts_read_the_rows_once_without_errors(store: Store) -> None:
    """The records op and its check count after every run: a harvester without errors is
    one pass over its rows; with some, only they are read again, and schema violations
    alone are no failure."""
    statements: list[str] = []
    sa.event.listen(store.engine, "before_cursor_execute",
                    lambda *args: statements.append(args[2]))
    write_page(store, "h", [rec("a"), rec("b"), rec("c", deleted=True)], run_id="r",
               transform=title_of)
    statements.clear()
    assert store.counts("h") == {"total": 3, "live": 2, "deleted": 1, "failed": 0}
    assert len(statements) == 1
    write_page(store, "h", [rec("bad")], run_id="r2", transform=broken)
    statements.clear()
    assert store.counts("h")["failed"] == 1
    assert len(statements) == 2
    with store.engine.begin() as conn:  # a schema violation alone: stored, not failed
        conn.execute(record_table.update().where(record_table.c.oai_identifier == "a")
                     .values(errors=[{"type": "schema", "message": "m"}]))
    assert store.counts("h")["failed"] == 1


def test_transform_error_with_location(store: Store) -> None:
    from oaipmh_dagster.harvesting.harvest import make_transform

    record = rec("x")
    record.metadata = b"<oai_dc:dc xmlns:oai_dc='http://www.openarchives.org/OAI/2.0/oai_dc/'"
    c = write_page(store, "h", [record], run_id="r", transform=make_transform("oai_dc"))
    assert c.failed == 1
    error = rows(store)["x"]["errors"][0]
    assert set(error) >= {"type", "message", "location"}
    assert error["type"] and error["message"]


def test_retransform(store: Store) -> None:
    write_page(store, "h", [rec("a"), rec("b"), rec("c", deleted=True)], run_id="r",
                      transform=broken)
    assert store.counts("h")["failed"] == 2
    c = retransform(store, "h", title_of, run_id="r2", batch=1)
    assert (c.updated, c.failed) == (2, 0)
    assert rows(store)["a"]["metadata"] == {"title": "a"}
    assert store.counts("h")["failed"] == 0


def test_iter_records_shape(store: Store) -> None:
    write_page(store, "h", [rec(f"id{i:03d}", sets=("s",)) for i in range(25)], run_id="r",
                      transform=title_of)
    items = list(store.iter_records("h", batch=7, with_raw=True))
    assert [i["oai_identifier"] for i in items] == [f"id{i:03d}" for i in range(25)]
    first = items[0]
    assert set(first) >= {"oai_identifier", "datestamp", "deleted", "sets", "metadata",
                          "errors", "harvested_at", "run_id", "raw_xml"}
    assert first["sets"] == ["s"] and first["errors"] == [] and first["deleted"] is False
    assert first["harvested_at"].endswith("Z")
    assert store.snapshot("h")["id000"] == ("2024-01-02T03:04:05Z", False, ("s",))


def test_empty_page(store: Store) -> None:
    assert counts(write_page(store, "h", [], run_id="r")) == (0, 0, 0, 0, 0)


# -- lease and checkpoint ----------------------------------------------------------


def test_lease_is_exclusive(store: Store) -> None:
    assert store.acquire("h", "run1") is None
    with pytest.raises(HarvestInProgress, match="run1"):
        store.acquire("h", "run2", wait=False)
    # Other harvesters are independent, and the holder may re-acquire its own lease.
    assert store.acquire("other", "run2") is None
    store.acquire("h", "run1")
    store.release("h", "run1", succeeded=True)
    assert store.acquire("h", "run2") is None
    assert store.state("h")["run_id"] == "run2"


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_lease_of_dead_process_is_taken_over(store: Store) -> None:
    store.acquire("h", "run1")
    store.save_checkpoint("h", "run1", {"token": "t1"})
    with store.engine.begin() as conn:
        conn.execute(state_table.update().values(holder=f"{socket.gethostname()}:{_dead_pid()}"))
    assert store.acquire("h", "run2") == {"token": "t1"}
    state = store.state("h")
    assert state["run_id"] == "run2" and state["status"] == "running"


def test_lease_stale_by_callback_or_silence(store: Store) -> None:
    store.acquire("h", "run1")
    with pytest.raises(HarvestInProgress):
        store.acquire("h", "run2", is_stale=lambda run_id: False, wait=False)
    assert store.acquire("h", "run2", is_stale=lambda run_id: run_id == "run1") is None
    # A holder on another host that has been silent too long.
    with store.engine.begin() as conn:
        conn.execute(state_table.update().values(
            holder="elsewhere:1", heartbeat_at=datetime.now(UTC) - STALE_AFTER * 2))
    store.acquire("h", "run3", wait=False)
    assert store.state("h")["run_id"] == "run3"


def test_release_success_clears_checkpoint(store: Store) -> None:
    store.acquire("h", "run1")
    store.save_checkpoint("h", "run1", {"token": "t"})
    store.release("h", "run1", succeeded=True)
    state = store.state("h")
    assert state["status"] == "succeeded" and state["checkpoint"] is None
    assert store.acquire("h", "run2") is None


def test_release_failure_keeps_checkpoint(store: Store) -> None:
    store.acquire("h", "run1")
    store.save_checkpoint("h", "run1", {"token": "t"})
    store.release("h", "run1", succeeded=False)
    state = store.state("h")
    assert state["status"] == "failed" and state["checkpoint"] == {"token": "t"}
    # The next run is free to go and gets the checkpoint to resume from.
    assert store.acquire("h", "run2") == {"token": "t"}


def test_checkpoint_saved_with_the_page(store: Store) -> None:
    store.acquire("h", "run1")
    write_page(store, "h", [rec("a")], run_id="run1", checkpoint={"token": "p2", "pages": 1})
    assert store.state("h")["checkpoint"] == {"token": "p2", "pages": 1}
    assert "a" in rows(store)
    # A checkpoint that cannot be written rolls the page back with it: one transaction.
    with pytest.raises((TypeError, ValueError, sa.exc.StatementError)):
        write_page(store, "h", [rec("b")], run_id="run1", checkpoint={"bad": object()})
    assert "b" not in rows(store)
    assert store.state("h")["checkpoint"] == {"token": "p2", "pages": 1}


def test_checkpoint_of_a_run_that_lost_its_lease_is_refused(store: Store) -> None:
    store.acquire("h", "run1")
    write_page(store, "h", [rec("a")], run_id="run1", checkpoint={"token": "old"})
    store.acquire("h", "run2", is_stale=lambda run_id: True)  # run1 is taken over
    store.save_checkpoint("h", "run2", {"token": "new"})
    with pytest.raises(LeaseLost):
        write_page(store, "h", [rec("b")], run_id="run1", checkpoint={"token": "zombie"})
    with pytest.raises(LeaseLost):
        store.save_checkpoint("h", "run1", {"token": "zombie"})
    assert "b" not in rows(store)
    assert store.state("h")["checkpoint"] == {"token": "new"}
    store.release("h", "run1", succeeded=True)  # does not end run2's lease
    assert store.state("h")["status"] == "running"
    assert store.state("h")["checkpoint"] == {"token": "new"}


def test_state_before_first_harvest(store: Store) -> None:
    assert store.state("nobody") is None
