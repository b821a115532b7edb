"""Provenance kept: a record's `<about>` blocks are stored with it (both databases),
change its content, leave with a tombstone, and come back in `export --format xml`."""

from __future__ import annotations

from pathlib import Path

from lxml import etree

from oaipmh_dagster.harvesting.rows import write_page
from oaipmh_dagster.oai.parse import parse_list_page
from oaipmh_dagster.operations.export import export
from oaipmh_dagster.storage import db
from oaipmh_dagster.storage.store import Store
from oaipmh_dagster_tests.storage.test_store import title_of

OAI = "http://www.openarchives.org/OAI/2.0/"
PROVENANCE = "http://www.openarchives.org/OAI/2.0/provenance"
PAGE = """<?xml version="1.0" encoding="UTF-8"?>
<OAI-PMH xmlns="http://www.openarchives.org/OAI/2.0/">
<responseDate>2024-01-02T03:04:05Z</responseDate>
<request verb="ListRecords" metadataPrefix="oai_dc">http://x/oai</request>
<ListRecords>
<record><header><identifier>oai:x:1</identifier><datestamp>2024-01-01</datestamp></header>
<metadata><oai_dc:dc xmlns:oai_dc="http://www.openarchives.org/OAI/2.0/oai_dc/"
 xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:title>One</dc:title></oai_dc:dc></metadata>
<about><provenance xmlns="http://www.openarchives.org/OAI/2.0/provenance">
<originDescription harvestDate="2023-05-06" altered="false">
<baseURL>http://origin.example/oai</baseURL><identifier>oai:origin:{origin}</identifier>
</originDescription></provenance></about>
<about><rights xmlns="http://www.openarchives.org/OAI/2.0/rights/">CC-BY</rights></about>
</record>
<record><header><identifier>oai:x:2</identifier><datestamp>2024-01-01</datestamp></header>
<metadata><oai_dc:dc xmlns:oai_dc="http://www.openarchives.org/OAI/2.0/oai_dc/"
 xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:title>Two</dc:title></oai_dc:dc></metadata>
</record>
</ListRecords></OAI-PMH>"""


def page(origin: str = "7") -> list:
    body = PAGE.format(origin=origin).encode()
    return parse_list_page(body, "http://x/oai", verb="ListRecords",
                           params={"metadataPrefix": "oai_dc"},
                           args={"metadataPrefix": "oai_dc"}).records


def about_of(store: Store, identifier: str) -> list[str]:
    return next(i["about"] for i in store.iter_records("h", with_raw=True)
                if i["oai_identifier"] == identifier)


def test_about_blocks_are_stored_and_change_the_record(database_url: str) -> None:
    store = Store(db.get_engine(database_url))
    counts = write_page(store, "h", page(), run_id="r1", transform=title_of)
    assert counts.new == 2
    blocks = about_of(store, "oai:x:1")
    assert len(blocks) == 2
    provenance = etree.fromstring(blocks[0].encode())
    assert provenance.tag == f"{{{PROVENANCE}}}provenance"
    assert provenance.findtext(f".//{{{PROVENANCE}}}identifier") == "oai:origin:7"
    assert "CC-BY" in blocks[1]
    assert about_of(store, "oai:x:2") == []
    again = write_page(store, "h", page(), run_id="r2", transform=title_of)
    assert (again.unchanged, again.updated) == (2, 0)
    changed = write_page(store, "h", page(origin="8"), run_id="r3", transform=title_of)
    assert (changed.updated, changed.unchanged) == (1, 1)  # only the about block changed
    assert "oai:origin:8" in about_of(store, "oai:x:1")[0]


def test_about_blocks_come_back_in_the_xml_export(database_url: str, tmp_path: Path) -> None:
    store = Store(db.get_engine(database_url))
    write_page(store, "h", page(), run_id="r1", transform=title_of)
    out = tmp_path / "h.xml"
    assert export(store, "h", "xml", out) == 2
    root = etree.parse(str(out)).getroot()
    first = root.find(f"{{{OAI}}}record")
    abouts = first.findall(f"{{{OAI}}}about")
    assert [a[0].tag for a in abouts] == [f"{{{PROVENANCE}}}provenance",
                                          "{http://www.openarchives.org/OAI/2.0/rights/}rights"]
