"""The ``datacite`` transformer against Zenodo records (kernel-4), wrapped and kernel-3."""

from __future__ import annotations

import json

import pytest
from lxml import etree

from oaipmh_dagster.transform import TransformError, transform_record

KERNEL4 = "http://datacite.org/schema/kernel-4"
KERNEL3 = "http://datacite.org/schema/kernel-3"
RDMO = "oai:zenodo.org:10357859"

KEYS = [
    "doi",
    "identifiers",
    "titles",
    "title",
    "creators",
    "contributors",
    "publisher",
    "publication_year",
    "types",
    "subjects",
    "dates",
    "language",
    "related_identifiers",
    "rights",
    "descriptions",
    "version",
    "formats",
    "sizes",
    "funding_references",
    "schema",
]


def _oai_datacite(resource_xml: bytes) -> bytes:
    """Wrap a resource the way Zenodo's ``oai_datacite`` format does."""
    wrapper = etree.fromstring(
        b'<oai_datacite xmlns="http://schema.datacite.org/oai/oai-1.1/">'
        b"<schemaVersion>4.3</schemaVersion><datacentreSymbol>CERN.ZENODO</datacentreSymbol>"
        b"<payload/></oai_datacite>"
    )
    wrapper[2].append(etree.fromstring(resource_xml))
    return etree.tostring(wrapper)


def test_zenodo_software_record(zenodo: dict[str, dict[str, bytes]]) -> None:
    result = transform_record("datacite", zenodo["datacite"][RDMO])
    assert list(result) == KEYS
    json.dumps(result)
    assert result["schema"] == KERNEL4
    assert result["doi"] == "10.5281/zenodo.10357859"
    # The DOI comes first although Zenodo writes alternateIdentifiers before it.
    assert result["identifiers"] == [
        {"identifier": "10.5281/zenodo.10357859", "identifier_type": "DOI"},
        {"identifier": RDMO, "identifier_type": "oai"},
    ]
    assert result["title"] == "Research Data Management Organiser (RDMO)"
    assert result["titles"] == [
        {"title": "Research Data Management Organiser (RDMO)", "title_type": None, "lang": None}
    ]
    creators = result["creators"]
    assert len(creators) == 9
    assert creators[0] == {
        "name": "Klar, Jochen",
        "name_type": "Personal",
        "given_name": "Jochen",
        "family_name": "Klar",
        "name_identifiers": [
            {"identifier": "0000-0002-5883-4273", "scheme": "ORCID", "scheme_uri": None}
        ],
        "affiliations": [],
    }
    assert creators[6]["name"] == "Martínez Muñoz, David"
    assert creators[6]["name_identifiers"] == []
    assert result["publisher"] == "Zenodo"
    assert result["publication_year"] == 2023
    assert result["dates"] == [
        {"date": "2023-12-11", "date_type": "Issued", "information": None},
        {"date": "2023-12-11", "date_type": "Updated", "information": None},
    ]
    assert result["types"] == {"resource_type_general": "Software", "resource_type": None}
    assert result["related_identifiers"] == [
        {
            "identifier": "https://github.com/rdmorganiser/rdmo/tree/2.1.0",
            "identifier_type": "URL",
            "relation_type": "IsSupplementTo",
            "resource_type_general": "Software",
        },
        {
            "identifier": "10.5281/zenodo.596581",
            "identifier_type": "DOI",
            "relation_type": "IsVersionOf",
            "resource_type_general": None,
        },
        {
            "identifier": "https://zenodo.org/communities/rdmo/",
            "identifier_type": "URL",
            "relation_type": "IsPartOf",
            "resource_type_general": None,
        },
    ]
    assert result["version"] == "2.1.0"
    assert result["rights"] == [
        {
            "rights": "Apache License 2.0",
            "uri": "http://www.apache.org/licenses/LICENSE-2.0",
            "identifier": "apache-2.0",
            "identifier_scheme": "spdx",
            "lang": None,
        },
        {
            "rights": None,
            "uri": "info:eu-repo/semantics/openAccess",
            "identifier": None,
            "identifier_scheme": None,
            "lang": None,
        },
    ]
    abstract, other = result["descriptions"]
    assert abstract["description_type"] == "Abstract"
    assert abstract["description"].startswith("RDMO 2.1.0 (Dec 11, 2023)")
    assert abstract["description"].endswith("python manage.py upgrade")
    assert other == {
        "description": "If you refer to this software in a publication, please cite it as below.",
        "description_type": "Other",
        "lang": None,
    }
    assert result["language"] is None
    assert result["subjects"] == result["contributors"] == result["funding_references"] == []


