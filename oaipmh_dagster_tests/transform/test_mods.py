"""The ``mods`` transformer on real MODS (Harvard LibraryCloud, REPOX) and on a record
that holds what an aggregator reads: names with roles, typed identifiers, dates,
subjects, genre, language, access conditions and the host it appeared in."""

from __future__ import annotations

from pathlib import Path

import pytest
from lxml import etree

from oaipmh_dagster import formats
from oaipmh_dagster.transform import TransformError, transform_record
from oaipmh_dagster.transform import mods as mods_mod

from .conftest import OAI_FIXTURES

REALWORLD = OAI_FIXTURES.parent / "oai-realworld" / "files"
OAI = "{http://www.openarchives.org/OAI/2.0/}"

ARTICLE = b"""<mods xmlns="http://www.loc.gov/mods/v3" xmlns:xlink="http://www.w3.org/1999/xlink"
    version="3.7">
  <titleInfo><nonSort>The </nonSort><title>Flora of Bohemia</title>
    <subTitle>a survey</subTitle></titleInfo>
  <titleInfo type="translated" lang="cze"><title>Kv\xc4\x9btena \xc4\x8cech</title></titleInfo>
  <name type="personal">
    <namePart type="family">Nov\xc3\xa1k</namePart><namePart type="given">Jan</namePart>
    <nameIdentifier type="orcid">0000-0002-1825-0097</nameIdentifier>
    <affiliation>Charles University</affiliation>
    <role><roleTerm type="code" authority="marcrelator">aut</roleTerm></role>
  </name>
  <name type="personal"><namePart>Smith, Ann</namePart>
    <role><roleTerm type="text">editor</roleTerm></role></name>
  <name type="corporate"><namePart>Academy of Sciences</namePart>
    <role><roleTerm type="code">fnd</roleTerm></role></name>
  <typeOfResource>text</typeOfResource>
  <genre authority="coar">journal article</genre>
  <originInfo>
    <place><placeTerm type="code">xr</placeTerm><placeTerm type="text">Prague</placeTerm></place>
    <publisher>Academia</publisher>
    <dateIssued encoding="w3cdtf" keyDate="yes">2021-05-04</dateIssued>
    <dateCreated>2020</dateCreated>
    <edition>2nd</edition>
  </originInfo>
  <language><languageTerm type="code" authority="iso639-2b">eng</languageTerm>
    <languageTerm type="text">English</languageTerm></language>
  <physicalDescription><form>electronic</form><extent>12 p.</extent>
    <internetMediaType>application/pdf</internetMediaType></physicalDescription>
  <abstract>Plants of <i>Bohemia</i>.</abstract>
  <subject authority="lcsh"><topic>Botany</topic><geographic>Czech Republic</geographic></subject>
  <subject><topic>Flora</topic></subject>
  <classification authority="ddc">581.943</classification>
  <relatedItem type="host">
    <titleInfo><title>Preslia</title></titleInfo>
    <identifier type="issn">0032-7786</identifier>
    <part><detail type="volume"><number>93</number></detail>
      <detail type="issue"><number>2</number></detail>
      <extent unit="pages"><start>101</start><end>112</end></extent>
      <date>2021</date></part>
  </relatedItem>
  <relatedItem type="otherVersion" xlink:href="https://example.org/v1"/>
  <identifier type="doi">10.23855/preslia.2021.101</identifier>
  <identifier type="hdl">11222.digilib/1234</identifier>
  <identifier>https://example.org/record/1</identifier>
  <location><url access="object in context">https://example.org/record/1</url></location>
  <accessCondition type="use and reproduction">CC BY 4.0</accessCondition>
  <accessCondition type="restriction on access">open access</accessCondition>
  <note type="funding">GA \xc4\x8cR 20-12345S</note>
  <recordInfo><recordIdentifier>rec-1</recordIdentifier>
    <recordContentSource>Example Library</recordContentSource></recordInfo>
</mods>"""


