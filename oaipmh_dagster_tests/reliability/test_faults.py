"""Fault injection through `harvest()` against the loopback server, on SQLite and PostgreSQL.

One test per fault; each docstring states the expected outcome. Either the harvest
recovers (the store equals the server's data, nothing duplicated), or it fails with a
clear error: `harvest()` raises, the harvest state is 'failed' with the checkpoint of the
last committed page kept, whatever was stored equals the server's data, and the next run
completes from there. Never a silent partial success. docs/reliability.md has the table.
"""

from __future__ import annotations

import email.utils
import json
import time
import tracemalloc
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import dagster as dg
import pytest

from oaipmh_dagster.demo.dataset import ServedRecord, make_dataset
from oaipmh_dagster.harvesting.harvest import HarvestStats, RunOptions, harvest
from oaipmh_dagster.oai import (
    BadArgument,
    BadResumptionToken,
    ClientOptions,
    OAIClient,
    OAIDataError,
    OAIError,
    OAITransportError,
)
from oaipmh_dagster.storage.registry import Harvester
from oaipmh_dagster.storage.store import Store
from oaipmh_dagster_tests.helpers import add_harvester, expected_snapshot
from oaipmh_dagster_tests.oaiserver import FaultyOAIServer as OAIServer
from oaipmh_dagster_tests.oaiserver import ManualClock
from oaipmh_dagster_tests.reliability.conftest import FAST, PAGE, RECORDS, assert_consistent
from oaipmh_dagster_tests.reliability.conftest import harvester as _h


class FakeSleep:
    """Records the waits the client asks for instead of sleeping them, and moves `clock`
    (the server's outage clock) on by as much: outages last what the waits say, whatever
    the machine's speed."""

    def __init__(self, clock: ManualClock | None = None) -> None:
        self.waits: list[float] = []
        self.clock = clock

    def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        if self.clock is not None:
            self.clock.advance(seconds)


def _virtual_time(server: OAIServer) -> FakeSleep:
    """A FakeSleep whose waits are the only time that passes for the server's outages."""
    clock = ManualClock()
    server.outage_clock = clock
    return FakeSleep(clock)


def _run(h: Harvester, store: Store, run_id: str, options: ClientOptions = FAST,
         sleep: FakeSleep | None = None, run: RunOptions | None = None) -> HarvestStats:
    if sleep is None:
        return harvest(h, store, run, run_id=run_id, options=options)
    with OAIClient(h.base_url, options, sleep=sleep) as client:
        return harvest(h, store, run, run_id=run_id, client=client)


def _recovered(store: Store, h: Harvester, server: OAIServer, stats: HarvestStats) -> None:
    expected = expected_snapshot(server.dataset)
    assert store.snapshot(h.id) == expected
    assert stats.records == len(expected) == RECORDS
    assert stats.new + stats.deleted == RECORDS  # each record written once
    state = store.state(h.id)
    assert state["status"] == "succeeded" and state["checkpoint"] is None


def _failed_cleanly(store: Store, h: Harvester, server: OAIServer, committed: int,
                    pages: int | None = None) -> None:
    """After a failure: state 'failed', checkpoint after the last committed page, the store
    holds exactly those pages and they equal the server's data. `pages` counts the pages
    the failed run committed (more than `committed` when it restarted its list)."""
    snap = assert_consistent(store, h.id, expected_snapshot(server.dataset))
    assert len(snap) == committed * PAGE
    state = store.state(h.id)
    assert state["status"] == "failed"
    if committed:
        pages = committed if pages is None else pages
        assert state["checkpoint"]["token"] and state["checkpoint"]["pages"] == pages
        assert state["checkpoint"]["records"] == pages * PAGE


def _resumes(store: Store, h: Harvester, server: OAIServer) -> HarvestStats:
    """The next run (faults gone) completes from the checkpoint; nothing is duplicated."""
    server.faults.clear()
    server.clear_log()
    stats = _run(h, store, "next")
    assert stats.mode == "resumed"
    first = next(r for r in server.requests if r.verb == "ListRecords")
    assert "resumptionToken" in first.params
    assert store.snapshot(h.id) == expected_snapshot(server.dataset)
    assert store.state(h.id)["checkpoint"] is None
    return stats


def _list_requests(server: OAIServer) -> list:
    return [r for r in server.requests if r.verb == "ListRecords"]


# -- HTTP status and Retry-After -----------------------------------------------------------


