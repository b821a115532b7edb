"""The `RecordStore` and `HarvestState` ports (storage/ports.py), one contract for every
implementation: the SQL store (SQLite, PostgreSQL) and the in-memory one of the tests."""

from __future__ import annotations

import inspect
import json
import threading
from datetime import UTC, datetime
from typing import Any

import pytest

from oaipmh_dagster.storage import db
from oaipmh_dagster.storage.ports import (
    SCHEMA_ERROR,
    HarvestInProgress,
    HarvestState,
    LeaseLost,
    LeaseWaitCancelled,
    MetadataUpdate,
    PageWrite,
    RecordStore,
    Selection,
)
from oaipmh_dagster.storage.store import SQLPageWrite, Store
from oaipmh_dagster_tests.memory_store import MemoryStore, _Page

H = "h"
WHEN = datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres),
                        "memory"])
def store(request: pytest.FixtureRequest) -> Any:
    """An empty store of each implementation."""
    if request.param == "memory":
        return MemoryStore()
    return Store(db.get_engine(request.getfixturevalue(f"{request.param}_url")))


@pytest.fixture
def other(store: Any) -> Any:
    """Another store on the same data, as another process's."""
    if isinstance(store, MemoryStore):
        return MemoryStore.sharing(store)
    return Store(store.engine)


def row(identifier: str, *, digest: str | None = "d", deleted: bool = False,
        datestamp: str = "2024-01-02T03:04:05Z", sets: tuple[str, ...] = (),
        errors: list[dict[str, Any]] | None = None, run_id: str = "r1") -> dict[str, Any]:
    """A row as a page upserts it: every column, the JSON ones as JSON text."""
    return {
        "harvester_id": H, "oai_identifier": identifier, "datestamp": datestamp,
        "deleted": deleted, "sets": json.dumps(list(sets)),
        "raw_xml": None if deleted else f"<x>{identifier}</x>",
        "metadata": None if deleted else json.dumps({"title": identifier}),
        "errors": json.dumps(errors or []), "harvested_at": WHEN, "run_id": run_id,
        "transformed_at": None if deleted else WHEN, "content_hash": digest,
    }


def put(store: Any, *rows: dict[str, Any]) -> None:
    with store.page(H, None) as page:
        page.upsert(list(rows))


# -- the implementations name the ports' methods as the ports do ---------------------------


def _members(proto: type) -> dict[str, inspect.Signature]:
    out: dict[str, inspect.Signature] = {}
    for cls in reversed(proto.__mro__):
        if cls in (object,) or not getattr(cls, "_is_protocol", False):
            continue
        for name, value in vars(cls).items():
            if not name.startswith("_") and callable(value):
                out[name] = inspect.signature(value)
    return out


def _shape(sig: inspect.Signature) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.kind, p.default) for p in sig.parameters.values()]


@pytest.mark.parametrize(("impl", "proto"), [
    (Store, RecordStore), (MemoryStore, RecordStore), (Store, HarvestState),
    (MemoryStore, HarvestState), (SQLPageWrite, PageWrite), (_Page, PageWrite)])
def test_implementations_have_the_ports_methods(impl: type, proto: type) -> None:
    members = _members(proto)
    assert members, proto
    for name, sig in members.items():
        assert hasattr(impl, name), f"{impl.__name__} lacks {name}"
        assert _shape(inspect.signature(getattr(impl, name))) == _shape(sig), name


# -- records --------------------------------------------------------------------------------


def test_hashes_and_upsert_in_one_page(store: Any) -> None:
    assert store.hashes(H, ["a"]) == {}
    with store.page(H, None) as page:
        page.upsert([row("a", digest="1"), row("b", digest=None)])
        assert page.hashes(["a", "b", "zz"]) == {"a": "1", "b": None}  # its own writes
    assert store.hashes(H, ["b", "a", "zz"]) == {"a": "1", "b": None}
    put(store, row("a", digest="2", datestamp="2025-01-01T00:00:00Z"))
    assert store.hashes(H, ["a"]) == {"a": "2"}
    assert store.snapshot(H)["a"] == ("2025-01-01T00:00:00Z", False, ())
    assert store.hashes("other", ["a"]) == {}


def test_a_failed_page_writes_nothing(store: Any) -> None:
    store.acquire(H, "r1")
    with pytest.raises(KeyError), store.page(H, "r1", {"page": 1}) as page:
        page.upsert([row("a")])
        raise KeyError("boom")
    assert store.snapshot(H) == {}
    assert store.state(H)["checkpoint"] is None
    store.release(H, "r1", succeeded=True)


