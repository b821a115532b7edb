"""Deadlines and cancellation of HTTP requests.

A request may take ``ClientOptions.deadline`` seconds in all (a server that trickles
bytes never trips a read timeout), and a :class:`CancelScope` ends the requests in
flight at once, from any thread: the connections' sockets are routed through
:class:`GuardedBackend`, which bounds each read by the deadline and lets a blocked read
be woken by shutting its socket down.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterable
from contextlib import suppress
from typing import Any

import httpcore
import httpx

from .errors import Cancelled

__all__ = [
    "CancelScope",
    "DeadlineExceeded",
    "Request",
    "bind_scope",
    "current_scope",
    "guard",
    "track",
]

_current = threading.local()
"""Per thread: ``request``, the request in flight; ``scope``, the cancel scope it belongs to."""


def bind_scope(scope: CancelScope) -> None:
    """Make `scope` the calling thread's cancel scope (a prefetch thread has its own)."""
    _current.scope = scope


def current_scope() -> CancelScope | None:
    """The cancel scope bound to the calling thread, if any."""
    return getattr(_current, "scope", None)


class CancelScope:
    """Requests (and the waits between them) that are cancelled together.

    Cancelling shuts down the sockets of the requests in flight, so a thread blocked in
    a read returns at once, and makes every later request or wait raise `Cancelled`.
    Cancelling a scope cancels its children."""

    def __init__(self, parent: CancelScope | None = None) -> None:
        self.parent = parent
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._requests: set[Request] = set()
        self._children: set[CancelScope] = set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def cancel(self) -> None:
        self._event.set()
        with self._lock:
            requests, children = list(self._requests), list(self._children)
        for request in requests:
            request.abort()
        for child in children:
            child.cancel()

    def child(self) -> CancelScope:
        scope = CancelScope(self)
        with self._lock:
            self._children.add(scope)
        if self.cancelled:
            scope.cancel()
        return scope

    def forget(self, child: CancelScope) -> None:
        with self._lock:
            self._children.discard(child)

    def add(self, request: Request) -> None:
        with self._lock:
            self._requests.add(request)
        if self.cancelled:
            request.abort()

    def discard(self, request: Request) -> None:
        with self._lock:
            self._requests.discard(request)

    def check(self) -> None:
        """Raise `Cancelled` once the scope is cancelled."""
        if self.cancelled:
            raise Cancelled("cancelled: the harvest is stopping")

    def wait(self, seconds: float) -> None:
        """Sleep `seconds`, or raise `Cancelled` as soon as the scope is cancelled."""
        if self._event.wait(max(0.0, seconds)):
            self.check()


class Request:
    """One HTTP request in flight: its deadline, the bytes received, its socket."""

    def __init__(self, limit: float) -> None:
        self.started = time.monotonic()
        self.limit = limit
        self.received = 0
        self.aborted = False
        self._sock: socket.socket | None = None

    def remaining(self) -> float:
        return self.started + self.limit - time.monotonic()

    def overdue(self) -> bool:
        return self.remaining() <= 0

    def describe(self) -> str:
        """Why the request was given up after its deadline."""
        elapsed = time.monotonic() - self.started
        return (
            f"the server sent {self.received} bytes in {elapsed:.1f} s and did not finish "
            f"the response within the request deadline of {self.limit:g} s"
        )

    def attach(self, stream: httpcore.NetworkStream) -> None:
        """Remember the socket the request uses (a new or a kept-alive connection)."""
        sock = stream.get_extra_info("socket")
        if sock is not self._sock:
            self._sock = sock
            if self.aborted:
                self._shutdown()

    def abort(self) -> None:
        """End the request from any thread: a blocked read returns at once."""
        self.aborted = True
        self._shutdown()

    def _shutdown(self) -> None:
        sock = self._sock
        if sock is not None:
            with suppress(OSError):
                # The plain socket's shutdown, also under TLS: wakes a blocked reader.
                socket.socket.shutdown(sock, socket.SHUT_RDWR)


class DeadlineExceeded(httpx.TimeoutException):
    """A request outlived its deadline (retried like any timeout)."""


class GuardedStream(httpcore.NetworkStream):
    """A connection's stream that keeps each read within the current request's deadline
    and lets the request be aborted from another thread."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def _timeout(self, timeout: float | None, request: Request | None) -> float | None:
        if request is None:
            return timeout
        request.attach(self._inner)
        if request.aborted:
            raise httpcore.ReadError("request cancelled")
        left = request.remaining()
        if left <= 0:
            raise httpcore.ReadTimeout("request deadline exceeded")
        return left if timeout is None else min(timeout, left)

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        request = getattr(_current, "request", None)
        data = self._inner.read(max_bytes, self._timeout(timeout, request))
        if request is not None:
            request.received += len(data)
        return data

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        request = getattr(_current, "request", None)
        self._inner.write(buffer, self._timeout(timeout, request))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        request = getattr(_current, "request", None)
        inner = self._inner.start_tls(ssl_context, server_hostname,
                                      self._timeout(timeout, request))
        return GuardedStream(inner)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class GuardedBackend(httpcore.NetworkBackend):
    """httpcore's network backend with `GuardedStream` connections."""

    def __init__(self, inner: httpcore.NetworkBackend) -> None:
        self._inner = inner

    def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                    local_address: str | None = None,
                    socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        request = getattr(_current, "request", None)
        if request is not None:
            left = max(0.001, request.remaining())
            timeout = left if timeout is None else min(timeout, left)
        return GuardedStream(self._inner.connect_tcp(
            host, port, timeout=timeout, local_address=local_address,
            socket_options=socket_options))

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable[Any] | None = None
                            ) -> httpcore.NetworkStream:
        return GuardedStream(self._inner.connect_unix_socket(
            path, timeout=timeout, socket_options=socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def guard(http: httpx.Client) -> bool:
    """Route the sockets of `http` through `GuardedBackend`; False if it cannot be done.

    httpx offers no public way to give its transports an httpcore network backend, so
    this sets the connection pools' backend attribute; a test holds it to the installed
    httpx. Without the guard, deadlines are checked between received chunks only."""
    guarded = False
    for transport in [http._transport, *http._mounts.values()]:  # noqa: SLF001
        pool = getattr(transport, "_pool", None)
        backend = getattr(pool, "_network_backend", None)
        if pool is not None and isinstance(backend, httpcore.NetworkBackend):
            if not isinstance(backend, GuardedBackend):
                pool._network_backend = GuardedBackend(backend)  # noqa: SLF001
            guarded = True
    return guarded



def track(request: Request | None) -> None:
    """Hold the calling thread's reads and writes to `request` (its deadline, an abort);
    None when the request is over."""
    _current.request = request
