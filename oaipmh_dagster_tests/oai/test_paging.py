"""Paging over resumptionTokens, selective harvesting and politeness."""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, date, datetime

import httpx
import pytest

from oaipmh_dagster.oai import (
    BadResumptionToken,
    CannotDisseminateFormat,
    ClientOptions,
    IdDoesNotExist,
    OAIClient,
    OAIDataError,
)

from .helpers import (
    FakeServer,
    SleepRecorder,
    error_xml,
    formats_xml,
    identify_xml,
    list_records_xml,
)

WAIT = 60.0  # bounds every wait for another thread: reached only when something is broken


def chain_route(pages: dict[str | None, bytes], *, extra=None):
    """Pages keyed by resumptionToken (None = first page); Identify answered too."""

    def route(params):
        if params["verb"] == "Identify":
            return identify_xml()
        if extra is not None:
            reply = extra(params)
            if reply is not None:
                return reply
        return pages[params.get("resumptionToken")]

    return route


def client_for(route, options=None, **kwargs):
    server = FakeServer(route)
    sleep = SleepRecorder()
    client = OAIClient(
        f"http://{kwargs.pop('host', 'oai.test')}/oai",
        options or ClientOptions(backoff_base=0.0),
        transport=server.transport(),
        sleep=sleep,
        clock=sleep.clock,
        **kwargs,
    )
    return client, server, sleep


def test_empty_final_token_ends_the_list():
    pages = {
        None: list_records_xml(["a", "b"], "t1", cursor=0, completeListSize=3),
        "t1": list_records_xml(["c"], "", cursor=2, completeListSize=3),
    }
    client, server, _ = client_for(chain_route(pages))
    got = list(client.iter_pages("ListRecords", metadata_prefix="oai_dc"))
    assert [len(p.records) for p in got] == [2, 1]
    assert got[-1].resumption_token.token == ""
    assert got[-1].token is None
    assert got[-1].resumption_token.cursor == 2
    assert len(server.requests) == 2


def test_token_loop_fails_clearly():
    pages = {
        None: list_records_xml(["a"], "t1"),
        "t1": list_records_xml(["b"], "t2"),
        "t2": list_records_xml(["c"], "t1"),
    }
    client, _, _ = client_for(chain_route(pages))
    with pytest.raises(OAIDataError, match="loop") as info:
        list(client.list_records("oai_dc"))
    assert info.value.token == "t1"
    assert "resumptionToken=t2" in str(info.value)


def test_same_token_twice_in_a_row_is_a_loop():
    pages = {None: list_records_xml(["a"], "t1"), "t1": list_records_xml(["b"], "t1")}
    client, _, _ = client_for(chain_route(pages))
    with pytest.raises(OAIDataError, match="loop"):
        list(client.list_records("oai_dc"))


def test_pages_with_token_but_no_records_continue_up_to_a_bound():
    pages = {None: list_records_xml([], "e1")}
    pages.update({f"e{i}": list_records_xml([], f"e{i + 1}") for i in range(1, 5)})
    pages["e5"] = list_records_xml(["z"])
    client, _, _ = client_for(chain_route(pages), ClientOptions(max_empty_pages=10))
    assert [r.identifier for r in client.list_records("oai_dc")] == ["z"]

    client, _, _ = client_for(chain_route(pages), ClientOptions(max_empty_pages=3))
    with pytest.raises(OAIDataError, match="no records"):
        list(client.list_records("oai_dc"))


def test_bad_resumption_token_restarts_once(caplog):
    calls = {"n": 0}

    def extra(params):
        if params.get("resumptionToken") == "t1":
            calls["n"] += 1
            if calls["n"] == 1:
                return httpx.Response(422, content=error_xml("badResumptionToken", "expired"))
        return None

    pages = {None: list_records_xml(["a"], "t1"), "t1": list_records_xml(["b"], "")}
    client, server, _ = client_for(chain_route(pages, extra=extra))
    with caplog.at_level(logging.WARNING):
        ids = [r.identifier for r in client.list_records("oai_dc", from_="2020-01-01")]
    assert ids == ["a", "a", "b"]
    assert "restarting the list" in caplog.text and "'t1'" in caplog.text
    assert server.params[2] == {
        "verb": "ListRecords",
        "metadataPrefix": "oai_dc",
        "from": "2020-01-01",
    }


