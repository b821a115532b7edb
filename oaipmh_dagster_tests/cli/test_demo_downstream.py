"""The demo's example downstream asset, `oaipmh/demo/records_by_year`, and the workspace
the demo's `dagster dev` loads to show it."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest
import yaml

from oaipmh_dagster.cli import demo as demo_run
from oaipmh_dagster.cli import demo_downstream
from oaipmh_dagster.cli.demo_downstream import RECORDS_BY_YEAR, with_example
from oaipmh_dagster.definitions import build_definitions
from oaipmh_dagster.defs.assets import asset_keys
from oaipmh_dagster.demo.dataset import make_dataset
from oaipmh_dagster.demo.server import OAIServer
from oaipmh_dagster.operations.shards import workspace_yaml
from oaipmh_dagster.storage.registry import Registry
from oaipmh_dagster_tests.conftest import REPO_ROOT
from oaipmh_dagster_tests.helpers import add_harvester


def test_the_demo_module_is_the_one_the_workspace_names() -> None:
    assert demo_downstream.MODULE == demo_run.DEMO_MODULE


def test_demo_workspace_keeps_the_repository_locations(tmp_path: Path) -> None:
    path = demo_run.demo_workspace(tmp_path, REPO_ROOT / "workspace.yaml")
    entries = yaml.safe_load(path.read_text())["load_from"]
    shipped = yaml.safe_load((REPO_ROOT / "workspace.yaml").read_text())["load_from"]
    assert [e["python_module"]["location_name"] for e in entries] == [
        e["python_module"]["location_name"] for e in shipped]
    assert {e["python_module"]["module_name"] for e in entries} == {demo_run.DEMO_MODULE}
    assert {e["python_module"]["working_directory"] for e in entries} == {str(REPO_ROOT)}


def test_demo_workspace_of_a_sharded_workspace(tmp_path: Path) -> None:
    source = tmp_path / "workspace.yaml"
    source.write_text(workspace_yaml(3))
    home = tmp_path / "home"
    home.mkdir()
    entries = yaml.safe_load(demo_run.demo_workspace(home, source).read_text())["load_from"]
    names = [e["python_module"]["location_name"] for e in entries]
    assert names == [e["python_module"]["location_name"]
                     for e in yaml.safe_load(source.read_text())["load_from"]]
    assert len(names) == 3
    assert {e["python_module"]["module_name"] for e in entries} == {demo_run.DEMO_MODULE}


def test_demo_workspace_without_a_source(tmp_path: Path) -> None:
    entries = yaml.safe_load(demo_run.demo_workspace(tmp_path).read_text())["load_from"]
    assert entries == [{"python_module": {"module_name": demo_run.DEMO_MODULE,
                                          "location_name": demo_run.DEFINITIONS_MODULE}}]


def test_the_example_joins_only_a_location_that_holds_the_demo_harvester(
        sqlite_url: str) -> None:
    add_harvester("demo", "http://127.0.0.1:9/oai")
    defs = with_example(build_definitions([Registry().get("demo")]))
    dg.Definitions.validate_loadable(defs)
    graph = defs.get_repository_def().asset_graph
    assert graph.get(RECORDS_BY_YEAR).parent_keys == {asset_keys("demo")[2]}
    assert graph.get(RECORDS_BY_YEAR).group_name == "oaipmh_demo"
    others = build_definitions([])
    assert with_example(others) is others
    dg.Definitions.validate_loadable(demo_downstream.defs())


def test_materialize_example_counts_the_live_records_by_year(
        sqlite_url: str, instance: dg.DagsterInstance) -> None:
    from oaipmh_dagster.cli.runner import run_harvest_job

    dataset = make_dataset(40, seed=2)
    server = OAIServer(dataset, port=0)
    server.start()
    try:
        registry = Registry()
        demo = demo_run.demo_harvesters(server.base_url)[0]
        registry.add(demo)
        ok, _ = run_harvest_job(instance, demo.id, {}, registry)
        assert ok
        ok, line = demo_run.materialize_example(instance, registry)
    finally:
        server.stop()
    live = [r for r in dataset if not r.deleted and "oai_dc" in r.metadata]
    years = {r.datestamp.year for r in live}
    assert ok
    assert line == (f"oaipmh/demo/records_by_year: {len(live)} live records in "
                    f"{len(years)} datestamp years")
    event = instance.get_latest_materialization_event(RECORDS_BY_YEAR)
    assert event is not None


@pytest.mark.parametrize("cwd_has_workspace", [True, False])
def test_dagster_dev_loads_the_demo_workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              cwd_has_workspace: bool) -> None:
    monkeypatch.chdir(REPO_ROOT if cwd_has_workspace else tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    cmd, _ = demo_run.dagster_dev_command(3999, home)
    assert cmd[cmd.index("-w") + 1] == str(home / demo_run.DEMO_WORKSPACE)
    assert (home / demo_run.DEMO_WORKSPACE).is_file()
