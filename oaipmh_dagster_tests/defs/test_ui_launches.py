"""Runs launched the way the Dagster UI launches them, in process: a check's Execute
button (the implicit asset job with no asset selected and one check), the asset graph's
Materialize (the implicit asset job), and the CLI's `harvest` seen from the job's Runs tab
(its job name and repository label). On SQLite and PostgreSQL where the store is read."""

from __future__ import annotations

import dagster as dg
import pytest

from oaipmh_dagster.cli.runner import run_harvest_job
from oaipmh_dagster.contracts import (
    CHECK_COMPLETE,
    CHECK_NO_FAILED,
    HARVESTER_TAG,
    HOST_TAG,
    SCHEDULE_TAG,
)
from oaipmh_dagster.definitions import build_definitions
from oaipmh_dagster.defs import _private
from oaipmh_dagster.defs.assets import asset_keys
from oaipmh_dagster.defs.harvester_state import last_run
from oaipmh_dagster.defs.schedules import active_run
from oaipmh_dagster.demo.dataset import make_dataset
from oaipmh_dagster.storage.registry import Harvester
from oaipmh_dagster_tests.defs.test_since import run_job
from oaipmh_dagster_tests.helpers import add_harvester
from oaipmh_dagster_tests.oaiserver import FaultyOAIServer as OAIServer

LOCATION = "oaipmh_dagster"


@pytest.fixture
def server():  # noqa: ANN201
    with OAIServer(make_dataset(60, seed=11, deleted_ratio=0.1), page_size=20) as srv:
        yield srv


def asset_job(*hs: Harvester) -> dg.JobDefinition:
    """Dagster's implicit asset job (`__ASSET_JOB`) of a location holding `hs`."""
    return build_definitions(list(hs), LOCATION).resolve_implicit_global_asset_job_def()


def execute_check(h: Harvester, instance: dg.DagsterInstance,
                  *checks: dg.AssetCheckKey) -> dg.ExecuteInProcessResult:
    """What a check's Execute button launches: no asset, the checks alone."""
    job = asset_job(h).get_subset(asset_selection=set(), asset_check_selection=set(checks))
    return job.execute_in_process(instance=instance, raise_on_error=False)


def check_key(harvester_id: str, name: str) -> dg.AssetCheckKey:
    _, raw_key, records_key = asset_keys(harvester_id)
    return dg.AssetCheckKey(records_key if name == CHECK_NO_FAILED else raw_key, name)


def test_a_check_executes_alone_from_the_store(database_url: str, server: OAIServer,
                                               instance: dg.DagsterInstance) -> None:
    h = add_harvester("alone", server.base_url)
    harvested = run_job(h, instance)
    assert harvested.success
    server.clear_log()
    for name in (CHECK_NO_FAILED, CHECK_COMPLETE):
        result = execute_check(h, instance, check_key(h.id, name))
        assert result.success, name
        assert result.get_asset_materialization_events() == []  # no harvest
        (evaluation,) = result.get_asset_check_evaluations()
        assert (evaluation.check_name, evaluation.passed) == (name, True)
    assert server.requests == []
    # The list-size result is the last materialization's: one list, judged.
    complete = execute_check(h, instance, check_key(h.id, CHECK_COMPLETE))
    (evaluation,) = complete.get_asset_check_evaluations()
    assert evaluation.metadata["lists_judged"].value == 1
    assert evaluation.metadata["judged_run"].value == harvested.run_id
    # A check-only run is not a harvest: the harvester's views do not count it.
    assert HARVESTER_TAG not in complete.dagster_run.tags
    assert last_run(instance, h.id)["run_id"] == harvested.run_id


def test_a_check_before_any_harvest_has_nothing_to_judge(
        sqlite_url: str, instance: dg.DagsterInstance) -> None:
    h = add_harvester("never", "http://127.0.0.1:9/oai")
    result = execute_check(h, instance, check_key(h.id, CHECK_COMPLETE),
                           check_key(h.id, CHECK_NO_FAILED))
    assert result.success
    evaluations = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert evaluations[CHECK_COMPLETE].passed
    assert "no harvest" in evaluations[CHECK_COMPLETE].metadata["note"].value
    assert evaluations[CHECK_NO_FAILED].passed


def test_materialize_from_the_graph_tags_the_run(database_url: str, server: OAIServer,
                                                 instance: dg.DagsterInstance) -> None:
    h = add_harvester("graph", server.base_url)
    _, raw_key, records_key = asset_keys(h.id)
    result = asset_job(h).execute_in_process(instance=instance, raise_on_error=False,
                                             asset_selection=[raw_key, records_key])
    assert result.success
    run = instance.get_run_by_id(result.run_id)
    assert (run.tags[HARVESTER_TAG], run.tags[HOST_TAG]) == (h.id, h.host)
    assert SCHEDULE_TAG not in run.tags
    assert last_run(instance, h.id)["run_id"] == result.run_id
    # The checks ran after the harvest, in the same run.
    names = {e.check_name for e in result.get_asset_check_evaluations()}
    assert names == {CHECK_NO_FAILED, CHECK_COMPLETE}
    # Re-materializing records alone is tagged as well.
    again = asset_job(h).execute_in_process(instance=instance, raise_on_error=False,
                                            asset_selection=[records_key])
    assert again.success
    assert instance.get_run_by_id(again.run_id).tags[HARVESTER_TAG] == h.id


def test_a_run_of_two_harvesters_is_not_tagged_as_either(
        sqlite_url: str, server: OAIServer, instance: dg.DagsterInstance) -> None:
    a, b = add_harvester("two_a", server.base_url), add_harvester("two_b", server.base_url)
    keys = [asset_keys(a.id)[2], asset_keys(b.id)[2]]
    result = asset_job(a, b).execute_in_process(instance=instance, raise_on_error=False,
                                                asset_selection=keys)
    assert result.success
    assert HARVESTER_TAG not in instance.get_run_by_id(result.run_id).tags
    assert active_run(instance, a.id) is None


def test_a_cli_run_shows_in_its_jobs_runs_tab(database_url: str, server: OAIServer,
                                             instance: dg.DagsterInstance) -> None:
    h = add_harvester("cli", server.base_url)
    ok, message = run_harvest_job(instance, h.id, {}, location=LOCATION)
    assert ok, message
    label = f"{_private.REPOSITORY_NAME}@{LOCATION}"
    # The job's Runs tab asks for its name and its repository's label.
    records = instance.get_run_records(filters=dg.RunsFilter(
        job_name=h.job_name, tags={_private.REPOSITORY_LABEL_TAG: label}))
    assert [r.dagster_run.run_id for r in records] == [message.split()[1]]
    origin = records[0].dagster_run.remote_job_origin
    assert origin is not None and origin.location_name == LOCATION
    assert origin.job_name == h.job_name


def test_the_harvest_command_names_the_location_it_knows(
        sqlite_url: str, server: OAIServer, run, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    h = add_harvester("named", server.base_url)
    # No webserver answers and no location is named: the run has no origin (as before).
    first = run("harvest", h.id)
    assert first.code == 0, first.err
    monkeypatch.setenv("OAIPMH_DAGSTER_LOCATION", "oaipmh_dagster_b")
    second = run("harvest", h.id)
    assert second.code == 0, second.err
    with dg.DagsterInstance.get() as instance:
        origins = {r.dagster_run.run_id: r.dagster_run.remote_job_origin
                   for r in instance.get_run_records(dg.RunsFilter(job_name=h.job_name))}
    assert origins[first.out.split()[1]] is None
    assert origins[second.out.split()[1]].location_name == "oaipmh_dagster_b"
