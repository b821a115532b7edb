"""Dagster's private API, used only in dagster_parts/_private.py: the version it was
written for, and each private call exercised, so an upgrade fails here first."""

from __future__ import annotations

import json
import re
from pathlib import Path

import dagster as dg
import pytest

from oaipmh_dagster.contracts import ROWS_KEY, SENSOR_NAME
from oaipmh_dagster.dagster_parts import _private
from oaipmh_dagster.dagster_parts.assets import _harvest_op, build_harvester_assets
from oaipmh_dagster.definitions import defs
from oaipmh_dagster.registry import Harvester
from oaipmh_dagster_tests.instigators import start_schedule, start_sensor

PACKAGE = Path(__file__).resolve().parents[1] / "oaipmh_dagster"


def test_written_for_this_dagster_version() -> None:
    assert dg.__version__ == _private.WRITTEN_FOR, (
        f"dagster {dg.__version__} is installed; oaipmh_dagster/dagster_parts/_private.py "
        f"was written for {_private.WRITTEN_FOR}: re-check each function there (or move to "
        "the public fallback its docstring describes), then update WRITTEN_FOR")


def test_private_api_is_used_in_one_module_only() -> None:
    private = re.compile(r"\bdagster\._")
    users = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                   if private.search(p.read_text(encoding="utf-8")))
    assert users == ["dagster_parts/_private.py"]


def test_renamed_op_is_a_copy_under_another_name() -> None:
    op = _harvest_op()
    copy = _private.renamed_op(op, "harvest_x", "Harvest x.", pool="oaipmh/host/example.org")
    assert (copy.name, copy.description, copy.pool) == ("harvest_x", "Harvest x.",
                                                         "oaipmh/host/example.org")
    assert op.name == "harvest" and op.pool is None  # the shared op is untouched
    assert copy.config_schema is op.config_schema and copy.outs == op.outs
    with pytest.raises(dg.DagsterInvalidDefinitionError):
        _private.renamed_op(op, "not a name", "")


def test_build_job_holds_only_its_own_assets() -> None:
    h = Harvester(id="p", base_url="http://127.0.0.1:9/oai", metadata_prefix="oai_dc")
    other = build_harvester_assets(Harvester(id="q", base_url="http://127.0.0.1:9/oai",
                                             metadata_prefix="oai_dc"))
    assert other
    job = _private.build_job(h.job_name, build_harvester_assets(h),
                             {key: dg.ResourceDefinition.none_resource()
                              for key in _harvest_op().required_resource_keys},
                             description="d",
                             tags={"oaipmh/harvester": "p"})
    assert job.name == h.job_name and job.tags["oaipmh/harvester"] == "p"
    assert {k.to_user_string() for k in job.asset_layer.executable_asset_keys} == {
        "oaipmh/p/raw_records", "oaipmh/p/records"}
    assert [n.name for n in job.graph.node_defs] == ["harvest_p"]


def test_execute_in_location_gives_the_run_its_remote_origin(sqlite_url: str) -> None:
    op_ran = []

    @dg.op
    def noop() -> None:
        op_ran.append(True)

    @dg.job(name="harvest_oaipmh_records_o", tags={"oaipmh/harvester": "o"})
    def job() -> None:
        noop()

    with dg.instance_for_test() as instance:
        result = _private.execute_in_location(job, "here", instance, raise_on_error=False)
        assert result.success and op_ran
        run = instance.get_run_by_id(result.run_id)
        origin = run.remote_job_origin
        assert (origin.location_name, origin.job_name) == ("here", job.name)
        assert origin.repository_origin.repository_name == _private.REPOSITORY_NAME
        label = f"{_private.REPOSITORY_NAME}@here"
        assert run.tags["oaipmh/harvester"] == "o"
        found = instance.get_run_records(dg.RunsFilter(
            job_name=job.name, tags={_private.REPOSITORY_LABEL_TAG: label}))
        assert [r.dagster_run.run_id for r in found] == [result.run_id]
        # The instance is left as it was: the next in-process run has no origin.
        assert "create_run_for_job" not in vars(instance)
        plain = job.execute_in_process(instance=instance)
        assert instance.get_run_by_id(plain.run_id).remote_job_origin is None


