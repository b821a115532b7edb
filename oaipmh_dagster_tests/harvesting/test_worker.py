"""A long list continues in a worker process (`harvesting/worker.py`): the same store as
in one process, on both databases; its failures, its death and its harvest's death."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from oaipmh_dagster.demo.dataset import make_dataset
from oaipmh_dagster.harvesting import worker as worker_mod
from oaipmh_dagster.harvesting.harvest import HarvestError, HarvestHooks, Progress, harvest
from oaipmh_dagster.harvesting.worker import WORKER_ENV, WorkerDied, split_setting
from oaipmh_dagster.oai import ClientOptions, OAIError, OAIHTTPStatusError
from oaipmh_dagster.storage.registry import Harvester
from oaipmh_dagster.storage.store import Store
from oaipmh_dagster_tests.harvesting.test_harvest import Said
from oaipmh_dagster_tests.helpers import expected_snapshot
from oaipmh_dagster_tests.memory_store import MemoryStore
from oaipmh_dagster_tests.oaiserver import FaultyOAIServer as OAIServer

FAST = ClientOptions(max_retries=2, backoff_base=0.01, backoff_max=0.05, read_timeout=5)
HANDED_OVER = "in a worker process from here"


@pytest.fixture
def server():  # noqa: ANN201
    ds = make_dataset(3000, seed=11, deleted_ratio=0.05)
    with OAIServer(ds, page_size=200) as srv:
        yield srv


@pytest.fixture
def split(monkeypatch: pytest.MonkeyPatch) -> None:
    """A list with 500 records still to come moves to a worker."""
    monkeypatch.setenv(WORKER_ENV, "500")


def _h(srv: OAIServer, **kw: object) -> Harvester:
    return Harvester(id=str(kw.pop("id", "t")), base_url=srv.base_url,
                     metadata_prefix="oai_dc", **kw)


@pytest.fixture
def workers(monkeypatch: pytest.MonkeyPatch) -> list[worker_mod.Worker]:
    """Every worker a harvest starts."""
    started: list[worker_mod.Worker] = []
    real = worker_mod.Worker.__init__

    def init(self: worker_mod.Worker, *args: object, **kwargs: object) -> None:
        real(self, *args, **kwargs)  # type: ignore[arg-type]
        started.append(self)

    monkeypatch.setattr(worker_mod.Worker, "__init__", init)
    return started


def test_a_long_list_is_harvested_in_a_worker_as_in_one_process(
        database_url: str, server: OAIServer, split: None,
        workers: list[worker_mod.Worker]) -> None:
    store, said = Store(), Said()
    seen: list[int] = []
    stats = harvest(_h(server), store, run_id="r1", options=FAST, logger=said,
                    hooks=HarvestHooks(on_page=lambda p: seen.append(p.records)))
    expected = expected_snapshot(server.dataset)
    assert len(workers) == 1 and workers[0]._proc.returncode is not None
    assert any(HANDED_OVER in line and "announces 2800 more records" in line for line in said)
    assert store.snapshot("t") == expected
    assert (stats.records, stats.pages, stats.complete_list_size) == (3000, 15, 3000)
    assert stats.new == 3000 - stats.deleted and stats.failed == 0
    # The worker's requests are counted with the harvest's (Identify and 15 pages; the
    # page the harvest's own client had begun to prefetch may be cancelled or counted).
    assert 16 <= stats.requests <= 17 and stats.lists_judged == 1 and not stats.short_lists
    assert seen == list(range(200, 3001, 200))  # every page reported, in order
    assert store.state("t")["checkpoint"] is None and store.state("t")["status"] == "succeeded"
    again = harvest(_h(server), store, run_id="r2", options=FAST)
    assert again.unchanged == 3000 and again.new == again.updated == 0
    assert {r["run_id"] for r in store.iter_records("t")} == {"r1"}


def test_sets_are_deduplicated_across_the_hand_over(
        sqlite_url: str, server: OAIServer, split: None,
        workers: list[worker_mod.Worker]) -> None:
    sets = ("datasets", "theses", "articles")
    stats = harvest(_h(server, sets=sets), Store(), run_id="r1", options=FAST)
    assert len(workers) == 1
    assert Store().snapshot("t") == expected_snapshot(server.dataset, sets=sets)
    assert stats.records == len(expected_snapshot(server.dataset, sets=sets))


def test_short_lists_are_small_enough_to_stay_in_process(
        sqlite_url: str, server: OAIServer, monkeypatch: pytest.MonkeyPatch,
        workers: list[worker_mod.Worker]) -> None:
    harvest(_h(server), Store(), run_id="r1", options=FAST)  # the default, 20,000
    monkeypatch.setenv(WORKER_ENV, "off")
    harvest(_h(server), Store(), run_id="r2", options=FAST)
    assert workers == []


def test_a_store_no_other_process_can_open_keeps_the_harvest_in_process(
        memory_store: MemoryStore, server: OAIServer, split: None,
        workers: list[worker_mod.Worker]) -> None:
    harvest(_h(server), memory_store, run_id="r1", options=FAST)
    assert workers == [] and len(memory_store.snapshot("t")) == 3000


def test_a_server_error_in_the_worker_fails_the_harvest_as_it_would_in_one_process(
        database_url: str, server: OAIServer, split: None,
        workers: list[worker_mod.Worker]) -> None:
    store = Store()
    server.faults.add("status", verb="ListRecords", page=6, times=100, status=404)
    with pytest.raises(OAIHTTPStatusError) as failed:
        harvest(_h(server), store, run_id="r1", options=FAST)
    assert failed.value.status_code == 404 and len(workers) == 1
    expected = expected_snapshot(server.dataset)
    snap = store.snapshot("t")
    assert len(snap) == 1000 and all(expected[k] == v for k, v in snap.items())
    state = store.state("t")
    assert state["status"] == "failed" and state["checkpoint"]["pages"] == 5
    server.faults.clear()
    stats = harvest(_h(server), store, run_id="r2", options=FAST)
    assert stats.mode == "resumed" and store.snapshot("t") == expected


def test_a_killed_worker_fails_the_harvest_and_loses_nothing(
        database_url: str, server: OAIServer, split: None,
        workers: list[worker_mod.Worker]) -> None:
    store = Store()

    def kill(progress: Progress) -> None:
        if progress.pages == 4:
            workers[0]._proc.kill()

    with pytest.raises(WorkerDied, match="exit code -9"):
        harvest(_h(server), store, run_id="r1", options=FAST,
                hooks=HarvestHooks(on_page=kill))
    state = store.state("t")
    assert state["status"] == "failed" and state["checkpoint"]["token"]
    expected = expected_snapshot(server.dataset)
    snap = store.snapshot("t")
    assert 800 <= len(snap) < 3000 and all(expected[k] == v for k, v in snap.items())
    assert state["checkpoint"]["records"] == len(snap)
    stats = harvest(_h(server), store, run_id="r2", options=FAST)
    assert stats.mode == "resumed" and store.snapshot("t") == expected


_MAIN = """
import os, sys
from oaipmh_dagster.harvesting import worker
from oaipmh_dagster.harvesting.harvest import HarvestHooks, harvest
from oaipmh_dagster.oai import ClientOptions
from oaipmh_dagster.storage.registry import Harvester
from oaipmh_dagster.storage.store import Store
started = []
real = worker.Worker.__init__
def init(self, *a, **k):
    real(self, *a, **k)
    started.append(self)
