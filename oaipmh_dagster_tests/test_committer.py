"""The committer: commits in order in its own thread, a bounded number of items behind
the caller, and hands a failed commit's error back to the caller."""

from __future__ import annotations

import threading
import time

import pytest

from oaipmh_dagster.committer import Committer


def test_commits_in_order_and_reports_each_item_once() -> None:
    done: list[int] = []
    seen: list[int] = []
    with Committer(done.append) as committer:
        for i in range(50):
            seen += committer.submit(i)
        seen += committer.finish()
    assert done == list(range(50))
    assert seen == list(range(50))


def test_commits_run_in_another_thread_while_the_caller_goes_on() -> None:
    release = threading.Event()
    threads: list[str] = []

    def commit(item: int) -> None:
        threads.append(threading.current_thread().name)
        release.wait(5)

    with Committer(commit, depth=1) as committer:
        started = time.monotonic()
        committer.submit(1)  # committing, held
        committer.submit(2)  # waiting in the queue
        assert time.monotonic() - started < 1  # neither call waited for a commit
        release.set()
        committer.finish()
    assert threads == ["oaipmh-committer"] * 2


def test_the_caller_waits_when_depth_items_wait() -> None:
    release = threading.Event()
    with Committer(lambda item: release.wait(5), depth=1) as committer:
        committer.submit(1)
        committer.submit(2)
        blocked = threading.Thread(target=committer.submit, args=(3,))
        blocked.start()
        blocked.join(0.3)
        assert blocked.is_alive()  # 1 committing, 2 queued: 3 waits
        release.set()
        blocked.join(5)
        assert not blocked.is_alive()
        committer.finish()


def test_a_failed_commit_is_raised_and_nothing_after_it_is_committed() -> None:
    done: list[int] = []

    def commit(item: int) -> None:
        if item == 3:
            raise RuntimeError("lease lost")
        done.append(item)

    committer = Committer(commit)
    with pytest.raises(RuntimeError, match="lease lost"), committer:
        for i in range(10):
            committer.submit(i)
        committer.finish()
    assert done == [0, 1, 2]


def test_items_handed_over_before_the_callers_error_are_committed() -> None:
    done: list[int] = []

    def commit(item: int) -> None:
        time.sleep(0.05)
        done.append(item)

    with pytest.raises(ValueError, match="fetch failed"), Committer(commit) as committer:
        committer.submit(1)
        committer.submit(2)
        raise ValueError("fetch failed")
    assert done == [1, 2]


def test_an_error_does_not_wait_for_a_stuck_commit(monkeypatch: pytest.MonkeyPatch) -> None:
    import oaipmh_dagster.committer as committer_mod

    monkeypatch.setattr(committer_mod, "ABANDON_AFTER", 0.3)
    stuck = threading.Event()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt), Committer(lambda item: stuck.wait(30)) as committer:
        committer.submit(1)  # committing, stuck
        committer.submit(2)  # waiting
        raise KeyboardInterrupt
    assert time.monotonic() - started < 5
    stuck.set()
