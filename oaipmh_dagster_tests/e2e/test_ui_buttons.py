"""End to end, under a real `dagster dev` with the shipped dagster.yaml, runs launched over
GraphQL as the UI sends them:

- the asset graph's Materialize (implicit asset job): the run carries the harvester's and
  the host's tags, `harvester list` shows it as the last run, its checks ran after it;
- a check's Execute button (implicit asset job, no asset, one check): SUCCESS, the check's
  evaluation recorded, no materialization, no request to the server;
- `oaipmh-dagster harvest`: the job's Runs tab (job name + repository label) lists it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from oaipmh_dagster.contracts import CHECK_COMPLETE, CHECK_NO_FAILED, HARVESTER_TAG, HOST_TAG
from oaipmh_dagster.defs.assets import asset_keys
from oaipmh_dagster.demo.dataset import SECONDS, make_dataset
from oaipmh_dagster.demo.server import OAIServer
from oaipmh_dagster_tests.e2e.conftest import LOCATION, REPOSITORY, DagsterDev
from oaipmh_dagster_tests.e2e.test_dagster_dev import assert_success, job_name, run_tags
from oaipmh_dagster_tests.e2e.test_materialize_twice import (
    ASSET_JOB,
    click_materialize,
    materialize_params,
)
from oaipmh_dagster_tests.helpers import add_harvester

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

HARVESTER = "e2e_buttons"
CHECK_EXECUTIONS = """
query Check($key: AssetKeyInput!, $name: String!) {
  assetCheckExecutions(assetKey: $key, checkName: $name, limit: 5) { runId status }
}"""
JOB_RUNS = """
query Runs($filter: RunsFilter!) {
  runsOrError(filter: $filter) { __typename ... on Runs { results { runId } } }
}"""


def execute_check_params(path: list[str], check: str) -> dict[str, Any]:
    """What a check's Execute button sends: the implicit asset job, no asset, one check."""
    return {
        "mode": "default",
        "executionMetadata": {"tags": []},
        "runConfigData": "{}",
        "selector": {
            "repositoryLocationName": LOCATION,
            "repositoryName": REPOSITORY,
            "pipelineName": ASSET_JOB,
            "assetSelection": [],
            "assetCheckSelection": [{"name": check, "assetKey": {"path": path}}],
        },
    }


def check_runs(dev: DagsterDev, path: list[str], check: str) -> dict[str, str]:
    executions = dev.graphql(CHECK_EXECUTIONS, {"key": {"path": path}, "name": check})
    return {e["runId"]: e["status"] for e in executions["assetCheckExecutions"]}


def materialized_keys(dev: DagsterDev, run_id: str) -> list[list[str]]:
    from dagster._core.events import DagsterEventType

    records = dev.instance().get_records_for_run(
        run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION).records
    return [r.event_log_entry.asset_materialization.asset_key.path for r in records]


def cli(dev: DagsterDev, *argv: str) -> subprocess.CompletedProcess:
    command = Path(sys.executable).with_name("oaipmh-dagster")
    done = subprocess.run([str(command), *argv], env=dev.env(), capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


@pytest.mark.parametrize("storage", ["sqlite"], indirect=True)
def test_ui_buttons_and_the_cli_run(start_dagster_dev) -> None:  # noqa: ANN001
    server = OAIServer(make_dataset(40, seed=3, granularity=SECONDS), page_size=20).start()
    try:
        h = add_harvester(HARVESTER, server.base_url)
        dev = start_dagster_dev()
        _, raw_key, records_key = asset_keys(HARVESTER)

        # Materialize from the asset graph: tagged, listed, its checks evaluated.
        run_id = click_materialize(dev, materialize_params(dev, [raw_key.path,
                                                                 records_key.path]))
        assert_success(dev, run_id)
        tags = run_tags(dev, run_id)
        assert (tags[HARVESTER_TAG], tags[HOST_TAG]) == (HARVESTER, h.host), tags
        listed = json.loads(cli(dev, "harvester", "list", "--json").stdout)
        assert listed[0]["state"]["last_run"]["run_id"] == run_id, listed
        assert check_runs(dev, records_key.path, CHECK_NO_FAILED) == {run_id: "SUCCEEDED"}

        # A check's Execute button: the check alone.
        server.clear_log()
        check_run = click_materialize(dev, execute_check_params(raw_key.path, CHECK_COMPLETE))
        assert_success(dev, check_run)
        assert check_runs(dev, raw_key.path, CHECK_COMPLETE)[check_run] == "SUCCEEDED"
        assert materialized_keys(dev, check_run) == []
        assert server.requests == []

        # A CLI run is in the job's Runs tab, as the UI filters it.
        done = cli(dev, "harvest", HARVESTER)
        cli_run = done.stdout.split()[1]
        label = {"key": ".dagster/repository", "value": f"{REPOSITORY}@{LOCATION}"}
        runs = dev.graphql(JOB_RUNS, {"filter": {"pipelineName": job_name(HARVESTER),
                                                 "tags": [label]}})["runsOrError"]
        assert cli_run in [r["runId"] for r in runs["results"]], (runs, done.stdout)
    finally:
        server.stop()
