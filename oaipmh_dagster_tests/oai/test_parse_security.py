"""Hostile and broken XML: XXE, billion laughs, illegal characters, HTML, truncation."""

from __future__ import annotations

import resource
from pathlib import Path

import httpx
import pytest
from lxml import etree

from oaipmh_dagster.oai import ClientOptions, OAIClient, OAIDataError
from oaipmh_dagster.oai._xml import hardened_parser, parse_xml, strip_illegal_chars
from oaipmh_dagster.oai.parse import parse_record_list, read_envelope

from .conftest import send
from .helpers import SleepRecorder, list_records_xml, record_xml

NS = 'xmlns="http://www.openarchives.org/OAI/2.0/"'
SECRET = "TOP-SECRET-CONTENT-42"

VERB_BODIES = {
    "Identify": "<Identify><repositoryName>&x;</repositoryName><baseURL>http://a</baseURL>"
    "<protocolVersion>2.0</protocolVersion><earliestDatestamp>2000-01-01</earliestDatestamp>"
    "<deletedRecord>no</deletedRecord><granularity>YYYY-MM-DD</granularity></Identify>",
    "ListMetadataFormats": "<ListMetadataFormats><metadataFormat><metadataPrefix>&x;</metadataPrefix>"
    "<schema>s</schema><metadataNamespace>n</metadataNamespace></metadataFormat></ListMetadataFormats>",
    "ListSets": "<ListSets><set><setSpec>&x;</setSpec><setName>n</setName></set></ListSets>",
    "ListIdentifiers": "<ListIdentifiers><header><identifier>&x;</identifier>"
    "<datestamp>2020-01-01</datestamp></header></ListIdentifiers>",
    "ListRecords": "<ListRecords><record><header><identifier>i</identifier>"
    "<datestamp>2020-01-01</datestamp></header><metadata><m>&x;</m></metadata></record></ListRecords>",
    "GetRecord": "<GetRecord><record><header><identifier>i</identifier>"
    "<datestamp>2020-01-01</datestamp></header><metadata><m>&x;</m></metadata></record></GetRecord>",
}


def _doc(doctype: str, verb: str) -> bytes:
    return (
        f'<?xml version="1.0"?>\n<!DOCTYPE OAI-PMH [{doctype}]>\n<OAI-PMH {NS}>'
        f"<responseDate>2020-01-01T00:00:00Z</responseDate><request>http://a</request>"
        f"{VERB_BODIES[verb]}</OAI-PMH>"
    ).encode()


def _billion_laughs() -> str:
    decls = ['<!ENTITY l0 "lollollollollollollollollollol">']
    decls += [f'<!ENTITY l{i} "{f"&l{i - 1};" * 10}">' for i in range(1, 10)]
    decls.append('<!ENTITY x "&l9;">')
    return "".join(decls)


def _call_verb(client: OAIClient, verb: str):
    if verb == "Identify":
        return client.identify()
    if verb == "ListMetadataFormats":
        return client.list_metadata_formats()
    if verb == "ListSets":
        return list(client.list_sets())
    if verb == "GetRecord":
        return client.get_record("i", "oai_dc")
    return list(client.iter_pages(verb, metadata_prefix="oai_dc", from_="2020-01-01"))


@pytest.fixture
def network_trap(loopback):
    """A loopback URL that records any fetch (none must happen)."""
    return loopback(lambda handler, params: send(handler, SECRET.encode()))


@pytest.mark.parametrize("verb", list(VERB_BODIES))
@pytest.mark.parametrize("kind", ["file", "http", "laughs", "parameter"])
def test_hostile_doctype_in_every_verb(tmp_path: Path, network_trap, verb, kind):
    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET)
    doctype = {
        "file": f'<!ENTITY x SYSTEM "file://{secret}">',
        "http": f'<!ENTITY x SYSTEM "{network_trap.url}?leak=1">',
        "laughs": _billion_laughs(),
        "parameter": f'<!ENTITY % p SYSTEM "{network_trap.url}?p=1"> %p; <!ENTITY x "y">',
    }[kind]
    body = _doc(doctype, verb)
    transport = httpx.MockTransport(lambda request: httpx.Response(200, content=body))
    client = OAIClient(
        "http://hostile.test/oai",
        ClientOptions(max_retries=1, backoff_base=0.0),
        transport=transport,
        sleep=SleepRecorder(),
    )
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(OAIDataError) as info:
        _call_verb(client, verb)
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert SECRET not in str(info.value)
    assert "entit" in str(info.value).lower()
    assert client.stats.requests == 1  # refused outright, not retried
    assert network_trap.requests == []
    assert grown_kib < 50 * 1024


