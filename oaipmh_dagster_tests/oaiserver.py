"""The loopback OAI-PMH server with fault injection, for tests.

:class:`FaultyOAIServer` is the shipped :class:`~oaipmh_dagster.demo.server.OAIServer`
whose :meth:`~oaipmh_dagster.demo.server.OAIServer.handle` consults a
:class:`FaultPlan` and misbehaves on demand::

    with FaultyOAIServer(make_dataset(500), page_size=50) as server:
        server.faults.add("truncate", verb="ListRecords", page=3)
        httpx.get(server.base_url, params={"verb": "ListRecords", "metadataPrefix": "oai_dc"})

Test modules whose servers may need faults import it as ``OAIServer``.
"""

from __future__ import annotations

import gzip
import re
import threading
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from oaipmh_dagster.demo.protocol import (
    XML_DECL,
    OAIError,
    error_element,
    parse_arguments,
    request_attrs,
)
from oaipmh_dagster.demo.server import OAIServer, Reply, RequestInfo, RequestLog, Wire

__all__ = [
    "FAULT_KINDS",
    "Fault",
    "FaultPlan",
    "FaultyOAIServer",
    "ManualClock",
    "RequestInfo",
    "RequestLog",
]

_TEXT_NODE_RE = re.compile(r">([^<>\s])")


# -- the plan -------------------------------------------------------------------------


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


# -- the server -----------------------------------------------------------------------


class ManualClock:
    """A clock that moves only when told: ``server.outage_clock = ManualClock()`` makes an outage
    (``down``) last until the test advances the clock past it, whatever the machine's speed."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FaultyOAIServer(OAIServer):
    """The loopback server, misbehaving as :attr:`faults` plans. :attr:`outage_clock` (default
    :func:`time.monotonic`) times the outages of ``down``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.faults = FaultPlan()
        self.outage_clock: Callable[[], float] = time.monotonic
        self._down_until = 0.0

    def handle(self, request: RequestInfo) -> Reply:
        """The reply, altered by the first planned fault matching ``request``."""
        assert request.log is not None
        if self.outage_clock() < self._down_until:
            request.log.fault = "down"
            return Reply(abort=True)
        fault = self.faults.take(request)
        if fault is None:
            return self.respond(request)
        request.log.fault = fault.kind
        return _FAULTS[fault.kind](self, request, fault.params)

    def go_down(self, seconds: float) -> None:
        """Drop every connection for ``seconds`` from now."""
        self._down_until = self.outage_clock() + seconds


Action = Callable[[FaultyOAIServer, RequestInfo, dict[str, Any]], Reply]


def _cut(size: int, fp: dict[str, Any]) -> int:
    """``bytes`` bytes, else ``fraction`` (default half) of ``size``."""
    return int(fp["bytes"]) if "bytes" in fp else int(size * float(fp.get("fraction", 0.5)))


# -- faults that replace the reply ----------------------------------------------------


def _status(server: FaultyOAIServer, request: RequestInfo, fp: dict[str, Any]) -> Reply:
    status = int(fp.get("status", 503))
    headers = fp.get("headers")
    if headers is None:
        headers = {"Retry-After": "1"} if status in (429, 503) else {}
    body = fp.get("body", f"{status} Service unavailable, try again later.\n")
    return Reply(status, body, "text/plain; charset=utf-8", dict(headers))


def _html(server: FaultyOAIServer, request: RequestInfo, fp: dict[str, Any]) -> Reply:
    body = fp.get(
        "body",
        "<!DOCTYPE html>\n<html><head><title>Error</title></head><body>"
        "<h1>Something went wrong</h1><p>The repository is under maintenance."
        "</p></body></html>\n",
    )
    return Reply(int(fp.get("status", 200)), body, "text/html; charset=utf-8")


def _oai_error(server: FaultyOAIServer, request: RequestInfo, fp: dict[str, Any]) -> Reply:
    error = OAIError(str(fp.get("code", "badArgument")), str(fp.get("message", "Injected error.")))
    return Reply(int(fp.get("status", 422)), server.envelope(error_element(error), {}))


def _bad_token(server: FaultyOAIServer, request: RequestInfo, fp: dict[str, Any]) -> Reply:
    try:
        verb, args = parse_arguments(request.query)
    except OAIError:
        return server.respond(request)
    error = OAIError("badResumptionToken", "The resumptionToken is invalid or expired.")
    return Reply(body=server.envelope(error_element(error), request_attrs(error, verb, args)))


def _down(server: FaultyOAIServer, request: RequestInfo, fp: dict[str, Any]) -> Reply:
    server.go_down(float(fp.get("seconds", 1.0)))
    return Reply(abort=True)


def _delay(server: FaultyOAIServer, request: RequestInfo, fp: dict[str, Any]) -> Reply:
    server.wait(float(fp.get("seconds", 5.0)))
    return server.respond(request)


def _repeat_token(server: FaultyOAIServer, request: RequestInfo, fp: dict[str, Any]) -> Reply:
    return server.respond(request, paging="repeat")


def _empty_page(server: FaultyOAIServer, request: RequestInfo, fp: dict[str, Any]) -> Reply:
    return server.respond(request, paging="stall")


