"""A loopback OAI-PMH 2.0 server over a :class:`Dataset`, with fault injection.

The server runs a :class:`~http.server.ThreadingHTTPServer` in a daemon thread,
answers the six verbs over GET and POST, pages lists with stateless resumption
tokens, logs every request, and can misbehave on demand through :attr:`OAIServer.faults`::

    with OAIServer(make_dataset(500), page_size=50) as server:
        server.faults.add("truncate", verb="ListRecords", page=3)
        httpx.get(server.base_url, params={"verb": "ListRecords", "metadataPrefix": "oai_dc"})

Run ``python -m oaipmh_dagster.demo.server --port 8765`` to serve a sample data set
in the foreground.
"""

from __future__ import annotations

import argparse
import base64
import bisect
import gzip as gzip_module
import hashlib
import hmac
import itertools
import json
import re
import secrets
import signal
import socket
import socketserver
import struct
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import suppress
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit
from xml.sax.saxutils import escape, quoteattr

from oaipmh_dagster.demo.dataset import DAY, Dataset, ServedRecord, make_dataset

__all__ = [
    "FAULT_KINDS",
    "Fault",
    "FaultPlan",
    "OAIServer",
    "RequestInfo",
    "RequestLog",
    "main",
]

OAI_NS = "http://www.openarchives.org/OAI/2.0/"
XSI_NS = "http://www.w3.org/2001/XMLSchema-instance"
XML_DECL = '<?xml version="1.0" encoding="UTF-8"?>\n'

FAULT_KINDS = frozenset(
    {
        "status",
        "reset",
        "delay",
        "truncate",
        "illegal_chars",
        "repeat_token",
        "bad_token",
        "html",
        "oai_error",
        "gzip_no_header",
        "huge",
        "down",
        "xxe",
        "billion_laughs",
        "empty_page",
        "malformed",
        "trickle",
    }
)

_LIST_VERBS = ("ListIdentifiers", "ListRecords", "ListSets")
# verb -> (required arguments, optional arguments); resumptionToken is exclusive.
_ARGUMENTS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "Identify": (frozenset(), frozenset()),
    "ListMetadataFormats": (frozenset(), frozenset({"identifier"})),
    "ListSets": (frozenset(), frozenset({"resumptionToken"})),
    "ListIdentifiers": (
        frozenset({"metadataPrefix"}),
        frozenset({"from", "until", "set", "resumptionToken"}),
    ),
    "ListRecords": (
        frozenset({"metadataPrefix"}),
        frozenset({"from", "until", "set", "resumptionToken"}),
    ),
    "GetRecord": (frozenset({"identifier", "metadataPrefix"}), frozenset()),
}
_DAY_RE = re.compile(r"\d{4}-\d{2}-\d{2}")
_SECONDS_RE = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z")
_TEXT_NODE_RE = re.compile(r">([^<>\s])")


# -- request log and fault plan -----------------------------------------------------


@dataclass
class RequestLog:
    """One request as the server saw it.

    ``started``/``finished`` are :func:`time.monotonic` values, the ``*_wall``
    twins are UTC datetimes; ``status`` is 0 when the connection was dropped
    without a status line; ``bytes_sent`` counts body bytes written.
    """

    number: int
    method: str
    path: str
    verb: str | None
    params: dict[str, list[str]]
    headers: dict[str, str]
    started: float
    started_wall: datetime
    finished: float | None = None
    finished_wall: datetime | None = None
    status: int | None = None
    bytes_sent: int = 0
    fault: str | None = None
    page: int | None = None

    @property
    def duration(self) -> float | None:
        """Seconds from start to finish (None while in flight)."""
        return None if self.finished is None else self.finished - self.started


@dataclass(frozen=True)
class RequestInfo:
    """What a fault predicate sees of a request.

    ``params`` holds the first value of each argument; ``page`` is the 1-based page
    of a list request (1 without a resumption token, None when the token is garbage
    or the verb is not a list).
    """

    number: int
    method: str
    verb: str | None
    params: dict[str, str]
    token: str | None
    page: int | None


@dataclass
class Fault:
    """A planned misbehaviour: ``kind`` fires on matching requests ``times`` times."""

    kind: str
    when: Callable[[RequestInfo], bool]
    times: int | None = 1
    params: dict[str, Any] = field(default_factory=dict)
    fired: int = 0

    @property
    def exhausted(self) -> bool:
        """True once the fault has fired ``times`` times (never for ``times=None``)."""
        return self.times is not None and self.fired >= self.times


