"""End to end: two Materialize clicks on one harvester's assets under a real `dagster dev`
(shipped dagster.yaml: queued runs, op-level host pools).

The asset graph's Materialize button launches Dagster's implicit asset job
(`__ASSET_JOB`), which the harvester's run tags and their run-queue limits do not govern.
A second click while the first harvest is still reading a slow server must neither fail
nor harvest alongside it: it waits for the store's lease, harvests after the first one,
both runs end in SUCCESS, and the since sensor then shows the second run's since."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from oaipmh_dagster.defs.assets import asset_keys
from oaipmh_dagster.demo.dataset import SECONDS, make_dataset
from oaipmh_dagster.demo.server import OAIServer, Reply, RequestInfo, RequestLog
from oaipmh_dagster_tests.e2e.conftest import LOCATION, REPOSITORY, DagsterDev, wait_for
from oaipmh_dagster_tests.e2e.test_dagster_dev import (
    RUN_TIMEOUT,
    TERMINAL,
    assert_success,
    parse_stamp,
    raw_metadata,
    run_next_since,
    run_status,
    run_text,
    wait_cursor,
)
from oaipmh_dagster_tests.helpers import add_harvester, expected_snapshot

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

HARVESTER = "e2e_twice"
ASSET_JOB = "__ASSET_JOB"
RECORDS = 200
PAGE_SIZE = 25  # 8 pages + Identify: 9 answers


class HeldServer(OAIServer):
    """Holds every ListRecords answer until `release` is set (or RUN_TIMEOUT passes): the
    first harvest keeps the lease, however long the second run takes to start on a loaded
    machine, until the test has seen the second run wait for it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.release = threading.Event()

    def handle(self, request: RequestInfo) -> Reply:
        if request.verb == "ListRecords":
            self.release.wait(RUN_TIMEOUT)
        return super().handle(request)

# What the UI's LaunchAssetExecutionButton sends (LaunchPipelineExecution mutation).
LAUNCH_PIPELINE_EXECUTION = """
mutation LaunchPipelineExecution($executionParams: ExecutionParams!) {
  launchPipelineExecution(executionParams: $executionParams) {
    __typename
    ... on LaunchRunSuccess { run { id pipelineName } }
    ... on PipelineNotFoundError { message }
    ... on InvalidSubsetError { message }
    ... on RunConfigValidationInvalid { errors { message } }
    ... on PythonError { message }
  }
}"""
ASSET_NODES = """
query Assets($keys: [AssetKeyInput!]!) {
  assetNodes(assetKeys: $keys) {
    assetKey { path } jobNames
    assetChecksOrError { __typename ... on AssetChecks { checks { name jobNames } } }
  }
}"""


def materialize_params(dev: DagsterDev, paths: list[list[str]]) -> dict[str, Any]:
    """The execution params the Materialize button builds for `paths` on the implicit
    asset job: the assets, their checks that the job runs, an empty run config."""
    nodes = dev.graphql(ASSET_NODES, {"keys": [{"path": p} for p in paths]})["assetNodes"]
    assert sorted(n["assetKey"]["path"] for n in nodes) == sorted(paths), nodes
    for node in nodes:
        assert ASSET_JOB in node["jobNames"], node
    checks = [
        {"name": check["name"], "assetKey": {"path": node["assetKey"]["path"]}}
        for node in nodes if node["assetChecksOrError"]["__typename"] == "AssetChecks"
        for check in node["assetChecksOrError"]["checks"]
        if not check["jobNames"] or ASSET_JOB in check["jobNames"]
    ]
    return {
        "mode": "default",
        "executionMetadata": {"tags": []},
        "runConfigData": "{}",
        "selector": {
            "repositoryLocationName": LOCATION,
            "repositoryName": REPOSITORY,
            "pipelineName": ASSET_JOB,
            "assetSelection": [{"path": p} for p in paths],
            "assetCheckSelection": checks,
        },
    }


def click_materialize(dev: DagsterDev, params: dict[str, Any]) -> str:
    result = dev.graphql(LAUNCH_PIPELINE_EXECUTION,
                         {"executionParams": params})["launchPipelineExecution"]
    assert result["__typename"] == "LaunchRunSuccess", result
    assert result["run"]["pipelineName"] == ASSET_JOB
    return result["run"]["id"]


def harvest_blocks(server: OAIServer) -> list[list[RequestLog]]:
    """The server's requests split into harvests (each starts with Identify), in order."""
    blocks: list[list[RequestLog]] = []
    for request in sorted(server.requests, key=lambda r: r.started):
        if request.verb == "Identify" or not blocks:
            blocks.append([])
        blocks[-1].append(request)
    return blocks


@pytest.mark.parametrize("storage", ["sqlite"], indirect=True)
def test_two_materialize_clicks_harvest_one_after_the_other(start_dagster_dev) -> None:  # noqa: ANN001
    server = HeldServer(make_dataset(RECORDS, seed=7, granularity=SECONDS),
                        page_size=PAGE_SIZE).start()
    try:
        add_harvester(HARVESTER, server.base_url)
        dev = start_dagster_dev()
        _, raw_key, records_key = asset_keys(HARVESTER)
        params = materialize_params(dev, [raw_key.path, records_key.path])

        # First click; the second once the first harvest is talking to the server (it
        # holds the lease from before its Identify on).
        first = click_materialize(dev, params)
        wait_for("the first harvest's Identify",
                 lambda: any(r.verb == "Identify" for r in server.requests), RUN_TIMEOUT,
                 interval=0.2, on_timeout=lambda: run_text(dev, first) + dev.log_tail())
        second = click_materialize(dev, params)
        assert run_status(dev, first)["status"] not in TERMINAL, "the runs must overlap"
        wait_for("the second run to wait for the first's lease",
                 lambda: f"waiting for run {first}" in run_text(dev, second), RUN_TIMEOUT,
                 on_timeout=lambda: run_text(dev, second) + dev.log_tail())
        server.release.set()

        assert_success(dev, first)
        assert_success(dev, second)

        # The second waited for the first's lease; the first never waited.
        first_log, second_log = run_text(dev, first), run_text(dev, second)
        assert f"waiting for run {first}" in second_log, second_log
        assert f"took the lease of {HARVESTER} after waiting" in second_log, second_log
        assert "waiting for run" not in first_log, first_log

        # Their harvests did not overlap: the second's first request started after the
        # first's last answer was sent, and each read the whole list.
        blocks = harvest_blocks(server)
        assert len(blocks) == 2, [[r.verb for r in b] for b in blocks]
        assert all(r.finished is not None for r in blocks[0])
        assert max(r.finished for r in blocks[0]) <= blocks[1][0].started
        expected = len(expected_snapshot(server.dataset))
        pages = -(-expected // PAGE_SIZE)
        verbs = [[r.verb for r in block] for block in blocks]
        assert verbs[0] == ["Identify"] + ["ListRecords"] * pages, verbs
        assert verbs[1][1:] and set(verbs[1][1:]) == {"ListRecords"}, verbs
        meta = raw_metadata(dev, first)
        assert (meta["oai/mode"], meta["records"]) == ("full", expected), meta

        # Since advanced with each, and the sensor shows the newer (the second's) date.
        first_since, second_since = run_next_since(dev, first), run_next_since(dev, second)
        assert parse_stamp(second_since) > parse_stamp(first_since)
        wait_cursor(dev, HARVESTER, second_since)
    finally:
        server.stop()
