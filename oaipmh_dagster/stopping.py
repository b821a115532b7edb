"""One stop rule for the harvest's own threads: the prefetch of the next page
(`oai._paging`), the committer (`committer.py`) and the window workers (`parallel.py`).

The thread that consumes their work owns a `Stop`. Leaving, it sets it; when a thread
still runs, it cancels what that thread has in flight (when it can be cancelled), then
joins each thread for a bounded time. The threads are daemons and poll the stop in
their waits, so one stuck in a step that cannot be cut short (name resolution, a stuck
database) never holds up the process's exit.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable
from typing import TypeVar

__all__ = ["Stop"]

T = TypeVar("T")

POLL = 0.2  # seconds between looks at the stop while waiting on a full queue


class Stop:
    """A stop signal that the consumer sets and its threads poll."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, seconds: float) -> bool:
        """Wait up to `seconds` for the stop; whether it is set."""
        return self._event.wait(seconds)

    def put(self, q: queue.Queue[T], item: T) -> bool:
        """Put `item` on `q`, waiting while `q` is full; False when stopped first."""
        while not self._event.is_set():
            try:
                q.put(item, timeout=POLL)
                return True
            except queue.Full:
                continue
        return False

    def end(self, threads: Iterable[threading.Thread], *, timeout: float | None,
            cancel: Callable[[], None] | None = None) -> bool:
        """Set the stop; when a thread still runs, `cancel()` what is in flight; join
        each thread for at most `timeout` seconds (None: until it ends). Whether every
        thread has ended."""
        self._event.set()
        threads = list(threads)
        if cancel is not None and any(t.is_alive() for t in threads):
            cancel()
        for t in threads:
            t.join(timeout)
        return not any(t.is_alive() for t in threads)
