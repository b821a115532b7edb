"""Real responses of 26 server implementations, served from a loopback HTTP server with
their recorded status and headers, read through the real client (every verb) and, for
ListRecords, harvested end to end into a store. Expected values come from an
independent parse (the standard library's ElementTree and ``datetime.fromisoformat``)."""

from __future__ import annotations

import csv
import http.server
import json
import re
import threading
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from oaipmh_dagster.harvesting.harvest import harvest
from oaipmh_dagster.oai import (
    ClientOptions,
    OAIClient,
    OAIDataError,
    OAIError,
    OAIProtocolError,
    OAITransportError,
)
from oaipmh_dagster.storage.registry import Harvester
from oaipmh_dagster.storage.store import Store

from .conftest import LoopbackServer
from .helpers import SleepRecorder, envelope, identify_xml

REALWORLD = Path(__file__).resolve().parents[2].parent / "shared" / "oai-realworld"
OAI = "{http://www.openarchives.org/OAI/2.0/}"
OPTIONS = ClientOptions(max_retries=2, backoff_base=0.0, read_timeout=10)
# ListRecords cases harvested on PostgreSQL too: a plain page, a token chain with
# whitespace, compact datestamps, a 503 before the answer, an empty list, deletions,
# and a page that can never parse.
ON_POSTGRES = {
    "mit-dspace-lr-set", "copac-lr-whitespace", "harvard-lr-mods", "arxiv-lr-503",
    "mikromarc-lr-empty", "mit-dspace-lr-deleted", "indiana-lr-broken",
}


@dataclass
class Response:
    path: Path
    status: int
    headers: dict[str, str]


@dataclass
class Case:
    name: str
    verb: str
    prefix: str
    expect: tuple[str, ...]
    pages: list[Response] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return "ok" in self.expect


def _load() -> list[Case]:
    if not (REALWORLD / "MANIFEST.tsv").is_file():
        return []
    cases: dict[str, Case] = {}
    with (REALWORLD / "MANIFEST.tsv").open(newline="", encoding="utf-8") as fh:
        for row in csv.DictReader(fh, delimiter="\t"):
            case = cases.setdefault(row["case"], Case(
                row["case"], row["verb"], row["prefix"], tuple(row["expect"].split("|"))))
            case.pages.append((int(row["page"] or 1), Response(
                REALWORLD / "files" / row["file"], int(row["http_status"]),
                json.loads(row["headers"] or "{}"))))
    for case in cases.values():
        case.pages = [r for _, r in sorted(case.pages, key=lambda item: item[0])]
    return list(cases.values())


CASES = _load()
MISSING = pytest.mark.skip(reason=f"real-world OAI-PMH responses not found at {REALWORLD}")


def _params(cases: list[Case]) -> list[Any]:
    return [pytest.param(c, id=c.name) for c in cases] or [pytest.param(None, marks=MISSING)]


# -- the loopback server -------------------------------------------------------------------


class CaseServer:
    """Serves one case's pages in order; a page after one with a resumptionToken only to
    a request that sends that token back. A request asked again gets the same answer,
    unless a failure status was recorded with the answer that followed it (a 503 then
    the page). Other verbs: a synthetic Identify, else 404."""

    def __init__(self, case: Case) -> None:
        self.case = case
        self.served = 0
        self.requests = 0
        self.expected_token: str | None = None
        self.last: Response | None = None
        self.last_sent: str | None = None
        self.mismatches: list[tuple[str | None, str | None]] = []
        self.lock = threading.Lock()
        self.server = LoopbackServer(self.handle)

    @property
    def url(self) -> str:
        return self.server.url

    def _next(self, sent: str | None) -> Response | bytes | None:
        """The page for a request that sent `sent` (bytes: a synthetic end of the list)."""
        pages, last = self.case.pages, self.last
        more = self.served < len(pages)
        if last is not None and sent == self.last_sent and (last.status == 200 or not more):
            return last
        if sent == self.expected_token and more:
            self.served += 1
            return pages[self.served - 1]
        if sent is not None and sent == self.expected_token:
            # The recording stops before its list does: end the list there.
            verb = self.case.verb
            return envelope(f"<{verb}><resumptionToken/></{verb}>")
        self.mismatches.append((self.expected_token, sent))
        return None

    def handle(self, handler: http.server.BaseHTTPRequestHandler, params: dict[str, str]) -> None:
        verb = params.get("verb")
        xml = {"Content-Type": "text/xml; charset=UTF-8"}
        if verb != self.case.verb:
            if verb == "Identify":
                _send(handler, 200, xml, identify_xml())
            else:
                _send(handler, 404, {"Content-Type": "text/plain"}, b"not recorded")
            return
        with self.lock:
            self.requests += 1
            sent = params.get("resumptionToken")
            page = self._next(sent)
            if isinstance(page, Response):
                self.last, self.last_sent = page, sent
                body = page.path.read_bytes()
                if page.status == 200:
                    self.expected_token = _token(_tree(body))
        if page is None:
            _send(handler, 404, {"Content-Type": "text/plain"}, b"not recorded")
        elif isinstance(page, bytes):
            _send(handler, 200, xml, page)
        else:
            _send(handler, page.status, page.headers, body)

    def close(self) -> None:
        self.server.close()