def test_bad_resumption_token_twice_fails():
    def extra(params):
        if params.get("resumptionToken") == "t1":
            return error_xml("badResumptionToken", "expired")
        return None

    pages = {None: list_records_xml(["a"], "t1")}
    client, server, _ = client_for(chain_route(pages, extra=extra))
    with pytest.raises(BadResumptionToken) as info:
        list(client.list_records("oai_dc"))
    assert info.value.token == "t1"
    assert len(server.requests) == 4


def test_resume_from_checkpoint():
    pages = {
        None: list_records_xml(["a"], "t1"),
        "t1": list_records_xml(["b"], "t2"),
        "t2": list_records_xml(["c"]),
    }
    client, server, _ = client_for(chain_route(pages))
    first = next(client.iter_pages("ListRecords", metadata_prefix="oai_dc", set_spec="s"))
    assert first.request_args == {"verb": "ListRecords", "metadataPrefix": "oai_dc", "set": "s"}
    args = {k: v for k, v in first.request_args.items()}
    resumed = list(
        client.iter_pages(
            "ListRecords",
            metadata_prefix=args["metadataPrefix"],
            set_spec=args["set"],
            resumption_token=first.token,
        )
    )
    assert [r.identifier for p in resumed for r in p.records] == ["b", "c"]
    assert server.params[1] == {"verb": "ListRecords", "resumptionToken": "t1"}


def test_from_until_formatted_to_granularity():
    def route(params):
        if params["verb"] == "Identify":
            return identify_xml(granularity="YYYY-MM-DD")
        return list_records_xml(["a"])

    client, server, _ = client_for(route)
    since = datetime(2024, 3, 1, 23, 30, tzinfo=UTC)
    list(client.list_records("oai_dc", from_=since, until=date(2024, 3, 5)))
    list(client.list_records("oai_dc", from_=since))
    list_params = [p for p in server.params if p["verb"] == "ListRecords"]
    assert list_params[0]["from"] == "2024-03-01"
    assert list_params[0]["until"] == "2024-03-05"
    assert [p["verb"] for p in server.params].count("Identify") == 1  # cached

    client, server, _ = client_for(chain_route({None: list_records_xml(["a"])}), host="sec.test")
    list(client.list_records("oai_dc", from_=since, until="2024-04-01T00:00:00Z"))
    params = server.params[-1]
    assert params["from"] == "2024-03-01T23:30:00Z"
    assert params["until"] == "2024-04-01T00:00:00Z"


def test_several_sets_dedupe_by_identifier():
    def route(params):
        if params.get("resumptionToken") == "a2":
            return list_records_xml(["x3"], "")
        return {
            "A": list_records_xml(["x1", "x2"], "a2"),
            "B": list_records_xml(["x2", "x4", "x3"]),
            "C": error_xml("noRecordsMatch"),
        }[params["set"]]

    client, server, _ = client_for(route)
    pages = list(client.iter_record_pages("oai_dc", sets=["A", "B", "A", "C"]))
    assert [r.identifier for p in pages for r in p.records] == ["x1", "x2", "x3", "x4"]
    assert pages[-2].duplicates_dropped == 2
    assert pages[-1].records == [] and pages[-1].request_args["set"] == "C"  # noRecordsMatch
    assert [p.get("set") for p in server.params if "set" in p] == ["A", "B", "C"]
    with pytest.raises(OAIDataError, match="no <ListIdentifiers> element"):
        list(client.list_identifiers("oai_dc", sets=["B"]))  # a ListRecords answer


