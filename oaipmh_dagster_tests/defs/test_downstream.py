"""Assets downstream of `oaipmh/<id>/records`: the records IO manager hands them the live
records as a DataFrame (or in batches) from the store, and `load_definitions()` merges
with assets of one's own."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import dagster as dg
import pandas as pd
import pytest

from oaipmh_dagster.contracts import HARVESTER_TAG, ROWS_KEY
from oaipmh_dagster.definitions import build_definitions, load_definitions
from oaipmh_dagster.defs._private import reconstruction
from oaipmh_dagster.defs.assets import asset_keys, op_name
from oaipmh_dagster.defs.records_io import (
    RECORDS_IO_MANAGER_KEY,
    RecordBatches,
    input_options,
    records_key,
    serves_records,
)
from oaipmh_dagster.demo.dataset import make_dataset
from oaipmh_dagster.storage.registry import Harvester, Registry
from oaipmh_dagster.storage.store import utc_datestamp
from oaipmh_dagster_tests.conftest import REPO_ROOT
from oaipmh_dagster_tests.helpers import add_harvester
from oaipmh_dagster_tests.oaiserver import FaultyOAIServer as OAIServer

LOCATION = "oaipmh_dagster"
H = "dn"
RECORDS_KEY = asset_keys(H)[2]


@pytest.fixture
def dataset():  # noqa: ANN201
    return make_dataset(60, seed=5, deleted_ratio=0.1, prefixes=("oai_dc",))


@pytest.fixture
def harvested(sqlite_url: str, dataset: Any, instance: dg.DagsterInstance):  # noqa: ANN201
    """A harvester whose harvest job ran once; yields (harvester, server)."""
    with OAIServer(dataset, page_size=25) as srv:
        h = add_harvester(H, srv.base_url)
        job = build_definitions([h], LOCATION).resolve_job_def(h.job_name)
        result = job.execute_in_process(run_config={"ops": {op_name(h.id): {"config": {}}}},
                                        instance=instance)
        assert result.success
        yield h, srv


def _merged(h: Harvester, *assets: dg.AssetsDefinition | dg.AssetSpec) -> dg.Definitions:
    return dg.Definitions.merge(build_definitions([h], LOCATION),
                                dg.Definitions(assets=list(assets)))


def _materialize(defs: dg.Definitions, instance: dg.DagsterInstance,
                 *keys: dg.AssetKey) -> dg.ExecuteInProcessResult:
    """What the asset graph's Materialize does for `keys` (the implicit asset job)."""
    job = defs.resolve_implicit_global_asset_job_def()
    return job.execute_in_process(instance=instance, asset_selection=list(keys),
                                  raise_on_error=False)


def _live(dataset: Any) -> list[Any]:
    return sorted((r for r in dataset if not r.deleted), key=lambda r: r.identifier)


FAILURE = "dagster._core.definitions.events.Failure: "


def _error(result: dg.ExecuteInProcessResult) -> str:
    """The message of the run's one step failure, a `dg.Failure`'s."""
    failures = [ev for ev in result.all_events if ev.is_step_failure]
    assert len(failures) == 1
    message = failures[0].step_failure_data.error.message.strip()
    assert message.startswith(FAILURE)
    assert "\n" not in message
    return message.removeprefix(FAILURE)


def test_a_downstream_asset_alone_gets_the_live_records_as_a_frame(
        harvested: Any, dataset: Any, instance: dg.DagsterInstance) -> None:
    h, srv = harvested
    seen: dict[str, pd.DataFrame] = {}

    @dg.asset(ins={"records": dg.AssetIn(key=RECORDS_KEY)})
    def titles(records: pd.DataFrame) -> int:
        seen["frame"] = records
        return len(records)

    requests = len(srv.requests)
    result = _materialize(_merged(h, titles), instance, titles.key)
    assert result.success
    assert len(srv.requests) == requests  # read from the store, not harvested again
    frame = seen["frame"]
    live = _live(dataset)
    assert len(frame) == len(live) > 0
    assert frame.columns[:3].tolist() == ["oai_identifier", "datestamp", "sets"]
    assert {"title", "creator", "date"} <= set(frame.columns)
    assert frame["oai_identifier"].tolist() == [r.identifier for r in live]
    assert [utc_datestamp(d.to_pydatetime()) for d in frame["datestamp"]] == [
        utc_datestamp(r.datestamp) for r in live]
    assert frame["sets"].tolist() == [list(r.sets) for r in live]
    assert all(isinstance(t, list) and t for t in frame["title"])
    assert instance.get_latest_materialization_event(titles.key) is not None


