"""Records of the three shipped formats, valid and invalid, as a loopback OAI-PMH server
serves them: what the validation tests harvest."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from oaipmh_dagster.demo.dataset import Dataset, ServedRecord

DC = ('<oai_dc:dc xmlns:oai_dc="http://www.openarchives.org/OAI/2.0/oai_dc/" '
      'xmlns:dc="http://purl.org/dc/elements/1.1/">{}</oai_dc:dc>')
DATACITE = ('<oai_datacite xmlns="http://schema.datacite.org/oai/oai-1.1/"><payload>'
            '<resource xmlns="http://datacite.org/schema/kernel-4">{}</resource>'
            '</payload></oai_datacite>')
MARC = '<record xmlns="http://www.loc.gov/MARC21/slim">{}</record>'
_DATACITE_REQUIRED = (
    '<identifier identifierType="DOI">10.1234/{n}</identifier>'
    '<creators><creator><creatorName>Doe, Jane</creatorName></creator></creators>'
    '<titles><title>Title {n}</title></titles><publisher>Publisher</publisher>'
    '<publicationYear>2024</publicationYear>')
_MARC_LEADER = "<leader>00000nam a2200000 a 4500</leader>"

# format -> (metadataPrefix, schema URL, namespace, {identifier: (metadata, valid)})
FORMATS: dict[str, tuple[str, str, str, dict[str, tuple[str, bool]]]] = {
    "oai_dc": ("oai_dc", "http://www.openarchives.org/OAI/2.0/oai_dc.xsd",
               "http://www.openarchives.org/OAI/2.0/oai_dc/", {
        "oai:t:dc-1": (DC.format('<dc:title xml:lang="en">One</dc:title>'
                                 '<dc:creator>Doe</dc:creator><dc:title>Again</dc:title>'), True),
        "oai:t:dc-2": (DC.format(""), True),
        "oai:t:dc-3": (DC.format("<dc:titel>Typo</dc:titel>"), False),
        "oai:t:dc-4": (DC.format('<dc:title lang="en">Bad attribute</dc:title>'), False),
    }),
    "datacite": ("oai_datacite", "http://schema.datacite.org/oai/oai-1.1/oai.xsd",
                 "http://schema.datacite.org/oai/oai-1.1/", {
        "oai:t:dc4-1": (DATACITE.format(
            _DATACITE_REQUIRED.format(n=1)
            + '<resourceType resourceTypeGeneral="Dataset">Data</resourceType>'), True),
        "oai:t:dc4-2": (DATACITE.format(
            '<resourceType resourceTypeGeneral="Poster"/>' + _DATACITE_REQUIRED.format(n=2)
            + '<dates><date dateType="Coverage">2020</date></dates>'), True),
        "oai:t:dc4-3": (DATACITE.format(_DATACITE_REQUIRED.format(n=3)), False),  # no type
        "oai:t:dc4-4": (DATACITE.format(
            _DATACITE_REQUIRED.format(n=4)
            + '<resourceType resourceTypeGeneral="Spreadsheet">x</resourceType>'), False),
    }),
    "marc21": ("marc21", "http://www.loc.gov/standards/marcxml/schema/MARC21slim.xsd",
               "http://www.loc.gov/MARC21/slim", {
        "oai:t:marc-1": (MARC.format(
            _MARC_LEADER + '<controlfield tag="001">42</controlfield>'
            '<datafield tag="245" ind1="1" ind2="0"><subfield code="a">T</subfield>'
            '</datafield>'), True),
        "oai:t:marc-2": (MARC.format(
            _MARC_LEADER + '<datafield tag="245" ind1="1" ind2="0"></datafield>'), False),
        "oai:t:marc-3": (MARC.format(
            '<controlfield tag="001">1</controlfield>' + _MARC_LEADER), False),
        "oai:t:marc-4": (MARC.format("<leader>short</leader>"), False),
    }),
}
T0 = datetime(2024, 1, 1, tzinfo=UTC)


def dataset(fmt: str) -> Dataset:
    """A repository serving the records of `fmt`."""
    prefix, schema_url, namespace, records = FORMATS[fmt]
    return Dataset(formats=[(prefix, schema_url, namespace)], records=[
        ServedRecord(identifier, T0 + timedelta(minutes=i), metadata={prefix: xml})
        for i, (identifier, (xml, _)) in enumerate(records.items())])


def invalid(fmt: str) -> set[str]:
    """The identifiers of `fmt`'s invalid records."""
    return {i for i, (_, valid) in FORMATS[fmt][3].items() if not valid}
