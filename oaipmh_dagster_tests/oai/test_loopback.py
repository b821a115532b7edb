"""The client against the bundled OAI-PMH server on a real loopback port, with faults."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest

from oaipmh_dagster.oai import (
    ClientOptions,
    Granularity,
    OAIClient,
    OAIDataError,
    OAITransportError,
)
from oaipmh_dagster_tests.oaiserver import FaultyOAIServer as OAIServer

from .helpers import SleepRecorder

dataset_module = pytest.importorskip("oaipmh_dagster.demo.dataset")
make_dataset = dataset_module.make_dataset

FAST = ClientOptions(max_retries=3, backoff_base=0.0, connect_timeout=2, read_timeout=5)


@pytest.fixture
def server():
    with OAIServer(make_dataset(230, seed=3, sets=4), page_size=50) as srv:
        yield srv


def client_of(server, options: ClientOptions = FAST, **kwargs) -> OAIClient:
    kwargs.setdefault("sleep", SleepRecorder())
    return OAIClient(server.base_url, options, **kwargs)


def all_ids(pages) -> list[str]:
    return [r.identifier for p in pages for r in p.records]


def test_full_harvest_matches_dataset(server):
    with client_of(server) as client:
        ident = client.identify()
        assert ident.granularity is Granularity.SECOND
        pages = list(client.iter_pages("ListRecords", metadata_prefix="oai_dc"))
    assert len(pages) == 5
    ids = all_ids(pages)
    assert sorted(ids) == sorted(r.identifier for r in server.dataset)
    deleted = {r.identifier for r in server.dataset if r.deleted}
    got_deleted = {r.identifier for p in pages for r in p.records if r.deleted}
    assert got_deleted == deleted
    assert all(r.metadata for p in pages for r in p.records if not r.deleted)
    assert pages[0].resumption_token.complete_list_size == 230
    headers = server.requests[-1].headers
    assert headers["User-Agent"].startswith("oaipmh-dagster/")
    assert "gzip" in headers["Accept-Encoding"]
    assert pages[0].bytes > 0


def test_from_until_and_sets(server):
    since = datetime(2022, 1, 1, tzinfo=UTC)
    with client_of(server) as client:
        recent = list(client.list_identifiers("oai_dc", from_=since))
        expected = {r.identifier for r in server.dataset if r.datestamp >= since}
        assert {h.identifier for h in recent} == expected
        sets = [s.spec for s in client.list_sets()]
        assert sets == list(server.dataset.sets)
        chosen = sets[:3]
        records = list(client.list_records("oai_dc", sets=chosen))
    ids = [r.identifier for r in records]
    assert len(ids) == len(set(ids))
    expected = {r.identifier for r in server.dataset if set(r.sets) & set(chosen)}
    assert set(ids) == expected


def test_get_records(server):
    wanted = [r.identifier for r in list(server.dataset)[:3]]
    with client_of(server) as client:
        got = list(client.get_records(wanted, "datacite"))
    assert [r.identifier for r in got] == wanted


@pytest.mark.parametrize(
    ("kind", "params"),
    [
        ("status", {"status": 503}),
        ("status", {"status": 429, "headers": {"Retry-After": "4"}}),
        ("status", {"status": 502}),
        ("reset", {}),
        ("truncate", {}),
        ("html", {}),
    ],
)
def test_transient_faults_recovered(server, kind, params):
    server.faults.add(kind, verb="ListRecords", page=2, times=2, **params)
    sleep = SleepRecorder()
    with client_of(server, sleep=sleep) as client:
        ids = all_ids(client.iter_pages("ListRecords", metadata_prefix="oai_dc"))
        assert client.stats.retries == 2
    assert len(ids) == 230
    if kind == "status" and params["status"] == 503:
        assert sleep.waits == [1.0, 1.0]  # the server's Retry-After
    if params.get("headers"):
        assert sleep.waits == [4.0, 4.0]


def test_broken_markup_is_not_retried(server):
    """A whole page with broken markup will not mend itself: one request, a OAIDataError."""
    server.faults.add("malformed", verb="ListRecords", page=2, times=2)
    with client_of(server) as client, pytest.raises(OAIDataError, match="not well-formed") as info:
        list(client.iter_pages("ListRecords", metadata_prefix="oai_dc"))
    assert client.stats.retries == 0 and not info.value.retryable
    assert "<unclosed attr=bare>" in str(info.value)


def test_persistent_fault_fails_clearly(server):
    server.faults.add("truncate", verb="ListRecords", page=3, times=None)
    with client_of(server) as client, pytest.raises(OAIDataError) as info:
        list(client.list_records("oai_dc"))
    assert "gave up after 4 attempts" in str(info.value)
    assert server.base_url in str(info.value)
    assert info.value.token
    assert f"resumptionToken={info.value.token!r}" in str(info.value)


def test_read_timeout_retried(server):
    """The first Identify stalls (ten minutes): its read times out and the retry, answered
    at once, succeeds. The read timeout leaves a loaded machine room to answer the retry."""
    server.faults.add("delay", verb="Identify", seconds=600)
    options = ClientOptions(max_retries=2, backoff_base=0.0, read_timeout=2)
    with client_of(server, options) as client:
        assert client.identify().repository_name
        assert client.stats.retries == 1


def test_server_down_gives_transport_error(server):
    server.faults.add("down", seconds=30)
    options = ClientOptions(max_retries=2, backoff_base=0.0, connect_timeout=1, read_timeout=1)
    with client_of(server, options) as client, pytest.raises(OAITransportError, match="gave up"):
        client.identify()


def test_connection_refused():
    srv = OAIServer(make_dataset(1)).start()
    url = srv.base_url
    srv.stop()
    client = OAIClient(url, ClientOptions(max_retries=1, backoff_base=0.0), sleep=SleepRecorder())
    with pytest.raises(OAITransportError, match="ConnectError"):
        client.identify()


def test_gzip_without_header(server):
    server.faults.add("gzip_no_header", verb="ListRecords", page=1)
    with client_of(server) as client:
        assert len(list(client.list_records("oai_dc"))) == 230
        assert client.stats.retries == 0


def test_oversize_response_aborted(server):
    server.faults.add("huge", verb="Identify", bytes=50_000_000)
    options = ClientOptions(max_response_bytes=1_000_000, max_retries=1)
    with client_of(server, options) as client, pytest.raises(OAIDataError, match="exceeds"):
        client.identify()
    log = server.requests[-1]
    assert log.bytes_sent < 50_000_000


def test_oversize_streamed_without_content_length_check(server):
    """The padded body is read as a stream and cut off at the limit."""
    server.faults.add("huge", verb="ListRecords", bytes=3_000_000, style="spaces")
    options = ClientOptions(max_response_bytes=2_000_000, max_retries=0)
    with client_of(server, options) as client, pytest.raises(OAIDataError, match="exceeds"):
        list(client.list_records("oai_dc"))


def test_illegal_chars_stripped(server):
    server.faults.add("illegal_chars", verb="ListRecords", page=1)
    with client_of(server) as client:
        pages = list(client.iter_pages("ListRecords", metadata_prefix="oai_dc"))
    assert pages[0].stripped_chars == 3
    assert sum(len(p.records) for p in pages) == 230


def test_repeated_token_is_a_loop(server):
    server.faults.add("repeat_token", verb="ListRecords", page=2)
    with client_of(server) as client, pytest.raises(OAIDataError, match="loop"):
        list(client.list_records("oai_dc"))


def test_expired_token_restarts_once(server):
    with client_of(server) as client:
        pages = client.iter_pages("ListRecords", metadata_prefix="oai_dc")
        first = next(pages)
        server.expire_tokens()
        rest = list(pages)
    ids = all_ids([first, *rest])
    assert len(set(ids)) == 230
    assert len(ids) == 230 + len(first.records)


def test_bad_token_twice_fails(server):
    from oaipmh_dagster.oai import BadResumptionToken

    server.faults.add("bad_token", verb="ListRecords", page=2, times=None)
    with client_of(server) as client, pytest.raises(BadResumptionToken):
        list(client.list_records("oai_dc"))


def test_empty_pages_continue(server):
    server.faults.add("empty_page", verb="ListRecords", page=2, times=3)
    with client_of(server) as client:
        assert len({r.identifier for r in client.list_records("oai_dc")}) == 230


def test_xxe_and_billion_laughs(server, tmp_path: Path):
    secret = tmp_path / "secret.txt"
    secret.write_text("LOOPBACK-SECRET")
    server.faults.add("xxe", verb="Identify", path=str(secret))
    server.faults.add("billion_laughs", verb="ListRecords", page=1)
    with client_of(server) as client:
        with pytest.raises(OAIDataError, match="entit") as info:
            client.identify()
        assert "LOOPBACK-SECRET" not in str(info.value)
        with pytest.raises(OAIDataError, match="entit"):
            list(client.list_records("oai_dc"))


def test_credentials_sent_to_base_host(server):
    options = ClientOptions(auth=("harvester", "pw"), max_retries=0)
    with client_of(server, options) as client:
        client.identify()
    assert server.requests[-1].headers["Authorization"].startswith("Basic ")


def test_per_host_limit_and_delay_on_a_real_server(server):
    options = ClientOptions(max_parallel=2, backoff_base=0.0)
    server.latency = 0.05
    clients = [OAIClient(server.base_url, options) for _ in range(4)]

    def work(client: OAIClient) -> None:
        for _ in range(3):
            client.list_metadata_formats()

    threads = [threading.Thread(target=work, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in clients:
        c.close()
    assert server.max_concurrency == 2

    server.latency = 0.0
    server.clear_log()
    with OAIClient(server.base_url, ClientOptions(delay=0.1)) as client:
        for _ in range(3):
            client.list_metadata_formats()
    starts = [r.started for r in server.requests]
    # Measured on the server side: scheduling jitter may shift one start a little,
    # but the requests cannot come closer together than the delay on average.
    assert starts[-1] - starts[0] >= 0.18
    assert all(b - a >= 0.05 for a, b in zip(starts, starts[1:], strict=False))


def test_prefetch_on_real_server(server):
    with client_of(server, ClientOptions(prefetch=True)) as client:
        ids = all_ids(client.iter_pages("ListRecords", metadata_prefix="oai_dc"))
    assert len(ids) == 230
