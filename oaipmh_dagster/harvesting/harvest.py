"""One harvest of one harvester: the page loop that executes a `plan.Plan` (lease ->
Identify -> plan -> pages -> rows written with their checkpoint -> statistics). A long
list's pages are fetched and prepared in a worker process (`worker`); the writes stay here.

No Dagster in here: the Dagster op, the CLI (through the job) and the benchmarks all
call `harvest()`.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from oaipmh_dagster import __version__
from oaipmh_dagster.errors import OAIPMHDagsterError
from oaipmh_dagster.harvesting import incremental, sweep
from oaipmh_dagster.harvesting import reconcile as reconcile_mod
from oaipmh_dagster.harvesting.committer import Committer
from oaipmh_dagster.harvesting.delivered import Delivered
from oaipmh_dagster.harvesting.lists import Lists, Position, ReadyPage, describe_short
from oaipmh_dagster.harvesting.parallel import harvest_windows
from oaipmh_dagster.harvesting.plan import (
    Checkpoint,
    Plan,
    PlanError,
    PlanMode,
    RunOptions,
    SinceChoice,
    WindowedCheckpoint,
    covers_sets,
    make_plan,
    validate,
)
from oaipmh_dagster.harvesting.rows import (
    Counts,
    Transform,
    Validate,
    commit_pages,
    prepare_page,
)
from oaipmh_dagster.harvesting.windows import WindowState
from oaipmh_dagster.harvesting.worker import WORKER_ENV, Spec, Split, Worker, split_setting
from oaipmh_dagster.oai import (
    ClientOptions,
    Granularity,
    IdDoesNotExist,
    Identify,
    OAIClient,
    Page,
    drop_seen,
    format_datestamp,
)
from oaipmh_dagster.storage.ports import IsStale, RecordStore
from oaipmh_dagster.storage.registry import (
    AUTH_ENV_PREFIX,
    AUTH_ENV_RULE,
    Harvester,
    auth_env_allowed,
)
from oaipmh_dagster.transform import (
    TransformError,
    get_transformer,
    parse_metadata,
    transform_element,
    transform_record,
)
from oaipmh_dagster.words import count

__all__ = ["CredentialsError", "HarvestError", "HarvestHooks", "HarvestStats", "Listener",
           "MassDeleteHeldBack", "PlanMode", "Progress", "RunOptions", "SinceChoice",
           "client_options", "describe_short", "harvest", "make_transform", "make_validate"]

log = logging.getLogger(__name__)

GETRECORD_BATCH = 100
# Progress lines: the first and last page, and one every this many seconds between
# (each line is an event in Dagster's log: one per page would slow fast harvests).
LOG_EVERY = 2.0
# Prepared pages that may wait for the committer; those waiting when a commit ends are
# committed together (a writer that falls behind a worker process catches up).
COMMIT_DEPTH = 4
# At most this many identifiers delivered before a hand-over go to the worker (more: its
# look-ups ask the store for every identifier)
HANDED_OVER = 100_000


class HarvestError(OAIPMHDagsterError, RuntimeError):
    """A harvest could not complete; committed pages stay valid."""


class MassDeleteHeldBack(HarvestError):
    """A sweep would have tombstoned more than the harvester's max_delete allows: nothing
    was tombstoned, the pages harvested before stay; `stats` says what the harvest did."""

    def __init__(self, stats: HarvestStats) -> None:
        assert stats.held_back is not None
        super().__init__(stats.held_back.message())
        self.stats = stats


class CredentialsError(HarvestError):
    """The environment variable named by the harvester's `auth_env` is missing or bad."""


