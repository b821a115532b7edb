"""The metadata-format table: every row is consistent, and a row added to it shows up
in the defaults, the transformers, the shipped schemas, the unwrapping and the help."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from lxml import etree

from oaipmh_dagster import formats, transform
from oaipmh_dagster.formats import FORMATS, MetadataFormat
from oaipmh_dagster.storage import registry
from oaipmh_dagster.transform import validation

FAKE_NS = "urn:example:fake"
FAKE_XSD = f"""<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema"
    targetNamespace="{FAKE_NS}" elementFormDefault="qualified">
  <xs:element name="rec"><xs:complexType><xs:sequence>
    <xs:element name="title" type="xs:string"/>
  </xs:sequence></xs:complexType></xs:element>
</xs:schema>"""
WRAPPED = (f'<fakewrap><head/><body><rec xmlns="{FAKE_NS}"><title>T</title></rec></body>'
           "</fakewrap>")


def fake_transform(element: Any) -> dict[str, Any]:
    """The fake format's transformer: the title of the unwrapped record."""
    return {"title": formats.unwrap(element).findtext(f"{{{FAKE_NS}}}title")}


def _fake_row(schema: Path) -> MetadataFormat:
    return MetadataFormat("fake", ("fake", "oai_fake", "fake0"),
                          f"{__name__}:fake_transform", str(schema),
                          unwrap=("fakewrap", "body"), aliases=("fakexml",),
                          schema_skips=("fake0",))


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> MetadataFormat:
    """The table with one more row (its schema a file of the test's own)."""
    (tmp_path / "fake.xsd").write_text(FAKE_XSD)
    row = _fake_row(tmp_path / "fake.xsd")
    monkeypatch.setattr(formats, "FORMATS", (*FORMATS, row))
    return row


# -- the shipped rows -----------------------------------------------------------------


def test_rows_are_consistent() -> None:
    names = [n for f in FORMATS for n in f.names]
    prefixes = [p for f in FORMATS for p in f.prefixes]
    roots = [r for f in FORMATS for r in f.roots]
    assert len(names) == len(set(names)) and len(prefixes) == len(set(prefixes))
    assert len(roots) == len(set(roots)) and all(r.startswith("{") for r in roots)
    assert all(f.roots for f in FORMATS if f.prefixes)  # a crosswalk can yield each one
    for row in FORMATS:
        assert set(row.schema_skips) <= set(row.prefixes), row.name
        assert all(p == p.lower() for p in row.prefixes), row.name
        module, _, attr = row.transformer.partition(":")
        fn = getattr(importlib.import_module(module), attr)
        assert all(transform.get_transformer(n) is fn for n in row.names)
        if row.schema is not None:
            validation.check_schema(row.name)
    assert formats.FALLBACK in transform.available_transformers()
    assert formats.format_named(formats.FALLBACK) is not None


def test_derived_maps_of_the_shipped_rows() -> None:
    assert validation.SHIPPED == {"oai_dc": "oai_dc.xsd", "datacite": "datacite-kernel-4.xsd",
                                  "marc21": "marc21-slim.xsd"}
    assert formats.schema_for_prefix("datacite3") is None
    assert formats.schema_for_prefix("marc") is None
    assert formats.default_transformer("datacite3") == "datacite"
    assert formats.default_transformer(" MARC ") == "marc21"
    assert formats.reads("marcxml") == "marc21" and formats.reads("xml") is None


def test_help_texts_name_the_shipped_rows() -> None:
    from oaipmh_dagster.cli import commands as cli
    from oaipmh_dagster.defs import manage

    assert formats.schema_prefixes_help() == (
        "oai_dc; datacite, oai_datacite, datacite4; marc21, marcxml")
    assert formats.shipped_schemas_help() == "oai_dc, datacite, marc21"
    assert formats.shipped_schemas_help("or") == "oai_dc, datacite or marc21"
    assert f"({formats.schema_prefixes_help()})" in cli._VALIDATE_HELP
    description = manage.AddHarvester.model_fields["validate_schema"].description
    assert description is not None and "oai_dc, datacite or marc21 for" in description


