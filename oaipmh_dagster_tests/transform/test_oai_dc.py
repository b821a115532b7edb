"""The ``oai_dc`` transformer against Sickle, pyoai (DSpace) and Zenodo records."""

from __future__ import annotations

import json

import pytest

from oaipmh_dagster.transform import TransformError, transform_record
from oaipmh_dagster.transform.oai_dc import DC_ELEMENTS

# The fifteen elements of Dublin Core 1.1, in the order of the spec (an independent oracle).
DC_KEYS = ["title", "creator", "subject", "description", "publisher", "contributor", "date",
           "type", "format", "identifier", "source", "language", "relation", "coverage",
           "rights"]


def _assert_clean(result: dict) -> None:
    assert list(result) == DC_KEYS
    for values in result.values():
        assert isinstance(values, list)
        for value in values:
            assert isinstance(value, str)
            assert value and value == value.strip()
    json.dumps(result)


def test_schema_is_the_fifteen_elements_in_order() -> None:
    assert list(DC_ELEMENTS) == DC_KEYS


def test_sickle_record(sickle_dc: dict[str, bytes]) -> None:
    result = transform_record("oai_dc", sickle_dc["oai:test.example.com:1585322"])
    _assert_clean(result)
    assert result["title"] == ["Sample Title"]
    assert result["creator"] == ["John Doe"] * 4
    assert result["identifier"] == ["http://test.example.com/publication/1585322"]
    assert result["language"] == ["eng"]
    assert result["source"] == ["Sample Source"]
    # The publisher is indented over three lines in the file: stripped.
    assert result["publisher"] == ["Sample Publisher"]
    assert result["date"] == ["2010"]
    assert result["type"] == ["info:eu-repo/semantics/article", "doc-type:article", "text"]
    (description,) = result["description"]
    assert description.startswith("Lorem ipsum dolor sit amet")
    assert description.endswith("id est laborum.")
    for absent in ("subject", "contributor", "format", "relation", "coverage", "rights"):
        assert result[absent] == []


def test_sickle_utf8_record(sickle_dc: dict[str, bytes]) -> None:
    result = transform_record("oai_dc", sickle_dc["oai:test.example.com:1996652"])
    assert result["creator"] == ["某人"]
    assert result["title"] == ["Sample Title"]


def test_sickle_every_record(sickle_dc: dict[str, bytes]) -> None:
    # The chain repeats one record; the deleted ones carry no metadata.
    assert set(sickle_dc) == {"oai:test.example.com:1585322", "oai:test.example.com:1996652"}
    for xml in sickle_dc.values():
        _assert_clean(transform_record("oai_dc", xml))


def test_pyoai_dspace_records(pyoai_dc: dict[str, bytes]) -> None:
    result = transform_record("oai_dc", pyoai_dc["hdl:1765/308"])
    _assert_clean(result)
    assert result["contributor"] == ["Smidts, A."]
    assert result["identifier"] == ["90-5892-036-4", "http://hdl.handle.net/1765/308"]
    assert result["date"] == ["2003-04-15T10:18:51Z"] * 3
    assert result["description"][0].startswith("Met moderne beeldvormende technieken")

    result = transform_record("oai_dc", pyoai_dc["hdl:1765/9"])
    assert result["creator"] == ["Jong, G. de", "Nooteboom, B."]
    assert result["contributor"] == ["Jong, G. de", "Nooteboom, B."]
    assert result["date"][:2] == ["2001-01-04", "2003-03-11T14:00:50Z"]
    assert result["identifier"] == [
        "http://hdl.handle.net/1765/9",
        "RePEc:dgr:eureri:2001134",
        "erimrs20020104123434",
    ]
    assert result["title"] == ["The Causality of Supply Relationships"]
    assert result["language"] == ["en", "en_US"]
    assert result["subject"][:2] == ["Automobile industries", "Learning theory"]
    assert result["format"] == [
        "application/pdf https://ep.eur.nl/retrieve/6/erimrs20020104123434.pdf"
    ]


def test_pyoai_every_record(pyoai_dc: dict[str, bytes]) -> None:
    assert len(pyoai_dc) >= 90  # 16 + 81 records, a few deleted
    for xml in pyoai_dc.values():
        _assert_clean(transform_record("oai_dc", xml))


def test_zenodo_record(zenodo: dict[str, dict[str, bytes]]) -> None:
    result = transform_record("oai_dc", zenodo["oai_dc"]["oai:zenodo.org:10357859"])
    _assert_clean(result)
    assert result["title"] == ["Research Data Management Organiser (RDMO)"]
    assert len(result["creator"]) == 9
    assert result["creator"][0] == "Klar, Jochen"
    assert "Schröder, Max" in result["creator"]
    assert result["date"] == ["2023-12-11"]
    assert result["identifier"] == [
        "https://doi.org/10.5281/zenodo.10357859",
        "oai:zenodo.org:10357859",
    ]
    assert result["publisher"] == ["Zenodo"]
    assert result["relation"] == [
        "https://github.com/rdmorganiser/rdmo/tree/2.1.0",
        "https://zenodo.org/communities/rdmo/",
        "https://doi.org/10.5281/zenodo.596581",
    ]
    assert result["rights"] == [
        "info:eu-repo/semantics/openAccess",
        "Apache License 2.0",
        "http://www.apache.org/licenses/LICENSE-2.0",
    ]
    assert result["type"] == ["info:eu-repo/semantics/other"]
    assert result["description"][1] == (
        "If you refer to this software in a publication, please cite it as below."
    )
    # Zenodo escapes its HTML twice; the transformer keeps the text as the XML says.
    assert result["description"][0].startswith(
        '&lt;h2&gt;&lt;a href="https://github.com/rdmorganiser'
    )


def test_zenodo_every_record(zenodo: dict[str, dict[str, bytes]]) -> None:
    assert len(zenodo["oai_dc"]) > 100
    for xml in zenodo["oai_dc"].values():
        result = transform_record("oai_dc", xml)
        _assert_clean(result)
        assert result["identifier"], "every Zenodo record has identifiers"


def test_blank_values_dropped_and_unknown_children_ignored() -> None:
    xml = b"""<oai_dc:dc xmlns:oai_dc="http://www.openarchives.org/OAI/2.0/oai_dc/"
        xmlns:dc="http://purl.org/dc/elements/1.1/" xmlns:x="urn:x">
      <dc:title>  </dc:title><dc:title/><dc:title> Kept </dc:title>
      <!-- a comment --><x:title>other namespace</x:title><dc:unknown>no</dc:unknown>
      <dc:subject>Mixed <x:b>content</x:b> joined</dc:subject>
    </oai_dc:dc>"""
    result = transform_record("oai_dc", xml)
    assert result["title"] == ["Kept"]
    assert result["subject"] == ["Mixed content joined"]
    assert sum(map(len, result.values())) == 2


def test_empty_dc_record_is_valid() -> None:
    result = transform_record(
        "oai_dc", b'<dc xmlns="http://www.openarchives.org/OAI/2.0/oai_dc/"/>'
    )
    assert result == {key: [] for key in DC_KEYS}


def test_other_format_is_rejected() -> None:
    with pytest.raises(TransformError) as info:
        transform_record("oai_dc", b'<resource xmlns="http://datacite.org/schema/kernel-4"/>')
    assert info.value.type == "unexpected_format"
    assert info.value.location == "/resource"
