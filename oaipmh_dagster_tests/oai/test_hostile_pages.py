"""Pages that used to fail every run: one oversized or deeply nested record, a charset
given only in HTTP, and responses that can never parse (raised at once, not retried)."""

from __future__ import annotations

import codecs

import httpx
import pytest

from oaipmh_dagster.oai import ClientOptions, OAIClient, OAIDataError, OAIProtocolError
from oaipmh_dagster.oai._charset import apply_http_charset
from oaipmh_dagster.oai.parse import parse_record_list, read_envelope

from .helpers import OAI_HEAD, RESPONSE_DATE, SleepRecorder, list_records_xml, record_xml

LIMIT_TEXT = 10_000_000  # libxml2's largest text node without XML_PARSE_HUGE
TITLE = "Café über Œuvre"


def _client(*responses: httpx.Response, base: str = "http://hostile.test/oai"):
    """A client over a transport that answers with `responses` in turn (the last repeats)."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return responses[min(len(seen), len(responses)) - 1]

    client = OAIClient(
        base,
        ClientOptions(max_retries=3, backoff_base=0.0),
        transport=httpx.MockTransport(handler),
        sleep=SleepRecorder(),
    )
    return client, seen


def _page(*records: str, verb: str = "ListRecords") -> bytes:
    return (OAI_HEAD.format(date=RESPONSE_DATE) + f"<{verb}>" + "".join(records)
            + f"</{verb}></OAI-PMH>").encode()


def _with_metadata(identifier: str, inner: str) -> str:
    return (
        f"<record><header><identifier>{identifier}</identifier>"
        f"<datestamp>2024-01-02T03:04:05Z</datestamp></header>"
        f'<metadata><m xmlns="urn:m">{inner}</m></metadata></record>'
    )


def _nested(depth: int) -> str:
    return "<n>" * depth + "deep" + "</n>" * depth


def _records(body: bytes, headers: dict[str, str] | None = None, verb: str = "ListRecords"):
    client, seen = _client(httpx.Response(200, content=body, headers=headers or {}))
    if verb == "GetRecord":
        return [client.get_record("b", "oai_dc")], seen
    pages = list(client.iter_pages(verb, metadata_prefix="oai_dc"))
    return [r for p in pages for r in p.records], seen


# -- one bad record, not a bad page ------------------------------------------------------


@pytest.mark.parametrize(
    ("inner", "words"),
    [
        ("x" * (LIMIT_TEXT + 1), "text"),
        ("é" * (LIMIT_TEXT // 2 + 1), "text"),
        (f"<![CDATA[{'x' * (LIMIT_TEXT + 1)}]]>", "text"),
        (f"<!--{'x' * (LIMIT_TEXT + 1)}-->", "comment"),
        (_nested(300), "nest"),
        (_nested(5000), "nest"),
    ],
    ids=["text", "text-2-byte-chars", "cdata", "comment", "depth-300", "depth-5000"],
)
def test_one_oversized_record_gets_an_error_and_the_rest_are_harvested(inner, words):
    body = _page(record_xml("a"), _with_metadata("b", inner), record_xml("c", deleted=True),
                 record_xml("d"))
    records, seen = _records(body)
    assert [r.identifier for r in records] == ["a", "b", "c", "d"]
    assert len(seen) == 1  # read on the first answer, not retried
    bad = records[1]
    assert bad.metadata is None and bad.element is None
    assert bad.header.datestamp_utc is not None and not bad.deleted
    assert bad.parse_error is not None
    assert set(bad.parse_error) == {"type", "message", "location"}
    assert words in bad.parse_error["message"] and bad.parse_error["location"] == "metadata"
    assert records[2].deleted and records[2].parse_error is None
    for good in (records[0], records[3]):
        assert good.parse_error is None
        assert good.metadata.startswith(b"<oai_dc:dc") and good.element is not None


def test_nesting_within_the_limit_is_kept():
    """256 levels in all (envelope included) is what the plain parser reads: no error."""
    body = _page(_with_metadata("a", _nested(256 - 6)))
    (record,), _ = _records(body)
    assert record.parse_error is None and record.metadata.count(b"<n>") == 250


def test_oversized_about_is_dropped_with_an_error():
    about = f'<about><p xmlns="urn:p">{"x" * (LIMIT_TEXT + 1)}</p></about>'
    body = _page(record_xml("a").replace("</record>", about + "</record>"), record_xml("b"))
    records, _ = _records(body)
    assert records[0].about == () and records[0].metadata is not None
    assert records[0].parse_error["location"] == "about"
    assert records[1].parse_error is None


def test_get_record_with_deep_metadata():
    body = _page(_with_metadata("b", _nested(400)), verb="GetRecord")
    (record,), seen = _records(body, verb="GetRecord")
    assert record.identifier == "b" and record.metadata is None
    assert "nest" in record.parse_error["message"] and len(seen) == 1


def test_oversized_record_with_illegal_characters_and_a_latin1_charset():
    title = TITLE.replace("Œ", "")
    good = record_xml("a", title=title).replace("<dc:title>", "<dc:title>\x01")
    body = _page(good, _with_metadata("b", _nested(300))).replace(b'encoding="UTF-8"', b"")
    body = body.decode().encode("iso-8859-1")
    client, _ = _client(httpx.Response(
        200, content=body, headers={"Content-Type": "text/xml; charset=ISO-8859-1"}))
    (page,) = list(client.iter_pages("ListRecords", metadata_prefix="oai_dc"))
    a, b = page.records
    assert title in a.metadata.decode() and page.stripped_chars == 1
    assert b.parse_error is not None and a.parse_error is None


def test_limit_broken_in_a_header_fails_the_page_at_once():
    huge_id = "i" * (LIMIT_TEXT + 1)
    body = _page(record_xml("a"), record_xml(huge_id))
    client, seen = _client(httpx.Response(200, content=body))
    with pytest.raises(OAIDataError, match="header") as info:
        list(client.iter_pages("ListRecords", metadata_prefix="oai_dc"))
    assert len(seen) == 1 and not info.value.retryable
    assert len(str(info.value)) < 2000


def test_entities_still_refused_on_the_bounded_path():
    body = _page(_with_metadata("a", _nested(300) + "&x;"))
    body = body.replace(b"<OAI-PMH", b'<!DOCTYPE OAI-PMH [<!ENTITY x "y">]><OAI-PMH', 1)
    with pytest.raises(OAIDataError, match="entit"):
        read_envelope(body)


# -- the charset of the HTTP Content-Type --------------------------------------------------


def _latin1_page(declaration: str) -> bytes:
    text = list_records_xml(["a"]).decode().replace('<?xml version="1.0" encoding="UTF-8"?>',
                                                    declaration)
    return text.replace("<dc:title>t", f"<dc:title>{TITLE}").encode("cp1252")


@pytest.mark.parametrize(
    ("declaration", "content_type"),
    [
        ("", "text/xml; charset=ISO-8859-1"),
        ('<?xml version="1.0"?>', "text/xml; charset=iso-8859-1"),
        ("<?xml version='1.0' standalone='yes'?>", 'application/xml; charset="latin1"'),
        ("", "text/xml;charset=windows-1252"),
        ('<?xml version="1.0" encoding="UTF-8"?>', "text/xml; charset=windows-1252"),
    ],
    ids=["no-declaration", "declaration-without-encoding", "quoted-alias", "cp1252",
         "declaration-contradicts-bytes"],
)
def test_http_charset_decides_when_the_document_does_not(declaration, content_type):
    body = _latin1_page(declaration)
    if "1252" not in content_type:
        body = body.replace("Œ".encode("cp1252"), b"")
    records, _ = _records(body, {"Content-Type": content_type})
    expected = TITLE if "1252" in content_type else TITLE.replace("Œ", "")
    assert f"<dc:title>{expected}</dc:title>" in records[0].metadata.decode()


def test_declaration_that_matches_the_bytes_wins_over_a_wrong_http_charset():
    """Tomcat's default ISO-8859-1 header over a UTF-8 page that says so itself."""
    body = list_records_xml(["a"]).replace(b"<dc:title>t", f"<dc:title>{TITLE}".encode())
    records, _ = _records(body, {"Content-Type": "text/xml; charset=ISO-8859-1"})
    assert f"<dc:title>{TITLE}</dc:title>" in records[0].metadata.decode()


