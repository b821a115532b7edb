"""The harvest job through Dagster: materializations, checks, records-only re-runs, and the
incremental since (sensor cursor, schedules, resolution order)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import dagster as dg
import pytest

from oaipmh_dagster.definitions import build_definitions
from oaipmh_dagster.defs import sensors
from oaipmh_dagster.defs.assets import asset_keys, op_name
from oaipmh_dagster.defs.since import resolve_since, set_since
from oaipmh_dagster.demo.dataset import ServedRecord, make_dataset
from oaipmh_dagster.storage.registry import Harvester
from oaipmh_dagster.storage.store import Store
from oaipmh_dagster_tests.helpers import add_harvester, expected_snapshot
from oaipmh_dagster_tests.oaiserver import FaultyOAIServer as OAIServer

LOCATION = "oaipmh_dagster"


@pytest.fixture
def server():  # noqa: ANN201
    ds = make_dataset(1500, seed=3, granularity="YYYY-MM-DDThh:mm:ssZ")
    with OAIServer(ds, page_size=250) as srv:
        yield srv


def _defs(h: Harvester) -> dg.Definitions:
    return build_definitions([h], LOCATION)


def _run(h: Harvester, instance: dg.DagsterInstance, config: dict | None = None,
         selection: list[dg.AssetKey] | None = None) -> dg.ExecuteInProcessResult:
    job = _defs(h).resolve_job_def(h.job_name)
    run_config = {"ops": {op_name(h.id): {"config": config or {}}}}
    return job.execute_in_process(run_config=run_config, instance=instance,
                                  asset_selection=selection, raise_on_error=False)


def _mat(result: dg.ExecuteInProcessResult, name: str) -> dg.AssetMaterialization:
    mats = [m for m in result.get_asset_materialization_events()
            if m.asset_key.path[-1] == name]
    assert len(mats) == 1, [m.asset_key for m in result.get_asset_materialization_events()]
    return mats[0].materialization


def _tick_sensor(h: Harvester, instance: dg.DagsterInstance, cursor: str | None) -> str:
    """One since-sensor evaluation, its observations reported as the daemon does."""
    tick = sensors.evaluate(instance, cursor, [h], LOCATION)
    sensors.report(instance, tick)
    return tick.cursor


def _froms(srv: OAIServer) -> list[str]:
    return [r.params["from"][0] for r in srv.requests
            if r.verb == "ListRecords" and "from" in r.params]


def test_job_materializes_raw_then_records(database_url: str, server: OAIServer,
                                           instance: dg.DagsterInstance) -> None:
    h = add_harvester("j", server.base_url)
    result = _run(h, instance)
    assert result.success
    raw = _mat(result, "raw_records").metadata
    records = _mat(result, "records").metadata
    assert raw["records"].value == 1500 and raw["pages"].value == 6
    assert raw["oai/response_date"].value.endswith("Z")
    assert raw["oai/since_source"].value == "none"
    live = sum(1 for r in server.dataset if not r.deleted)
    assert records["dagster/row_count"].value == live
    assert "| oai_identifier" in records["preview"].value
    order = [e.asset_key.path[-1] for e in result.get_asset_materialization_events()]
    assert order == ["raw_records", "records"]
    checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
    assert checks["no_failed_records"].passed
    assert checks["complete_list_size_matches"].passed
    assert Store().snapshot("j") == expected_snapshot(server.dataset)
    assert result.dagster_run.tags["oaipmh/harvester"] == "j"


def test_harvest_op_reads_the_store_counts_once(sqlite_url: str, server: OAIServer,
                                               instance: dg.DagsterInstance,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # Each count is a pass over the harvester's rows (0.3-0.5 s at 500,000 records):
    # the raw_records and records metadata and the two checks share one.
    calls: list[str] = []
    counts, count = Store.counts, Store.count
    monkeypatch.setattr(Store, "counts", lambda self, *a, **k: (
        calls.append("counts"), counts(self, *a, **k))[1])
    monkeypatch.setattr(Store, "count", lambda self, *a, **k: (
        calls.append("count"), count(self, *a, **k))[1])
    h = add_harvester("j", server.base_url)
    result = _run(h, instance)
    assert result.success
    assert calls == ["counts"]
    live = sum(1 for r in server.dataset if not r.deleted)
    assert _mat(result, "raw_records").metadata["dagster/row_count"].value == live
    records = _mat(result, "records").metadata
    assert records["dagster/row_count"].value == live
    assert records["deleted_in_store"].value == len(server.dataset) - live
    checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
    assert checks["no_failed_records"].metadata["failed_in_store"].value == 0


def test_records_only_retransforms_without_server(sqlite_url: str, server: OAIServer,
                                                  instance: dg.DagsterInstance) -> None:
    h = add_harvester("j", server.base_url)
    assert _run(h, instance).success
    server.clear_log()
    _, _, records_key = asset_keys("j")
    result = _run(h, instance, selection=[records_key])
    assert result.success
    assert server.requests == []
    assert _mat(result, "records").metadata["transformed"].value == sum(
        1 for r in server.dataset if not r.deleted)


def test_since_sensor_advances_only_on_success(sqlite_url: str, server: OAIServer,
                                               instance: dg.DagsterInstance) -> None:
    # No client retries: the failed run below fails at once (5 retries back off ~30 s).
    h = add_harvester("j", server.base_url, max_retries=0)
    server.clock = lambda: datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert _run(h, instance).success
    cursor = _tick_sensor(h, instance, None)
    assert json.loads(cursor)["since"] == {"j": "2025-01-02T03:04:05Z"}
    # A failed run (server gone) does not advance it.
    server.clock = lambda: datetime(2025, 6, 1, tzinfo=UTC)
    server.faults.add("status", status=500, times=None)
    failed = _run(h, instance, {"full": True})
    assert not failed.success
    cursor2 = _tick_sensor(h, instance, cursor)
    assert json.loads(cursor2)["since"] == {"j": "2025-01-02T03:04:05Z"}
    # A canceled run does not either.
    run = instance.create_run_for_job(_defs(h).resolve_job_def(h.job_name),
                                      tags={"oaipmh/harvester": "j"})
    instance.report_run_canceled(run)
    cursor3 = _tick_sensor(h, instance, cursor2)
    assert json.loads(cursor3)["since"] == {"j": "2025-01-02T03:04:05Z"}
    # Ticking again changes nothing (the watermark holds).
    assert json.loads(_tick_sensor(h, instance, cursor3))["since"] == json.loads(cursor3)["since"]


def test_day_granularity_is_formatted_as_dates(sqlite_url: str, instance: dg.DagsterInstance
                                               ) -> None:
    ds = make_dataset(50, seed=1, granularity="YYYY-MM-DD")
    with OAIServer(ds) as srv:
        srv.clock = lambda: datetime(2025, 5, 6, 23, 59, 59, tzinfo=UTC)
        h = add_harvester("d", srv.base_url)
        assert _run(h, instance).success
        cursor = json.loads(_tick_sensor(h, instance, None))
        assert cursor["since"]["d"] == "2025-05-06"
        srv.clear_log()
        assert _run(h, instance).success
        assert _froms(srv) == ["2025-05-05"]  # one day of overlap at day granularity


def test_since_resolution_order(sqlite_url: str, server: OAIServer,
                                instance: dg.DagsterInstance) -> None:
    h = add_harvester("j", server.base_url)
    _, raw_key, _ = asset_keys("j")

    def resolve(**kw: object):  # noqa: ANN202
        return resolve_since(instance, h, since=kw.get("since"), full=bool(kw.get("full")),
                             raw_key=raw_key)

    assert resolve().source == "none" and resolve().value is None
    server.clock = lambda: datetime(2025, 1, 1, tzinfo=UTC)
    assert _run(h, instance).success
    assert (resolve().source, resolve().value) == ("run", "2025-01-01T00:00:00Z")
    assert resolve().overlap
    set_since(instance, h, raw_key, "2024-06-01T00:00:00Z")
    assert (resolve().source, resolve().value) == ("operator", "2024-06-01T00:00:00Z")
    assert not resolve().overlap
    assert resolve(full=True).source == "full" and resolve(full=True).value is None
    assert resolve(since="2020-01-01", full=True).value == "2020-01-01"


def test_bare_cursor_mapping_sets_since(sqlite_url: str, server: OAIServer,
                                        instance: dg.DagsterInstance) -> None:
    h = add_harvester("j", server.base_url, cron="*/5 * * * *")
    assert _run(h, instance).success
    # An operator types a bare mapping in the UI to re-harvest from a date.
    _tick_sensor(h, instance, json.dumps({"j": "2024-01-01T00:00:00Z"}))
    server.clear_log()
    result = _run(h, instance)
    assert result.success
    assert _froms(server) == ["2024-01-01T00:00:00Z"]
    expected = sum(1 for r in server.dataset
                   if r.datestamp >= datetime(2024, 1, 1, tzinfo=UTC))
    assert _mat(result, "raw_records").metadata["records"].value == expected


def test_incremental_run_fetches_only_new_records(sqlite_url: str, server: OAIServer,
                                                  instance: dg.DagsterInstance) -> None:
    h = add_harvester("j", server.base_url)
    assert _run(h, instance).success
    _tick_sensor(h, instance, None)
    later = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=2)
    for i in range(3):
        server.dataset.add(ServedRecord(f"oai:demo.example.org:x{i}", later, ("datasets",),
                                        metadata={"oai_dc": "<oai_dc:dc xmlns:oai_dc='http://"
                                                  "www.openarchives.org/OAI/2.0/oai_dc/'/>"}))
    server.clear_log()
    result = _run(h, instance)  # launchpad defaults: incremental
    assert result.success
    raw = _mat(result, "raw_records").metadata
    assert raw["oai/since_source"].value == "run"
    assert (raw["new"].value, raw["records"].value) == (3, 3)
