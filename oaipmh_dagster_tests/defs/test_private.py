"""Dagster's private API, used only in defs/_private.py: the series it was
written for (and pinned to), and each private call exercised, so an upgrade fails here
first."""

from __future__ import annotations

import json
import re
from pathlib import Path

import dagster as dg

from oaipmh_dagster.contracts import ROWS_KEY, SENSOR_NAME
from oaipmh_dagster.definitions import defs
from oaipmh_dagster.defs import _private
from oaipmh_dagster.storage.registry import Harvester
from oaipmh_dagster_tests.instigators import start_schedule, start_sensor

PACKAGE = Path(__file__).resolve().parents[2] / "oaipmh_dagster"


def test_installed_dagster_is_of_the_supported_series() -> None:
    series = ".".join(dg.__version__.split(".")[:2])
    assert series == _private.SUPPORTED_SERIES, (
        f"dagster {dg.__version__} is installed; oaipmh_dagster/defs/_private.py "
        f"was written for the {_private.SUPPORTED_SERIES} series: re-check each function "
        "there (or move to the public fallback its docstring describes), then update "
        "SUPPORTED_SERIES and the pins in pyproject.toml")


def test_pins_hold_dagster_to_the_supported_series() -> None:
    """Each Dagster pin of pyproject.toml is a range within the supported series (the
    libraries' series is the minor plus 16 with a leading 0: 1.13 -> 0.29)."""
    major, minor = map(int, _private.SUPPORTED_SERIES.split("."))
    lib = f"0.{minor + 16}"
    text = (PACKAGE.parent / "pyproject.toml").read_text(encoding="utf-8")
    pins = dict(re.findall(r'"(dagster(?:-[a-z0-9-]+)?)([<>=!~][^"]*)"', text))
    assert {"dagster", "dagster-webserver", "dagster-graphql", "dagster-postgres",
            "dagster-dg-cli", "dagster-k8s", "dagster-docker", "dagster-celery-k8s"} <= set(pins)
    for name, spec in pins.items():
        series = f"{major}.{minor}" if name in _CORE else lib
        upper = f"{major}.{minor + 1}" if name in _CORE else f"0.{minor + 17}"
        assert re.fullmatch(rf">={re.escape(series)}\.\d+,<{re.escape(upper)}", spec), (
            name, spec)


_CORE = {"dagster", "dagster-webserver", "dagster-graphql", "dagster-dg-cli"}


def test_every_private_function_is_exercised_here() -> None:
    source = Path(__file__).read_text(encoding="utf-8")
    names = [n for n, v in vars(_private).items() if not n.startswith("_")
             and getattr(v, "__module__", None) == _private.__name__]
    assert names and all(f"_private.{n}" in source for n in names), [
        n for n in names if f"_private.{n}" not in source]


def test_private_api_is_used_in_one_module_only() -> None:
    private = re.compile(r"\bdagster\._")
    users = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                   if private.search(p.read_text(encoding="utf-8")))
    assert users == ["defs/_private.py"]


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
        assert origin == _private.job_origin("here", job.name)
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


def test_stored_schedule_statuses_one_running_state_wins(sqlite_url: str) -> None:
    with dg.instance_for_test() as instance:
        assert _private.stored_schedule_statuses(instance) == {}
        start_schedule(instance, "harvest_oaipmh_records_a", "here", "0 0 * * *")
        start_schedule(instance, "harvest_oaipmh_records_b", "here", "0 0 * * *")
        _private.stop_schedule_states(instance, "harvest_oaipmh_records_b")
        start_sensor(instance, SENSOR_NAME, "here", "{}")  # not a schedule: left out
        assert _private.stop_schedule_states(instance, SENSOR_NAME) == 0
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
        assert all(isinstance(s, _private.StoredSchedule) for s in stored)
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


def test_batched_event_and_run_reads_answer_as_the_public_calls(sqlite_url: str) -> None:
    """The newest ids of each key's observations, their records and the newest run of
    each tag value are what `fetch_observations` and `get_run_records(limit=1)` give per
    key; a wiped key is left to the public call."""
    observation = dg.DagsterEventType.ASSET_OBSERVATION
    keys = [dg.AssetKey(["p", name]) for name in ("a", "b", "wiped", "none")]
    with dg.instance_for_test() as instance:
        for key, n in zip(keys, (1, 3, 2, 0), strict=True):
            for i in range(n):
                instance.report_runless_asset_event(dg.AssetObservation(key, metadata={"i": i}))
        instance.wipe_assets([keys[2]])
        for i, value in enumerate(("x", "y", "x")):
            instance.add_run(dg.DagsterRun(job_name="j", run_id=f"{i:036d}", tags={"t": value}))
        ids = _private.newest_asset_event_ids(instance, observation, keys, 2)
        assert ids is not None and set(ids) == {keys[0], keys[1], keys[3]}
        for key, found in ids.items():
            assert found == [r.storage_id for r in instance.fetch_observations(key, 2).records]
        records = _private.asset_event_records(instance, [i for v in ids.values() for i in v])
        assert records is not None and {r.storage_id: r for r in records.values()} == {
            r.storage_id: r for key in ids for r in instance.fetch_observations(key, 2).records}
        newest = _private.newest_tagged_run_ids(instance, "t", ["x", "y", "z"])
        assert newest == {v: instance.get_run_records(dg.RunsFilter(tags={"t": v}), limit=1)[0]
                          .dagster_run.run_id for v in ("x", "y")}