def test_records_and_a_downstream_asset_in_one_run(harvested: Any,
                                                   instance: dg.DagsterInstance) -> None:
    h, _ = harvested
    rows: list[int] = []

    @dg.asset(ins={"records": dg.AssetIn(key=RECORDS_KEY)})
    def counted(records: pd.DataFrame) -> None:
        rows.append(len(records))

    result = _materialize(_merged(h, counted), instance, RECORDS_KEY, counted.key)
    assert result.success
    assert {e.asset_key for e in result.get_asset_materialization_events()} == {
        RECORDS_KEY, counted.key}
    assert rows == [instance.get_latest_materialization_event(RECORDS_KEY)
                    .asset_materialization.metadata["dagster/row_count"].value]
    # The op's run still carries the harvester's tags (the run queue's limits, the Runs
    # filter): a downstream asset of one's own is no other harvester's.
    tags = instance.get_run_by_id(result.run_id).tags
    assert tags.get(HARVESTER_TAG) == H


def test_batches_by_annotation_or_batch_size(harvested: Any, dataset: Any,
                                             instance: dg.DagsterInstance) -> None:
    h, _ = harvested
    sizes: dict[str, list[int]] = {}

    @dg.asset(ins={"records": dg.AssetIn(key=RECORDS_KEY, metadata={"batch_size": 20})})
    def sized(records: RecordBatches) -> None:
        sizes["sized"] = [len(frame) for frame in records]

    @dg.asset(ins={"records": dg.AssetIn(key=RECORDS_KEY, metadata={"batch_size": 7})})
    def unannotated(records) -> None:  # noqa: ANN001 - no annotation: batch_size decides
        sizes["unannotated"] = [len(frame) for frame in records]

    @dg.asset(ins={"records": dg.AssetIn(key=RECORDS_KEY)})
    def default(records: RecordBatches) -> None:
        sizes["default"] = [len(frame) for frame in records]

    result = _materialize(_merged(h, sized, unannotated, default), instance,
                          sized.key, unannotated.key, default.key)
    assert result.success
    n = len(_live(dataset))
    assert sizes["sized"] == [20] * (n // 20) + ([n % 20] if n % 20 else [])
    assert sum(sizes["unannotated"]) == n and max(sizes["unannotated"]) == 7
    assert sizes["default"] == [n]


def test_a_batch_size_on_a_frame_input_fails_clearly(harvested: Any,
                                                     instance: dg.DagsterInstance) -> None:
    h, _ = harvested

    @dg.asset(ins={"records": dg.AssetIn(key=RECORDS_KEY, metadata={"batch_size": 5})})
    def wrong(records: pd.DataFrame) -> None:
        raise AssertionError("never called")

    result = _materialize(_merged(h, wrong), instance, wrong.key)
    assert not result.success
    assert _error(result) == ("input 'records' has a batch_size: annotate it RecordBatches "
                              "(an iterable of DataFrames), not DataFrame")
    assert instance.get_latest_materialization_event(wrong.key) is None


def test_an_unknown_harvester_fails_with_one_line_and_writes_nothing(
        harvested: Any, instance: dg.DagsterInstance) -> None:
    h, _ = harvested
    ghost = records_key("ghost")  # declared by the user, held by no registry row

    @dg.asset(ins={"records": dg.AssetIn(key=ghost, input_manager_key=RECORDS_IO_MANAGER_KEY)})
    def haunted(records: pd.DataFrame) -> None:
        raise AssertionError("never called")

    result = _materialize(_merged(h, haunted, dg.AssetSpec(ghost)), instance, haunted.key)
    assert not result.success
    assert _error(result) == ("no harvester 'ghost' in the registry: there are no records of "
                              "oaipmh/ghost/records to load")
    assert instance.get_latest_materialization_event(haunted.key) is None


def test_a_harvester_removed_since_the_load_fails_clearly(
        harvested: Any, instance: dg.DagsterInstance) -> None:
    h, _ = harvested
    mine = _user_asset()
    defs = _merged(h, mine)
    Registry().remove(H)
    result = _materialize(defs, instance, mine.key)
    assert not result.success
    assert _error(result) == ("no harvester 'dn' in the registry: there are no records of "
                              "oaipmh/dn/records to load")
    assert instance.get_latest_materialization_event(mine.key) is None


def test_the_io_manager_loads_records_assets_only(harvested: Any,
                                                  instance: dg.DagsterInstance) -> None:
    h, _ = harvested
    raw = asset_keys(H)[1]

    @dg.asset(ins={"raw": dg.AssetIn(key=raw, input_manager_key=RECORDS_IO_MANAGER_KEY)})
    def rawish(raw: Any) -> None:
        raise AssertionError("never called")

    result = _materialize(_merged(h, rawish), instance, rawish.key)
    assert not result.success
    assert _error(result) == ("oaipmh_records_io_manager loads the records assets "
                              "oaipmh/<harvester id>/records only, not oaipmh/dn/raw_records")


# -- load_definitions ----------------------------------------------------------------------


def _user_asset() -> dg.AssetsDefinition:
    @dg.asset(ins={"records": dg.AssetIn(key=RECORDS_KEY)})
    def records_by_year(records: pd.DataFrame) -> pd.DataFrame:
        return records.groupby(records["datestamp"].dt.year).size().to_frame("records")

    return records_by_year


def test_load_definitions_merged_with_a_user_asset_validates(sqlite_url: str) -> None:
    add_harvester(H, "http://127.0.0.1:9/oai")
    mine = _user_asset()
    defs = dg.Definitions.merge(load_definitions(), dg.Definitions(assets=[mine]))
    dg.Definitions.validate_loadable(defs)
    graph = defs.get_repository_def().asset_graph
    assert graph.get(mine.key).parent_keys == {RECORDS_KEY}
    assert defs.resolve_job_def(f"harvest_oaipmh_records_{H}") is not None
    assert ROWS_KEY in defs.metadata  # run workers are still rebuilt from the rows
    assert serves_records(defs, H) and not serves_records(defs, "ghost")


def test_load_definitions_is_what_the_location_serves(sqlite_url: str) -> None:
    from oaipmh_dagster.definitions import defs

    add_harvester(H, "http://127.0.0.1:9/oai")
    served = defs()
    loaded = load_definitions()
    assert {k for a in served.assets or [] for k in getattr(a, "keys", ())} == {
        k for a in loaded.assets or [] for k in getattr(a, "keys", ())}
    assert served.metadata == loaded.metadata


def test_load_definitions_in_a_run_worker_reads_the_rows_it_was_handed(
        sqlite_url: str) -> None:
    add_harvester(H, "http://127.0.0.1:9/oai")
    other = Harvester(id="elsewhere", base_url="http://127.0.0.1:9/oai",
                      metadata_prefix="oai_dc")
    with reconstruction({ROWS_KEY: json.dumps([other.to_dict()])}):
        defs = load_definitions()
    keys = {k for a in defs.assets or [] for k in getattr(a, "keys", ())}
    assert asset_keys("elsewhere")[2] in keys
    assert RECORDS_KEY not in keys


# -- the README's example ------------------------------------------------------------------


def _readme_example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The README's example module (the first Python block of its section), imported."""
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Assets downstream of a harvest"):]
    code = section[section.index("```python\n") + 10:]
    code = code[:code.index("```")]
    (tmp_path / "readme_pipeline.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    return importlib.import_module("readme_pipeline")


def test_the_readme_example_loads_and_materializes(
        sqlite_url: str, dataset: Any, instance: dg.DagsterInstance, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    module = _readme_example(tmp_path, monkeypatch)
    before = module.defs()  # no such harvester yet: the location loads without them
    dg.Definitions.validate_loadable(before)
    assert not serves_records(before, "zenodo")
    with OAIServer(dataset, page_size=25) as srv:
        h = add_harvester("zenodo", srv.base_url)
        build_definitions([h], LOCATION).resolve_job_def(h.job_name).execute_in_process(
            run_config={"ops": {op_name(h.id): {"config": {}}}}, instance=instance)
    defs = module.defs()
    dg.Definitions.validate_loadable(defs)
    keys = [module.zenodo_by_year.key, module.zenodo_creators.key]
    result = _materialize(defs, instance, *keys)
    assert result.success
    by_year = result.asset_value(module.zenodo_by_year.key)
    live = _live(dataset)
    assert by_year["records"].sum() == len(live)
    creators = {c for r in live for c in _creators(r)}
    assert result.asset_value(module.zenodo_creators.key) == len(creators)


def _creators(record: Any) -> list[str]:
    from oaipmh_dagster.transform import transform_record

    return transform_record("oai_dc", record.metadata["oai_dc"]).get("creator") or []


@pytest.mark.parametrize(("metadata", "message"), [
    ({"batch_size": 0}, "batch_size must be a positive number of rows, not 0"),
    ({"batch_size": "10"}, "batch_size must be a positive number of rows, not '10'"),
    ({"batch_size": True}, "batch_size must be a positive number of rows, not True"),
    ({"columns": "title"}, "columns must be a list of column names, not 'title'"),
    ({"columns": 3}, "columns must be a list of column names, not 3"),
])
def test_bad_input_metadata_is_one_clear_failure(metadata: dict, message: str) -> None:
    with pytest.raises(dg.Failure) as caught:
        input_options(metadata)
    assert caught.value.description == message


def test_input_metadata_gives_batch_size_and_columns() -> None:
    assert input_options({}) == (None, None)
    assert input_options({"batch_size": 5, "columns": ["title"]}) == (5, ("title",))
