"""A loopback OAI-PMH 2.0 server over a :class:`Dataset`.

The server runs a :class:`~http.server.ThreadingHTTPServer` in a daemon thread,
answers the six verbs over GET and POST, pages lists with stateless resumption
tokens and logs every request::

    with OAIServer(make_dataset(500), page_size=50) as server:
        httpx.get(server.base_url, params={"verb": "ListRecords", "metadataPrefix": "oai_dc"})

Every request goes through :meth:`OAIServer.handle`, the one point a subclass
overrides to alter or replace a reply (a :class:`Reply` may also drop the
connection or write its body its own way through a :class:`Wire`).

Run ``python -m oaipmh_dagster.demo.server --port 8765`` to serve a sample data set
in the foreground.
"""

from __future__ import annotations

import argparse
import bisect
import gzip as gzip_module
import itertools
import signal
import socket
import socketserver
import struct
import sys
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit
from xml.sax.saxutils import escape

from oaipmh_dagster.demo.dataset import DAY, Dataset, ServedRecord, make_dataset
from oaipmh_dagster.demo.protocol import (
    LIST_VERBS,
    ListState,
    OAIError,
    TokenCodec,
    envelope,
    error_element,
    header_xml,
    parse_arguments,
    parse_range,
    record_xml,
    request_attrs,
    token_element,
)

__all__ = [
    "OAIServer",
    "Paging",
    "Reply",
    "RequestInfo",
    "RequestLog",
    "Wire",
    "main",
]

Paging = Literal["next", "repeat", "stall"]
"""How a list page links on: to the next page, to itself again ("repeat"), or with
no records to a token one page further ("stall")."""


# -- requests and replies -------------------------------------------------------------


@dataclass
class RequestLog:
    """One request as the server saw it.

    ``started``/``finished`` are :func:`time.monotonic` values, the ``*_wall``
    twins are UTC datetimes; ``status`` is 0 when the connection was dropped
    without a status line; ``bytes_sent`` counts body bytes written; ``fault``
    names what a :meth:`OAIServer.handle` override did to the reply, if anything.
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
    """A request as :meth:`OAIServer.handle` sees it.

    ``params`` holds the first value of each argument, ``query`` all of them; ``page``
    is the 1-based page of a list request (1 without a resumption token, None when
    the token is garbage or the verb is not a list); ``log`` is its log entry.
    """

    number: int
    method: str
    verb: str | None
    params: dict[str, str]
    token: str | None
    page: int | None
    query: dict[str, list[str]] = field(default_factory=dict, repr=False)
    log: RequestLog | None = field(default=None, repr=False, compare=False)


class Wire:
    """The client connection a :class:`Reply` writer writes its body to."""

    def __init__(
        self, handler: BaseHTTPRequestHandler, log: RequestLog, stopping: threading.Event
    ) -> None:
        self._handler = handler
        self._log = log
        self._stopping = stopping

    @property
    def stopping(self) -> bool:
        """True once the server is stopping."""
        return self._stopping.is_set()

    def wait(self, seconds: float) -> bool:
        """Sleep ``seconds`` unless the server stops first; True when it stops."""
        return self._stopping.wait(seconds)

    def write(self, data: bytes) -> None:
        """Send ``data`` now, counted in the request's ``bytes_sent``."""
        self._handler.wfile.write(data)
        self._handler.wfile.flush()
        self._log.bytes_sent += len(data)

    def abort(self) -> None:
        """Close the connection with a TCP reset."""
        _abort(self._handler)


