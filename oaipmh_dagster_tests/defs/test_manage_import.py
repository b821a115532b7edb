"""The `manage_harvesters` job's `import` action: a list of harvesters added and updated
in one run, every one checked before any is written, one reload per shard; the other
actions' run config unchanged."""

from __future__ import annotations

from collections.abc import Iterator

import dagster as dg
import pytest

from oaipmh_dagster.definitions import build_definitions
from oaipmh_dagster.defs.manage import MANAGE_JOB, MANAGE_OP, HarvesterRow, ImportHarvesters
from oaipmh_dagster.demo.dataset import make_dataset
from oaipmh_dagster.demo.server import OAIServer
from oaipmh_dagster.operations.shards import shard_of
from oaipmh_dagster.storage import db
from oaipmh_dagster.storage.registry import SHARDS_SETTING, Registry
from oaipmh_dagster_tests.defs.test_manage import failure, launch, logged, rows, table
from oaipmh_dagster_tests.helpers import add_harvester

URL = "http://127.0.0.1:9/oai"


@pytest.fixture(scope="module")
def server() -> Iterator[OAIServer]:
    srv = OAIServer(make_dataset(7, seed=3, sets=3), page_size=5).start()
    yield srv
    srv.stop()


def test_import_adds_and_updates_in_one_run(database_url: str, instance: dg.DagsterInstance,
                                            server: OAIServer, reloads: list) -> None:
    add_harvester("old", server.base_url, name="Old", cron="0 1 * * *")
    first = sorted(server.dataset.sets)[0]
    result = launch(instance, "import", update=True, harvesters=[
        {"id": "old", "url": server.base_url, "prefix": "oai_dc", "cron": "0 2 * * *"},
        {"id": "new", "url": server.base_url, "prefix": "oai_dc", "sets": [first],
         "max_retries": 2, "validate_schema": "shipped"}])
    assert result.success, failure(result)
    registry = Registry(db.get_engine())
    old, new = registry.get("old"), registry.get("new")
    assert (old.cron, old.name) == ("0 2 * * *", "Old")
    assert (new.sets, new.max_retries, new.schema) == ((first,), 2, "oai_dc")
    assert new.name == "Demo Research Repository"
    log = logged(instance, result)
    assert "added harvester new" in log and "updated harvester old: cron" in log
    assert len(reloads) == 1  # one location holds both
    assert "| new |" in table(result) and "| old |" in table(result)


def test_one_bad_harvester_fails_the_run_and_writes_nothing(
    database_url: str, instance: dg.DagsterInstance, server: OAIServer, reloads: list,
) -> None:
    add_harvester("taken", URL)
    before = rows()
    harvesters = [
        {"id": "fine", "url": server.base_url, "prefix": "oai_dc"},
        {"id": "taken", "url": server.base_url, "prefix": "oai_dc"},
        {"id": "odd", "url": server.base_url, "prefix": "marc21"},
        {"id": "cronless", "url": URL, "prefix": "oai_dc", "cron": "daily"}]
    result = launch(instance, "import", harvesters=harvesters)
    message = failure(result)
    assert "3 of 4 harvesters refused, nothing written (skip_invalid writes the valid " \
           "ones)" in message
    refusals = [line for line in logged(instance, result).splitlines()
                if line.startswith("harvesters[")]
    assert refusals[0] == ("harvesters[1] (taken): harvester 'taken' already exists "
                           "(update changes it)")
    assert refusals[1].startswith(f"harvesters[2] (odd): {server.base_url} does not offer "
                                  "metadataPrefix 'marc21'")
    assert refusals[2] == "harvesters[3] (cronless): invalid cron expression 'daily'"
    assert len(refusals) == 3
    assert rows() == before and reloads == []
    result = launch(instance, "import", harvesters=harvesters, skip_invalid=True)
    assert result.success, failure(result)
    assert [r["id"] for r in rows()] == ["fine", "taken"]
    assert "skipped harvesters[3] (cronless)" in logged(instance, result)


def test_an_import_reloads_each_shard_once(sqlite_url: str, instance: dg.DagsterInstance,
                                          reloads: list) -> None:
    Registry(db.get_engine()).set_setting(SHARDS_SETTING, "4")
    ids = [f"h{i:02d}" for i in range(24)]
    result = launch(instance, "import", no_check=True,
                    harvesters=[{"id": i, "url": URL, "prefix": "oai_dc"} for i in ids])
    assert result.success, failure(result)
    shards = sorted({shard_of(i, 4) for i in ids})
    assert len(reloads) == len(shards) == 4
    assert [shard_of(c["harvester_id"], 4) for c in reloads] == shards
    assert [c["location"] for c in reloads] == [None] * 4  # in process: no location


def test_the_import_action_takes_a_list() -> None:
    fields = ImportHarvesters.model_fields
    assert fields["harvesters"].is_required()
    assert all(f.description for k, f in fields.items() if k != "kind")
    assert all(f.description for f in HarvesterRow.model_fields.values())
    assert {"id", "url", "prefix", "sets", "cron", "validate_schema", "max_delete"} <= set(
        HarvesterRow.model_fields)
    job = build_definitions([]).resolve_job_def(MANAGE_JOB)
    with pytest.raises(dg.DagsterInvalidConfigError, match='unexpected config entry "colour"'):
        job.execute_in_process(run_config={"ops": {MANAGE_OP: {"config": {"action": {
            "import": {"harvesters": [{"id": "a", "url": URL, "prefix": "p",
                                       "colour": "red"}]}}}}}})