def test_one_unwrapping_rule_for_transformer_and_validator() -> None:
    resource = b'<resource xmlns="http://datacite.org/schema/kernel-4"/>'
    wrapped = (b'<oai_datacite xmlns="http://schema.datacite.org/oai/oai-1.1/"><payload/>'
               b"<payload>" + resource + b"</payload></oai_datacite>")
    root = etree.fromstring(wrapped)
    inner = formats.unwrap(root)
    assert etree.QName(inner).localname == "resource"
    from oaipmh_dagster.transform.datacite import find_resource

    assert find_resource(root) is inner
    plain = etree.fromstring(b"<dc><payload><x/></payload></dc>")
    assert formats.unwrap(plain) is plain


# -- a row added to the table -------------------------------------------------------------


def test_a_new_row_drives_defaults_and_transformers(fake: MetadataFormat) -> None:
    assert registry.default_transformer("OAI_FAKE") == "fake"
    assert registry.default_transformer("fake0") == "fake"
    assert registry.transformer_fits("fakexml", "oai_fake") is True
    assert registry.transformer_fits("fake", "oai_dc") is False
    assert registry.Harvester(id="f", base_url="https://example.org/oai",
                              metadata_prefix="oai_fake").transformer == "fake"
    assert {"fake", "fakexml"} <= set(transform.available_transformers())
    assert transform.get_transformer("fakexml") is fake_transform
    assert transform.transform_record("fake", WRAPPED) == {"title": "T"}
    with pytest.raises(ValueError, match="already registered"):
        transform.register_transformer("fake", fake_transform)


def test_a_new_row_drives_schemas_and_unwrapping(fake: MetadataFormat) -> None:
    assert formats.schema_for_prefix("oai_fake") == "fake"
    assert formats.schema_for_prefix("fake0") is None
    assert registry.validate_schema("fake") == "fake"
    with pytest.raises(registry.InvalidHarvester, match="marc21, fake, the absolute"):
        registry.validate_schema("nope")
    assert validation.schema_path("fake") == Path(fake.schema or "")
    validator = validation.Validator("fake")
    assert validator(WRAPPED) == []
    (error,) = validator(WRAPPED.replace("<title>T</title>", ""))
    assert error["type"] == "schema"
    assert "fake" in formats.shipped_schemas_help()
    assert formats.schema_prefixes_help().endswith("; marc21, marcxml; fake, oai_fake")


def test_a_new_row_shows_in_the_help(tmp_path: Path) -> None:
    """The CLI's --validate help and manage_harvesters' description are built when their
    modules load: load them in a fresh interpreter whose table has the row."""
    (tmp_path / "fake.xsd").write_text(FAKE_XSD)
    code = textwrap.dedent(f"""
        import json
        from pathlib import Path
        from click.testing import CliRunner
        from oaipmh_dagster import formats
        from oaipmh_dagster_tests.test_formats import _fake_row
        formats.FORMATS = (*formats.FORMATS, _fake_row(Path({str(tmp_path / 'fake.xsd')!r})))
        from oaipmh_dagster.cli import commands as cli
        from oaipmh_dagster.defs import manage
        out = CliRunner().invoke(cli.cli, ["harvester", "add", "--help"],
                                 terminal_width=1000).output
        desc = manage.AddHarvester.model_fields["validate_schema"].description
        print(json.dumps({{"cli": " ".join(out.split()), "manage": desc}}))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout.splitlines()[-1])
    assert "marc21, marcxml; fake, oai_fake)" in shown["cli"]
    assert "(oai_dc, datacite, marc21, fake), the path" in shown["cli"]
    assert "oai_dc, datacite, marc21 or fake for that shipped schema" in shown["manage"]


def test_datacite_finds_a_resource_inside_any_wrapper() -> None:
    """A `<resource>` deeper in another wrapper than oai_datacite's payload is still found
    (the transformer has always searched at any depth)."""
    from lxml import etree

    from oaipmh_dagster.transform import datacite

    root = etree.fromstring(
        b'<wrapper><meta><resource xmlns="http://datacite.org/schema/kernel-4">'
        b'<identifier identifierType="DOI">10.1/x</identifier></resource></meta></wrapper>')
    assert datacite.transform(root)["doi"] == "10.1/x"
