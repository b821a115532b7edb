"""The OAI-PMH client: six verbs over httpx, lazy paging, retries and politeness."""

from __future__ import annotations

import base64
import email.utils
import logging
import random
import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import suppress
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime
from importlib import metadata as _metadata
from typing import Any, Protocol, TypeVar

import httpcore
import httpx

from .datestamps import Granularity, format_datestamp
from .errors import (
    BadResumptionToken,
    Cancelled,
    CannotDisseminateFormat,
    IdDoesNotExist,
    NoRecordsMatch,
    NoSetHierarchy,
    OAIDataError,
    OAIError,
    OAIHTTPStatusError,
    OAITransportError,
)
from .models import ClientStats, Header, Identify, MetadataFormat, OAISet, Page, Record
from .parse import (
    apply_http_charset,
    parse_get_record,
    parse_identify,
    parse_metadata_formats,
    parse_record_list,
    parse_sets,
    read_envelope,
)

__all__ = ["OAIClient", "ClientOptions", "LoggerLike", "DEFAULT_USER_AGENT", "redact_url"]

T = TypeVar("T")

try:
    __version__ = _metadata.version("oaipmh-dagster")
except _metadata.PackageNotFoundError:  # pragma: no cover - running from a bare checkout
    __version__ = "0"

DEFAULT_USER_AGENT = f"oaipmh-dagster/{__version__}"
LIST_VERBS = ("ListRecords", "ListIdentifiers")
_RETRY_AFTER_STATUSES = frozenset({429, 503})
_BACKOFF_STATUSES = frozenset({500, 502, 504})
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_MAX_REDIRECTS = 10
_GZIP_MAGIC = b"\x1f\x8b"
DEADLINE_FACTOR = 5
"""A request's default deadline, in multiples of the read timeout."""
_POLL = 0.2


class LoggerLike(Protocol):
    """Anything with the usual logging methods (a ``logging.Logger``, Dagster's ``context.log``)."""

    def debug(self, msg: str, *args: Any, **kwargs: Any) -> Any: ...
    def info(self, msg: str, *args: Any, **kwargs: Any) -> Any: ...
    def warning(self, msg: str, *args: Any, **kwargs: Any) -> Any: ...
    def error(self, msg: str, *args: Any, **kwargs: Any) -> Any: ...


@dataclass(frozen=True)
class ClientOptions:
    """How a client talks to one endpoint. Times are in seconds."""

    connect_timeout: float = 10.0
    read_timeout: float = 60.0
    """Longest wait for any single read from the server."""
    request_timeout: float | None = None
    """Longest time one HTTP request may take, from connecting to the last byte of the
    body (a server that trickles bytes never trips ``read_timeout``). None means
    ``DEADLINE_FACTOR`` × ``read_timeout``."""
    max_retries: int = 5
    backoff_base: float = 1.0
    backoff_max: float = 60.0
    retry_after_max: float = 300.0
    delay: float = 0.0
    """Minimum time between the starts of two requests to the same host."""
    max_parallel: int = 1
    """Requests in flight to the same host at once, counted across all clients of the process."""
    user_agent: str = DEFAULT_USER_AGENT
    contact: str | None = None
    """An e-mail address or URL added to the User-Agent (and sent as ``From`` if an e-mail)."""
    max_response_bytes: int = 256 * 1024 * 1024
    max_empty_pages: int = 100
    """Consecutive pages with a resumptionToken but no records accepted before giving up."""
    prefetch: bool = False
    """Fetch page n+1 in a background thread while page n is consumed."""
    auth: tuple[str, str] | None = field(default=None, repr=False)
    bearer_token: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.max_parallel < 1:
            raise ValueError("max_parallel must be at least 1")
        if self.max_retries < 0:
            raise ValueError("max_retries must not be negative")
        if self.max_response_bytes < 1:
            raise ValueError("max_response_bytes must be positive")
        if self.auth is not None and self.bearer_token is not None:
            raise ValueError("give either auth (basic) or bearer_token, not both")
        if self.request_timeout is not None and self.request_timeout <= 0:
            raise ValueError("request_timeout must be positive")

    @property
    def deadline(self) -> float:
        """Seconds one request may take in total."""
        if self.request_timeout is not None:
            return self.request_timeout
        return DEADLINE_FACTOR * self.read_timeout

    @property
    def full_user_agent(self) -> str:
        if not self.contact:
            return self.user_agent
        contact = self.contact
        if "@" in contact and ":" not in contact:
            contact = f"mailto:{contact}"
        return f"{self.user_agent} (+{contact})"