def test_503_retry_after_seconds(store: Store, server: OAIServer) -> None:
    """503 with `Retry-After: 7` (seconds), twice: waits 7 s each time, then recovers."""
    server.faults.add("status", verb="ListRecords", page=3, times=2, status=503,
                      headers={"Retry-After": "7"})
    sleep = FakeSleep()
    stats = _run(_h(server), store, "r1", sleep=sleep)
    _recovered(store, _h(server), server, stats)
    assert sleep.waits == [7.0, 7.0] and stats.retries == 2
    assert [r.status for r in _list_requests(server)][2:5] == [503, 503, 200]


def test_429_retry_after_http_date(store: Store, server: OAIServer) -> None:
    """429 with `Retry-After: <HTTP date 40 s ahead>`: waits about 40 s, then recovers.
    The wait is the date less the moment the answer came, however long the run took to
    get there (the date has whole seconds: up to 1 s less)."""
    before = time.time()
    when = email.utils.format_datetime(datetime.fromtimestamp(before, UTC)
                                       + timedelta(seconds=40), usegmt=True)
    server.faults.add("status", verb="ListRecords", page=2, status=429,
                      headers={"Retry-After": when})
    sleep = FakeSleep()
    stats = _run(_h(server), store, "r1", sleep=sleep)
    took = time.time() - before
    _recovered(store, _h(server), server, stats)
    assert len(sleep.waits) == 1 and 39 - took <= sleep.waits[0] <= 40 + 0.5


def test_503_for_ever_fails_after_retries(store: Store, server: OAIServer) -> None:
    """503 on every request of page 4: gives up after max_retries with a OAITransportError
    naming the status; pages 1-3 stay committed; the next run resumes."""
    server.faults.add("status", verb="ListRecords", page=4, times=None, status=503,
                      headers={"Retry-After": "0"})
    with pytest.raises(OAITransportError, match=r"HTTP 503.*gave up after 4 attempts"):
        _run(_h(server), store, "r1")
    _failed_cleanly(store, _h(server), server, committed=3)
    assert _resumes(store, _h(server), server).pages == RECORDS // PAGE - 3


# -- transport ------------------------------------------------------------------------------


def test_connection_reset_mid_body(store: Store, server: OAIServer) -> None:
    """The connection is reset halfway through the body, twice: retried, recovered."""
    server.faults.add("reset", verb="ListRecords", page=5, times=2, fraction=0.5)
    stats = _run(_h(server), store, "r1")
    _recovered(store, _h(server), server, stats)
    assert stats.retries == 2
    assert [r.fault for r in _list_requests(server)].count("reset") == 2


# A stalled answer takes STALL seconds (or until the server stops): far beyond the read
# timeout of 2 s, which an answer that is not stalled (some milliseconds) meets even on a
# loaded machine.
STALL = 600


def test_read_timeout(store: Store, server: OAIServer) -> None:
    """The server stalls longer than the read timeout once: retried, recovered (without
    waiting for the stalled answer)."""
    server.faults.add("delay", verb="ListRecords", page=2, seconds=STALL)
    options = ClientOptions(max_retries=2, backoff_base=0.01, backoff_max=0.05,
                            read_timeout=2, connect_timeout=5)
    started = time.monotonic()
    stats = _run(_h(server), store, "r1", options=options)
    _recovered(store, _h(server), server, stats)
    assert stats.retries == 1 and time.monotonic() - started < STALL / 5


def test_read_timeout_for_ever_fails(store: Store, server: OAIServer) -> None:
    """Every answer to page 2 stalls: a OAITransportError saying 'timeout', page 1 kept."""
    server.faults.add("delay", verb="ListRecords", page=2, seconds=STALL, times=None)
    options = ClientOptions(max_retries=1, backoff_base=0.01, backoff_max=0.05,
                            read_timeout=2, connect_timeout=5)
    with pytest.raises(OAITransportError, match="timeout"):
        _run(_h(server), store, "r1", options=options)
    _failed_cleanly(store, _h(server), server, committed=1)


def test_server_down_mid_harvest_comes_back(store: Store, server: OAIServer) -> None:
    """The server drops every connection for 1 s from page 3 on: the retries (backoff)
    outlast the outage and the harvest recovers. The back-offs are the only time that
    passes for the outage (at least 0.05+0.1+0.2 x 5 s in 7 retries of 10)."""
    sleep = _virtual_time(server)
    server.faults.add("down", verb="ListRecords", page=3, seconds=1.0)
    options = ClientOptions(max_retries=10, backoff_base=0.1, backoff_max=0.4,
                            read_timeout=5, connect_timeout=5)
    stats = _run(_h(server), store, "r1", options=options, sleep=sleep)
    _recovered(store, _h(server), server, stats)
    assert stats.retries >= 2
    assert any(r.fault == "down" for r in server.requests)