def test_load_context_outside_a_code_location_load() -> None:
    context = _private.LoadContext()
    assert context.location_name is None
    assert context.reconstructed(ROWS_KEY) is None
    context.hand_to_run_workers(ROWS_KEY, "[]")  # nothing to hand to: no error


def test_load_context_hands_rows_to_run_workers_and_reads_them_back(sqlite_url: str) -> None:
    pending: dict[str, str] = {}
    with _private.initialization(pending):
        assert _private.LoadContext().reconstructed(ROWS_KEY) is None
        defs()
    assert json.loads(pending[ROWS_KEY]) == []
    row = Harvester(id="r", base_url="http://127.0.0.1:9/oai", metadata_prefix="oai_dc")
    rows = json.dumps([row.to_dict()])
    with _private.reconstruction({ROWS_KEY: rows}):
        assert _private.LoadContext().reconstructed(ROWS_KEY) == rows
        rebuilt = defs()
    assert rebuilt.resolve_job_def(row.job_name).name == row.job_name


def test_read_sensor_cursor_of_a_started_sensor(sqlite_url: str) -> None:
    with dg.instance_for_test() as instance:
        assert _private.read_sensor_cursor(instance, SENSOR_NAME, "here") is None
        for location, cursor in (("here", '{"since": {"a": "2024-01-01"}}'),
                                 ("elsewhere", '{"since": {}}')):
            start_sensor(instance, SENSOR_NAME, location, cursor)
        assert _private.read_sensor_cursor(instance, SENSOR_NAME, "here") == (
            '{"since": {"a": "2024-01-01"}}')
        assert _private.read_sensor_cursor(instance, SENSOR_NAME, None) is None  # two
        assert _private.read_sensor_cursor(instance, "other_sensor", "here") is None
        # (stop_schedule_states: exercised on a real schedule in test_schedule_stop.py)
        assert _private.stop_schedule_states(instance, SENSOR_NAME) == 0  # not a schedule


def test_stored_schedule_statuses_one_running_state_wins(sqlite_url: str) -> None:
    with dg.instance_for_test() as instance:
        assert _private.stored_schedule_statuses(instance) == {}
        start_schedule(instance, "harvest_oaipmh_records_a", "here", "0 0 * * *")
        start_schedule(instance, "harvest_oaipmh_records_b", "here", "0 0 * * *")
        _private.stop_schedule_states(instance, "harvest_oaipmh_records_b")
        start_sensor(instance, SENSOR_NAME, "here", "{}")  # not a schedule: left out
        assert _private.stored_schedule_statuses(instance) == {
            "harvest_oaipmh_records_a": "RUNNING", "harvest_oaipmh_records_b": "STOPPED"}


def test_stored_schedules_name_their_location_and_can_be_forgotten(sqlite_url: str) -> None:
    with dg.instance_for_test() as instance:
        start_schedule(instance, "harvest_oaipmh_records_a", "loc_shard_0", "0 0 * * *")
        start_schedule(instance, "harvest_oaipmh_records_a", "loc_shard_1", "0 0 * * *")
        _private.stop_schedule_states(instance, "harvest_oaipmh_records_a")
        start_schedule(instance, "harvest_oaipmh_records_b", "loc_shard_1", "0 0 * * *")
        start_sensor(instance, SENSOR_NAME, "loc_shard_1", "{}")  # not a schedule
        stored = sorted(_private.stored_schedules(instance), key=lambda s: (s.name, s.location))
        assert [(s.name, s.location, s.running) for s in stored] == [
            ("harvest_oaipmh_records_a", "loc_shard_0", False),
            ("harvest_oaipmh_records_a", "loc_shard_1", False),
            ("harvest_oaipmh_records_b", "loc_shard_1", True)]
        _private.forget_schedule(instance, stored[0])
        assert sorted((s.name, s.location) for s in _private.stored_schedules(instance)) == [
            ("harvest_oaipmh_records_a", "loc_shard_1"),
            ("harvest_oaipmh_records_b", "loc_shard_1")]


def test_forget_defs_state_storage_lets_a_later_load_succeed(sqlite_url: str) -> None:
    with dg.instance_for_test():
        pass
    _private.forget_defs_state_storage()
    assert defs().get_repository_def() is not None
