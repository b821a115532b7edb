"""The one stop rule of the harvest's threads (prefetch, committer, window workers)."""

from __future__ import annotations

import queue
import threading

from oaipmh_dagster.stopping import Stop


def test_put_gives_up_on_a_full_queue_once_stopped() -> None:
    stop, q = Stop(), queue.Queue[int](maxsize=1)
    assert stop.put(q, 1) and q.get_nowait() == 1
    q.put(2)
    result: list[bool] = []
    putter = threading.Thread(target=lambda: result.append(stop.put(q, 3)), daemon=True)
    putter.start()
    stop.set()
    putter.join(10)
    assert result == [False] and q.get_nowait() == 2 and q.empty()


def test_end_cancels_a_running_thread_and_joins_it() -> None:
    stop, cancelled = Stop(), threading.Event()
    worker = threading.Thread(target=cancelled.wait, args=(10,), daemon=True)
    worker.start()
    assert stop.end([worker], timeout=10, cancel=cancelled.set)
    assert stop.is_set() and cancelled.is_set() and not worker.is_alive()


def test_end_does_not_cancel_when_every_thread_has_ended() -> None:
    stop, calls = Stop(), []
    done = threading.Thread(target=lambda: None)
    done.start()
    done.join()
    assert stop.end([done], timeout=1, cancel=lambda: calls.append(1))
    assert calls == []


def test_end_reports_a_thread_that_outlives_its_bounded_join() -> None:
    stop, release = Stop(), threading.Event()
    stuck = threading.Thread(target=release.wait, args=(30,), daemon=True)
    stuck.start()
    try:
        assert not stop.end([stuck], timeout=0.01)
    finally:
        release.set()
        stuck.join(10)
