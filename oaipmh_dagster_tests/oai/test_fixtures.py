"""The client against third-party OAI-PMH responses (Sickle, pyoai, Zenodo cassettes)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path

import pytest

from oaipmh_dagster.oai import (
    BadArgument,
    BadResumptionToken,
    CannotDisseminateFormat,
    ClientOptions,
    Granularity,
    IdDoesNotExist,
    NoRecordsMatch,
    NoSetHierarchy,
    OAIClient,
    OAIDataError,
    OAIProtocolError,
)
from oaipmh_dagster.oai.parse import read_envelope

from .helpers import SleepRecorder

FAST = ClientOptions(max_retries=2, backoff_base=0.01)


def test_sickle_identify(sickle_transport):
    with OAIClient("http://sickle.test/oai", transport=sickle_transport()) as client:
        ident = client.identify()
    assert ident.repository_name == "A Test Repository"
    assert ident.granularity is Granularity.DAY
    assert ident.earliest_datestamp == datetime(1970, 1, 1, tzinfo=UTC)
    assert ident.deleted_record == "persistent"
    assert ident.admin_emails == ["john.doe@example.com"]
    assert ident.response_date == datetime(2013, 2, 27, 10, 1, 15, tzinfo=UTC)
    assert ident.raw.startswith(b"<?xml")
    assert ident.descriptions and b"oai-identifier" in ident.descriptions[0]


def test_sickle_record_chain(sickle_transport, caplog):
    log: list[dict[str, str]] = []
    client = OAIClient("http://sickle.test/oai", transport=sickle_transport(log=log))
    with caplog.at_level(logging.WARNING):
        pages = list(client.iter_pages("ListRecords", metadata_prefix="oai_dc"))
    assert len(pages) == 4
    assert [p.params.get("resumptionToken") for p in pages] == [
        None,
        "ListRecords2.xml",
        "ListRecords3.xml",
        "ListRecords4.xml",
    ]
    assert pages[0].resumption_token.complete_list_size == 8
    assert pages[0].resumption_token.cursor == 0
    assert pages[-1].resumption_token is None
    assert pages[-1].skipped_headers == 1
    assert "without identifier or datestamp" in caplog.text
    records = [r for p in pages for r in p.records]
    assert sum(r.deleted for r in records) >= 3
    live = [r for r in records if not r.deleted]
    assert all(r.metadata.startswith(b"<oai_dc:dc") for r in live)
    assert b'xmlns:dc="http://purl.org/dc/elements/1.1/"' in live[0].metadata
    assert all(p.request_args == {"verb": "ListRecords", "metadataPrefix": "oai_dc"} for p in pages)
    assert client.stats.pages == 4
    assert client.stats.skipped_headers == 1
    assert log[0] == {"verb": "ListRecords", "metadataPrefix": "oai_dc"}


def test_sickle_identifiers_and_sets(sickle_transport):
    client = OAIClient("http://sickle.test/oai", transport=sickle_transport())
    headers = list(client.list_identifiers("oai_dc"))
    assert len(headers) == 4
    assert all(h.identifier and h.datestamp for h in headers)
    sets = list(client.list_sets())
    assert sets and all(s.spec for s in sets)
    formats = client.list_metadata_formats()
    assert "oai_dc" in [f.prefix for f in formats]
    record = client.get_record("oai:test.example.com:1996652", "oai_dc")
    assert record.header.identifier
    assert record.metadata is not None


def test_sickle_utf8(sickle_transport):
    transport = sickle_transport({"GetRecord": "GetRecord_utf8test.xml"})
    record = OAIClient("http://sickle.test/oai", transport=transport).get_record("x", "oai_dc")
    text = record.metadata.decode("utf-8")
    assert any(ord(ch) > 0x3000 for ch in text)


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("badArgument.xml", BadArgument),
        ("badResumptionToken.xml", BadResumptionToken),
        ("cannotDisseminateFormat.xml", CannotDisseminateFormat),
        ("idDoesNotExist.xml", IdDoesNotExist),
        ("noRecordsMatch.xml", NoRecordsMatch),
        ("noSetHierarchy.xml", NoSetHierarchy),
    ],
)
def test_sickle_error_files(fixtures_dir: Path, name, cls):
    with pytest.raises(cls) as info:
        read_envelope((fixtures_dir / "sickle" / name).read_bytes(), url="http://x/oai")
    assert info.value.code == name.removesuffix(".xml")
    assert "http://x/oai" in str(info.value)


def test_sickle_unknown_error_code(fixtures_dir: Path):
    with pytest.raises(OAIProtocolError) as info:
        read_envelope((fixtures_dir / "sickle" / "undefinedError.xml").read_bytes())
    assert type(info.value) is OAIProtocolError
    assert info.value.code == "undefinedError"
    assert "undefinedError" in str(info.value)


def test_sickle_no_records_match_is_empty(sickle_transport):
    transport = sickle_transport({"ListRecords": "noRecordsMatch.xml"})
    assert list(OAIClient("http://sickle.test/oai", transport=transport).list_records("x")) == []


def test_sickle_no_set_hierarchy_lists_no_sets(sickle_transport):
    transport = sickle_transport({"ListSets": "noSetHierarchy.xml"})
    assert list(OAIClient("http://sickle.test/oai", transport=transport).list_sets()) == []


def test_sickle_cannot_disseminate_names_offered_formats(sickle_transport):
    transport = sickle_transport({"ListRecords": "cannotDisseminateFormat.xml"})
    with pytest.raises(CannotDisseminateFormat) as info:
        list(OAIClient("http://sickle.test/oai", transport=transport).list_records("marc"))
    assert info.value.prefix == "marc"
    assert info.value.offered and "oai_dc" in info.value.offered
    assert "'marc'" in str(info.value) and "oai_dc" in str(info.value)


def test_sickle_broken_page_fails_after_retries(sickle_transport):
    sleep = SleepRecorder()
    transport = sickle_transport({"ListRecords": "ListRecordsBroken.xml"})
    client = OAIClient("http://sickle.test/oai", FAST, transport=transport, sleep=sleep)
    with pytest.raises(OAIDataError) as info:
        list(client.list_records("oai_dc"))
    assert "not well-formed" in str(info.value)
    assert "http://sickle.test/oai?verb=ListRecords" in str(info.value)
    assert client.stats.requests == 3
    assert len(sleep.waits) == 2


def test_sickle_broken_page_mid_list_names_token(sickle_transport, fixtures_dir):
    def route(request):
        import httpx

        token = request.url.params.get("resumptionToken")
        name = "ListRecordsBroken.xml" if token else "ListRecords.xml"
        return httpx.Response(200, content=(fixtures_dir / "sickle" / name).read_bytes())

    import httpx

    client = OAIClient(
        "http://sickle.test/oai", FAST, transport=httpx.MockTransport(route), sleep=SleepRecorder()
    )
    pages = client.iter_pages("ListRecords", metadata_prefix="oai_dc")
    first = next(pages)
    assert first.records
    with pytest.raises(OAIDataError) as info:
        next(pages)
    assert "ListRecords2.xml" in str(info.value)
    assert info.value.token == "ListRecords2.xml"


# -- pyoai -----------------------------------------------------------------------


def test_pyoai_fake1_verbs(pyoai_transport):
    client = OAIClient("http://ep.eur.nl/oai/request", transport=pyoai_transport("fake1"))
    ident = client.identify()
    assert ident.granularity is Granularity.SECOND
    assert ident.repository_name
    assert list(client.list_sets())
    assert client.list_metadata_formats()
    since = datetime(2003, 4, 10, tzinfo=UTC)
    records = list(client.list_records("oai_dc", from_=since))
    assert len(records) == 16
    headers = list(client.list_identifiers("oai_dc", from_=since))
    assert headers
    record = client.get_record("hdl:1765/315", "oai_dc")
    assert record.header.identifier == "hdl:1765/315"


def test_pyoai_fake2_big_page(pyoai_transport):
    client = OAIClient("http://ep.eur.nl/oai/request", transport=pyoai_transport("fake2"))
    pages = list(
        client.iter_pages("ListRecords", metadata_prefix="oai_dc", from_="2004-01-01T00:00:00Z")
    )
    assert sum(len(p.records) for p in pages) == 81


def test_pyoai_fake3_not_well_formed(pyoai_transport):
    client = OAIClient(
        "http://ep.eur.nl/oai/request",
        FAST,
        transport=pyoai_transport("fake3"),
        sleep=SleepRecorder(),
    )
    with pytest.raises(OAIDataError, match="not well-formed"):
        client.identify()


def test_pyoai_fake4_unknown_entities(pyoai_transport):
    client = OAIClient(
        "http://ep.eur.nl/oai/request",
        FAST,
        transport=pyoai_transport("fake4"),
        sleep=SleepRecorder(),
    )
    with pytest.raises(OAIDataError) as info:
        client.identify()
    assert "bogus" in str(info.value)


def test_pyoai_fake5_junk_earliest_datestamp(pyoai_transport, caplog):
    client = OAIClient("http://ep.eur.nl/oai/request", transport=pyoai_transport("fake5"))
    with caplog.at_level(logging.WARNING):
        ident = client.identify()
    assert ident.earliest_datestamp is None
    assert "aaaa-bb-cc" in caplog.text
    assert ident.granularity is Granularity.SECOND


# -- Zenodo cassettes ---------------------------------------------------------------

ZENODO = "https://zenodo.org/oai2d"


def test_zenodo_list_records_two_pages(scythe_transport):
    requests = []
    client = OAIClient(ZENODO, transport=scythe_transport("list_records.yaml", log=requests))
    pages = list(client.iter_pages("ListRecords", metadata_prefix="oai_dc"))
    assert len(pages) >= 2
    first = pages[0].resumption_token
    assert first.expiration_date == datetime(2026, 8, 13, 17, 58, 52, tzinfo=UTC)
    assert first.complete_list_size == 8091628
    assert pages[1].resumption_token.cursor == 50 or len(pages) > 2
    assert all(r.header.identifier.startswith("oai:zenodo.org:") for p in pages for r in p.records)


def test_zenodo_422_errors(scythe_transport):
    transport = scythe_transport("list_records.yaml", "get_record.yaml", "id_does_not_exist.yaml")
    sleep = SleepRecorder()
    client = OAIClient(ZENODO, transport=transport, sleep=sleep)
    assert list(client.list_records("oai_dc", from_="2030-01-01")) == []
    assert list(client.list_records("oai_dc", sets=["XXX"])) == []
    with pytest.raises(BadArgument, match="metadataPrefix does not exist"):
        list(client.list_records("XXX"))
    with pytest.raises(IdDoesNotExist):
        client.get_record("oai:zenodo.org:XXX", "oai_dc")
    with pytest.raises(BadResumptionToken):
        list(client.iter_pages("ListRecords", resumption_token="XXX"))
    assert sleep.waits == []  # Retry-After on 200/422 is not a reason to wait


def test_zenodo_get_record_datacite(scythe_transport):
    client = OAIClient(ZENODO, transport=scythe_transport("get_record.yaml"))
    record = client.get_record("oai:zenodo.org:10357859", "datacite")
    assert record.header.identifier == "oai:zenodo.org:10357859"
    assert b"datacite" in record.metadata.split(b">", 1)[0].lower()


def test_zenodo_sets_paged_and_formats(scythe_transport):
    client = OAIClient(
        ZENODO, transport=scythe_transport("list_sets.yaml", "list_metadata_formats.yaml")
    )
    sets = list(client.list_sets())
    assert len(sets) == 10  # two pages of five
    assert len({s.spec for s in sets}) == len(sets)
    prefixes = [f.prefix for f in client.list_metadata_formats()]
    assert "oai_dc" in prefixes and "datacite" in prefixes
    with pytest.raises(IdDoesNotExist):
        client.list_metadata_formats("oai:zenodo.org:XXX")


def test_zenodo_identifiers(scythe_transport):
    client = OAIClient(ZENODO, transport=scythe_transport("list_identifiers.yaml"))
    pages = list(client.iter_pages("ListIdentifiers", metadata_prefix="oai_dc"))
    assert len(pages) == 3
    assert pages[-1].resumption_token is None or pages[-1].resumption_token.token == ""
    assert all(r.metadata is None for p in pages for r in p.records)
    assert sum(len(p.records) for p in pages) == len(list(client.list_identifiers("oai_dc")))
    assert list(client.list_identifiers("oai_dc", from_="2030-01-15")) == []


def test_html_instead_of_identify(scythe_transport):
    client = OAIClient(
        "https://httpbun.com/html",
        FAST,
        transport=scythe_transport("identify.yaml"),
        sleep=SleepRecorder(),
    )
    with pytest.raises(OAIDataError, match="HTML"):
        client.identify()
    other = OAIClient(
        "https://www.e-periodica.ch/oai/dataprovider", transport=scythe_transport("identify.yaml")
    )
    assert other.identify().repository_name
    zen = OAIClient(ZENODO, transport=scythe_transport("identify.yaml"))
    assert zen.identify().granularity is Granularity.SECOND
