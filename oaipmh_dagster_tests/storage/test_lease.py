"""The harvest lease: a heartbeat of its own, take-over only of a dead holder, fenced page
writes, and a second harvest that waits for the first. SQLite and PostgreSQL."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from oaipmh_dagster.demo.dataset import make_dataset
from oaipmh_dagster.demo.server import OAIServer
from oaipmh_dagster.harvesting.harvest import HarvestHooks, Progress, harvest
from oaipmh_dagster.harvesting.rows import retransform, write_page
from oaipmh_dagster.oai import ClientOptions
from oaipmh_dagster.storage.lease import Leases, holder_id, process_start
from oaipmh_dagster.storage.registry import Harvester
from oaipmh_dagster.storage.store import (
    STALE_AFTER,
    HarvestInProgress,
    LeaseLost,
    LeaseWaitCancelled,
    Store,
    state_table,
)
from oaipmh_dagster_tests.storage.test_store import rec, rows, title_of

WAIT = 60.0  # bounds every wait below: reached only when the lease is broken
FAST = ClientOptions(max_retries=1, backoff_base=0.01, backoff_max=0.05, read_timeout=5)


@pytest.fixture
def store(database_url: str) -> Store:
    return Store(poll_every=0.05)


def _set_state(store: Store, **values: Any) -> None:
    with store.engine.begin() as conn:
        conn.execute(state_table.update().values(**values))


def _ago(**delta: float) -> datetime:
    return datetime.now(UTC) - timedelta(**delta)


def _until(predicate: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    """Poll `predicate` until it holds; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s waiting for {what}"
        time.sleep(0.02)


def _logged(caplog: pytest.LogCaptureFixture, text: str) -> Callable[[], bool]:
    return lambda: any(text in r.getMessage() for r in list(caplog.records))


def _heartbeat(store: Store) -> datetime:
    beat = store.state("h")["heartbeat_at"]
    return beat if beat.tzinfo else beat.replace(tzinfo=UTC)


# -- take-over only of a dead holder -------------------------------------------------------


def test_live_holder_on_this_host_keeps_its_lease_despite_an_old_heartbeat(store: Store) -> None:
    store.acquire("h", "run1")
    _set_state(store, heartbeat_at=_ago(hours=2))  # its process (this one) is alive
    with pytest.raises(HarvestInProgress, match="run1"):
        Store(store.engine).acquire("h", "run2", wait=False)
    assert store.state("h")["run_id"] == "run1"
    # The orchestrator saying the run finished is proof enough.
    Store(store.engine).acquire("h", "run2", wait=False, is_stale=lambda run: run == "run1")
    assert store.state("h")["run_id"] == "run2"


@pytest.mark.skipif(process_start(os.getpid()) is None,
                    reason="process start times come from /proc (Linux)")
def test_a_holder_whose_pid_was_reused_is_dead(store: Store) -> None:
    """A dead holder's PID taken by a later process on the same host: the start time
    recorded with the PID tells them apart, so the lease is taken over instead of
    waited for until the orchestrator gives up on the run."""
    store.acquire("h", "run1")
    assert store.state("h")["holder"] == holder_id()
    assert holder_id().endswith(f":{os.getpid()}@{process_start(os.getpid())}")
    other = os.getppid()  # alive, and not the holder
    host = socket.gethostname()
    _set_state(store, holder=f"{host}:{other}@{process_start(other)}",
               heartbeat_at=_ago(hours=2))
    with pytest.raises(HarvestInProgress):  # that very process: alive
        Store(store.engine).acquire("h", "run2", wait=False)
    _set_state(store, holder=f"{host}:{other}")  # recorded before start times were
    with pytest.raises(HarvestInProgress):
        Store(store.engine).acquire("h", "run2", wait=False)
    boot, _, ticks = process_start(other).partition(".")  # type: ignore[union-attr]
    _set_state(store, holder=f"{host}:{other}@{boot}.{int(ticks) + 1}")  # PID reused
    Store(store.engine).acquire("h", "run2", wait=False)
    assert store.state("h")["run_id"] == "run2"


def test_holder_on_another_host_is_dead_after_the_heartbeat_timeout(store: Store) -> None:
    assert timedelta(minutes=2) < STALE_AFTER <= timedelta(minutes=10)
    store.acquire("h", "run1")
    _set_state(store, holder="elsewhere:1", heartbeat_at=_ago(minutes=1))
    with pytest.raises(HarvestInProgress, match="elsewhere:1"):
        store.acquire("h", "run2", wait=False)
    _set_state(store, heartbeat_at=datetime.now(UTC) - STALE_AFTER - timedelta(seconds=5))
    store.acquire("h", "run2", wait=False)
    assert store.state("h")["run_id"] == "run2"


