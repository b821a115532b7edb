"""The shipped schemas against every record of their formats in the third-party
responses (`../shared/oai-fixtures`, `../shared/oai-realworld`): each record the
schemas reject is listed here with why the standard itself rejects it, so a schema
that flags a valid real-world record fails this test."""

from __future__ import annotations

import collections
from collections.abc import Iterator

import pytest
from lxml import etree

from oaipmh_dagster.transform.validation import Validator
from oaipmh_dagster_tests.conftest import FIXTURES

REALWORLD = FIXTURES.parent / "oai-realworld"
OAI = "{http://www.openarchives.org/OAI/2.0/}"
FORMATS = {
    "http://www.openarchives.org/OAI/2.0/oai_dc/": "oai_dc",
    "http://datacite.org/schema/kernel-4": "datacite",
    "http://www.loc.gov/MARC21/slim": "marc21",
}
_MARC_INDICATOR = ("a MARCXML indicator is a digit, a lower-case letter or a blank; "
                   "CDS/Invenio write upper-case local indicators")
# (file, identifier) -> (why the standard rejects it, a phrase of libxml2's message)
INVALID = {
    ("cds-gr.xml", "oai:cds.cern.ch:2653609"): (_MARC_INDICATOR, "'C' is not accepted"),
    ("cds-lr-hepex.xml", "oai:cds.cern.ch:445527"): (_MARC_INDICATOR, "'C' is not accepted"),
    ("cds-lr-hepex.xml", "oai:cds.cern.ch:449260"): (_MARC_INDICATOR, "'C' is not accepted"),
    ("cds-lr-hepth.xml", "oai:cds.cern.ch:329074"): (_MARC_INDICATOR, "'C' is not accepted"),
    ("cds-lr-hepth.xml", "oai:cds.cern.ch:428218"): (_MARC_INDICATOR, "'C' is not accepted"),
    ("nusl-gr-marc.xml", "oai:invenio.nusl.cz:333449"): (_MARC_INDICATOR, "'C' is not accepted"),
    ("hindawi-lr-marc.xml", "oai:hindawi.com:10.1155/2010/194946"): (
        "the fields of marc:record are unprefixed, so they fall in the envelope's default "
        "namespace (OAI-PMH), not MARC21 slim: the record has no MARC leader or fields",
        "{http://www.openarchives.org/OAI/2.0/}datafield': This element is not expected"),
    ("ida-gr.xml", "urn:nbn:fi:csc-ida2013032600070m"): (
        "oai_dc:dc holds only the 15 DCMES elements; this one carries dcterms:rights",
        "{http://purl.org/dc/terms/}rights': This element is not expected"),
    **{(page, "oai:test.example.com:1585322"): (
        "stray text '(?s)' after dc:source inside oai_dc:dc, whose content is elements only",
        "Character content other than whitespace is not allowed")
       for page in ("ListRecords.xml", "ListRecords2.xml", "ListRecords3.xml",
                    "ListRecords4.xml")},
}
# At least this many records of each format are checked (the data sets hold more).
AT_LEAST = {"oai_dc": 400, "datacite": 50, "marc21": 100}


def _pages() -> Iterator[tuple[str, bytes]]:
    """(file name, body) of every recorded response: XML files and the VCR cassettes."""
    for path in sorted((REALWORLD / "files").glob("*.xml")):
        yield path.name, path.read_bytes()
    for path in sorted(FIXTURES.rglob("*.xml")):
        yield path.name, path.read_bytes()
    yaml = pytest.importorskip("yaml", reason="PyYAML reads the VCR cassettes")
    for path in sorted((FIXTURES / "scythe").glob("*.yaml")):
        data = yaml.load(path.read_text("utf-8"), Loader=getattr(yaml, "CSafeLoader",
                                                                  yaml.SafeLoader))
        for i, interaction in enumerate(data["interactions"]):
            body = interaction["response"]["body"]["content"]
            if isinstance(body, str):
                yield f"{path.name}[{i}]", body.encode("utf-8")


def _records() -> Iterator[tuple[str, str, str, etree._Element]]:
    """(format, file, identifier, metadata element) of every record of the three formats
    (an oai_datacite record by its wrapper, as harvested)."""
    parser = etree.XMLParser(resolve_entities=False, no_network=True, huge_tree=True)
    for name, body in _pages():
        try:
            root = etree.fromstring(body, parser)
        except etree.XMLSyntaxError:
            continue  # the broken pages of the data sets: no records to judge
        for record in root.iter(f"{OAI}record"):
            metadata = record.find(f"{OAI}metadata")
            if metadata is None or not len(metadata):
                continue
            element = metadata[0]
            inner = element
            if etree.QName(element).localname == "oai_datacite":
                inner = element.find(".//{*}payload/*")
            fmt = FORMATS.get(etree.QName(inner).namespace or "")
            if fmt is not None:
                identifier = record.findtext(f"{OAI}header/{OAI}identifier") or ""
                yield fmt, name, identifier.strip(), element


@pytest.fixture(scope="module")
def judged() -> dict[str, dict[tuple[str, str], list[dict]]]:
    if not FIXTURES.is_dir() or not (REALWORLD / "files").is_dir():
        pytest.skip(f"third-party responses not found at {FIXTURES} and {REALWORLD}")
    validators = {fmt: Validator(fmt) for fmt in AT_LEAST}
    out: dict[str, dict[tuple[str, str], list[dict]]] = collections.defaultdict(dict)
    for fmt, name, identifier, element in _records():
        out[fmt][(name, identifier)] = validators[fmt](None, element)
    return out


@pytest.mark.parametrize("fmt", sorted(AT_LEAST))
def test_every_record_of_the_format_is_judged(fmt: str, judged: dict) -> None:
    assert len(judged[fmt]) >= AT_LEAST[fmt]


def test_rejected_records_are_exactly_the_invalid_ones(judged: dict) -> None:
    rejected = {key: errors for records in judged.values() for key, errors in records.items()
                if errors}
    assert set(rejected) == set(INVALID)
    for key, errors in rejected.items():
        assert [e["type"] for e in errors] == ["schema"]
        assert INVALID[key][1] in errors[0]["message"], (key, errors[0]["message"])


def test_datacite_records_include_oai_datacite_wrappers(judged: dict) -> None:
    """The wrapper's <resource> is what is validated (Viringo and Zenodo serve both)."""
    names = {name for name, _ in judged["datacite"]}
    assert "viringo-gr-oaidatacite.xml" in names and "viringo-gr-datacite.xml" in names
