"""One harvest of one harvester: since -> pages -> store -> statistics.

No Dagster in here: the Dagster op, the CLI (through the job) and the benchmarks all
call `harvest()`.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from oaipmh_dagster import __version__, incremental
from oaipmh_dagster import reconcile as reconcile_mod
from oaipmh_dagster.oai import (
    BadResumptionToken,
    ClientOptions,
    Granularity,
    IdDoesNotExist,
    OAIClient,
    Page,
    format_datestamp,
    parse_user_datetime,
)
from oaipmh_dagster.parallel import Unit, harvest_windows
from oaipmh_dagster.registry import SET_SPEC_PATTERN, Harvester
from oaipmh_dagster.store import PageCounts, Store
from oaipmh_dagster.transform import get_transformer, transform_element, transform_record
from oaipmh_dagster.windows import Window

log = logging.getLogger(__name__)

GETRECORD_BATCH = 100
# Progress lines: the first and last page, and one every this many seconds between
# (each line is an event in Dagster's log: one per page would slow fast harvests).
LOG_EVERY = 2.0


class HarvestError(RuntimeError):
    """A harvest could not complete; committed pages stay valid."""


class CredentialsError(HarvestError):
    """The environment variable named by the harvester's `auth_env` is missing or bad."""


@dataclass
class HarvestStats:
    """What one harvest did (also the materialization metadata)."""

    harvester_id: str
    mode: str = "incremental"  # incremental | full | oai_ids | resumed
    since: str | None = None
    until: str | None = None
    sets: list[str] = field(default_factory=list)
    granularity: str = Granularity.DAY.value
    response_date: str | None = None  # the server's clock at the first response
    # What this harvest may record as the next since (the server's clock at the start of
    # the lists it read, through resumes), whether it covered the harvester's whole
    # selection, and why not, or why the value is not the plain list start.
    next_since: str | None = None
    covers_selection: bool = False
    since_note: str = ""
    scope: str = ""
    pages: int = 0
    requests: int = 0
    retries: int = 0
    bytes: int = 0
    stripped_chars: int = 0
    new: int = 0
    updated: int = 0
    deleted: int = 0
    unchanged: int = 0
    failed: int = 0
    failed_ids: list[str] = field(default_factory=list)
    complete_list_size: int | None = None
    # Lists that ended short of the completeListSize they announced (suspect: since
    # does not advance), and how many lists could be judged at all.
    short_lists: list[dict[str, Any]] = field(default_factory=list)
    lists_judged: int = 0
    # The reconciliation after the lists (run config `reconcile`), when there was one.
    reconcile: reconcile_mod.ReconcileStats | None = None
    resumed_from_token: str | None = None
    duration: float = 0.0

    @property
    def records(self) -> int:
        """Records seen (every header the server sent for this harvest)."""
        return self.new + self.updated + self.deleted + self.unchanged

    @property
    def records_per_second(self) -> float:
        return self.records / self.duration if self.duration > 0 else 0.0

    def add_counts(self, counts: PageCounts) -> None:
        """Accumulate one page's store counts."""
        self.new += counts.new
        self.updated += counts.updated
        self.deleted += counts.deleted
        self.unchanged += counts.unchanged
        self.failed += counts.failed
        self.failed_ids.extend(counts.failed_ids[: max(0, 20 - len(self.failed_ids))])

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["records"] = self.records
        data["records_per_second"] = round(self.records_per_second, 1)
        data["duration"] = round(self.duration, 3)
        return data

    def summary(self) -> str:
        """One line for logs and the CLI."""
        return (
            f"{self.harvester_id}: {self.records} records ({self.new} new, {self.updated} "
            f"updated, {self.deleted} deleted, {self.unchanged} unchanged, {self.failed} "
            f"failed) in {_n(self.pages, 'page')}, {_n(self.requests, 'request')}, "
            f"{_n(self.retries, 'retry', 'retries')}, "
            f"{self.bytes / 1e6:.1f} MB, {self.duration:.1f} s "
            f"({self.records_per_second:.0f} records/s); since={self.since or '-'} "
            f"until={self.until or '-'} response_date={self.response_date}"
            + (f"; since not advanced: {'; '.join(map(describe_short, self.short_lists))}"
               if self.short_lists else "")
            + (f"; reconcile: {self.reconcile.summary()}" if self.reconcile else "")
        )