@dataclass
class HarvestStats:
    """What one harvest did (also the materialization metadata)."""

    harvester_id: str
    mode: str = PlanMode.INCREMENTAL.value  # a `PlanMode`'s value
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
    counts: Counts = field(default_factory=Counts)
    complete_list_size: int | None = None
    # Lists that ended short of the completeListSize they announced (suspect: since
    # does not advance), and how many lists could be judged at all.
    short_lists: list[dict[str, Any]] = field(default_factory=list)
    lists_judged: int = 0
    # The reconciliation after the lists (run config `reconcile`), when there was one.
    reconcile: reconcile_mod.ReconcileStats | None = None
    # A sweep that would have tombstoned more than max_delete allows (nothing was).
    held_back: sweep.HeldBack | None = None
    # Records outside a changed selection tombstoned after its first complete harvest
    # (None: no such sweep ran), and whether one is still to come.
    selection_swept: int | None = None
    sweep_pending: bool = False
    resumed_from_token: str | None = None
    duration: float = 0.0

    @property
    def new(self) -> int:
        return self.counts.new

    @property
    def updated(self) -> int:
        return self.counts.updated

    @property
    def deleted(self) -> int:
        return self.counts.deleted

    @property
    def unchanged(self) -> int:
        return self.counts.unchanged

    @property
    def failed(self) -> int:
        return self.counts.failed

    @property
    def failed_ids(self) -> list[str]:
        return self.counts.failed_ids

    @property
    def records(self) -> int:
        """Records seen (every header the server sent for this harvest)."""
        return self.counts.records

    @property
    def records_per_second(self) -> float:
        return self.records / self.duration if self.duration > 0 else 0.0

    def summary(self) -> str:
        """One line for logs and the CLI."""
        return (
            f"{self.harvester_id}: {count(self.records, 'record')} ({self.new} new, "
            f"{self.updated} updated, {self.deleted} deleted, {self.unchanged} unchanged, {self.failed} "
            f"failed) in {count(self.pages, 'page')}, {count(self.requests, 'request')}, "
            f"{count(self.retries, 'retry', 'retries')}, "
            f"{self.bytes / 1e6:.1f} MB, {self.duration:.1f} s "
            f"({self.records_per_second:.0f} records/s); since={self.since or '-'} "
            f"until={self.until or '-'} response_date={self.response_date}"
            + (f"; since not advanced: {'; '.join(map(describe_short, self.short_lists))}"
               if self.short_lists else "")
            + (f"; reconcile: {self.reconcile.summary()}" if self.reconcile else "")
            + (f"; selection sweep: {self.selection_swept} records outside the new "
               "selection tombstoned" if self.selection_swept is not None else "")
            + (f"; held back: {self.held_back.sweep} sweep of "
               f"{self.held_back.would_tombstone} records (max_delete "
               f"{self.held_back.max_delete}: {self.held_back.limit})"
               if self.held_back else "")
        )


@dataclass(frozen=True)
class Progress:
    """Emitted after each committed page."""

    pages: int
    records: int
    rate: float
    cursor: int | None
    complete_list_size: int | None
    token: str | None


OnPage = Callable[[Progress], None]


@dataclass(frozen=True)
class Listener:
    """Who hears about one run's harvest as it goes (the CLI's progress line)."""

    on_page: OnPage | None = None
    on_finish: Callable[[HarvestStats], None] | None = None
    on_retry: Callable[[str], None] | None = None  # one line: cause, retry n of m, wait


@dataclass(frozen=True)
class HarvestHooks:
    """What a harvest asks of its caller, each optional: `resolve_since` is called once
    the harvester's lease is held (a run that waited for another harvest of the same
    harvester starts from the since that harvest left); `is_stale(run_id)` says the
    orchestrator saw the lease holder's run end; `on_page` hears each committed page;
    `on_identify` hears the server's Identify answer as soon as it arrives (before any
    list)."""

    resolve_since: Callable[[], SinceChoice] | None = None
    is_stale: IsStale | None = None
    on_page: OnPage | None = None
    on_identify: Callable[[Identify], None] | None = None


def _identify(client: OAIClient, hooks: HarvestHooks) -> Identify:
    """The server's Identify answer, told to `hooks.on_identify` first."""
    ident = client.identify()
    if hooks.on_identify is not None:
        hooks.on_identify(ident)
    return ident



