"""Security: XXE and billion-laughs payloads in every verb's response are refused; endpoint
credentials come from the environment variable the harvester row names, go only to the
base host and never show up in logs, run config, tags, metadata or exceptions; URLs are
logged without userinfo; SQL is parameterized; ids, prefixes and sets are validated before
they reach a Dagster name or a URL."""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import threading
import tracemalloc
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import sqlalchemy as sa

from oaipmh_dagster.demo.dataset import ServedRecord, make_dataset
from oaipmh_dagster.harvesting.harvest import CredentialsError, HarvestError, RunOptions, harvest
from oaipmh_dagster.harvesting.rows import write_page
from oaipmh_dagster.oai import OAIClient, OAIDataError, OAIError, OAIHTTPStatusError
from oaipmh_dagster.storage import db
from oaipmh_dagster.storage.registry import Harvester, InvalidHarvester, Registry, harvester_table
from oaipmh_dagster.storage.store import Store
from oaipmh_dagster_tests.helpers import add_harvester, expected_snapshot
from oaipmh_dagster_tests.oaiserver import FaultyOAIServer as OAIServer
from oaipmh_dagster_tests.reliability.conftest import FAST
from oaipmh_dagster_tests.reliability.conftest import harvester as _h

VERBS = ("Identify", "ListMetadataFormats", "ListSets", "ListIdentifiers", "ListRecords",
         "GetRecord")
AUTH_ENV = "OAIPMH_AUTH_RELIABILITY"


@pytest.fixture
def server() -> Iterator[OAIServer]:
    with OAIServer(make_dataset(120, seed=17), page_size=40) as srv:
        yield srv


def _call_verb(client: OAIClient, verb: str, server: OAIServer) -> Any:
    """Issue `verb` through the client and consume the answer."""
    ident = next(iter(server.dataset)).identifier
    calls: dict[str, Callable[[], Any]] = {
        "Identify": client.identify,
        "ListMetadataFormats": client.list_metadata_formats,
        "ListSets": lambda: list(client.list_sets()),
        "ListIdentifiers": lambda: list(client.list_identifiers("oai_dc")),
        "ListRecords": lambda: list(client.list_records("oai_dc")),
        "GetRecord": lambda: client.get_record(ident, "oai_dc"),
    }
    return calls[verb]()


def _secret_file(tmp_path: Path) -> tuple[Path, str]:
    secret = f"TOP-SECRET-{uuid.uuid4().hex}"
    path = tmp_path / "secret.txt"
    path.write_text(secret + "\n")
    return path, secret


def _store_text(store: Store, harvester_id: str) -> str:
    """Everything the store holds about a harvester, as one string."""
    items = list(store.iter_records(harvester_id, with_raw=True))
    return json.dumps(items, default=str) + json.dumps(store.state(harvester_id), default=str)


# -- XXE and billion laughs --------------------------------------------------------------


@pytest.mark.parametrize("verb", VERBS)
def test_xxe_local_file_in_every_verb(verb: str, server: OAIServer, tmp_path: Path,
                                      caplog: pytest.LogCaptureFixture) -> None:
    """A DOCTYPE declaring an external entity to a local file, in the answer to `verb`:
    refused with a OAIDataError (not retried); the file's content is in no result, message or
    log line."""
    path, secret = _secret_file(tmp_path)
    server.faults.add("xxe", verb=verb, path=str(path), times=None)
    caplog.set_level(logging.DEBUG)
    with OAIClient(server.base_url, FAST) as client, \
            pytest.raises(OAIDataError, match="declares XML entities") as err:
        _call_verb(client, verb, server)
    assert secret not in str(err.value) and secret not in caplog.text
    assert sum(1 for r in server.requests if r.fault == "xxe") == 1


def test_xxe_to_a_url_is_never_fetched(server: OAIServer,
                                       caplog: pytest.LogCaptureFixture) -> None:
    """An external entity pointing at a URL: refused, and nothing asks that URL."""
    with OAIServer(make_dataset(5, seed=1)) as bait:
        for verb in VERBS:
            server.faults.add("xxe", verb=verb, url=f"{bait.base_url}?verb=Identify&leak=1")
            with OAIClient(server.base_url, FAST) as client, pytest.raises(OAIDataError):
                _call_verb(client, verb, server)
        assert bait.requests == []


