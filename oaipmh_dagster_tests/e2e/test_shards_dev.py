"""End to end: a real `dagster dev` on a workspace of three shard locations (written by
`oaipmh-dagster workspace --shards 3`). Each location serves only its shard's
harvesters; `oaipmh-dagster harvester add` reloads only the location that holds the new
harvester; its job runs there, and only that location's since sensor publishes its
since. Then a re-shard to four locations keeps the schedules switched on in the UI, of
a harvester that moves and of one that stays."""

from __future__ import annotations

import json
import subprocess
import sys
from functools import partial
from itertools import count
from pathlib import Path
from typing import Any

import pytest

from oaipmh_dagster.contracts import JOB_PREFIX, SENSOR_NAME, job_name, op_name
from oaipmh_dagster.demo.dataset import SECONDS, make_dataset
from oaipmh_dagster.demo.server import OAIServer
from oaipmh_dagster.operations.shards import Shard, shard_of
from oaipmh_dagster_tests.e2e.conftest import (
    REPOSITORY,
    DagsterDev,
    stop_process_group,
    wait_for,
)
from oaipmh_dagster_tests.e2e.test_dagster_dev import (
    JOBS,
    LAUNCH,
    SCHEDULE,
    SENSOR,
    START_SCHEDULE,
    Steps,
    assert_success,
    run_next_since,
    wait_run,
)
from oaipmh_dagster_tests.helpers import add_harvester

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SHARDS = 3
LOCATIONS = [Shard(i, SHARDS).location_name() for i in range(SHARDS)]
CLI = Path(sys.executable).with_name("oaipmh-dagster")
SENSOR_TIMEOUT = 180.0  # the sensor ticks every 5 s here (conftest): room for a loaded machine
YEARLY = "17 3 1 1 *"
ENTRIES = """{ workspaceOrError { __typename ... on Workspace {
  locationEntries { name loadStatus updatedTimestamp } } } }"""


def _ids(prefix: str, shard: int, n: int) -> list[str]:
    """The first `n` ids `<prefix>_<k>` that shard `shard` holds."""
    found = (f"{prefix}_{k}" for k in count() if shard_of(f"{prefix}_{k}", SHARDS) == shard)
    return [next(found) for _ in range(n)]


def _entries(dev: DagsterDev) -> dict[str, dict[str, Any]]:
    data = dev.graphql(ENTRIES)["workspaceOrError"]
    assert data["__typename"] == "Workspace", data
    return {e["name"]: e for e in data["locationEntries"]}


def _jobs(dev: DagsterDev, location: str) -> set[str]:
    """The harvest jobs of a location (shard 0 also hosts manage_harvesters)."""
    sel = {"repositoryLocationName": location, "repositoryName": REPOSITORY}
    repo = dev.graphql(JOBS, {"sel": sel})["repositoryOrError"]
    assert repo["__typename"] == "Repository", repo
    return {j["name"] for j in repo["jobs"] if j["name"].startswith(JOB_PREFIX)}


def _launch(dev: DagsterDev, location: str, harvester_id: str) -> str:
    params = {
        "selector": {"repositoryLocationName": location, "repositoryName": REPOSITORY,
                     "jobName": job_name(harvester_id)},
        "runConfigData": {"ops": {op_name(harvester_id): {"config": {}}}},
    }
    result = dev.graphql(LAUNCH, {"params": params})["launchRun"]
    assert result["__typename"] == "LaunchRunSuccess", result
    return result["run"]["runId"]


def _sensor(dev: DagsterDev, location: str) -> dict[str, Any]:
    sel = {"repositoryLocationName": location, "repositoryName": REPOSITORY,
           "sensorName": SENSOR_NAME}
    sensor = dev.graphql(SENSOR, {"sel": sel})["sensorOrError"]
    assert sensor["__typename"] == "Sensor", sensor
    return sensor["sensorState"]


def _ticked_after(dev: DagsterDev, location: str, when: float) -> dict[str, Any] | None:
    """The location's since sensor state once it has ticked after `when`."""
    state = _sensor(dev, location)
    return state if any(t["timestamp"] > when for t in state["ticks"]) else None


def _cursor_since(state: dict[str, Any]) -> dict[str, str]:
    raw = (state["typeSpecificData"] or {}).get("lastCursor")
    return json.loads(raw)["since"] if raw else {}


@pytest.mark.parametrize("storage", ["sqlite"], indirect=True)
def test_a_harvester_added_to_a_sharded_deployment(start_dagster_dev, storage,  # noqa: ANN001
                                                   tmp_path: Path) -> None:
    server = OAIServer(make_dataset(40, seed=11, granularity=SECONDS), page_size=20).start()
    step = Steps()
    try:
        _session(start_dagster_dev, tmp_path, server, step)
        step("done")
    finally:
        server.stop()


