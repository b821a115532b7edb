"""The `schema_valid` asset check on raw_records in a job run: declared only for
harvesters that validate, failed as a warning with counts and a sample when records are
invalid; the records-only re-run validates the stored XML again."""

from __future__ import annotations

import dagster as dg

from oaipmh_dagster.definitions import build_definitions
from oaipmh_dagster.defs.assets import asset_keys, op_name
from oaipmh_dagster.storage.registry import Harvester
from oaipmh_dagster.storage.store import Store
from oaipmh_dagster_tests.helpers import add_harvester
from oaipmh_dagster_tests.oaiserver import FaultyOAIServer as OAIServer
from oaipmh_dagster_tests.validation.served import FORMATS, dataset, invalid

LOCATION = "oaipmh_dagster"


def _run(h: Harvester, instance: dg.DagsterInstance,
         selection: list[dg.AssetKey] | None = None) -> dg.ExecuteInProcessResult:
    job = build_definitions([h], LOCATION).resolve_job_def(h.job_name)
    return job.execute_in_process(run_config={"ops": {op_name(h.id): {"config": {}}}},
                                  instance=instance, asset_selection=selection,
                                  raise_on_error=False)


def test_schema_valid_reports_the_invalid_records(database_url: str,
                                                   instance: dg.DagsterInstance) -> None:
    with OAIServer(dataset("marc21"), page_size=2) as srv:
        h = add_harvester("mv", srv.base_url, metadata_prefix="marc21", schema="marc21")
        result = _run(h, instance)
    assert result.success
    checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
    check = checks["schema_valid"]
    assert check.asset_key == asset_keys("mv")[1]
    assert not check.passed and check.severity == dg.AssetCheckSeverity.WARN
    meta = check.metadata
    total = len(FORMATS["marc21"][3])
    assert meta["invalid"].value == len(invalid("marc21")) and meta["live"].value == total
    sample = meta["invalid_sample"].value
    lines = sample.splitlines()
    assert len(lines) == len(invalid("marc21"))
    for line, identifier in zip(lines, sorted(invalid("marc21")), strict=True):
        assert line.startswith(f"- {identifier}: Element '{{http://www.loc.gov/MARC21/slim}}")
    assert checks["no_failed_records"].passed  # invalid records did not fail

    # Re-materializing records alone validates the stored raw XML again: the schema
    # errors stay.
    again = _run(h, instance, selection=[asset_keys("mv")[2]])
    assert again.success
    assert Store().schema_invalid("mv").count == len(invalid("marc21"))


def test_schema_valid_passes_when_every_record_is_valid(sqlite_url: str,
                                                        instance: dg.DagsterInstance) -> None:
    ds = dataset("oai_dc")
    for identifier in invalid("oai_dc"):
        ds.delete(identifier)
    with OAIServer(ds, page_size=5) as srv:
        h = add_harvester("dv", srv.base_url, schema="oai_dc")
        result = _run(h, instance)
    check = {c.check_name: c for c in result.get_asset_check_evaluations()}["schema_valid"]
    assert check.passed
    assert check.metadata["invalid"].value == 0 and check.metadata["live"].value == 2


def test_no_schema_no_check(sqlite_url: str) -> None:
    h = Harvester(id="plain", base_url="http://127.0.0.1:9/oai", metadata_prefix="oai_dc")
    plain = build_definitions([h], LOCATION).resolve_asset_graph().asset_check_keys
    assert {key.name for key in plain} == {"no_failed_records", "complete_list_size_matches"}
    validated = build_definitions([h.replace(schema="oai_dc")], LOCATION)
    keys = validated.resolve_asset_graph().asset_check_keys
    assert dg.AssetCheckKey(asset_keys("plain")[1], "schema_valid") in keys
