"""The hardened XML parser of OAI-PMH pages.

The parser never resolves entities, never loads a DTD, never touches the network
and keeps lxml's tree-size limits. A document that declares entities is refused
outright. Characters illegal in XML 1.0 are stripped (and counted) when a first
parse fails on them, so a clean page costs a single parse and no extra scan.

A record whose metadata breaks the parser's limits (a text node over 10 MB, nesting
deeper than 256 levels) does not sink its page: when the first parse fails on a limit,
the page is scanned with expat, that record's metadata is left out, the page is parsed
again and the record carries a ``parse_error``. A page that can never parse (broken
markup, another root element) is an :class:`OAIDataError` that asking again will not
cure; a page that ends early (truncated) may come back whole and is retryable.
"""

from __future__ import annotations

import codecs
import logging
import re
import threading
from xml.parsers import expat

from lxml import etree

from ._charset import DECL_ENCODING, XML_DECL, codec_name
from .errors import OAIDataError

__all__ = [
    "MAX_DEPTH",
    "MAX_TEXT_BYTES",
    "hardened_parser",
    "opening",
    "parse_page",
    "parse_xml",
    "strip_illegal_chars",
]

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
_ROOT_NAME = re.compile(
    rb"\A(?:\xef\xbb\xbf)?(?:\s+|<\?.*?\?>|<!--.*?-->|<!DOCTYPE(?:[^>\[]|\[.*?\])*>)*"
    rb"<([^\s/>!?]+)",
    re.S,
)
_TRAILER = re.compile(rb"(?:\s+|<!--.*?-->|<\?.*?\?>)*\Z", re.S)

_local = threading.local()


def hardened_parser() -> etree.XMLParser:
    """The calling thread's parser (lxml parsers must not be shared between threads):
    no entities resolved, no DTD loaded, no network, lxml's tree-size limits kept.

    Not ``collect_ids=False``: with it, libxml2 tries to load an external DTD subset
    (refused by ``no_network``, so the page fails to parse)."""
    parser: etree.XMLParser | None = getattr(_local, "parser", None)
    if parser is None:
        parser = etree.XMLParser(
            resolve_entities=False,
            no_network=True,
            load_dtd=False,
            dtd_validation=False,
            huge_tree=False,
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



def _code(exc: etree.XMLSyntaxError) -> int:
    """libxml2's error code of a syntax error (lxml's stubs do not declare it)."""
    code: int = getattr(exc, "code", 0)
    return code


def _ends_early(body: bytes, exc: etree.XMLSyntaxError) -> bool:
    """Whether a page that does not parse looks cut off (it may come back whole), rather
    than broken for good: it does not end with its root element's end tag."""
    if _code(exc) == _EXTRA_CONTENT:
        return False
    root = _ROOT_NAME.match(body[:65536])
    if root is None:
        return True
    tail = body[-4096:]
    trailer = _TRAILER.search(tail)
    if trailer is not None:
        tail = tail[: trailer.start()]
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


def opening(body: bytes) -> str:
    """The first bytes of a body after any XML declaration, for a message."""
    decl = XML_DECL.match(body, 0, 1024)
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
                f"response is not well-formed XML (not XML at all): {opening(body)!r}",
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
    if dtd is not None and any(True for _ in dtd.iterentities()):  # type: ignore[attr-defined]
        raise OAIDataError("refused a response that declares XML entities", url=url, token=token)
    return root


def parse_xml(body: bytes, *, url: str | None = None, token: str | None = None) -> etree._Element:
    """Parse bytes with the hardened parser; OAIDataError when unsafe or not well-formed."""
    _refuse_entities(body, url, token)
    try:
        root = etree.fromstring(body, hardened_parser())
    except (etree.XMLSyntaxError, ValueError) as exc:
        raise _syntax_error(body, exc, url, token) from None
    return _checked(root, url, token)

def _over_limit(exc: Exception) -> bool:
    """Whether a parse failed on one of libxml2's size limits rather than on the markup."""
    if not isinstance(exc, etree.XMLSyntaxError):
        return False
    msg = exc.msg or ""
    code = _code(exc)
    return (
        code in _LIMIT_ERRORS
        or (code in _TOO_BIG_ERRORS and "too big" in msg)
        or "XML_PARSE_HUGE" in msg
    )


def parse_page(
    body: bytes, url: str | None, token: str | None
) -> tuple[etree._Element, int, dict[int, dict[str, str]]]:
    """Root, characters stripped, and the errors of records whose metadata was left out."""
    _refuse_entities(body, url, token)
    try:
        return _checked(etree.fromstring(body, hardened_parser()), url, token), 0, {}
    except (etree.XMLSyntaxError, ValueError) as exc:
        failure: Exception = exc
    cleaned, stripped = strip_illegal_chars(body)
    if stripped:
        try:
            return _checked(etree.fromstring(cleaned, hardened_parser()), url, token), stripped, {}
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
        decl = XML_DECL.match(body, 0, 1024)
        named = DECL_ENCODING.search(decl.group()) if decl else None
        if named is not None:
            codec = codec_name(named.group(1).decode("ascii")) or "utf-8"
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
        root = etree.fromstring(trimmed, hardened_parser())
    except (etree.XMLSyntaxError, ValueError) as exc:
        raise _syntax_error(trimmed, exc, url, token) from None
    for index, error in scan.errors.items():
        _log.warning(f"record {index + 1} of {url}: {error['message']}")
    return _checked(root, url, token), scan.errors
