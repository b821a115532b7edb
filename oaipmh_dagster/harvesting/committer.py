"""The harvest's last stage in a thread of its own: prepared pages are committed in
order, one at a time, while the caller prepares the next page (and the client fetches
and parses the one after). The database's work then overlaps with ours instead of
following it. The caller hands over at most `depth` pages ahead of the commit in
progress, so memory stays bounded, and reads back what was committed in its own thread
(statistics, logging and progress callbacks never run in the committer)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from oaipmh_dagster.stopping import Stop

__all__ = ["Committer"]

T = TypeVar("T")
_STOP = object()
ABANDON_AFTER = 10.0  # seconds the pages handed over get to commit after an error


class Committer(Generic[T]):
    """`commit(item)` for each submitted item, in order, in one daemon thread.

    `submit` returns the items committed since the last call and raises the error of a
    failed commit (nothing after a failed commit is committed). Leaving the `with`
    block waits for the commits already handed over, so every page handed over before a
    failure is committed, as it would be without the thread.

    With `group`, the items waiting when a commit ends (up to `depth`) are committed
    together by `group(items)`: a writer that falls behind catches up with fewer,
    larger transactions."""

    def __init__(self, commit: Callable[[T], None], depth: int = 1,
                 group: Callable[[list[T]], None] | None = None) -> None:
        self._commit = commit
        self._group = group
        self._todo: queue.Queue[object] = queue.Queue(maxsize=depth)
        self._done: queue.Queue[T] = queue.Queue()
        self._error: BaseException | None = None
        self._stop = Stop()
        self._thread = threading.Thread(target=self._run, name="oaipmh-committer",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            items, stop = self._take()
            if items and self._error is None:  # else drained, never committed
                try:
                    if len(items) == 1:
                        self._commit(items[0])
                    else:
                        assert self._group is not None
                        self._group(items)
                except BaseException as exc:  # noqa: BLE001 - handed to the caller
                    self._error = exc
                else:
                    for item in items:
                        self._done.put(item)
            if stop:
                return

    def _take(self) -> tuple[list[T], bool]:
        """The next item, and (with `group`) those already waiting behind it; whether
        the stop came after them."""
        first = self._todo.get()
        if first is _STOP:
            return [], True
        items: list[T] = [first]  # type: ignore[list-item]
        while self._group is not None:
            try:
                item = self._todo.get_nowait()
            except queue.Empty:
                break
            if item is _STOP:
                return items, True
            items.append(item)  # type: ignore[arg-type]
        return items, False

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def committed(self) -> list[T]:
        """The items committed since the last call, in order."""
        out = []
        while True:
            try:
                out.append(self._done.get_nowait())
            except queue.Empty:
                return out

    def submit(self, item: T) -> list[T]:
        """Hand `item` over (waiting while `depth` items wait); the items committed so far."""
        self._raise()
        self._todo.put(item)
        return self.committed()

    def finish(self) -> list[T]:
        """Wait for every commit; the items committed since the last call."""
        self._close()
        self._raise()
        return self.committed()

    def _close(self, wait: float | None = None) -> None:
        """Stop the thread after the items handed over; with `wait`, give up waiting
        after that many seconds (the thread is a daemon)."""
        if not self._thread.is_alive():
            return
        try:
            self._todo.put(_STOP, timeout=wait)
        except queue.Full:
            return
        self._stop.end([self._thread], timeout=wait)

    def __enter__(self) -> Committer[T]:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        # After the caller's error (an interrupt included), the pages already handed over
        # get a bounded time to commit: the error must not wait on a stuck database.
        self._close(None if exc_type is None else ABANDON_AFTER)