@dataclass
class Reply:
    """What the server sends back.

    The body is gzip-compressed when ``compress`` is on, the server's ``gzip`` is on
    and the client accepts it; a ``Content-Length`` in ``headers`` is kept as given.
    ``writer`` writes the (encoded) body its own way instead of at once; ``abort``
    drops the connection without a status line.
    """

    status: int = 200
    body: str | bytes = ""
    content_type: str = "text/xml; charset=utf-8"
    headers: dict[str, str] = field(default_factory=dict)
    compress: bool = True
    writer: Callable[[Wire, bytes], None] | None = None
    abort: bool = False

    @property
    def text(self) -> str:
        """The body as text."""
        return self.body if isinstance(self.body, str) else self.body.decode("utf-8")

    @property
    def data(self) -> bytes:
        """The body as bytes."""
        return self.body.encode("utf-8") if isinstance(self.body, str) else self.body


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


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
    :meth:`expire_tokens`. ``snapshot_lists`` and ``offset_tokens`` page lists the
    way some real servers do (see :meth:`__init__`).
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
        self.max_concurrency = 0
        self._lock = threading.Lock()
        self._log: list[RequestLog] = []
        self._count = 0
        self._in_flight = 0
        self._generation = 0
        self._tokens = TokenCodec()
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

    def settled(self, timeout: float = 5.0) -> list[RequestLog]:
        """The request log once no request is in flight (a client can read a whole
        reply before its handler has counted the last write); raises TimeoutError
        after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if self._in_flight == 0:
                    return list(self._log)
            if time.monotonic() >= deadline:
                raise TimeoutError(f"requests still in flight after {timeout} s")
            time.sleep(0.005)

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

    def wait(self, seconds: float) -> bool:
        """Sleep ``seconds`` unless the server stops first; True when it stops."""
        return self._stopping.wait(seconds)

    def _track(self, conn: socket.socket, *, add: bool) -> None:
        with self._lock:
            if add:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)

    def _encode_token(self, state: ListState) -> str:
        return self._tokens.encode(state)

    def _decode_token(self, token: str) -> ListState | None:
        """The state in ``token`` (ignoring expiry), or None when it is not ours."""
        return self._tokens.decode(token)

    def _state(self, token: str, verb: str) -> ListState:
        state = self._decode_token(token)
        if state is None or state.verb != verb:
            raise OAIError(
                "badResumptionToken", "The value of the resumptionToken argument is invalid."
            )
        if state.generation != self._generation:
            raise OAIError("badResumptionToken", "The resumptionToken has expired.")
        if self.token_ttl is not None and self._now().timestamp() - state.issued > self.token_ttl:
            raise OAIError("badResumptionToken", "The resumptionToken has expired.")
        return state

    def _now(self) -> datetime:
        return _utc(self.clock())

    # -- request handling --------------------------------------------------------------

    def _serve(self, handler: _Handler, method: str, path: str, query: str) -> None:
        params = parse_qs(query, keep_blank_values=True)
        verb = params["verb"][0] if params.get("verb") else None
        token = params["resumptionToken"][0] if params.get("resumptionToken") else None
        page: int | None = None
        if verb in LIST_VERBS:
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
            first = {k: v[0] for k, v in params.items()}
            info = RequestInfo(log.number, method, verb, first, token, page, params, log)
            self._send(handler, self.handle(info), log)
        finally:
            with self._lock:
                self._in_flight -= 1
                log.finished = time.monotonic()
                log.finished_wall = datetime.now(UTC)

    def handle(self, request: RequestInfo) -> Reply:
        """The reply to ``request``: override to alter or replace it."""
        return self.respond(request)

    def respond(self, request: RequestInfo, paging: Paging = "next") -> Reply:
        """The protocol's answer to ``request``, list pages linked as ``paging`` says."""
        verb, args = "", dict[str, str]()
        try:
            verb, args = parse_arguments(request.query)
            inner = getattr(self, f"_verb_{verb}")(args, paging)
            attrs = request_attrs(None, verb, args)
        except OAIError as error:
            inner, attrs = error_element(error), request_attrs(error, verb, args)
        return Reply(body=self.envelope(inner, attrs))

    def envelope(self, inner: str, attrs: dict[str, str]) -> str:
        """A whole response around ``inner``, dated by :attr:`clock`."""
        return envelope(inner, attrs, self.base_url, self._now())

    def _send(self, handler: _Handler, reply: Reply, log: RequestLog) -> None:
        if reply.abort:
            log.status = 0
            _abort(handler)
            return
        body = reply.data
        headers = {"Content-Type": reply.content_type, **reply.headers}
        accepts = "gzip" in handler.headers.get("Accept-Encoding", "").lower()
        if reply.compress and self.gzip and accepts:
            body = gzip_module.compress(body, compresslevel=5)
            headers["Content-Encoding"] = "gzip"
            headers["Vary"] = "Accept-Encoding"
        headers.setdefault("Content-Length", str(len(body)))
        try:
            handler.send_response(reply.status)
            for name, value in headers.items():
                handler.send_header(name, value)
            handler.end_headers()
            log.status = reply.status
            wire = Wire(handler, log, self._stopping)
            if reply.writer is not None:
                reply.writer(wire, body)
            else:
                wire.write(body)
        except OSError:
            handler.close_connection = True

    # -- verbs -------------------------------------------------------------------------

    def _verb_Identify(self, args: dict[str, str], paging: Paging) -> str:  # noqa: N802
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

    def _verb_ListMetadataFormats(self, args: dict[str, str], paging: Paging) -> str:  # noqa: N802
        ds = self.dataset
        formats = ds.formats
        if "identifier" in args:
            record = ds.get(args["identifier"])
            if record is None:
                raise OAIError("idDoesNotExist", f"No item {args['identifier']!r}.")
            formats = [f for f in formats if ds.disseminates(record, f[0])]
            if not formats:
                raise OAIError("noMetadataFormats", "The item has no metadata formats.")
        items = "".join(
            f"<metadataFormat><metadataPrefix>{escape(p)}</metadataPrefix>"
            f"<schema>{escape(s)}</schema><metadataNamespace>{escape(n)}</metadataNamespace>"
            "</metadataFormat>"
            for p, s, n in formats
        )
        return f"<ListMetadataFormats>{items}</ListMetadataFormats>"

    def _verb_ListSets(self, args: dict[str, str], paging: Paging) -> str:  # noqa: N802
        sets = list(self.dataset.sets.items())
        token = args.get("resumptionToken")
        cursor, page = 0, 1
        if token is not None:
            state = self._state(token, "ListSets")
            cursor, page = state.cursor, state.page
        if not sets:
            raise OAIError("noSetHierarchy", "This repository does not support sets.")
        chunk = [] if paging == "stall" else sets[cursor : cursor + self.page_size]
        items = "".join(
            f"<set><setSpec>{escape(spec)}</setSpec><setName>{escape(name)}</setName></set>"
            for spec, name in chunk
        )
        here = ListState("ListSets", cursor, page, self._generation, self._now().timestamp())
        nxt = replace(here, cursor=cursor + len(chunk), page=page + 1)
        more = cursor + len(chunk) < len(sets)
        element = self._link(paging, token, more, nxt, here, len(sets), cursor)
        return f"<ListSets>{items}{element}</ListSets>"

    def _verb_ListIdentifiers(self, args: dict[str, str], paging: Paging) -> str:  # noqa: N802
        return self._list(args, paging, "ListIdentifiers")

    def _verb_ListRecords(self, args: dict[str, str], paging: Paging) -> str:  # noqa: N802
        return self._list(args, paging, "ListRecords")

    def _verb_GetRecord(self, args: dict[str, str], paging: Paging) -> str:  # noqa: N802
        ds = self.dataset
        prefix = args["metadataPrefix"]
        record = ds.get(args["identifier"])
        if record is None:
            raise OAIError("idDoesNotExist", f"No item {args['identifier']!r}.")
        if not ds.disseminates(record, prefix):
            raise OAIError("cannotDisseminateFormat", f"Item not available as {prefix!r}.")
        return f"<GetRecord>{self._record(record, prefix)}</GetRecord>"

    # -- list machinery ----------------------------------------------------------------

    def _list(self, args: dict[str, str], paging: Paging, verb: str) -> str:
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
        low, high = parse_range(from_s, until_s, ds.granularity)
        if prefix not in ds.prefixes:
            raise OAIError("cannotDisseminateFormat", f"Unsupported metadataPrefix {prefix!r}.")
        if set_spec is not None and not ds.sets:
            raise OAIError("noSetHierarchy", "This repository does not support sets.")
        if snapshot is not None:
            if snapshot not in self._snapshots:
                raise OAIError("badResumptionToken", "The resumptionToken has expired.")
            view = self._snapshots[snapshot]
        else:
            view = ds.select_view(prefix, low, high, set_spec)
            if self.snapshot_lists:
                snapshot = next(self._snapshot_ids)
                self._snapshots[snapshot] = view
        if not view and token is None:
            raise OAIError("noRecordsMatch", "No records match the request.")
        if self.offset_tokens:
            start = cursor
        else:
            start = 0 if last is None else bisect.bisect_right(view, last, key=_record_key)
        chunk = () if paging == "stall" else view[start : start + self.page_size]
        more = paging == "stall" or start + len(chunk) < len(view)
        issued = self._now().timestamp()
        next_last = chunk[-1].key if chunk else last
        here = ListState(
            verb,
            cursor,
            page,
            self._generation,
            issued,
            prefix,
            set_spec,
            from_s,
            until_s,
            last,
            snapshot,
        )
        nxt = replace(here, cursor=cursor + len(chunk), page=page + 1, last=next_last)
        if verb == "ListRecords":
            items = "".join(self._record(r, str(prefix)) for r in chunk)
        else:
            items = "".join(header_xml(r, ds) for r in chunk)
        element = self._link(paging, token, more, nxt, here, len(view), cursor)
        return f"<{verb}>{items}{element}</{verb}>"

    def _link(
        self,
        paging: Paging,
        token: str | None,
        more: bool,
        nxt: ListState,
        here: ListState,
        size: int,
        cursor: int,
    ) -> str:
        """The page's resumptionToken element, linking on as ``paging`` says."""
        value: str | None = None
        if paging == "repeat":
            value = token if token is not None else self._encode_token(here)
        elif paging == "stall":
            value = self._encode_token(replace(here, page=here.page + 1))
        elif more:
            value = self._encode_token(nxt)
        expires = None
        if self.token_ttl is not None:
            expires = datetime.fromtimestamp(nxt.issued + self.token_ttl, UTC)
        return token_element(
            value, size=size, cursor=cursor, resumed=token is not None, expires=expires
        )

    def _record(self, record: ServedRecord, prefix: str) -> str:
        return record_xml(record, header_xml(record, self.dataset), record.metadata.get(prefix))


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
