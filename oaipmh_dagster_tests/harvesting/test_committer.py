"""The committer: commits in order in its own thread, a bounded number of items behind
the caller, and hands a failed commit's error back to the caller."""

from __future__ import annotations

import threading
import time

import pytest

from oaipmh_dagster.harvesting.committer import Committer

WAIT = 60.0  # an upper bound on any wait below: reached only when the committer is broken


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
    finished: list[int] = []

    def commit(item: int) -> None:
        threads.append(threading.current_thread().name)
        release.wait(WAIT)
        finished.append(item)

    with Committer(commit, depth=1) as committer:
        committer.submit(1)  # committing, held
        committer.submit(2)  # waiting in the queue
        assert finished == []  # neither call waited for a commit to end
        release.set()
        committer.finish()
    assert threads == ["oaipmh-committer"] * 2 and finished == [1, 2]


def test_the_caller_waits_when_depth_items_wait() -> None:
    release = threading.Event()
    committing = threading.Event()
    returned: list[int] = []

    def commit(item: int) -> None:
        committing.set()
        release.wait(WAIT)

    with Committer(commit, depth=1) as committer:
        committer.submit(1)
        assert committing.wait(WAIT)  # 1 is committing, held
        committer.submit(2)  # 2 queued: the queue is full

        def submit_3() -> None:
            committer.submit(3)
            returned.append(3)

        blocked = threading.Thread(target=submit_3)
        blocked.start()
        blocked.join(0.3)
        assert blocked.is_alive() and returned == []  # 3 waits
        release.set()
        blocked.join(WAIT)
        assert not blocked.is_alive() and returned[-1] == 3
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


def test_items_handed_over_before_the_callers_error_are_committed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import oaipmh_dagster.harvesting.committer as committer_mod

    monkeypatch.setattr(committer_mod, "ABANDON_AFTER", WAIT)  # never reached here
    done: list[int] = []

    def commit(item: int) -> None:
        time.sleep(0.05)  # slow commits: the error comes while they are still pending
        done.append(item)

    with pytest.raises(ValueError, match="fetch failed"), Committer(commit) as committer:
        committer.submit(1)
        committer.submit(2)
        raise ValueError("fetch failed")
    assert done == [1, 2]


def test_an_error_does_not_wait_for_a_stuck_commit(monkeypatch: pytest.MonkeyPatch) -> None:
    """After the caller's error, the `with` block gives the stuck commit ABANDON_AFTER
    seconds, then leaves it behind: the commit is still stuck when the error comes out."""
    import oaipmh_dagster.harvesting.committer as committer_mod

    monkeypatch.setattr(committer_mod, "ABANDON_AFTER", 0.3)
    stuck = threading.Event()
    entered = threading.Event()
    ended: list[int] = []

    def commit(item: int) -> None:
        entered.set()
        stuck.wait(WAIT)
        ended.append(item)

    with pytest.raises(KeyboardInterrupt), Committer(commit) as committer:
        committer.submit(1)  # committing, stuck
        committer.submit(2)  # waiting
        assert entered.wait(WAIT)
        raise KeyboardInterrupt
    assert ended == []  # the stuck commit was left behind, not awaited
    stuck.set()


def test_items_that_wait_behind_a_commit_are_committed_together_in_order() -> None:
    release = threading.Event()
    committing = threading.Event()
    calls: list[list[int]] = []

    def commit(item: int) -> None:
        calls.append([item])
        committing.set()
        release.wait(WAIT)

    seen: list[int] = []
    with Committer(commit, depth=3, group=calls.append) as committer:
        seen += committer.submit(1)
        assert committing.wait(WAIT)  # 1 is committing, held
        for i in (2, 3, 4):
            seen += committer.submit(i)  # all three wait behind it
        release.set()
        seen += committer.finish()
    assert calls == [[1], [2, 3, 4]] and seen == [1, 2, 3, 4]


def test_a_failed_group_commits_none_of_its_items() -> None:
    release = threading.Event()
    committing = threading.Event()
    done: list[int] = []

    def commit(item: int) -> None:
        committing.set()
        release.wait(WAIT)
        done.append(item)

    def group(items: list[int]) -> None:
        raise ValueError(f"group {items} failed")

    with pytest.raises(ValueError, match=r"group \[2, 3\] failed"), \
            Committer(commit, depth=2, group=group) as committer:
        committer.submit(1)
        assert committing.wait(WAIT)
        committer.submit(2)
        committer.submit(3)
        release.set()
        committer.finish()
    assert done == [1]
