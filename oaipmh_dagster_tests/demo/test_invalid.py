"""The demo's records with invalid oai_dc: the shipped schema rejects each for its own
reason, the generated records stay as they are, and the demo's harvest reports them."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest

from oaipmh_dagster.cli import demo as demo_run
from oaipmh_dagster.demo.dataset import make_dataset
from oaipmh_dagster.demo.invalid import INVALID_OAI_DC, add_invalid_records, invalid_records
from oaipmh_dagster.operations.profile import profile_store
from oaipmh_dagster.storage import db
from oaipmh_dagster.storage.registry import Harvester, Registry
from oaipmh_dagster.storage.store import Store
from oaipmh_dagster.transform.oai_dc import transform
from oaipmh_dagster.transform.validation import Validator

# identifier -> a phrase of the schema's complaint
WHY = {
    "oai:demo.example.org:invalid-1": "titel",
    "oai:demo.example.org:invalid-2": "license",
    "oai:demo.example.org:invalid-3": "Character content",
}


def test_each_invalid_record_breaks_the_oai_dc_schema() -> None:
    validate = Validator("oai_dc")
    assert set(INVALID_OAI_DC) == set(WHY)
    for record in invalid_records():
        (error,) = validate(record.metadata["oai_dc"])
        assert error["type"] == "schema"
        assert WHY[record.identifier] in error["message"], error
        assert record.metadata.keys() == {"oai_dc"} and not record.deleted


def test_generated_records_are_valid_and_unchanged() -> None:
    validate = Validator("oai_dc")
    plain = make_dataset(40, seed=1)
    dataset = make_dataset(40, seed=1)
    assert add_invalid_records(dataset) == 3
    generated = [r for r in dataset.records if r.identifier not in INVALID_OAI_DC]
    assert [(r.identifier, r.datestamp, r.sets, r.deleted) for r in generated] == [
        (r.identifier, r.datestamp, r.sets, r.deleted) for r in plain.records]
    assert all(validate(r.metadata["oai_dc"]) == [] for r in generated if not r.deleted)
    # oai_dc only: a DataCite list does not show them.
    assert len(dataset.select("datacite")) == len(plain.select("datacite"))
    assert len(dataset.select("oai_dc")) == len(plain.select("oai_dc")) + 3


def test_not_added_without_oai_dc() -> None:
    dataset = make_dataset(5, seed=1, prefixes=("datacite",))
    assert add_invalid_records(dataset) == 0
    assert len(dataset) == 5


def test_the_misspelt_title_leaves_no_title() -> None:
    from lxml import etree

    xml = INVALID_OAI_DC["oai:demo.example.org:invalid-1"][2]
    assert transform(etree.fromstring(xml))["title"] == []


def test_demo_harvest_reports_the_invalid_records(
        sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`oaipmh-dagster demo --no-ui`: the demo harvester validates; its store holds the
    three invalid records with schema errors, and the title's coverage shows the gap."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.chdir(tmp_path)
    # A demo harvester left by an older demo, without a schema, gets the demo's.
    Registry(db.get_engine()).add(Harvester(id="demo", base_url="http://127.0.0.1:9/oai",
                                            metadata_prefix="oai_dc"))
    with dg.instance_for_test() as instance:
        code = demo_run.run_demo(ui_port=3999, oai_port=0, n_records=20, ui=False,
                                 instance_factory=lambda: instance)
    assert code == 0
    assert Registry(db.get_engine()).get("demo").schema == "oai_dc"
    store = Store(db.get_engine())
    invalid = store.schema_invalid("demo")
    assert invalid.count == 3
    assert [identifier for identifier, _ in invalid.sample] == sorted(WHY)
    for identifier, message in invalid.sample:
        assert WHY[identifier] in message
    profile = profile_store(store, "demo")
    live = store.count("demo")
    assert profile.coverage()["title"] == round((live - 1) / live, 4)
    assert store.schema_invalid("demo_datacite").count == 0
