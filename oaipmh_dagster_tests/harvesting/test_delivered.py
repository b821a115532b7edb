"""A harvest into a store that holds none of its harvester's records asks the store for
the hashes of identifiers it delivered before, and for no others (`harvesting/delivered.py`);
its counts and its store are those of a harvest that asks for every identifier."""

from __future__ import annotations

import pickle
import re
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from oaipmh_dagster.demo.dataset import make_dataset
from oaipmh_dagster.demo.server import Reply, RequestInfo
from oaipmh_dagster.harvesting import delivered as delivered_mod
from oaipmh_dagster.harvesting import worker as worker_mod
from oaipmh_dagster.harvesting.delivered import Delivered
from oaipmh_dagster.harvesting.harvest import harvest
from oaipmh_dagster.harvesting.worker import WORKER_ENV
from oaipmh_dagster.oai import ClientOptions
from oaipmh_dagster.storage.registry import Harvester
from oaipmh_dagster.storage.store import Store
from oaipmh_dagster_tests.oaiserver import FaultyOAIServer

FAST = ClientOptions(max_retries=2, backoff_base=0.01, backoff_max=0.05, read_timeout=5)
_IDENTIFIER = re.compile(r"<identifier>([^<]+)</identifier>")


class RepeatingServer(FaultyOAIServer):
    """Page `again` of a list begins with page 1's first record's identifier (its own
    record's content): a list that delivers one identifier twice, far apart."""

    def __init__(self, *args: Any, again: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.again, self.first = again, ""

    def handle(self, request: RequestInfo) -> Reply:
        reply = super().handle(request)
        if request.verb != "ListRecords" or not isinstance(reply.body, str):
            return reply
        if request.page == 1:
            self.first = _IDENTIFIER.search(reply.body).group(1)  # type: ignore[union-attr]
        elif request.page == self.again:
            reply = replace(reply, body=_IDENTIFIER.sub(
                f"<identifier>{self.first}</identifier>", reply.body, count=1))
        return reply


@pytest.fixture
def server():  # noqa: ANN201
    with RepeatingServer(make_dataset(3000, seed=5, deleted_ratio=0.05), page_size=200,
                         again=10) as srv:
        yield srv


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every identifier whose hash a store in this process is asked for."""
    out: list[str] = []
    real = Store.hashes

    def hashes(self: Store, harvester_id: str, identifiers: Sequence[str]) -> dict:
        out.extend(identifiers)
        return real(self, harvester_id, identifiers)

    monkeypatch.setattr(Store, "hashes", hashes)
    return out


def _h(srv: FaultyOAIServer) -> Harvester:
    return Harvester(id="t", base_url=srv.base_url, metadata_prefix="oai_dc")


def test_the_filter_says_no_for_what_it_never_saw_and_keeps_a_bounded_list() -> None:
    d = Delivered(["a", "b"], keep=3)
    assert d.may_hold("a") and d.may_hold("b")
    unseen = [f"oai:x:{i}" for i in range(10_000)]
    assert sum(d.may_hold(i) for i in unseen) <= 2  # false positives: about 1 in 10^10 here
    assert d.kept == ["a", "b"]
    d.add(["c", "d"])
    assert d.kept is None  # more than `keep`: a worker then asks for every identifier
    assert d.may_hold("d") and Delivered().kept is None


def test_the_filter_grows_past_its_first_step_and_forgets_nothing() -> None:
    d = Delivered()
    assert not d.may_hold("a") and d._filters == []  # nothing allocated before a page
    first = [f"oai:x:{i}" for i in range(delivered_mod.SMALL_HOLDS)]
    d.add(first)
    later = [f"oai:y:{i}" for i in range(1000)]
    d.add(later)
    assert [len(f) for f in d._filters] == [delivered_mod.SMALL >> 3, delivered_mod.LARGE >> 3]
    assert all(d.may_hold(i) for i in first[::997] + later)


def test_a_first_harvest_asks_the_store_only_for_the_identifier_it_repeats(
        database_url: str, server: RepeatingServer, asked: list[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(WORKER_ENV, "off")
    fresh = harvest(_h(server), Store(), run_id="r1", options=FAST)
    assert asked == [server.first]
    assert fresh.updated + fresh.deleted >= 1 and fresh.records == 3000

    # The same harvest asking for every identifier: the same counts, the same store.
    want = Store().snapshot("t")
    Store().delete_harvester_records("t")
    asked.clear()
    monkeypatch.setattr(Store, "has_records", lambda self, harvester_id: True)
    plain = harvest(_h(server), Store(), run_id="r2", options=FAST, run=None)
    assert len(asked) == 3000
    assert (plain.new, plain.updated, plain.deleted, plain.unchanged) == (
        fresh.new, fresh.updated, fresh.deleted, fresh.unchanged)
    assert Store().snapshot("t") == want and len(want) == 2999


def test_a_harvest_into_a_store_holding_records_asks_for_every_identifier(
        database_url: str, server: RepeatingServer, asked: list[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(WORKER_ENV, "off")
    harvest(_h(server), Store(), run_id="r1", options=FAST)
    asked.clear()
    again = harvest(_h(server), Store(), run_id="r2", options=FAST)
    assert len(asked) == 3000 and again.new == 0


def test_the_worker_gets_what_was_delivered_and_asks_for_the_repeat_alone(
        tmp_path: Path, server: RepeatingServer, asked: list[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The hand-over carries the identifiers of the pages before it; the worker's page
    loop (run here, in this process) asks the store for page 1's identifier alone."""
    monkeypatch.setenv(WORKER_ENV, "500")
    url = f"sqlite:///{tmp_path / 'w.db'}"
    from oaipmh_dagster.storage import db

    specs: list[worker_mod.Spec] = []
    real = worker_mod.Worker.__init__

    def init(self: worker_mod.Worker, spec: worker_mod.Spec, logger: Any) -> None:
        specs.append(spec)
        real(self, spec, logger)

    monkeypatch.setattr(worker_mod.Worker, "__init__", init)
    stats = harvest(_h(server), Store(db.get_engine(url)), run_id="r1", options=FAST)
    assert stats.records == 3000 and len(specs) == 1
    spec = specs[0]
    assert spec.delivered is not None and len(spec.delivered) == 200
    assert server.first in spec.delivered and "delivered" not in repr(spec).split("(", 1)[1]

    # The worker's loop again, from the same hand-over, into a store without the records.
    empty = f"sqlite:///{tmp_path / 'empty.db'}"
    db.get_engine(empty)
    sent: list[tuple[str, Any]] = []
    asked.clear()
    worker_mod._run(replace(spec, store_url=empty), lambda kind, body: sent.append(
        (kind, pickle.loads(pickle.dumps(body)))))
    pages = [body for kind, body in sent if kind == "page"]
    assert len(pages) == 14 and sent[-1][0] == "end"
    assert asked == [server.first]
