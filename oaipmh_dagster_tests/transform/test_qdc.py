"""The ``qdc`` transformer: qualified Dublin Core as CONTENTdm serves it (real) and as
the DCMI terms describe it (refinements fold into their element, and keep a key)."""

from __future__ import annotations

import pytest
from lxml import etree

from oaipmh_dagster import formats
from oaipmh_dagster.transform import TransformError, oai_dc, transform_record
from oaipmh_dagster.transform import qdc as qdc_mod

from .conftest import OAI_FIXTURES

REALWORLD = OAI_FIXTURES.parent / "oai-realworld" / "files"
OAI = "{http://www.openarchives.org/OAI/2.0/}"

# A DSpace-style record after the DCMI terms (https://www.dublincore.org/specifications/
# dublin-core/dcmi-terms/), typed by xsi:type as the DC-in-XML guidelines do.
THESIS = b"""<qdc:qualifieddc xmlns:qdc="http://dspace.org/qualifieddc/"
    xmlns:dc="http://purl.org/dc/elements/1.1/" xmlns:dcterms="http://purl.org/dc/terms/"
    xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">
  <dc:title>Soil microbes of alpine meadows</dc:title>
  <dcterms:alternative>Bodenmikroben alpiner Wiesen</dcterms:alternative>
  <dc:creator>Keller, Anna</dc:creator>
  <dc:contributor>Huber, Max (advisor)</dc:contributor>
  <dc:subject>soil ecology</dc:subject>
  <dcterms:abstract>We sampled 40 meadows.</dcterms:abstract>
  <dc:publisher>University of Innsbruck</dc:publisher>
  <dcterms:issued xsi:type="dcterms:W3CDTF">2019-11-30</dcterms:issued>
  <dcterms:dateAccepted>2019-10-02</dcterms:dateAccepted>
  <dc:type>Thesis</dc:type>
  <dcterms:extent>142 p.</dcterms:extent>
  <dc:identifier xsi:type="dcterms:URI">https://hdl.handle.net/10.1234/567</dc:identifier>
  <dc:identifier>10.5281/zenodo.123456</dc:identifier>
  <dcterms:bibliographicCitation>Keller A. (2019) Soil microbes. Innsbruck.</dcterms:bibliographicCitation>
  <dc:language xsi:type="dcterms:ISO639-3">eng</dc:language>
  <dcterms:isPartOf>Theses of the Faculty of Biology</dcterms:isPartOf>
  <dcterms:spatial>Tyrol</dcterms:spatial>
  <dcterms:accessRights>open access</dcterms:accessRights>
  <dcterms:license>https://creativecommons.org/licenses/by/4.0/</dcterms:license>
  <dcterms:rightsHolder>Anna Keller</dcterms:rightsHolder>
  <dcterms:audience>researchers</dcterms:audience>
  <dc:foo>not a DC element</dc:foo>
</qdc:qualifieddc>"""


def test_refinements_fold_into_their_element_and_keep_their_key() -> None:
    out = transform_record("qdc", THESIS)
    assert list(out) == list(qdc_mod.KEYS)
    assert out["title"] == ["Soil microbes of alpine meadows", "Bodenmikroben alpiner Wiesen"]
    assert out["alternative"] == ["Bodenmikroben alpiner Wiesen"]
    assert out["description"] == ["We sampled 40 meadows."] == out["abstract"]
    assert out["date"] == ["2019-11-30", "2019-10-02"]
    assert out["issued"] == ["2019-11-30"] and out["date_accepted"] == ["2019-10-02"]
    assert out["format"] == ["142 p."] == out["extent"]
    assert out["relation"] == ["Theses of the Faculty of Biology"] == out["is_part_of"]
    assert out["coverage"] == ["Tyrol"] == out["spatial"]
    assert out["rights"] == ["open access", "https://creativecommons.org/licenses/by/4.0/"]
    assert out["access_rights"] == ["open access"]
    assert out["license"] == ["https://creativecommons.org/licenses/by/4.0/"]
    assert out["rights_holder"] == ["Anna Keller"] and out["audience"] == ["researchers"]
    assert out["bibliographic_citation"] == ["Keller A. (2019) Soil microbes. Innsbruck."]
    assert out["identifiers"] == [
        {"type": "uri", "value": "https://hdl.handle.net/10.1234/567"},  # its xsi:type
        {"type": "doi", "value": "10.5281/zenodo.123456"},  # what its text shows
    ]
    assert out["language"] == ["eng"] and out["creator"] == ["Keller, Anna"]


def test_the_fifteen_elements_read_like_oai_dc() -> None:
    dc = (b'<oai_dc:dc xmlns:oai_dc="http://www.openarchives.org/OAI/2.0/oai_dc/" '
          b'xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:title>T</dc:title>'
          b"<dc:date>2020</dc:date></oai_dc:dc>")
    out = transform_record("qdc", dc)
    assert {k: out[k] for k in oai_dc.DC_ELEMENTS} == transform_record("oai_dc", dc)


def test_no_dublin_core_is_an_unexpected_format() -> None:
    with pytest.raises(TransformError) as info:
        transform_record("qdc", b"<record><title>x</title></record>")
    assert info.value.type == "unexpected_format"


def test_prefixes_and_roots() -> None:
    assert formats.default_transformer("oai_qdc") == "qdc"
    assert formats.default_transformer("qdc") == "qdc"
    assert formats.format_of_root("{http://dspace.org/qualifieddc/}qualifieddc").name == "qdc"


def test_real_contentdm_record() -> None:
    if not REALWORLD.is_dir():
        pytest.skip(f"real-world OAI-PMH responses not found at {REALWORLD}")
    page = etree.parse(str(REALWORLD / "contentdm-lr-qdc.xml")).getroot()
    (metadata,) = page.iter(f"{OAI}metadata")
    out = qdc_mod.transform(metadata[0])
    assert out["title"] == ["Letter, Cornelia A. Kelley to Andrew Viterbi, February 25, 2000"]
    assert out["created"] == ["2000/2000", "2000"] == out["date"]
    assert out["is_part_of"] == ["Boston Latin School", "vit-m1",
                                 "Andrew J. and Erna Viterbi Family Archives",
                                 "Academic Affiliations"]
    assert out["relation"] == out["is_part_of"]
    assert out["rights_holder"] == ["USC Libraries Special Collections"]
    assert out["access_rights"][0].startswith("There are materials within the archives")
    assert "Dr. Viterbi's classes" in out["access_rights"][0]  # &#x27; decoded
    assert len(out["rights"]) == 3  # two dc:rights and the accessRights
    assert [i["type"] for i in out["identifiers"]] == [None, None, "url"]
    assert out["source"] == ["University of Southern California", "Box 1, Folder 2"]
