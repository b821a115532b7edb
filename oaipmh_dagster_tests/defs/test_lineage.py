"""Lineage of a harvester's assets: the records asset's code version follows its
transformer (and Dagster then shows it stale), every harvest observes `source` from its
Identify answer, and the record tables are named with their row counts."""

from __future__ import annotations

import sys
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa
from dagster._core.definitions.data_version import StaleStatus  # not public: tests only
from dagster._utils.test.data_versions import get_stale_status_resolver

from oaipmh_dagster.definitions import build_definitions
from oaipmh_dagster.defs.assets import asset_keys, build_harvester_assets, op_name
from oaipmh_dagster.defs.lineage import IDENTIFY_DIGEST_KEY, records_code_version
from oaipmh_dagster.demo.dataset import make_dataset
from oaipmh_dagster.storage.registry import Harvester, Registry
from oaipmh_dagster.storage.store import Store
from oaipmh_dagster.transform import PLUGIN_MODULES_ENV, forget_plugins
from oaipmh_dagster_tests.helpers import add_harvester
from oaipmh_dagster_tests.oaiserver import FaultyOAIServer as OAIServer

LOCATION = "oaipmh_dagster"
XSL = """<xsl:stylesheet version="1.0" xmlns:xsl="http://www.w3.org/1999/XSL/Transform">
  <xsl:template match="/"><out><xsl:value-of select="{select}"/></out></xsl:template>
</xsl:stylesheet>"""


@pytest.fixture
def server():  # noqa: ANN201
    with OAIServer(make_dataset(40, seed=5), page_size=20) as srv:
        yield srv


def _run(h: Harvester, instance: dg.DagsterInstance) -> dg.ExecuteInProcessResult:
    job = build_definitions([h], LOCATION).resolve_job_def(h.job_name)
    return job.execute_in_process(run_config={"ops": {op_name(h.id): {"config": {}}}},
                                  instance=instance, raise_on_error=False)


def _observations(result: dg.ExecuteInProcessResult) -> list[dg.AssetObservation]:
    return [e.asset_observation_data.asset_observation
            for e in result.get_asset_observation_events()]


def _spec_code_version(h: Harvester) -> str | None:
    _, harvest = build_harvester_assets(h)
    return harvest.code_versions_by_key[asset_keys(h.id)[2]]


# -- the records asset's code version ----------------------------------------------------


def test_code_version_is_equal_for_equal_transformers_and_differs_otherwise() -> None:
    assert records_code_version("oai_dc") == records_code_version(" oai_dc ")
    assert records_code_version("oai_dc") != records_code_version("xml")
    h = Harvester(id="cv", base_url="http://127.0.0.1:9/oai", metadata_prefix="oai_dc")
    assert _spec_code_version(h) == records_code_version("oai_dc")
    assert _spec_code_version(Harvester(id="cv", base_url=h.base_url, metadata_prefix="oai_dc",
                                        transformer="xml")) == records_code_version("xml")


def test_code_version_follows_the_stylesheet_bytes(tmp_path: Path) -> None:
    path = tmp_path / "crosswalk.xsl"
    path.write_text(XSL.format(select="'a'"))
    spec = f"xslt:{path}"
    first = records_code_version(spec)
    assert first == records_code_version(spec)
    path.write_text(XSL.format(select="'b'"))
    assert records_code_version(spec) != first
    path.write_text(XSL.format(select="'a'"))
    assert records_code_version(spec) == first


