"""The OAI-PMH 2.0 server core both loopback servers share (no I/O).

Argument validation, ``from``/``until`` parsing, the response envelope and error
element, record and header rendering, signed resumption tokens and the
``resumptionToken`` element. :mod:`oaipmh_dagster.demo.server` answers from a
:class:`~oaipmh_dagster.demo.dataset.Dataset` with it; the benchmark server answers
from pre-rendered pages with it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import json
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, date, datetime
from xml.sax.saxutils import escape, quoteattr

from oaipmh_dagster.demo.dataset import DAY, Dataset, ServedRecord

__all__ = [
    "ARGUMENTS",
    "ENVELOPE_TAIL",
    "LIST_VERBS",
    "OAI_NS",
    "XML_DECL",
    "ListState",
    "OAIError",
    "TokenCodec",
    "envelope",
    "envelope_head",
    "error_element",
    "format_seconds",
    "header_xml",
    "parse_arguments",
    "parse_range",
    "record_xml",
    "request_attrs",
    "token_element",
]

OAI_NS = "http://www.openarchives.org/OAI/2.0/"
XSI_NS = "http://www.w3.org/2001/XMLSchema-instance"
XML_DECL = '<?xml version="1.0" encoding="UTF-8"?>\n'
ENVELOPE_TAIL = "</OAI-PMH>\n"

LIST_VERBS = ("ListIdentifiers", "ListRecords", "ListSets")
# verb -> (required arguments, optional arguments); resumptionToken is exclusive.
ARGUMENTS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
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
_SECONDS_FMT = "%Y-%m-%dT%H:%M:%SZ"


class OAIError(Exception):
    """An OAI-PMH error the server answers with ``<error code=...>``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def format_seconds(value: datetime) -> str:
    """``value`` in UTC at seconds granularity."""
    utc = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    return f"{utc.year:04d}" + utc.strftime(_SECONDS_FMT[2:])  # %Y is not padded before 1000


# -- requests -------------------------------------------------------------------------


def parse_arguments(params: dict[str, list[str]]) -> tuple[str, dict[str, str]]:
    """The verb and its arguments, or :class:`OAIError` (badVerb, badArgument)."""
    verbs = params.get("verb")
    if not verbs or len(verbs) > 1 or verbs[0] not in ARGUMENTS:
        shown = verbs[0] if verbs else ""
        raise OAIError("badVerb", f"Illegal OAI verb: {shown!r}." if shown else "Missing verb.")
    verb = verbs[0]
    required, optional = ARGUMENTS[verb]
    args: dict[str, str] = {}
    for name, values in params.items():
        if name == "verb":
            continue
        if name not in required and name not in optional:
            raise OAIError("badArgument", f"Illegal argument for {verb}: {name}.")
        if len(values) > 1:
            raise OAIError("badArgument", f"Repeated argument: {name}.")
        args[name] = values[0]
    if "resumptionToken" in args:
        if len(args) > 1:
            raise OAIError("badArgument", "resumptionToken is an exclusive argument.")
    else:
        missing = sorted(required - args.keys())
        if missing:
            raise OAIError("badArgument", f"Missing argument: {', '.join(missing)}.")
    return verb, args


def _parse_stamp(name: str, value: str, granularity: str) -> tuple[date | datetime, bool]:
    """``(value, is_day)`` of one ``from``/``until`` argument."""
    if _DAY_RE.fullmatch(value):
        try:
            return datetime.strptime(value, "%Y-%m-%d").date(), True
        except ValueError:
            pass
    elif _SECONDS_RE.fullmatch(value):
        if granularity == DAY:
            raise OAIError(
                "badArgument", f"{name}={value!r} is finer than the repository granularity {DAY}."
            )
        try:
            return datetime.strptime(value, _SECONDS_FMT).replace(tzinfo=UTC), False
        except ValueError:
            pass
    raise OAIError("badArgument", f"Illegal {name} date: {value!r}.")


def parse_range(
    from_: str | None, until: str | None, granularity: str
) -> tuple[date | datetime | None, date | datetime | None]:
    """``from`` and ``until`` as a date (day granularity) or an aware datetime."""
    low = None if from_ is None else _parse_stamp("from", from_, granularity)
    high = None if until is None else _parse_stamp("until", until, granularity)
    if low and high:
        if low[1] != high[1]:
            raise OAIError("badArgument", "from and until have different granularities.")
        if low[0] > high[0]:
            raise OAIError("badArgument", "from is later than until.")
    return (low[0] if low else None), (high[0] if high else None)


