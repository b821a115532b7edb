"""The pages of a sequential harvest: one list after another (one per set), each page
with the checkpoint to save with it, the tally that judges a list that ended short, and
what a page becomes once prepared for its commit (`ReadyPage`).

`Lists` runs in the harvest's process, or in a worker process that continues it from a
page boundary (`worker`): its position after each page is what a worker is started from.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from oaipmh_dagster.harvesting.plan import ListCheckpoint, Plan
from oaipmh_dagster.harvesting.rows import PreparedPage
from oaipmh_dagster.oai import OAIClient, Page, drop_seen
from oaipmh_dagster.storage.registry import Harvester

__all__ = ["Due", "Judged", "ListTally", "Lists", "Position", "ReadyPage", "describe_short"]


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

    @property
    def remaining(self) -> int | None:
        """Headers the list announced that have not come yet (None: unknown)."""
        if self.announced is None or self.offset is None:
            return None
        return max(0, self.announced - self.offset - self.received)

    def short(self) -> dict[str, Any] | None:
        """What was announced and received when the list ended short, else None."""
        if self.announced is None or self.offset is None:
            return None
        received = self.offset + self.received
        if received >= self.announced:
            return None
        return {"set": self.set_spec, "announced": self.announced, "received": received}


class _Judges(Protocol):
    short_lists: list[dict[str, Any]]
    lists_judged: int


@dataclass
class Judged:
    """The lists judged (`HarvestStats` has the same two fields)."""

    short_lists: list[dict[str, Any]] = field(default_factory=list)
    lists_judged: int = 0


@dataclass(frozen=True)
class ReadyPage:
    """A page prepared for its commit (rows, counts) with its checkpoint's JSON and what
    its progress report needs; `identifiers`: every record it delivered, when asked for
    (a selection sweep)."""

    prepared: PreparedPage
    checkpoint: dict[str, Any] | None
    token: str | None
    cursor: int | None
    complete_list_size: int | None
    identifiers: list[str] | None = None

    @classmethod
    def of(cls, page: Page, prepared: PreparedPage, checkpoint: dict[str, Any] | None,
           identifiers: list[str] | None = None) -> ReadyPage:
        rt = page.resumption_token
        return cls(prepared, checkpoint, page.token, rt.cursor if rt else None,
                   rt.complete_list_size if rt else None, identifiers)


@dataclass(frozen=True)
class Position:
    """Where a sequential harvest stands after a page that has a token: what a worker
    continues from (the checkpoint of that page, the open list's tally, and the
    identifiers delivered so far when the harvest's lists are de-duplicated)."""

    checkpoint: ListCheckpoint
    tally: ListTally
    seen: frozenset[str] | None = None


Due = Callable[[ListTally, int], bool]
"""Whether the harvest stops here to hand its lists over, after a page: the open list's
tally and the records delivered so far (`worker.Split.due`)."""


class Lists:
    """The plan's lists, one after another, from the plan's resume point or from
    `start`; `judged` hears each list that ends (a short one is logged). With `due`,
    nothing is fetched ahead of a page after which it is true (`hands_over`)."""

    def __init__(self, client: OAIClient, h: Harvester, plan: Plan, judged: _Judges,
                 logger: Any, start: Position | None = None, due: Due | None = None
                 ) -> None:
        self.client, self.h, self.plan, self.judged, self.logger = (
            client, h, plan, judged, logger)
        self.start, self.due = start, due
        self.delivered = 0  # records delivered by this object's pages
        self.tally: ListTally | None = start.tally if start else None
        self.seen: set[str] | None = (set(start.seen or ()) if start else set()
                                      ) if len(plan.sets) > 1 else None

    def pages(self) -> Generator[tuple[Page, ListCheckpoint | None], None, None]:
        """Each page with its checkpoint, which keeps the start of the earliest list it
        continues; records another set's list already delivered are dropped."""
        h, plan = self.h, self.plan
        cp = self.start.checkpoint if self.start else plan.resume
        delivered, records = (cp.pages, cp.records) if self.start and cp else (0, 0)
        for set_spec, page in self._list_pages():
            delivered, records = delivered + 1, records + len(page.records)
            self.delivered += len(page.records)
            if self.seen is not None:
                page = drop_seen(page, self.seen)
            if self.tally is None or "resumptionToken" not in page.params:
                self.tally = ListTally.start(set_spec, page)
            self.tally.add(page)
            token = page.token
            if token is None:
                judge(self.tally, self.judged, self.logger)
                self.tally = None
            yield page, None if token is None else ListCheckpoint(
                token, set_spec, h.metadata_prefix, plan.since, plan.until,
                plan.checkpoint_start, delivered, records)

    def _tally_after(self, page: Page) -> ListTally:
        """The open list's tally as it will be once `page` is counted."""
        if self.tally is None or "resumptionToken" not in page.params:
            return ListTally.start(None, page)
        return replace(self.tally)

    def hands_over(self, page: Page) -> bool:
        """Whether `due` will be true once `page` is counted (a page with a token)."""
        if self.due is None or page.token is None:
            return False
        tally = self._tally_after(page)
        tally.add(page)
        return self.due(tally, self.delivered + len(page.records))

    def position(self, cp: ListCheckpoint) -> Position:
        """Where the harvest stands after the page whose checkpoint is `cp`."""
        assert self.tally is not None
        return Position(cp, self.tally,
                        frozenset(self.seen) if self.seen is not None else None)

    def _list_pages(self) -> Iterator[tuple[str | None, Page]]:
        """The ListRecords pages, each with the set it belongs to."""
        h, plan = self.h, self.plan
        sets: list[str | None] = list(plan.sets) or [None]
        first, token = 0, None
        point = self.start.checkpoint if self.start else plan.resume
        if point is not None:
            first, token = sets.index(point.set_spec), point.token
            if self.start is None:
                self.logger.info("resuming the interrupted harvest after page %s (%s "
                                 "records) with token %r", point.pages, point.records,
                                 point.token)
        for set_spec in sets[first:]:
            # A rejected token restarts the list from these arguments (the client).
            for page in self.client.iter_pages(
                    "ListRecords", metadata_prefix=h.metadata_prefix, set_spec=set_spec,
                    from_=plan.since, until=plan.until, resumption_token=token,
                    hold=self.hands_over if self.due is not None else None):
                yield set_spec, page
            token = None


def judge(tally: ListTally, judged: _Judges, logger: Any) -> None:
    """Note a finished list that delivered fewer headers than it announced."""
    if tally.announced is None or tally.offset is None:
        return
    judged.lists_judged += 1
    short = tally.short()
    if short is not None:
        judged.short_lists.append(short)
        logger.warning("%s: the records that went missing are not harvested, so since does "
                       "not advance and the next harvest asks again from the same since",
                       describe_short(short))