def test_tombstone_unlisted(store: Any) -> None:
    put(store, row("a"), row("b"), row("c"), row("d", deleted=True))
    n = store.tombstone_unlisted(H, ["b", "c", "c", "d", "x"], reason="gone", run_id="r2",
                                 batch=1)
    assert n == 2
    assert store.tombstone_unlisted(H, ["b"], reason="gone", run_id="r2") == 0
    items = {i["oai_identifier"]: i for i in store.iter_records(H)}
    assert items["b"]["deleted"] and items["b"]["metadata"] is None
    assert items["b"]["errors"] == [{"type": "not_listed", "message": "gone",
                                     "location": "reconcile"}]
    assert items["b"]["run_id"] == "r2" and not items["a"]["deleted"]
    assert store.hashes(H, ["a", "b"]) == {"a": "d", "b": None}
    assert list(store.live_identifiers(H)) == ["a"]


def test_counts_failures_and_schema_errors(store: Any) -> None:
    schema = {"type": SCHEMA_ERROR, "message": "m",
              "violations": [{"message": "first"}, {"message": "second"}]}
    put(store, row("ok"), row("gone", deleted=True),
        row("bad2", errors=[{"type": "transform", "message": "x"}]),
        row("bad1", errors=[{"type": "transform", "message": "x"}, schema]),
        row("invalid", errors=[schema]), row("plain", errors=[{"type": SCHEMA_ERROR,
                                                               "message": "plain"}]))
    assert store.counts(H) == {"total": 6, "live": 5, "deleted": 1, "failed": 2}
    assert store.count(H) == 5 and store.count(H, live_only=False) == 6
    assert store.failed_identifiers(H) == ["bad1", "bad2"]
    assert store.failed_identifiers(H, limit=1) == ["bad1"]
    invalid = store.schema_invalid(H, sample=2)
    assert invalid.count == 3
    assert invalid.sample == [("bad1", "first"), ("invalid", "first")]
    assert store.counts("none") == {"total": 0, "live": 0, "deleted": 0, "failed": 0}


def test_iter_records_of_a_selection(store: Any) -> None:
    put(store, row("c", datestamp="2024-03-01T00:00:00Z", sets=("s1", "s2")),
        row("a", datestamp="2024-01-01T00:00:00Z", sets=("s1",)),
        row("b", datestamp="2024-02-01T00:00:00Z", deleted=True, sets=("s2",)),
        row("d", datestamp="2024-04-01T00:00:00Z", errors=[{"type": "t", "message": "m"}]))

    def ids(selection: Selection | None = None, **kw: Any) -> list[str]:
        return [i["oai_identifier"] for i in store.iter_records(H, selection, **kw)]

    assert ids() == ids(batch=1) == ["a", "b", "c", "d"]
    assert ids(Selection(since=datetime(2024, 2, 1, tzinfo=UTC))) == ["b", "c", "d"]
    assert ids(Selection(set_spec="s1")) == ["a", "c"]
    assert ids(Selection(set_spec="s")) == []
    assert ids(Selection(deleted=True)) == ["b"]
    assert ids(Selection(deleted=False, set_spec="s2")) == ["c"]
    assert ids(Selection(oai_id="c")) == ["c"]
    assert ids(Selection(errors_only=True)) == ids(errors_only=True) == ["d"]
    first = next(store.iter_records(H, with_raw=True))
    assert first == {"oai_identifier": "a", "datestamp": "2024-01-01T00:00:00Z",
                     "deleted": False, "sets": ["s1"], "metadata": {"title": "a"},
                     "errors": [], "harvested_at": "2024-05-06T07:08:09Z", "run_id": "r1",
                     "raw_xml": "<x>a</x>", "about": []}
    assert "raw_xml" not in next(store.iter_records(H))
    assert next(store.iter_records(H, Selection(deleted=True)))["metadata"] is None


def test_live_reads_and_deleting_a_harvester(store: Any) -> None:
    assert not store.has_records(H)
    put(store, *(row(f"r{i:02d}") for i in range(7)), row("r99", deleted=True))
    assert store.has_records(H) and not store.has_records("other")
    assert [m["title"] for m in store.iter_live_metadata(H, batch=2)] == [
        f"r{i:02d}" for i in range(7)]
    assert [m["title"] for m in store.iter_live_metadata_every(H, 3, batch=2)] == [
        "r00", "r03", "r06"]
    put(store, row("r03", deleted=True), row("r04a"))  # every 3rd of all, the live ones
    assert [m["title"] for m in store.iter_live_metadata_every(H, 3, batch=2)] == [
        "r00", "r05"]
    assert [m["title"] for m in store.iter_live_metadata_every(H, 2)] == [
        "r00", "r02", "r04", "r05"]
    assert sorted(store.snapshot(H)) == sorted([f"r{i:02d}" for i in range(7)] + ["r04a", "r99"])
    assert isinstance(store.table_name(), str)
    store.acquire(H, "r1")
    store.release(H, "r1", succeeded=True)
    assert store.delete_harvester_records(H) == 9
    assert store.snapshot(H) == {} and store.state(H) is None