def test_an_article_gives_what_an_aggregator_reads() -> None:
    out = transform_record("mods", ARTICLE)
    assert out["title"] == "The Flora of Bohemia: a survey"
    assert out["titles"][1] == {"title": "Květena Čech", "type": "translated", "lang": "cze"}
    assert out["names"][0] == {"name": "Novák, Jan", "type": "personal", "roles": ["aut"],
                               "identifiers": ["0000-0002-1825-0097"],
                               "affiliations": ["Charles University"]}
    assert out["creators"] == ["Novák, Jan"]  # the editor and the funder are no creators
    assert [n["roles"] for n in out["names"]] == [["aut"], ["editor"], ["fnd"]]
    assert out["doi"] == "10.23855/preslia.2021.101"
    assert out["identifiers"] == [
        {"type": "doi", "value": "10.23855/preslia.2021.101"},
        {"type": "hdl", "value": "11222.digilib/1234"},
        {"type": "url", "value": "https://example.org/record/1"},  # typed by its text
    ]
    assert out["urls"] == ["https://example.org/record/1"]
    assert out["date"] == "2021-05-04"
    assert out["dates"][0] == {"type": "dateIssued", "value": "2021-05-04", "point": None,
                               "encoding": "w3cdtf", "key_date": True}
    assert out["publishers"] == ["Academia"] and out["places"] == ["Prague"]
    assert out["edition"] == "2nd"
    assert out["subjects"] == [
        {"value": "Botany--Czech Republic", "kind": None, "authority": "lcsh"},
        {"value": "Flora", "kind": "topic", "authority": None}]
    assert out["classifications"] == [{"value": "581.943", "authority": "ddc"}]
    assert out["genres"] == ["journal article"] and out["types_of_resource"] == ["text"]
    assert out["languages"] == ["eng"]
    assert out["abstracts"] == ["Plants of Bohemia."]
    assert out["rights"] == ["CC BY 4.0", "open access"]
    assert out["access_conditions"][1] == {"type": "restriction on access",
                                           "value": "open access"}
    assert out["host"] == {
        "type": "host", "title": "Preslia", "urls": [],
        "identifiers": [{"type": "issn", "value": "0032-7786"}],
        "part": {"volume": "93", "issue": "2", "pages": "101-112", "start_page": "101",
                 "end_page": "112", "date": "2021"}}
    assert out["related_items"][1]["type"] == "otherVersion"
    assert out["extents"] == ["12 p."] and out["media_types"] == ["application/pdf"]
    assert out["notes"] == [{"type": "funding", "value": "GA ČR 20-12345S"}]
    assert out["record_identifiers"] == ["rec-1"] and out["record_source"] == "Example Library"
    assert out["version"] == "3.7"


def test_keys_are_the_same_for_every_record() -> None:
    empty = transform_record("mods", b'<mods xmlns="http://www.loc.gov/mods/v3"/>')
    assert list(empty) == list(transform_record("mods", ARTICLE))
    assert empty["title"] is None and empty["names"] == [] and empty["host"] is None


def test_a_collection_gives_its_first_record_and_other_roots_fail() -> None:
    collection = (b'<modsCollection xmlns="http://www.loc.gov/mods/v3"><mods><titleInfo>'
                  b"<title>One</title></titleInfo></mods><mods/></modsCollection>")
    assert transform_record("mods", collection)["title"] == "One"
    with pytest.raises(TransformError) as info:
        transform_record("mods", b"<record/>")
    assert info.value.type == "unexpected_format"


def test_mods_is_the_default_for_its_prefix() -> None:
    assert formats.default_transformer("mods") == "mods"
    assert formats.format_of_root("{http://www.loc.gov/mods/v3}mods").name == "mods"


def _records(name: str) -> list[tuple[str, etree._Element]]:
    if not REALWORLD.is_dir():
        pytest.skip(f"real-world OAI-PMH responses not found at {REALWORLD}")
    page = etree.parse(str(Path(REALWORLD, name))).getroot()
    return [(r.findtext(f"{OAI}header/{OAI}identifier") or "", r.find(f"{OAI}metadata")[0])
            for r in page.iter(f"{OAI}record") if r.find(f"{OAI}metadata") is not None]


def test_real_harvard_librarycloud_records() -> None:
    records = _records("harvard-lr-mods.xml")
    assert len(records) >= 10
    for identifier, element in records:
        out = mods_mod.transform(element)
        assert out["title"], identifier
        assert out["version"] == "3.6"
        assert out["host"] is not None and out["host"]["title"], identifier
    first = mods_mod.transform(records[0][1])
    assert first["title"] == "Plate 1. Clematis cylindrica"
    assert first["languages"] == ["und"]
    assert first["host"]["title"] == "Alfred Riocreux botanical watercolors"
    assert first["record_identifiers"] == ["arn00007c00001"]
    assert first["urls"][1] == "https://nrs.harvard.edu/urn-3:FMUS.ARN:37524535"


def test_real_repox_records() -> None:
    ((_, gr),) = _records("repox-gr-mods.xml")
    out = mods_mod.transform(gr)
    assert out["title"] == "Reading notes for 2nd Wind 2001"
    assert out["creators"] == ["Goedicke, Patricia"]
    assert out["names"][0]["roles"] == ["Creator"]
    assert out["types_of_resource"] == ["text"] and out["media_types"] == ["application/pdf"]
    assert out["date"] == "2001-10-07T07:00:00Z"
    assert out["rights"][0].startswith("Copyright to this collection")
    assert "Series I: Works by Patricia Goedicke, 1945-2006" in out["physical_locations"]
    assert out["related_items"][0]["title"] == "Collection Title"
    ((_, metro),) = _records("repox-metro-lr-mods.xml")
    out = mods_mod.transform(metro)
    assert out["creators"] == ["Franck Taylor Bowers"]
    assert out["types_of_resource"] == ["still image"] and out["extents"] == ["5 X 7 inches"]
    assert out["urls"][0].endswith("/p261501coll8/id/110")