def test_zenodo_funding_subjects_language(zenodo: dict[str, dict[str, bytes]]) -> None:
    result = transform_record("datacite", zenodo["datacite"]["oai:zenodo.org:8435639"])
    assert (
        result["title"] == "H2020 Platone Italian Demonstrator Use Case 1-2 Market 1st quarter 2022"
    )
    assert result["language"] == "eng"
    assert [s["subject"] for s in result["subjects"]] == ["Flexibility  services", "DSO"]
    assert result["funding_references"] == [
        {
            "funder_name": "European Commission",
            "funder_identifier": "00k4n6c32",
            "funder_identifier_type": "ROR",
            "award_number": "864300",
            "award_uri": None,
            "award_title": "PLATform for Operation of distribution NEtworks",
        }
    ]
    assert result["creators"][0]["name"] == "Gabriele Fedele"
    assert result["creators"][0]["affiliations"] == [
        {"name": "areti", "identifier": None, "scheme": None}
    ]


def test_zenodo_affiliations_and_contributors(zenodo: dict[str, dict[str, bytes]]) -> None:
    result = transform_record("datacite", zenodo["datacite"]["oai:zenodo.org:8433301"])
    lin = result["creators"][0]
    assert lin["name"] == "Lin, Sam"
    assert lin["affiliations"] == [
        {"name": "University of Wollongong", "identifier": None, "scheme": None}
    ]
    assert lin["name_identifiers"][0]["identifier"] == "0000-0001-6834-2646"

    result = transform_record("datacite", zenodo["datacite"]["oai:zenodo.org:8435907"])
    assert [(c["name"], c["contributor_type"]) for c in result["contributors"]] == [
        ("Hasselbring, Wilhelm", "Supervisor"),
        ("Krause-Glau, Alexander", "Supervisor"),
    ]
    assert result["contributors"][0]["affiliations"][0]["name"] == "Kiel University"
    assert result["creators"][0]["name"] == "Brück, Johannes"

    result = transform_record("datacite", zenodo["datacite"]["oai:zenodo.org:8435696"])
    assert result["types"] == {"resource_type_general": "Text", "resource_type": "Presentation"}


def test_zenodo_every_record(zenodo: dict[str, dict[str, bytes]]) -> None:
    records = zenodo["datacite"]
    assert len(records) >= 50
    for identifier, xml in records.items():
        result = transform_record("datacite", xml)
        assert list(result) == KEYS
        json.dumps(result)
        assert result["doi"] and result["doi"].startswith("10.")  # Zenodo, Dryad ...
        assert {"identifier": identifier, "identifier_type": "oai"} in result["identifiers"]
        assert result["title"] and result["creators"]
        assert isinstance(result["publication_year"], int)
        assert result["types"]["resource_type_general"]


def test_oai_datacite_wrapper_is_unwrapped(zenodo: dict[str, dict[str, bytes]]) -> None:
    plain = zenodo["datacite"][RDMO]
    assert transform_record("datacite", _oai_datacite(plain)) == transform_record("datacite", plain)