def _send(handler: http.server.BaseHTTPRequestHandler, status: int, headers: dict[str, str],
          body: bytes) -> None:
    handler.send_response(status)
    for name, value in headers.items():
        if name.lower() not in ("content-length", "transfer-encoding", "content-encoding"):
            handler.send_header(name, value)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


@pytest.fixture
def serve() -> Iterator[Callable[[Case], CaseServer]]:
    servers: list[CaseServer] = []

    def start(case: Case) -> CaseServer:
        servers.append(CaseServer(case))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


# -- the independent reading ---------------------------------------------------------------


def _tree(body: bytes) -> ET.Element | None:
    """ElementTree's reading of a page (all recorded pages are UTF-8, whatever they
    declare), or None when it is not well-formed."""
    text = body.decode("utf-8-sig")
    text = re.sub(r"\A\s*<\?xml[^>]*\?>", "", text)
    try:
        return ET.fromstring(text)
    except ET.ParseError:
        return None


def _text(el: ET.Element | None) -> str:
    return (el.text or "").strip() if el is not None else ""


def _token(root: ET.Element | None) -> str | None:
    el = root.find(f".//{OAI}resumptionToken") if root is not None else None
    return _text(el) or None


def _utc(text: str) -> str:
    value = datetime.fromisoformat(text)
    value = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    return value.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Expected:
    identifier: str
    datestamp: str
    deleted: bool
    sets: tuple[str, ...]
    has_metadata: bool


def _headers(case: Case) -> list[Expected]:
    """Every usable header (identifier and datestamp) of the case's 200 pages."""
    out = []
    for page in case.pages:
        root = _tree(page.path.read_bytes()) if page.status == 200 else None
        if root is None:
            continue
        for header in root.iter(f"{OAI}header"):
            identifier, datestamp = _text(header.find(f"{OAI}identifier")), _text(
                header.find(f"{OAI}datestamp"))
            if not identifier or not datestamp:
                continue
            record = next((r for r in root.iter(f"{OAI}record")
                           if r.find(f"{OAI}header") is header), None)
            metadata = record.find(f"{OAI}metadata") if record is not None else None
            out.append(Expected(
                identifier, datestamp, header.get("status") == "deleted",
                tuple(_text(s) for s in header.findall(f"{OAI}setSpec") if _text(s)),
                metadata is not None and len(metadata) > 0,
            ))
    return out


def _pages(case: Case) -> list[ET.Element]:
    return [r for p in case.pages if p.status == 200
            if (r := _tree(p.path.read_bytes())) is not None]


# -- what each verb gives ------------------------------------------------------------------


def _call(client: OAIClient, case: Case) -> Any:
    if case.verb == "Identify":
        return client.identify()
    if case.verb == "ListMetadataFormats":
        return client.list_metadata_formats()
    if case.verb == "ListSets":
        return list(client.list_sets())
    if case.verb == "GetRecord":
        root = _tree(case.pages[0].path.read_bytes())
        request = root.find(f"{OAI}request") if root is not None else None
        identifier = (request.get("identifier") if request is not None else None) or "oai:x:1"
        return client.get_record(identifier, case.prefix or "oai_dc")
    pages = list(client.iter_pages(case.verb, metadata_prefix=case.prefix or "oai_dc"))
    return [r for p in pages for r in p.records]


def _check_ok(case: Case, result: Any) -> None:
    if case.verb in ("ListRecords", "ListIdentifiers"):
        expected = _headers(case)
        assert [r.identifier for r in result] == [e.identifier for e in expected]
        for record, exp in zip(result, expected, strict=True):
            assert record.header.datestamp == exp.datestamp
            assert record.deleted == exp.deleted
            assert record.header.set_specs == exp.sets
            assert record.header.datestamp_utc is not None, record.header.datestamp
            assert record.header.datestamp_utc.strftime("%Y-%m-%dT%H:%M:%SZ") == _utc(
                exp.datestamp)
            assert (record.metadata is not None) == exp.has_metadata
            assert record.parse_error is None
        return
    if case.verb == "GetRecord":
        (exp,) = _headers(case)
        assert (result.identifier, result.deleted) == (exp.identifier, exp.deleted)
        assert result.header.set_specs == exp.sets
        assert result.header.datestamp_utc.strftime("%Y-%m-%dT%H:%M:%SZ") == _utc(exp.datestamp)
        assert (result.metadata is not None) == exp.has_metadata
        return
    if case.verb == "ListSets":
        specs = [_text(s.find(f"{OAI}setSpec")) for root in _pages(case)
                 for s in root.iter(f"{OAI}set")]
        assert [s.spec for s in result] == specs and specs
        return
    (root,) = _pages(case)
    if case.verb == "ListMetadataFormats":
        prefixes = [_text(f) for f in root.iter(f"{OAI}metadataPrefix")]
        assert [f.prefix for f in result] == prefixes and prefixes
        return
    assert result.repository_name == _text(root.find(f".//{OAI}repositoryName"))
    assert result.earliest_datestamp is not None
    assert result.earliest_datestamp.strftime("%Y-%m-%dT%H:%M:%SZ") == _utc(
        _text(root.find(f".//{OAI}earliestDatestamp")))