def credentials(h: Harvester) -> dict[str, Any]:
    """Client auth options from the environment variable the row names.

    The variable holds `user:password` (HTTP basic) or `Bearer <token>`. Only a variable
    of the `OAIPMH_AUTH_` namespace is read: a row naming any other (written before the
    rule, or edited by hand) fails here, before any request."""
    if not h.auth_env:
        return {}
    if not auth_env_allowed(h.auth_env):
        raise CredentialsError(
            f"harvester {h.id!r}: credentials are not read from ${h.auth_env}: "
            f"{AUTH_ENV_RULE}; nothing was sent (fix it with `oaipmh-dagster harvester "
            f"update {h.id} --auth-env {AUTH_ENV_PREFIX}...`)"
        )
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


class _Transform:
    """The store's transform function of a transformer: it uses the element the page
    parse already built, and parses the raw XML only without one. `many` (a page at
    once) is there for transformers that take batches (``xslt:``)."""

    def __init__(self, name: str) -> None:
        self.fn = get_transformer(name)
        batch = getattr(self.fn, "transform_many", None)
        if batch is not None:
            self.many = functools.partial(self._many, batch)

    def __call__(self, raw: str, element: Any = None) -> dict[str, Any]:
        if element is not None:
            return transform_element(self.fn, element)
        return transform_record(self.fn, raw.encode("utf-8"))

    @staticmethod
    def _many(batch: Callable[[list[Any]], list[Any]], items: list[tuple[str, Any]]
              ) -> list[dict[str, Any] | Exception]:
        """Each (raw, element or None)'s dict or error, in order."""
        out: list[Any] = [None] * len(items)
        parsed: list[tuple[int, Any]] = []
        for i, (raw, element) in enumerate(items):
            if element is None:
                try:
                    element = parse_metadata(raw.encode("utf-8"))
                except TransformError as exc:
                    out[i] = exc
                    continue
            parsed.append((i, element))
        for (i, _), outcome in zip(parsed, batch([e for _, e in parsed]), strict=True):
            out[i] = outcome
        return out


def make_transform(name: str) -> Callable[[str, Any], dict[str, Any]]:
    """The store's transform function for a transformer name or dotted path."""
    return _Transform(name)


def make_validate(h: Harvester) -> Validate | None:
    """The harvester's schema validation (None when it validates nothing); a schema
    that cannot be loaded fails the harvest before any request."""
    if h.schema is None:
        return None
    from oaipmh_dagster.transform.validation import SchemaError, Validator

    try:
        return Validator(h.schema)
    except SchemaError as exc:
        raise HarvestError(f"harvester {h.id!r}: {exc}") from None


def harvest(
    h: Harvester,
    store: RecordStore,
    run: RunOptions | None = None,
    *,
    run_id: str,
    options: ClientOptions | None = None,
    client: OAIClient | None = None,
    logger: logging.Logger | Any = log,
    hooks: HarvestHooks | None = None,
) -> HarvestStats:
    """Harvest `h` into `store` as `run` says (the defaults without one) and return the
    statistics; raise on failure.

    Each page is committed with its checkpoint, so a failed or killed harvest is resumed
    by the next one of the same list; a successful harvest of other lists leaves it. The
    statistics say which since the harvest may record (`next_since`) and whether it
    covered the harvester's whole selection (`covers_selection`). `hooks`: see
    `HarvestHooks`.

    When the store holds records of another selection (the URL, prefix or sets changed),
    a since a run recorded is not used (a full harvest), and the first full harvest read
    whole in one run tombstones the live records it did not see (`sweep`). A sweep
    that would tombstone more than `h.max_delete` allows raises `MassDeleteHeldBack`
    unless `run.allow_mass_delete`."""
    run = run or RunOptions()
    hooks = hooks or HarvestHooks()
    _checked(validate, h, run)
    started = time.perf_counter()
    stats = HarvestStats(harvester_id=h.id, sets=run.set_specs(h),
                         scope=incremental.scope(h.base_url, h.metadata_prefix, h.sets))
    transform = make_transform(h.transformer)
    validator = make_validate(h)
    own_client = client is None
    options = options or client_options(h)
    split = _split(store) if own_client else None
    client = client or OAIClient(h.base_url, options, logger=logger)
    saved = store.acquire(h.id, run_id, is_stale=hooks.is_stale, logger=logger)
    held_selection = (store.state(h.id) or {}).get("selection")
    delivered = None if store.has_records(h.id) else Delivered(
        keep=HANDED_OVER if split is not None else 0)
    job = _Job(h, store, run_id, client, logger, transform, validator, stats, started,
               held_selection, options, split, delivered)
    ok, keeps, selection = False, None, None
    try:
        if hooks.resolve_since is not None:
            run = run.with_since(hooks.resolve_since())
        run = _full_when_pending(run, h, job.pending, logger)
        local_start = datetime.now(UTC)  # our clock, before the server's first answer
        ident = _identify(client, hooks)
        plan = _checked(make_plan, h, run, ident, saved, local_start)
        keeps = plan.keeps
        selection = _execute(job, run, plan, ident, local_start, hooks.on_page)
        ok = stats.held_back is None
    finally:
        _close(job, ok=ok, keeps=keeps, selection=selection, own_client=own_client)
    logger.info("harvest finished: %s", stats.summary())
    if stats.held_back is not None:
        raise MassDeleteHeldBack(stats)
    return stats


