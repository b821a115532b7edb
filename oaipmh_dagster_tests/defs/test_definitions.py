"""The Definitions builder: names, empty/missing registry, reconstruction from a snapshot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from oaipmh_dagster.contracts import ROWS_KEY, SENSOR_NAME
from oaipmh_dagster.definitions import build_definitions, defs, load_harvesters
from oaipmh_dagster.defs._private import initialization, reconstruction
from oaipmh_dagster.storage import db
from oaipmh_dagster.storage.registry import Harvester, Registry, harvester_table
from oaipmh_dagster_tests.conftest import REPO_ROOT
from oaipmh_dagster_tests.helpers import add_harvester


def _load() -> dg.Definitions:
    return defs()


def test_names_per_harvester(database_url: str) -> None:
    add_harvester("alpha", "http://127.0.0.1:9/oai", cron="0 3 * * *")
    add_harvester("beta_2", "https://example.org/oai", metadata_prefix="datacite",
                  enabled=False, cron="*/5 * * * *")
    d = _load()
    repo = d.get_repository_def()
    for hid in ("alpha", "beta_2"):
        name = f"harvest_oaipmh_records_{hid}"
        job = d.resolve_job_def(name)
        assert job.name == name
        schedule = repo.get_schedule_def(name)
        assert schedule.job_name == name
        keys = {k.to_user_string() for k in job.asset_layer.executable_asset_keys}
        assert keys == {f"oaipmh/{hid}/raw_records", f"oaipmh/{hid}/records"}
        assert job.tags["oaipmh/harvester"] == hid
    assert repo.get_schedule_def("harvest_oaipmh_records_alpha").default_status == (
        dg.DefaultScheduleStatus.RUNNING)
    assert repo.get_schedule_def("harvest_oaipmh_records_beta_2").default_status == (
        dg.DefaultScheduleStatus.STOPPED)
    assert repo.get_sensor_def(SENSOR_NAME).default_status == dg.DefaultSensorStatus.RUNNING
    graph = repo.asset_graph
    src, raw, rec = (dg.AssetKey(["oaipmh", "alpha", n]) for n in ("source", "raw_records",
                                                                   "records"))
    assert graph.get(raw).parent_keys == {src}
    assert graph.get(rec).parent_keys == {raw}
    assert not graph.get(src).is_executable
    assert graph.get(raw).group_name == "oaipmh_alpha"


def test_harvester_without_cron_has_stopped_schedule(sqlite_url: str) -> None:
    add_harvester("nocron", "http://127.0.0.1:9/oai", enabled=True)
    schedule = _load().get_repository_def().get_schedule_def("harvest_oaipmh_records_nocron")
    assert schedule.default_status == dg.DefaultScheduleStatus.STOPPED
    with dg.instance_for_test() as instance:
        ctx = dg.build_schedule_context(instance=instance)
        result = schedule.evaluate_tick(ctx)
    assert not result.run_requests
    assert "no cron" in (result.skip_message or "")


def test_missing_table_gives_empty_location(sqlite_url: str,
                                            caplog: pytest.LogCaptureFixture) -> None:
    engine = db.get_engine(migrate=False)
    assert not db.table_exists(engine, harvester_table.name)
    d = _load()
    assert [j for j in d.get_repository_def().get_all_jobs()
            if not j.name.startswith("__") and j.name != "manage_harvesters"] == []
    assert "no harvester table" in caplog.text
    # Loading must not create anything.
    assert not db.table_exists(engine, harvester_table.name)


def test_unreachable_database_fails_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(db.DATABASE_URL_ENV, "postgresql+psycopg2://postgres@127.0.0.1:1/x")
    db.dispose_all()
    with pytest.raises(db.DatabaseUnavailable, match="cannot reach database"):
        load_harvesters()


def test_invalid_row_is_left_out(sqlite_url: str, caplog: pytest.LogCaptureFixture) -> None:
    add_harvester("good", "http://127.0.0.1:9/oai")
    engine = db.get_engine()
    with engine.begin() as conn:
        conn.execute(harvester_table.update().where(harvester_table.c.id == "good").values(
            id="Bad-ID"))
    add_harvester("other", "http://127.0.0.1:9/oai")
    names = {j.name for j in _load().get_repository_def().get_all_jobs()
             if not j.name.startswith("__") and j.name != "manage_harvesters"}
    assert names == {"harvest_oaipmh_records_other"}
    assert "Bad-ID" in caplog.text


def _reconstruct(rows: list[dict]) -> dg.Definitions:
    with reconstruction({ROWS_KEY: json.dumps(rows)}):
        return _load()


def test_reconstruction_uses_snapshot_not_registry(sqlite_url: str) -> None:
    h = add_harvester("gone", "http://127.0.0.1:9/oai")
    loaded = _load()
    snapshot = json.loads(loaded.metadata[ROWS_KEY].data)
    assert [r["id"] for r in snapshot] == ["gone"]
    Registry().remove("gone")
    assert load_harvesters() == []
    rebuilt = _reconstruct(snapshot)
    job = rebuilt.resolve_job_def(h.job_name)
    # The run worker loads; the run itself fails clearly because the row is gone.
    with dg.instance_for_test() as instance:
        result = job.execute_in_process(instance=instance, raise_on_error=False)
    assert not result.success
    failure = next(e for e in result.all_events if e.is_step_failure)
    message = failure.event_specific_data.error.to_string()
    assert "was removed from the registry" in message


def test_build_definitions_validates_at_scale() -> None:
    harvesters = [Harvester(id=f"h{i}", base_url=f"https://host{i % 7}.example.org/oai",
                            metadata_prefix="oai_dc", cron="0 3 * * *") for i in range(50)]
    d = build_definitions(harvesters)
    dg.Definitions.validate_loadable(d)
    assert len([j for j in d.get_repository_def().get_all_jobs()
                if not j.name.startswith("__") and j.name != "manage_harvesters"]) == 50


@pytest.mark.parametrize("count", [0, 1, 50])
def test_dagster_definitions_validate_cli(count: int, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'reg.sqlite'}"
    env = {**os.environ, db.DATABASE_URL_ENV: url, "DAGSTER_HOME": str(tmp_path)}
    if count:
        engine = db.get_engine(url)
        registry = Registry(engine)
        for i in range(count):
            registry.add(Harvester(id=f"h{i:03d}", base_url="http://127.0.0.1:9/oai",
                                   metadata_prefix="oai_dc", cron="0 4 * * *"))
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("dagster")), "definitions", "validate",
         "-w", str(REPO_ROOT / "workspace.yaml")],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Validation successful" in proc.stdout + proc.stderr


def test_initial_load_hands_rows_to_run_workers(sqlite_url: str) -> None:
    """The rows must reach the load context's pending reconstruction metadata: that, not
    the Definitions' own metadata, is what run workers are rebuilt from."""
    add_harvester("kept", "http://127.0.0.1:9/oai")
    pending: dict[str, str] = {}
    with initialization(pending):
        _load()
    rows = json.loads(pending[ROWS_KEY])
    assert [r["id"] for r in rows] == ["kept"]
    assert Harvester.from_dict(rows[0]) == Registry().get("kept")