@pytest.mark.parametrize("verb", VERBS)
def test_billion_laughs_in_every_verb(verb: str, server: OAIServer) -> None:
    """Ten levels of ten-fold entities (10^10 'lol's if expanded) in the answer to `verb`:
    refused before any expansion; memory stays bounded."""
    server.faults.add("billion_laughs", verb=verb, levels=10, width=10, times=None)
    tracemalloc.start()
    try:
        with OAIClient(server.base_url, FAST) as client, \
                pytest.raises(OAIDataError, match="declares XML entities"):
            _call_verb(client, verb, server)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 20_000_000, f"peak {peak} bytes"


@pytest.mark.parametrize("payload", ["xxe", "billion_laughs"])
def test_entities_hidden_behind_a_long_prologue(payload: str, server: OAIServer,
                                                tmp_path: Path) -> None:
    """The DOCTYPE pushed 100 kB down by a comment (past any quick scan of the head):
    still refused after the hardened parse, nothing expanded, nothing read."""
    path, secret = _secret_file(tmp_path)
    if payload == "xxe":
        doctype = f'<!DOCTYPE OAI-PMH [<!ENTITY e SYSTEM "file://{path}">]>'
    else:
        ents = ['<!ENTITY e0 "lol">'] + [f'<!ENTITY e{i} "{f"&e{i - 1};" * 10}">'
                                         for i in range(1, 10)]
        doctype = f"<!DOCTYPE OAI-PMH [{''.join(ents)}]>".replace("e9", "e")
    body = ('<?xml version="1.0" encoding="UTF-8"?>\n<!--' + "x" * 100_000 + "-->\n" + doctype
            + '<OAI-PMH xmlns="http://www.openarchives.org/OAI/2.0/"><responseDate>'
            "2024-01-01T00:00:00Z</responseDate><request verb=\"Identify\">u</request>"
            "<Identify><repositoryName>&e;</repositoryName><baseURL>http://x/</baseURL>"
            "<protocolVersion>2.0</protocolVersion><adminEmail>a@b.c</adminEmail>"
            "<earliestDatestamp>2000-01-01</earliestDatestamp><deletedRecord>no"
            "</deletedRecord><granularity>YYYY-MM-DD</granularity></Identify></OAI-PMH>")
    server.faults.add("malformed", verb="Identify", body=body, times=None)
    tracemalloc.start()
    try:
        with OAIClient(server.base_url, FAST) as client, pytest.raises(OAIDataError) as err:
            client.identify()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert secret not in str(err.value) and peak < 20_000_000