def _split(store: RecordStore) -> Split | None:
    """When this harvest's lists move to a worker process: never for a store another
    process cannot open (an in-memory one) or with `$OAIPMH_HARVEST_WORKER=off`."""
    try:
        records = split_setting()
    except ValueError as exc:
        raise HarvestError(str(exc)) from None
    url = getattr(store, "worker_url", lambda: None)()
    return None if records is None or url is None else Split(records, url)


@dataclass(frozen=True)
class _Job:
    """What the steps of one harvest share once its lease is held."""

    h: Harvester
    store: RecordStore
    run_id: str
    client: OAIClient
    logger: Any
    transform: Transform
    validate: Validate | None
    stats: HarvestStats
    started: float
    held_selection: str | None  # the selection the harvest state records (None: unknown)
    options: ClientOptions
    split: Split | None  # when the lists move to a worker process (None: never)
    delivered: Delivered | None  # the store held none of the harvester's records

    @property
    def pending(self) -> bool:
        """Whether the store still holds live records of a previous selection."""
        return sweep.pending(self.held_selection, self.stats.scope)


def _execute(job: _Job, run: RunOptions, plan: Plan, ident: Identify, local_start: datetime,
             on_page: OnPage | None) -> str | None:
    """Execute `plan`: the pages, the next since, then the reconcile and sweeps after the
    lists. Returns the selection to record (see `_sweep`)."""
    h, client, stats, logger = job.h, job.client, job.stats, job.logger
    for level, note in plan.notes:
        getattr(logger, level)(note)
    _start(stats, plan, ident.response_date)
    seen: set[str] | None = (set() if job.pending and plan.mode is PlanMode.FULL
                             and not run.reconcile else None)
    skipped = client.stats.skipped_headers
    _store_pages(_ready_pages(job, plan, seen), job, plan, on_page)
    _decide_next_since(stats, plan, ident.earliest_datestamp, local_start,
                       oai_ids=bool(run.oai_ids), until=run.until_dt() is not None)
    if client.stats.skipped_headers > skipped and seen is not None:
        logger.warning("the harvest skipped headers it could not read: the records of "
                       "the previous selection are swept by a later full harvest")
        seen = None
    return _after_lists(client, h, job.store, run, stats, seen, job.run_id, logger,
                        transform=job.transform, validate=job.validate,
                        held=job.held_selection)


def _close(job: _Job, *, ok: bool, keeps: Any, selection: str | None, own_client: bool
           ) -> None:
    """The client's counts into the statistics, the lease released (recording the
    selection on success), the client closed when the harvest opened it."""
    stats, cs = job.stats, job.client.stats
    stats.requests, stats.retries = cs.requests, cs.retries
    stats.bytes, stats.stripped_chars = cs.bytes_received, cs.stripped_chars
    stats.duration = time.perf_counter() - job.started
    job.store.release(job.h.id, job.run_id, succeeded=ok, keep=keeps,
                      selection=selection if ok else None)
    if own_client:
        job.client.close()