def test_server_down_longer_than_retries_then_back(store: Store, server: OAIServer) -> None:
    """The outage outlasts the retries: the run fails with a OAITransportError after pages
    1-3; once the server is back the next run resumes from page 4 and completes."""
    sleep = _virtual_time(server)
    server.faults.add("down", verb="ListRecords", page=4, seconds=1.5)
    options = ClientOptions(max_retries=2, backoff_base=0.01, backoff_max=0.02,
                            read_timeout=5, connect_timeout=5)
    with pytest.raises(OAITransportError, match="gave up after 3 attempts"):
        _run(_h(server), store, "r1", options=options, sleep=sleep)
    _failed_cleanly(store, _h(server), server, committed=3)
    sleep.clock.advance(1.6)  # type: ignore[union-attr]
    stats = _resumes(store, _h(server), server)
    assert stats.pages == RECORDS // PAGE - 3 and stats.new + stats.deleted == RECORDS - 300


# -- broken bodies ---------------------------------------------------------------------------


def test_truncated_xml_mid_page(store: Store, server: OAIServer) -> None:
    """Page 3 arrives cut off halfway (valid HTTP, broken XML), once: retried, recovered."""
    server.faults.add("truncate", verb="ListRecords", page=3, fraction=0.5)
    stats = _run(_h(server), store, "r1")
    _recovered(store, _h(server), server, stats)
    assert stats.retries == 1


def test_truncated_xml_for_ever_fails(store: Store, server: OAIServer) -> None:
    """Page 3 is always truncated: OAIDataError 'not well-formed', pages 1-2 kept; still
    `retryable` (the harvest op tries again later, in the same run)."""
    server.faults.add("truncate", verb="ListRecords", page=3, fraction=0.5, times=None)
    with pytest.raises(OAIDataError, match="not well-formed.*gave up") as failed:
        _run(_h(server), store, "r1")
    assert failed.value.retryable
    _failed_cleanly(store, _h(server), server, committed=2)
    _resumes(store, _h(server), server)


