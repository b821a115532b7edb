"""Plain data objects returned by the OAI-PMH client."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .datestamps import Granularity, parse_datestamp
from .errors import OAIDataError

__all__ = [
    "Header",
    "Record",
    "ResumptionToken",
    "Page",
    "Identify",
    "MetadataFormat",
    "OAISet",
    "ClientStats",
]


@dataclass(slots=True)
class Header:
    """A record header; ``datestamp`` is kept exactly as the server sent it."""

    identifier: str
    datestamp: str
    set_specs: tuple[str, ...] = ()
    deleted: bool = False

    @property
    def datestamp_utc(self) -> datetime | None:
        """The datestamp as an aware UTC datetime, or None when unreadable."""
        try:
            return parse_datestamp(self.datestamp)
        except OAIDataError:
            return None


@dataclass(slots=True)
class Record:
    """A harvested record: header, the metadata element serialized once, about elements."""

    header: Header
    metadata: bytes | None = None
    about: tuple[bytes, ...] = ()
    element: Any = field(default=None, repr=False, compare=False)
    """The parsed metadata element (part of its page's tree), so a consumer can use it
    without parsing ``metadata`` again; None when not parsed from a page."""
    parse_error: dict[str, str] | None = field(default=None, compare=False)
    """Why part of the record could not be read (its ``metadata`` or an ``about`` was
    left out, e.g. over the parser's size or depth limits), in the store's error form
    ``{"type", "message", "location"}``; None when the record was read whole."""

    @property
    def identifier(self) -> str:
        return self.header.identifier

    @property
    def deleted(self) -> bool:
        return self.header.deleted


@dataclass(frozen=True, slots=True)
class ResumptionToken:
    """A resumptionToken; ``token`` is "" on the last page of a list."""

    token: str
    cursor: int | None = None
    complete_list_size: int | None = None
    expiration_date: datetime | None = None


@dataclass
class Page:
    """One response of a list verb.

    ``records`` holds :class:`Record` objects (ListRecords) or records whose
    ``metadata`` is None (ListIdentifiers). ``request_args`` are the list's original
    arguments: with ``resumption_token`` they are enough to resume the list later.
    """

    records: list[Record]
    resumption_token: ResumptionToken | None
    response_date: datetime
    request_url: str
    verb: str
    params: dict[str, str]
    bytes: int = 0
    stripped_chars: int = 0
    request_args: dict[str, str] = field(default_factory=dict)
    skipped_headers: int = 0
    duplicates_dropped: int = 0

    @property
    def token(self) -> str | None:
        """The token to ask for the next page, or None when this is the last page."""
        rt = self.resumption_token
        return rt.token if rt is not None and rt.token else None


@dataclass
class Identify:
    """What the repository says about itself."""

    repository_name: str
    base_url: str
    protocol_version: str
    earliest_datestamp: datetime | None
    granularity: Granularity
    deleted_record: str
    admin_emails: list[str]
    response_date: datetime
    raw: bytes = field(repr=False, default=b"")
    compression: list[str] = field(default_factory=list)
    descriptions: list[bytes] = field(default_factory=list, repr=False)


@dataclass(frozen=True, slots=True)
class MetadataFormat:
    prefix: str
    schema: str
    namespace: str


@dataclass(frozen=True, slots=True)
class OAISet:
    spec: str
    name: str
    description: bytes | None = None


@dataclass
class ClientStats:
    """Counters a client updates as it goes (thread-safe increments via :meth:`add`)."""

    requests: int = 0
    retries: int = 0
    bytes_received: int = 0
    pages: int = 0
    stripped_chars: int = 0
    skipped_headers: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, value in counts.items():
                setattr(self, name, getattr(self, name) + value)