def test_code_version_follows_a_plugins_source(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    module = tmp_path / "lineage_plugin_mod.py"
    module.write_text("def transform(el):\n    return {'v': 1}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(PLUGIN_MODULES_ENV, "lineage_plugin_mod")
    forget_plugins()
    name = "lineage_plugin_mod:transform"
    first = records_code_version(name)
    assert first == records_code_version(name) and "unavailable" not in first
    module.write_text("def transform(el):\n    return {'v': 2}\n")
    assert records_code_version(name) != first
    assert "lineage_plugin_mod" not in sys.modules  # read, never imported
    monkeypatch.delenv(PLUGIN_MODULES_ENV)
    refused = records_code_version(name)  # not allowed any more: marked, not raised
    assert refused not in (first, records_code_version(name + "x"))


# -- the job: source observation, table metadata, staleness -------------------------------


def test_each_run_observes_source_from_identify(database_url: str, server: OAIServer,
                                                instance: dg.DagsterInstance) -> None:
    h = add_harvester("lin", server.base_url)
    first = _run(h, instance)
    assert first.success
    (obs,) = _observations(first)
    assert obs.asset_key == asset_keys(h.id)[0]
    ds = server.dataset
    assert obs.metadata["repositoryName"].value == ds.repository_name
    assert obs.metadata["granularity"].value == ds.granularity
    assert obs.metadata["deletedRecord"].value == ds.deleted_record
    assert obs.metadata["earliestDatestamp"].value == ds.format_datestamp(ds.earliest_datestamp)
    version = obs.metadata[IDENTIFY_DIGEST_KEY].value
    (again,) = _observations(_run(h, instance))
    assert again.metadata[IDENTIFY_DIGEST_KEY].value == version  # same Identify, same version
    ds.repository_name = "Renamed Repository"
    (renamed,) = _observations(_run(h, instance))
    assert renamed.metadata["repositoryName"].value == "Renamed Repository"
    assert renamed.metadata[IDENTIFY_DIGEST_KEY].value != version
    history = instance.fetch_observations(asset_keys(h.id)[0], limit=10).records
    assert len(history) == 3  # one per run, in the asset's event history


def test_a_run_failing_after_identify_still_observes_source(
        sqlite_url: str, server: OAIServer, instance: dg.DagsterInstance) -> None:
    h = add_harvester("linf", server.base_url, max_retries=0)
    server.faults.add("oai_error", verb="ListRecords", times=None)
    result = _run(h, instance)
    assert not result.success
    (obs,) = _observations(result)
    assert obs.metadata["repositoryName"].value == server.dataset.repository_name


def test_record_assets_name_their_table_and_live_rows(database_url: str, server: OAIServer,
                                                      instance: dg.DagsterInstance) -> None:
    h = add_harvester("lint", server.base_url)
    result = _run(h, instance)
    assert result.success
    mats = {m.asset_key.path[-1]: m.materialization.metadata
            for m in result.get_asset_materialization_events()}
    store = Store()
    live = store.count(h.id)
    assert 0 < live < store.count(h.id, live_only=False)  # the data set has tombstones
    url = sa.engine.make_url(database_url)
    table = ("oaipmh_record" if url.get_backend_name() == "sqlite"
             else f"{url.database}.public.oaipmh_record")
    for name in ("raw_records", "records"):
        assert mats[name]["dagster/table_name"].value == table
        assert mats[name]["dagster/row_count"].value == live


def _stale(h: Harvester, instance: dg.DagsterInstance, key: dg.AssetKey
           ) -> tuple[StaleStatus, list[str]]:
    """What Dagster's stale status resolver (the UI's) says of `key` of `h`'s assets."""
    resolver = get_stale_status_resolver(instance, build_harvester_assets(h))
    return resolver.get_status(key), [c.reason for c in resolver.get_stale_causes(key)]


def test_a_transformer_change_shows_records_stale(sqlite_url: str, server: OAIServer,
                                                  instance: dg.DagsterInstance) -> None:
    h = add_harvester("lins", server.base_url)
    assert _run(h, instance).success
    _, raw, records = asset_keys(h.id)
    for key in (raw, records):  # the harvest that observed the source is up to date
        assert _stale(h, instance, key) == (StaleStatus.FRESH, [])
    changed = Registry().update(h.id, transformer="xml")
    status, causes = _stale(changed, instance, records)
    assert status == StaleStatus.STALE and causes == ["has a new code version"]
    assert _stale(changed, instance, raw) == (StaleStatus.FRESH, [])
    # Re-materializing records alone with the new transformer makes it fresh again.
    job = build_definitions([changed], LOCATION).resolve_job_def(h.job_name)
    assert job.execute_in_process(run_config={"ops": {op_name(h.id): {"config": {}}}},
                                  instance=instance, asset_selection=[records]).success
    assert _stale(changed, instance, records) == (StaleStatus.FRESH, [])


def test_a_changed_identify_leaves_raw_records_fresh(sqlite_url: str, server: OAIServer,
                                                     instance: dg.DagsterInstance) -> None:
    """The source's observations carry no data version that raw_records' provenance
    would record and the stale status resolver would not read (the source is not an
    observable asset): raw_records stays fresh through Identify changes."""
    h = add_harvester("linr", server.base_url)
    _, raw, records = asset_keys(h.id)
    for name in ("Renamed Repository", "Renamed Again"):
        assert _run(h, instance).success
        server.dataset.repository_name = name
    assert _run(h, instance).success
    for key in (raw, records):
        assert _stale(h, instance, key) == (StaleStatus.FRESH, [])