def test_latin1_declaration_wins_over_a_utf8_http_charset():
    body = _latin1_page('<?xml version="1.0" encoding="ISO-8859-1"?>').replace(
        "Œ".encode("cp1252"), b"")
    records, _ = _records(body, {"Content-Type": "text/xml; charset=UTF-8"})
    assert f"<dc:title>{TITLE.replace('Œ', '')}</dc:title>" in records[0].metadata.decode()


def test_utf16_declared_over_utf8_bytes_reads_as_the_http_charset():
    body = list_records_xml(["a"]).replace(b'encoding="UTF-8"', b'encoding="utf-16"')
    body = body.replace(b"<dc:title>t", f"<dc:title>{TITLE}".encode())
    records, _ = _records(body, {"Content-Type": "text/xml; charset=UTF-8"})
    assert f"<dc:title>{TITLE}</dc:title>" in records[0].metadata.decode()


@pytest.mark.parametrize("codec", ["utf-8-sig", "utf-16", "utf-16-be"])
def test_a_bom_wins_over_both(codec):
    text = list_records_xml(["a"]).decode().replace("<dc:title>t", f"<dc:title>{TITLE}")
    if codec == "utf-16-be":
        body = codecs.BOM_UTF16_BE + text.replace("UTF-8", "UTF-16").encode(codec)
    else:
        body = text.replace("UTF-8", "utf-16" if codec == "utf-16" else "UTF-8").encode(codec)
    records, _ = _records(body, {"Content-Type": "text/xml; charset=ISO-8859-1"})
    assert f"<dc:title>{TITLE}</dc:title>" in records[0].metadata.decode()


