"""The OAI-PMH client: the six verbs over a transport (HTTP) and a paging layer."""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC, date, datetime
from typing import Any, TypeVar

import httpx

from ._options import ClientOptions, LoggerLike
from ._paging import Fetch, follow_tokens, prefetched
from ._transport import Transport
from .datestamps import Granularity, format_datestamp
from .errors import (
    CannotDisseminateFormat,
    IdDoesNotExist,
    NoRecordsMatch,
    NoSetHierarchy,
    OAIError,
)
from .models import (
    ClientStats,
    Header,
    Identify,
    MetadataFormat,
    OAISet,
    Page,
    Record,
    ResumptionToken,
)
from .parse import (
    parse_get_record,
    parse_identify,
    parse_list_page,
    parse_metadata_formats,
    parse_sets,
    read_envelope,
)

__all__ = ["LIST_VERBS", "OAIClient", "drop_seen"]

T = TypeVar("T")

LIST_VERBS = ("ListRecords", "ListIdentifiers")


def drop_seen(page: Page, seen: set[str]) -> Page:
    """`page` without the records whose identifier is in `seen` (a record that several
    sets' lists deliver), counted in ``page.duplicates_dropped``; the identifiers it
    keeps join `seen`. The one de-duplication across lists, for whoever walks several."""
    kept = []
    for record in page.records:
        identifier = record.header.identifier
        if identifier in seen:
            page.duplicates_dropped += 1
        else:
            seen.add(identifier)
            kept.append(record)
    page.records = kept
    return page