def _full_when_pending(run: RunOptions, h: Harvester, pending: bool, logger: Any
                       ) -> RunOptions:
    """`run` as a full harvest when a sweep of a previous selection is pending and its
    since was recorded by a run (an interrupted first harvest of the new selection that
    a later run completed): only a full harvest read in one run can sweep."""
    if not (pending and run.overlap and run.since and not run.full and not run.oai_ids
            and run.until in (None, "") and covers_sets(h, run)):
        return run
    logger.warning("the store still holds records of the harvester's previous selection "
                   "(URL, prefix or sets): harvesting in full instead of from %s, so that "
                   "the records outside the new selection can be swept", run.since)
    return replace(run, since=None, full=True, overlap=False)


def _after_lists(
    client: OAIClient, h: Harvester, store: RecordStore, run: RunOptions, stats: HarvestStats,
    seen: set[str] | None, run_id: str, logger: Any, *, transform: Transform,
    validate: Validate | None, held: str | None,
) -> str | None:
    """The reconcile the run asks for, then the selection sweep (see `_sweep`); a sweep
    held back clears the checkpoint (the lists are complete). Returns `_sweep`'s."""
    if run.reconcile:
        store.save_checkpoint(h.id, run_id, None)  # the lists are complete
        stats.reconcile = reconcile_mod.reconcile(
            client, h, store, run_id=run_id, transform=transform, logger=logger,
            validate=validate, allow_mass_delete=run.allow_mass_delete)
        stats.held_back = stats.reconcile.held_back
    selection = _sweep(store, h, run, stats, seen, run_id, logger, held=held)
    if stats.held_back is not None and not run.reconcile:
        store.save_checkpoint(h.id, run_id, None)
    return selection


def _sweep(
    store: RecordStore, h: Harvester, run: RunOptions, stats: HarvestStats, seen: set[str] | None,
    run_id: str, logger: Any, *, held: str | None,
) -> str | None:
    """After the lists (and any reconcile): the selection sweep when `seen` holds what a
    complete full harvest of a changed selection saw. Returns the selection to record in
    the harvest state (None: leave it); `held`: the one recorded (None: unknown)."""
    if run.reconcile:  # a reconcile compares the whole selection, under the same cap
        return stats.scope if stats.held_back is None else None
    if seen is not None and stats.covers_selection:
        stats.selection_swept, stats.held_back = sweep.sweep_selection(
            store, h, seen, run_id=run_id, allow=run.allow_mass_delete, logger=logger)
        return stats.scope if stats.held_back is None else None
    if sweep.pending(held, stats.scope):
        stats.sweep_pending = True
        logger.warning("the store still holds live records of the harvester's previous "
                       "selection (URL, prefix or sets): the first full harvest of the new "
                       "selection that completes in one run tombstones them (subject to "
                       "max_delete %s)", h.max_delete)
        return None
    return stats.scope if held is None and stats.covers_selection else None


