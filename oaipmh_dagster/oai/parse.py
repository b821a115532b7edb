"""Parsing of OAI-PMH responses: one hardened lxml parse per page, then plain objects.

The parser never resolves entities, never loads a DTD, never touches the network
and keeps lxml's tree-size limits. A document that declares entities is refused
outright. Characters illegal in XML 1.0 are stripped (and counted) when a first
parse fails on them, so a clean page costs a single parse and no extra scan.

A record whose metadata breaks the parser's limits (a text node over 10 MB, nesting
deeper than 256 levels) does not sink its page: when the first parse fails on a limit,
the page is scanned with expat, that record's metadata is left out, the page is parsed
again and the record carries a ``parse_error``. A page that can never parse (broken
markup, another root element) is a :class:`OAIDataError` that asking again will not
cure; a page that ends early (truncated) may come back whole and is retryable.
"""

from __future__ import annotations

import codecs
import functools
import logging
import re
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from xml.parsers import expat

from lxml import etree

from .datestamps import Granularity, parse_datestamp
from .errors import DatestampError, OAIDataError, protocol_error
from .models import Header, Identify, MetadataFormat, OAISet, Record, ResumptionToken

__all__ = [
    "OAI_NS",
    "MAX_TEXT_BYTES",
    "MAX_DEPTH",
    "Envelope",
    "apply_http_charset",
    "http_charset",
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

# libxml2's limits without XML_PARSE_HUGE: the longest text node, attribute value or
# CDATA section, and the deepest nesting (counted from the root element, which is 1).
MAX_TEXT_BYTES = 10_000_000
MAX_DEPTH = 256
MAX_NAME_CHARS = 50_000
_LIMIT_ERRORS = frozenset({etree.ErrorTypes.ERR_RESOURCE_LIMIT, etree.ErrorTypes.ERR_NAME_TOO_LONG})
_TOO_BIG_ERRORS = frozenset(
    {etree.ErrorTypes.ERR_COMMENT_NOT_FINISHED, etree.ErrorTypes.ERR_CDATA_NOT_FINISHED}
)
_EXTRA_CONTENT = etree.ErrorTypes.ERR_DOCUMENT_END

_BOMS = (
    codecs.BOM_UTF8,
    codecs.BOM_UTF32_LE,
    codecs.BOM_UTF32_BE,
    codecs.BOM_UTF16_LE,
    codecs.BOM_UTF16_BE,
)
_XML_DECL = re.compile(rb"<\?xml[ \t\r\n][^>]*?\?>")
_DECL_ENCODING = re.compile(rb"""[ \t\r\n]encoding[ \t\r\n]*=[ \t\r\n]*["']([A-Za-z][\w.:-]*)["']""")
_CHARSET = re.compile(r"""(?:^|;)\s*charset\s*=\s*["']?([^"';\s]+)""", re.I)
_ROOT_NAME = re.compile(
    rb"\A(?:\xef\xbb\xbf)?(?:\s+|<\?.*?\?>|<!--.*?-->|<!DOCTYPE(?:[^>\[]|\[.*?\])*>)*"
    rb"<([^\s/>!?]+)",
    re.S,
)
_TRAILER = re.compile(rb"(?:\s+|<!--.*?-->|<\?.*?\?>)*\Z", re.S)

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


@functools.lru_cache(maxsize=64)
def _codec(name: str) -> str | None:
    try:
        return codecs.lookup(name).name
    except LookupError:
        return None


def http_charset(content_type: str | None) -> str | None:
    """The codec named by a Content-Type's charset parameter; None if absent or unknown."""
    if not content_type:
        return None
    m = _CHARSET.search(content_type)
    return _codec(m.group(1)) if m else None


def _contradicts(body: bytes, declared: str | None) -> bool:
    """Whether the bytes cannot be in the encoding the XML declaration names."""
    if declared is None:
        return True
    if declared.startswith(("utf-16", "utf-32")):
        return body.startswith(b"<?xml")  # one byte per character: not UTF-16/32
    try:
        codecs.decode(body, declared)
    except UnicodeDecodeError:
        return True
    return False


def _transcode(body: bytes, charset: str, decl: re.Match[bytes] | None) -> bytes:
    """The body read in `charset`, as UTF-8 without a declaration; as it was when the
    bytes are not in `charset` (the XML rules then apply)."""
    try:
        text = body[decl.end() :].decode(charset) if decl else body.decode(charset)
    except UnicodeDecodeError:
        return body
    return text.encode("utf-8")


def apply_http_charset(body: bytes, content_type: str | None) -> bytes:
    """The body as the parser should see it, following RFC 7303 and real servers.

    A byte order mark wins over everything. The Content-Type's charset decides when the
    document names no encoding, or names one its bytes cannot be in (``utf-16`` over
    one-byte text, ``UTF-8`` over Latin-1 bytes); a declaration its bytes agree with is
    kept (servers often send a default ``ISO-8859-1`` over UTF-8 pages that say so).
    Returns the same object when nothing needs changing (the common case).
    """
    charset = http_charset(content_type)
    if charset is None or body.startswith(_BOMS):
        return body
    decl = _XML_DECL.match(body, 0, 1024)
    named = _DECL_ENCODING.search(decl.group()) if decl else None
    if named is None:
        return body if charset == "utf-8" else _transcode(body, charset, decl)
    declared = _codec(named.group(1).decode("ascii"))
    if declared == charset or not _contradicts(body, declared):
        return body
    return _transcode(body, charset, decl)


def _ends_early(body: bytes, exc: etree.XMLSyntaxError) -> bool:
    """Whether a page that does not parse looks cut off (it may come back whole), rather
    than broken for good: it does not end with its root element's end tag."""
    if exc.code == _EXTRA_CONTENT:
        return False
    root = _ROOT_NAME.match(body[:65536])
    if root is None:
        return True
    tail = body[-4096:]
    tail = tail[: _TRAILER.search(tail).start()]
    return re.search(rb"</\s*" + re.escape(root.group(1)) + rb"\s*>\Z", tail) is None


def _excerpt(body: bytes, position: tuple[int, int] | None) -> str:
    """The text around a parse error's (line, column), for the message."""
    if not position:
        return ""
    line, column = position
    start = 0
    for _ in range(max(0, line - 1)):
        nl = body.find(b"\n", start)
        if nl < 0:
            return ""
        start = nl + 1
    end = body.find(b"\n", start)
    end = len(body) if end < 0 else end
    if end - start > 120:
        at = start + max(0, column - 1)
        start, end = max(start, at - 80), min(end, at + 40)
    text = body[start:end].decode("utf-8", "replace").strip()
    return f"; at line {line}: {text!r}" if text else ""


def _opening(body: bytes) -> str:
    """The first bytes of a body after any XML declaration, for a message."""
    decl = _XML_DECL.match(body, 0, 1024)
    start = decl.end() if decl else 0
    return body[start : start + 200].decode("utf-8", "replace").strip()[:120]


def _looks_like_html(body: bytes) -> bool:
    return _HTML_START.match(body[:4096]) is not None


def _refuse_entities(body: bytes, url: str | None, token: str | None) -> None:
    doctype = body.find(_DOCTYPE, 0, 65536)
    if doctype >= 0 and body.find(_ENTITY, doctype) >= 0:
        raise OAIDataError(
            "refused a response that declares XML entities (DOCTYPE with <!ENTITY>)",
            url=url,
            token=token,
        )


def _syntax_error(body: bytes, exc: Exception, url: str | None, token: str | None) -> OAIDataError:
    if _looks_like_html(body):
        return OAIDataError(
            "received an HTML page instead of OAI-PMH XML", url=url, token=token, retryable=True
        )
    if isinstance(exc, etree.XMLSyntaxError):
        where = _excerpt(body, exc.position)
        head = body[:256].lstrip()
        if head and head[:1] not in b"<\xef\xfe\xff\x00":
            return OAIDataError(
                f"response is not well-formed XML (not XML at all): {_opening(body)!r}",
                url=url,
                token=token,
                retryable=True,
            )
        if _ends_early(body, exc):
            return OAIDataError(
                f"response is not well-formed XML (it ends early): {exc.msg}{where}",
                url=url,
                token=token,
                retryable=True,
            )
        return OAIDataError(f"response is not well-formed XML: {exc.msg}{where}", url=url, token=token)
    return OAIDataError(f"response cannot be parsed: {exc}", url=url, token=token)


def _checked(root: etree._Element, url: str | None, token: str | None) -> etree._Element:
    dtd = root.getroottree().docinfo.internalDTD
    if dtd is not None and any(True for _ in dtd.iterentities()):
        raise OAIDataError("refused a response that declares XML entities", url=url, token=token)
    return root


def parse_xml(body: bytes, *, url: str | None = None, token: str | None = None) -> etree._Element:
    """Parse bytes with the hardened parser; OAIDataError when unsafe or not well-formed."""
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
    root and the number of characters stripped. Record metadata that breaks the
    parser's limits is left out (:func:`read_envelope` says which records lost it).
    """
    root, stripped, _ = _parse_page(body, url, token)
    return root, stripped


def _over_limit(exc: Exception) -> bool:
    """Whether a parse failed on one of libxml2's size limits rather than on the markup."""
    if not isinstance(exc, etree.XMLSyntaxError):
        return False
    msg = exc.msg or ""
    return (
        exc.code in _LIMIT_ERRORS
        or (exc.code in _TOO_BIG_ERRORS and "too big" in msg)
        or "XML_PARSE_HUGE" in msg
    )


def _parse_page(
    body: bytes, url: str | None, token: str | None
) -> tuple[etree._Element, int, dict[int, dict[str, str]]]:
    """Root, characters stripped, and the errors of records whose metadata was left out."""
    _refuse_entities(body, url, token)
    try:
        return _checked(etree.fromstring(body, _parser()), url, token), 0, {}
    except (etree.XMLSyntaxError, ValueError) as exc:
        failure: Exception = exc
    cleaned, stripped = strip_illegal_chars(body)
    if stripped:
        try:
            return _checked(etree.fromstring(cleaned, _parser()), url, token), stripped, {}
        except (etree.XMLSyntaxError, ValueError) as exc:
            failure = exc
    if _over_limit(failure):
        root, errors = _parse_bounded(cleaned, failure, url, token)
        return root, stripped, errors
    raise _syntax_error(cleaned, failure, url, token) from None


def _as_utf8(body: bytes) -> bytes | None:
    """The document as UTF-8 without its XML declaration; None when it cannot be read."""
    codec = "utf-8"
    for bom, name in (
        (codecs.BOM_UTF32_LE, "utf-32"),
        (codecs.BOM_UTF32_BE, "utf-32"),
        (codecs.BOM_UTF8, "utf-8-sig"),
        (codecs.BOM_UTF16_LE, "utf-16"),
        (codecs.BOM_UTF16_BE, "utf-16"),
    ):
        if body.startswith(bom):
            codec = name
            break
    else:
        decl = _XML_DECL.match(body, 0, 1024)
        named = _DECL_ENCODING.search(decl.group()) if decl else None
        if named is not None:
            codec = _codec(named.group(1).decode("ascii")) or "utf-8"
    try:
        text = body.decode(codec)
    except UnicodeDecodeError:
        return None
    return re.sub(r"\A<\?xml[ \t\r\n][^>]*?\?>", "", text, count=1).encode("utf-8")


class _LimitScan:
    """One expat pass (expat has none of these limits) that finds the content of record
    children (``metadata``, ``about``) breaking libxml2's limits.

    ``cuts`` are byte ranges of such content, ``errors`` maps the index of a record
    among the payload's records to its error, ``fatal`` says what broke a limit outside
    any record's metadata (then the page cannot be read).
    """

    def __init__(self, body: bytes) -> None:
        self.cuts: list[tuple[int, int]] = []
        self.errors: dict[int, dict[str, str]] = {}
        self.fatal: str | None = None
        self._ns = ""
        self._depth = 0
        self._record = -1
        self._in_record = False
        self._child: str | None = None
        self._child_start = 0
        self._awaiting = False
        self._problem: str | None = None
        self._text_start: int | None = None
        parser = expat.ParserCreate(namespace_separator=" ")
        parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
        parser.StartElementHandler = self._start
        parser.EndElementHandler = self._end
        parser.CharacterDataHandler = self._chars
        parser.CommentHandler = self._comment
        self._parser = parser
        parser.Parse(body, True)

    def _flag(self, reason: str, inside: bool) -> None:
        if inside and self._child not in (None, "header"):
            self._problem = self._problem or reason
        elif self.fatal is None:
            where = (
                f"in the {self._child or 'envelope'} of record {self._record + 1}"
                if self._in_record
                else "outside any record's metadata"
            )
            self.fatal = f"{reason} {where}"

    def _event(self) -> int:
        at = self._parser.CurrentByteIndex
        if self._awaiting:
            self._child_start, self._awaiting = at, False
        if self._text_start is not None:
            size = at - self._text_start
            if size > MAX_TEXT_BYTES:
                self._flag(
                    f"a text node of {size} bytes exceeds the parser's limit of "
                    f"{MAX_TEXT_BYTES} bytes",
                    self._in_record and self._depth >= 4,
                )
            self._text_start = None
        return at

    def _chars(self, _data: str) -> None:
        if self._awaiting or self._text_start is None:
            at = self._parser.CurrentByteIndex
            if self._awaiting:
                self._child_start, self._awaiting = at, False
            if self._text_start is None:
                self._text_start = at

    def _comment(self, data: str) -> None:
        self._event()
        if len(data) > MAX_TEXT_BYTES // 4 and len(data.encode()) > MAX_TEXT_BYTES:
            self._flag(
                f"a comment exceeds the parser's limit of {MAX_TEXT_BYTES} bytes",
                self._in_record and self._depth >= 4,
            )

    def _start(self, name: str, attrs: dict[str, str]) -> None:
        self._event()
        self._depth += 1
        depth = self._depth
        if depth == 1:
            self._ns = name[: -len("OAI-PMH")] if name.endswith("OAI-PMH") else ""
        elif depth == 3 and name == self._ns + "record":
            self._record += 1
            self._in_record = True
        elif depth == 4 and self._in_record:
            self._child = name.rpartition(" ")[2]
            self._awaiting, self._problem = True, None
        if depth > MAX_DEPTH:
            self._flag(f"elements nest deeper than {MAX_DEPTH} levels", self._in_record)
        if len(name) > MAX_NAME_CHARS:
            self._flag(f"an element name exceeds {MAX_NAME_CHARS} characters", depth >= 5)
        for value in attrs.values():
            if len(value) > MAX_TEXT_BYTES // 4 and len(value.encode()) > MAX_TEXT_BYTES:
                self._flag(
                    f"an attribute value exceeds the parser's limit of {MAX_TEXT_BYTES} bytes",
                    self._in_record and depth >= 5,
                )

    def _end(self, _name: str) -> None:
        at = self._event()
        if self._depth == 4 and self._child is not None:
            if self._problem is not None:
                self.cuts.append((self._child_start, at))
                self.errors.setdefault(
                    self._record,
                    {
                        "type": "ParseError",
                        "message": f"{self._child} not read: {self._problem}",
                        "location": self._child,
                    },
                )
            self._child, self._problem = None, None
        elif self._depth == 3:
            self._in_record = False
        self._depth -= 1


def _parse_bounded(
    body: bytes, failure: Exception, url: str | None, token: str | None
) -> tuple[etree._Element, dict[int, dict[str, str]]]:
    """Parse a page whose first parse hit a limit, leaving out the record content that
    broke it; OAIDataError when something else broke it."""
    utf8 = _as_utf8(body)
    if utf8 is None:
        raise _syntax_error(body, failure, url, token)
    try:
        scan = _LimitScan(utf8)
    except expat.ExpatError:
        raise _syntax_error(body, failure, url, token) from None
    if scan.fatal is not None:
        raise OAIDataError(f"response cannot be read: {scan.fatal}", url=url, token=token)
    pieces, pos = [], 0
    for start, end in scan.cuts:
        pieces.append(utf8[pos:start])
        pos = end
    pieces.append(utf8[pos:])
    trimmed = b"".join(pieces)
    try:
        root = etree.fromstring(trimmed, _parser())
    except (etree.XMLSyntaxError, ValueError) as exc:
        raise _syntax_error(trimmed, exc, url, token) from None
    for index, error in scan.errors.items():
        _log.warning(f"record {index + 1} of {url}: {error['message']}")
    return _checked(root, url, token), scan.errors


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
    root, stripped, record_errors = _parse_page(body, url, token)
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
        message = f"not an OAI-PMH response (root element <{name}>): {_opening(body)!r}"
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
