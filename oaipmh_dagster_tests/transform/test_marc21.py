"""The ``marc21``/``marcxml`` transformer on a small hand-written MARCXML record."""

from __future__ import annotations

import json

import pytest

from oaipmh_dagster.transform import TransformError, get_transformer, transform_record

LEADER = "01142cam  2200301 a 4500"
F008 = "920219s1993    caua   j      000 0 eng  "

MARCXML = f"""<?xml version="1.0" encoding="UTF-8"?>
<marc:collection xmlns:marc="http://www.loc.gov/MARC21/slim">
  <marc:record>
    <marc:leader>{LEADER}</marc:leader>
    <marc:controlfield tag="001">   92005291 </marc:controlfield>
    <marc:controlfield tag="003">DLC</marc:controlfield>
    <marc:controlfield tag="008">{F008}</marc:controlfield>
    <marc:datafield tag="020" ind1=" " ind2=" ">
      <marc:subfield code="a">0152038655 :</marc:subfield>
      <marc:subfield code="c">$15.95</marc:subfield>
    </marc:datafield>
    <marc:datafield tag="020" ind1=" " ind2=" ">
      <marc:subfield code="a">9780152038656 (pbk.)</marc:subfield>
    </marc:datafield>
    <marc:datafield tag="022" ind1="0" ind2=" ">
      <marc:subfield code="a">1234-5679</marc:subfield>
    </marc:datafield>
    <marc:datafield tag="100" ind1="1" ind2=" ">
      <marc:subfield code="a">Sandburg, Carl,</marc:subfield>
      <marc:subfield code="d">1878-1967.</marc:subfield>
    </marc:datafield>
    <marc:datafield tag="245" ind1="1" ind2="0">
      <marc:subfield code="a">Arithmetic /</marc:subfield>
      <marc:subfield code="c">Carl Sandburg ; illustrated as an anamorphic adventure.</marc:subfield>
      <marc:subfield code="b">a poem :</marc:subfield>
      <marc:subfield code="x">   </marc:subfield>
    </marc:datafield>
    <marc:datafield tag="650" ind1=" " ind2="1">
      <marc:subfield code="a">Arithmetic</marc:subfield>
      <marc:subfield code="x">Juvenile poetry.</marc:subfield>
    </marc:datafield>
  </marc:record>
</marc:collection>
""".encode()


def test_marcxml_record() -> None:
    result = transform_record("marc21", MARCXML)
    json.dumps(result)
    assert list(result) == [
        "leader",
        "control_fields",
        "data_fields",
        "title",
        "author",
        "isbn",
        "issn",
    ]
    # Fixed-position data is kept verbatim, spaces included.
    assert result["leader"] == LEADER
    assert result["control_fields"] == [
        {"tag": "001", "value": "   92005291 "},
        {"tag": "003", "value": "DLC"},
        {"tag": "008", "value": F008},
    ]
    assert [f["tag"] for f in result["data_fields"]] == ["020", "020", "022", "100", "245", "650"]
    title_field = result["data_fields"][4]
    assert title_field["ind1"] == "1" and title_field["ind2"] == "0"
    # Subfields keep document order; blank ones are dropped.
    assert title_field["subfields"] == [
        {"code": "a", "value": "Arithmetic /"},
        {"code": "c", "value": "Carl Sandburg ; illustrated as an anamorphic adventure."},
        {"code": "b", "value": "a poem :"},
    ]
    assert result["data_fields"][5] == {
        "tag": "650",
        "ind1": " ",
        "ind2": "1",
        "subfields": [
            {"code": "a", "value": "Arithmetic"},
            {"code": "x", "value": "Juvenile poetry."},
        ],
    }
    assert result["title"] == "Arithmetic / a poem"
    assert result["author"] == "Sandburg, Carl"
    assert result["isbn"] == ["0152038655", "9780152038656"]
    assert result["issn"] == ["1234-5679"]


def test_marcxml_alias_and_unnamespaced_record() -> None:
    assert get_transformer("marcxml") is get_transformer("marc21")
    xml = b"""<record><leader>00000nam a2200000 i 4500</leader>
      <datafield tag="110" ind1="2"><subfield code="a">Example Corporation.</subfield></datafield>
      <datafield tag="245" ind1="0" ind2="0"><subfield code="a">Only a title.</subfield></datafield>
    </record>"""
    result = transform_record("marcxml", xml)
    assert result["author"] == "Example Corporation"
    assert result["title"] == "Only a title"
    assert result["data_fields"][0]["ind2"] == " "  # missing indicator = blank
    assert result["control_fields"] == [] and result["isbn"] == [] and result["issn"] == []


def test_empty_record() -> None:
    result = transform_record("marc21", b'<record xmlns="http://www.loc.gov/MARC21/slim"/>')
    assert result == {
        "leader": None,
        "control_fields": [],
        "data_fields": [],
        "title": None,
        "author": None,
        "isbn": [],
        "issn": [],
    }


def test_field_without_tag_points_at_the_element() -> None:
    broken = MARCXML.replace(b'<marc:datafield tag="022"', b"<marc:datafield")
    with pytest.raises(TransformError) as info:
        transform_record("marc21", broken)
    assert info.value.type == "invalid_record"
    assert info.value.location == "/marc:collection/marc:record/marc:datafield[3]"


def test_not_marc_is_rejected() -> None:
    with pytest.raises(TransformError) as info:
        transform_record("marc21", b"<mods xmlns='http://www.loc.gov/mods/v3'><titleInfo/></mods>")
    assert info.value.type == "unexpected_format"