def test_contract_names() -> None:
    from oaipmh_dagster import contracts

    assert contracts.job_name("a_1") == "harvest_oaipmh_records_a_1"
    assert contracts.asset_paths("a_1") == (["oaipmh", "a_1", "source"],
                                            ["oaipmh", "a_1", "raw_records"],
                                            ["oaipmh", "a_1", "records"])
    assert contracts.harvester_of(["oaipmh", "a_1", "raw_records"], "raw_records") == "a_1"
    assert contracts.harvester_of(["oaipmh", "a_1", "records"], "raw_records") is None
    assert contracts.harvester_of(["other", "a_1", "records"]) is None
    assert (contracts.HARVESTER_TAG, contracts.HOST_TAG, contracts.SINCE_TAG,
            contracts.SINCE_SOURCE_TAG, contracts.RECONCILE_TAG) == (
        "oaipmh/harvester", "oaipmh/host", "oaipmh/since", "oaipmh/since_source",
        "oaipmh/reconcile")
    assert contracts.host_pool("example.org:8080") == "oaipmh/host/example.org:8080"
    assert contracts.SENSOR_NAME == "oaipmh_since_sensor"
    h = Harvester(id="a_1", base_url="http://example.org:8080/oai", metadata_prefix="oai_dc")
    job = build_definitions([h]).resolve_job_def(h.job_name)
    assert job.tags == {"oaipmh/harvester": "a_1", "oaipmh/host": "example.org:8080"}
    assert [n.name for n in job.graph.node_defs] == [contracts.op_name("a_1")]
    assert job.graph.node_defs[0].pool == contracts.host_pool("example.org:8080")
    # The location's check op reads the store: it takes no slot of a host's pool.
    asset_job = build_definitions([h]).resolve_implicit_global_asset_job_def()
    assert asset_job.graph.node_named(contracts.CHECKS_OP).definition.pool is None
