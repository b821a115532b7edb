"""Load: 20 harvesters on two hosts harvested concurrently through Dagster's run queue
(`dagster dev`: webserver + daemon, QueuedRunCoordinator with the repo's dagster.yaml), on
the embedded default storage and on PostgreSQL. Every run succeeds, at most two runs per
host and one per harvester are in flight (measured from the servers' request logs and the
runs' start/end times), and the store equals the servers' data."""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

import dagster as dg
import pytest
from dagster_graphql import DagsterGraphQLClient

from oaipmh_dagster.defs.jobs import HARVESTER_TAG, HOST_TAG
from oaipmh_dagster.demo.dataset import make_dataset
from oaipmh_dagster.demo.server import OAIServer, RequestLog
from oaipmh_dagster.storage import db
from oaipmh_dagster.storage.registry import Harvester
from oaipmh_dagster.storage.store import Store
from oaipmh_dagster_tests.helpers import add_harvester, expected_snapshot
from oaipmh_dagster_tests.reliability.conftest import (
    DagsterDev,
    fresh_postgres_database,
    postgres_storage_yaml,
    start_dagster_dev,
    stop_dagster_dev,
)

HARVESTERS_PER_HOST = 10
HOST_LIMIT = 2  # dagster.yaml: tag_concurrency_limits oaipmh/host
TWICE = ("h0_0", "h1_0")  # launched twice: the per-harvester limit must serialize them
RUN_TIMEOUT = 240


def max_in_flight(requests: list[RequestLog]) -> int:
    """The largest number of requests the server was answering at the same moment."""
    events = []
    for r in requests:
        assert r.finished is not None, "a request never finished"
        events += [(r.started, 1), (r.finished, -1)]
    peak = current = 0
    for _, delta in sorted(events, key=lambda e: (e[0], e[1])):  # ends before starts
        current += delta
        peak = max(peak, current)
    return peak


def max_overlap(spans: list[tuple[float, float]]) -> int:
    events = [(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans]
    peak = current = 0
    for _, delta in sorted(events):
        current += delta
        peak = max(peak, current)
    return peak


def _load(tmp_path: Path, store_url: str, storage_yaml: str) -> None:
    servers = [
        OAIServer(make_dataset(300, seed=31, deleted_ratio=0.05), page_size=50,
                  host="127.0.0.1", latency=0.3),
        OAIServer(make_dataset(250, seed=32, deleted_ratio=0.05), page_size=50,
                  host="127.0.0.2", latency=0.3),
    ]
    dev: DagsterDev | None = None
    try:
        for s in servers:
            s.start()
        harvesters: list[Harvester] = []
        for i, s in enumerate(servers):
            for j in range(HARVESTERS_PER_HOST):
                harvesters.append(add_harvester(f"h{i}_{j}", s.base_url, max_parallel=1))
        db.dispose_all()
        dev = start_dagster_dev(tmp_path, store_url, storage_yaml)
        client = DagsterGraphQLClient("127.0.0.1", port_number=dev.port, timeout=30)
        run_ids = []
        for h in harvesters + [h for h in harvesters if h.id in TWICE]:
            run_ids.append(client.submit_job_execution(
                h.job_name, repository_location_name="oaipmh_dagster",
                repository_name="__repository__",
                run_config={"ops": {f"harvest_{h.id}": {"config": {"full": True}}}},
            ))
        instance = dg.DagsterInstance.from_config(str(dev.home))
        try:
            deadline = time.monotonic() + RUN_TIMEOUT
            while True:
                records = instance.get_run_records(dg.RunsFilter(run_ids=run_ids))
                if len(records) == len(run_ids) and all(r.dagster_run.is_finished
                                                        for r in records):
                    break
                if time.monotonic() > deadline:
                    states = sorted(r.dagster_run.status.value for r in records)
                    raise AssertionError(f"runs not finished after {RUN_TIMEOUT}s: {states}\n"
                                         f"{dev.log_tail()}")
                time.sleep(1)
            failed = [r.dagster_run.run_id for r in records
                      if r.dagster_run.status != dg.DagsterRunStatus.SUCCESS]
            assert not failed, f"{len(failed)} runs did not succeed: {failed}"
            by_host: dict[str, list] = defaultdict(list)
            by_harvester: dict[str, list] = defaultdict(list)
            for r in records:
                span = (r.start_time, r.end_time)
                assert None not in span
                by_host[r.dagster_run.tags[HOST_TAG]].append(span)
                by_harvester[r.dagster_run.tags[HARVESTER_TAG]].append(span)
        finally:
            instance.dispose()
    finally:
        if dev is not None:
            stop_dagster_dev(dev)
        for s in servers:
            s.stop()

    # Limits: per host at most two runs (each sequential, max_parallel=1) at a time ...
    assert set(by_host) == {h.host for h in harvesters}
    for host, spans in by_host.items():
        assert max_overlap(spans) <= HOST_LIMIT, host
    for s in servers:
        assert max_in_flight(s.requests) <= HOST_LIMIT, s.base_url
        assert s.max_concurrency <= HOST_LIMIT
    # How parallel it got depends on the machine (a loaded one starts run workers slowly);
    # shown with -s, not asserted.
    print(f"runs in flight per host at most: "
          f"{ {h: max_overlap(s) for h, s in by_host.items()} }; requests in flight per "
          f"server at most: {[max_in_flight(s.requests) for s in servers]}; all runs at "
          f"once at most: {max_overlap([x for s in by_host.values() for x in s])}")
    # ... and never two runs of one harvester.
    assert all(max_overlap(spans) == 1 for spans in by_harvester.values())
    assert all(len(by_harvester[h]) == 2 for h in TWICE)
    # The store equals the servers' data.
    store = Store(db.get_engine(store_url))
    for i, s in enumerate(servers):
        expected = expected_snapshot(s.dataset)
        for j in range(HARVESTERS_PER_HOST):
            assert store.snapshot(f"h{i}_{j}") == expected, f"h{i}_{j}"
            assert store.state(f"h{i}_{j}")["status"] == "succeeded"


@pytest.mark.slow
def test_load_through_run_queue_embedded(sqlite_url: str, tmp_path: Path) -> None:
    """Embedded default: Dagster's SQLite storage, the record store in SQLite."""
    _load(tmp_path, sqlite_url, "")


@pytest.mark.slow
@pytest.mark.postgres
def test_load_through_run_queue_postgres(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """dagster-postgres storage and the record store on fresh PostgreSQL databases."""
    storage_url, drop_storage = fresh_postgres_database()
    store_url, drop_store = fresh_postgres_database()
    try:
        monkeypatch.setenv(db.DATABASE_URL_ENV, store_url)
        _load(tmp_path, store_url, postgres_storage_yaml(storage_url))
    finally:
        db.dispose_all()
        drop_store()
        drop_storage()
