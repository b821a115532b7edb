"""Fixtures: metadata records taken from the third-party OAI-PMH responses.

The responses live outside the repository, in ``<repo root>/../shared/oai-fixtures``;
tests that need them skip with a reason when that folder is absent.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from lxml import etree

REPO_ROOT = Path(__file__).resolve().parents[2]
OAI_FIXTURES = REPO_ROOT.parent / "shared" / "oai-fixtures"
OAI_NS = "http://www.openarchives.org/OAI/2.0/"
_OAI = f"{{{OAI_NS}}}"

Records = dict[str, bytes]


def _metadata_records(page: bytes) -> Iterator[tuple[str, bytes]]:
    """(OAI identifier, serialized metadata child) for each non-deleted record of a page."""
    root = etree.fromstring(page)
    for record in root.iter(f"{_OAI}record"):
        metadata = record.find(f"{_OAI}metadata")
        if metadata is None or not len(metadata):
            continue
        identifier = record.findtext(f"{_OAI}header/{_OAI}identifier")
        assert identifier, "every record with metadata has an identifier"
        # tostring() carries the namespace declarations inherited from the page.
        yield identifier.strip(), etree.tostring(metadata[0], with_tail=False)


@pytest.fixture(scope="session")
def oai_fixtures() -> Path:
    if not OAI_FIXTURES.is_dir():
        pytest.skip(f"third-party OAI-PMH fixtures not found at {OAI_FIXTURES}")
    return OAI_FIXTURES


@pytest.fixture(scope="session")
def sickle_dc(oai_fixtures: Path) -> Records:
    """oai_dc records of Sickle's ListRecords chain and GetRecord samples."""
    out: Records = {}
    for name in (
        "ListRecords.xml",
        "ListRecords2.xml",
        "ListRecords3.xml",
        "ListRecords4.xml",
        "GetRecord.xml",
        "GetRecord_utf8test.xml",
    ):
        out.update(_metadata_records((oai_fixtures / "sickle" / name).read_bytes()))
    return out


@pytest.fixture(scope="session")
def pyoai_dc(oai_fixtures: Path) -> Records:
    """oai_dc records of the DSpace captures kept by pyoai (fake1 and fake2)."""
    out: Records = {}
    for page in sorted((oai_fixtures / "pyoai").glob("fake[12]/*.xml")):
        out.update(_metadata_records(page.read_bytes()))
    return out


@pytest.fixture(scope="session")
def zenodo(oai_fixtures: Path) -> dict[str, Records]:
    """Zenodo records from the VCR cassettes, by format: ``{"oai_dc": ..., "datacite": ...}``."""
    yaml = pytest.importorskip("yaml", reason="PyYAML reads the VCR cassettes")
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    out: dict[str, Records] = {"oai_dc": {}, "datacite": {}}
    for cassette in ("list_records.yaml", "get_record.yaml"):
        data = yaml.load((oai_fixtures / "scythe" / cassette).read_text("utf-8"), Loader=loader)
        for interaction in data["interactions"]:
            response = interaction["response"]
            if response["status"] != 200:  # OAI errors (HTTP 422) carry no records
                continue
            page = response["body"]["content"].encode("utf-8")
            for identifier, xml in _metadata_records(page):
                root_tag = etree.QName(etree.fromstring(xml)).localname
                fmt = {"dc": "oai_dc", "resource": "datacite"}[root_tag]
                out[fmt][identifier] = xml
    return out
