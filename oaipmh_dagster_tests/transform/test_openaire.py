"""The ``oai_openaire`` transformer on a record written after the OpenAIRE Guidelines
for Literature Repositories v4 (https://openaire-guidelines-for-literature-repository-
managers.readthedocs.io/en/v4.0.0/): the fields an aggregator reads."""

from __future__ import annotations

import pytest

from oaipmh_dagster import formats
from oaipmh_dagster.transform import TransformError, transform_record

ARTICLE = b"""<?xml version="1.0" encoding="UTF-8"?>
<oaire:resource xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#"
    xmlns:dc="http://purl.org/dc/elements/1.1/" xmlns:dcterms="http://purl.org/dc/terms/"
    xmlns:datacite="http://datacite.org/schema/kernel-4"
    xmlns:oaire="http://namespace.openaire.eu/schema/oaire/"
    xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
    xsi:schemaLocation="http://namespace.openaire.eu/schema/oaire/ https://www.openaire.eu/schema/repo-lit/4.0/openaire.xsd">
  <datacite:titles>
    <datacite:title xml:lang="en-US">National Institute for Environmental Studies and Center
      for Climate System Research Japan</datacite:title>
    <datacite:title xml:lang="ja" titleType="TranslatedTitle">\xe5\x9b\xbd\xe7\xab\x8b\xe7\x92\xb0\xe5\xa2\x83\xe7\xa0\x94\xe7\xa9\xb6\xe6\x89\x80</datacite:title>
  </datacite:titles>
  <datacite:creators>
    <datacite:creator>
      <datacite:creatorName nameType="Personal">Evans, R.J.</datacite:creatorName>
      <datacite:givenName>Robert</datacite:givenName>
      <datacite:familyName>Evans</datacite:familyName>
      <datacite:affiliation>Institute of Science and Technology</datacite:affiliation>
      <datacite:nameIdentifier nameIdentifierScheme="ORCID"
          schemeURI="http://orcid.org">1234-1234-1234-1234</datacite:nameIdentifier>
    </datacite:creator>
    <datacite:creator>
      <datacite:creatorName nameType="Organizational">Example Consortium</datacite:creatorName>
    </datacite:creator>
  </datacite:creators>
  <datacite:contributors>
    <datacite:contributor contributorType="DataManager">
      <datacite:contributorName>Starr, Joan</datacite:contributorName>
    </datacite:contributor>
  </datacite:contributors>
  <oaire:fundingReferences>
    <oaire:fundingReference>
      <oaire:funderName>European Commission</oaire:funderName>
      <oaire:funderIdentifier funderIdentifierType="Crossref Funder ID">http://doi.org/10.13039/501100000780</oaire:funderIdentifier>
      <oaire:fundingStream>Horizon 2020 Framework Programme</oaire:fundingStream>
      <oaire:awardNumber awardURI="http://cordis.europa.eu/project/rcn/194062_en.html">643410</oaire:awardNumber>
      <oaire:awardTitle>Open Access Infrastructure for Research in Europe 2020</oaire:awardTitle>
    </oaire:fundingReference>
  </oaire:fundingReferences>
  <datacite:alternateIdentifiers>
    <datacite:alternateIdentifier alternateIdentifierType="URL">http://repository.example.org/1234</datacite:alternateIdentifier>
    <datacite:alternateIdentifier alternateIdentifierType="DOI">10.1234/abc</datacite:alternateIdentifier>
  </datacite:alternateIdentifiers>
  <datacite:relatedIdentifiers>
    <datacite:relatedIdentifier relatedIdentifierType="ISSN" relationType="IsPartOf">0001-4842</datacite:relatedIdentifier>
    <datacite:relatedIdentifier relatedIdentifierType="DOI" relationType="IsSupplementedBy">10.5281/zenodo.1000</datacite:relatedIdentifier>
  </datacite:relatedIdentifiers>
  <datacite:dates>
    <datacite:date dateType="Accepted">2011-12-01</datacite:date>
    <datacite:date dateType="Issued">2012-01-15</datacite:date>
    <datacite:date dateType="Available">2013-01-15</datacite:date>
  </datacite:dates>
  <dc:language>eng</dc:language>
  <dc:publisher>Loughborough University</dc:publisher>
  <oaire:resourceType resourceTypeGeneral="literature"
      uri="http://purl.org/coar/resource_type/c_6501">journal article</oaire:resourceType>
  <dc:description>Foreword [by] Hazel Anderson; Introduction.</dc:description>
  <dc:format>application/pdf</dc:format>
  <datacite:identifier identifierType="Handle">http://hdl.handle.net/1234/5628</datacite:identifier>
  <datacite:rights rightsURI="http://purl.org/coar/access_right/c_abf2">open access</datacite:rights>
  <datacite:subjects>
    <datacite:subject subjectScheme="DDC" schemeURI="http://dewey.info/"
        valueURI="http://dewey.info/class/551">551 Geology, hydrology, meteorology</datacite:subject>
    <datacite:subject>climate</datacite:subject>
  </datacite:subjects>
  <datacite:sizes><datacite:size>15 pages</datacite:size></datacite:sizes>
  <oaire:licenseCondition startDate="2019-02-01"
      uri="http://creativecommons.org/licenses/by-nc/4.0/">Creative Commons Attribution-NonCommercial</oaire:licenseCondition>
  <dcterms:audience>Researchers</dcterms:audience>
  <dc:coverage>2000-2010</dc:coverage>
  <oaire:version uri="http://purl.org/coar/version/c_970fb48d4fbd8a85">VoR</oaire:version>
  <oaire:file accessRightsURI="http://purl.org/coar/access_right/c_abf2"
      mimeType="application/pdf" objectType="fulltext">http://link-to-the-fulltext.org</oaire:file>
  <oaire:citationTitle>Journal of Testing</oaire:citationTitle>
  <oaire:citationVolume>10</oaire:citationVolume>
  <oaire:citationIssue>1</oaire:citationIssue>
  <oaire:citationStartPage>100</oaire:citationStartPage>
  <oaire:citationEndPage>105</oaire:citationEndPage>
</oaire:resource>"""