def test_rewrite_in_a_page_live_raw_and_set_metadata(store: Any) -> None:
    put(store, row("a"), row("b", deleted=True), row("c"), row("d"))
    with store.holding(H, "t1"), store.page(H, "t1") as page:
        assert page.live_raw("", 2) == [("a", "<x>a</x>"), ("c", "<x>c</x>")]
        assert page.live_raw("c", 5) == [("d", "<x>d</x>")]
        page.set_metadata([
            MetadataUpdate("a", {"new": 1}, [], WHEN),
            MetadataUpdate("c", None, [{"type": "transform", "message": "x"}], WHEN),
            MetadataUpdate("d", {"new": 2}, [{"type": SCHEMA_ERROR, "message": "s"}],
                           WHEN),
            MetadataUpdate("zz", {"new": 3}, [], WHEN)])
    items = {i["oai_identifier"]: i for i in store.iter_records(H)}
    assert items["a"]["metadata"] == {"new": 1} and "zz" not in items
    assert store.hashes(H, ["a", "c", "d"]) == {"a": "d", "c": None, "d": "d"}
    assert store.failed_identifiers(H) == ["c"]


# -- harvest state ---------------------------------------------------------------------------


def test_checkpoints_across_runs(store: Any) -> None:
    assert store.state(H) is None
    assert store.acquire(H, "r1") is None
    assert store.state(H)["status"] == "running"
    with store.page(H, "r1", {"page": 1}) as page:
        page.upsert([row("a")])
    assert store.state(H)["checkpoint"] == {"page": 1}
    store.save_checkpoint(H, "r1", {"page": 2})
    store.release(H, "r1", succeeded=False)
    assert store.state(H)["status"] == "failed"
    assert store.acquire(H, "r2") == {"page": 2}
    store.release(H, "r2", succeeded=True, selection="sel1")
    state = store.state(H)
    assert (state["status"], state["checkpoint"], state["selection"]) == (
        "succeeded", None, "sel1")
    store.acquire(H, "r3")
    store.release(H, "r3", succeeded=True, keep={"page": 9})
    assert store.state(H)["checkpoint"] == {"page": 9}
    assert store.state(H)["selection"] == "sel1"


def test_holding_keeps_status_and_checkpoint(store: Any) -> None:
    store.acquire(H, "r1")
    store.save_checkpoint(H, "r1", {"page": 3})
    store.release(H, "r1", succeeded=False)
    with store.holding(H, "t1"):
        assert store.state(H)["status"] == "running"
    state = store.state(H)
    assert (state["status"], state["checkpoint"]) == ("failed", {"page": 3})


def test_one_harvest_at_a_time(store: Any, other: Any) -> None:
    store.acquire(H, "r1")
    with pytest.raises(HarvestInProgress):
        other.acquire(H, "r2", wait=False)
    with pytest.raises(HarvestInProgress):
        other.acquire(H, "r2", wait_limit=0)
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(LeaseWaitCancelled):
        other.acquire(H, "r2", cancel=cancel)
    other.acquire(H, "r2", wait=False, is_stale=lambda run: run == "r1")  # r1 has ended
    with pytest.raises(LeaseLost), store.page(H, "r1", {"page": 1}) as page:
        page.upsert([row("a")])
    with pytest.raises(LeaseLost):
        store.tombstone_unlisted(H, ["a"], reason="gone", run_id="r1")
    store.release(H, "r1", succeeded=True)  # lost: changes nothing
    state = store.state(H)
    assert (state["run_id"], state["status"], state["checkpoint"]) == ("r2", "running", None)
    assert store.snapshot(H) == {}
    other.release(H, "r2", succeeded=True)
    assert other.state(H)["status"] == "succeeded"


def test_a_released_lease_is_free(store: Any, other: Any) -> None:
    store.acquire(H, "r1")
    store.release(H, "r1", succeeded=False)
    assert other.acquire(H, "r2", wait=False) is None
    other.release(H, "r2", succeeded=True)


def test_forget_and_a_changed_selection(store: Any, other: Any) -> None:
    other.selection_changed("fresh", "sel-old")
    state = other.state("fresh")
    assert (state["status"], state["selection"], state["checkpoint"]) == (
        "idle", "sel-old", None)
    store.acquire(H, "r1")
    store.save_checkpoint(H, "r1", {"page": 1})
    store.release(H, "r1", succeeded=True, keep={"page": 1}, selection="sel1")
    store.acquire(H, "r2")
    other.selection_changed(H, "sel2")  # the recorded selection stays
    state = other.state(H)
    assert (state["status"], state["selection"], state["checkpoint"], state["run_id"]) == (
        "idle", "sel1", None, None)
    with pytest.raises(LeaseLost), store.page(H, "r2") as page:
        page.upsert([row("a")])
    other.forget(H)
    assert store.state(H) is None
    assert other.acquire(H, "r3", wait=False) is None
    other.release(H, "r3", succeeded=True)
