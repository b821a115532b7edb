"""Parsing of OAI-PMH responses: one hardened lxml parse per page, then plain objects.

The parser never resolves entities, never loads a DTD, never touches the network
and keeps lxml's tree-size limits. A document that declares entities is refused
outright. Characters illegal in XML 1.0 are stripped (and counted) when a first
parse fails on them, so a clean page costs a single parse and no extra scan.
"""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from lxml import etree

from .datestamps import Granularity, parse_datestamp
from .errors import DataError, DatestampError, protocol_error
from .models import Header, Identify, MetadataFormat, OAISet, Record, ResumptionToken

__all__ = [
    "OAI_NS",
    "Envelope",
    "strip_illegal_chars",
    "parse_xml",
    "parse_xml_cleaning",
    "read_envelope",
    "parse_record_list",
    "parse_identify",
    "parse_metadata_formats",
    "parse_sets",
    "parse_get_record",
]

OAI_NS = "http://www.openarchives.org/OAI/2.0/"

_log = logging.getLogger("oaipmh_dagster.oai")

# Characters illegal in XML 1.0: raw control characters, the UTF-8 encodings of
# U+FFFE / U+FFFF, and character references to any of them. Each kind is looked
# for with a fast scan first; the substitution only runs when something is there.
_CONTROL = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f]")
_NONCHARS = re.compile(rb"\xef\xbf[\xbe\xbf]")
_CHAR_REFS = re.compile(
    rb"&#(?:[xX]0*(?:[0-8bBcCeEfF]|1[0-9a-fA-F]|[fF]{3}[eEfF])"
    rb"|0*(?:[0-8]|1[124-9]|2[0-9]|3[01]|6553[45]));"
)
_DOCTYPE = b"<!DOCTYPE"
_ENTITY = b"<!ENTITY"
_HTML_START = re.compile(
    rb"^\s*(?:<\?xml[^>]*>\s*)?(?:<!--.*?-->\s*)*<(?:!doctype\s+html|html)\b", re.I | re.S
)

_local = threading.local()


def _parser() -> etree.XMLParser:
    parser = getattr(_local, "parser", None)
    if parser is None:
        parser = etree.XMLParser(
            resolve_entities=False,
            no_network=True,
            load_dtd=False,
            dtd_validation=False,
            huge_tree=False,
            remove_comments=False,
        )
        _local.parser = parser
    return parser


def strip_illegal_chars(body: bytes) -> tuple[bytes, int]:
    """Remove characters illegal in XML 1.0; return the cleaned body and how many went."""
    total = 0
    if _CONTROL.search(body) is not None:
        body, n = _CONTROL.subn(b"", body)
        total += n
    if b"\xef\xbf" in body:
        body, n = _NONCHARS.subn(b"", body)
        total += n
    if b"&#" in body and _CHAR_REFS.search(body) is not None:
        body, n = _CHAR_REFS.subn(b"", body)
        total += n
    return body, total


def _looks_like_html(body: bytes) -> bool:
    return _HTML_START.match(body[:4096]) is not None


def _refuse_entities(body: bytes, url: str | None, token: str | None) -> None:
    doctype = body.find(_DOCTYPE, 0, 65536)
    if doctype >= 0 and body.find(_ENTITY, doctype) >= 0:
        raise DataError(
            "refused a response that declares XML entities (DOCTYPE with <!ENTITY>)",
            url=url,
            token=token,
        )


def _syntax_error(body: bytes, exc: Exception, url: str | None, token: str | None) -> DataError:
    if _looks_like_html(body):
        return DataError(
            "received an HTML page instead of OAI-PMH XML", url=url, token=token, retryable=True
        )
    if isinstance(exc, etree.XMLSyntaxError):
        return DataError(
            f"response is not well-formed XML: {exc}", url=url, token=token, retryable=True
        )
    return DataError(f"response cannot be parsed: {exc}", url=url, token=token)


def _checked(root: etree._Element, url: str | None, token: str | None) -> etree._Element:
    dtd = root.getroottree().docinfo.internalDTD
    if dtd is not None and any(True for _ in dtd.iterentities()):
        raise DataError("refused a response that declares XML entities", url=url, token=token)
    return root


def parse_xml(body: bytes, *, url: str | None = None, token: str | None = None) -> etree._Element:
    """Parse bytes with the hardened parser; DataError when unsafe or not well-formed."""
    _refuse_entities(body, url, token)
    try:
        root = etree.fromstring(body, _parser())
    except (etree.XMLSyntaxError, ValueError) as exc:
        raise _syntax_error(body, exc, url, token) from None
    return _checked(root, url, token)