class FaultPlan:
    """An ordered, thread-safe list of faults; the first live match fires."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._faults: list[Fault] = []

    def add(
        self,
        kind: str,
        *,
        when: Callable[[RequestInfo], bool] | None = None,
        verb: str | Collection[str] | None = None,
        request_no: int | Collection[int] | None = None,
        token: str | None = None,
        page: int | Collection[int] | None = None,
        times: int | None = 1,
        **params: Any,
    ) -> Fault:
        """Plan a fault of ``kind``; every given condition must hold.

        ``request_no`` is the 1-based number of the request since the server
        started (or since :meth:`OAIServer.clear_log`); ``times=None`` fires for ever.
        The keyword ``params`` configure the fault (``status``, ``seconds``, ...).
        """
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; known: {sorted(FAULT_KINDS)}")
        checks: list[Callable[[RequestInfo], bool]] = []
        if verb is not None:
            verbs = {verb} if isinstance(verb, str) else set(verb)
            checks.append(lambda r: r.verb in verbs)
        if request_no is not None:
            numbers = {request_no} if isinstance(request_no, int) else set(request_no)
            checks.append(lambda r: r.number in numbers)
        if token is not None:
            checks.append(lambda r: r.token == token)
        if page is not None:
            pages = {page} if isinstance(page, int) else set(page)
            checks.append(lambda r: r.page in pages)
        if when is not None:
            checks.append(when)
        fault = Fault(kind, lambda r: all(c(r) for c in checks), times, dict(params))
        with self._lock:
            self._faults.append(fault)
        return fault

    def take(self, info: RequestInfo) -> Fault | None:
        """The first live fault matching ``info``, counted as fired."""
        with self._lock:
            for fault in self._faults:
                if not fault.exhausted and fault.when(info):
                    fault.fired += 1
                    return fault
        return None

    def clear(self) -> None:
        """Forget every planned fault."""
        with self._lock:
            self._faults.clear()

    @property
    def pending(self) -> list[Fault]:
        """Faults that can still fire."""
        with self._lock:
            return [f for f in self._faults if not f.exhausted]

    def __iter__(self) -> Iterator[Fault]:
        with self._lock:
            return iter(list(self._faults))

    def __len__(self) -> int:
        return len(self._faults)


# -- protocol helpers -----------------------------------------------------------------


class _OAIError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class _TokenState:
    """What a resumption token carries: the request, the position and its issue."""

    verb: str
    cursor: int
    page: int
    generation: int
    issued: float
    prefix: str | None = None
    set_spec: str | None = None
    from_: str | None = None
    until: str | None = None
    last: tuple[datetime, str] | None = None
    snapshot: int | None = None  # the list's snapshot (servers whose tokens page over one)


@dataclass
class _Reply:
    status: int = 200
    body: str = ""
    content_type: str = "text/xml; charset=utf-8"
    headers: dict[str, str] = field(default_factory=dict)


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _seconds(value: datetime) -> str:
    return _utc(value).strftime("%Y-%m-%dT%H:%M:%SZ")


def _record_key(record: ServedRecord) -> tuple[datetime, str]:
    return (record.datestamp, record.identifier)


def _abort(handler: BaseHTTPRequestHandler) -> None:
    """Close the client connection with a TCP reset."""
    handler.close_connection = True
    sock = handler.connection
    with suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with suppress(OSError):
        sock.close()
    with suppress(OSError):
        handler.rfile.close()


def _text_node_at(body: str) -> int | None:
    """Where the first text node of the metadata (else of the response) starts."""
    for anchor in ("<metadata>", "<repositoryName>", "<setName>", "<header", "<responseDate>"):
        start = body.find(anchor)
        if start >= 0:
            found = _TEXT_NODE_RE.search(body, start)
            if found:
                return found.start(1)
    return None


def _inject(body: str, text: str, doctype: str = "") -> str:
    """Insert raw ``text`` into a text node and an optional DOCTYPE after the declaration."""
    at = _text_node_at(body)
    if at is not None:
        body = body[:at] + text + body[at:]
    if doctype:
        body = body.replace(XML_DECL, XML_DECL + doctype + "\n", 1)
    return body


# -- HTTP plumbing ----------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "oaipmh-dagster-demo/1.0"
    sys_version = ""
    timeout = 60
    server: _HTTPServer

    def setup(self) -> None:
        super().setup()
        self.server.oai._track(self.connection, add=True)

    def finish(self) -> None:
        try:
            with suppress(OSError):
                super().finish()
        finally:
            self.server.oai._track(self.connection, add=False)

    def do_GET(self) -> None:  # noqa: N802 - http.server naming
        split = urlsplit(self.path)
        if split.path != self.server.oai.path:
            self._not_found()
            return
        self.server.oai._serve(self, "GET", split.path, split.query)

    def do_POST(self) -> None:  # noqa: N802 - http.server naming
        split = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode("utf-8", "replace") if length else ""
        if split.path != self.server.oai.path:
            self._not_found()
            return
        self.server.oai._serve(self, "POST", split.path, body or split.query)

    def _not_found(self) -> None:
        payload = b"Not Found\n"
        self.send_response(404)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - inherited name
        """Stay quiet: the server keeps its own request log."""


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], oai: OAIServer) -> None:
        self.oai = oai
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # Skip HTTPServer's reverse DNS lookup of the host.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], OSError):
            return  # the client went away
        super().handle_error(request, client_address)


# -- the server -------------------------------------------------------------------


class OAIServer:
    """An OAI-PMH 2.0 endpoint on a loopback port, serving ``dataset``.

    ``latency`` seconds are slept before each answer; responses are gzip-compressed
    when ``gzip`` is on and the client accepts it; resumption tokens expire after
    ``token_ttl`` seconds of :attr:`clock` time (never when None) or on
    :meth:`expire_tokens`.
    """

    def __init__(
        self,
        dataset: Dataset,
        *,
        page_size: int = 100,
        host: str = "127.0.0.1",
        port: int = 0,
        latency: float = 0.0,
        gzip: bool = True,
        token_ttl: float | None = None,
        path: str = "/oai",
        snapshot_lists: bool = False,
        offset_tokens: bool = False,
    ) -> None:
        if page_size < 1:
            raise ValueError("page_size must be at least 1")
        self.dataset = dataset
        self.page_size = page_size
        self.host = host
        self.port = port
        self.latency = latency
        self.gzip = gzip
        self.token_ttl = token_ttl
        self.path = path if path.startswith("/") else "/" + path
        # Like search-backed servers (Invenio, Zenodo): a list's tokens page over the
        # records as they were at its first request, whatever changes after.
        self.snapshot_lists = snapshot_lists
        # Like servers whose tokens carry a position (SQL OFFSET): a list that changes
        # before that position makes the next page repeat or skip records.
        self.offset_tokens = offset_tokens
        self._snapshots: dict[int, tuple[ServedRecord, ...]] = {}
        self._snapshot_ids = itertools.count(1)
        self.clock: Callable[[], datetime] = lambda: datetime.now(UTC)
        self.faults = FaultPlan()
        self.max_concurrency = 0
        self._lock = threading.Lock()
        self._log: list[RequestLog] = []
        self._count = 0
        self._in_flight = 0
        self._generation = 0
        self._secret = secrets.token_bytes(16)
        self._nonce = itertools.count()
        self._down_until = 0.0
        self._stopping = threading.Event()
        self._connections: set[socket.socket] = set()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> OAIServer:
        """Bind and serve in a daemon thread; return self."""
        if self._httpd is not None:
            return self
        self._stopping.clear()
        self._httpd = _HTTPServer((self.host, self.port), self)
        self.port = self._httpd.server_port
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"oai-server-{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving, drop open connections, close the port and join the thread."""
        httpd, thread = self._httpd, self._thread
        if httpd is None:
            return
        self._stopping.set()
        httpd.shutdown()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            with suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        httpd.server_close()
        if thread is not None:
            thread.join(timeout)
        self._httpd = None
        self._thread = None

    @property
    def running(self) -> bool:
        """True while the serving thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> OAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        """``http://host:port/path`` of the endpoint."""
        return f"http://{self.host}:{self.port}{self.path}"

    # -- log and tokens ---------------------------------------------------------------

    @property
    def requests(self) -> list[RequestLog]:
        """A snapshot of the request log, oldest first."""
        with self._lock:
            return list(self._log)

    def clear_log(self) -> None:
        """Empty the log, restart request numbering and ``max_concurrency``."""
        with self._lock:
            self._log.clear()
            self._count = 0
            self.max_concurrency = self._in_flight

    def expire_tokens(self) -> None:
        """Invalidate every resumption token issued so far."""
        with self._lock:
            self._generation += 1

    def _track(self, conn: socket.socket, *, add: bool) -> None:
        with self._lock:
            if add:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)

    def _encode_token(self, state: _TokenState) -> str:
        last = [state.last[0].isoformat(), state.last[1]] if state.last else None
        payload = json.dumps(
            [
                1,
                state.verb,
                state.prefix,
                state.set_spec,
                state.from_,
                state.until,
                state.cursor,
                state.page,
                last,
                state.generation,
                round(state.issued, 3),
                next(self._nonce),
                state.snapshot,
            ],
            separators=(",", ":"),
        ).encode()
        mac = hmac.new(self._secret, payload, hashlib.sha256).digest()[:8]
        return base64.urlsafe_b64encode(mac + payload).decode().rstrip("=")

    def _decode_token(self, token: str) -> _TokenState | None:
        """The state in ``token`` (ignoring expiry), or None when it is not ours."""
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
            mac, payload = raw[:8], raw[8:]
            if not hmac.compare_digest(
                mac, hmac.new(self._secret, payload, hashlib.sha256).digest()[:8]
            ):
                return None
            v, verb, prefix, set_spec, from_, until, cursor, page, last, gen, issued, _, snap = (
                json.loads(payload)
            )
            if v != 1:
                return None
            last_key = (datetime.fromisoformat(last[0]), last[1]) if last else None
            return _TokenState(
                verb, cursor, page, gen, issued, prefix, set_spec, from_, until, last_key, snap
            )
        except (ValueError, TypeError, IndexError):
            return None

    def _state(self, token: str, verb: str) -> _TokenState:
        state = self._decode_token(token)
        if state is None or state.verb != verb:
            raise _OAIError(
                "badResumptionToken", "The value of the resumptionToken argument is invalid."
            )
        if state.generation != self._generation:
            raise _OAIError("badResumptionToken", "The resumptionToken has expired.")
        if self.token_ttl is not None and self._now().timestamp() - state.issued > self.token_ttl:
            raise _OAIError("badResumptionToken", "The resumptionToken has expired.")
        return state

    def _now(self) -> datetime:
        return _utc(self.clock())

    # -- request handling --------------------------------------------------------------

    def _serve(self, handler: _Handler, method: str, path: str, query: str) -> None:
        params = parse_qs(query, keep_blank_values=True)
        verb_values = params.get("verb") or [None]
        verb = verb_values[0]
        token = (params.get("resumptionToken") or [None])[0]
        page: int | None = None
        if verb in _LIST_VERBS:
            if token is None:
                page = 1
            else:
                state = self._decode_token(token)
                page = state.page if state is not None else None
        with self._lock:
            self._count += 1
            self._in_flight += 1
            self.max_concurrency = max(self.max_concurrency, self._in_flight)
            log = RequestLog(
                number=self._count,
                method=method,
                path=path,
                verb=verb,
                params=params,
                headers=dict(handler.headers.items()),
                started=time.monotonic(),
                started_wall=datetime.now(UTC),
                page=page,
            )
            self._log.append(log)
        try:
            if self.latency > 0:
                self._stopping.wait(self.latency)
            if time.monotonic() < self._down_until:
                log.fault, log.status = "down", 0
                _abort(handler)
                return
            info = RequestInfo(
                log.number, method, verb, {k: v[0] for k, v in params.items()}, token, page
            )
            fault = self.faults.take(info)
            log.fault = fault.kind if fault else None
            if fault is not None and fault.kind == "down":
                self._down_until = time.monotonic() + float(fault.params.get("seconds", 1.0))
                log.status = 0
                _abort(handler)
                return
            if fault is not None and fault.kind == "delay":
                self._stopping.wait(float(fault.params.get("seconds", 5.0)))
            reply = self._reply(params, fault)
            self._send(handler, reply, fault, log)
        finally:
            with self._lock:
                self._in_flight -= 1
                log.finished = time.monotonic()
                log.finished_wall = datetime.now(UTC)

    def _reply(self, params: dict[str, list[str]], fault: Fault | None) -> _Reply:
        kind = fault.kind if fault else None
        fp = fault.params if fault else {}
        if kind == "status":
            status = int(fp.get("status", 503))
            headers = fp.get("headers")
            if headers is None:
                headers = {"Retry-After": "1"} if status in (429, 503) else {}
            body = fp.get("body", f"{status} Service unavailable, try again later.\n")
            return _Reply(status, body, "text/plain; charset=utf-8", dict(headers))
        if kind == "html":
            body = fp.get(
                "body",
                "<!DOCTYPE html>\n<html><head><title>Error</title></head><body>"
                "<h1>Something went wrong</h1><p>The repository is under maintenance."
                "</p></body></html>\n",
            )
            return _Reply(int(fp.get("status", 200)), body, "text/html; charset=utf-8")
        if kind == "malformed" and "body" in fp:
            return _Reply(200, str(fp["body"]))
        verb = params.get("verb", [None])[0]
        attrs: dict[str, str] = {}
        status = 200
        try:
            if kind == "oai_error":
                status = int(fp.get("status", 422))
                raise _OAIError(
                    str(fp.get("code", "badArgument")), str(fp.get("message", "Injected error."))
                )
            verb, args = self._arguments(params)
            attrs = {"verb": verb, **args}
            if kind == "bad_token":
                raise _OAIError("badResumptionToken", "The resumptionToken is invalid or expired.")
            inner = getattr(self, f"_verb_{verb}")(args, kind)
        except _OAIError as error:
            if error.code in ("badVerb", "badArgument"):
                attrs = {}
            inner = f'<error code="{error.code}">{escape(error.message)}</error>'
        body = self._envelope(inner, attrs)
        if kind == "illegal_chars":
            body = _inject(body, str(fp.get("chars", "\x01\x0b\x1f")))
        elif kind == "xxe":
            target = fp.get("url") or "file://" + str(fp.get("path", "/etc/passwd"))
            body = _inject(body, "&xxe;", f'<!DOCTYPE OAI-PMH [<!ENTITY xxe SYSTEM "{target}">]>')
        elif kind == "billion_laughs":
            levels, width = int(fp.get("levels", 10)), int(fp.get("width", 10))
            entities = ['<!ENTITY lol0 "lol">']
            for i in range(1, levels):
                entities.append(f'<!ENTITY lol{i} "{f"&lol{i - 1};" * width}">')
            doctype = f"<!DOCTYPE OAI-PMH [{''.join(entities)}]>"
            body = _inject(body, f"&lol{levels - 1};", doctype)
        elif kind == "malformed":
            body = body.replace("</responseDate>", "</responseDate><unclosed attr=bare>", 1)
        return _Reply(status, body)

    def _arguments(self, params: dict[str, list[str]]) -> tuple[str, dict[str, str]]:
        verbs = params.get("verb")
        if not verbs or len(verbs) > 1 or verbs[0] not in _ARGUMENTS:
            shown = verbs[0] if verbs else ""
            raise _OAIError(
                "badVerb", f"Illegal OAI verb: {shown!r}." if shown else "Missing verb."
            )
        verb = verbs[0]
        required, optional = _ARGUMENTS[verb]
        args: dict[str, str] = {}
        for name, values in params.items():
            if name == "verb":
                continue
            if name not in required and name not in optional:
                raise _OAIError("badArgument", f"Illegal argument for {verb}: {name}.")
            if len(values) > 1:
                raise _OAIError("badArgument", f"Repeated argument: {name}.")
            args[name] = values[0]
        if "resumptionToken" in args:
            if len(args) > 1:
                raise _OAIError("badArgument", "resumptionToken is an exclusive argument.")
        else:
            missing = sorted(required - args.keys())
            if missing:
                raise _OAIError("badArgument", f"Missing argument: {', '.join(missing)}.")
        return verb, args

    def _envelope(self, inner: str, attrs: dict[str, str]) -> str:
        request_attrs = "".join(f" {k}={quoteattr(v)}" for k, v in attrs.items())
        return (
            f'{XML_DECL}<OAI-PMH xmlns="{OAI_NS}" xmlns:xsi="{XSI_NS}" '
            f'xsi:schemaLocation="{OAI_NS} http://www.openarchives.org/OAI/2.0/OAI-PMH.xsd">'
            f"<responseDate>{_seconds(self._now())}</responseDate>"
            f"<request{request_attrs}>{escape(self.base_url)}</request>{inner}</OAI-PMH>\n"
        )

    # -- verbs -------------------------------------------------------------------------

    def _verb_Identify(self, args: dict[str, str], kind: str | None) -> str:  # noqa: N802
        ds = self.dataset
        host = ds.repository_identifier
        compression = "<compression>gzip</compression>" if self.gzip else ""
        return (
            "<Identify>"
            f"<repositoryName>{escape(ds.repository_name)}</repositoryName>"
            f"<baseURL>{escape(self.base_url)}</baseURL>"
            "<protocolVersion>2.0</protocolVersion>"
            f"<adminEmail>{escape(ds.admin_email)}</adminEmail>"
            f"<earliestDatestamp>{ds.format_datestamp(ds.earliest_datestamp)}</earliestDatestamp>"
            f"<deletedRecord>{ds.deleted_record}</deletedRecord>"
            f"<granularity>{ds.granularity}</granularity>"
            f"{compression}"
            "<description><oai-identifier "
            'xmlns="http://www.openarchives.org/OAI/2.0/oai-identifier" '
            'xsi:schemaLocation="http://www.openarchives.org/OAI/2.0/oai-identifier '
            'http://www.openarchives.org/OAI/2.0/oai-identifier.xsd">'
            f"<scheme>oai</scheme><repositoryIdentifier>{escape(host)}</repositoryIdentifier>"
            f"<delimiter>:</delimiter><sampleIdentifier>oai:{escape(host)}:1</sampleIdentifier>"
            "</oai-identifier></description>"
            "</Identify>"
        )

    def _verb_ListMetadataFormats(self, args: dict[str, str], kind: str | None) -> str:  # noqa: N802
        ds = self.dataset
        formats = ds.formats
        if "identifier" in args:
            record = ds.get(args["identifier"])
            if record is None:
                raise _OAIError("idDoesNotExist", f"No item {args['identifier']!r}.")
            formats = [f for f in formats if ds.disseminates(record, f[0])]
            if not formats:
                raise _OAIError("noMetadataFormats", "The item has no metadata formats.")
        items = "".join(
            f"<metadataFormat><metadataPrefix>{escape(p)}</metadataPrefix>"
            f"<schema>{escape(s)}</schema><metadataNamespace>{escape(n)}</metadataNamespace>"
            "</metadataFormat>"
            for p, s, n in formats
        )
        return f"<ListMetadataFormats>{items}</ListMetadataFormats>"

    def _verb_ListSets(self, args: dict[str, str], kind: str | None) -> str:  # noqa: N802
        sets = list(self.dataset.sets.items())
        token = args.get("resumptionToken")
        cursor, page = 0, 1
        if token is not None:
            state = self._state(token, "ListSets")
            cursor, page = state.cursor, state.page
        if not sets:
            raise _OAIError("noSetHierarchy", "This repository does not support sets.")
        chunk = [] if kind == "empty_page" else sets[cursor : cursor + self.page_size]
        items = "".join(
            f"<set><setSpec>{escape(spec)}</setSpec><setName>{escape(name)}</setName></set>"
            for spec, name in chunk
        )
        here = _TokenState("ListSets", cursor, page, self._generation, self._now().timestamp())
        nxt = replace(here, cursor=cursor + len(chunk), page=page + 1)
        more = cursor + len(chunk) < len(sets)
        element = self._token_element(kind, token, more, nxt, here, len(sets), cursor)
        return f"<ListSets>{items}{element}</ListSets>"

    def _verb_ListIdentifiers(self, args: dict[str, str], kind: str | None) -> str:  # noqa: N802
        return self._list(args, kind, "ListIdentifiers")

    def _verb_ListRecords(self, args: dict[str, str], kind: str | None) -> str:  # noqa: N802
        return self._list(args, kind, "ListRecords")

    def _verb_GetRecord(self, args: dict[str, str], kind: str | None) -> str:  # noqa: N802
        ds = self.dataset
        prefix = args["metadataPrefix"]
        record = ds.get(args["identifier"])
        if record is None:
            raise _OAIError("idDoesNotExist", f"No item {args['identifier']!r}.")
        if not ds.disseminates(record, prefix):
            raise _OAIError("cannotDisseminateFormat", f"Item not available as {prefix!r}.")
        return f"<GetRecord>{self._record(record, prefix)}</GetRecord>"

    # -- list machinery ----------------------------------------------------------------

    def _range(
        self, from_: str | None, until: str | None
    ) -> tuple[date | datetime | None, date | datetime | None]:
        parsed: list[tuple[date | datetime, bool] | None] = []
        for name, value in (("from", from_), ("until", until)):
            if value is None:
                parsed.append(None)
                continue
            try:
                if _DAY_RE.fullmatch(value):
                    parsed.append((datetime.strptime(value, "%Y-%m-%d").date(), True))
                elif _SECONDS_RE.fullmatch(value):
                    if self.dataset.granularity == DAY:
                        raise _OAIError(
                            "badArgument",
                            f"{name}={value!r} is finer than the repository granularity {DAY}.",
                        )
                    stamp = datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
                    parsed.append((stamp, False))
                else:
                    raise ValueError(value)
            except ValueError:
                raise _OAIError("badArgument", f"Illegal {name} date: {value!r}.") from None
        low, high = parsed
        if low and high:
            if low[1] != high[1]:
                raise _OAIError("badArgument", "from and until have different granularities.")
            if low[0] > high[0]:
                raise _OAIError("badArgument", "from is later than until.")
        return (low[0] if low else None), (high[0] if high else None)

    def _list(self, args: dict[str, str], kind: str | None, verb: str) -> str:
        ds = self.dataset
        token = args.get("resumptionToken")
        if token is not None:
            state = self._state(token, verb)
            prefix, set_spec, from_s, until_s = (
                state.prefix,
                state.set_spec,
                state.from_,
                state.until,
            )
            cursor, page, last, snapshot = state.cursor, state.page, state.last, state.snapshot
        else:
            prefix = args["metadataPrefix"]
            set_spec, from_s, until_s = args.get("set"), args.get("from"), args.get("until")
            cursor, page, last, snapshot = 0, 1, None, None
        low, high = self._range(from_s, until_s)
        if prefix not in ds.prefixes:
            raise _OAIError("cannotDisseminateFormat", f"Unsupported metadataPrefix {prefix!r}.")
        if set_spec is not None and not ds.sets:
            raise _OAIError("noSetHierarchy", "This repository does not support sets.")
        if snapshot is not None:
            if snapshot not in self._snapshots:
                raise _OAIError("badResumptionToken", "The resumptionToken has expired.")
            view = self._snapshots[snapshot]
        else:
            view = ds.select_view(prefix, low, high, set_spec)
            if self.snapshot_lists:
                snapshot = next(self._snapshot_ids)
                self._snapshots[snapshot] = view
        if not view and token is None:
            raise _OAIError("noRecordsMatch", "No records match the request.")
        if self.offset_tokens:
            start = cursor
        else:
            start = 0 if last is None else bisect.bisect_right(view, last, key=_record_key)
        chunk = () if kind == "empty_page" else view[start : start + self.page_size]
        more = kind == "empty_page" or start + len(chunk) < len(view)
        issued = self._now().timestamp()
        next_last = chunk[-1].key if chunk else last
        here = _TokenState(
            verb, cursor, page, self._generation, issued, prefix, set_spec, from_s, until_s, last,
            snapshot,
        )
        nxt = replace(here, cursor=cursor + len(chunk), page=page + 1, last=next_last)
        if verb == "ListRecords":
            items = "".join(self._record(r, prefix) for r in chunk)
        else:
            items = "".join(self._header(r) for r in chunk)
        element = self._token_element(kind, token, more, nxt, here, len(view), cursor)
        return f"<{verb}>{items}{element}</{verb}>"

    def _token_element(
        self,
        kind: str | None,
        token: str | None,
        more: bool,
        nxt: _TokenState,
        here: _TokenState,
        size: int,
        cursor: int,
    ) -> str:
        expiry = ""
        if self.token_ttl is not None:
            expires = datetime.fromtimestamp(nxt.issued + self.token_ttl, UTC)
            expiry = f' expirationDate="{_seconds(expires)}"'
        attrs = f'completeListSize="{size}" cursor="{cursor}"'
        if kind == "repeat_token":
            value = token if token is not None else self._encode_token(here)
            return f"<resumptionToken {attrs}{expiry}>{escape(value)}</resumptionToken>"
        if kind == "empty_page":
            value = self._encode_token(replace(here, page=here.page + 1))
            return f"<resumptionToken {attrs}{expiry}>{escape(value)}</resumptionToken>"
        if more:
            return f"<resumptionToken {attrs}{expiry}>{escape(self._encode_token(nxt))}</resumptionToken>"
        if token is not None or cursor > 0:
            return f"<resumptionToken {attrs}/>"
        return ""

    def _header(self, record: ServedRecord) -> str:
        status = ' status="deleted"' if record.deleted else ""
        specs = "".join(f"<setSpec>{escape(s)}</setSpec>" for s in record.sets)
        return (
            f"<header{status}><identifier>{escape(record.identifier)}</identifier>"
            f"<datestamp>{self.dataset.format_datestamp(record.datestamp)}</datestamp>"
            f"{specs}</header>"
        )

    def _record(self, record: ServedRecord, prefix: str) -> str:
        if record.deleted:
            return f"<record>{self._header(record)}</record>"
        return (
            f"<record>{self._header(record)}<metadata>{record.metadata[prefix]}</metadata></record>"
        )

    # -- sending -----------------------------------------------------------------------

    def _send(self, handler: _Handler, reply: _Reply, fault: Fault | None, log: RequestLog) -> None:
        kind = fault.kind if fault else None
        fp = fault.params if fault else {}
        body = reply.body.encode("utf-8")
        headers = {"Content-Type": reply.content_type, **reply.headers}
        if kind == "truncate":
            size = (
                int(fp["bytes"])
                if "bytes" in fp
                else int(len(body) * float(fp.get("fraction", 0.5)))
            )
            body = body[: max(0, min(size, len(body)))]
        padding = 0
        if kind == "huge":
            padding = max(0, int(fp.get("bytes", 20_000_000)) - len(body))
        accepts = "gzip" in handler.headers.get("Accept-Encoding", "").lower()
        if kind == "gzip_no_header":
            body = gzip_module.compress(body, compresslevel=5)
        elif self.gzip and accepts and kind != "huge":
            body = gzip_module.compress(body, compresslevel=5)
            headers["Content-Encoding"] = "gzip"
            headers["Vary"] = "Accept-Encoding"
        total = len(body) + padding
        headers["Content-Length"] = str(total)
        cut: int | None = None
        if kind == "reset":
            cut = (
                int(fp["bytes"])
                if "bytes" in fp
                else int(len(body) * float(fp.get("fraction", 0.5)))
            )
            cut = max(0, min(cut, len(body) - 1))
        try:
            handler.send_response(reply.status)
            for name, value in headers.items():
                handler.send_header(name, value)
            handler.end_headers()
            log.status = reply.status
            if cut is not None:
                handler.wfile.write(body[:cut])
                log.bytes_sent = cut
                time.sleep(0.05)
                _abort(handler)
                return
            if kind == "trickle":
                self._trickle(handler, body, fp, log)
            elif padding:
                self._write_padded(handler, body, padding, str(fp.get("style", "comment")), log)
            else:
                handler.wfile.write(body)
                log.bytes_sent = len(body)
        except OSError:
            handler.close_connection = True

    def _trickle(
        self, handler: _Handler, body: bytes, fp: dict[str, Any], log: RequestLog
    ) -> None:
        """Write ``body`` ``bytes`` bytes (default 1) at a time, one write every
        ``interval`` seconds (default 1.0): no read waits long, yet a page of some
        kilobytes takes hours."""
        step = max(1, int(fp.get("bytes", 1)))
        interval = float(fp.get("interval", 1.0))
        for start in range(0, len(body), step):
            if self._stopping.wait(interval):
                return
            handler.wfile.write(body[start : start + step])
            handler.wfile.flush()
            log.bytes_sent += min(step, len(body) - start)

    def _write_padded(
        self, handler: _Handler, body: bytes, padding: int, style: str, log: RequestLog
    ) -> None:
        """Write ``body`` with ``padding`` filler bytes before the closing root tag."""
        end = body.rfind(b"</OAI-PMH>")
        head, tail = (body, b"") if end < 0 else (body[:end], body[end:])
        handler.wfile.write(head)
        log.bytes_sent = len(head)
        chunk = 1 << 16
        if style == "comment" and padding >= 7:
            inner = padding - 7
            handler.wfile.write(b"<!--")
            log.bytes_sent += 4
            while inner > 0 and not self._stopping.is_set():
                n = min(chunk, inner)
                handler.wfile.write(b"x" * n)
                log.bytes_sent += n
                inner -= n
            handler.wfile.write(b"-->")
            log.bytes_sent += 3
        else:
            left = padding
            while left > 0 and not self._stopping.is_set():
                n = min(chunk, left)
                handler.wfile.write(b" " * n)
                log.bytes_sent += n
                left -= n
        handler.wfile.write(tail)
        log.bytes_sent += len(tail)