# -- faults that spoil the XML --------------------------------------------------------


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


def _spoiled(edit: Callable[[str, dict[str, Any]], str]) -> Action:
    """A fault that edits the text of the normal reply."""

    def action(server: FaultyOAIServer, request: RequestInfo, fp: dict[str, Any]) -> Reply:
        reply = server.respond(request)
        return replace(reply, body=edit(reply.text, fp))

    return action


def _illegal_chars(body: str, fp: dict[str, Any]) -> str:
    return _inject(body, str(fp.get("chars", "\x01\x0b\x1f")))


def _xxe(body: str, fp: dict[str, Any]) -> str:
    target = fp.get("url") or "file://" + str(fp.get("path", "/etc/passwd"))
    return _inject(body, "&xxe;", f'<!DOCTYPE OAI-PMH [<!ENTITY xxe SYSTEM "{target}">]>')


def _billion_laughs(body: str, fp: dict[str, Any]) -> str:
    levels, width = int(fp.get("levels", 10)), int(fp.get("width", 10))
    entities = ['<!ENTITY lol0 "lol">']
    for i in range(1, levels):
        entities.append(f'<!ENTITY lol{i} "{f"&lol{i - 1};" * width}">')
    return _inject(body, f"&lol{levels - 1};", f"<!DOCTYPE OAI-PMH [{''.join(entities)}]>")


def _malformed(server: FaultyOAIServer, request: RequestInfo, fp: dict[str, Any]) -> Reply:
    if "body" in fp:
        return Reply(body=str(fp["body"]))
    reply = server.respond(request)
    tag = "</responseDate><unclosed attr=bare>"
    return replace(reply, body=reply.text.replace("</responseDate>", tag, 1))


# -- faults on the wire ---------------------------------------------------------------


def _truncate(server: FaultyOAIServer, request: RequestInfo, fp: dict[str, Any]) -> Reply:
    reply = server.respond(request)
    body = reply.data
    return replace(reply, body=body[: max(0, min(_cut(len(body), fp), len(body)))])


def _gzip_no_header(server: FaultyOAIServer, request: RequestInfo, fp: dict[str, Any]) -> Reply:
    reply = server.respond(request)
    return replace(reply, body=gzip.compress(reply.data, compresslevel=5), compress=False)


def _reset(server: FaultyOAIServer, request: RequestInfo, fp: dict[str, Any]) -> Reply:
    def writer(wire: Wire, body: bytes) -> None:
        wire.write(body[: max(0, min(_cut(len(body), fp), len(body) - 1))])
        time.sleep(0.05)
        wire.abort()

    return replace(server.respond(request), writer=writer)


def _trickle(server: FaultyOAIServer, request: RequestInfo, fp: dict[str, Any]) -> Reply:
    """Write the body ``bytes`` bytes (default 1) at a time, one write every ``interval``
    seconds (default 1.0): no read waits long, yet a page of some kilobytes takes hours."""
    step = max(1, int(fp.get("bytes", 1)))
    interval = float(fp.get("interval", 1.0))

    def writer(wire: Wire, body: bytes) -> None:
        for start in range(0, len(body), step):
            if wire.wait(interval):
                return
            wire.write(body[start : start + step])

    return replace(server.respond(request), writer=writer)


def _huge(server: FaultyOAIServer, request: RequestInfo, fp: dict[str, Any]) -> Reply:
    """The reply padded to ``bytes`` (default 20 MB) with a comment (``style``) or blanks."""
    reply = server.respond(request)
    padding = max(0, int(fp.get("bytes", 20_000_000)) - len(reply.data))
    style = str(fp.get("style", "comment"))

    def writer(wire: Wire, body: bytes) -> None:
        end = body.rfind(b"</OAI-PMH>")
        head, tail = (body, b"") if end < 0 else (body[:end], body[end:])
        wire.write(head)
        if style == "comment" and padding >= 7:
            wire.write(b"<!--")
            _fill(wire, b"x", padding - 7)
            wire.write(b"-->")
        else:
            _fill(wire, b" ", padding)
        wire.write(tail)

    headers = {**reply.headers, "Content-Length": str(len(reply.data) + padding)}
    return replace(reply, headers=headers, compress=False, writer=writer)


def _fill(wire: Wire, byte: bytes, count: int) -> None:
    """Write ``count`` copies of ``byte`` in 64 KiB chunks until the server stops."""
    chunk = 1 << 16
    while count > 0 and not wire.stopping:
        n = min(chunk, count)
        wire.write(byte * n)
        count -= n


_FAULTS: dict[str, Action] = {
    "status": _status,
    "reset": _reset,
    "delay": _delay,
    "truncate": _truncate,
    "illegal_chars": _spoiled(_illegal_chars),
    "repeat_token": _repeat_token,
    "bad_token": _bad_token,
    "html": _html,
    "oai_error": _oai_error,
    "gzip_no_header": _gzip_no_header,
    "huge": _huge,
    "down": _down,
    "xxe": _spoiled(_xxe),
    "billion_laughs": _spoiled(_billion_laughs),
    "empty_page": _empty_page,
    "malformed": _malformed,
    "trickle": _trickle,
}
FAULT_KINDS = frozenset(_FAULTS)
