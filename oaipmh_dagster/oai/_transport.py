"""HTTP for one OAI-PMH base URL: the httpx client, per-host limits and pacing,
redirects, retries with back-off and Retry-After, gzip and the body size limit.

Connections are kept alive and shared by all transports of the process that talk to
the same host (unless an httpx ``transport`` is given), and so is the per-host limit
of parallel requests and the pacing between them.
"""

from __future__ import annotations

import base64
import email.utils
import logging
import random
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC
from typing import Any, TypeVar

import httpx

from ._charset import apply_http_charset
from ._deadline import CancelScope, DeadlineExceeded, Request, current_scope, guard, track
from ._options import ClientOptions, LoggerLike
from .errors import Cancelled, OAIDataError, OAIError, OAIHTTPStatusError, OAITransportError
from .models import ClientStats

__all__ = ["Transport", "parse_retry_after", "redact_url"]

T = TypeVar("T")

_RETRY_AFTER_STATUSES = frozenset({429, 503})
_BACKOFF_STATUSES = frozenset({500, 502, 504})
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_MAX_REDIRECTS = 10
_GZIP_MAGIC = b"\x1f\x8b"
_POLL = 0.2


# Query parameters whose values are credentials (compared in lower case); OAI-PMH's own
# arguments (verb, resumptionToken, ...) are never among them.
SECRET_PARAMS = frozenset({
    "access_token", "api_key", "apikey", "auth", "key", "password", "passwd", "secret",
    "sig", "signature", "token", "x-api-key",
})
MASK = "***"


def redact_url(url: str | httpx.URL) -> str:
    """The URL as text without userinfo (user name and password) and with the values
    of credential-like query parameters (`SECRET_PARAMS`) masked."""
    u = httpx.URL(str(url)) if not isinstance(url, httpx.URL) else url
    if u.userinfo:
        u = u.copy_with(username=None, password=None)
    if any(name.lower() in SECRET_PARAMS for name in u.params):
        u = u.copy_with(params=[(k, MASK if k.lower() in SECRET_PARAMS else v)
                                for k, v in u.params.multi_items()])
    return str(u)


class _RedactURLs(logging.Filter):
    """httpx logs each request's URL at INFO (`HTTP Request: GET <url> ...`): the URL
    arguments of its records are shown through `redact_url`."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and any(
                isinstance(a, httpx.URL) for a in record.args):
            record.args = tuple(redact_url(a) if isinstance(a, httpx.URL) else a
                                for a in record.args)
        return True


if not any(isinstance(f, _RedactURLs) for f in logging.getLogger("httpx").filters):
    logging.getLogger("httpx").addFilter(_RedactURLs())


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
        scope: CancelScope,
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


class Transport:
    """Requests to one base URL: ``call`` asks, classifies the answer and retries what
    may succeed on a second try. Thread-safe; :meth:`close` releases the connections."""

    def __init__(
        self,
        base_url: str,
        options: ClientOptions,
        *,
        log: logging.Logger | LoggerLike,
        stats: ClientStats,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
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
        self.log = log
        self.stats = stats
        self._sleep = sleep
        self._clock = clock
        self.cancel_scope = CancelScope()
        """The scope of every request of this transport (a prefetch thread's is a child)."""
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
        self.guarded = guard(self._http)
        """True when reads are held to the request deadline and can be cancelled at once."""

    def cancel(self) -> None:
        """Stop the requests in flight (and back-off waits) now; every later request
        raises `Cancelled`. Safe to call from any thread or a signal handler."""
        self.cancel_scope.cancel()

    def _scope(self) -> CancelScope:
        """The cancel scope of the calling thread's requests (a prefetch thread has its own)."""
        scope = current_scope()
        return scope if scope is not None and scope.parent is self.cancel_scope else self.cancel_scope

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
        self.cancel_scope.cancel()
        if not self._shared:
            self._http.close()
            return
        with self._host.cond:
            self._host.refs -= 1
            if self._host.refs <= 0 and self._host.http is not None:
                self._host.http.close()
                self._host.http = None

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
        self, resp: httpx.Response, url: str, token: str | None, request: Request
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
                    raise DeadlineExceeded(request.describe())
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
            request = Request(self.options.deadline)
            scope.add(request)
            track(request)
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
                    raise DeadlineExceeded(request.describe()) from None
                raise
            finally:
                track(None)
                scope.discard(request)
                self._host.release()
        raise OAITransportError(
            f"more than {_MAX_REDIRECTS} redirects", url=self.url_for(params), token=token
        )

    def _backoff(self, attempt: int) -> float:
        base = min(self.options.backoff_max, self.options.backoff_base * (2**attempt))
        return base / 2 + random.uniform(0, base / 2)

    def call(
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
                retry_after, reason = _retry_status(status, headers)
                if reason is None:
                    return _handled(handler, status, body, headers, shown, token)
            except OAIDataError as exc:
                if not exc.retryable:
                    raise
                last_error = exc
                reason = exc.message
            except DeadlineExceeded as exc:
                reason = str(exc)
            except httpx.TimeoutException as exc:
                reason = f"timeout ({type(exc).__name__})"
            except (httpx.TransportError, httpx.DecodingError) as exc:
                reason = f"{type(exc).__name__}: {exc}"
            if attempt >= self.options.max_retries:
                raise _gave_up(last_error, reason, attempt + 1, shown, token)
            self._before_retry(attempt, reason, retry_after, shown, token)
            attempt += 1

    def _before_retry(self, attempt: int, reason: str, retry_after: float | None,
                      shown: str, token: str | None) -> None:
        """Count, log and wait out retry `attempt + 1`."""
        if retry_after is not None:
            wait = min(retry_after, self.options.retry_after_max)
        else:
            wait = self._backoff(attempt)
        self.stats.add(retries=1)
        where = f"{shown}" + (f" (resumptionToken={token!r})" if token else "")
        self.log.warning(
            f"retry {attempt + 1}/{self.options.max_retries} of {where} in {wait:.1f}s: {reason}"
        )
        self._wait(wait)


def _retry_status(status: int, headers: httpx.Headers) -> tuple[float | None, str | None]:
    """(Retry-After seconds, the reason to retry) of an HTTP status that asks for another
    try; (None, None) for any other status."""
    if status in _RETRY_AFTER_STATUSES:
        retry_after = parse_retry_after(headers.get("retry-after"))
        reason = f"HTTP {status}"
        if retry_after is not None:
            reason += f" (Retry-After {headers.get('retry-after')})"
        return retry_after, reason
    if status in _BACKOFF_STATUSES:
        return None, f"HTTP {status}"
    return None, None


def _handled(handler: Callable[[bytes, str, int], T], status: int, body: bytes,
             headers: httpx.Headers, shown: str, token: str | None) -> T:
    """The handler's reading of an answer; a broken answer with an error status is that
    status's error."""
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


def _gave_up(last_error: OAIError | None, reason: str, attempts: int, shown: str,
             token: str | None) -> OAIError:
    """The error of a request that failed `attempts` times."""
    if isinstance(last_error, OAIDataError):
        return OAIDataError(
            f"{last_error.message}; gave up after {attempts} attempts", url=shown, token=token,
            retryable=True,  # later, the page may come back whole
        )
    return OAITransportError(f"{reason}; gave up after {attempts} attempts", url=shown,
                             token=token)