def describe_short(item: dict[str, Any]) -> str:
    """One short list in words."""
    which = f"the list of set {item['set']}" if item.get("set") else "the list"
    return (f"{which} ended after {item['received']} of the {item['announced']} records its "
            "first page announced (completeListSize)")


@dataclass
class ListTally:
    """One list as it went by: the completeListSize its first page announced, the headers
    it delivered, and how many came before the first page this run saw (a resumed list's
    cursor; None when the server did not say)."""

    set_spec: str | None
    offset: int | None = 0
    announced: int | None = None
    received: int = 0

    @classmethod
    def start(cls, set_spec: str | None, page: Page) -> ListTally:
        """The tally of a list whose first page in this run is `page`."""
        if "resumptionToken" not in page.params:
            return cls(set_spec)
        rt = page.resumption_token
        return cls(set_spec, offset=rt.cursor if rt is not None else None)

    def add(self, page: Page) -> None:
        rt = page.resumption_token
        if self.announced is None and rt is not None:
            self.announced = rt.complete_list_size
        self.received += len(page.records) + page.duplicates_dropped + page.skipped_headers

    def short(self) -> dict[str, Any] | None:
        """What was announced and received when the list ended short, else None."""
        if self.announced is None or self.offset is None:
            return None
        received = self.offset + self.received
        if received >= self.announced:
            return None
        return {"set": self.set_spec, "announced": self.announced, "received": received}


def _n(count: int, one: str, many: str | None = None) -> str:
    return f"{count} {one if count == 1 else (many or one + 's')}"


@dataclass(frozen=True)
class Progress:
    """Emitted after each committed page."""

    pages: int
    records: int
    rate: float
    cursor: int | None
    complete_list_size: int | None
    token: str | None


_listeners: list[Callable[[Progress | HarvestStats], None]] = []


@contextmanager
def listening(fn: Callable[[Progress | HarvestStats], None]) -> Iterator[None]:
    """Call `fn` with each `Progress` and the final `HarvestStats` of harvests in this
    process while the block runs (the CLI's progress line)."""
    _listeners.append(fn)
    try:
        yield
    finally:
        _listeners.remove(fn)


def _notify(event: Progress | HarvestStats) -> None:
    for fn in list(_listeners):
        fn(event)


def credentials(h: Harvester) -> dict[str, Any]:
    """Client auth options from the environment variable the row names.

    The variable holds `user:password` (HTTP basic) or `Bearer <token>`."""
    if not h.auth_env:
        return {}
    value = os.environ.get(h.auth_env)
    if not value:
        raise CredentialsError(
            f"harvester {h.id!r} needs credentials from ${h.auth_env}, which is not set"
        )
    if value.lower().startswith("bearer "):
        return {"bearer_token": value[7:].strip()}
    user, sep, password = value.partition(":")
    if not sep:
        raise CredentialsError(
            f"${h.auth_env} must hold 'user:password' or 'Bearer <token>'"
        )
    return {"auth": (user, password)}


def client_options(h: Harvester, **overrides: Any) -> ClientOptions:
    """The client options of a harvester row."""
    values: dict[str, Any] = {
        "read_timeout": h.timeout,
        "delay": h.delay,
        "max_parallel": h.max_parallel,
        "max_retries": h.max_retries,
        "user_agent": f"oaipmh-dagster/{__version__}",
        # One request in flight at most: page n+1 is fetched while page n is stored.
        "prefetch": h.max_parallel == 1,
    }
    values.update(credentials(h))
    values.update(overrides)
    return ClientOptions(**values)


