"""Windowed parallel harvesting: windows cover the range exactly; the parallel harvest
equals the sequential one, stays within the host limit, and resumes unfinished windows."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oaipmh_dagster.demo.dataset import make_dataset
from oaipmh_dagster.harvesting.harvest import harvest
from oaipmh_dagster.harvesting.windows import Window, split, unit
from oaipmh_dagster.oai import ClientOptions, Granularity, OAIError
from oaipmh_dagster.storage.registry import Harvester
from oaipmh_dagster.storage.store import Store
from oaipmh_dagster_tests.helpers import expected_snapshot
from oaipmh_dagster_tests.oaiserver import FaultyOAIServer as OAIServer

FAST = dict(max_retries=1, backoff_base=0.01, backoff_max=0.02, read_timeout=5)


class RendezvousServer(OAIServer):
    """Once `meet` is set, the first list request with `from` waits (at most 10 s) until
    a second one is in flight: a windowed harvest shows its concurrency however the
    machine schedules its threads, and a sequential one is caught by the wait's end."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.meet = False
        self.met: bool | None = None
        self._barrier = threading.Barrier(2, timeout=10)
        self._waiting = 0
        self._waiting_lock = threading.Lock()

    def handle(self, request: Any) -> Any:
        if self.meet and "from" in request.params:
            with self._waiting_lock:
                self._waiting += 1
                join = self._waiting <= 2
            if join:
                try:
                    self._barrier.wait()
                    self.met = True
                except threading.BrokenBarrierError:
                    self.met = False
        return super().handle(request)


@given(
    start=st.datetimes(min_value=datetime(1990, 1, 1), max_value=datetime(2030, 1, 1)),
    span=st.integers(min_value=0, max_value=10_000_000),
    parts=st.integers(min_value=1, max_value=80),
    gran=st.sampled_from(list(Granularity)),
)
def test_split_covers_exactly(start: datetime, span: int, parts: int, gran: Granularity) -> None:
    from datetime import timedelta

    from oaipmh_dagster.harvesting.windows import floor

    a = floor(start.replace(tzinfo=UTC), gran)
    b = floor(a + timedelta(seconds=span), gran)
    pieces = split(Window(None, a, b), parts, gran)
    assert pieces[0].start == a and pieces[-1].end == b
    for left, right in zip(pieces, pieces[1:], strict=False):
        assert right.start == left.end + unit(gran)
    assert all(p.start <= p.end for p in pieces)
    assert 1 <= len(pieces) <= parts


@pytest.mark.parametrize("granularity", ["YYYY-MM-DDThh:mm:ssZ", "YYYY-MM-DD"])
def test_windowed_equals_sequential(database_url: str, granularity: str) -> None:
    ds = make_dataset(4000, seed=11, granularity=granularity)
    with RendezvousServer(ds, page_size=100, latency=0.01) as srv:
        store = Store()
        seq = harvest(Harvester(id="seq", base_url=srv.base_url, metadata_prefix="oai_dc"),
                      store, run_id="a", options=ClientOptions(**FAST))
        srv.clear_log()
        srv.meet = True
        par_h = Harvester(id="par", base_url=srv.base_url, metadata_prefix="oai_dc",
                          max_parallel=4)
        par = harvest(par_h, store, run_id="b",
                      options=ClientOptions(max_parallel=4, **FAST))
        assert store.snapshot("par") == store.snapshot("seq") == expected_snapshot(ds)
        assert par.records == seq.records == 4000
        assert seq.complete_list_size == 4000 and par.complete_list_size is None
        assert srv.met is True  # two windows' requests were in flight at once
        assert 2 <= srv.max_concurrency <= 4
        froms = {r.params["from"][0] for r in srv.requests if "from" in r.params}
        assert len(froms) > 4
        expected_len = 10 if granularity == "YYYY-MM-DD" else 20
        assert all(len(f) == expected_len for f in froms)


def test_windowed_with_sets_dedupes(sqlite_url: str) -> None:
    ds = make_dataset(2000, seed=5)
    sets = ("publications", "publications:articles", "datasets")
    with OAIServer(ds, page_size=50) as srv:
        h = Harvester(id="w", base_url=srv.base_url, metadata_prefix="oai_dc", sets=sets,
                      max_parallel=3)
        stats = harvest(h, Store(), run_id="r", options=ClientOptions(max_parallel=3, **FAST))
    expected = expected_snapshot(ds, sets=sets)
    assert Store().snapshot("w") == expected
    assert stats.records == len(expected)


def _fail_windowed_run(srv: OAIServer) -> tuple[Harvester, Store, dict]:
    """A windowed harvest of `srv` that fails from its 26th list request on; the
    harvester, its store and the checkpoint the failed run left."""
    h = Harvester(id="w", base_url=srv.base_url, metadata_prefix="oai_dc", max_parallel=2)
    store = Store()
    srv.faults.add("malformed", verb="ListRecords", when=lambda r: r.number >= 26,
                   times=None)
    with pytest.raises(OAIError):
        harvest(h, store, run_id="r1", options=ClientOptions(max_parallel=2, **FAST))
    return h, store, store.state("w")["checkpoint"]


def test_failed_window_run_resumes_only_unfinished(sqlite_url: str) -> None:
    ds = make_dataset(3000, seed=2)
    with OAIServer(ds, page_size=100) as srv:
        h, store, cp = _fail_windowed_run(srv)
        assert cp["mode"] == "windowed"
        done = [k for k, v in cp["windows"].items() if v["done"]]
        assert done and len(done) < len(cp["windows"])
        partial = len(store.snapshot("w"))
        assert 0 < partial < 3000
        srv.faults.clear()
        srv.clear_log()
        stats = harvest(h, store, run_id="r2", options=ClientOptions(max_parallel=2, **FAST))
        assert stats.mode == "resumed"
        assert store.snapshot("w") == expected_snapshot(ds)
        # Finished windows were not fetched again.
        asked = {(r.params.get("from", [""])[0], r.params.get("until", [""])[0])
                 for r in srv.requests if r.verb == "ListRecords"}
        for key in done:
            _, start, end = key.split("|")
            assert (start, end) not in asked


def test_window_resume_with_expired_tokens_restarts_the_windows(sqlite_url: str) -> None:
    """The checkpointed windows' tokens expired: each unfinished window starts again from
    its own from/until, and the store ends up equal to the server's data."""
    ds = make_dataset(3000, seed=2)
    with OAIServer(ds, page_size=100) as srv:
        h, store, cp = _fail_windowed_run(srv)
        tokens = {v["token"] for v in cp["windows"].values() if v["token"]}
        assert tokens
        srv.faults.clear()
        srv.expire_tokens()
        srv.clear_log()
        stats = harvest(h, store, run_id="r2", options=ClientOptions(max_parallel=2, **FAST))
        assert stats.mode == "resumed"
        assert store.snapshot("w") == expected_snapshot(ds)
        asked = {r.params["resumptionToken"][0] for r in srv.requests
                 if "resumptionToken" in r.params}
        assert tokens <= asked  # each tried once, refused, then the window restarted
