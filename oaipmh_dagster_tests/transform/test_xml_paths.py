"""The generic ``xml`` transformer stores element paths -> text values, so coverage,
the records table and CSV name elements (``mods/titleInfo/title``), not structure."""

from __future__ import annotations

from pathlib import Path

import pytest
from lxml import etree

from oaipmh_dagster.operations.flat import flatten
from oaipmh_dagster.operations.profile import profile_records
from oaipmh_dagster.transform import transform_record
from oaipmh_dagster.transform import xml as xml_mod

from .conftest import OAI_FIXTURES

REALWORLD = OAI_FIXTURES.parent / "oai-realworld" / "files"
OAI = "{http://www.openarchives.org/OAI/2.0/}"

SMALL = (b'<r:rec xmlns:r="urn:r" xmlns="urn:d" xmlns:xsi="http://www.w3.org/2001/'
         b'XMLSchema-instance" xsi:schemaLocation="urn:d d.xsd" id="7" xml:lang="en">\n'
         b"  <title>T</title>\n  <title> Second </title>\n"
         b"  <p>Mixed <b>bold</b> text<!-- c --></p>\n"
         b'  <name type="personal"><part>Doe, J.</part><role><term>aut</term></role></name>\n'
         b"  <empty/>\n</r:rec>")


def test_element_paths_and_text_values() -> None:
    out = transform_record("xml", SMALL)
    assert out == {
        "rec/@id": ["7"],
        "rec/@xml:lang": ["en"],
        "rec/title": ["T", "Second"],
        "rec/p": ["Mixed bold text"],
        "rec/p/b": ["bold"],
        "rec/name/@type": ["personal"],
        "rec/name/part": ["Doe, J."],
        "rec/name/role/term": ["aut"],
        "rec/empty": [],
    }


def test_no_structural_keys_in_coverage_or_csv() -> None:
    out = transform_record("xml", SMALL)
    profile = profile_records([out])
    assert "rec/title" in profile.coverage()
    row = flatten({"oai_identifier": "x", "datestamp": "d", "deleted": False, "sets": [],
                   "errors": [], "metadata": out})
    assert row["metadata.rec/title"] == "T | Second"
    for key in [*profile.coverage(), *row]:
        assert not key.endswith(("tag", "children", "attributes", "text")), key
        assert "nsmap" not in key, key


def test_old_rows_read_as_element_paths() -> None:
    """Rows stored by the lossless mapping of earlier versions read as element paths."""
    old = xml_mod.lossless(etree.fromstring(SMALL))
    assert {"tag", "children", "nsmap"} <= set(old)
    assert xml_mod.readable(old) == transform_record("xml", SMALL)
    assert xml_mod.readable({"title": ["T"]}) == {"title": ["T"]}  # other rows as they are
    assert xml_mod.readable(None) is None
    broken = {"tag": "a", "children": [{"nope": 1}], "nsmap": {}}
    assert xml_mod.readable(broken) == {"a": []}  # unreadable children are skipped
    profile = profile_records([old])
    assert set(profile.coverage()) == set(transform_record("xml", SMALL))
    row = flatten({"oai_identifier": "x", "datestamp": "d", "deleted": False, "sets": [],
                   "errors": [], "metadata": old})
    assert row["metadata.rec/name/part"] == "Doe, J."
    assert not any("nsmap" in k or k.endswith((".tag", ".children")) for k in row)


def _mods_records() -> list[bytes]:
    if not REALWORLD.is_dir():
        pytest.skip(f"real-world OAI-PMH responses not found at {REALWORLD}")
    out = []
    for name in ("harvard-lr-mods.xml", "repox-gr-mods.xml", "repox-metro-lr-mods.xml"):
        page = etree.parse(str(Path(REALWORLD, name))).getroot()
        out += [etree.tostring(m[0]) for m in page.iter(f"{OAI}metadata") if len(m)]
    return out


def test_real_mods_through_the_generic_mapping() -> None:
    records = _mods_records()
    assert len(records) > 10
    for raw in records:
        out = transform_record("xml", raw)
        assert "tag" not in out and "children" not in out and "nsmap" not in out
        assert out["mods/titleInfo/title"], out
        assert all(k.startswith("mods/") for k in out)
        assert all(isinstance(v, list) and all(isinstance(s, str) for s in v)
                   for v in out.values())
        assert "mods/@schemaLocation" not in out


def test_the_records_table_shows_a_title_of_every_shape() -> None:
    from oaipmh_dagster.operations.flat import display_title

    generic = transform_record("xml", SMALL)
    assert display_title(generic) == "T"  # the first element named title
    assert display_title(xml_mod.lossless(etree.fromstring(SMALL))) == "T"  # an old row
    assert display_title({"title": ["DC"], "creator": []}) == "DC"
    assert display_title({"title": "MODS", "titles": [{"title": "MODS"}]}) == "MODS"
    assert display_title({"titles": [{"title": "DataCite", "lang": None}]}) == "DataCite"
    assert display_title(None) == "" and display_title({"x/y": ["z"]}) == ""


def test_xsi_type_keeps_its_prefix() -> None:
    out = transform_record("xml", b'<r xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">'
                           b'<d type="own" xsi:type="dcterms:W3CDTF">2020</d></r>')
    assert out == {"r/d/@type": ["own"], "r/d/@xsi:type": ["dcterms:W3CDTF"], "r/d": ["2020"]}