def test_illegal_xml_characters_in_metadata(store: Store, server: OAIServer) -> None:
    """Control characters illegal in XML 1.0 inside metadata on every page: stripped
    (counted in the stats), every record stored and transformed."""
    server.faults.add("illegal_chars", verb="ListRecords", times=None, chars="\x01\x0b\x1f\x00")
    stats = _run(_h(server), store, "r1")
    _recovered(store, _h(server), server, stats)
    assert stats.stripped_chars == 4 * (RECORDS // PAGE) and stats.failed == 0
    for item in store.iter_records("r"):
        blob = json.dumps(item)
        assert "\\u0001" not in blob and "\\u0000" not in blob


def test_html_error_page_with_status_200(store: Store, server: OAIServer) -> None:
    """An HTML maintenance page with 200 OK: taken as a transient error (retried); when it
    persists the run fails with a OAIDataError that says HTML, never 'zero records'."""
    server.faults.add("html", verb="ListRecords", page=2)
    stats = _run(_h(server), store, "r1")
    _recovered(store, _h(server), server, stats)
    assert stats.retries == 1

    store.delete_harvester_records("r")
    server.faults.add("html", verb="ListRecords", page=2, times=None)
    with pytest.raises(OAIDataError, match="HTML page instead of OAI-PMH XML"):
        _run(_h(server), store, "r2")
    _failed_cleanly(store, _h(server), server, committed=1)


def test_gzip_bodies(store: Store, server: OAIServer) -> None:
    """gzip with `Content-Encoding: gzip` (the server's default when asked): recovered."""
    stats = _run(_h(server), store, "r1")
    _recovered(store, _h(server), server, stats)
    assert all("gzip" in r.headers.get("Accept-Encoding", "") for r in server.requests)
    raw = sum(len(r.metadata["oai_dc"]) for r in server.dataset if not r.deleted)
    assert stats.bytes < raw / 2  # the wire carried compressed bodies


def test_gzip_without_content_encoding_header(store: Store, server: OAIServer) -> None:
    """Every body gzip-compressed but sent without Content-Encoding: recognized by its
    magic bytes and decompressed; recovered."""
    server.faults.add("gzip_no_header", times=None)
    stats = _run(_h(server), store, "r1")
    _recovered(store, _h(server), server, stats)
    assert all(r.fault == "gzip_no_header" for r in server.requests)


def test_response_larger_than_maximum(store: Store, server: OAIServer) -> None:
    """Page 2 is 30 MB with a 256 kB maximum: a OAIDataError 'exceeds the maximum', not
    retried, and memory stays far below the response size."""
    server.faults.add("huge", verb="ListRecords", page=2, bytes=30_000_000, times=None)
    options = ClientOptions(max_retries=3, backoff_base=0.01, backoff_max=0.05,
                            read_timeout=5, max_response_bytes=256 * 1024)
    tracemalloc.start()
    try:
        with pytest.raises(OAIDataError, match="exceeds the maximum of 262144 bytes"):
            _run(_h(server), store, "r1", options=options)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 10_000_000, f"peak {peak} bytes"
    assert [r.fault for r in _list_requests(server)].count("huge") == 1  # not retried
    _failed_cleanly(store, _h(server), server, committed=1)


# -- protocol ------------------------------------------------------------------------------


def test_same_resumption_token_twice(store: Store, server: OAIServer) -> None:
    """Page 3 hands back the token it was asked with (a loop): a OAIDataError 'loop' after
    committing page 3, never an endless harvest; the next run resumes and completes."""
    server.faults.add("repeat_token", verb="ListRecords", page=3, times=None)
    with pytest.raises(OAIDataError, match="resumptionToken loop"):
        _run(_h(server), store, "r1")
    _failed_cleanly(store, _h(server), server, committed=3)
    assert len(_list_requests(server)) == 3
    _resumes(store, _h(server), server)


def test_expired_token_mid_list(store: Store, server: OAIServer) -> None:
    """badResumptionToken on page 6: the list is restarted once from its original arguments
    (same from/until/set) and completes; upserts make the repeat harmless."""
    server.faults.add("bad_token", verb="ListRecords", page=6)
    stats = _run(_h(server), store, "r1")
    assert store.snapshot("r") == expected_snapshot(server.dataset)
    assert stats.new + stats.deleted == RECORDS and stats.unchanged == 500
    firsts = [r for r in _list_requests(server) if "resumptionToken" not in r.params]
    assert len(firsts) == 2 and firsts[0].params == firsts[1].params


def test_expired_token_every_time_fails(store: Store, server: OAIServer) -> None:
    """Every token is refused: one restart of the list, then BadResumptionToken; page 1
    kept (committed twice, once per attempt at the list)."""
    server.faults.add("bad_token", verb="ListRecords", page=2, times=None)
    with pytest.raises(BadResumptionToken):
        _run(_h(server), store, "r1")
    _failed_cleanly(store, _h(server), server, committed=1, pages=2)


def test_oai_error_with_http_422(store: Store, server: OAIServer) -> None:
    """An OAI-PMH badArgument error sent with HTTP 422 on page 3: read as the protocol
    error it is (BadArgument, with the server's message), not retried, pages 1-2 kept."""
    server.faults.add("oai_error", verb="ListRecords", page=3, status=422, code="badArgument",
                      message="Injected: from is malformed.", times=None)
    with pytest.raises(BadArgument, match="Injected: from is malformed"):
        _run(_h(server), store, "r1")
    assert len(_list_requests(server)) == 3
    _failed_cleanly(store, _h(server), server, committed=2)
    _resumes(store, _h(server), server)


def test_no_records_match_with_http_422(store: Store, server: OAIServer) -> None:
    """noRecordsMatch with HTTP 422 on the first page of an incremental harvest: an empty
    harvest that succeeds (nothing changed), not an error."""
    server.faults.add("oai_error", verb="ListRecords", page=1, status=422, code="noRecordsMatch",
                      message="Nothing changed.")
    stats = _run(_h(server), store, "r1", run=RunOptions(since="2026-01-01"))
    assert stats.records == 0 and store.snapshot("r") == {}
    assert store.state("r")["status"] == "succeeded"


# -- records that break the transformer -------------------------------------------------------


def fragile(element):  # noqa: ANN001, ANN201 - a plugin transformer for the test below
    """Raises on records whose title mentions 'BREAK'; returns a set (not JSON) on 'ODD'."""
    text = " ".join(element.itertext())
    if "BREAK" in text:
        raise ValueError("cannot read this record")
    if "ODD" in text:
        return {"bad": {1, 2}}
    return {"ok": True}


def test_records_breaking_the_transformer(store: Store,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Records whose metadata breaks the transformer (it raises, or returns something that is
    not JSON): stored with their raw XML and an error each, counted as failed; every other
    record is transformed; the run succeeds and says so in its stats."""
    monkeypatch.setenv("OAIPMH_TRANSFORMER_MODULES", __name__)  # the plugin's module
    ds = make_dataset(300, seed=5, deleted_ratio=0.0)
    base = next(iter(ds))
    when = datetime(2025, 1, 1, tzinfo=UTC)
    dc = base.metadata["oai_dc"]
    for i, word in enumerate(("BREAK", "BREAK", "ODD")):
        marked = dc.replace("<dc:title>", f"<dc:title>{word} ", 1)
        assert marked != dc
        ds.add(ServedRecord(f"oai:demo.example.org:broken-{i}", when + timedelta(seconds=i),
                            ("datasets",), metadata={"oai_dc": marked}))
    with OAIServer(ds, page_size=PAGE) as srv:
        h = _h(srv, transformer="oaipmh_dagster_tests.reliability.test_faults:fragile")
        stats = _run(h, store, "r1")
        assert store.snapshot("r") == expected_snapshot(srv.dataset)
    assert stats.failed == 3 and stats.records == 303
    assert sorted(stats.failed_ids) == [f"oai:demo.example.org:broken-{i}" for i in range(3)]
    bad = {i["oai_identifier"]: i for i in store.iter_records("r", errors_only=True,
                                                              with_raw=True)}
    assert set(bad) == set(stats.failed_ids)
    for item in bad.values():
        assert item["metadata"] is None and item["raw_xml"]
        assert {"type", "message", "location"} <= set(item["errors"][0])
    messages = " ".join(i["errors"][0]["message"] for i in bad.values())
    assert "cannot read this record" in messages and "not JSON" in messages
    assert store.counts("r")["failed"] == 3
    assert sum(1 for i in store.iter_records("r") if i["metadata"] == {"ok": True}) == 300


# -- through Dagster: since does not advance past a failed window ------------------------------


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as inst:
        yield inst


def test_failed_run_does_not_advance_since(database_url: str, server: OAIServer,
                                           instance: dg.DagsterInstance) -> None:
    """Through the Dagster job: a run that fails mid-list (a token loop) is a FAILURE run,
    leaves no raw_records materialization, keeps its checkpoint, and the since sensor's
    cursor stays at the last successful run; the next run resumes and advances it."""
    from oaipmh_dagster_tests.defs.test_job import _run as run_job
    from oaipmh_dagster_tests.defs.test_job import _tick_sensor

    h = add_harvester("j", server.base_url)
    server.clock = lambda: datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert run_job(h, instance).success
    cursor = _tick_sensor(h, instance, None)
    assert json.loads(cursor)["since"] == {"j": "2025-01-02T03:04:05Z"}

    server.clock = lambda: datetime(2025, 6, 7, 8, 9, 10, tzinfo=UTC)
    server.faults.add("repeat_token", verb="ListRecords", page=4, times=None)
    failed = run_job(h, instance, {"full": True})
    assert not failed.success
    assert failed.dagster_run.status == dg.DagsterRunStatus.FAILURE
    assert not [m for m in failed.get_asset_materialization_events()
                if m.asset_key.path[-1] == "raw_records"]
    errors = [e for e in failed.all_events if e.is_step_failure]
    assert errors and "resumptionToken loop" in str(errors[0].step_failure_data.error)
    state = Store().state("j")
    assert state["status"] == "failed" and state["checkpoint"]["pages"] == 4
    cursor2 = _tick_sensor(h, instance, cursor)
    assert json.loads(cursor2)["since"] == {"j": "2025-01-02T03:04:05Z"}

    server.faults.clear()
    resumed = run_job(h, instance, {"full": True})
    assert resumed.success
    raw = next(m for m in resumed.get_asset_materialization_events()
               if m.asset_key.path[-1] == "raw_records").materialization.metadata
    assert raw["oai/mode"].value == "resumed" and raw["oai/resumed_from_token"].value
    assert Store().snapshot("j") == expected_snapshot(server.dataset)
    cursor3 = _tick_sensor(h, instance, cursor2)
    assert json.loads(cursor3)["since"] == {"j": "2025-06-07T08:09:10Z"}


def test_every_failure_is_an_oai_error_subclass() -> None:
    """The three families a caller tells apart share one base (a sanity check of the
    taxonomy the table in docs/reliability.md relies on)."""
    for cls in (OAITransportError, OAIDataError, BadArgument, BadResumptionToken):
        assert issubclass(cls, OAIError)