def _session(start_dagster_dev, tmp_path: Path, server: OAIServer,  # noqa: ANN001
             step: Steps) -> None:
    step("0. register harvesters, write the workspace of 3 shards, start dagster dev")
    # Two harvesters per shard, registered before the start; the new one goes to shard 1.
    held = {i: _ids("e2e_sh", i, 2) for i in range(SHARDS)}
    for ids in held.values():
        for hid in ids:
            add_harvester(hid, server.base_url)
    # With a yearly cron and disabled: schedules stopped by default, switched on in step 3.
    mover = next(f"e2e_mv_{k}" for k in count() if shard_of(f"e2e_mv_{k}", SHARDS + 1) == SHARDS)
    stayer = next(f"e2e_st_{k}" for k in count()
                  if shard_of(f"e2e_st_{k}", SHARDS + 1) == shard_of(f"e2e_st_{k}", SHARDS))
    for hid in (mover, stayer):
        add_harvester(hid, server.base_url, cron=YEARLY, enabled=False)
        held[shard_of(hid, SHARDS)].append(hid)
    new_id = _ids("e2e_added", 1, 1)[0]
    holder = LOCATIONS[1]

    written = subprocess.run([str(CLI), "workspace", "--shards", str(SHARDS)],
                             capture_output=True, text=True, timeout=60, check=False)
    assert written.returncode == 0, written.stderr
    workspace = tmp_path / "workspace.yaml"
    workspace.write_text(written.stdout)

    dev = start_dagster_dev(workspace, LOCATIONS)
    entries = _entries(dev)
    assert set(entries) == set(LOCATIONS)
    assert {e["loadStatus"] for e in entries.values()} == {"LOADED"}
    for i, location in enumerate(LOCATIONS):
        assert _jobs(dev, location) == {job_name(h) for h in held[i]}, location
    before = {name: e["updatedTimestamp"] for name, e in entries.items()}

    step("1. harvester add reloads the holding shard only")

    # The CLI adds the harvester (probing the loopback server) and reloads its shard only.
    added = subprocess.run(
        [str(CLI), "harvester", "add", new_id, "--url", server.base_url, "--prefix", "oai_dc"],
        env=dev.env(), capture_output=True, text=True, timeout=300, check=False)
    output = added.stdout + added.stderr
    assert added.returncode == 0, output
    assert f"reloaded code location '{holder}'" in output, output
    wait_for(f"{new_id}'s job in {holder}",
             lambda: job_name(new_id) in _jobs(dev, holder), 60, on_timeout=dev.log_tail)
    for location in LOCATIONS:
        expected = {job_name(h) for h in held[LOCATIONS.index(location)]}
        if location == holder:
            expected.add(job_name(new_id))
        assert _jobs(dev, location) == expected, location
    after = {name: e["updatedTimestamp"] for name, e in _entries(dev).items()}
    assert after[holder] > before[holder]
    assert {n: after[n] for n in LOCATIONS if n != holder} == {
        n: before[n] for n in LOCATIONS if n != holder}

    step("2. its run, and the since sensors")
    # Its job runs in its location; only that location's since sensor publishes its since.
    run_id = _launch(dev, holder, new_id)
    assert_success(dev, run_id)
    ended = wait_run(dev, run_id)["endTime"]
    since = run_next_since(dev, run_id)
    wait_for(f"{holder}'s since sensor to record {new_id}={since}",
             lambda: _cursor_since(_sensor(dev, holder)).get(new_id) == since,
             SENSOR_TIMEOUT, interval=2.0,
             on_timeout=lambda: f"cursor: {_sensor(dev, holder)}\n{dev.log_tail()}")
    for location in LOCATIONS:
        if location == holder:
            continue
        state = wait_for(f"a tick of {location}'s since sensor after the run",
                         partial(_ticked_after, dev, location, ended),
                         SENSOR_TIMEOUT, interval=2.0, on_timeout=dev.log_tail)
        assert new_id not in _cursor_since(state), (location, state)

    _reshard(start_dagster_dev, dev, tmp_path, step, mover, stayer)


def _schedule(dev: DagsterDev, location: str, harvester_id: str) -> dict[str, Any]:
    sel = {"repositoryLocationName": location, "repositoryName": REPOSITORY,
           "scheduleName": job_name(harvester_id)}
    return dev.graphql(SCHEDULE, {"sel": sel})["scheduleOrError"]


def _reshard(start_dagster_dev, dev: DagsterDev, tmp_path: Path,  # noqa: ANN001
             step: Steps, mover: str, stayer: str) -> None:
    step("3. re-shard 3 -> 4 keeps the schedules switched on in the UI")
    for hid in (mover, stayer):
        location = LOCATIONS[shard_of(hid, SHARDS)]
        assert _schedule(dev, location, hid)["scheduleState"]["status"] == "STOPPED"
        sel = {"repositoryLocationName": location, "repositoryName": REPOSITORY,
               "scheduleName": job_name(hid)}
        started = dev.graphql(START_SCHEDULE, {"sel": sel})["startSchedule"]
        assert started["__typename"] == "ScheduleStateResult", started
    dev.close_instance()
    stop_process_group(dev.process)
    written = subprocess.run([str(CLI), "workspace", "--shards", str(SHARDS + 1)],
                             env=dev.env(), capture_output=True, text=True, timeout=120,
                             check=False)
    assert written.returncode == 0, written.stderr
    assert f"{mover}: on (from {LOCATIONS[shard_of(mover, SHARDS)]})" in written.stderr
    workspace = tmp_path / "workspace-4.yaml"
    workspace.write_text(written.stdout)
    locations = [Shard(i, SHARDS + 1).location_name() for i in range(SHARDS + 1)]
    assert locations[:SHARDS] == LOCATIONS  # no location was renamed
    dev = start_dagster_dev(workspace, locations)
    moved = _schedule(dev, locations[SHARDS], mover)
    assert moved["__typename"] == "Schedule", moved
    assert moved["scheduleState"]["status"] == "RUNNING", moved
    stayed = _schedule(dev, LOCATIONS[shard_of(stayer, SHARDS)], stayer)
    assert stayed["scheduleState"]["status"] == "RUNNING", stayed
