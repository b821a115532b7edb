"""Crosswalks come back typed: an XSLT result whose root is a known format is read by
that format's transformer; any other root is stored as element paths."""

from __future__ import annotations

from pathlib import Path

import pytest

from oaipmh_dagster.operations.profile import profile_records
from oaipmh_dagster.transform import TransformError, transform_record

from .conftest import Records

XSL_HEAD = '<xsl:stylesheet version="1.0" xmlns:xsl="http://www.w3.org/1999/XSL/Transform">\n'
OAI_DC = ('xmlns:oai_dc="http://www.openarchives.org/OAI/2.0/oai_dc/" '
          'xmlns:dc="http://purl.org/dc/elements/1.1/"')
# An identity crosswalk: every record comes back as it is.
IDENTITY = ('<xsl:template match="@*|node()"><xsl:copy><xsl:apply-templates select="@*|node()"/>'
            "</xsl:copy></xsl:template>")


def _sheet(tmp_path: Path, body: str) -> str:
    path = tmp_path / "s.xsl"
    path.write_text(f"{XSL_HEAD}{body}\n</xsl:stylesheet>\n", encoding="utf-8")
    return f"xslt:{path}"


def test_a_crosswalk_to_oai_dc_is_stored_as_harvested_oai_dc(
        tmp_path: Path, sickle_dc: Records, pyoai_dc: Records) -> None:
    spec = _sheet(tmp_path, IDENTITY)
    records = {**sickle_dc, **pyoai_dc}
    assert len(records) > 50
    for identifier, raw in records.items():
        assert transform_record(spec, raw) == transform_record("oai_dc", raw), identifier


@pytest.mark.parametrize(("root", "name", "key"), [
    (f'<oai_dc:dc {OAI_DC}><dc:title>T</dc:title></oai_dc:dc>', "oai_dc", "title"),
    ('<mods xmlns="http://www.loc.gov/mods/v3"><titleInfo><title>T</title></titleInfo></mods>',
     "mods", "titles"),
    ('<q:qualifieddc xmlns:q="http://dspace.org/qualifieddc/" '
     'xmlns:dcterms="http://purl.org/dc/terms/"><dcterms:title>T</dcterms:title>'
     "</q:qualifieddc>", "qdc", "is_part_of"),
    ('<oaire:resource xmlns:oaire="http://namespace.openaire.eu/schema/oaire/" '
     'xmlns:datacite="http://datacite.org/schema/kernel-4"><datacite:titles><datacite:title>'
     "T</datacite:title></datacite:titles></oaire:resource>", "oai_openaire", "funding_references"),
    ('<resource xmlns="http://datacite.org/schema/kernel-4"><titles><title>T</title></titles>'
     "</resource>", "datacite", "publication_year"),
    ('<record xmlns="http://www.loc.gov/MARC21/slim"><datafield tag="245" ind1="0" ind2="0">'
     '<subfield code="a">T</subfield></datafield></record>', "marc21", "data_fields"),
])
def test_a_known_root_is_read_by_its_format(tmp_path: Path, root: str, name: str,
                                            key: str) -> None:
    spec = _sheet(tmp_path, f'<xsl:template match="/">{root}</xsl:template>')
    out = transform_record(spec, b"<any/>")
    assert out == transform_record(name, root)
    assert key in out


def test_an_unknown_root_is_element_paths_and_its_coverage_names_them(tmp_path: Path) -> None:
    spec = _sheet(tmp_path, '<xsl:template match="/"><rec xmlns="urn:x" kind="k"><t>'
                  '<xsl:value-of select="/*/@n"/></t><empty/></rec></xsl:template>')
    outs = [transform_record(spec, f'<r n="{n}"/>'.encode()) for n in ("1", "", "3")]
    assert outs[0] == {"rec/@kind": ["k"], "rec/t": ["1"], "rec/empty": []}
    assert profile_records(outs).coverage() == {"rec/@kind": 1.0, "rec/t": 0.6667,
                                                "rec/empty": 0.0}


def test_a_typed_result_that_its_format_refuses_fails_that_record(tmp_path: Path) -> None:
    # An oai_dc root with no Dublin Core inside is fine (all fields empty) ...
    spec = _sheet(tmp_path, f'<xsl:template match="/"><oai_dc:dc {OAI_DC}/></xsl:template>')
    assert transform_record(spec, b"<a/>")["title"] == []
    # ... a MARC record without a tag attribute is not.
    spec = _sheet(tmp_path, '<xsl:template match="/"><record xmlns="http://www.loc.gov/MARC21/'
                  'slim"><datafield/></record></xsl:template>')
    with pytest.raises(TransformError) as info:
        transform_record(spec, b"<a/>")
    assert info.value.type == "invalid_record"
    assert info.value.location is not None and info.value.location.startswith(spec)
