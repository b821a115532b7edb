"""`harvester list`, the since sensor and since resolution read many harvesters at once.
On one instance holding every kind of history (never harvested, a since set by an
operator, published by the sensor, not published yet, a failed run after a success, an
operator's since after a run, a since of another selection, a partial run, more
materializations than a resolution reads, a wiped asset, observations that publish no
since, a run without asset events, a run of the implicit asset job), on SQLite and
PostgreSQL, the batched reads give exactly what reading one harvester at a time gives,
and the statements they send do not grow with the number of harvesters."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import sqlalchemy as sa

from oaipmh_dagster.contracts import (
    ADVANCES_SINCE_KEY,
    HARVESTER_TAG,
    NEXT_SINCE_KEY,
    SCOPE_KEY,
    job_name,
)
from oaipmh_dagster.defs import asset_events, sensors
from oaipmh_dagster.defs.assets import asset_keys
from oaipmh_dagster.defs.harvester_state import harvester_states
from oaipmh_dagster.defs.since import (
    current_states,
    published_state,
    published_states,
    set_since,
    since_observation,
)
from oaipmh_dagster.harvesting import incremental
from oaipmh_dagster.storage.registry import Harvester
from oaipmh_dagster_tests.conftest import empty_dagster_home, fresh_pg_database

NOW = datetime(2099, 1, 1, tzinfo=UTC)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def any_instance(request: pytest.FixtureRequest, tmp_path: Path,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[dg.DagsterInstance]:
    """A throwaway Dagster instance on SQLite, and on PostgreSQL."""
    if request.param == "sqlite":
        home = empty_dagster_home(tmp_path / "instance", tmp_path_factory)
        with dg.instance_for_test(temp_dir=str(home)) as inst:
            yield inst
        return
    with fresh_pg_database() as url:  # Dagster's tables stay out of the shared database
        u = sa.engine.make_url(url)
        db = {"username": u.username or "postgres", "password": u.password or "",
              "hostname": u.host or "127.0.0.1", "port": u.port or 5432,
              "db_name": u.database, "scheme": "postgresql+psycopg2"}
        with dg.instance_for_test(
                overrides={"storage": {"postgres": {"postgres_db": db}}}) as inst:
            yield inst


class History:
    """Runs and `raw_records` events written as a harvest, the sensor and an operator
    write them; harvester ids carry a tag of their own (PostgreSQL's instance is shared
    by the session's tests)."""

    def __init__(self, instance: dg.DagsterInstance) -> None:
        self.instance = instance
        self.tag = uuid.uuid4().hex[:6]
        self.harvesters: list[Harvester] = []

    def harvester(self, name: str) -> Harvester:
        h = Harvester(id=f"{name}_{self.tag}", base_url=f"http://127.0.0.1:9/{name}",
                      metadata_prefix="oai_dc")
        self.harvesters.append(h)
        return h

    def scope(self, h: Harvester) -> str:
        return incremental.scope(h.base_url, h.metadata_prefix, h.sets)

    def _store(self, run_id: str, job: str, kind: Any, data: Any) -> None:
        from dagster._core.events import DagsterEvent
        from dagster._core.events.log import EventLogEntry

        event = DagsterEvent(event_type_value=kind.value, job_name=job, event_specific_data=data)
        self.instance.store_event(EventLogEntry(
            error_info=None, level=logging.INFO, user_message="", run_id=run_id,
            timestamp=time.time(), dagster_event=event))

    def run(self, h: Harvester, status: dg.DagsterRunStatus, since: str | None = None, *,
            advances: bool = True, scope: str | None = None, events: bool = True,
            tagged: bool = True) -> str:
        """A run of the harvester's job (or, untagged, of the implicit asset job): it plans
        raw_records and records; a successful one materializes them (raw_records recording
        `since` for the harvester's selection)."""
        from dagster._core.events import (
            AssetMaterializationPlannedData,
            DagsterEventType,
            StepMaterializationData,
        )

        run_id = str(uuid.uuid4())
        job = job_name(h.id) if tagged else "__ASSET_JOB"
        self.instance.add_run(dg.DagsterRun(job_name=job, run_id=run_id, status=status,
                                            tags={HARVESTER_TAG: h.id} if tagged else {}))
        _, raw, records = asset_keys(h.id)
        if not events:
            return run_id
        for key in (raw, records):
            self._store(run_id, job, DagsterEventType.ASSET_MATERIALIZATION_PLANNED,
                        AssetMaterializationPlannedData(key))
        if since is not None:
            meta = {NEXT_SINCE_KEY: since, ADVANCES_SINCE_KEY: advances,
                    SCOPE_KEY: scope or self.scope(h)}
            for key, m in ((raw, meta), (records, {"records": 3})):
                self._store(run_id, job, DagsterEventType.ASSET_MATERIALIZATION,
                            StepMaterializationData(dg.AssetMaterialization(key, metadata=m)))
        return run_id

    def publish(self, h: Harvester, since: str | None, run_id: str = "", *,
                scope: str | None = None) -> None:
        """The since sensor's observation of a run's since."""
        self.instance.report_runless_asset_event(since_observation(
            asset_keys(h.id)[1], since, scope or self.scope(h), f"run {run_id[:8]}",
            operator=False))

    def operator(self, h: Harvester, since: str | None) -> None:
        set_since(self.instance, h, asset_keys(h.id)[1], since)

    def observe(self, h: Harvester, n: int) -> None:
        """Observations of raw_records that publish no since."""
        for i in range(n):
            self.instance.report_runless_asset_event(dg.AssetObservation(
                asset_keys(h.id)[1], metadata={"note": f"other {i}"}))


OK, FAIL, STARTED = (dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE,
                     dg.DagsterRunStatus.STARTED)


def _day(n: int) -> str:
    return f"2026-03-{n:02d}T12:00:00Z"


def _every_history(hist: History) -> None:  # noqa: PLR0915 - one history each, in a row
    hist.harvester("never")
    hist.operator(hist.harvester("operator"), _day(5))
    h = hist.harvester("published")
    hist.publish(h, _day(1), hist.run(h, OK, _day(1)))
    hist.publish(h, _day(2), hist.run(h, OK, _day(2)))
    hist.run(hist.harvester("unpublished"), OK, _day(3))
    h = hist.harvester("failed_after")
    hist.publish(h, _day(1), hist.run(h, OK, _day(1)))
    hist.run(h, FAIL)
    h = hist.harvester("operator_after")
    hist.publish(h, _day(1), hist.run(h, OK, _day(1)))
    hist.operator(h, _day(9))
    hist.run(h, OK, _day(10))  # started after the operator's since: it moves it
    h = hist.harvester("reset")
    hist.publish(h, _day(1), hist.run(h, OK, _day(1)))
    hist.operator(h, None)
    hist.publish(hist.harvester("other_scope"), _day(4), scope="http://elsewhere|oai_dc|")
    h = hist.harvester("partial")
    hist.run(h, OK, _day(1))
    hist.run(h, OK, _day(2))
    hist.run(h, OK, _day(3), advances=False)
    h = hist.harvester("many")  # more materializations than a resolution reads
    for day in range(1, 24):
        hist.run(h, OK, _day(day))
    h = hist.harvester("later_run_earlier_since")
    hist.run(h, OK, _day(7))
    hist.run(h, OK, _day(6))
    h = hist.harvester("still_running")
    hist.publish(h, _day(1), hist.run(h, OK, _day(1)))
    hist.run(h, STARTED, _day(2))
    h = hist.harvester("wiped")
    hist.publish(h, _day(1), hist.run(h, OK, _day(1)))
    hist.instance.wipe_assets([asset_keys(h.id)[1]])
    hist.run(h, OK, _day(2))
    h = hist.harvester("observed_after")  # the since is among the 5 newest observations
    hist.publish(h, _day(1), hist.run(h, OK, _day(1)))
    hist.observe(h, 2)
    h = hist.harvester("observed_over")  # ... and not among them
    hist.publish(h, _day(1), hist.run(h, OK, _day(2)))
    hist.observe(h, 5)
    h = hist.harvester("run_without_events")
    hist.publish(h, _day(1), hist.run(h, OK, _day(1)))
    hist.run(h, FAIL, events=False)
    hist.run(hist.harvester("asset_job"), OK, _day(8), tagged=False)
    hist.run(hist.harvester("tagged_only"), FAIL, events=False)


@pytest.fixture
def history(any_instance: dg.DagsterInstance) -> History:
    hist = History(any_instance)
    _every_history(hist)
    return hist


def one_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every read from now on takes the per-key public path."""
    monkeypatch.setattr(asset_events, "BATCH_FROM", 10**9)


def _raw(hs: list[Harvester]) -> list[dg.AssetKey]:
    return [asset_keys(h.id)[1] for h in hs]


def _tick(instance: dg.DagsterInstance, hs: list[Harvester], cursor: str | None) -> Any:
    tick = sensors.evaluate(instance, cursor, hs, None, now=NOW)
    return tick.cursor, [repr(e) for e in tick.events], tick.lines


def test_batched_reads_give_what_one_harvester_at_a_time_gives(
        history: History, monkeypatch: pytest.MonkeyPatch) -> None:
    instance, hs = history.instance, history.harvesters
    batched = (published_states(instance, _raw(hs)), current_states(instance, _raw(hs)),
               harvester_states(instance, hs), _tick(instance, hs, None))
    one_at_a_time(monkeypatch)
    single = ({k: published_state(instance, k) for k in _raw(hs)},
              {k: current_states(instance, [k])[k] for k in _raw(hs)},
              harvester_states(instance, hs), _tick(instance, hs, None))
    assert batched[0] == single[0]
    assert batched[1] == single[1]
    assert batched[2] == single[2]
    assert batched[3] == single[3]
    # The histories are what they say (a few spot checks of the shared answer).
    states, listed = single[1], single[2]
    since = {h.id.rsplit("_", 1)[0]: listed[h.id]["since"] for h in hs}
    assert since["never"] is None and since["operator"] == _day(5)
    assert since["published"] == _day(2) and since["unpublished"] == _day(3)
    assert since["operator_after"] == _day(10) and since["reset"] is None
    assert since["other_scope"] is None and since["partial"] == _day(2)
    assert since["many"] == _day(23) and since["later_run_earlier_since"] == _day(7)
    assert since["still_running"] == _day(1) and since["wiped"] == _day(2)
    assert since["observed_over"] == _day(2)
    last = {h.id.rsplit("_", 1)[0]: listed[h.id]["last_run"] for h in hs}
    assert last["never"] is None and last["asset_job"] is None
    assert last["failed_after"]["status"] == "FAILURE"
    assert last["run_without_events"]["status"] == "FAILURE"
    assert last["tagged_only"] is None  # no asset event: not looked up
    assert states[asset_keys(hs[0].id)[1]] is None


def test_a_quiet_tick_and_an_edit_read_as_one_at_a_time(
        history: History, monkeypatch: pytest.MonkeyPatch) -> None:
    """After the first tick, a quiet one (its round robin mirrors published sinces) and
    one after an operator's cursor edit give what they give one harvester at a time."""
    import json

    instance, hs = history.instance, history.harvesters
    first, _, _ = _tick(instance, hs, None)
    edited = json.loads(first)
    edited["since"][hs[2].id] = _day(20)
    edited = json.dumps(edited)
    batched = _tick(instance, hs, first), _tick(instance, hs, edited)
    one_at_a_time(monkeypatch)
    assert batched == (_tick(instance, hs, first), _tick(instance, hs, edited))


def _statements(instance: dg.DagsterInstance, fn: Callable[[], object]) -> int:
    count = [0]

    def seen(*_: object) -> None:
        count[0] += 1

    sa.event.listen(sa.engine.Engine, "before_cursor_execute", seen)
    try:
        fn()
    finally:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", seen)
    return count[0]


def test_statements_do_not_grow_with_the_harvesters(instance: dg.DagsterInstance) -> None:
    """`harvester list`, since resolution and a first sensor tick of 4 and of 12
    harvesters (published, not published, failed after a success) send as many
    statements to the instance."""
    hist = History(instance)
    for i in range(12):
        h = hist.harvester(f"h{i}")
        run_id = hist.run(h, OK, _day(1))
        if i % 3:
            hist.publish(h, _day(1), run_id)
        if i % 3 == 2:
            hist.run(h, FAIL)
    counts = {}
    for n in (2, 4, 12):  # 2: Dagster's first-use statements
        hs = hist.harvesters[:n]
        counts[n] = (_statements(instance, lambda hs=hs: harvester_states(instance, hs)),
                     _statements(instance, lambda hs=hs: current_states(instance, _raw(hs))),
                     _statements(instance, lambda hs=hs: _tick(instance, hs, None)))
    assert counts[4] == counts[12], counts