def test_no_records_match_is_empty():
    client, _, _ = client_for(
        lambda params: httpx.Response(422, content=error_xml("noRecordsMatch"))
    )
    assert list(client.list_records("oai_dc")) == []
    assert list(client.list_identifiers("oai_dc")) == []


def test_cannot_disseminate_format_names_offered():
    def route(params):
        if params["verb"] == "ListMetadataFormats":
            return formats_xml("oai_dc", "datacite")
        return error_xml("cannotDisseminateFormat")

    client, _, _ = client_for(route)
    with pytest.raises(CannotDisseminateFormat) as info:
        list(client.list_records("marcxml"))
    assert info.value.offered == ["oai_dc", "datacite"]
    assert "'marcxml'" in str(info.value) and "oai_dc, datacite" in str(info.value)
    with pytest.raises(CannotDisseminateFormat, match="datacite"):
        client.get_record("oai:x:1", "marcxml")


def test_get_records():
    def route(params):
        if params["identifier"] == "missing":
            return error_xml("idDoesNotExist")
        body = list_records_xml([params["identifier"]], verb="GetRecord")
        return body

    client, server, _ = client_for(route)
    got = list(client.get_records(["a", "missing", "b", "a"], "oai_dc", skip_missing=True))
    assert [r.identifier for r in got] == ["a", "b"]
    assert len(server.requests) == 3
    with pytest.raises(IdDoesNotExist):
        list(client.get_records(["missing"], "oai_dc"))


def test_unknown_error_code_is_clear():
    from oaipmh_dagster.oai import OAIProtocolError

    client, _, _ = client_for(lambda params: error_xml("tooBusy", "come back later"))
    with pytest.raises(OAIProtocolError) as info:
        list(client.list_records("oai_dc"))
    assert info.value.code == "tooBusy"
    assert "tooBusy" in str(info.value) and "come back later" in str(info.value)


def test_minimum_delay_between_requests():
    pages = {
        None: list_records_xml(["a"], "t1"),
        "t1": list_records_xml(["b"], "t2"),
        "t2": list_records_xml(["c"]),
    }
    client, _, sleep = client_for(chain_route(pages), ClientOptions(delay=2.5), host="slow.test")
    list(client.list_records("oai_dc"))
    assert sleep.waits == [2.5, 2.5]


