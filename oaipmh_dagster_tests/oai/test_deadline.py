"""Request deadlines and cancellation against the loopback server.

A read timeout bounds each read, not a request: a server that sends one byte every
second never trips it. Every request also has a total deadline, and a request, a
prefetch or a retry back-off in flight can be cancelled from another thread."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from oaipmh_dagster.demo.dataset import make_dataset
from oaipmh_dagster.oai import Cancelled, ClientOptions, OAIClient, OAITransportError
from oaipmh_dagster_tests.oaiserver import FaultyOAIServer as OAIServer

# A deadline of 3 s, and a read timeout no trickle below comes near (a loaded machine can
# delay a server's write by a second: the deadline, not the read timeout, must end these).
QUICK = ClientOptions(read_timeout=10, request_timeout=3, connect_timeout=5, max_retries=1,
                      backoff_base=0.01, backoff_max=0.02)
# What the tests below stall for: far beyond every bound they assert.
STALL = 600
# The generous bound of "at once": a loaded 2-core machine meets it, a request or back-off
# that is awaited instead of cut (STALL seconds) does not.
PROMPTLY = 30.0
LIMIT = 180.0  # a call still running after this fails the test instead of hanging it


@pytest.fixture
def server() -> Iterator[OAIServer]:
    with OAIServer(make_dataset(300, seed=5), page_size=100) as srv:
        yield srv


class Call:
    """`fn` running in a daemon thread: its result or error once `join` returns."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.started = time.monotonic()
        self.thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self.thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.result = fn()
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            self.error = exc

    def join(self, limit: float = LIMIT) -> float:
        """Wait for the call (failing after `limit` seconds); seconds since it started."""
        self.thread.join(limit)
        assert not self.thread.is_alive(), f"still running after {limit:.0f} s"
        return time.monotonic() - self.started


def _bounded(fn: Callable[[], Any], limit: float = LIMIT
             ) -> tuple[Any, BaseException | None, float]:
    """Run `fn` for at most `limit` seconds: (result, error, seconds)."""
    call = Call(fn)
    elapsed = call.join(limit)
    return call.result, call.error, elapsed