def test_an_article_after_the_guidelines() -> None:
    out = transform_record("oai_openaire", ARTICLE)
    assert out["title"].startswith("National Institute for Environmental Studies")
    assert out["titles"][1]["type"] == "TranslatedTitle" and out["titles"][1]["lang"] == "ja"
    evans, consortium = out["creators"]
    assert evans == {"name": "Evans, R.J.", "name_type": "Personal", "given_name": "Robert",
                     "family_name": "Evans",
                     "identifiers": [{"scheme": "ORCID", "value": "1234-1234-1234-1234"}],
                     "affiliations": ["Institute of Science and Technology"]}
    assert consortium["name_type"] == "Organizational"
    assert out["creator_names"] == ["Evans, R.J.", "Example Consortium"]
    assert out["contributors"][0]["type"] == "DataManager"
    assert out["funding_references"] == [{
        "funder_name": "European Commission",
        "funder_identifier": "http://doi.org/10.13039/501100000780",
        "funder_identifier_type": "Crossref Funder ID",
        "funding_stream": "Horizon 2020 Framework Programme", "award_number": "643410",
        "award_uri": "http://cordis.europa.eu/project/rcn/194062_en.html",
        "award_title": "Open Access Infrastructure for Research in Europe 2020"}]
    assert out["identifier"] == "http://hdl.handle.net/1234/5628"
    assert out["identifier_type"] == "Handle"
    assert out["doi"] == "10.1234/abc"  # from the alternate identifiers
    assert out["related_identifiers"][0] == {"type": "ISSN", "relation": "IsPartOf",
                                             "value": "0001-4842"}
    assert out["date_issued"] == "2012-01-15" and len(out["dates"]) == 3
    assert out["languages"] == ["eng"] and out["publishers"] == ["Loughborough University"]
    assert out["resource_type"] == "journal article"
    assert out["resource_type_general"] == "literature"
    assert out["resource_type_uri"] == "http://purl.org/coar/resource_type/c_6501"
    assert out["access_rights"] == "open access"
    assert out["access_rights_uri"] == "http://purl.org/coar/access_right/c_abf2"
    assert out["license_conditions"] == [{
        "value": "Creative Commons Attribution-NonCommercial",
        "uri": "http://creativecommons.org/licenses/by-nc/4.0/", "start_date": "2019-02-01"}]
    assert out["subjects"][0]["scheme"] == "DDC" and out["subjects"][1]["value"] == "climate"
    assert out["version"] == "VoR" and out["sizes"] == ["15 pages"]
    assert out["files"] == [{"url": "http://link-to-the-fulltext.org",
                             "mime_type": "application/pdf", "object_type": "fulltext",
                             "access_rights_uri": "http://purl.org/coar/access_right/c_abf2"}]
    assert out["citation"] == {"title": "Journal of Testing", "volume": "10", "issue": "1",
                               "start_page": "100", "end_page": "105", "edition": None,
                               "conference_place": None, "conference_date": None}
    assert out["descriptions"] == ["Foreword [by] Hazel Anderson; Introduction."]
    assert out["formats"] == ["application/pdf"] and out["audiences"] == ["Researchers"]
    assert out["coverages"] == ["2000-2010"]


def test_keys_are_the_same_for_every_record() -> None:
    empty = transform_record(
        "oai_openaire", b'<oaire:resource xmlns:oaire="http://namespace.openaire.eu/schema/oaire/"/>')
    assert list(empty) == list(transform_record("oai_openaire", ARTICLE))
    assert empty["title"] is None and empty["citation"] is None and empty["doi"] is None


def test_other_roots_fail_and_the_prefix_defaults_to_it() -> None:
    with pytest.raises(TransformError) as info:
        transform_record("oai_openaire", b"<record/>")
    assert info.value.type == "unexpected_format"
    assert formats.default_transformer("oai_openaire") == "oai_openaire"
    root = "{http://namespace.openaire.eu/schema/oaire/}resource"
    assert formats.format_of_root(root).name == "oai_openaire"
    # A DataCite resource (kernel-4) is no OpenAIRE record.
    assert formats.format_of_root("{http://datacite.org/schema/kernel-4}resource").name == (
        "datacite")
