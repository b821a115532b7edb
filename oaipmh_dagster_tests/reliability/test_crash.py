"""Checkpointed resumption: a harvest killed with SIGKILL, failed, or interrupted is
resumed by the next run from its last committed page (token still accepted), restarted
from its `since` (token expired), or started over (`resume=False`); the store always
ends equal to the server's data, with nothing written twice. SQLite and PostgreSQL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from datetime import UTC, datetime

import pytest

from oaipmh_dagster.demo.dataset import make_dataset
from oaipmh_dagster.harvesting.harvest import RunOptions, harvest
from oaipmh_dagster.oai import OAIDataError
from oaipmh_dagster.storage import db
from oaipmh_dagster.storage.store import HarvestInProgress, Store, utc_datestamp
from oaipmh_dagster_tests.helpers import expected_snapshot
from oaipmh_dagster_tests.oaiserver import FaultyOAIServer as OAIServer
from oaipmh_dagster_tests.reliability.conftest import FAST, PAGE, RECORDS, assert_consistent
from oaipmh_dagster_tests.reliability.conftest import harvester as _h

CHILD = textwrap.dedent("""
    import sys
    from oaipmh_dagster.harvesting.harvest import harvest
    from oaipmh_dagster.oai import ClientOptions
    from oaipmh_dagster.storage.registry import Harvester
    from oaipmh_dagster.storage.store import Store

    h = Harvester(id="crash", base_url=sys.argv[1], metadata_prefix="oai_dc")
    harvest(h, Store(), run_id=sys.argv[2],
            options=ClientOptions(max_retries=2, backoff_base=0.01, read_timeout=10))