@pytest.mark.parametrize(
    "content_type",
    [None, "text/xml", "text/xml; charset=UTF-8", "text/xml; charset=no-such-codec",
     "text/xml; charset="],
)
def test_a_utf8_page_is_passed_through_untouched(content_type):
    body = list_records_xml(["a"])
    assert apply_http_charset(body, content_type) is body


def test_bytes_that_are_not_in_the_http_charset_are_left_to_the_xml_rules():
    body = list_records_xml(["a"]).replace(b"<dc:title>t", f"<dc:title>{TITLE}".encode())
    body = body.replace(b' encoding="UTF-8"', b"")
    assert apply_http_charset(body, "text/xml; charset=us-ascii") is body


# -- responses that can never parse ----------------------------------------------------------


def test_broken_markup_is_a_data_error_raised_at_once():
    body = list_records_xml(["a", "b"]).replace(b"</ListRecords>", b"</ListRecords></request>")
    client, seen = _client(httpx.Response(200, content=body),
                           base="http://user:secret@hostile.test/oai")
    with pytest.raises(OAIDataError) as info:
        list(client.iter_pages("ListRecords", metadata_prefix="oai_dc"))
    message = str(info.value)
    assert len(seen) == 1 and not info.value.retryable
    assert "not well-formed" in message and "mismatch" in message
    assert "</request>" in message  # the text where it breaks
    assert "line " in message and "http://hostile.test/oai?verb=ListRecords" in message
    assert "secret" not in message and "user" not in message
    assert client.stats.retries == 0


def test_a_truncated_page_is_still_retried():
    whole = list_records_xml(["a", "b", "c"])
    client, seen = _client(httpx.Response(200, content=whole[: len(whole) // 2]),
                           httpx.Response(200, content=whole))
    records = [r for p in client.iter_pages("ListRecords", metadata_prefix="oai_dc")
               for r in p.records]
    assert len(records) == 3 and len(seen) == 2


def test_a_bare_error_root_is_a_data_error_raised_at_once():
    body = (b'<?xml version="1.0" encoding="UTF-8"?>\n'
            b'<error code="idDoesNotExist">Malformed identifier: oai:x</error>\n')
    client, seen = _client(httpx.Response(200, content=body))
    with pytest.raises(OAIDataError) as info:
        client.get_record("oai:x", "oai_dc")
    assert not isinstance(info.value, OAIProtocolError)
    assert len(seen) == 1 and not info.value.retryable
    message = str(info.value)
    assert "without the OAI-PMH envelope" in message and "idDoesNotExist" in message
    assert "Malformed identifier" in message


def test_another_root_is_a_data_error_raised_at_once():
    client, seen = _client(httpx.Response(200, content=b"<rss><channel/></rss>"))
    with pytest.raises(OAIDataError, match=r"root element <rss>.*<rss><channel/>"):
        client.identify()
    assert len(seen) == 1


def test_html_maintenance_page_is_still_retried():
    html = httpx.Response(200, text="<html><body>maintenance</body></html>")
    client, seen = _client(html, httpx.Response(200, content=list_records_xml(["a"])))
    pages = list(client.iter_pages("ListRecords", metadata_prefix="oai_dc"))
    assert len(pages[0].records) == 1 and len(seen) == 2


def test_parse_record_list_reports_the_error_of_the_right_record():
    body = _page(_with_metadata("a", _nested(300)), record_xml("b"), _with_metadata("c", "ok"))
    records, _, skipped = parse_record_list(read_envelope(body), "ListRecords")
    assert [r.parse_error is not None for r in records] == [True, False, False]
    assert records[2].metadata.endswith(b">ok</m>") and skipped == 0
