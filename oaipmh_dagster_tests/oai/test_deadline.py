"""Request deadlines and cancellation against the loopback server.

A read timeout bounds each read, not a request: a server that sends one byte every
second never trips it. Every request also has a total deadline, and a request, a
prefetch or a retry back-off in flight can be cancelled from another thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from oaipmh_dagster.demo.dataset import make_dataset
from oaipmh_dagster.oai import Cancelled, ClientOptions, OAIClient, OAITransportError
from oaipmh_dagster_tests.oaiserver import FaultyOAIServer as OAIServer

# Small pages, and a deadline of 5 x 0.6 s = 3 s.
QUICK = ClientOptions(read_timeout=0.6, connect_timeout=2, max_retries=1, backoff_base=0.01,
                      backoff_max=0.02)


@pytest.fixture
def server() -> Iterator[OAIServer]:
    with OAIServer(make_dataset(300, seed=5), page_size=100) as srv:
        yield srv


def _bounded(fn: Callable[[], Any], limit: float) -> tuple[Any, BaseException | None, float]:
    """Run `fn` in a daemon thread for at most `limit` seconds: (result, error, seconds).
    A call still running after `limit` fails the test instead of hanging it."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = fn()
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            out["error"] = exc

    started = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit)
    elapsed = time.monotonic() - started
    assert not thread.is_alive(), f"still running after {limit:.0f} s"
    return out.get("result"), out.get("error"), elapsed


def _pages(client: OAIClient) -> list:
    return list(client.iter_pages("ListRecords", metadata_prefix="oai_dc"))


def test_trickling_response_fails_at_the_deadline(server: OAIServer) -> None:
    """Page 2 arrives one byte every 0.2 s (each read well within the 0.6 s read timeout):
    each attempt is given up at the 3 s deadline, retried once, then a OAITransportError
    says how many bytes came in how long."""
    server.faults.add("trickle", verb="ListRecords", page=2, times=None, interval=0.2)
    with OAIClient(server.base_url, QUICK) as client:
        assert client.guarded
        _, error, elapsed = _bounded(lambda: _pages(client), 30)
    assert isinstance(error, OAITransportError), error
    assert "did not finish the response within the request deadline of 3 s" in error.message
    assert "gave up after 2 attempts" in error.message
    assert " bytes in 3.0 s" in error.message
    assert 6 <= elapsed < 9
    tries = [r for r in server.requests if r.page == 2]
    assert len(tries) == 2 and all(0 < r.bytes_sent < 100 for r in tries)


def test_request_timeout_option(server: OAIServer) -> None:
    """`request_timeout` sets the deadline itself (here 1.5 s, below 5 x read_timeout)."""
    server.faults.add("trickle", verb="ListRecords", page=1, times=None, interval=0.2)
    options = ClientOptions(read_timeout=5, request_timeout=1.5, max_retries=0)
    assert options.deadline == 1.5 and ClientOptions(read_timeout=7).deadline == 35
    with OAIClient(server.base_url, options) as client:
        _, error, elapsed = _bounded(lambda: _pages(client), 20)
    assert isinstance(error, OAITransportError) and "deadline of 1.5 s" in error.message
    assert 1.4 < elapsed < 3
    with pytest.raises(ValueError, match="request_timeout"):
        ClientOptions(request_timeout=0)


def test_slow_response_within_the_deadline_succeeds(server: OAIServer) -> None:
    """A response that takes its time but ends before the deadline is not cut off."""
    server.faults.add("trickle", verb="ListRecords", page=2, bytes=1500, interval=0.2)
    with OAIClient(server.base_url, QUICK) as client:
        pages, error, _ = _bounded(lambda: _pages(client), 20)
        assert error is None and client.stats.retries == 0
    assert sum(len(p.records) for p in pages) == 300
    slow = next(r for r in server.requests if r.fault == "trickle")
    assert slow.duration is not None and slow.duration > 0.6  # longer than one read timeout