# -- command line ------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Serve a sample data set in the foreground until Ctrl-C."""
    parser = argparse.ArgumentParser(description="Serve a sample OAI-PMH repository on loopback.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--path", default="/oai")
    parser.add_argument("--records", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sets", type=int, default=4)
    parser.add_argument("--page-size", type=int, default=100)
    parser.add_argument("--deleted-ratio", type=float, default=0.05)
    parser.add_argument(
        "--granularity", choices=[DAY, "YYYY-MM-DDThh:mm:ssZ"], default="YYYY-MM-DDThh:mm:ssZ"
    )
    parser.add_argument("--latency", type=float, default=0.0)
    parser.add_argument("--token-ttl", type=float, default=None)
    args = parser.parse_args(argv)
    dataset = make_dataset(
        args.records,
        seed=args.seed,
        sets=args.sets,
        deleted_ratio=args.deleted_ratio,
        granularity=args.granularity,
    )
    server = OAIServer(
        dataset,
        page_size=args.page_size,
        host=args.host,
        port=args.port,
        latency=args.latency,
        token_ttl=args.token_ttl,
        path=args.path,
    )

    def _terminate(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started in background
    try:
        server.start()
    except OSError as error:
        print(f"cannot listen on {args.host}:{args.port}: {error}", file=sys.stderr)
        return 1
    print(f"OAI-PMH endpoint with {len(dataset)} records at {server.base_url}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    print("stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
