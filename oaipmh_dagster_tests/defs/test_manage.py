"""The `manage_harvesters` job as the Launchpad runs it: add, update and remove a harvester
on both databases against a loopback endpoint; a bad input fails the run with its message
and leaves the registry as it was; the `oaipmh/registry` asset shows the table."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import dagster as dg
import pytest

from oaipmh_dagster.definitions import build_definitions
from oaipmh_dagster.defs.manage import (
    MANAGE_JOB,
    MANAGE_OP,
    REGISTRY_KEY,
    AddHarvester,
    ManageConfig,
    RemoveHarvester,
    UpdateHarvester,
    holding_location,
    hosts_manage_job,
    launchpad_terms,
    registry_markdown,
)
from oaipmh_dagster.demo.dataset import make_dataset
from oaipmh_dagster.demo.server import OAIServer
from oaipmh_dagster.harvesting.rows import write_page
from oaipmh_dagster.operations.shards import Shard, shard_of
from oaipmh_dagster.storage import db
from oaipmh_dagster.storage.registry import Harvester, InvalidRow, Registry
from oaipmh_dagster.storage.store import Store
from oaipmh_dagster_tests.helpers import add_harvester
from oaipmh_dagster_tests.storage.test_store import rec


@pytest.fixture(scope="module")
def server() -> Iterator[OAIServer]:
    srv = OAIServer(make_dataset(7, seed=3, sets=3), page_size=5).start()
    yield srv
    srv.stop()


def launch(instance: dg.DagsterInstance, action: str, **fields: Any
           ) -> dg.ExecuteInProcessResult:
    """One run of the job with the run config the Launchpad sends: `action` chosen, its
    fields below it."""
    job = build_definitions([]).resolve_job_def(MANAGE_JOB)
    return job.execute_in_process(
        run_config={"ops": {MANAGE_OP: {"config": {"action": {action: fields}}}}},
        instance=instance, raise_on_error=False)


def logged(instance: dg.DagsterInstance, result: dg.ExecuteInProcessResult) -> str:
    return "\n".join(e.user_message for e in instance.all_logs(result.run_id))


def failure(result: dg.ExecuteInProcessResult) -> str:
    assert not result.success
    event = next(e for e in result.all_events if e.is_step_failure)
    return event.step_failure_data.error.to_string()


def table(result: dg.ExecuteInProcessResult) -> str:
    (mat,) = result.asset_materializations_for_node(MANAGE_OP)
    assert mat.asset_key == REGISTRY_KEY
    return mat.metadata["registry"].value


def rows() -> list[dict]:
    return [h.to_dict() for h in Registry(db.get_engine()).list()]


def test_add_update_remove(database_url: str, instance: dg.DagsterInstance,
                           server: OAIServer) -> None:
    first_set = next(iter(server.dataset.sets))
    result = launch(instance, action="add", id="demo", url=server.base_url, prefix="oai_dc",
                    sets=[first_set], cron="0 3 * * *", timezone="Europe/Prague",
                    max_retries=2)
    assert result.success, failure(result)
    h = Registry(db.get_engine()).get("demo")
    assert (h.sets, h.cron, h.timezone, h.max_retries) == ((first_set,), "0 3 * * *",
                                                            "Europe/Prague", 2)
    assert h.name == "Demo Research Repository" and h.enabled and h.timeout == 60.0
    log = logged(instance, result)
    assert "added harvester demo" in log
    assert "/jobs/harvest_oaipmh_records_demo" in log
    assert "reload the code location 'oaipmh_dagster'" in log  # no webserver: a note
    assert f"| demo | {server.base_url} | oai_dc | {first_set} | 0 3 * * * | yes | " \
           "(full next) |" in table(result)

    result = launch(instance, action="update", id="demo", cron="0 4 * * *", enabled=False,
                    name="Renamed")
    assert result.success, failure(result)
    h = Registry(db.get_engine()).get("demo")
    assert (h.cron, h.enabled, h.name, h.sets) == ("0 4 * * *", False, "Renamed",
                                                   (first_set,))
    assert "updated harvester demo: cron, enabled, name" in logged(instance, result)
    result = launch(instance, action="update", id="demo", all_sets=True, no_cron=True)
    assert result.success, failure(result)
    h = Registry(db.get_engine()).get("demo")
    assert (h.sets, h.cron) == ((), None)
    assert "the next harvest is a full one" in logged(instance, result)

    write_page(Store(db.get_engine()), "demo", [rec("a")], run_id="r")
    result = launch(instance, action="remove", id="demo", delete_records=True)
    assert result.success, failure(result)
    assert rows() == []
    assert Store(db.get_engine()).count("demo") == 0
    log = logged(instance, result)
    assert "deleted 1 record of demo" in log and "removed harvester demo" in log
    assert "(no harvesters)" in table(result)


@pytest.mark.parametrize(("config", "message"), [
    ({"action": "add", "id": "Bad-ID", "url": "SERVER", "prefix": "oai_dc"}, "invalid harvester id 'Bad-ID'"),
    ({"action": "add", "id": "demo", "url": "SERVER", "prefix": "marc21"},
     "does not offer metadataPrefix 'marc21'; it offers: datacite, oai_dc"),
    ({"action": "add", "id": "demo", "url": "SERVER", "prefix": "oai_dc", "sets": ["nosuch"]},
     "does not list set 'nosuch'"),
    ({"action": "add", "id": "keep", "url": "SERVER", "prefix": "oai_dc"}, "harvester 'keep' already exists"),
    ({"action": "add", "id": "demo", "url": "SERVER", "prefix": "oai_dc", "cron": "every day"},
     "invalid cron expression 'every day'"),
    ({"action": "update", "id": "nope", "cron": "0 * * * *"}, "no harvester 'nope'"),
    ({"action": "update", "id": "keep", "prefix": "marc21"}, "does not offer metadataPrefix"),
    ({"action": "update", "id": "keep"}, "nothing to update"),
    ({"action": "remove", "id": "nope"}, "no harvester 'nope'"),
])
def test_bad_input_fails_the_run_and_writes_nothing(
    database_url: str, instance: dg.DagsterInstance, server: OAIServer,
    config: dict[str, Any], message: str,
) -> None:
    add_harvester("keep", server.base_url)
    before = rows()
    config = {k: server.base_url if v == "SERVER" else v for k, v in config.items()}
    result = launch(instance, config.pop("action"), **config)
    assert message in failure(result)
    assert message in logged(instance, result)
    assert rows() == before


def test_unreachable_endpoint_fails_the_run(database_url: str, instance: dg.DagsterInstance,
                                            closed_port_url: str) -> None:
    result = launch(instance, action="add", id="demo", url=closed_port_url, prefix="oai_dc",
                    timeout=5.0)
    assert f"cannot use {closed_port_url} as an OAI-PMH endpoint" in failure(result)
    assert rows() == []
    result = launch(instance, action="add", id="demo", url=closed_port_url, prefix="oai_dc",
                    no_check=True)
    assert result.success, failure(result)
    assert [r["id"] for r in rows()] == ["demo"]


@pytest.mark.parametrize(("config", "message"), [
    ({"add": {"id": "demo"}}, r"Missing required config entries \['prefix', 'url'\]"),
    ({"remove": {"id": "keep", "cron": "0 * * * *"}}, 'Received unexpected config entry "cron"'),
    ({"rename": {"id": "keep"}}, 'Received unexpected config entry "rename"'),
    ({"add": {"id": "a", "url": "u", "prefix": "p"}, "remove": {"id": "a"}},
     "You can only specify a single field"),
])
def test_the_form_refuses_what_the_action_does_not_take(
    sqlite_url: str, instance: dg.DagsterInstance, config: dict[str, Any], message: str,
) -> None:
    """The Launchpad checks the config before a run exists: each action shows only its
    fields, and a field another action takes is refused."""
    job = build_definitions([]).resolve_job_def(MANAGE_JOB)
    with pytest.raises(dg.DagsterInvalidConfigError, match=message):
        job.execute_in_process(run_config={"ops": {MANAGE_OP: {"config": {"action": config}}}},
                               instance=instance)
    assert rows() == []


def test_refusals_speak_the_launchpads_terms(
    database_url: str, instance: dg.DagsterInstance, server: OAIServer,
) -> None:
    result = launch(instance, "add", id="demo", url=server.base_url, prefix="oai_dc",
                    sets=["nosuch"])
    message = failure(result)
    assert "no_check: true registers it anyway" in message or "no_check" in message
    assert "--" not in message.split("Stack Trace")[0]
    assert launchpad_terms("--validate PATH, --set, --no-check, --all-sets") == (
        "validate_schema PATH, sets, no_check, all_sets")


def test_every_field_is_described_and_each_action_has_its_own() -> None:
    fields = {name: dict(cls.model_fields) for name, cls in
              (("add", AddHarvester), ("update", UpdateHarvester), ("remove", RemoveHarvester))}
    for name, own in fields.items():
        assert all(f.description for k, f in own.items() if k != "kind"), name
        assert own["id"].is_required()
    assert {"url", "prefix", "sets", "cron", "timezone", "enabled", "name", "transformer",
            "max_parallel", "max_retries", "timeout", "delay", "auth_env", "overlap",
            "comment", "reconcile_every", "no_check", "validate_schema"} <= set(fields["add"])
    assert fields["add"]["url"].is_required() and fields["add"]["prefix"].is_required()
    assert not fields["update"]["url"].is_required()
    assert set(fields["update"]) - set(fields["add"]) == {"all_sets", "no_cron", "no_validate"}
    assert set(fields["remove"]) == {"kind", "id", "delete_records"}
    assert ManageConfig.model_fields["action"].is_required()
    job = build_definitions([]).resolve_job_def(MANAGE_JOB)
    assert [node.name for node in job.nodes] == [MANAGE_OP]
    assert job.executor_def is dg.in_process_executor
    assert job.tags["dagster/max_retries"] == "0"


def test_the_form_has_the_commands_options() -> None:
    """Every option of `harvester add` and `update` is a field of its action (the
    command's --validate is validate_schema), and no field is unknown to the command."""
    from oaipmh_dagster.cli import commands as cli

    for command, cls in (("add", AddHarvester), ("update", UpdateHarvester)):
        params = {p.name for p in cli.harvester.commands[command].params}
        params = {"validate_schema" if p == "validate" else p for p in params}
        params = {"id" if p == "harvester_id" else p for p in params}
        assert params == set(cls.model_fields) - {"kind"}, command


def test_one_location_hosts_the_job() -> None:
    assert hosts_manage_job(None) and hosts_manage_job("oaipmh_dagster")
    assert hosts_manage_job("oaipmh_dagster_shard_0_of_3")
    assert not hosts_manage_job("oaipmh_dagster_shard_1_of_3")
    for name, hosted in [("oaipmh_dagster_shard_0_of_2", True),
                         ("oaipmh_dagster_shard_1_of_2", False)]:
        defs = build_definitions([], name)
        dg.Definitions.validate_loadable(defs)
        repo = defs.get_repository_def()
        assert repo.has_job(MANAGE_JOB) is hosted
        assert (REGISTRY_KEY in repo.asset_graph.get_all_asset_keys()) is hosted


def test_the_holding_location_follows_the_shard() -> None:
    assert holding_location(None, "demo") is None
    assert holding_location("mine", "demo") == "mine"
    holder = Shard(shard_of("demo", 5), 5).location_name("oai")
    assert holding_location("oai_shard_0", "demo", 5) == holder
    assert holding_location("oai_shard_0", "demo") == "oai_shard_0"  # K unknown
    legacy = f"oai_shard_{shard_of('demo', 5)}_of_5"
    assert holding_location("oai_shard_0_of_5", "demo") == legacy
    assert holding_location("oai-shard-0-of-5", "demo") == legacy.replace("_", "-")


def test_registry_markdown() -> None:
    h = Harvester(id="a", base_url="http://x.org/oai?a|b", metadata_prefix="oai_dc",
                  sets=("s1", "s2"), enabled=False)
    text = registry_markdown([h, InvalidRow("b", "bad\ncron")], {"a": "2024-01-01"})
    assert text.splitlines()[0] == "| id | url | prefix | sets | cron | enabled | since |"
    assert "| a | http://x.org/oai?a\\|b | oai_dc | s1, s2 | (none) | no | 2024-01-01 |" in text
    assert "| b | invalid: bad cron |" in text


def test_registry_asset_materializes_the_table(sqlite_url: str,
                                               instance: dg.DagsterInstance) -> None:
    add_harvester("one", "http://127.0.0.1:9/oai", cron="0 3 * * *")
    defs = build_definitions([])
    result = dg.materialize([defs.get_assets_def(REGISTRY_KEY)], instance=instance,
                            resources={"oaipmh_db": defs.resources["oaipmh_db"]})
    assert result.success
    (mat,) = result.asset_materializations_for_node("oaipmh__registry")
    assert mat.metadata["harvesters"].value == 1
    assert "| one | http://127.0.0.1:9/oai | oai_dc | (all) | 0 3 * * * | yes |" \
        in mat.metadata["registry"].value


def test_update_of_the_prefix_brings_its_default_transformer(
    database_url: str, instance: dg.DagsterInstance, server: OAIServer,
) -> None:
    add_harvester("demo", server.base_url)
    result = launch(instance, action="update", id="demo", prefix="datacite")
    assert result.success, failure(result)
    h = Registry(db.get_engine()).get("demo")
    assert (h.metadata_prefix, h.transformer) == ("datacite", "datacite")
    assert "transformer follows the prefix: oai_dc -> datacite" in logged(instance, result)
