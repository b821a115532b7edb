"""End to end, under one real `dagster dev` with the shipped dagster.yaml (queued runs,
op-level host pools), runs launched over GraphQL as the UI sends them:

- the asset graph's Materialize (implicit asset job): the run carries the harvester's and
  the host's tags, `harvester list` shows it as the last run, its checks ran after it;
- a check's Execute button (implicit asset job, no asset, one check): SUCCESS, the check's
  evaluation recorded, no materialization, no request to the server;
- `oaipmh-dagster harvest`: the job's Runs tab (job name + repository label) lists it;
- two Materialize clicks on one harvester's assets: the implicit asset job, which the
  harvester's run tags and their run-queue limits do not govern. A second click while the
  first harvest is still reading a slow server must neither fail nor harvest alongside
  it: it waits for the store's lease, harvests after the first one, both runs end in
  SUCCESS, and the since sensor then shows the second run's since.

The tests share the `dagster dev` (started once for the module): each has its own
harvester and loopback server, registered before the start."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from oaipmh_dagster.contracts import CHECK_COMPLETE, CHECK_NO_FAILED, HARVESTER_TAG, HOST_TAG
from oaipmh_dagster.defs.assets import asset_keys
from oaipmh_dagster.demo.dataset import SECONDS, make_dataset
from oaipmh_dagster.demo.server import OAIServer, Reply, RequestInfo, RequestLog
from oaipmh_dagster.storage import db
from oaipmh_dagster.storage.registry import Harvester
from oaipmh_dagster_tests.e2e.conftest import (
    LOCATION,
    REPOSITORY,
    DagsterDev,
    launch_dagster_dev,
    make_storage,
    stop_all,
    wait_for,
)
from oaipmh_dagster_tests.e2e.test_dagster_dev import (
    RUN_TIMEOUT,
    TERMINAL,
    assert_success,
    job_name,
    parse_stamp,
    raw_metadata,
    run_next_since,
    run_status,
    run_tags,
    run_text,
    wait_cursor,
)
from oaipmh_dagster_tests.helpers import add_harvester, expected_snapshot

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

BUTTONS = "e2e_buttons"
TWICE = "e2e_twice"
ASSET_JOB = "__ASSET_JOB"
RECORDS = 200
PAGE_SIZE = 25  # 8 pages + Identify: 9 answers
CHECK_EXECUTIONS = """
query Check($key: AssetKeyInput!, $name: String!) {
  assetCheckExecutions(assetKey: $key, checkName: $name, limit: 5) { runId status }
}"""
JOB_RUNS = """
query Runs($filter: RunsFilter!) {
  runsOrError(filter: $filter) { __typename ... on Runs { results { runId } } }
}"""


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
    return asset_job_params([{"path": p} for p in paths], checks)


def asset_job_params(assets: list[dict[str, Any]], checks: list[dict[str, Any]]
                     ) -> dict[str, Any]:
    """Execution params of the implicit asset job for these assets and checks, as the
    UI sends them (default mode, no tags, an empty run config)."""
    return {
        "mode": "default",
        "executionMetadata": {"tags": []},
        "runConfigData": "{}",
        "selector": {
            "repositoryLocationName": LOCATION,
            "repositoryName": REPOSITORY,
            "pipelineName": ASSET_JOB,
            "assetSelection": assets,
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


def execute_check_params(path: list[str], check: str) -> dict[str, Any]:
    """What a check's Execute button sends: the implicit asset job, no asset, one check."""
    return asset_job_params([], [{"name": check, "assetKey": {"path": path}}])


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


@dataclass
class Session:
    """The shared `dagster dev`, and each test's harvester with its server."""

    dev: DagsterDev
    buttons: Harvester
    plain: OAIServer
    held: HeldServer


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    """One `dagster dev` on SQLite for the module, both harvesters registered first."""
    tmp = tmp_path_factory.mktemp("e2e_ui")
    storage = make_storage("sqlite", tmp)
    plain = OAIServer(make_dataset(40, seed=3, granularity=SECONDS), page_size=20).start()
    held = HeldServer(make_dataset(RECORDS, seed=7, granularity=SECONDS),
                      page_size=PAGE_SIZE).start()
    started: list[DagsterDev] = []
    try:
        with pytest.MonkeyPatch.context() as env:
            env.setenv(db.DATABASE_URL_ENV, storage.database_url)
            buttons = add_harvester(BUTTONS, plain.base_url)
            add_harvester(TWICE, held.base_url)
            db.dispose_all()
        yield Session(launch_dagster_dev(storage, tmp, started), buttons, plain, held)
    finally:
        stop_all(started)
        held.release.set()
        held.stop()
        plain.stop()
        db.dispose_all()


def test_ui_buttons_and_the_cli_run(session: Session) -> None:
    dev, h, server = session.dev, session.buttons, session.plain
    _, raw_key, records_key = asset_keys(BUTTONS)

    # Materialize from the asset graph: tagged, listed, its checks evaluated.
    run_id = click_materialize(dev, materialize_params(dev, [raw_key.path,
                                                             records_key.path]))
    assert_success(dev, run_id)
    tags = run_tags(dev, run_id)
    assert (tags[HARVESTER_TAG], tags[HOST_TAG]) == (BUTTONS, h.host), tags
    listed = json.loads(cli(dev, "harvester", "list", "--json").stdout)
    (mine,) = [row for row in listed if row["id"] == BUTTONS]
    assert mine["state"]["last_run"]["run_id"] == run_id, listed
    assert check_runs(dev, records_key.path, CHECK_NO_FAILED) == {run_id: "SUCCEEDED"}

    # A check's Execute button: the check alone.
    server.clear_log()
    check_run = click_materialize(dev, execute_check_params(raw_key.path, CHECK_COMPLETE))
    assert_success(dev, check_run)
    assert check_runs(dev, raw_key.path, CHECK_COMPLETE)[check_run] == "SUCCEEDED"
    assert materialized_keys(dev, check_run) == []
    assert server.requests == []

    # A CLI run is in the job's Runs tab, as the UI filters it.
    done = cli(dev, "harvest", BUTTONS)
    cli_run = done.stdout.split()[1]
    label = {"key": ".dagster/repository", "value": f"{REPOSITORY}@{LOCATION}"}
    runs = dev.graphql(JOB_RUNS, {"filter": {"pipelineName": job_name(BUTTONS),
                                             "tags": [label]}})["runsOrError"]
    assert cli_run in [r["runId"] for r in runs["results"]], (runs, done.stdout)


def test_two_materialize_clicks_harvest_one_after_the_other(session: Session) -> None:
    dev, server = session.dev, session.held
    _, raw_key, records_key = asset_keys(TWICE)
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
    assert f"took the lease of {TWICE} after waiting" in second_log, second_log
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
    wait_cursor(dev, TWICE, second_since)