def _checked(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)`, its `PlanError` raised as the `HarvestError` callers expect."""
    try:
        return fn(*args)
    except PlanError as exc:
        raise HarvestError(str(exc)) from None


def _start(stats: HarvestStats, plan: Plan, response_date: datetime) -> None:
    """The statistics a plan decides before the first page."""
    stats.mode = plan.mode.value  # a plain str: Dagster's metadata serializes no enum
    stats.granularity = plan.granularity.value
    stats.response_date = format_datestamp(response_date, plan.granularity)
    stats.since, stats.until = plan.since, plan.until
    if plan.resume is not None:
        stats.resumed_from_token = plan.resume.token


def _store_pages(pages: Iterator[ReadyPage], job: _Job, plan: Plan,
                 on_page: OnPage | None) -> None:
    """The page loop: each prepared page is committed with its checkpoint by the
    committer while the next is prepared; each is counted, logged and reported once
    committed."""
    report = _Report(job.stats, not plan.windowed, on_page, job.logger, job.started)
    commit = functools.partial(_commit, job.store, job.h.id, job.run_id)
    with Committer(commit, COMMIT_DEPTH, lambda items: commit(*items)) as committer:
        for ready in pages:
            for done in committer.submit(ready):
                report.committed(done)
        for done in committer.finish():
            report.committed(done)


def _commit(store: RecordStore, harvester_id: str, run_id: str, *ready: ReadyPage) -> None:
    """Commit prepared pages in one transaction with the checkpoint of the last that has
    one (in the committer's thread): the state one commit per page would leave."""
    checkpoint = next((r.checkpoint for r in reversed(ready) if r.checkpoint is not None),
                      None)
    commit_pages(store, harvester_id, [r.prepared for r in ready], run_id=run_id,
                 checkpoint=checkpoint)


class _Report:
    """Each committed page into the statistics, the log (the first and last page, and
    one every `LOG_EVERY` seconds between) and `on_page`. `whole_lists`: a page's
    completeListSize is the harvest's (not a window's part)."""

    def __init__(self, stats: HarvestStats, whole_lists: bool, on_page: OnPage | None,
                 logger: Any, started: float) -> None:
        self.stats, self.whole_lists, self.on_page = stats, whole_lists, on_page
        self.logger, self.started, self.logged = logger, started, 0.0

    def committed(self, ready: ReadyPage) -> None:
        stats = self.stats
        stats.counts.add(ready.prepared.counts)
        stats.pages += 1
        if ready.complete_list_size is not None and self.whole_lists:
            stats.complete_list_size = ready.complete_list_size  # a window's is partial
        elapsed = time.perf_counter() - self.started
        records, token = stats.records, ready.token
        event = Progress(
            pages=stats.pages, records=records, rate=records / elapsed if elapsed else 0.0,
            cursor=ready.cursor,
            complete_list_size=stats.complete_list_size, token=token,
        )
        if stats.pages == 1 or token is None or elapsed - self.logged >= LOG_EVERY:
            self.logged = elapsed
            self.logger.info(
                "page %d: %d records so far (%.0f/s)%s", event.pages, event.records,
                event.rate, f", cursor {event.cursor} of {event.complete_list_size}"
                if event.cursor is not None else "",
            )
        if self.on_page is not None:
            self.on_page(event)


def _ready_pages(job: _Job, plan: Plan, seen: set[str] | None) -> Iterator[ReadyPage]:
    """The plan's pages, prepared; a long sequential harvest continues in a worker
    process (`worker`) from the page that showed it is long. `seen` (when given)
    collects every identifier delivered."""
    client, h, logger = job.client, job.h, job.logger
    if plan.oai_ids:
        yield from _prepared(job, ((p, None) for p in _get_records(
            client, h, list(plan.oai_ids))), seen)
        return
    if plan.windowed:
        pages = _windowed(client, h, plan, logger)
        yield from _prepared(job, _distinct(pages) if len(plan.sets) > 1 else pages, seen)
        return
    split = job.split
    lists = Lists(client, h, plan, job.stats, logger,
                  due=split.due if split is not None else None)
    position = None
    listed = lists.pages()
    try:
        for page, cp in listed:
            yield from _prepared(job, [(page, cp)], seen)
            if split is not None and cp is not None and lists.tally is not None \
                    and split.due(lists.tally, lists.delivered):
                position = lists.position(cp)
                break
    finally:
        listed.close()
    if position is not None:
        yield from _in_worker(job, plan, position, seen)


def _prepared(job: _Job, pages: Iterable[tuple[Page, Checkpoint | None]],
              seen: set[str] | None) -> Iterator[ReadyPage]:
    """Each page prepared here: hashes, rows, transform, validation."""
    h = job.h
    for page, cp in pages:
        if seen is not None:
            seen.update(r.header.identifier for r in page.records)
        prepared = prepare_page(job.store, h.id, page.records, run_id=job.run_id,
                                transform=job.transform, metadata_prefix=h.metadata_prefix,
                                transformer=h.transformer, validate=job.validate,
                                delivered=job.delivered)
        yield ReadyPage.of(page, prepared, None if cp is None else cp.to_json())


def _in_worker(job: _Job, plan: Plan, position: Position, seen: set[str] | None
               ) -> Iterator[ReadyPage]:
    """The rest of the lists from `position`, prepared by a worker process."""
    assert job.split is not None
    remaining = position.tally.remaining
    job.logger.info(
        "the list %s: its pages are fetched, parsed and prepared in a worker process "
        "from here (%s=%s)", f"announces {remaining} more records" if remaining is not None
        else f"is long ({position.checkpoint.records} records so far)", WORKER_ENV,
        job.split.records)
    delivered = job.delivered.kept if job.delivered is not None else None
    spec = Spec(job.h, plan, position, job.options, job.split.url, job.run_id,
                identifiers=seen is not None,
                delivered=tuple(delivered) if delivered is not None else None,
                debug=bool(getattr(job.logger, "isEnabledFor", lambda _: False)(
                    logging.DEBUG)))
    worker = Worker(spec, job.logger)
    try:
        for ready in worker.pages():
            if seen is not None and ready.identifiers:
                seen.update(ready.identifiers)
            yield ready
    finally:
        worker.close()
        end = worker.end
        if end is not None:
            job.stats.short_lists.extend(end.judged.short_lists)
            job.stats.lists_judged += end.judged.lists_judged
            job.client.stats.add(**end.client)


def _distinct(
    pages: Iterator[tuple[Page, Checkpoint | None]],
) -> Iterator[tuple[Page, Checkpoint | None]]:
    """Drop records an earlier page of this harvest already delivered (a record in
    several of the harvested sets); `page.duplicates_dropped` counts them."""
    seen: set[str] = set()
    for page, cp in pages:
        yield drop_seen(page, seen), cp


def _decide_next_since(
    stats: HarvestStats, plan: Plan, earliest: datetime | None, local_start: datetime, *,
    oai_ids: bool, until: bool,
) -> None:
    """Fill in `next_since`, `covers_selection` and `since_note` of a finished harvest
    (`local_start`: our clock when it asked for Identify)."""
    decided = incremental.next_since(
        plan.list_start, plan.granularity, previous=plan.since_in_force, now=local_start,
        earliest=earliest,
        resumed_start=plan.resumed_list_start if plan.mode is PlanMode.RESUMED else None)
    reasons = []
    if oai_ids:
        reasons.append("it fetched chosen identifiers only")
    if until:
        reasons.append("it was bounded by until")
    if not plan.covers_sets:
        reasons.append("it harvested other sets than the harvester's")
    reasons.extend(describe_short(item) for item in stats.short_lists)
    stats.covers_selection = not reasons
    stats.next_since = decided.value
    notes = [f"since does not advance: {', '.join(reasons)}"] if reasons else []
    if decided.note:
        notes.append(decided.note)
    stats.since_note = "; ".join(notes)


def _windowed(
    client: OAIClient, h: Harvester, plan: Plan, logger: Any,
) -> Iterator[tuple[Page, Checkpoint | None]]:
    """Date windows harvested concurrently (up to the harvester's `max_parallel`); each
    page comes with a checkpoint of every window's state, so a failed run resumes only
    the unfinished windows. The outer windows are open-ended where the harvest is (no
    `from` on a full harvest, no `until` without one), so records dated before the
    server's earliestDatestamp or after its responseDate are still harvested."""
    assert plan.windows is not None and plan.window_range is not None
    gran = plan.granularity
    units: dict[str, WindowState] = {u.key: replace(u) for u in plan.windows}
    if plan.mode is PlanMode.RESUMED:
        logger.info("resuming the interrupted windowed harvest: %d of %d windows done",
                    sum(u.done for u in units.values()), len(units))
    start, end = plan.window_range
    logger.info("windowed harvest with up to %d parallel requests from %s to %s",
                h.max_parallel, format_datestamp(start, gran), format_datestamp(end, gran))

    def snapshot() -> WindowedCheckpoint:
        return WindowedCheckpoint(h.metadata_prefix, plan.sets, plan.since, plan.until,
                                  plan.checkpoint_start, gran, tuple(units.values()))

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
        assert page is not None
        u.token = page.token
        u.done = page.token is None
        yield page, snapshot()


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
    return Page(records=records, resumption_token=None, response_date=datetime.now(UTC),
                request_url="", verb="GetRecord", params={})