@pytest.mark.parametrize("verb", ["Identify", "ListRecords", "GetRecord"])
def test_xxe_through_harvest_reaches_neither_store_nor_logs(
        verb: str, database_url: str, server: OAIServer, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """The verbs a harvest uses, each answered with an XXE payload (ListRecords on page 2):
    the harvest fails with the OAIDataError; the store holds only clean pages; the secret is
    nowhere in the store, the state, the exception or the logs."""
    path, secret = _secret_file(tmp_path)
    page = 2 if verb == "ListRecords" else None
    server.faults.add("xxe", verb=verb, page=page, path=str(path), times=None)
    caplog.set_level(logging.DEBUG)
    store = Store()
    oai_ids = [next(iter(server.dataset)).identifier] if verb == "GetRecord" else ()
    with pytest.raises(OAIDataError) as err:
        harvest(_h(server), store, RunOptions(oai_ids=oai_ids), run_id="r1", options=FAST)
    assert secret not in str(err.value) and secret not in caplog.text
    assert secret not in _store_text(store, "r")
    assert len(store.snapshot("r")) == (40 if verb == "ListRecords" else 0)
    assert store.state("r")["status"] == "failed"


# -- credentials -------------------------------------------------------------------------


class _Redirector(BaseHTTPRequestHandler):
    """Answers every GET with 302 to the same path and query on `target`; logs headers."""

    target = ""
    seen: list[dict[str, str]] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server naming
        type(self).seen.append(dict(self.headers.items()))
        query = self.path.partition("?")[2]
        self.send_response(302)
        self.send_header("Location", f"{self.target}?{query}")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass


@pytest.fixture
def redirect_to_other_host(server: OAIServer) -> Iterator[tuple[str, OAIServer, list]]:
    """(base URL on 127.0.0.1 that redirects, the OAI server on 127.0.0.2, header log)."""
    with OAIServer(server.dataset, page_size=40, host="127.0.0.2") as other:
        handler = type("Redirector", (_Redirector,), {"target": other.base_url, "seen": []})
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                  daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{httpd.server_port}/oai", other, handler.seen
        finally:
            httpd.shutdown()
            httpd.server_close()
            thread.join(5)


SECRETS = {
    "basic": ("harvest-user:pa55-S3CRET-9f2c", "Basic "
              + base64.b64encode(b"harvest-user:pa55-S3CRET-9f2c").decode()),
    "bearer": ("Bearer tok-S3CRET-77ab31", "Bearer tok-S3CRET-77ab31"),
}


def _leaks(text: str, value: str) -> list[str]:
    """The secret parts of `value` (password, token, encoded header) found in `text`."""
    parts = [value.partition(":")[2] if not value.startswith("Bearer") else value[7:],
             base64.b64encode(value.encode()).decode()]
    return [p for p in parts if p and p in text]


@pytest.mark.parametrize("kind", ["basic", "bearer"])
def test_credentials_sent_to_base_host_only(kind: str, sqlite_url: str, server: OAIServer,
                                            redirect_to_other_host: tuple,
                                            monkeypatch: pytest.MonkeyPatch,
                                            caplog: pytest.LogCaptureFixture) -> None:
    """auth_env names the variable holding 'user:password' or 'Bearer <token>': every
    request to the base host carries it; after a redirect to another host none does;
    neither the logs nor the stats show it."""
    value, header = SECRETS[kind]
    monkeypatch.setenv(AUTH_ENV, value)
    caplog.set_level(logging.DEBUG)
    store = Store()
    stats = harvest(_h(server, auth_env=AUTH_ENV), store, run_id="r1", options=None)
    assert stats.records == len(server.dataset)
    assert all(r.headers.get("Authorization") == header for r in server.requests)

    base, other, seen = redirect_to_other_host
    h = Harvester(id="redir", base_url=base, metadata_prefix="oai_dc", auth_env=AUTH_ENV)
    stats = harvest(h, store, run_id="r2")
    assert store.snapshot("redir") == expected_snapshot(other.dataset)
    assert seen and all(s.get("Authorization") == header for s in seen)
    assert other.requests and all("Authorization" not in r.headers for r in other.requests)
    everything = caplog.text + json.dumps(dataclasses.asdict(stats), default=str) + _store_text(store, "redir")
    assert not _leaks(everything, value)


def test_credentials_never_in_exceptions(sqlite_url: str, server: OAIServer,
                                         monkeypatch: pytest.MonkeyPatch,
                                         caplog: pytest.LogCaptureFixture) -> None:
    """A protected endpoint that refuses (401), a missing variable and a malformed value:
    each fails with a clear message that names the variable, never its value."""
    value = SECRETS["basic"][0]
    monkeypatch.setenv(AUTH_ENV, value)
    caplog.set_level(logging.DEBUG)
    server.faults.add("status", status=401, times=None, body="Unauthorized\n")
    with pytest.raises(OAIHTTPStatusError, match="HTTP 401") as err:
        harvest(_h(server, auth_env=AUTH_ENV), Store(), run_id="r1", options=FAST)
    assert not _leaks(str(err.value) + repr(err.value) + caplog.text, value)
    monkeypatch.delenv(AUTH_ENV)
    with pytest.raises(CredentialsError, match=AUTH_ENV):
        harvest(_h(server, auth_env=AUTH_ENV), Store(), run_id="r2", options=None)
    monkeypatch.setenv(AUTH_ENV, "no-colon-S3CRET")
    with pytest.raises(CredentialsError) as bad:
        harvest(_h(server, auth_env=AUTH_ENV), Store(), run_id="r3", options=None)
    assert "S3CRET" not in str(bad.value) and AUTH_ENV in str(bad.value)


def test_credentials_never_in_dagster_run(database_url: str, server: OAIServer,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the Dagster job, a successful and a refused (401) run: the secret is in no run
    config, tag, materialization metadata, log message or failure of the event log."""
    from dagster._serdes import serialize_value

    from oaipmh_dagster_tests.defs.test_job import _run as run_job

    value = SECRETS["basic"][0]
    monkeypatch.setenv(AUTH_ENV, value)
    h = add_harvester("sec", server.base_url, auth_env=AUTH_ENV)
    with dg.instance_for_test() as instance:
        ok = run_job(h, instance)
        assert ok.success
        assert all(r.headers.get("Authorization") == SECRETS["basic"][1]
                   for r in server.requests)
        server.faults.add("status", status=401, times=None, body="Unauthorized\n")
        refused = run_job(h, instance, {"full": True, "resume": False})
        assert not refused.success
        for result in (ok, refused):
            run = instance.get_run_by_id(result.run_id)
            text = json.dumps(run.run_config) + json.dumps(run.tags)
            text += "".join(serialize_value(e) for e in instance.all_logs(result.run_id))
            assert "HTTP 401" in text or result is ok
            assert not _leaks(text, value), result.run_id


def test_urls_logged_without_userinfo(server: OAIServer,
                                      caplog: pytest.LogCaptureFixture) -> None:
    """Credentials in a base URL given to the client are used as basic auth, but every
    logged or raised URL is without them; the registry refuses such URLs outright."""
    url = server.base_url.replace("http://", "http://urluser:url-S3CRET@")
    caplog.set_level(logging.DEBUG)
    server.faults.add("status", verb="Identify", status=503, headers={"Retry-After": "0"})
    server.faults.add("status", verb="ListRecords", status=500, times=None)
    with OAIClient(url, FAST) as client:
        assert "S3CRET" not in client.base_url and "S3CRET" not in repr(client)
        client.identify()
        with pytest.raises(OAIError) as err:
            list(client.list_records("oai_dc"))
    assert "retry 1/" in caplog.text and server.base_url in caplog.text
    assert "S3CRET" not in caplog.text and "urluser" not in caplog.text
    assert "S3CRET" not in str(err.value)
    expected = "Basic " + base64.b64encode(b"urluser:url-S3CRET").decode()
    assert server.requests[0].headers.get("Authorization") == expected
    with pytest.raises(InvalidHarvester) as bad:
        Harvester(id="x", base_url=url, metadata_prefix="oai_dc")
    assert "S3CRET" not in str(bad.value)


# -- SQL and validation ---------------------------------------------------------------------

NASTY = [
    "oai:x:1'; DROP TABLE oaipmh_record; --",
    'oai:x:2" OR "1"="1',
    "oai:x:3'); DELETE FROM oaipmh_harvester; --",
    "oai:x:4\\'; SELECT pg_sleep(10); --",
    "oai:x:5 %s %(name)s :param ? $1",
]


def test_quotes_and_sql_fragments_round_trip(database_url: str) -> None:
    """Identifiers and set specs with quotes and SQL fragments are stored and read back
    verbatim (harvest, oai_ids, store queries); no table is touched."""
    from datetime import UTC, datetime

    ds = make_dataset(30, seed=2)
    template = next(r for r in ds if not r.deleted).metadata["oai_dc"]
    for i, ident in enumerate(NASTY):
        ds.add(ServedRecord(ident, datetime(2025, 1, 1, 0, 0, i, tzinfo=UTC),
                            ("it's'; DROP TABLE oaipmh_harvest_state; --", 'q"uote'),
                            metadata={"oai_dc": template}))
    registry = Registry()
    with OAIServer(ds, page_size=7) as srv:
        h = add_harvester("sqlsafe", srv.base_url)
        store = Store()
        stats = harvest(h, store, run_id="r1'; --", options=FAST)
        assert store.snapshot("sqlsafe") == expected_snapshot(ds)
        again = harvest(h, store, RunOptions(oai_ids=NASTY), run_id="r2", options=FAST)
        assert again.unchanged == len(NASTY)
    assert stats.records == 35
    items = {i["oai_identifier"]: i for i in store.iter_records("sqlsafe")}
    for ident in NASTY:
        assert items[ident]["sets"][0].startswith("it's'; DROP") and items[ident]["run_id"] == \
            "r1'; --"
    # The store does not validate harvester ids itself; a hostile one still round-trips.
    hostile = "x'; DROP TABLE oaipmh_record; --"
    rec = next(iter(store_records_for_upsert(ds)))
    write_page(store, hostile, [rec], run_id="r")
    assert list(store.snapshot(hostile)) == [rec.header.identifier]
    assert store.count("sqlsafe", live_only=False) == 35
    assert registry.get("sqlsafe").id == "sqlsafe"
    inspector = sa.inspect(db.get_engine())
    assert {"oaipmh_record", "oaipmh_harvest_state", "oaipmh_harvester"} <= set(
        inspector.get_table_names())


def store_records_for_upsert(ds: Any) -> Iterator[Any]:
    """oai.Record objects for records of `ds`, parsed from a GetRecord answer."""
    with OAIServer(ds) as srv, OAIClient(srv.base_url, FAST) as client:
        yield client.get_record(NASTY[0], "oai_dc")


@pytest.mark.parametrize("field,value", [
    ("id", "Bad-Id"), ("id", "a'; drop table x; --"), ("id", "../etc"), ("id", "a" * 49),
    ("id", "x y"), ("metadata_prefix", "oai_dc&verb=Identify"),
    ("metadata_prefix", "oai dc"), ("sets", ("a&set=b",)), ("sets", ("x'; --",)),
    ("sets", ("a/../b",)), ("base_url", "file:///etc/passwd"),
    ("base_url", "http://h/oai#frag"), ("auth_env", "X; rm -rf /"),
])
def test_ids_prefixes_sets_validated(field: str, value: object) -> None:
    """What becomes part of a Dagster name (id) or a request URL (prefix, sets, URL) is
    validated when the row is built; bad values never get that far."""
    fields: dict[str, Any] = {"id": "ok", "base_url": "http://127.0.0.1/oai",
                              "metadata_prefix": "oai_dc", field: value}
    with pytest.raises(InvalidHarvester):
        Harvester(**fields)


def test_run_config_sets_are_validated(sqlite_url: str, server: OAIServer) -> None:
    """Sets given per run (run config `sets`) pass the same check as the row's before any
    request is made."""
    with pytest.raises(HarvestError, match="invalid set spec"):
        harvest(_h(server), Store(), RunOptions(sets=["ok", "a&verb=Identify"]), run_id="r1",
                options=FAST)
    assert server.requests == []
    assert Store().state("r") is None


def test_invalid_rows_never_become_dagster_names(sqlite_url: str,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    """A row edited by hand to an invalid id or prefix is left out of the code location
    (logged), the valid rows are loaded."""
    from oaipmh_dagster.definitions import build_definitions, load_harvesters

    add_harvester("good", "http://127.0.0.1:9/oai")
    good = Registry().get("good").to_dict()
    rows = [{**good, "id": "bad'; drop", "name": "bad"},
            {**good, "id": "bad2", "metadata_prefix": "x&verb=Identify"}]
    with db.get_engine().begin() as conn:
        for row in rows:
            row = {k: v for k, v in row.items() if k not in ("created", "updated")}
            conn.execute(harvester_table.insert().values(
                **row, created=Registry().get("good").created,
                updated=Registry().get("good").created))
    harvesters = load_harvesters()
    assert [h.id for h in harvesters] == ["good"]
    assert "bad'; drop" in caplog.text and "bad2" in caplog.text
    jobs = [j.name for j in build_definitions(harvesters).resolve_all_job_defs()
            if not j.name.startswith("__") and j.name != "manage_harvesters"]
    assert jobs == ["harvest_oaipmh_records_good"]