def test_heartbeat_runs_between_pages_and_stops_on_release(database_url: str) -> None:
    store = Store(heartbeat_every=0.05)
    store.acquire("h", "run1")
    _set_state(store, heartbeat_at=_ago(hours=1))
    _until(lambda: _heartbeat(store) > _ago(minutes=1), "a heartbeat")
    lease = store.leases.held("h", "run1")
    assert lease is not None and lease.thread is not None and lease.thread.is_alive()
    store.release("h", "run1", succeeded=True)
    assert not lease.thread.is_alive()
    _set_state(store, heartbeat_at=_ago(hours=1))
    time.sleep(0.3)
    assert _heartbeat(store) < _ago(minutes=1)


def test_a_run_that_lost_its_lease_writes_nothing(store: Store) -> None:
    store.acquire("h", "run1")
    write_page(store, "h", [rec("a")], run_id="run1", checkpoint={"token": "t1"})
    other = Store(store.engine)
    other.acquire("h", "run2", is_stale=lambda run: run == "run1")
    write_page(other, "h", [rec("a", title="newer")], run_id="run2", transform=title_of,
                      checkpoint={"token": "t2"})
    with pytest.raises(LeaseLost, match="run2"):
        write_page(store, "h", [rec("a", title="older"), rec("b")], run_id="run1",
                          transform=title_of, checkpoint={"token": "zombie"})
    with pytest.raises(LeaseLost):
        store.save_checkpoint("h", "run1", {"token": "zombie"})
    assert set(rows(store)) == {"a"} and rows(store)["a"]["metadata"] == {"title": "newer"}
    store.release("h", "run1", succeeded=True)  # ends nothing of run2's
    state = store.state("h")
    assert (state["run_id"], state["status"], state["checkpoint"]) == (
        "run2", "running", {"token": "t2"})


def test_a_page_without_a_checkpoint_keeps_the_last_one(store: Store) -> None:
    store.acquire("h", "run1")
    write_page(store, "h", [rec("a")], run_id="run1", checkpoint={"token": "t1"})
    write_page(store, "h", [rec("b")], run_id="run1")  # e.g. the last page of a list
    assert store.state("h")["checkpoint"] == {"token": "t1"}
    store.save_checkpoint("h", "run1", None)
    assert store.state("h")["checkpoint"] is None


def _harvester(server: OAIServer) -> Harvester:
    return Harvester(id="h", base_url=server.base_url, metadata_prefix="oai_dc")


def test_harvest_whose_lease_is_taken_stops_without_writing(database_url: str) -> None:
    with OAIServer(make_dataset(1000, seed=3, deleted_ratio=0.0), page_size=100) as server:
        store = Store()
        thief = Store(store.engine)
        stored_at_take_over: list[int] = []

        def take_over(event: Progress) -> None:
            if event.pages == 1:
                thief.acquire("h", "thief", is_stale=lambda run: run == "victim")
                stored_at_take_over.append(len(rows(store)))

        with pytest.raises(LeaseLost):
            harvest(_harvester(server), store, run_id="victim", options=FAST,
                    hooks=HarvestHooks(on_page=take_over))
    # The pages committed before the take-over (the first, and those whose commit was
    # already under way: the committer runs at most two pages ahead), nothing after it.
    assert stored_at_take_over[0] in (100, 200, 300)
    assert len(rows(store)) == stored_at_take_over[0]
    state = store.state("h")
    assert (state["run_id"], state["status"]) == ("thief", "running")


# -- a second harvest waits ------------------------------------------------------------------


def test_second_acquire_waits_for_the_holder(store: Store,
                                             caplog: pytest.LogCaptureFixture) -> None:
    store.acquire("h", "run1")
    got: list[Any] = []
    waiter = threading.Thread(
        target=lambda: got.append(Store(store.engine, poll_every=0.05).acquire("h", "run2")))
    with caplog.at_level(logging.INFO, logger="oaipmh_dagster"):
        waiter.start()
        _until(_logged(caplog, "waiting for run run1"), "the second acquire to wait")
        assert waiter.is_alive() and store.state("h")["run_id"] == "run1"
        store.release("h", "run1", succeeded=False)
        waiter.join(WAIT)
    assert not waiter.is_alive() and got == [None]
    assert store.state("h")["run_id"] == "run2"
    holder = f"{socket.gethostname()}:"
    assert any("waiting for run run1 (" + holder in r.getMessage()
               and "to finish its harvest of h" in r.getMessage() for r in caplog.records)


