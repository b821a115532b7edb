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

from oaipmh_dagster.oai import Granularity, OAIClient, Page
from oaipmh_dagster.windows import WindowState, split

SPLIT_PAGES = 10
MAX_SPLIT = 128
MAX_DEPTH = 6


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
    todo: deque[WindowState] = deque(u for u in units if not u.done)
    lock = threading.Lock()
    out: queue.Queue[Event] = queue.Queue(maxsize=max(2, workers * 2))
    stop = threading.Event()
    active = [0]
    errors: list[BaseException] = []

    def put(event: Event) -> None:
        while not stop.is_set():
            try:
                out.put(event, timeout=0.2)
                return
            except queue.Full:
                continue
        raise _Stop

    def run_unit(u: WindowState) -> None:
        """Page through `u` (from its checkpointed token, if any: the client restarts the
        window from its bounds when the server rejects it); the window's first page,
        before any other went out, may split it instead."""
        start_from, end = u.window.bounds(granularity)
        first = True
        for page in client.iter_pages("ListRecords", metadata_prefix=metadata_prefix,
                                      set_spec=u.window.set_spec, from_=start_from, until=end,
                                      resumption_token=u.token):
            first = first and "resumptionToken" not in page.params
            if first and page.token and u.depth < MAX_DEPTH:
                pieces = _pieces(page, split_pages, u.depth, workers)
                if pieces > 1:
                    parts = split(u.window, pieces, granularity)
                    if len(parts) > 1:
                        new = [WindowState(w, w.key(granularity), depth=u.depth + 1) for w in parts]
                        with lock:
                            todo.extendleft(reversed(new))
                        put(Event(u, split_into=new))
                        return
            first = False
            put(Event(u, page=page))
            if stop.is_set():
                raise _Stop

    def worker() -> None:
        try:
            while not stop.is_set():
                with lock:
                    if not todo:
                        if active[0] == 0:
                            return
                        u = None
                    else:
                        u = todo.popleft()
                        active[0] += 1
                if u is None:
                    stop.wait(0.05)
                    continue
                try:
                    run_unit(u)
                finally:
                    with lock:
                        active[0] -= 1
        except _Stop:
            return
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=worker, name=f"oai-window-{i}", daemon=True)
               for i in range(workers)]
    for t in threads:
        t.start()
    try:
        while True:
            if errors:
                raise errors[0]
            try:
                event = out.get(timeout=0.2)
            except queue.Empty:
                if not any(t.is_alive() for t in threads) and out.empty():
                    if errors:
                        raise errors[0] from None
                    return
                continue
            yield event
    finally:
        stop.set()
        if any(t.is_alive() for t in threads):
            # Stopped early (an error, Ctrl-C): end the workers' requests and back-off
            # waits instead of waiting for a slow server.
            client.cancel()
        for t in threads:
            t.join(timeout=30)


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