def make_transform(name: str) -> Callable[[str, Any], dict[str, Any]]:
    """The store's transform function for a transformer name or dotted path: it uses the
    element the page parse already built, and parses the raw XML only without one."""
    fn = get_transformer(name)

    def apply(raw: str, element: Any = None) -> dict[str, Any]:
        if element is not None:
            return transform_element(fn, element)
        return transform_record(fn, raw.encode("utf-8"))

    return apply


def harvest(
    h: Harvester,
    store: Store,
    *,
    run_id: str,
    since: str | datetime | None = None,
    until: str | datetime | None = None,
    full: bool = False,
    overlap: bool = False,
    oai_ids: Sequence[str] = (),
    sets: Sequence[str] | None = None,
    resume: bool = True,
    transform: bool = True,
    logger: logging.Logger | Any = log,
    progress: Callable[[Progress], None] | None = None,
    options: ClientOptions | None = None,
    client: OAIClient | None = None,
    is_stale: Callable[[str | None], bool] | None = None,
    reconcile: bool = False,
    since_after_lease: Callable[[], tuple[str | None, bool, bool]] | None = None,
) -> HarvestStats:
    """Harvest `h` into `store` and return the statistics; raise on failure.

    `since`/`until` are user input (a date or datetime); `full` ignores `since`;
    `overlap` asks a little before `since` (a remembered since: see `incremental`);
    `oai_ids` fetches exactly those records with GetRecord; `reconcile` then compares
    the identifiers the server lists with the store and repairs the difference (see
    `reconcile`; it never changes what the harvest may record as since). Each page is committed
    with its checkpoint, so a failed or killed harvest is resumed by the next one.
    The statistics say which since the harvest may record (`next_since`) and whether it
    covered the harvester's whole selection (`covers_selection`). `since_after_lease`,
    when given, is called once the harvester's lease is held and returns (since, full,
    overlap): a run that waited for another harvest of the same harvester starts from
    the since that harvest left."""
    started = time.perf_counter()
    stats = HarvestStats(harvester_id=h.id)
    since_dt = None if full or since in (None, "") else parse_user_datetime(since)
    until_dt = None if until in (None, "") else parse_user_datetime(until)
    if since_dt and until_dt and since_dt > until_dt:
        raise HarvestError(f"since {since} is after until {until}")
    set_specs = list(h.sets if sets is None else sets)
    for spec in set_specs:  # run config sets skip the row's validation: check them here
        if not isinstance(spec, str) or not SET_SPEC_PATTERN.fullmatch(spec):
            raise HarvestError(f"invalid set spec {spec!r}")
    stats.sets = set_specs
    stats.scope = incremental.scope(h.base_url, h.metadata_prefix, h.sets)
    whole = sorted(set(set_specs)) == sorted(set(h.sets))
    if reconcile and (oai_ids or until_dt is not None or not whole):
        raise HarvestError("reconcile compares the harvester's whole selection: it cannot be "
                           "combined with oai_ids, until or other sets than the harvester's")
    transform_fn = make_transform(h.transformer) if transform else None
    own_client = client is None
    client = client or OAIClient(h.base_url, options or client_options(h), logger=logger)
    checkpoint = store.acquire(h.id, run_id, is_stale=is_stale, logger=logger)
    ok = False
    logged = 0.0
    try:
        if since_after_lease is not None:
            since, full, overlap = since_after_lease()
            since_dt = None if full or since in (None, "") else parse_user_datetime(since)
            if since_dt and until_dt and since_dt > until_dt:
                raise HarvestError(f"since {since} is after until {until}")
        ident = client.identify()
        gran = ident.granularity
        stats.granularity = gran.value
        stats.response_date = format_datestamp(ident.response_date, gran)
        if since_dt is not None and overlap:
            since_dt = incremental.request_from(since_dt, gran, h.overlap)
        stats.since = format_datestamp(since_dt, gran) if since_dt else None
        stats.until = format_datestamp(until_dt, gran) if until_dt else None
        checkpoint = checkpoint if resume else None
        if checkpoint and not checkpoint.get("list_start"):
            logger.warning("the interrupted harvest's checkpoint does not say when its list "
                           "started: starting the list again instead of resuming it")
            checkpoint = None
        # The server's clock before any list request of this run: the start of its lists,
        # unless it resumes a list that started earlier (then the checkpoint's).
        list_start = ident.response_date
        pages: Iterator[tuple[Page, dict | None]]
        windowed = False
        if oai_ids:
            stats.mode = "oai_ids"
            pages = ((p, None) for p in _get_records(client, h, list(oai_ids)))
        else:
            stats.mode = "full" if since_dt is None else "incremental"
            start = since_dt or ident.earliest_datestamp
            if h.max_parallel > 1 and start is not None:
                end = until_dt or ident.response_date
                windowed = True
                pages = _windowed(client, h, gran, start, end, set_specs, checkpoint, stats,
                                  logger, open_start=since_dt is None,
                                  open_end=until_dt is None, list_start=list_start)
            else:
                if h.max_parallel > 1:
                    logger.info("the server gives no earliestDatestamp: harvesting sequentially")
                args = {"metadata_prefix": h.metadata_prefix, "sets": set_specs,
                        "from": stats.since, "until": stats.until}
                pages = _sequential(client, h, args, checkpoint, stats, logger, list_start)
        resumed_start = _checkpoint_start(checkpoint) if checkpoint else None
        for page, cp in pages:
            counts = store.upsert_page(h.id, page.records, run_id=run_id,
                                       transform=transform_fn, checkpoint=cp,
                                       metadata_prefix=h.metadata_prefix,
                                       transformer=h.transformer)
            stats.add_counts(counts)
            stats.pages += 1
            rt = page.resumption_token
            if rt is not None and rt.complete_list_size is not None and not windowed:
                stats.complete_list_size = rt.complete_list_size  # a window's is partial
            elapsed = time.perf_counter() - started
            event = Progress(
                pages=stats.pages, records=stats.records,
                rate=stats.records / elapsed if elapsed else 0.0,
                cursor=rt.cursor if rt else None,
                complete_list_size=stats.complete_list_size, token=page.token,
            )
            if stats.pages == 1 or page.token is None or elapsed - logged >= LOG_EVERY:
                logged = elapsed
                logger.info(
                    "page %d: %d records so far (%.0f/s)%s", event.pages, event.records,
                    event.rate, f", cursor {event.cursor} of {event.complete_list_size}"
                    if event.cursor is not None else "",
                )
            if progress is not None:
                progress(event)
            _notify(event)
        if stats.mode == "resumed" and resumed_start is not None:
            list_start = min(list_start, resumed_start)
        _decide_next_since(stats, list_start, gran, whole=whole, oai_ids=bool(oai_ids),
                           until=until_dt is not None, since=since)
        if reconcile:
            store.save_checkpoint(h.id, run_id, None)  # the lists are complete
            stats.reconcile = reconcile_mod.reconcile(client, h, store, run_id=run_id,
                                                      transform=transform_fn, logger=logger)
        ok = True
    finally:
        cs = client.stats
        stats.requests, stats.retries = cs.requests, cs.retries
        stats.bytes, stats.stripped_chars = cs.bytes_received, cs.stripped_chars
        stats.duration = time.perf_counter() - started
        store.release(h.id, run_id, succeeded=ok)
        if own_client:
            client.close()
    logger.info("harvest finished: %s", stats.summary())
    _notify(stats)
    return stats