def parse_xml_cleaning(
    body: bytes, *, url: str | None = None, token: str | None = None
) -> tuple[etree._Element, int]:
    """Like :func:`parse_xml`, but strips illegal characters when the first parse fails.

    Well-formed pages (nearly all) are parsed once with no extra scan; a page that
    fails is cleaned and parsed again only if something was stripped. Returns the
    root and the number of characters stripped.
    """
    _refuse_entities(body, url, token)
    try:
        return _checked(etree.fromstring(body, _parser()), url, token), 0
    except (etree.XMLSyntaxError, ValueError) as exc:
        cleaned, stripped = strip_illegal_chars(body)
        if not stripped:
            raise _syntax_error(body, exc, url, token) from None
    try:
        root = etree.fromstring(cleaned, _parser())
    except (etree.XMLSyntaxError, ValueError) as exc:
        raise _syntax_error(cleaned, exc, url, token) from None
    return _checked(root, url, token), stripped


@dataclass(slots=True)
class Envelope:
    """A parsed OAI-PMH response without errors; ``ns`` is ``{uri}`` (or "" if none)."""

    root: etree._Element
    ns: str
    response_date: datetime | None
    stripped_chars: int
    size: int

    def payload(self, verb: str, *, url: str | None = None, token: str | None = None) -> Any:
        """The element named after the verb; DataError when missing."""
        el = self.root.find(self.ns + verb)
        if el is None:
            raise DataError(f"OAI-PMH response has no <{verb}> element", url=url, token=token)
        return el


def read_envelope(
    body: bytes,
    *,
    url: str | None = None,
    token: str | None = None,
    logger: Any = None,
) -> Envelope:
    """Strip, parse and check one OAI-PMH response; raise the ProtocolError it carries."""
    size = len(body)
    root, stripped = parse_xml_cleaning(body, url=url, token=token)
    if stripped:
        (logger or _log).warning(
            f"stripped {stripped} characters illegal in XML 1.0 from the response of {url}"
        )
    tag = root.tag
    if not isinstance(tag, str):
        raise DataError("response has no root element", url=url, token=token, retryable=True)
    qname = etree.QName(tag)
    if qname.localname != "OAI-PMH":
        if qname.localname.lower() == "html":
            raise DataError(
                "received an HTML page instead of OAI-PMH XML", url=url, token=token, retryable=True
            )
        raise DataError(
            f"not an OAI-PMH response (root element <{qname.localname}>)",
            url=url,
            token=token,
            retryable=True,
        )
    ns = f"{{{qname.namespace}}}" if qname.namespace else ""
    response_date: datetime | None = None
    text = root.findtext(ns + "responseDate")
    if text:
        try:
            response_date = parse_datestamp(text)
        except DatestampError:
            (logger or _log).warning(f"unreadable responseDate {text.strip()!r} from {url}")
    error = root.find(ns + "error")
    if error is not None:
        exc = protocol_error(
            (error.get("code") or "").strip(), (error.text or "").strip(), url=url, token=token
        )
        exc.response_date = response_date
        raise exc
    return Envelope(root, ns, response_date, stripped, size)


def _text(el: etree._Element | None) -> str:
    if el is None or el.text is None:
        return ""
    return el.text.strip()


def _first_element(el: etree._Element) -> etree._Element | None:
    for child in el:
        if isinstance(child.tag, str):
            return child
    return None


def _serialize_child(el: etree._Element) -> bytes | None:
    child = _first_element(el)
    return None if child is None else etree.tostring(child, encoding="UTF-8", with_tail=False)


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value.strip())
    except ValueError:
        return None


def _token(el: etree._Element | None) -> ResumptionToken | None:
    if el is None:
        return None
    expiration = None
    if el.get("expirationDate"):
        try:
            expiration = parse_datestamp(el.get("expirationDate"))
        except DatestampError:
            expiration = None
    return ResumptionToken(
        token=_text(el),
        cursor=_int(el.get("cursor")),
        complete_list_size=_int(el.get("completeListSize")),
        expiration_date=expiration,
    )


def _header(el: etree._Element, ns: str) -> Header | None:
    identifier = datestamp = None
    specs: list[str] = []
    id_tag, ds_tag, set_tag = ns + "identifier", ns + "datestamp", ns + "setSpec"
    for child in el:
        tag = child.tag
        if tag == id_tag:
            identifier = (child.text or "").strip()
        elif tag == ds_tag:
            datestamp = (child.text or "").strip()
        elif tag == set_tag and child.text:
            specs.append(child.text.strip())
    if not identifier or not datestamp:
        return None
    return Header(identifier, datestamp, tuple(specs), el.get("status") == "deleted")


