"""Builders of OAI-PMH responses and fake transports for the protocol tests."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from urllib.parse import parse_qsl
from xml.sax.saxutils import escape

import httpx

OAI_HEAD = (
    '<?xml version="1.0" encoding="UTF-8"?>\n'
    '<OAI-PMH xmlns="http://www.openarchives.org/OAI/2.0/" '
    'xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">'
    "<responseDate>{date}</responseDate><request>http://oai.test/oai</request>"
)
RESPONSE_DATE = "2024-05-01T12:00:00Z"


def envelope(inner: str, date: str = RESPONSE_DATE) -> bytes:
    return (OAI_HEAD.format(date=date) + inner + "</OAI-PMH>").encode()


def error_xml(code: str, message: str = "") -> bytes:
    return envelope(f'<error code="{code}">{escape(message)}</error>')


def record_xml(
    identifier: str, *, deleted: bool = False, sets: Sequence[str] = (), title: str = "t"
) -> str:
    status = ' status="deleted"' if deleted else ""
    specs = "".join(f"<setSpec>{escape(s)}</setSpec>" for s in sets)
    header = (
        f"<header{status}><identifier>{escape(identifier)}</identifier>"
        f"<datestamp>2024-01-02T03:04:05Z</datestamp>{specs}</header>"
    )
    if deleted:
        return f"<record>{header}</record>"
    metadata = (
        '<metadata><oai_dc:dc xmlns:oai_dc="http://www.openarchives.org/OAI/2.0/oai_dc/" '
        'xmlns:dc="http://purl.org/dc/elements/1.1/">'
        f"<dc:title>{escape(title)}</dc:title><dc:identifier>{escape(identifier)}</dc:identifier>"
        "</oai_dc:dc></metadata>"
    )
    return f"<record>{header}{metadata}</record>"


def token_xml(token: str | None, **attrs: object) -> str:
    if token is None:
        return ""
    attr = "".join(f' {k}="{v}"' for k, v in attrs.items())
    return f"<resumptionToken{attr}>{escape(token)}</resumptionToken>"


def list_records_xml(
    identifiers: Iterable[str],
    token: str | None = None,
    *,
    verb: str = "ListRecords",
    sets: Sequence[str] = (),
    **token_attrs: object,
) -> bytes:
    if verb == "ListIdentifiers":
        items = "".join(
            f"<header><identifier>{escape(i)}</identifier><datestamp>2024-01-02</datestamp></header>"
            for i in identifiers
        )
    else:
        items = "".join(record_xml(i, sets=sets) for i in identifiers)
    return envelope(f"<{verb}>{items}{token_xml(token, **token_attrs)}</{verb}>")


def identify_xml(
    granularity: str = "YYYY-MM-DDThh:mm:ssZ", earliest: str = "2000-01-01T00:00:00Z"
) -> bytes:
    return envelope(
        "<Identify><repositoryName>Test</repositoryName><baseURL>http://oai.test/oai</baseURL>"
        "<protocolVersion>2.0</protocolVersion><adminEmail>a@oai.test</adminEmail>"
        f"<earliestDatestamp>{earliest}</earliestDatestamp><deletedRecord>persistent</deletedRecord>"
        f"<granularity>{granularity}</granularity></Identify>"
    )


def formats_xml(*prefixes: str) -> bytes:
    items = "".join(
        f"<metadataFormat><metadataPrefix>{p}</metadataPrefix><schema>http://s/{p}.xsd</schema>"
        f"<metadataNamespace>http://ns/{p}</metadataNamespace></metadataFormat>"
        for p in prefixes
    )
    return envelope(f"<ListMetadataFormats>{items}</ListMetadataFormats>")


Reply = httpx.Response | bytes | Callable[[httpx.Request], httpx.Response | bytes]


@dataclass
class FakeServer:
    """A MockTransport handler: ``route(params) -> reply``; records every request."""

    route: Callable[[dict[str, str]], httpx.Response | bytes]
    requests: list[httpx.Request] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        with self.lock:
            self.requests.append(request)
        params = dict(parse_qsl(request.url.query.decode()))
        reply = self.route(params)
        if isinstance(reply, bytes):
            return httpx.Response(200, content=reply, headers={"Content-Type": "text/xml"})
        return reply

    @property
    def params(self) -> list[dict[str, str]]:
        return [dict(parse_qsl(r.url.query.decode())) for r in self.requests]

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self)


class SleepRecorder:
    """A fake ``sleep`` that records the waits (and advances a fake clock)."""

    def __init__(self) -> None:
        self.waits: list[float] = []
        self.now = 1000.0

    def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds

    def clock(self) -> float:
        return self.now