def redact_url(url: str | httpx.URL) -> str:
    """The URL as text without userinfo (user name and password)."""
    u = httpx.URL(str(url)) if not isinstance(url, httpx.URL) else url
    if u.userinfo:
        u = u.copy_with(username=None, password=None)
    return str(u)


def _origin(url: httpx.URL) -> tuple[str, str, int | None]:
    default = {"http": 80, "https": 443}.get(url.scheme)
    return url.scheme, url.host, url.port or default


class _Host:
    """Process-wide state of one host: in-flight count, pacing, the shared HTTP client."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.active = 0
        self.next_start: float | None = None
        self.http: httpx.Client | None = None
        self.refs = 0

    def acquire(
        self,
        limit: int,
        delay: float,
        clock: Callable[[], float],
        sleep: Callable[[float], Any],
        scope: _CancelScope,
    ) -> None:
        with self.cond:
            while self.active >= limit:
                scope.check()
                self.cond.wait(_POLL)
            scope.check()
            self.active += 1
            now = clock()
            start = now
            if delay > 0:
                if self.next_start is not None and self.next_start > now:
                    start = self.next_start
                self.next_start = start + delay
        if start > now:
            sleep(start - now)

    def release(self) -> None:
        with self.cond:
            self.active -= 1
            self.cond.notify()


_HOSTS: dict[tuple[str, str, int | None], _Host] = {}
_HOSTS_LOCK = threading.Lock()


def _host_state(key: tuple[str, str, int | None]) -> _Host:
    with _HOSTS_LOCK:
        host = _HOSTS.get(key)
        if host is None:
            host = _HOSTS[key] = _Host()
        return host


# -- cancellation and deadlines ----------------------------------------------------------

_current = threading.local()
"""Per thread: ``request``, the request in flight; ``scope``, the cancel scope it belongs to."""


class _CancelScope:
    """Requests (and the waits between them) that are cancelled together.

    Cancelling shuts down the sockets of the requests in flight, so a thread blocked in
    a read returns at once, and makes every later request or wait raise `Cancelled`.
    Cancelling a scope cancels its children."""

    def __init__(self, parent: _CancelScope | None = None) -> None:
        self.parent = parent
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._requests: set[_Request] = set()
        self._children: set[_CancelScope] = set()

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

    def child(self) -> _CancelScope:
        scope = _CancelScope(self)
        with self._lock:
            self._children.add(scope)
        if self.cancelled:
            scope.cancel()
        return scope

    def forget(self, child: _CancelScope) -> None:
        with self._lock:
            self._children.discard(child)

    def add(self, request: _Request) -> None:
        with self._lock:
            self._requests.add(request)
        if self.cancelled:
            request.abort()

    def discard(self, request: _Request) -> None:
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


class _Request:
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


class _DeadlineExceeded(httpx.TimeoutException):
    """A request outlived its deadline (retried like any timeout)."""


class _GuardedStream(httpcore.NetworkStream):
    """A connection's stream that keeps each read within the current request's deadline
    and lets the request be aborted from another thread."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def _timeout(self, timeout: float | None, request: _Request | None) -> float | None:
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
        return _GuardedStream(inner)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _GuardedBackend(httpcore.NetworkBackend):
    """httpcore's network backend with `_GuardedStream` connections."""

    def __init__(self, inner: httpcore.NetworkBackend) -> None:
        self._inner = inner

    def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                    local_address: str | None = None,
                    socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        request = getattr(_current, "request", None)
        if request is not None:
            left = max(0.001, request.remaining())
            timeout = left if timeout is None else min(timeout, left)
        return _GuardedStream(self._inner.connect_tcp(
            host, port, timeout=timeout, local_address=local_address,
            socket_options=socket_options))

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable[Any] | None = None
                            ) -> httpcore.NetworkStream:
        return _GuardedStream(self._inner.connect_unix_socket(
            path, timeout=timeout, socket_options=socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def _guard(http: httpx.Client) -> bool:
    """Route the sockets of `http` through `_GuardedBackend`; False if it cannot be done.

    httpx offers no public way to give its transports an httpcore network backend, so
    this sets the connection pools' backend attribute; a test holds it to the installed
    httpx. Without the guard, deadlines are checked between received chunks only."""
    guarded = False
    for transport in [http._transport, *http._mounts.values()]:  # noqa: SLF001
        pool = getattr(transport, "_pool", None)
        backend = getattr(pool, "_network_backend", None)
        if isinstance(backend, httpcore.NetworkBackend):
            if not isinstance(backend, _GuardedBackend):
                pool._network_backend = _GuardedBackend(backend)  # noqa: SLF001
            guarded = True
    return guarded


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (seconds or HTTP date); None if unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    current = now if now is not None else time.time()
    return max(0.0, when.timestamp() - current)


class OAIClient:
    """An OAI-PMH client for one base URL.

    Thread-safe; use it as a context manager or call :meth:`close`. Connections are
    kept alive and shared by all clients of the process that talk to the same host
    (unless a ``transport`` is given), and so is the per-host limit of parallel
    requests and the pacing between them.
    """

    def __init__(
        self,
        base_url: str,
        options: ClientOptions | None = None,
        *,
        logger: logging.Logger | LoggerLike | None = None,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        options = options or ClientOptions()
        url = httpx.URL(base_url)
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError(f"not an http(s) base URL: {redact_url(url)}")
        if url.userinfo and options.auth is None and options.bearer_token is None:
            options = replace(options, auth=(url.username, url.password))
        if url.userinfo:
            url = url.copy_with(username=None, password=None)
        self.base_url = str(url)
        self._base = url
        self.options = options
        self.log: logging.Logger | LoggerLike = logger or logging.getLogger("oaipmh_dagster.oai")
        self.stats = ClientStats()
        self._sleep = sleep
        self._clock = clock
        self._cancel = _CancelScope()
        self._identify: Identify | None = None
        self._identify_lock = threading.Lock()
        self._timeout = httpx.Timeout(
            connect=options.connect_timeout,
            read=options.read_timeout,
            write=options.read_timeout,
            pool=options.read_timeout,
        )
        self._origin = _origin(url)
        self._host = _host_state(self._origin)
        self._shared = transport is None
        self._closed = False
        self._auth_header = self._make_auth_header(options)
        self._headers = {
            "User-Agent": options.full_user_agent,
            "Accept": "text/xml, application/xml;q=0.9, */*;q=0.1",
            "Accept-Encoding": "gzip, deflate",
        }
        if options.contact and "@" in options.contact and ":" not in options.contact:
            self._headers["From"] = options.contact
        if self._shared:
            with self._host.cond:
                if self._host.http is None:
                    self._host.http = httpx.Client(timeout=self._timeout, follow_redirects=False)
                self._host.refs += 1
                self._http = self._host.http
        else:
            self._http = httpx.Client(
                transport=transport, timeout=self._timeout, follow_redirects=False
            )
        self.guarded = _guard(self._http)
        """True when reads are held to the request deadline and can be cancelled at once."""

    # -- lifecycle -------------------------------------------------------------------

    def cancel(self) -> None:
        """Stop this client's requests in flight (and back-off waits) now; every later
        request raises `Cancelled`. Safe to call from any thread or a signal handler."""
        self._cancel.cancel()

    def _scope(self) -> _CancelScope:
        """The cancel scope of the calling thread's requests (a prefetch thread has its own)."""
        scope = getattr(_current, "scope", None)
        return scope if scope is not None and scope.parent is self._cancel else self._cancel

    def _wait(self, seconds: float) -> None:
        """Sleep between requests; a cancel ends the wait at once."""
        scope = self._scope()
        if self._sleep is None:
            scope.wait(seconds)
        else:
            self._sleep(seconds)
            scope.check()

    def close(self) -> None:
        """Cancel what is still in flight (a prefetch nobody waits for) and release the
        connection pool (the shared one when its last client closes)."""
        if self._closed:
            return
        self._closed = True
        self._cancel.cancel()
        if not self._shared:
            self._http.close()
            return
        with self._host.cond:
            self._host.refs -= 1
            if self._host.refs <= 0 and self._host.http is not None:
                self._host.http.close()
                self._host.http = None

    def __enter__(self) -> OAIClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"OAIClient({self.base_url!r})"

    # -- HTTP ------------------------------------------------------------------------

    @staticmethod
    def _make_auth_header(options: ClientOptions) -> str | None:
        if options.bearer_token:
            return f"Bearer {options.bearer_token}"
        if options.auth:
            user, password = options.auth
            raw = f"{user}:{password}".encode()
            return "Basic " + base64.b64encode(raw).decode("ascii")
        return None

    def url_for(self, params: dict[str, str]) -> str:
        """The request URL for these OAI arguments (never with userinfo)."""
        return str(self._base.copy_merge_params(params))

    def _headers_for(self, url: httpx.URL) -> dict[str, str]:
        if self._auth_header is None or _origin(url) != self._origin:
            return self._headers
        return {**self._headers, "Authorization": self._auth_header}

    def _read_body(
        self, resp: httpx.Response, url: str, token: str | None, request: _Request
    ) -> bytes:
        limit = self.options.max_response_bytes
        declared = resp.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            raise OAIDataError(
                f"response of {int(declared)} bytes exceeds the maximum of {limit} bytes",
                url=url,
                token=token,
            )
        chunks: list[bytes] = []
        total = 0
        for chunk in resp.iter_bytes():
            total += len(chunk)
            if total > limit:
                raise OAIDataError(
                    f"response exceeds the maximum of {limit} bytes", url=url, token=token
                )
            chunks.append(chunk)
            if not self.guarded:
                request.received = resp.num_bytes_downloaded
                if request.overdue():
                    raise _DeadlineExceeded(request.describe())
        body = b"".join(chunks)
        if body[:2] == _GZIP_MAGIC:
            body = self._gunzip(body, url, token)
        return body

    def _gunzip(self, body: bytes, url: str, token: str | None) -> bytes:
        limit = self.options.max_response_bytes
        out: list[bytes] = []
        total = 0
        data = body
        try:
            while data:
                d = zlib.decompressobj(16 + zlib.MAX_WBITS)
                piece = d.decompress(data, limit + 1 - total)
                out.append(piece)
                total += len(piece)
                if total > limit or d.unconsumed_tail:
                    raise OAIDataError(
                        f"decompressed response exceeds the maximum of {limit} bytes",
                        url=url,
                        token=token,
                    )
                if not d.eof:
                    raise OAIDataError(
                        "gzip response is truncated", url=url, token=token, retryable=True
                    )
                data = d.unused_data  # concatenated gzip members
        except zlib.error as exc:
            raise OAIDataError(
                f"gzip response cannot be decompressed: {exc}", url=url, token=token, retryable=True
            ) from None
        return b"".join(out)

    def _exchange(
        self, params: dict[str, str], token: str | None
    ) -> tuple[int, bytes, httpx.Headers, str]:
        """One request (following redirects): status, body, headers, display URL."""
        target = self._base.copy_merge_params(params)
        scope = self._scope()
        for _ in range(_MAX_REDIRECTS + 1):
            shown = redact_url(target)
            self._host.acquire(
                self.options.max_parallel, self.options.delay, self._clock, self._wait, scope
            )
            request = _Request(self.options.deadline)
            scope.add(request)
            _current.request = request
            try:
                self.stats.add(requests=1)
                with self._http.stream(
                    "GET", target, headers=self._headers_for(target), timeout=self._timeout
                ) as resp:
                    location = resp.headers.get("location")
                    if resp.status_code in _REDIRECTS and location:
                        self.stats.add(bytes_received=resp.num_bytes_downloaded)
                        target = target.join(location)
                        self.log.debug(
                            f"redirect {resp.status_code} from {shown} to {redact_url(target)}"
                        )
                        continue
                    try:
                        body = self._read_body(resp, shown, token, request)
                    finally:
                        self.stats.add(bytes_received=resp.num_bytes_downloaded)
                    return resp.status_code, body, resp.headers, shown
            except httpx.HTTPError:
                if request.aborted or scope.cancelled:
                    raise Cancelled("cancelled: the harvest is stopping", url=shown,
                                    token=token) from None
                if request.overdue():
                    raise _DeadlineExceeded(request.describe()) from None
                raise
            finally:
                _current.request = None
                scope.discard(request)
                self._host.release()
        raise OAITransportError(
            f"more than {_MAX_REDIRECTS} redirects", url=self.url_for(params), token=token
        )

    def _backoff(self, attempt: int) -> float:
        base = min(self.options.backoff_max, self.options.backoff_base * (2**attempt))
        return base / 2 + random.uniform(0, base / 2)

    def _call(
        self,
        params: dict[str, str],
        token: str | None,
        handler: Callable[[bytes, str, int], T],
    ) -> T:
        """Request, classify, parse with ``handler``; retry what may succeed on a second try."""
        shown = self.url_for(params)
        attempt = 0
        while True:
            last_error: OAIError | None = None
            retry_after: float | None = None
            try:
                status, body, headers, shown = self._exchange(params, token)
                if status in _RETRY_AFTER_STATUSES:
                    retry_after = parse_retry_after(headers.get("retry-after"))
                    reason = f"HTTP {status}"
                    if retry_after is not None:
                        reason += f" (Retry-After {headers.get('retry-after')})"
                elif status in _BACKOFF_STATUSES:
                    reason = f"HTTP {status}"
                else:
                    try:
                        body = apply_http_charset(body, headers.get("content-type"))
                        return handler(body, shown, status)
                    except OAIDataError as exc:
                        if status >= 400:
                            raise OAIHTTPStatusError(
                                f"HTTP {status} without an OAI-PMH response ({exc.message})",
                                status_code=status,
                                url=shown,
                                token=token,
                            ) from None
                        raise
            except OAIDataError as exc:
                if not exc.retryable:
                    raise
                last_error = exc
                reason = exc.message
            except _DeadlineExceeded as exc:
                reason = str(exc)
            except httpx.TimeoutException as exc:
                reason = f"timeout ({type(exc).__name__})"
            except (httpx.TransportError, httpx.DecodingError) as exc:
                reason = f"{type(exc).__name__}: {exc}"
            if attempt >= self.options.max_retries:
                attempts = attempt + 1
                if isinstance(last_error, OAIDataError):
                    raise OAIDataError(
                        f"{last_error.message}; gave up after {attempts} attempts",
                        url=shown,
                        token=token,
                    )
                raise OAITransportError(
                    f"{reason}; gave up after {attempts} attempts", url=shown, token=token
                )
            if retry_after is not None:
                wait = min(retry_after, self.options.retry_after_max)
            else:
                wait = self._backoff(attempt)
            attempt += 1
            self.stats.add(retries=1)
            where = f"{shown}" + (f" (resumptionToken={token!r})" if token else "")
            self.log.warning(
                f"retry {attempt}/{self.options.max_retries} of {where} in {wait:.1f}s: {reason}"
            )
            self._wait(wait)

    # -- verbs -----------------------------------------------------------------------

    def identify(self) -> Identify:
        """Identify (fetched once, then cached)."""
        with self._identify_lock:
            if self._identify is None:

                def handle(body: bytes, url: str, status: int) -> Identify:
                    env = read_envelope(body, url=url, logger=self.log)
                    self.stats.add(stripped_chars=env.stripped_chars)
                    return parse_identify(env, body, url=url, logger=self.log)

                self._identify = self._call({"verb": "Identify"}, None, handle)
            return self._identify

    @property
    def granularity(self) -> Granularity:
        """The repository's datestamp granularity (from a cached Identify)."""
        return self.identify().granularity

    def list_metadata_formats(self, identifier: str | None = None) -> list[MetadataFormat]:
        """The metadata formats of the repository (or of one item)."""
        params = {"verb": "ListMetadataFormats"}
        if identifier is not None:
            params["identifier"] = identifier

        def handle(body: bytes, url: str, status: int) -> list[MetadataFormat]:
            env = read_envelope(body, url=url, logger=self.log)
            return parse_metadata_formats(env, url=url)

        return self._call(params, None, handle)

    def list_sets(self) -> Iterator[OAISet]:
        """All sets, page by page; a repository without sets yields none."""

        def fetch(params: dict[str, str], token: str | None) -> tuple[list[OAISet], Any, int]:
            def handle(body: bytes, url: str, status: int) -> tuple[list[OAISet], Any]:
                env = read_envelope(body, url=url, token=token, logger=self.log)
                self.stats.add(pages=1, stripped_chars=env.stripped_chars)
                return parse_sets(env, url=url, token=token)

            sets, rt = self._call(params, token, handle)
            return sets, rt, len(sets)

        try:
            for sets, _ in self._chain("ListSets", {"verb": "ListSets"}, None, fetch):
                yield from sets
        except NoSetHierarchy:
            self.log.info(f"{self.base_url} has no set hierarchy")

    def _format_time(self, value: datetime | date | str | None) -> str | None:
        if value is None or isinstance(value, str):
            return value
        return format_datestamp(value, self.granularity)

    def iter_pages(
        self,
        verb: str,
        *,
        metadata_prefix: str | None = None,
        set_spec: str | None = None,
        from_: datetime | date | str | None = None,
        until: datetime | date | str | None = None,
        resumption_token: str | None = None,
    ) -> Iterator[Page]:
        """The pages of a ListRecords or ListIdentifiers list, fetched lazily.

        ``from_``/``until`` objects are formatted at the Identify granularity; strings go
        as they are. ``resumption_token`` starts mid-list (to resume a checkpoint); with
        the original arguments too, an expired token can restart the list.
        """
        if verb not in LIST_VERBS:
            raise ValueError(f"iter_pages serves {' and '.join(LIST_VERBS)}, not {verb!r}")
        args: dict[str, str] = {"verb": verb}
        if metadata_prefix is not None:
            args["metadataPrefix"] = metadata_prefix
        if set_spec is not None:
            args["set"] = set_spec
        from_text, until_text = self._format_time(from_), self._format_time(until)
        if from_text is not None:
            args["from"] = from_text
        if until_text is not None:
            args["until"] = until_text
        if metadata_prefix is None and resumption_token is None:
            raise ValueError(f"{verb} needs metadata_prefix (or a resumption_token)")

        def fetch(params: dict[str, str], token: str | None) -> tuple[Page, Any, int]:
            def handle(body: bytes, url: str, status: int) -> Page:
                env = read_envelope(body, url=url, token=token, logger=self.log)
                records, rt, skipped = parse_record_list(env, verb, url=url, token=token)
                if skipped:
                    self.log.warning(
                        f"skipped {skipped} header(s) without identifier or datestamp in {url}"
                    )
                if env.response_date is None:
                    self.log.warning(f"no readable responseDate in {url}; using the local clock")
                self.stats.add(pages=1, stripped_chars=env.stripped_chars, skipped_headers=skipped)
                return Page(
                    records=records,
                    resumption_token=rt,
                    response_date=env.response_date or datetime.now(UTC),
                    request_url=url,
                    verb=verb,
                    params=dict(params),
                    bytes=env.size,
                    stripped_chars=env.stripped_chars,
                    request_args=dict(args),
                    skipped_headers=skipped,
                )

            try:
                page = self._call(params, token, handle)
            except CannotDisseminateFormat as exc:
                raise self._explain_format(exc, metadata_prefix) from None
            except NoRecordsMatch as exc:
                if token:
                    raise
                # An empty list: one empty page, so the caller still learns the
                # server's responseDate.
                page = Page(
                    records=[],
                    resumption_token=None,
                    response_date=exc.response_date or datetime.now(UTC),
                    request_url=exc.url or self.url_for(params),
                    verb=verb,
                    params=dict(params),
                    request_args=dict(args),
                )
            return page, page.resumption_token, len(page.records)

        can_restart = metadata_prefix is not None
        chain = self._chain(verb, args, resumption_token, fetch, can_restart=can_restart)
        pages = (page for page, _ in chain)
        if self.options.prefetch:
            yield from _prefetched(pages, self._cancel)
        else:
            yield from pages

    def resume_pages(self, request_args: dict[str, str], resumption_token: str) -> Iterator[Page]:
        """Continue a list from a checkpoint: a page's ``request_args`` and its next token."""
        return self.iter_pages(
            request_args["verb"],
            metadata_prefix=request_args.get("metadataPrefix"),
            set_spec=request_args.get("set"),
            from_=request_args.get("from"),
            until=request_args.get("until"),
            resumption_token=resumption_token,
        )

    def _chain(
        self,
        verb: str,
        args: dict[str, str],
        start_token: str | None,
        fetch: Callable[[dict[str, str], str | None], tuple[T, Any, int]],
        *,
        can_restart: bool = True,
    ) -> Iterator[tuple[T, Any]]:
        """Follow resumptionTokens: loop detection, empty pages, one restart on a bad token."""
        token = start_token
        loops = _LoopDetector()
        empty = 0
        restarted = False
        while True:
            params = {"verb": verb, "resumptionToken": token} if token else args
            try:
                item, rt, count = fetch(params, token)
            except NoRecordsMatch:
                if token:
                    self.log.warning(
                        f"noRecordsMatch in the middle of a list at {self.url_for(params)}; "
                        "taking it as the end"
                    )
                return
            except BadResumptionToken as exc:
                if not token or restarted or not can_restart:
                    raise
                restarted = True
                self.log.warning(
                    f"resumptionToken {token!r} rejected ({exc.server_message or 'badResumptionToken'}); "
                    f"restarting the list from its original arguments at {self.url_for(args)}"
                )
                token, loops, empty = None, _LoopDetector(), 0
                continue
            yield item, rt
            if rt is None or not rt.token:
                return
            if rt.token == token or loops.repeated(rt.token):
                raise OAIDataError(
                    "resumptionToken loop: the server sent a token it already sent",
                    url=self.url_for(params),
                    token=rt.token,
                )
            if count == 0:
                empty += 1
                if empty > self.options.max_empty_pages:
                    raise OAIDataError(
                        f"{empty} pages in a row with a resumptionToken but no records",
                        url=self.url_for(params),
                        token=rt.token,
                    )
            else:
                empty = 0
            token = rt.token

    def _explain_format(
        self, exc: CannotDisseminateFormat, prefix: str | None, identifier: str | None = None
    ) -> CannotDisseminateFormat:
        offered: list[str] | None = None
        try:
            offered = [f.prefix for f in self.list_metadata_formats(identifier)]
        except OAIError as err:
            self.log.debug(f"could not list metadata formats: {err}")
        return CannotDisseminateFormat(
            exc.server_message, url=exc.url, token=exc.token, prefix=prefix, offered=offered
        )

    def iter_record_pages(
        self,
        metadata_prefix: str,
        *,
        sets: Sequence[str] = (),
        from_: datetime | date | str | None = None,
        until: datetime | date | str | None = None,
        identifiers_only: bool = False,
    ) -> Iterator[Page]:
        """Pages of one or several sets, one set after another.

        With several sets, a record already yielded in an earlier set is dropped from
        later pages (``page.duplicates_dropped`` counts them).
        """
        verb = "ListIdentifiers" if identifiers_only else "ListRecords"
        from_text, until_text = self._format_time(from_), self._format_time(until)
        specs = list(dict.fromkeys(sets)) or [None]
        seen: set[str] | None = set() if len(specs) > 1 else None
        for spec in specs:
            for page in self.iter_pages(
                verb,
                metadata_prefix=metadata_prefix,
                set_spec=spec,
                from_=from_text,
                until=until_text,
            ):
                if seen is not None:
                    kept = []
                    for record in page.records:
                        if record.header.identifier in seen:
                            page.duplicates_dropped += 1
                        else:
                            seen.add(record.header.identifier)
                            kept.append(record)
                    page.records = kept
                yield page

    def list_records(
        self,
        metadata_prefix: str,
        *,
        sets: Sequence[str] = (),
        from_: datetime | date | str | None = None,
        until: datetime | date | str | None = None,
    ) -> Iterator[Record]:
        """Every record of the selection, lazily."""
        for page in self.iter_record_pages(metadata_prefix, sets=sets, from_=from_, until=until):
            yield from page.records

    def list_identifiers(
        self,
        metadata_prefix: str,
        *,
        sets: Sequence[str] = (),
        from_: datetime | date | str | None = None,
        until: datetime | date | str | None = None,
    ) -> Iterator[Header]:
        """Every header of the selection, lazily."""
        for page in self.iter_record_pages(
            metadata_prefix, sets=sets, from_=from_, until=until, identifiers_only=True
        ):
            for record in page.records:
                yield record.header

    def get_record(self, identifier: str, metadata_prefix: str) -> Record:
        """One record by identifier."""
        params = {"verb": "GetRecord", "identifier": identifier, "metadataPrefix": metadata_prefix}

        def handle(body: bytes, url: str, status: int) -> Record:
            env = read_envelope(body, url=url, logger=self.log)
            self.stats.add(stripped_chars=env.stripped_chars)
            return parse_get_record(env, url=url)

        try:
            return self._call(params, None, handle)
        except CannotDisseminateFormat as exc:
            raise self._explain_format(exc, metadata_prefix, identifier) from None

    def get_records(
        self, identifiers: Iterable[str], metadata_prefix: str, *, skip_missing: bool = False
    ) -> Iterator[Record]:
        """GetRecord for each identifier (duplicates asked once).

        With ``skip_missing``, an identifier the server does not know is logged and skipped.
        """
        for identifier in dict.fromkeys(identifiers):
            try:
                yield self.get_record(identifier, metadata_prefix)
            except IdDoesNotExist:
                if not skip_missing:
                    raise
                self.log.warning(f"{identifier!r} does not exist at {self.base_url}; skipped")


_END = object()


class _LoopDetector:
    """Finds a resumptionToken sequence that repeats, in constant memory: the recent
    tokens catch short loops at once, and Brent's method (a saved token compared with
    each new one, saved again at doubling distances) catches a loop of any length
    within two of its turns."""

    RECENT = 64

    def __init__(self) -> None:
        self.recent: dict[str, None] = {}
        self.saved: str | None = None
        self.power = 1
        self.steps = 0

    def repeated(self, token: str) -> bool:
        if token in self.recent or token == self.saved:
            return True
        self.recent[token] = None
        if len(self.recent) > self.RECENT:
            del self.recent[next(iter(self.recent))]
        self.steps += 1
        if self.steps == self.power:
            self.saved, self.power, self.steps = token, self.power * 2, 0
        return False


class _Ahead:
    """``next(pages)`` in a daemon thread whose requests belong to ``scope``."""

    def __init__(self, pages: Iterator[Page], scope: _CancelScope) -> None:
        self._done = threading.Event()
        self._value: Any = _END
        self._error: BaseException | None = None
        self.thread = threading.Thread(
            target=self._run, args=(pages, scope), name="oai-prefetch", daemon=True
        )
        self.thread.start()

    def _run(self, pages: Iterator[Page], scope: _CancelScope) -> None:
        _current.scope = scope
        try:
            self._value = next(pages, _END)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            self._error = exc
        finally:
            self._done.set()

    def result(self) -> Any:
        """The page (or `_END`); raises what the fetch raised. A signal interrupts the wait."""
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value


_JOIN_AFTER_CANCEL = 5.0


def _prefetched(pages: Iterator[Page], parent: _CancelScope) -> Iterator[Page]:
    """Fetch the next page in a background thread while the current one is consumed.

    Leaving early (an error, an interrupt, the consumer stopping) cancels the fetch in
    flight rather than waiting for it; the thread is a daemon, so even a step that
    cannot be cut short (name resolution) never holds up the process's exit."""
    scope = parent.child()
    ahead = _Ahead(pages, scope)
    finished = False
    try:
        while True:
            page = ahead.result()
            if page is _END:
                finished = True
                return
            ahead = _Ahead(pages, scope)
            yield page
    finally:
        if not finished:
            scope.cancel()
            ahead.thread.join(_JOIN_AFTER_CANCEL)
        parent.forget(scope)
        close = getattr(pages, "close", None)
        if close is not None and not ahead.thread.is_alive():
            close()