def test_per_host_limit_shared_between_clients():
    active = {"now": 0, "max": 0, "all": 0}
    lock = threading.Lock()
    two = threading.Event()  # two requests were in flight at once

    def handler(request: httpx.Request) -> httpx.Response:
        with lock:
            active["now"] += 1
            active["all"] += 1
            active["max"] = max(active["max"], active["now"])
            first = active["all"] == 1
            if active["now"] == 2:
                two.set()
        if first:  # held until a second request is in (however slowly threads start)
            two.wait(WAIT)
        time.sleep(0.02)
        with lock:
            active["now"] -= 1
        return httpx.Response(200, content=list_records_xml(["a"]))

    options = ClientOptions(max_parallel=2)
    clients = [
        OAIClient("http://busy.test/oai", options, transport=httpx.MockTransport(handler))
        for _ in range(3)
    ]
    other = OAIClient(
        "http://busy.test:8080/oai",
        ClientOptions(max_parallel=8),
        transport=httpx.MockTransport(handler),
    )

    def work(client):
        for _ in range(5):
            list(client.list_records("oai_dc"))

    threads = [threading.Thread(target=work, args=(c,)) for c in clients for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert active["max"] == 2
    assert other._transport._host is not clients[0]._transport._host
    assert clients[0]._transport._host is clients[1]._transport._host


def test_prefetch_yields_same_pages():
    pages = {
        None: list_records_xml(["a"], "t1"),
        "t1": list_records_xml(["b"], "t2"),
        "t2": list_records_xml(["c"]),
    }
    client, server, _ = client_for(chain_route(pages), ClientOptions(prefetch=True))
    got = client.iter_pages("ListRecords", metadata_prefix="oai_dc")
    first = next(got)
    deadline = time.monotonic() + WAIT
    while len(server.requests) < 2 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert len(server.requests) == 2  # page 2 fetched while page 1 is consumed
    assert [r.identifier for r in first.records] == ["a"]
    assert [r.identifier for p in got for r in p.records] == ["b", "c"]


def test_prefetch_uses_one_thread_per_list(monkeypatch):
    """Every page of a list is fetched by one prefetch thread (a thread per page made
    the consumer wait for each start), which is gone when the list ends or when the
    consumer stops with a page already fetched."""
    from oaipmh_dagster.oai import _paging

    started: list[threading.Thread] = []

    class Counted(threading.Thread):
        def start(self) -> None:
            started.append(self)
            super().start()

    monkeypatch.setattr(_paging.threading, "Thread", Counted)
    pages = {None: list_records_xml(["a"], "t1"), "t1": list_records_xml(["b"], "t2"),
             "t2": list_records_xml(["c"], "t3"), "t3": list_records_xml(["d"])}
    client, server, _ = client_for(chain_route(pages), ClientOptions(prefetch=True))
    got = [r.identifier for p in client.iter_pages("ListRecords", metadata_prefix="oai_dc")
           for r in p.records]
    assert got == ["a", "b", "c", "d"] and len(started) == 1
    started[0].join(WAIT)
    assert not started[0].is_alive()

    it = client.iter_pages("ListRecords", metadata_prefix="oai_dc")
    next(it)
    deadline = time.monotonic() + WAIT
    while len(server.requests) < 6 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert len(server.requests) == 6  # page 2 of the second list is fetched: it waits
    it.close()
    assert len(started) == 2 and not started[1].is_alive()


def test_prefetch_propagates_errors_and_closes_early():
    pages = {None: list_records_xml(["a"], "t1"), "t1": list_records_xml(["b"], "t1")}
    client, _, _ = client_for(chain_route(pages), ClientOptions(prefetch=True))
    with pytest.raises(OAIDataError, match="loop"):
        list(client.list_records("oai_dc"))
    it = client.iter_pages("ListRecords", metadata_prefix="oai_dc")
    next(it)
    it.close()


def test_shared_connection_pool_refcounted():
    a = OAIClient("http://pool.test/oai")
    b = OAIClient("http://pool.test/other")
    assert a._transport._http is b._transport._http
    a.close()
    assert not b._transport._http.is_closed
    b.close()
    assert b._transport._http.is_closed
    c = OAIClient("http://pool.test/oai")
    assert not c._transport._http.is_closed
    c.close()


def test_iter_pages_resumes_from_a_checkpointed_token():
    pages = {
        None: list_records_xml(["a"], "t1"),
        "t1": list_records_xml(["b"], "t2"),
        "t2": list_records_xml(["c"]),
    }
    client, server, _ = client_for(chain_route(pages))
    first = next(client.iter_pages("ListRecords", metadata_prefix="oai_dc", from_="2020-01-01"))
    rest = list(client.iter_pages("ListRecords", resumption_token=first.token))
    assert [r.identifier for p in rest for r in p.records] == ["b", "c"]


def test_iter_pages_restarts_when_the_start_token_is_rejected(caplog):
    """A checkpoint's token the server no longer accepts: the list starts again from its
    original arguments, once, with a warning naming the checkpoint."""

    def extra(params):
        if params.get("resumptionToken") == "old":
            return httpx.Response(422, content=error_xml("badResumptionToken", "expired"))
        return None

    pages = {None: list_records_xml(["a"], "t1"), "t1": list_records_xml(["b"])}
    client, server, _ = client_for(chain_route(pages, extra=extra))
    with caplog.at_level(logging.WARNING):
        got = list(client.iter_pages("ListRecords", metadata_prefix="oai_dc", set_spec="s",
                                     from_="2020-01-01", until="2020-12-31",
                                     resumption_token="old"))
    assert [r.identifier for p in got for r in p.records] == ["a", "b"]
    assert [p.get("resumptionToken") for p in server.params] == ["old", None, "t1"]
    assert server.params[1] == {"verb": "ListRecords", "metadataPrefix": "oai_dc", "set": "s",
                                "from": "2020-01-01", "until": "2020-12-31"}
    assert "checkpoint's resumptionToken 'old' was rejected" in caplog.text


def test_iter_pages_start_token_rejected_twice_fails():
    """The restarted list's token is refused too: the one restart is spent."""

    def extra(params):
        if params.get("resumptionToken") in ("old", "t1"):
            return error_xml("badResumptionToken", "expired")
        return None

    pages = {None: list_records_xml(["a"], "t1")}
    client, _, _ = client_for(chain_route(pages, extra=extra))
    with pytest.raises(BadResumptionToken) as info:
        list(client.iter_pages("ListRecords", metadata_prefix="oai_dc", resumption_token="old"))
    assert info.value.token == "t1"


def _endless_route(n_pages: int):
    def route(params):
        if params["verb"] == "Identify":
            return identify_xml()
        token = params.get("resumptionToken")
        n = int(token) if token else 0
        ids = [f"oai:x:{n}-{i}-" + "y" * 40 for i in range(100)]
        nxt = str(n + 1) if n + 1 < n_pages else ""
        return list_records_xml(ids, nxt)

    return route


def _peak_while_harvesting(n_pages: int) -> tuple[int, int]:
    import tracemalloc

    route = _endless_route(n_pages)

    def handler(request: httpx.Request) -> httpx.Response:
        # A streamed body, as from a socket: a bytes body would sit in httpx's
        # response/stream reference cycle until the garbage collector runs.
        return httpx.Response(200, content=iter([route(dict(request.url.params))]))

    transport = httpx.MockTransport(handler)
    client = OAIClient(f"http://mem{n_pages}.test/oai", transport=transport)
    tracemalloc.start()
    count = sum(1 for _ in client.list_records("oai_dc"))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return count, peak


def test_memory_bounded_one_page_at_a_time():
    small_count, small_peak = _peak_while_harvesting(5)
    big_count, big_peak = _peak_while_harvesting(60)
    assert (small_count, big_count) == (500, 6000)
    assert big_peak < 8 * 1024 * 1024
    assert big_peak < small_peak * 1.5 + 512 * 1024


def test_no_records_match_gives_one_empty_page_with_response_date():
    reply = error_xml("noRecordsMatch").replace(b"2024-05-01T12:00:00Z", b"2024-06-07T08:09:10Z")
    client, _, _ = client_for(lambda params: httpx.Response(422, content=reply))
    pages = list(client.iter_pages("ListRecords", metadata_prefix="oai_dc", from_="2030-01-01"))
    assert len(pages) == 1
    assert pages[0].records == [] and pages[0].resumption_token is None
    assert pages[0].response_date == datetime(2024, 6, 7, 8, 9, 10, tzinfo=UTC)
    assert pages[0].request_args["from"] == "2030-01-01"


def test_loop_detector_finds_long_loops_in_constant_memory() -> None:
    from oaipmh_dagster.oai._paging import LoopDetector

    # A cycle of 500 tokens after a tail of 37: found within two turns of the cycle.
    det = LoopDetector()
    seq = [f"t{i}" for i in range(37)] + [f"c{i % 500}" for i in range(5000)]
    found = next(i for i, tok in enumerate(seq) if det.repeated(tok))
    assert 37 + 500 <= found <= 37 + 3 * 500
    assert len(det.recent) <= LoopDetector.RECENT
    # A long list without a loop is never flagged.
    det = LoopDetector()
    assert not any(det.repeated(f"u{i}") for i in range(100_000))
