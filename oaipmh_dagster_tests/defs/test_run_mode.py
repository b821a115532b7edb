"""Runs launched without the schedule (the Launchpad, the asset graph's Materialize,
`oaipmh-dagster harvest`) carry `oaipmh/mode` too, set by the op when it starts from the
since in force, as the schedule computes it at tick time; a run that has one keeps it."""

from __future__ import annotations

import dagster as dg
import pytest

from oaipmh_dagster.contracts import MODE_TAG
from oaipmh_dagster.defs.assets import asset_keys
from oaipmh_dagster.demo.dataset import make_dataset
from oaipmh_dagster_tests.defs.test_since import run_job
from oaipmh_dagster_tests.defs.test_ui_launches import asset_job
from oaipmh_dagster_tests.helpers import add_harvester
from oaipmh_dagster_tests.oaiserver import FaultyOAIServer as OAIServer


@pytest.fixture
def server():  # noqa: ANN201
    with OAIServer(make_dataset(30, seed=5), page_size=10) as srv:
        yield srv


def _tags(instance: dg.DagsterInstance, result: dg.ExecuteInProcessResult) -> dict[str, str]:
    assert result.success
    run = instance.get_run_by_id(result.run_id)
    assert run is not None
    return dict(run.tags)


def test_a_launchpad_run_is_tagged_from_the_since_in_force(
        sqlite_url: str, server: OAIServer, instance: dg.DagsterInstance) -> None:
    h = add_harvester("pad", server.base_url)
    assert _tags(instance, run_job(h, instance))[MODE_TAG] == "full"  # never harvested
    # The first run's since is in force (its materialization, not yet published).
    assert _tags(instance, run_job(h, instance))[MODE_TAG] == "incremental"
    assert _tags(instance, run_job(h, instance, {"full": True}))[MODE_TAG] == "full"
    assert _tags(instance, run_job(h, instance, {"since": "2020-01-01"}))[MODE_TAG] == (
        "incremental")
    # A few identifiers are no list: never a full harvest.
    some = [next(iter(server.dataset)).identifier]
    h2 = add_harvester("ids", server.base_url)
    assert _tags(instance, run_job(h2, instance, {"oai_ids": some}))[MODE_TAG] == "incremental"
    # Re-transforming the stored records harvests nothing: no mode.
    records_only = run_job(h, instance, selection=[asset_keys(h.id)[2]])
    assert MODE_TAG not in _tags(instance, records_only)


def test_a_run_tagged_at_launch_keeps_its_mode(
        sqlite_url: str, server: OAIServer, instance: dg.DagsterInstance) -> None:
    """A scheduled run's tag says what the tick saw; the op does not rewrite it."""
    h = add_harvester("kept", server.base_url)
    job = asset_job(h)
    _, raw_key, records_key = asset_keys(h.id)
    result = job.execute_in_process(instance=instance, asset_selection=[raw_key, records_key],
                                    tags={MODE_TAG: "incremental"})
    assert _tags(instance, result)[MODE_TAG] == "incremental"


def test_materialize_from_the_graph_is_tagged(
        sqlite_url: str, server: OAIServer, instance: dg.DagsterInstance) -> None:
    h = add_harvester("graph", server.base_url)
    _, raw_key, records_key = asset_keys(h.id)
    result = asset_job(h).execute_in_process(instance=instance,
                                             asset_selection=[raw_key, records_key])
    tags = _tags(instance, result)
    assert (tags[MODE_TAG], tags["oaipmh/harvester"]) == ("full", h.id)


def test_the_harvest_command_tags_its_runs(sqlite_url: str, server: OAIServer, run) -> None:  # noqa: ANN001
    h = add_harvester("cli", server.base_url)
    first, second = run("harvest", h.id), run("harvest", h.id)
    assert (first.code, second.code) == (0, 0), first.err + second.err
    with dg.DagsterInstance.get() as instance:
        modes = {r.dagster_run.run_id: r.dagster_run.tags.get(MODE_TAG)
                 for r in instance.get_run_records(dg.RunsFilter(job_name=h.job_name))}
    assert modes == {first.out.split()[1]: "full", second.out.split()[1]: "incremental"}
