"""Validation during a harvest from a loopback OAI-PMH server, for each shipped schema
(SQLite and PostgreSQL): exactly the invalid records carry a schema error, they are kept
and transformed, unchanged records are not validated again, and switching validation
off rewrites the rows."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from oaipmh_dagster.demo.dataset import ServedRecord
from oaipmh_dagster.harvesting.harvest import harvest
from oaipmh_dagster.oai import ClientOptions
from oaipmh_dagster.storage.registry import Harvester
from oaipmh_dagster.storage.store import Store
from oaipmh_dagster_tests.oaiserver import FaultyOAIServer as OAIServer
from oaipmh_dagster_tests.validation.served import FORMATS, MARC, T0, dataset, invalid

FAST = ClientOptions(max_retries=1, backoff_base=0.01, backoff_max=0.05, read_timeout=5)


@pytest.fixture(params=sorted(FORMATS))
def served(request: pytest.FixtureRequest) -> Iterator[tuple[str, OAIServer]]:
    with OAIServer(dataset(request.param), page_size=2) as srv:
        yield request.param, srv


def _schema_errors(store: Store, harvester_id: str) -> dict[str, list[dict]]:
    return {item["oai_identifier"]: [e for e in item["errors"] if e["type"] == "schema"]
            for item in store.iter_records(harvester_id)}


def test_exactly_the_invalid_records_are_flagged_and_kept(
        database_url: str, served: tuple[str, OAIServer]) -> None:
    fmt, srv = served
    store = Store()
    prefix = FORMATS[fmt][0]
    h = Harvester(id="v", base_url=srv.base_url, metadata_prefix=prefix, schema=fmt)
    stats = harvest(h, store, run_id="r1", options=FAST)
    total = len(FORMATS[fmt][3])
    assert stats.new == total and stats.failed == 0  # invalid is not failed
    errors = _schema_errors(store, "v")
    assert {i for i, e in errors.items() if e} == invalid(fmt)
    for identifier in invalid(fmt):
        (error,) = errors[identifier]
        assert error["location"] == "metadata" and error["message"]
        assert 1 <= len(error.get("violations", [None])) <= 3
    records = {r["oai_identifier"]: r for r in store.iter_records("v")}
    assert all(r["metadata"] is not None for r in records.values())  # still transformed
    found = store.schema_invalid("v", sample=2)
    assert found.count == len(invalid(fmt))
    assert [i for i, _ in found.sample] == sorted(invalid(fmt))[:2]
    assert store.counts("v")["failed"] == 0 and store.failed_identifiers("v") == []

    again = harvest(h, store, run_id="r2", options=FAST, run=None)
    assert again.unchanged == total and again.updated == 0  # not validated again

    off = h.replace(schema=None)
    rewritten = harvest(off, store, run_id="r3", options=FAST)
    assert rewritten.updated == total
    assert not any(_schema_errors(store, "v").values())
    assert store.schema_invalid("v").count == 0


def test_a_record_in_another_namespace_names_the_expected_one(sqlite_url: str) -> None:
    ds = dataset("oai_dc")
    ds.add(ServedRecord("oai:t:dc-marc", T0, metadata={"oai_dc": MARC.format("")}))
    with OAIServer(ds, page_size=10) as srv:
        store = Store()
        h = Harvester(id="ns", base_url=srv.base_url, metadata_prefix="oai_dc", schema="oai_dc",
                      transformer="xml")
        harvest(h, store, run_id="r1", options=FAST)
    assert {i for i, e in _schema_errors(store, "ns").items() if e} == (
        invalid("oai_dc") | {"oai:t:dc-marc"})
    (error,) = _schema_errors(store, "ns")["oai:t:dc-marc"]
    assert error["message"] == (
        "the metadata element <record> is in namespace http://www.loc.gov/MARC21/slim; the "
        "schema expects http://www.openarchives.org/OAI/2.0/oai_dc/")


def test_violations_name_line_path_and_message(sqlite_url: str) -> None:
    with OAIServer(dataset("marc21"), page_size=10) as srv:
        store = Store()
        h = Harvester(id="m", base_url=srv.base_url, metadata_prefix="marc21", schema="marc21")
        harvest(h, store, run_id="r1", options=FAST)
    (error,) = _schema_errors(store, "m")["oai:t:marc-4"]
    (violation,) = error["violations"]
    # libxml2's path: unprefixed (default namespace) elements show as *; the message
    # names the element.
    assert violation["path"] == "/*/*" and isinstance(violation["line"], int)
    assert violation["message"].startswith("Element '{http://www.loc.gov/MARC21/slim}leader'")
    assert "pattern" in violation["message"] and "'short'" in violation["message"]
    assert error["message"].startswith(f"line {violation['line']} {violation['path']}: ")