def test_closing_the_pages_cancels_the_prefetch_in_flight(server: OAIServer) -> None:
    """The consumer stops after page 1 while page 2 is being prefetched from a server
    that stalls for a minute: closing the generator returns at once (the fetch in
    flight is cut), and no prefetch thread is left behind."""
    server.faults.add("delay", verb="ListRecords", page=2, seconds=60)
    options = ClientOptions(read_timeout=30, max_retries=0, prefetch=True)
    with OAIClient(server.base_url, options) as client:
        pages = client.iter_pages("ListRecords", metadata_prefix="oai_dc")
        assert len(next(pages).records) == 100
        deadline = time.monotonic() + 5
        while not any(r.page == 2 for r in server.requests) and time.monotonic() < deadline:
            time.sleep(0.02)
        _, error, elapsed = _bounded(pages.close, 20)
    assert error is None and elapsed < 1
    assert not [t for t in threading.enumerate() if t.name == "oai-prefetch"]


@pytest.mark.parametrize("fault", ["delay", "trickle"])
def test_cancel_stops_a_request_in_flight(server: OAIServer, fault: str) -> None:
    """`cancel()` from another thread ends a request that waits for a stalled or
    trickling server at once with `Cancelled`, which is never retried; the client
    refuses later requests."""
    server.faults.add(fault, verb="ListRecords", page=1, times=None, seconds=60,
                      interval=0.5)
    with OAIClient(server.base_url, ClientOptions(read_timeout=30, max_retries=5)) as client:
        client.identify()
        threading.Timer(0.5, client.cancel).start()
        _, error, elapsed = _bounded(lambda: _pages(client), 20)
        assert isinstance(error, Cancelled), error
        assert elapsed < 1.5 and client.stats.retries == 0
        with pytest.raises(Cancelled):
            client.list_metadata_formats()
    assert len([r for r in server.requests if r.verb == "ListRecords"]) == 1


def test_cancel_ends_a_retry_back_off(server: OAIServer) -> None:
    """A cancel during a 30 s back-off between retries ends the wait at once."""
    server.faults.add("status", verb="ListRecords", times=None, status=500)
    options = ClientOptions(max_retries=3, backoff_base=60, backoff_max=60)
    with OAIClient(server.base_url, options) as client:
        threading.Timer(0.5, client.cancel).start()
        _, error, elapsed = _bounded(lambda: _pages(client), 20)
    assert isinstance(error, Cancelled) and elapsed < 1.5


def test_consumer_error_with_a_prefetch_in_flight(server: OAIServer) -> None:
    """The consumer fails (as on Ctrl-C) while the next page is prefetched from a stalled
    server: its error propagates at once and the prefetch is cancelled, not awaited."""
    server.faults.add("delay", verb="ListRecords", page=2, seconds=60)
    options = ClientOptions(read_timeout=30, max_retries=0, prefetch=True)

    class Stop(Exception):
        pass

    def consume() -> None:
        with OAIClient(server.base_url, options) as client:
            for page in client.iter_pages("ListRecords", metadata_prefix="oai_dc"):
                if page.token:  # page 1 in hand, page 2 in flight
                    time.sleep(0.3)
                    raise Stop

    _, error, elapsed = _bounded(consume, 20)
    assert isinstance(error, Stop) and elapsed < 1.5
    assert not [t for t in threading.enumerate() if t.name == "oai-prefetch"]


def test_close_cancels_requests_in_flight(server: OAIServer) -> None:
    """Closing a client (as a failing harvest does) ends its requests still in flight in
    other threads, such as a prefetch nobody waits for any more."""
    server.faults.add("delay", verb="ListRecords", page=1, seconds=60)
    client = OAIClient(server.base_url, ClientOptions(read_timeout=30, max_retries=3))
    client.identify()
    threading.Timer(0.5, client.close).start()
    _, error, elapsed = _bounded(lambda: _pages(client), 20)
    assert isinstance(error, Cancelled) and elapsed < 1.5
