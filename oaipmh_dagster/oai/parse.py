"""Reading OAI-PMH responses: the envelope (responseDate, the OAI-PMH error it
carries) and each verb's answer as plain objects (:mod:`.models`).

One hardened parse per page (:mod:`._xml`); the records keep their parsed metadata
element, so a consumer need not parse it again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from lxml import etree

from ._xml import opening, parse_page
from .datestamps import Granularity, parse_datestamp
from .errors import DatestampError, OAIDataError, protocol_error
from .models import Header, Identify, MetadataFormat, OAISet, Page, Record, ResumptionToken

__all__ = [
    "Envelope",
    "parse_get_record",
    "parse_identify",
    "parse_list_page",
    "parse_metadata_formats",
    "parse_record_list",
    "parse_sets",
    "read_envelope",
]

_log = logging.getLogger("oaipmh_dagster.oai")


@dataclass(slots=True)
class Envelope:
    """A parsed OAI-PMH response without errors; ``ns`` is ``{uri}`` (or "" if none)."""

    root: etree._Element
    ns: str
    response_date: datetime | None
    stripped_chars: int
    size: int
    record_errors: dict[int, dict[str, str]] = field(default_factory=dict)
    """Errors of records whose content was left out, by index among the payload's records."""

    def payload(self, verb: str, *, url: str | None = None, token: str | None = None) -> Any:
        """The element named after the verb; OAIDataError when missing."""
        el = self.root.find(self.ns + verb)
        if el is None:
            raise OAIDataError(f"OAI-PMH response has no <{verb}> element", url=url, token=token)
        return el


def read_envelope(
    body: bytes,
    *,
    url: str | None = None,
    token: str | None = None,
    logger: Any = None,
) -> Envelope:
    """Strip, parse and check one OAI-PMH response; raise the OAIProtocolError it carries."""
    size = len(body)
    root, stripped, record_errors = parse_page(body, url, token)
    if stripped:
        (logger or _log).warning(
            f"stripped {stripped} characters illegal in XML 1.0 from the response of {url}"
        )
    tag = root.tag
    if not isinstance(tag, str):
        raise OAIDataError("response has no root element", url=url, token=token, retryable=True)
    qname = etree.QName(tag)
    if qname.localname != "OAI-PMH":
        if qname.localname.lower() == "html":
            raise OAIDataError(
                "received an HTML page instead of OAI-PMH XML", url=url, token=token, retryable=True
            )
        raise _not_oai(root, qname.localname, body, url, token)
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
    return Envelope(root, ns, response_date, stripped, size, record_errors)


def _not_oai(
    root: etree._Element, name: str, body: bytes, url: str | None, token: str | None
) -> OAIDataError:
    """A well-formed answer that is not OAI-PMH: asking again will not change it."""
    if name == "error":
        code = (root.get("code") or "").strip()
        text = " ".join((root.text or "").split())[:200]
        message = (
            f"not an OAI-PMH response: a bare <error code={code!r}> without the OAI-PMH "
            "envelope" + (f": {text}" if text else "")
        )
    else:
        message = f"not an OAI-PMH response (root element <{name}>): {opening(body)!r}"
    return OAIDataError(message, url=url, token=token)


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
    expires = el.get("expirationDate")
    if expires:
        try:
            expiration = parse_datestamp(expires)
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
        errors = env.record_errors
        index = -1
        for child in container:
            if child.tag == r_tag:
                index += 1
                record = _record(child, ns)
                if record is None:
                    skipped += 1
                else:
                    if errors:
                        record.parse_error = errors.get(index)
                    records.append(record)
            elif child.tag == ns + "resumptionToken":
                rt_el = child
    return records, _token(rt_el), skipped


def parse_list_page(
    body: bytes,
    url: str,
    status: int = 200,
    *,
    verb: str,
    params: dict[str, str],
    args: dict[str, str],
    token: str | None = None,
    logger: Any = None,
) -> Page:
    """One ListRecords or ListIdentifiers response as its page (asked with `params`, of
    the list started with `args`); headers without identifier or datestamp are skipped
    and counted, a missing responseDate becomes the local clock (a warning says each)."""
    log = logger or _log
    env = read_envelope(body, url=url, token=token, logger=log)
    records, rt, skipped = parse_record_list(env, verb, url=url, token=token)
    if skipped:
        log.warning(f"skipped {skipped} header(s) without identifier or datestamp in {url}")
    if env.response_date is None:
        log.warning(f"no readable responseDate in {url}; using the local clock")
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


def parse_get_record(env: Envelope, *, url: str | None = None) -> Record:
    """The single record of a GetRecord response."""
    container = env.payload("GetRecord", url=url)
    el = container.find(env.ns + "record")
    record = _record(el, env.ns) if el is not None else None
    if record is None:
        raise OAIDataError("GetRecord response has no usable record", url=url)
    record.parse_error = env.record_errors.get(0)
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
