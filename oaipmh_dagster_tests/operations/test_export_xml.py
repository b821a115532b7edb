"""`export --format xml`: one well-formed document of the records as harvested (both
databases), read back as OAI-PMH records."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from lxml import etree

from oaipmh_dagster.demo.dataset import make_dataset
from oaipmh_dagster.demo.server import OAIServer
from oaipmh_dagster.harvesting.rows import write_page
from oaipmh_dagster.operations.export import export
from oaipmh_dagster.operations.export_xml import OAI_NS
from oaipmh_dagster.storage import db
from oaipmh_dagster.storage.registry import Harvester, Registry
from oaipmh_dagster.storage.store import Store
from oaipmh_dagster_tests.operations.test_export import run
from oaipmh_dagster_tests.storage.test_store import rec, title_of

NS = {"oai": OAI_NS}


def records_of(path: Path) -> list[etree._Element]:
    root = etree.parse(str(path)).getroot()
    assert root.tag == f"{{{OAI_NS}}}records"
    return root.findall("oai:record", NS)


@pytest.fixture
def server() -> Iterator[OAIServer]:
    srv = OAIServer(make_dataset(30, seed=3), page_size=7).start()
    yield srv
    srv.stop()


def test_xml_export_after_a_real_harvest(capsys: pytest.CaptureFixture[str], database_url: str,
                                         server: OAIServer, tmp_path: Path) -> None:
    """Every served record, in identifier order: header as served, the metadata element
    byte-equal (canonically) to the served one, deleted records as deleted headers."""
    from oaipmh_dagster.harvesting.harvest import harvest

    h = Registry(db.get_engine()).add(Harvester(id="demo", base_url=server.base_url,
                                                metadata_prefix="oai_dc"))
    harvest(h, Store(), run_id="t")
    path = tmp_path / "demo.xml"
    code, out, err = run(capsys, "export", "demo", "--format", "xml", "--output", str(path))
    assert code == 0, err
    assert "wrote 30 records of demo" in out
    served = sorted(server.dataset.records, key=lambda r: r.identifier)
    got = records_of(path)
    assert [r.findtext("oai:header/oai:identifier", namespaces=NS) for r in got] == [
        s.identifier for s in served]
    stored = {i["oai_identifier"]: i for i in Store().iter_records("demo", with_raw=True)}
    for element, record in zip(got, served, strict=True):
        header = element.find("oai:header", NS)
        assert (header.get("status") == "deleted") is record.deleted
        assert header.findtext("oai:datestamp", namespaces=NS) == stored[
            record.identifier]["datestamp"]
        assert [s.text for s in header.findall("oai:setSpec", NS)] == stored[
            record.identifier]["sets"]
        metadata = element.find("oai:metadata", NS)
        if record.deleted:
            assert metadata is None
            continue
        assert len(metadata) == 1
        expected = etree.fromstring(stored[record.identifier]["raw_xml"].encode())
        assert etree.tostring(metadata[0], method="c14n") == etree.tostring(
            expected, method="c14n")


def test_xml_export_escapes_and_skips_unreadable_metadata(database_url: str,
                                                           tmp_path: Path) -> None:
    """Identifiers and set names with markup characters stay text; a record whose
    metadata failed is a header only; the document parses."""
    store = Store(db.get_engine(database_url))
    write_page(store, "h", [rec("oai:x:<a&b>", sets=("s&1", "<s2>"), title="t"), rec("plain"),
                            rec("gone", deleted=True)], run_id="r1", transform=title_of)
    out = tmp_path / "h.xml"
    assert export(store, "h", "xml", out) == 3
    got = {r.findtext("oai:header/oai:identifier", namespaces=NS): r for r in records_of(out)}
    assert set(got) == {"oai:x:<a&b>", "plain", "gone"}
    assert [s.text for s in got["oai:x:<a&b>"].findall("oai:header/oai:setSpec", NS)] == [
        "s&1", "<s2>"]
    assert got["gone"].find("oai:header", NS).get("status") == "deleted"
    assert out.read_text().rstrip().endswith("<!-- 3 records -->")


def test_xml_export_of_nothing_is_an_empty_document(database_url: str, tmp_path: Path) -> None:
    out = tmp_path / "none.xml"
    assert export(Store(db.get_engine(database_url)), "nobody", "xml", out) == 0
    assert records_of(out) == []