def _check_refusal(case: Case, exc: BaseException | None, requests: int) -> None:
    """What the manifest expects of a failure (``ok`` cases pass through)."""
    codes = [e.removeprefix("oai:") for e in case.expect if e.startswith("oai:")]
    if exc is None:
        assert case.ok or (codes == ["noRecordsMatch"] and case.verb.startswith("List")), (
            f"{case.name} should have failed with {case.expect}")
        return
    if isinstance(exc, OAIProtocolError):
        assert exc.code in codes, f"{case.name}: {exc!r}"
        return
    assert "refuse" in case.expect, f"{case.name}: {exc!r}"
    assert isinstance(exc, OAIDataError | OAITransportError)
    if isinstance(exc, OAIDataError) and case.pages[0].status == 200:
        assert requests == 1, f"{case.name}: a response that never parses was asked again"


@pytest.mark.parametrize("case", _params(CASES))
def test_client_reads_each_case_as_the_manifest_expects(case: Case, serve) -> None:
    server = serve(case)
    client = OAIClient(server.url, OPTIONS, sleep=SleepRecorder())
    result: Any = None
    error: OAIError | None = None
    try:
        result = _call(client, case)
    except OAIError as exc:
        error = exc
    finally:
        client.close()
    assert server.mismatches == [], "the client did not send back the tokens it was given"
    _check_refusal(case, error, server.requests)
    if error is None and case.ok:
        _check_ok(case, result)
        assert server.served == len(case.pages)
    if error is not None:
        assert "127.0.0.1" in str(error)


# -- end to end into a store ---------------------------------------------------------------

LIST_RECORDS = [c for c in CASES if c.verb == "ListRecords"]


def _harvest_case(case: Case, server: CaseServer) -> tuple[Store, Any, OAIError | None]:
    store = Store()
    h = Harvester(id="rw", base_url=server.url, metadata_prefix=case.prefix, max_retries=2)
    client = OAIClient(server.url, OPTIONS, sleep=SleepRecorder())
    try:
        return store, harvest(h, store, run_id="r1", client=client), None
    except OAIError as exc:
        return store, None, exc
    finally:
        client.close()


def _check_store(case: Case, serve) -> None:
    server = serve(case)
    store, stats, error = _harvest_case(case, server)
    assert server.mismatches == [], "the harvest did not send back the tokens it was given"
    _check_refusal(case, error, server.requests)
    stored = {r["oai_identifier"]: r for r in store.iter_records("rw")}
    if error is not None:
        assert stored == {}
        return
    expected = {e.identifier: e for e in _headers(case)}  # the last copy of a repeated id
    assert set(stored) == set(expected)
    for identifier, exp in expected.items():
        row = stored[identifier]
        assert row["datestamp"] == _utc(exp.datestamp), identifier
        assert row["deleted"] == exp.deleted
        assert tuple(row["sets"]) == exp.sets
        assert (row["metadata"] is not None) == (exp.has_metadata and not row["errors"])
    assert stats.records == len(_headers(case))
    assert stats.deleted == sum(e.deleted for e in expected.values())


@pytest.mark.parametrize("case", _params(LIST_RECORDS))
def test_list_records_harvested_into_sqlite(case: Case, serve, sqlite_url: str) -> None:
    _check_store(case, serve)


@pytest.mark.parametrize("case", _params([c for c in LIST_RECORDS if c.name in ON_POSTGRES]))
def test_list_records_harvested_on_both_databases(case: Case, serve, database_url: str) -> None:
    _check_store(case, serve)


def test_manifest_is_complete() -> None:
    if not CASES:
        pytest.skip(f"real-world OAI-PMH responses not found at {REALWORLD}")
    files = sorted(p.name for p in (REALWORLD / "files").iterdir())
    assert sorted(r.path.name for c in CASES for r in c.pages) == files
    assert {c.name for c in LIST_RECORDS} >= ON_POSTGRES