def test_wait_limits(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """`wait=False` and a limit of 0 never sleep; a limit of 0.4 s gives up once it has
    waited that long (never before: a deadline cannot fire early)."""
    store.acquire("h", "run1")
    slept: list[float] = []
    real_sleep = Leases._sleep

    def sleep(seconds: float, cancel: threading.Event | None, harvester_id: str) -> None:
        slept.append(seconds)
        real_sleep(seconds, cancel, harvester_id)

    monkeypatch.setattr(Leases, "_sleep", staticmethod(sleep))
    with pytest.raises(HarvestInProgress, match="run1"):
        store.acquire("h", "run2", wait=False)
    with pytest.raises(HarvestInProgress, match="run1"):
        store.acquire("h", "run2", wait_limit=0)
    assert slept == []
    t0 = time.monotonic()
    with pytest.raises(HarvestInProgress, match="run1"):
        store.acquire("h", "run2", wait_limit=0.4)
    assert time.monotonic() - t0 >= 0.4 and slept and sum(slept) <= 0.4 + 1e-6
    slept.clear()
    with pytest.raises(HarvestInProgress, match="run1"):
        Store(store.engine, wait_limit=0).acquire("h", "run2")
    assert slept == [] and store.state("h")["run_id"] == "run1"


# An interrupted wait ends within PROMPTLY seconds; the store polls every POLL_SLOWLY
# seconds, so a wait that ran until the next poll would fail the bound.
PROMPTLY = 30.0
POLL_SLOWLY = 600.0


def test_waiting_stops_promptly_when_cancelled(database_url: str,
                                               caplog: pytest.LogCaptureFixture) -> None:
    store = Store(poll_every=POLL_SLOWLY)
    store.acquire("h", "run1")
    cancel = threading.Event()
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            store.acquire("h", "run2", cancel=cancel)
        except BaseException as exc:  # noqa: BLE001 - checked below
            errors.append(exc)

    waiter = threading.Thread(target=wait, daemon=True)
    with caplog.at_level(logging.INFO, logger="oaipmh_dagster"):
        waiter.start()
        _until(_logged(caplog, "waiting for run run1"), "the acquire to wait")
    t0 = time.monotonic()
    cancel.set()
    waiter.join(PROMPTLY)
    assert not waiter.is_alive(), f"still waiting {PROMPTLY:.0f} s after the cancel"
    assert time.monotonic() - t0 < PROMPTLY
    assert [type(e) for e in errors] == [LeaseWaitCancelled]
    assert store.state("h")["run_id"] == "run1"


def test_waiting_stops_promptly_on_keyboard_interrupt(database_url: str) -> None:
    store = Store(poll_every=POLL_SLOWLY)
    store.acquire("h", "run1")

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.3)
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            store.acquire("h", "run2")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert time.monotonic() - t0 < PROMPTLY
    assert store.state("h")["run_id"] == "run1"


def test_second_harvest_waits_and_then_runs(database_url: str,
                                           caplog: pytest.LogCaptureFixture) -> None:
    with OAIServer(make_dataset(150, seed=4, deleted_ratio=0.0), page_size=100) as server:
        store = Store(poll_every=0.05)
        store.acquire("h", "holder")
        results: list[Any] = []

        def run() -> None:
            try:
                results.append(harvest(_harvester(server), Store(store.engine, poll_every=0.05),
                                       run_id="second", options=FAST))
            except Exception as exc:  # noqa: BLE001 - reported by the assertion below
                results.append(exc)

        second = threading.Thread(target=run)
        with caplog.at_level(logging.INFO, logger="oaipmh_dagster"):
            second.start()
            _until(_logged(caplog, "waiting for run holder"), "the second harvest to wait")
        assert second.is_alive() and server.requests == []
        store.release("h", "holder", succeeded=True)
        second.join(WAIT)
    assert not second.is_alive()
    [stats] = results
    assert not isinstance(stats, Exception), stats
    assert stats.new == 150 and store.state("h")["status"] == "succeeded"


# -- re-transforming takes the lease ---------------------------------------------------------


def test_retransform_takes_and_releases_the_lease(store: Store) -> None:
    write_page(store, "h", [rec("a"), rec("b")], run_id="r0")
    store.acquire("h", "run1")
    with pytest.raises(HarvestInProgress, match="run1"):
        retransform(store, "h", title_of, run_id="run2", wait=False)
    assert rows(store)["a"]["metadata"] is None
    store.save_checkpoint("h", "run1", {"token": "keep"})
    store.release("h", "run1", succeeded=False)
    c = retransform(store, "h", title_of, run_id="run2", wait=False)
    assert c.updated == 2 and rows(store)["a"]["metadata"] == {"title": "a"}
    state = store.state("h")
    # The harvest's status and checkpoint stay for the next harvest to resume.
    assert (state["status"], state["checkpoint"]) == ("failed", {"token": "keep"})
    assert store.acquire("h", "run3", wait=False) == {"token": "keep"}