def _decide_next_since(
    stats: HarvestStats, list_start: datetime, gran: Granularity, *, whole: bool,
    oai_ids: bool, until: bool, since: str | datetime | None,
) -> None:
    """Fill in `next_since`, `covers_selection` and `since_note` of a finished harvest."""
    reasons = []
    if oai_ids:
        reasons.append("it fetched chosen identifiers only")
    if until:
        reasons.append("it was bounded by until")
    if not whole:
        reasons.append("it harvested other sets than the harvester's")
    reasons.extend(describe_short(item) for item in stats.short_lists)
    stats.covers_selection = not reasons
    previous = since if isinstance(since, str) else None
    decided = incremental.next_since(list_start, gran, previous=previous)
    stats.next_since = decided.value
    notes = [f"since does not advance: {', '.join(reasons)}"] if reasons else []
    if decided.note:
        notes.append(decided.note)
    stats.since_note = "; ".join(notes)


def _checkpoint_start(checkpoint: dict[str, Any]) -> datetime | None:
    """When the checkpoint's list(s) started (server clock)."""
    try:
        return parse_user_datetime(checkpoint["list_start"])
    except (KeyError, TypeError, ValueError):
        return None


def _checkpoint(
    page: Page, set_spec: str | None, prefix: str, stats: HarvestStats, list_start: str
) -> dict[str, Any] | None:
    """Where to resume after this page (None once its list is complete)."""
    if not page.token:
        return None
    return {"args": {"metadataPrefix": prefix, "set": set_spec, "from": stats.since,
                     "until": stats.until},
            "token": page.token, "set": set_spec, "pages": stats.pages + 1,
            "records": stats.records + len(page.records), "since": stats.since,
            "until": stats.until, "list_start": list_start}