# -- responses ------------------------------------------------------------------------


def request_attrs(error: OAIError | None, verb: str, args: dict[str, str]) -> dict[str, str]:
    """The ``<request>`` attributes: none after badVerb or badArgument."""
    if error is not None and error.code in ("badVerb", "badArgument"):
        return {}
    return {"verb": verb, **args}


def envelope_head(attrs: dict[str, str], base_url: str, now: datetime) -> str:
    """The response up to and including ``<request>``."""
    request = "".join(f" {k}={quoteattr(v)}" for k, v in attrs.items())
    return (
        f'{XML_DECL}<OAI-PMH xmlns="{OAI_NS}" xmlns:xsi="{XSI_NS}" '
        f'xsi:schemaLocation="{OAI_NS} http://www.openarchives.org/OAI/2.0/OAI-PMH.xsd">'
        f"<responseDate>{format_seconds(now)}</responseDate>"
        f"<request{request}>{escape(base_url)}</request>"
    )


def envelope(inner: str, attrs: dict[str, str], base_url: str, now: datetime) -> str:
    """A whole response around ``inner``."""
    return envelope_head(attrs, base_url, now) + inner + ENVELOPE_TAIL


def error_element(error: OAIError) -> str:
    """``<error code="...">message</error>``."""
    return f'<error code="{error.code}">{escape(error.message)}</error>'


def header_xml(record: ServedRecord, dataset: Dataset) -> str:
    """The ``<header>`` of ``record``."""
    status = ' status="deleted"' if record.deleted else ""
    specs = "".join(f"<setSpec>{escape(s)}</setSpec>" for s in record.sets)
    return (
        f"<header{status}><identifier>{escape(record.identifier)}</identifier>"
        f"<datestamp>{dataset.format_datestamp(record.datestamp)}</datestamp>"
        f"{specs}</header>"
    )


def record_xml(record: ServedRecord, header: str, metadata: str | None) -> str:
    """The ``<record>`` of ``record`` (no metadata for a tombstone)."""
    if record.deleted or metadata is None:
        return f"<record>{header}</record>"
    return f"<record>{header}<metadata>{metadata}</metadata></record>"


# -- resumption tokens ----------------------------------------------------------------


@dataclass(frozen=True)
class ListState:
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


class TokenCodec:
    """Signed, stateless resumption tokens: a :class:`ListState` as base64 JSON."""

    def __init__(self) -> None:
        self._secret = secrets.token_bytes(16)
        self._nonce = itertools.count()

    def _mac(self, payload: bytes) -> bytes:
        return hmac.new(self._secret, payload, hashlib.sha256).digest()[:8]

    def encode(self, state: ListState) -> str:
        """A token for ``state``; every call gives a distinct token."""
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
        return base64.urlsafe_b64encode(self._mac(payload) + payload).decode().rstrip("=")

    def decode(self, token: str) -> ListState | None:
        """The state in ``token`` (ignoring expiry), or None when it is not ours."""
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
            mac, payload = raw[:8], raw[8:]
            if not hmac.compare_digest(mac, self._mac(payload)):
                return None
            v, verb, prefix, set_spec, from_, until, cursor, page, last, gen, issued, _, snap = (
                json.loads(payload)
            )
            if v != 1:
                return None
            last_key = (datetime.fromisoformat(last[0]), last[1]) if last else None
            return ListState(
                verb, cursor, page, gen, issued, prefix, set_spec, from_, until, last_key, snap
            )
        except (ValueError, TypeError, IndexError):
            return None


def token_element(
    value: str | None, *, size: int, cursor: int, resumed: bool, expires: datetime | None = None
) -> str:
    """The ``<resumptionToken>`` of a list page.

    ``value`` is the token of the next page (None on the last page); the last page of
    a list that was ``resumed`` or started past 0 gets an empty element.
    """
    attrs = f'completeListSize="{size}" cursor="{cursor}"'
    if value is not None:
        expiry = "" if expires is None else f' expirationDate="{format_seconds(expires)}"'
        return f"<resumptionToken {attrs}{expiry}>{escape(value)}</resumptionToken>"
    if resumed or cursor > 0:
        return f"<resumptionToken {attrs}/>"
    return ""