def _until(predicate: Callable[[], bool], what: str, timeout: float = LIMIT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s waiting for {what}"
        time.sleep(0.01)


def _in_flight(server: OAIServer, page: int) -> Callable[[], bool]:
    """Whether the server is answering a ListRecords request for `page` right now."""
    return lambda: any(r.verb == "ListRecords" and r.page == page and r.finished is None
                       for r in server.requests)


def _pages(client: OAIClient) -> list:
    return list(client.iter_pages("ListRecords", metadata_prefix="oai_dc"))


def test_trickling_response_fails_at_the_deadline(server: OAIServer) -> None:
    """Page 2 arrives one byte every 0.2 s (no read waits long): each attempt is given up
    at the 3 s deadline, never before, retried once, then a OAITransportError says how
    many bytes came in how long."""
    server.faults.add("trickle", verb="ListRecords", page=2, times=None, interval=0.2)
    with OAIClient(server.base_url, QUICK) as client:
        assert client.guarded
        _, error, elapsed = _bounded(lambda: _pages(client))
    assert isinstance(error, OAITransportError), error
    assert "did not finish the response within the request deadline of 3 s" in error.message
    assert "gave up after 2 attempts" in error.message
    took = re.search(r" bytes in (\d+\.\d) s", error.message)
    assert took and float(took.group(1)) >= 3.0, error.message
    assert elapsed >= 2 * 3
    tries = [r for r in server.requests if r.page == 2]
    assert len(tries) == 2 and all(0 < r.bytes_sent < 100 for r in tries)


def test_request_timeout_option(server: OAIServer) -> None:
    """`request_timeout` sets the deadline itself (here 1.5 s, below 5 x read_timeout)."""
    server.faults.add("trickle", verb="ListRecords", page=1, times=None, interval=0.2)
    options = ClientOptions(read_timeout=5, request_timeout=1.5, max_retries=0)
    assert options.deadline == 1.5 and ClientOptions(read_timeout=7).deadline == 35
    with OAIClient(server.base_url, options) as client:
        _, error, elapsed = _bounded(lambda: _pages(client))
    assert isinstance(error, OAITransportError) and "deadline of 1.5 s" in error.message
    assert elapsed >= 1.5
    with pytest.raises(ValueError, match="request_timeout"):
        ClientOptions(request_timeout=0)


def test_slow_response_within_the_deadline_succeeds(server: OAIServer) -> None:
    """A response that takes longer than a read timeout, each read well within it, and ends
    before the deadline is not cut off."""
    server.faults.add("trickle", verb="ListRecords", page=2, bytes=1500, interval=0.5)
    options = ClientOptions(read_timeout=2, request_timeout=120, max_retries=1,
                            backoff_base=0.01, backoff_max=0.02)
    with OAIClient(server.base_url, options) as client:
        pages, error, _ = _bounded(lambda: _pages(client))
        assert error is None and client.stats.retries == 0
    assert sum(len(p.records) for p in pages) == 300
    slow = next(r for r in server.requests if r.fault == "trickle")
    assert slow.duration is not None and slow.duration > 2  # longer than one read timeout


def test_closing_the_pages_cancels_the_prefetch_in_flight(server: OAIServer) -> None:
    """The consumer stops after page 1 while page 2 is being prefetched from a server
    that stalls: closing the generator returns at once (the fetch in flight is cut), and
    no prefetch thread is left behind."""
    server.faults.add("delay", verb="ListRecords", page=2, seconds=STALL)
    options = ClientOptions(read_timeout=STALL, max_retries=0, prefetch=True)
    with OAIClient(server.base_url, options) as client:
        pages = client.iter_pages("ListRecords", metadata_prefix="oai_dc")
        assert len(next(pages).records) == 100
        _until(_in_flight(server, 2), "the prefetch of page 2")
        _, error, elapsed = _bounded(pages.close)
    assert error is None and elapsed < PROMPTLY
    assert not [t for t in threading.enumerate() if t.name == "oai-prefetch"]


@pytest.mark.parametrize("fault", ["delay", "trickle"])
def test_cancel_stops_a_request_in_flight(server: OAIServer, fault: str) -> None:
    """`cancel()` from another thread ends a request that waits for a stalled or
    trickling server at once with `Cancelled`, which is never retried; the client
    refuses later requests."""
    server.faults.add(fault, verb="ListRecords", page=1, times=None, seconds=STALL,
                      interval=0.5)
    options = ClientOptions(read_timeout=STALL, request_timeout=STALL, max_retries=5)
    with OAIClient(server.base_url, options) as client:
        client.identify()
        call = Call(lambda: _pages(client))
        _until(_in_flight(server, 1), "the request of page 1")
        cancelled = time.monotonic()
        client.cancel()
        call.join()
        assert time.monotonic() - cancelled < PROMPTLY
        assert isinstance(call.error, Cancelled), call.error
        assert client.stats.retries == 0
        with pytest.raises(Cancelled):
            client.list_metadata_formats()
    assert len([r for r in server.requests if r.verb == "ListRecords"]) == 1


def test_cancel_ends_a_retry_back_off(server: OAIServer) -> None:
    """A cancel during a long back-off between retries ends the wait at once."""
    server.faults.add("status", verb="ListRecords", times=None, status=500)
    options = ClientOptions(max_retries=3, backoff_base=STALL, backoff_max=STALL)
    with OAIClient(server.base_url, options) as client:
        call = Call(lambda: _pages(client))
        _until(lambda: any(r.verb == "ListRecords" and r.finished is not None
                           for r in server.requests), "the first answer (500)")
        cancelled = time.monotonic()
        client.cancel()
        call.join()
    assert isinstance(call.error, Cancelled) and time.monotonic() - cancelled < PROMPTLY
    assert len([r for r in server.requests if r.verb == "ListRecords"]) == 1


def test_consumer_error_with_a_prefetch_in_flight(server: OAIServer) -> None:
    """The consumer fails (as on Ctrl-C) while the next page is prefetched from a stalled
    server: its error propagates at once and the prefetch is cancelled, not awaited."""
    server.faults.add("delay", verb="ListRecords", page=2, seconds=STALL)
    options = ClientOptions(read_timeout=STALL, max_retries=0, prefetch=True)
    raised: list[float] = []

    class Stop(Exception):
        pass

    def consume() -> None:
        with OAIClient(server.base_url, options) as client:
            for page in client.iter_pages("ListRecords", metadata_prefix="oai_dc"):
                if page.token:  # page 1 in hand, page 2 in flight
                    _until(_in_flight(server, 2), "the prefetch of page 2")
                    raised.append(time.monotonic())
                    raise Stop

    call = Call(consume)
    call.join()
    assert isinstance(call.error, Stop) and time.monotonic() - raised[0] < PROMPTLY
    assert not [t for t in threading.enumerate() if t.name == "oai-prefetch"]


def test_close_cancels_requests_in_flight(server: OAIServer) -> None:
    """Closing a client (as a failing harvest does) ends its requests still in flight in
    other threads, such as a prefetch nobody waits for any more."""
    server.faults.add("delay", verb="ListRecords", page=1, seconds=STALL)
    client = OAIClient(server.base_url, ClientOptions(read_timeout=STALL, max_retries=3))
    client.identify()
    call = Call(lambda: _pages(client))
    _until(_in_flight(server, 1), "the request of page 1")
    closed = time.monotonic()
    client.close()
    call.join()
    assert isinstance(call.error, Cancelled) and time.monotonic() - closed < PROMPTLY