def _resume_point(checkpoint: dict | None, args: dict[str, Any]) -> tuple[str | None, str] | None:
    """(set, token) to resume from, when the checkpoint belongs to this same list."""
    if not checkpoint or not checkpoint.get("token"):
        return None
    cp_args = checkpoint.get("args") or {}
    same = (
        checkpoint.get("since") == args["from"]
        and checkpoint.get("until") == args["until"]
        and cp_args.get("metadataPrefix") == args["metadata_prefix"]
        and (checkpoint.get("set") in args["sets"] if args["sets"] else not checkpoint.get("set"))
    )
    return (checkpoint.get("set"), checkpoint["token"]) if same else None


def _sequential(
    client: OAIClient, h: Harvester, args: dict[str, Any], checkpoint: dict | None,
    stats: HarvestStats, logger: Any, list_start: datetime,
) -> Iterator[tuple[Page, dict | None]]:
    """One list after another (one per set); each page with its checkpoint, which keeps
    the start of the earliest list it continues."""
    start = _iso(list_start)
    if _resume_point(checkpoint, args) is not None:
        start = str(checkpoint["list_start"])  # type: ignore[index]
    tally: ListTally | None = None
    for set_spec, page in _list_pages(client, h, args, checkpoint, stats, logger):
        if tally is None or "resumptionToken" not in page.params:
            tally = ListTally.start(set_spec, page)
        tally.add(page)
        if page.token is None:
            _judge(tally, stats, logger)
            tally = None
        yield page, _checkpoint(page, set_spec, h.metadata_prefix, stats, start)


def _judge(tally: ListTally, stats: HarvestStats, logger: Any) -> None:
    """Note a finished list that delivered fewer headers than it announced."""
    if tally.announced is None or tally.offset is None:
        return
    stats.lists_judged += 1
    short = tally.short()
    if short is not None:
        stats.short_lists.append(short)
        logger.warning("%s: the records that went missing are not harvested, so since does "
                       "not advance and the next harvest asks again from the same since",
                       describe_short(short))


def _iso(dt: datetime) -> str:
    return dt.isoformat()