class OAIClient:
    """An OAI-PMH client for one base URL.

    Thread-safe; use it as a context manager or call :meth:`close`. Connections are
    kept alive and shared by all clients of the process that talk to the same host
    (unless a ``transport`` is given), and so is the per-host limit of parallel
    requests and the pacing between them.
    """

    def __init__(
        self,
        base_url: str,
        options: ClientOptions | None = None,
        *,
        logger: logging.Logger | LoggerLike | None = None,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.log: logging.Logger | LoggerLike = logger or logging.getLogger("oaipmh_dagster.oai")
        self.stats = ClientStats()
        self._transport = Transport(
            base_url,
            options or ClientOptions(),
            log=self.log,
            stats=self.stats,
            transport=transport,
            sleep=sleep,
            clock=clock,
        )
        self.base_url = self._transport.base_url
        self.options = self._transport.options
        self.guarded = self._transport.guarded
        """True when reads are held to the request deadline and can be cancelled at once."""
        self._identify: Identify | None = None
        self._identify_lock = threading.Lock()

    def cancel(self) -> None:
        """Stop this client's requests in flight (and back-off waits) now; every later
        request raises `Cancelled`. Safe to call from any thread or a signal handler."""
        self._transport.cancel()

    def close(self) -> None:
        """Cancel what is still in flight (a prefetch nobody waits for) and release the
        connection pool (the shared one when its last client closes)."""
        self._transport.close()

    def __enter__(self) -> OAIClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"OAIClient({self.base_url!r})"

    def url_for(self, params: dict[str, str]) -> str:
        """The request URL for these OAI arguments (never with userinfo)."""
        return self._transport.url_for(params)

    def _follow(
        self,
        fetch: Fetch[T],
        verb: str,
        args: dict[str, str],
        start_token: str | None,
        *,
        can_restart: bool = True,
    ) -> Iterator[tuple[T, ResumptionToken | None]]:
        return follow_tokens(
            fetch,
            verb,
            args,
            start_token,
            url_for=self.url_for,
            log=self.log,
            max_empty_pages=self.options.max_empty_pages,
            can_restart=can_restart,
        )

    # -- verbs -----------------------------------------------------------------------

    def identify(self) -> Identify:
        """Identify (fetched once, then cached)."""
        with self._identify_lock:
            if self._identify is None:

                def handle(body: bytes, url: str, status: int) -> Identify:
                    env = read_envelope(body, url=url, logger=self.log)
                    self.stats.add(stripped_chars=env.stripped_chars)
                    return parse_identify(env, body, url=url, logger=self.log)

                self._identify = self._transport.call({"verb": "Identify"}, None, handle)
            return self._identify

    @property
    def granularity(self) -> Granularity:
        """The repository's datestamp granularity (from a cached Identify)."""
        return self.identify().granularity

    def list_metadata_formats(self, identifier: str | None = None) -> list[MetadataFormat]:
        """The metadata formats of the repository (or of one item)."""
        params = {"verb": "ListMetadataFormats"}
        if identifier is not None:
            params["identifier"] = identifier

        def handle(body: bytes, url: str, status: int) -> list[MetadataFormat]:
            env = read_envelope(body, url=url, logger=self.log)
            return parse_metadata_formats(env, url=url)

        return self._transport.call(params, None, handle)

    def list_sets(self) -> Iterator[OAISet]:
        """All sets, page by page; a repository without sets yields none."""

        def fetch(params: dict[str, str], token: str | None) -> tuple[list[OAISet], ResumptionToken | None, int]:
            def handle(body: bytes, url: str, status: int) -> tuple[list[OAISet], ResumptionToken | None]:
                env = read_envelope(body, url=url, token=token, logger=self.log)
                self.stats.add(pages=1, stripped_chars=env.stripped_chars)
                return parse_sets(env, url=url, token=token)

            sets, rt = self._transport.call(params, token, handle)
            return sets, rt, len(sets)

        try:
            for sets, _ in self._follow(fetch, "ListSets", {"verb": "ListSets"}, None):
                yield from sets
        except NoSetHierarchy:
            self.log.info(f"{self.base_url} has no set hierarchy")

    def _format_time(self, value: datetime | date | str | None) -> str | None:
        if value is None or isinstance(value, str):
            return value
        return format_datestamp(value, self.granularity)

    def iter_pages(
        self,
        verb: str,
        *,
        metadata_prefix: str | None = None,
        set_spec: str | None = None,
        from_: datetime | date | str | None = None,
        until: datetime | date | str | None = None,
        resumption_token: str | None = None,
        hold: Callable[[Page], bool] | None = None,
    ) -> Iterator[Page]:
        """The pages of a ListRecords or ListIdentifiers list, fetched lazily.

        ``from_``/``until`` objects are formatted at the Identify granularity; strings go
        as they are. ``resumption_token`` starts mid-list (to resume a checkpoint); given
        with the list's original arguments, a token the server rejects (this one or a
        later one) restarts the list from those arguments, once. With prefetch, nothing
        is fetched ahead after a page for which ``hold(page)`` is true (the caller may
        stop there).
        """
        if verb not in LIST_VERBS:
            raise ValueError(f"iter_pages serves {' and '.join(LIST_VERBS)}, not {verb!r}")
        args = self._list_args(verb, metadata_prefix, set_spec, from_, until)
        if metadata_prefix is None and resumption_token is None:
            raise ValueError(f"{verb} needs metadata_prefix (or a resumption_token)")
        fetch = functools.partial(self._fetch_page, verb, args, metadata_prefix)
        chain = self._follow(
            fetch, verb, args, resumption_token, can_restart=metadata_prefix is not None
        )
        pages = (page for page, _ in chain)
        if self.options.prefetch:
            yield from prefetched(pages, self._transport.cancel_scope, hold)
        else:
            yield from pages

    def _list_args(
        self,
        verb: str,
        metadata_prefix: str | None,
        set_spec: str | None,
        from_: datetime | date | str | None,
        until: datetime | date | str | None,
    ) -> dict[str, str]:
        """A list's original arguments."""
        args: dict[str, str] = {"verb": verb}
        if metadata_prefix is not None:
            args["metadataPrefix"] = metadata_prefix
        if set_spec is not None:
            args["set"] = set_spec
        from_text, until_text = self._format_time(from_), self._format_time(until)
        if from_text is not None:
            args["from"] = from_text
        if until_text is not None:
            args["until"] = until_text
        return args

    def _fetch_page(
        self,
        verb: str,
        args: dict[str, str],
        metadata_prefix: str | None,
        params: dict[str, str],
        token: str | None,
    ) -> tuple[Page, ResumptionToken | None, int]:
        """One page of a list (`follow_tokens`' fetch): the page, its token, its records.
        An empty list is one empty page, so the caller still learns the responseDate."""
        parse = functools.partial(parse_list_page, verb=verb, params=params, args=args,
                                  token=token, logger=self.log)
        try:
            page = self._transport.call(params, token, parse)
        except CannotDisseminateFormat as exc:
            raise self._explain_format(exc, metadata_prefix) from None
        except NoRecordsMatch as exc:
            if token:
                raise
            page = Page(
                records=[],
                resumption_token=None,
                response_date=exc.response_date or datetime.now(UTC),
                request_url=exc.url or self.url_for(params),
                verb=verb,
                params=dict(params),
                request_args=dict(args),
            )
        else:
            self.stats.add(pages=1, stripped_chars=page.stripped_chars,
                           skipped_headers=page.skipped_headers)
        return page, page.resumption_token, len(page.records)

    def _explain_format(
        self, exc: CannotDisseminateFormat, prefix: str | None, identifier: str | None = None
    ) -> CannotDisseminateFormat:
        offered: list[str] | None = None
        try:
            offered = [f.prefix for f in self.list_metadata_formats(identifier)]
        except OAIError as err:
            self.log.debug(f"could not list metadata formats: {err}")
        return CannotDisseminateFormat(
            exc.server_message, url=exc.url, token=exc.token, prefix=prefix, offered=offered
        )

    def iter_record_pages(
        self,
        metadata_prefix: str,
        *,
        sets: Sequence[str] = (),
        from_: datetime | date | str | None = None,
        until: datetime | date | str | None = None,
        identifiers_only: bool = False,
    ) -> Iterator[Page]:
        """Pages of one or several sets, one set after another.

        With several sets, a record already yielded in an earlier set is dropped from
        later pages (`drop_seen`; ``page.duplicates_dropped`` counts them).
        """
        verb = "ListIdentifiers" if identifiers_only else "ListRecords"
        from_text, until_text = self._format_time(from_), self._format_time(until)
        specs: list[str | None] = [*dict.fromkeys(sets)] or [None]
        seen: set[str] | None = set() if len(specs) > 1 else None
        for spec in specs:
            for page in self.iter_pages(
                verb,
                metadata_prefix=metadata_prefix,
                set_spec=spec,
                from_=from_text,
                until=until_text,
            ):
                yield page if seen is None else drop_seen(page, seen)

    def list_records(
        self,
        metadata_prefix: str,
        *,
        sets: Sequence[str] = (),
        from_: datetime | date | str | None = None,
        until: datetime | date | str | None = None,
    ) -> Iterator[Record]:
        """Every record of the selection, lazily."""
        for page in self.iter_record_pages(metadata_prefix, sets=sets, from_=from_, until=until):
            yield from page.records

    def list_identifiers(
        self,
        metadata_prefix: str,
        *,
        sets: Sequence[str] = (),
        from_: datetime | date | str | None = None,
        until: datetime | date | str | None = None,
    ) -> Iterator[Header]:
        """Every header of the selection, lazily."""
        for page in self.iter_record_pages(
            metadata_prefix, sets=sets, from_=from_, until=until, identifiers_only=True
        ):
            for record in page.records:
                yield record.header

    def get_record(self, identifier: str, metadata_prefix: str) -> Record:
        """One record by identifier."""
        params = {"verb": "GetRecord", "identifier": identifier, "metadataPrefix": metadata_prefix}

        def handle(body: bytes, url: str, status: int) -> Record:
            env = read_envelope(body, url=url, logger=self.log)
            self.stats.add(stripped_chars=env.stripped_chars)
            return parse_get_record(env, url=url)

        try:
            return self._transport.call(params, None, handle)
        except CannotDisseminateFormat as exc:
            raise self._explain_format(exc, metadata_prefix, identifier) from None

    def get_records(
        self, identifiers: Iterable[str], metadata_prefix: str, *, skip_missing: bool = False
    ) -> Iterator[Record]:
        """GetRecord for each identifier (duplicates asked once).

        With ``skip_missing``, an identifier the server does not know is logged and skipped.
        """
        for identifier in dict.fromkeys(identifiers):
            try:
                yield self.get_record(identifier, metadata_prefix)
            except IdDoesNotExist:
                if not skip_missing:
                    raise
                self.log.warning(f"{identifier!r} does not exist at {self.base_url}; skipped")