def test_kernel3_namespace(zenodo: dict[str, dict[str, bytes]]) -> None:
    kernel4 = zenodo["datacite"][RDMO]
    kernel3 = kernel4.replace(KERNEL4.encode(), KERNEL3.encode())
    expected = transform_record("datacite", kernel4)
    expected["schema"] = KERNEL3
    assert transform_record("datacite", kernel3) == expected


KERNEL3_SAMPLE = f"""<?xml version="1.0" encoding="UTF-8"?>
<resource xmlns="{KERNEL3}" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">
  <identifier identifierType="DOI">10.1234/EXAMPLE</identifier>
  <creators><creator>
    <creatorName>Doe, Jane</creatorName>
    <nameIdentifier nameIdentifierScheme="ORCID" schemeURI="http://orcid.org/">0000-0001-2345-6789</nameIdentifier>
    <affiliation>Example University</affiliation>
  </creator></creators>
  <titles>
    <title xml:lang="de" titleType="TranslatedTitle">Ein Beispiel</title>
    <title xml:lang="en">An example</title>
  </titles>
  <publisher> Example Press </publisher>
  <publicationYear>unknown</publicationYear>
  <subjects><subject subjectScheme="DDC" schemeURI="http://dewey.info/">004</subject></subjects>
  <contributors><contributor contributorType="DataCurator">
    <contributorName>Curator, C.</contributorName>
  </contributor></contributors>
  <language>de</language>
  <resourceType resourceTypeGeneral="Dataset">Survey data</resourceType>
  <formats><format>text/csv</format><format> </format></formats>
  <sizes><size>2 MB</size></sizes>
  <rightsList><rights rightsURI="http://creativecommons.org/licenses/by/4.0/"/></rightsList>
  <descriptions>
    <description descriptionType="Abstract">First line<br/>second line</description>
    <description descriptionType="Methods">   </description>
  </descriptions>
</resource>""".encode()


def test_kernel3_sample() -> None:
    result = transform_record("datacite", KERNEL3_SAMPLE)
    assert result["schema"] == KERNEL3
    assert result["doi"] == "10.1234/EXAMPLE"
    # The untyped title is the main one even when it is not first.
    assert result["title"] == "An example"
    assert result["titles"][0] == {
        "title": "Ein Beispiel",
        "title_type": "TranslatedTitle",
        "lang": "de",
    }
    assert result["creators"][0]["name_identifiers"] == [
        {"identifier": "0000-0001-2345-6789", "scheme": "ORCID", "scheme_uri": "http://orcid.org/"}
    ]
    assert result["creators"][0]["affiliations"][0]["name"] == "Example University"
    assert result["creators"][0]["name_type"] is None
    assert result["publisher"] == "Example Press"
    assert result["publication_year"] is None
    assert result["subjects"][0]["subject"] == "004"
    assert result["subjects"][0]["scheme"] == "DDC"
    assert result["contributors"][0]["contributor_type"] == "DataCurator"
    assert result["language"] == "de"
    assert result["types"] == {"resource_type_general": "Dataset", "resource_type": "Survey data"}
    assert result["formats"] == ["text/csv"]
    assert result["sizes"] == ["2 MB"]
    assert result["rights"][0]["uri"] == "http://creativecommons.org/licenses/by/4.0/"
    assert result["descriptions"] == [
        {"description": "First line\nsecond line", "description_type": "Abstract", "lang": None}
    ]


def test_unnamespaced_resource() -> None:
    xml = b"<resource><identifier identifierType='doi'>10.1/x</identifier></resource>"
    result = transform_record("datacite", xml)
    assert result["doi"] == "10.1/x"
    assert result["schema"] is None


def test_not_datacite_is_rejected() -> None:
    with pytest.raises(TransformError) as info:
        transform_record(
            "datacite", b'<oai_dc:dc xmlns:oai_dc="http://www.openarchives.org/OAI/2.0/oai_dc/"/>'
        )
    assert info.value.type == "unexpected_format"
    assert info.value.location == "/oai_dc:dc"