def _windowed(
    client: OAIClient, h: Harvester, gran: Granularity, start: datetime, end: datetime,
    sets: list[str], checkpoint: dict | None, stats: HarvestStats, logger: Any, *,
    open_start: bool, open_end: bool, list_start: datetime,
) -> Iterator[tuple[Page, dict | None]]:
    """Date windows harvested concurrently (up to the harvester's `max_parallel`); each
    page comes with a checkpoint of every window's state, so a failed run resumes only
    the unfinished windows. The outer windows are open-ended where the harvest is (no
    `from` on a full harvest, no `until` without one), so records dated before the
    server's earliestDatestamp or after its responseDate are still harvested."""
    ident = {"mode": "windowed", "prefix": h.metadata_prefix, "sets": sets,
             "since": stats.since, "until": stats.until}
    units: dict[str, Unit] = {}
    started = _iso(list_start)
    if checkpoint and all(checkpoint.get(k) == v for k, v in ident.items()):
        for key, item in checkpoint.get("windows", {}).items():
            units[key] = Unit(Window.from_dict(item), key, item.get("token"),
                              bool(item.get("done")), int(item.get("depth", 1)))
        started = str(checkpoint["list_start"])
        stats.mode = "resumed"
        logger.info("resuming the interrupted windowed harvest: %d of %d windows done",
                    sum(u.done for u in units.values()), len(units))
    else:
        for spec in sets or [None]:
            w = Window(spec, start, end, open_start=open_start, open_end=open_end)
            units[w.key(gran)] = Unit(w, w.key(gran))
    logger.info("windowed harvest with up to %d parallel requests from %s to %s",
                h.max_parallel, format_datestamp(start, gran), format_datestamp(end, gran))
    seen: set[str] | None = set() if len(sets) > 1 else None

    def snapshot() -> dict:
        return {**ident, "list_start": started, "windows": {
            k: {**u.window.to_dict(gran), "token": u.token, "done": u.done, "depth": u.depth}
            for k, u in units.items()}}

    for event in harvest_windows(client, h.metadata_prefix, list(units.values()),
                                 workers=h.max_parallel, granularity=gran, logger=logger):
        u = event.unit
        if event.split_into:
            units.pop(u.key, None)
            for new in event.split_into:
                units[new.key] = new
            logger.info("window %s split into %d windows", u.key, len(event.split_into))
            continue
        page = event.page
        u.token = page.token
        u.done = page.token is None
        if seen is not None:
            page.records = [r for r in page.records if r.header.identifier not in seen]
            seen.update(r.header.identifier for r in page.records)
        yield page, snapshot()


def _list_pages(
    client: OAIClient, h: Harvester, args: dict[str, Any], checkpoint: dict | None,
    stats: HarvestStats, logger: Any,
) -> Iterator[tuple[str | None, Page]]:
    """The harvest's ListRecords pages (with the set each belongs to), resuming from `checkpoint` when it still applies."""
    sets: list[str | None] = list(args["sets"]) or [None]
    first = 0
    point = _resume_point(checkpoint, args)
    if point is not None:
        set_spec, token = point
        first = sets.index(set_spec)
        stats.mode = "resumed"
        stats.resumed_from_token = token
        logger.info("resuming the interrupted harvest after page %s (%s records) with token %r",
                    checkpoint.get("pages"), checkpoint.get("records"), token)
        try:
            for page in client.iter_pages("ListRecords", resumption_token=token):
                yield set_spec, page
            first += 1
        except BadResumptionToken:
            logger.warning("the checkpoint's resumption token is no longer accepted: "
                           "restarting the list from its original arguments")
    remaining = sets[first:]
    if not remaining:
        return
    for page in client.iter_record_pages(
        h.metadata_prefix, sets=[s for s in remaining if s is not None],
        from_=args["from"], until=args["until"],
    ):
        yield page.request_args.get("set"), page


def _get_records(client: OAIClient, h: Harvester, identifiers: list[str]) -> Iterator[Page]:
    """Pages of GetRecord results for exactly `identifiers`; missing ones fail the harvest
    after the others are stored."""
    missing: list[str] = []
    batch = []
    for identifier in dict.fromkeys(identifiers):
        try:
            batch.append(client.get_record(identifier, h.metadata_prefix))
        except IdDoesNotExist:
            missing.append(identifier)
        if len(batch) >= GETRECORD_BATCH:
            yield _synthetic_page(batch)
            batch = []
    if batch:
        yield _synthetic_page(batch)
    if missing:
        raise HarvestError(
            f"{len(missing)} of {len(identifiers)} identifiers do not exist on the server: "
            + ", ".join(missing[:10]) + (" ..." if len(missing) > 10 else "")
        )


def _synthetic_page(records: list) -> Page:
    from datetime import UTC

    return Page(records=records, resumption_token=None, response_date=datetime.now(UTC),
                request_url="", verb="GetRecord", params={})