def test_hardened_parser_alone_never_expands(tmp_path: Path, network_trap):
    """Even without the DOCTYPE pre-check the parser neither reads files nor expands."""
    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET)
    xxe = f'<!DOCTYPE r [<!ENTITY x SYSTEM "file://{secret}"><!ENTITY y SYSTEM "{network_trap.url}">]><r>&x;&y;</r>'
    root = etree.fromstring(xxe.encode(), hardened_parser())
    assert SECRET not in etree.tostring(root, encoding="unicode")
    assert network_trap.requests == []
    laughs = f"<!DOCTYPE r [{_billion_laughs()}]><r>&x;</r>".encode()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        root = etree.fromstring(laughs, hardened_parser())
    except etree.XMLSyntaxError:
        pass
    else:
        assert len(etree.tostring(root)) < 1000
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 50 * 1024


def test_external_dtd_is_not_loaded(network_trap):
    body = (
        f'<?xml version="1.0"?><!DOCTYPE OAI-PMH SYSTEM "{network_trap.url}?dtd=1"><OAI-PMH {NS}>'
        "<responseDate>2020-01-01T00:00:00Z</responseDate>"
        f"{VERB_BODIES['ListSets'].replace('&x;', 'ok')}</OAI-PMH>"
    ).encode()
    env = read_envelope(body)
    assert env.root is not None
    assert network_trap.requests == []


def test_illegal_characters_are_stripped_and_counted():
    body = list_records_xml(["a"]).replace(
        b"<dc:title>t", b"<dc:title>t\x01\x0b&#x1F;&#8;\xef\xbf\xbe"
    )
    with pytest.raises(OAIDataError):
        parse_xml(body)
    cleaned, count = strip_illegal_chars(body)
    assert count == 5
    env = read_envelope(body)
    assert env.stripped_chars == 5
    records, _, _ = parse_record_list(env, "ListRecords")
    assert b"<dc:title>t</dc:title>" in records[0].metadata


def test_legal_characters_untouched():
    body = "<a>tab\there\nnew&#9;&#10;&#13;&#x20;é✓</a>".encode()
    assert strip_illegal_chars(body) == (body, 0)


def test_client_counts_stripped_chars():
    body = list_records_xml(["a", "b"]).replace(b"<dc:title>t", b"<dc:title>\x02t")
    client = OAIClient(
        "http://x.test/oai",
        transport=httpx.MockTransport(lambda r: httpx.Response(200, content=body)),
    )
    pages = list(client.iter_pages("ListRecords", metadata_prefix="oai_dc"))
    assert pages[0].stripped_chars == 2
    assert client.stats.stripped_chars == 2


@pytest.mark.parametrize(
    ("body", "message", "retryable"),
    [
        (b"<html><body>Service down</body></html>", "HTML", True),
        (b"<!DOCTYPE html>\n<html><head><title>x</title></head><body><p>x</body></html>", "HTML",
         True),
        (list_records_xml(["a", "b"])[:-40], "not well-formed", True),
        (b"", "not well-formed", True),
        (b"<foo/>", "not an OAI-PMH response", False),
    ],
)
def test_broken_bodies(body, message, retryable):
    with pytest.raises(OAIDataError, match=message) as info:
        read_envelope(body, url="http://x.test/oai?verb=ListRecords", token="tok-1")
    assert info.value.retryable is retryable
    assert "http://x.test/oai?verb=ListRecords" in str(info.value)
    assert "tok-1" in str(info.value)


def test_metadata_serialized_with_namespaces_and_about():
    about = '<about><prov xmlns="urn:prov"><src>x</src></prov></about>'
    body = list_records_xml(["a"]).replace(b"</metadata>", b"</metadata>" + about.encode())
    records, token, skipped = parse_record_list(read_envelope(body), "ListRecords")
    record = records[0]
    assert record.metadata.startswith(b"<oai_dc:dc ")
    assert b'xmlns:dc="http://purl.org/dc/elements/1.1/"' in record.metadata
    assert not record.metadata.endswith(b"\n")
    assert len(record.about) == 1
    assert record.about[0].startswith(b'<prov xmlns="urn:prov"')
    assert record.about[0].endswith(b"><src>x</src></prov>")
    assert token is None and skipped == 0


def test_header_fields():
    inner = record_xml("oai:x:1", sets=["a", "b:c"]) + record_xml("oai:x:2", deleted=True)
    body = list_records_xml([]).replace(b"<ListRecords>", b"<ListRecords>" + inner.encode())
    records, _, _ = parse_record_list(read_envelope(body), "ListRecords")
    assert [r.header.set_specs for r in records] == [("a", "b:c"), ()]
    assert [r.deleted for r in records] == [False, True]
    assert records[1].metadata is None
    assert records[0].header.datestamp == "2024-01-02T03:04:05Z"
    assert records[0].header.datestamp_utc.isoformat() == "2024-01-02T03:04:05+00:00"