""")


def _list_requests(server: OAIServer) -> list:
    return [r for r in server.requests if r.verb == "ListRecords"]


@pytest.mark.slow
def test_sigkill_mid_harvest_then_next_run_completes(database_url: str) -> None:
    """25,000 records; the harvesting process is SIGKILLed once the store holds some but
    not all of them. The next run takes over the dead process's lease, resumes after the
    last committed page (exactly what the checkpoint says was stored), and the store
    equals the server's data with every record written once."""
    n = 25_000
    ds = make_dataset(n, seed=21, deleted_ratio=0.03)
    expected = expected_snapshot(ds)
    store = Store()  # creates the schema before the child starts
    with OAIServer(ds, page_size=500, latency=0.05) as server:
        # A backstop, not the kill's moment: page 30 stalls, so however slowly this
        # process polls on a loaded machine, the child is killed before it could finish.
        server.faults.add("delay", verb="ListRecords", page=30, seconds=600)
        env = {**os.environ, db.DATABASE_URL_ENV: database_url}
        child = subprocess.Popen([sys.executable, "-c", CHILD, server.base_url, "killed-run"],
                                 env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 180
            stored = 0
            while time.monotonic() < deadline:
                stored = store.count("crash", live_only=False)
                if stored >= 4000 or child.poll() is not None:
                    break
                time.sleep(0.05)
            assert child.poll() is None, (
                f"the child ended before it could be killed:\n{child.stdout.read().decode()}")
            assert 0 < stored < n, f"{stored} records stored at kill time"
            os.kill(child.pid, signal.SIGKILL)
        finally:
            if child.poll() is None:
                child.kill()
            child.wait(timeout=30)  # reaped: its pid is gone, so its lease is dead
            child.stdout.close()
        assert child.returncode == -signal.SIGKILL
        server.faults.clear()

        state = store.state("crash")
        assert state["status"] == "running" and state["run_id"] == "killed-run"
        assert state["holder"].rpartition(":")[2].partition("@")[0] == str(child.pid)
        checkpoint = state["checkpoint"]
        before = assert_consistent(store, "crash", expected)
        assert checkpoint["records"] == len(before) < n  # page + checkpoint: one commit

        server.clear_log()
        stats = harvest(_h(server, id="crash"), store, run_id="next-run", options=FAST)
    assert stats.mode == "resumed" and stats.resumed_from_token == checkpoint["token"]
    first = _list_requests(server)[0]
    assert first.params["resumptionToken"] == [checkpoint["token"]]
    assert stats.unchanged == 0 and stats.new + stats.deleted == n - len(before)
    assert store.snapshot("crash") == expected
    assert store.count("crash", live_only=False) == n
    state = store.state("crash")
    assert (state["status"], state["run_id"], state["checkpoint"]) == ("succeeded", "next-run",
                                                                       None)


@pytest.fixture
def server():  # noqa: ANN201
    with OAIServer(make_dataset(RECORDS, seed=13, deleted_ratio=0.05), page_size=PAGE) as srv:
        yield srv


def _fail_after_pages(server: OAIServer, store: Store, pages: int,
                      run: RunOptions | None = None) -> dict:
    """A run that commits `pages` pages and then fails; returns its checkpoint."""
    server.faults.add("repeat_token", verb="ListRecords", page=pages, times=None)
    with pytest.raises(OAIDataError, match="loop"):
        harvest(_h(server), store, run, run_id="failed-run", options=FAST)
    server.faults.clear()
    server.clear_log()
    state = store.state("r")
    assert state["status"] == "failed" and state["checkpoint"]["pages"] == pages
    return state["checkpoint"]


def test_resume_from_checkpoint(database_url: str, server: OAIServer) -> None:
    """`resume` (default True): the next run continues with the checkpoint's token and
    writes only the records after it."""
    store = Store()
    cp = _fail_after_pages(server, store, 4)
    stats = harvest(_h(server), store, run_id="r2", options=FAST)
    assert stats.mode == "resumed" and stats.resumed_from_token == cp["token"]
    assert _list_requests(server)[0].params["resumptionToken"] == [cp["token"]]
    assert stats.unchanged == PAGE  # page 4 asked again with its own token
    assert stats.new + stats.deleted == RECORDS - 4 * PAGE
    assert store.snapshot("r") == expected_snapshot(server.dataset)
    assert store.state("r")["checkpoint"] is None


def test_token_expired_restarts_from_since(database_url: str, server: OAIServer) -> None:
    """The checkpoint's token is no longer accepted (the server expired its tokens): the
    next run restarts the list from the same `since` (never a later one), and the store
    equals the server's data for that window."""
    store = Store()
    since = "2021-06-01T00:00:00Z"
    cutoff = datetime(2021, 6, 1, tzinfo=UTC)
    window = {k: v for k, v in expected_snapshot(server.dataset).items()
              if v[0] >= utc_datestamp(cutoff)}
    assert PAGE * 4 < len(window) < RECORDS
    cp = _fail_after_pages(server, store, 2, RunOptions(since=since))
    assert cp["since"] == since
    server.expire_tokens()
    stats = harvest(_h(server), store, RunOptions(since=since), run_id="r2", options=FAST)
    requests = _list_requests(server)
    assert requests[0].params["resumptionToken"] == [cp["token"]]  # tried, refused
    assert requests[1].params["from"] == [since] and "resumptionToken" not in requests[1].params
    assert stats.since == since
    assert stats.unchanged == 2 * PAGE and stats.new + stats.deleted == len(window) - 2 * PAGE
    assert store.snapshot("r") == window


def test_resume_false_starts_over(database_url: str, server: OAIServer) -> None:
    """`resume=False`: the checkpoint is ignored; the list starts from its first page, the
    records already stored are seen as unchanged (no duplicates), the checkpoint is
    cleared on success."""
    store = Store()
    _fail_after_pages(server, store, 3)
    stats = harvest(_h(server), store, RunOptions(resume=False), run_id="r2", options=FAST)
    assert stats.mode == "full" and stats.resumed_from_token is None
    assert "resumptionToken" not in _list_requests(server)[0].params
    assert stats.unchanged == 3 * PAGE and stats.new + stats.deleted == RECORDS - 3 * PAGE
    assert store.snapshot("r") == expected_snapshot(server.dataset)
    assert store.state("r")["checkpoint"] is None


def test_checkpoint_of_another_window_is_not_resumed(database_url: str,
                                                     server: OAIServer) -> None:
    """A checkpoint of a full harvest is not resumed by an incremental one (different list
    arguments): that run starts its own list."""
    store = Store()
    _fail_after_pages(server, store, 3)
    stats = harvest(_h(server), store, RunOptions(since="2022-01-01"), run_id="r2",
                    options=FAST)
    assert stats.mode == "incremental"
    assert _list_requests(server)[0].params["from"] == ["2022-01-01T00:00:00Z"]


def test_live_lease_blocks_a_second_harvest(database_url: str, server: OAIServer) -> None:
    """While a live process holds the harvester's lease, another harvest of it that may
    not wait (a store with a wait limit of 0) is refused before any request; the holder's
    state is untouched. (With the default limit it waits: test_lease.py.)"""
    store = Store(wait_limit=0)
    store.acquire("r", "holder-run")  # this (live) process holds it
    with pytest.raises(HarvestInProgress, match="holder-run"):
        harvest(_h(server), store, run_id="other", options=FAST)
    assert server.requests == []
    state = store.state("r")
    assert (state["status"], state["run_id"]) == ("running", "holder-run")