worker.Worker.__init__ = init
def page(progress):
    if progress.pages == 3:
        print(started[0]._proc.pid, flush=True)
        os.kill(os.getpid(), 9)
harvest(Harvester(id="t", base_url=sys.argv[1], metadata_prefix="oai_dc"), Store(),
        run_id="r1", options=ClientOptions(read_timeout=5), hooks=HarvestHooks(on_page=page))
"""


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


def test_a_worker_whose_harvest_was_killed_exits(
        sqlite_url: str, server: OAIServer, split: None) -> None:
    server.faults.add("delay", verb="ListRecords", page=list(range(5, 16)), times=None,
                      seconds=0.5)
    proc = subprocess.run([sys.executable, "-c", _MAIN, server.base_url],
                          capture_output=True, text=True, timeout=120, env=os.environ)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    pid = int(proc.stdout.split()[0])
    for _ in range(100):
        if _gone(pid):
            break
        time.sleep(0.1)
    assert _gone(pid), "the worker outlived its harvest"
    store = Store()
    assert store.state("t")["checkpoint"]["pages"] >= 3
    harvest(_h(server), store, run_id="r2", options=FAST)
    assert store.snapshot("t") == expected_snapshot(server.dataset)


def test_the_setting_reads_a_number_or_off() -> None:
    assert split_setting({}) == 20_000
    assert split_setting({WORKER_ENV: "50_000"}) == 50_000
    assert split_setting({WORKER_ENV: "off"}) is None
    for bad in ("-3", "many", "1.5"):
        with pytest.raises(ValueError, match=WORKER_ENV):
            split_setting({WORKER_ENV: bad})


def test_a_bad_setting_fails_the_harvest_before_any_request(
        sqlite_url: str, server: OAIServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(WORKER_ENV, "lots")
    with pytest.raises(HarvestError, match=WORKER_ENV):
        harvest(_h(server), Store(), run_id="r1", options=FAST)
    assert server.requests == []


def test_errors_cross_the_process_boundary_whole() -> None:
    exc = OAIHTTPStatusError("HTTP 503", status_code=503, url="http://x/oai", token="t1")
    back = pickle.loads(pickle.dumps(exc))
    assert (type(back), str(back), back.status_code, back.url, back.token) == (
        OAIHTTPStatusError, str(exc), 503, "http://x/oai", "t1")
    assert isinstance(pickle.loads(pickle.dumps(OAIError("x"))), OAIError)
