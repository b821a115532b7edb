"""harvest(): a full harvest equals the server's data; re-runs, failures, oai_ids, resume.
A full harvest and a failure run on each database; the rest on the in-memory store."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from oaipmh_dagster.demo.dataset import ServedRecord, make_dataset
from oaipmh_dagster.harvesting.harvest import (
    HarvestError,
    HarvestHooks,
    PlanMode,
    Progress,
    RunOptions,
    SinceChoice,
    harvest,
)
from oaipmh_dagster.oai import ClientOptions, OAIError
from oaipmh_dagster.storage.registry import Harvester
from oaipmh_dagster.storage.store import Store
from oaipmh_dagster_tests.helpers import expected_snapshot
from oaipmh_dagster_tests.memory_store import MemoryStore
from oaipmh_dagster_tests.oaiserver import FaultyOAIServer as OAIServer

FAST = ClientOptions(max_retries=2, backoff_base=0.01, backoff_max=0.05, read_timeout=5)


@pytest.fixture
def server():  # noqa: ANN201
    ds = make_dataset(3000, seed=7, deleted_ratio=0.05)
    with OAIServer(ds, page_size=200) as srv:
        yield srv


def _h(srv: OAIServer, **kw: object) -> Harvester:
    return Harvester(id=str(kw.pop("id", "t")), base_url=srv.base_url,
                     metadata_prefix=str(kw.pop("metadata_prefix", "oai_dc")), **kw)


def test_full_harvest_equals_server(database_url: str, server: OAIServer) -> None:
    store = Store()
    h = _h(server)
    stats = harvest(h, store, run_id="r1", options=FAST)
    expected = expected_snapshot(server.dataset)
    assert store.snapshot("t") == expected
    assert stats.records == len(expected) == 3000
    assert stats.deleted == sum(1 for v in expected.values() if v[1])
    assert stats.new == 3000 - stats.deleted
    assert stats.pages == 15 and stats.failed == 0
    assert stats.complete_list_size == 3000
    assert stats.response_date and stats.response_date.endswith("Z")
    # Transformed fields equal the server's metadata.
    rec = next(r for r in server.dataset if not r.deleted)
    stored = next(i for i in store.iter_records("t") if i["oai_identifier"] == rec.identifier)
    assert stored["metadata"]["title"] and stored["metadata"]["title"][0] in rec.metadata["oai_dc"]
    # Re-running changes nothing and duplicates nothing.
    again = harvest(h, store, run_id="r2", options=FAST)
    assert again.unchanged == 3000 and again.new == again.updated == again.deleted == 0
    assert store.snapshot("t") == expected
    assert {i["run_id"] for i in store.iter_records("t")} == {"r1"}


def test_sets_and_incremental(memory_store: MemoryStore, server: OAIServer) -> None:
    store = memory_store
    sets = ("datasets", "theses")
    harvest(_h(server, sets=sets), store, run_id="r1", options=FAST)
    assert store.snapshot("t") == expected_snapshot(server.dataset, sets=sets)
    # The server changes: one new record, one deletion; an incremental harvest sees them.
    now = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=5)
    old = next(r for r in server.dataset if "datasets" in r.sets and not r.deleted)
    server.dataset.delete(old.identifier, now)
    server.dataset.add(ServedRecord("oai:demo.example.org:new-1", now, ("theses",),
                                    metadata={"oai_dc": old.metadata["oai_dc"]}))
    stats = harvest(_h(server, sets=sets), store, RunOptions(since=now), run_id="r2", options=FAST)
    assert (stats.new, stats.deleted) == (1, 1)
    assert store.snapshot("t") == expected_snapshot(server.dataset, sets=sets)
    froms = [r.params.get("from", [None])[0] for r in server.requests if r.verb == "ListRecords"]
    assert now.strftime("%Y-%m-%dT%H:%M:%SZ") in froms


def test_failure_mid_harvest_keeps_committed_pages(database_url: str, server: OAIServer) -> None:
    store = Store()
    server.faults.add("malformed", verb="ListRecords", page=4, times=100)
    with pytest.raises(OAIError):
        harvest(_h(server), store, run_id="r1", options=FAST)
    snap = store.snapshot("t")
    expected = expected_snapshot(server.dataset)
    assert len(snap) == 600  # three committed pages of 200
    assert all(expected[k] == v for k, v in snap.items())
    state = store.state("t")
    assert state["status"] == "failed" and state["checkpoint"]["token"]
    # The next run resumes from the checkpoint and completes; no duplicates.
    server.faults.clear()
    server.clear_log()
    stats = harvest(_h(server), store, run_id="r2", options=FAST)
    assert stats.mode == "resumed"
    assert store.snapshot("t") == expected
    first = next(r for r in server.requests if r.verb == "ListRecords")
    assert "resumptionToken" in first.params
    assert store.state("t")["checkpoint"] is None


class Said(list):
    """A logger that keeps what it was told."""

    def _say(self, message: str, *args: object) -> None:
        self.append(message % args if args else message)

    info = warning = error = debug = _say


@pytest.mark.parametrize("between", [
    RunOptions(oai_ids=["oai:demo.example.org:1"]),  # reads no list
    RunOptions(since="2019-06-01"),  # reads another list (after earliestDatestamp)
    RunOptions(sets=["datasets"]),  # reads other lists
], ids=["oai_ids", "since", "sets"])
def test_an_interrupted_harvest_resumes_after_another_one_succeeded(
    memory_store: MemoryStore, server: OAIServer, between: RunOptions,
) -> None:
    """Another harvest that succeeds in between, over other lists, leaves the
    interrupted list's checkpoint: the same harvest run again resumes it, as the
    interrupted run said it would."""
    store = memory_store
    server.faults.add("malformed", verb="ListRecords", page=4, times=100)
    with pytest.raises(OAIError):
        harvest(_h(server), store, run_id="r1", options=FAST)
    server.faults.clear()
    interrupted = store.state("t")["checkpoint"]
    said = Said()
    other = harvest(_h(server), store, between, run_id="r2", options=FAST, logger=said)
    assert other.mode != "resumed"
    assert store.state("t")["checkpoint"] == interrupted
    assert any("keeps the interrupted harvest's checkpoint" in line for line in said), said
    server.clear_log()
    again = harvest(_h(server), store, run_id="r3", options=FAST)
    assert again.mode == "resumed" and again.resumed_from_token == interrupted["token"]
    first = next(r for r in server.requests if r.verb == "ListRecords")
    assert first.params["resumptionToken"] == [interrupted["token"]]
    assert store.snapshot("t") == expected_snapshot(server.dataset)
    assert store.state("t")["checkpoint"] is None


def test_a_harvest_that_reads_the_interrupted_list_whole_clears_its_checkpoint(
    memory_store: MemoryStore, server: OAIServer,
) -> None:
    """An incremental list interrupted, then a full harvest (its list holds the other)
    succeeds: nothing is left to continue, and the next run says nothing of resuming."""
    store = memory_store
    server.faults.add("malformed", verb="ListRecords", page=4, times=100)
    with pytest.raises(OAIError):
        harvest(_h(server), store, RunOptions(since="2019-06-01"), run_id="r1", options=FAST)
    server.faults.clear()
    assert store.state("t")["checkpoint"]["since"] == "2019-06-01T00:00:00Z"
    assert harvest(_h(server), store, run_id="r2", options=FAST).mode == "full"
    assert store.state("t")["checkpoint"] is None


def test_oai_ids_fetch_exactly_those(memory_store: MemoryStore, server: OAIServer) -> None:
    store = memory_store
    live = [r.identifier for r in server.dataset if not r.deleted][:5]
    stats = harvest(_h(server), store, RunOptions(oai_ids=live), run_id="r1", options=FAST)
    assert sorted(store.snapshot("t")) == sorted(live)
    assert stats.mode == "oai_ids" and stats.new == 5
    verbs = {r.verb for r in server.requests}
    assert verbs == {"Identify", "GetRecord"}
    with pytest.raises(HarvestError, match="do not exist"):
        harvest(_h(server), store, RunOptions(oai_ids=[live[0], "oai:nope:1"]), run_id="r2",
                options=FAST)


def test_transform_failure_is_recorded_and_run_goes_on(memory_store: MemoryStore,
                                                        server: OAIServer,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        ) -> None:
    monkeypatch.setenv("OAIPMH_TRANSFORMER_MODULES", __name__)  # the plugin's module
    store = memory_store
    h = _h(server, transformer="oaipmh_dagster_tests.harvesting.test_harvest:picky")
    stats = harvest(h, store, run_id="r1", options=FAST)
    assert stats.failed > 0 and stats.records == 3000
    bad = [i for i in store.iter_records("t", errors_only=True)]
    assert len(bad) == stats.failed
    err = bad[0]["errors"][0]
    assert set(err) >= {"type", "message", "location"} and "odd" in err["message"]


def picky(element):  # noqa: ANN001, ANN201 - a plugin transformer for the test above
    """Fails on every record whose identifier number is odd."""
    ident = element.findtext("{http://purl.org/dc/elements/1.1/}identifier") or ""
    digits = "".join(c for c in ident if c.isdigit())
    if digits and int(digits[-1]) % 2:
        raise ValueError("odd record")
    return {"ok": True}


def test_hooks_resolve_since_after_the_lease_and_hear_each_page(
    memory_store: MemoryStore,
) -> None:
    """One hooks object: since is resolved once the lease is held, each committed page
    is reported."""
    ds = make_dataset(50, seed=3)
    with OAIServer(ds, page_size=20) as srv:
        store, h = memory_store, _h(srv)
        asked: list[bool] = []

        def resolve() -> SinceChoice:
            asked.append(store.state("t") is not None)  # the lease is held by now
            return SinceChoice(None, full=True, source="since recorded by run r0")

        heard: list[Progress] = []
        stats = harvest(h, store, run_id="r1", options=FAST,
                        hooks=HarvestHooks(resolve_since=resolve, on_page=heard.append))
        assert asked == [True]
        assert [p.pages for p in heard] == [1, 2, 3] and heard[-1].records == 50
        assert (stats.mode, type(stats.mode)) == ("full", str)


def test_modes_and_since_sources_reach_dagster_as_plain_strings() -> None:
    """Dagster's metadata and run tags serialize no enum: the enums' values go out."""
    from oaipmh_dagster.defs.since import ResolvedSince, SinceSource

    resolved = ResolvedSince("2024-01-01", SinceSource.RUN, overlap=True, origin="run 1a2b")
    assert (resolved.source, type(resolved.source)) == ("run", str)
    assert resolved.choice(False) == SinceChoice("2024-01-01", False, True,
                                                 "since recorded by run 1a2b")
    assert ResolvedSince(None, SinceSource.NONE).choice(False).full
    assert [m.value for m in PlanMode] == ["incremental", "full", "oai_ids", "resumed"]
