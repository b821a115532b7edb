"""Windowed parallel harvesting: date windows fetched concurrently within one run.

Workers take windows from a shared queue and page through them; the caller consumes
the pages in one thread (the store stays single-writer). A window whose first page
announces more than `split_pages` pages is cut into smaller windows instead (its first
page is dropped and fetched again later), so skewed repositories still spread over the
workers. The per-host limit of the OAI client caps the requests in flight."""

from __future__ import annotations

import math
import queue
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from oaipmh_dagster.harvesting.windows import WindowState, split
from oaipmh_dagster.oai import Granularity, OAIClient, Page
from oaipmh_dagster.stopping import Stop

SPLIT_PAGES = 10
MAX_SPLIT = 128
MAX_DEPTH = 6
JOIN_AFTER_STOP = 30.0  # seconds each worker gets to end once stopped


@dataclass
class Event:
    """A page of a unit, or the split of a unit into smaller ones."""

    unit: WindowState
    page: Page | None = None
    split_into: list[WindowState] = field(default_factory=list)


class _Stop(Exception):
    pass


def harvest_windows(
    client: OAIClient, metadata_prefix: str, units: list[WindowState], *, workers: int,
    granularity: Granularity, logger: Any, split_pages: int = SPLIT_PAGES,
) -> Iterator[Event]:
    """Fetch every unfinished unit with `workers` threads; yield events in arrival order.

    Raises the first worker error after stopping the others."""
    pool = _Pool(client, metadata_prefix, units, workers=workers, granularity=granularity,
                 split_pages=split_pages)
    return pool.events()


class _Pool:
    """The worker threads of one windowed harvest and the queue of their events."""

    def __init__(self, client: OAIClient, metadata_prefix: str, units: list[WindowState], *,
                 workers: int, granularity: Granularity, split_pages: int) -> None:
        self.client = client
        self.metadata_prefix = metadata_prefix
        self.workers = workers
        self.granularity = granularity
        self.split_pages = split_pages
        self.todo: deque[WindowState] = deque(u for u in units if not u.done)
        self.lock = threading.Lock()
        self.out: queue.Queue[Event] = queue.Queue(maxsize=max(2, workers * 2))
        self.stop = Stop()
        self.active = 0
        self.errors: list[BaseException] = []

    def events(self) -> Iterator[Event]:
        """Start the workers; the events as they come; stop the workers on leaving."""
        threads = [threading.Thread(target=self.worker, name=f"oai-window-{i}", daemon=True)
                   for i in range(self.workers)]
        for t in threads:
            t.start()
        try:
            while True:
                if self.errors:
                    raise self.errors[0]
                try:
                    event = self.out.get(timeout=0.2)
                except queue.Empty:
                    if not any(t.is_alive() for t in threads) and self.out.empty():
                        if self.errors:
                            raise self.errors[0] from None
                        return
                    continue
                yield event
        finally:
            # Stopped early (an error, Ctrl-C): end the workers' requests and back-off
            # waits instead of waiting for a slow server.
            self.stop.end(threads, timeout=JOIN_AFTER_STOP, cancel=self.client.cancel)

    def put(self, event: Event) -> None:
        """Hand `event` to the consumer; `_Stop` once the harvest stops."""
        if not self.stop.put(self.out, event):
            raise _Stop

    def run_unit(self, u: WindowState) -> None:
        """Page through `u` (from its checkpointed token, if any: the client restarts the
        window from its bounds when the server rejects it); the window's first page,
        before any other went out, may split it instead."""
        start_from, end = u.window.bounds(self.granularity)
        first = True
        for page in self.client.iter_pages(
                "ListRecords", metadata_prefix=self.metadata_prefix,
                set_spec=u.window.set_spec, from_=start_from, until=end,
                resumption_token=u.token):
            first = first and "resumptionToken" not in page.params
            if first and page.token and u.depth < MAX_DEPTH and self.split(u, page):
                return
            first = False
            self.put(Event(u, page=page))
            if self.stop.is_set():
                raise _Stop

    def split(self, u: WindowState, page: Page) -> bool:
        """Cut `u` into smaller windows queued first when its first page says it is
        long; whether it was cut."""
        pieces = _pieces(page, self.split_pages, u.depth, self.workers)
        if pieces <= 1:
            return False
        parts = split(u.window, pieces, self.granularity)
        if len(parts) <= 1:
            return False
        new = [WindowState(w, w.key(self.granularity), depth=u.depth + 1) for w in parts]
        with self.lock:
            self.todo.extendleft(reversed(new))
        self.put(Event(u, split_into=new))
        return True

    def take(self) -> tuple[WindowState | None, bool]:
        """The next unit to fetch (counted active; None when none is queued now), and
        whether nothing more can come (nothing queued, no worker fetching)."""
        with self.lock:
            if not self.todo:
                return None, self.active == 0
            self.active += 1
            return self.todo.popleft(), False

    def worker(self) -> None:
        try:
            while not self.stop.is_set():
                u, finished = self.take()
                if finished:
                    return
                if u is None:
                    self.stop.wait(0.05)
                    continue
                try:
                    self.run_unit(u)
                finally:
                    with self.lock:
                        self.active -= 1
        except _Stop:
            return
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            self.errors.append(exc)
            self.stop.set()


def _pieces(page: Page, split_pages: int, depth: int, workers: int) -> int:
    """How many windows a list of this size should become (1 = keep it)."""
    rt = page.resumption_token
    per_page = max(1, len(page.records))
    if rt is None or rt.complete_list_size is None:
        # Size unknown: cut the whole range once into a few windows per worker.
        return workers * 4 if depth == 0 else 1
    pages = math.ceil(rt.complete_list_size / per_page)
    if pages <= split_pages:
        return 1
    # Aim at half the threshold, so uneven windows rarely need a second split (each
    # split throws away the first page it fetched).
    return min(MAX_SPLIT, math.ceil(2 * pages / split_pages))