def _record(el: etree._Element, ns: str) -> Record | None:
    header: Header | None = None
    metadata: bytes | None = None
    element: etree._Element | None = None
    about: list[bytes] = []
    h_tag, m_tag, a_tag = ns + "header", ns + "metadata", ns + "about"
    for child in el:
        tag = child.tag
        if tag == h_tag:
            header = _header(child, ns)
            if header is None:
                return None
        elif tag == m_tag:
            element = _first_element(child)
            if element is not None:
                metadata = etree.tostring(element, encoding="UTF-8", with_tail=False)
        elif tag == a_tag:
            data = _serialize_child(child)
            if data is not None:
                about.append(data)
    if header is None:
        return None
    return Record(header, metadata, tuple(about), element)


def parse_record_list(
    env: Envelope, verb: str, *, url: str | None = None, token: str | None = None
) -> tuple[list[Record], ResumptionToken | None, int]:
    """Records (or bare headers), the resumption token and the count of skipped headers."""
    container = env.payload(verb, url=url, token=token)
    ns = env.ns
    records: list[Record] = []
    skipped = 0
    rt_el = None
    if verb == "ListIdentifiers":
        h_tag = ns + "header"
        for child in container:
            if child.tag == h_tag:
                header = _header(child, ns)
                if header is None:
                    skipped += 1
                else:
                    records.append(Record(header))
            elif child.tag == ns + "resumptionToken":
                rt_el = child
    else:
        r_tag = ns + "record"
        for child in container:
            if child.tag == r_tag:
                record = _record(child, ns)
                if record is None:
                    skipped += 1
                else:
                    records.append(record)
            elif child.tag == ns + "resumptionToken":
                rt_el = child
    return records, _token(rt_el), skipped


def parse_get_record(env: Envelope, *, url: str | None = None) -> Record:
    """The single record of a GetRecord response."""
    container = env.payload("GetRecord", url=url)
    el = container.find(env.ns + "record")
    record = _record(el, env.ns) if el is not None else None
    if record is None:
        raise DataError("GetRecord response has no usable record", url=url)
    return record


def parse_identify(
    env: Envelope, raw: bytes, *, url: str | None = None, logger: Any = None
) -> Identify:
    """Identify, read tolerantly (a junk earliestDatestamp becomes None with a warning)."""
    log = logger or _log
    el = env.payload("Identify", url=url)
    ns = env.ns
    earliest_text = _text(el.find(ns + "earliestDatestamp"))
    earliest: datetime | None = None
    if earliest_text:
        try:
            earliest = parse_datestamp(earliest_text)
        except DatestampError:
            log.warning(f"ignoring unreadable earliestDatestamp {earliest_text!r} from {url}")
    granularity_text = _text(el.find(ns + "granularity"))
    return Identify(
        repository_name=_text(el.find(ns + "repositoryName")),
        base_url=_text(el.find(ns + "baseURL")),
        protocol_version=_text(el.find(ns + "protocolVersion")),
        earliest_datestamp=earliest,
        granularity=Granularity.parse(granularity_text, log),
        deleted_record=_text(el.find(ns + "deletedRecord")),
        admin_emails=[_text(e) for e in el.iterfind(ns + "adminEmail") if _text(e)],
        response_date=env.response_date or datetime.now(UTC),
        raw=raw,
        compression=[_text(e) for e in el.iterfind(ns + "compression") if _text(e)],
        descriptions=[
            d for d in (_serialize_child(e) for e in el.iterfind(ns + "description")) if d
        ],
    )


def parse_metadata_formats(env: Envelope, *, url: str | None = None) -> list[MetadataFormat]:
    """The formats of a ListMetadataFormats response."""
    el = env.payload("ListMetadataFormats", url=url)
    ns = env.ns
    return [
        MetadataFormat(
            prefix=_text(f.find(ns + "metadataPrefix")),
            schema=_text(f.find(ns + "schema")),
            namespace=_text(f.find(ns + "metadataNamespace")),
        )
        for f in el.iterfind(ns + "metadataFormat")
    ]


def parse_sets(
    env: Envelope, *, url: str | None = None, token: str | None = None
) -> tuple[list[OAISet], ResumptionToken | None]:
    """The sets of one ListSets page and its resumption token."""
    el = env.payload("ListSets", url=url, token=token)
    ns = env.ns
    sets = []
    for s in el.iterfind(ns + "set"):
        desc = s.find(ns + "setDescription")
        sets.append(
            OAISet(
                spec=_text(s.find(ns + "setSpec")),
                name=_text(s.find(ns + "setName")),
                description=_serialize_child(desc) if desc is not None else None,
            )
        )
    return sets, _token(el.find(ns + "resumptionToken"))
