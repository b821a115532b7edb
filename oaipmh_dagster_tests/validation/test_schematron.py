"""ISO Schematron beside XML Schema: `--validate schematron:PATH` stores the absolute
path, a file that does not compile is one clear line at add time with nothing written,
failed assertions become per-record errors of type `schematron` (text and location),
kept records are not failed, and `schema_valid` counts them."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Callable
from pathlib import Path

import dagster as dg
import pytest

from oaipmh_dagster.defs.schema_check import schema_check_result
from oaipmh_dagster.harvesting.harvest import HarvestError, harvest
from oaipmh_dagster.oai import ClientOptions
from oaipmh_dagster.operations.admin import AdminError, add_harvester, update_harvester
from oaipmh_dagster.storage import db
from oaipmh_dagster.storage.registry import Harvester, InvalidHarvester, Registry
from oaipmh_dagster.storage.store import Store
from oaipmh_dagster.transform.validation import SchemaError, Validator, check_schema
from oaipmh_dagster_tests.conftest import Result
from oaipmh_dagster_tests.oaiserver import FaultyOAIServer as OAIServer
from oaipmh_dagster_tests.validation.served import DC, dataset

URL = "http://127.0.0.1:9/oai"
FAST = ClientOptions(max_retries=1, backoff_base=0.01, backoff_max=0.05, read_timeout=5)
SCH = """<?xml version="1.0"?>
<schema xmlns="http://purl.oclc.org/dsdl/schematron">
  <ns prefix="oai_dc" uri="http://www.openarchives.org/OAI/2.0/oai_dc/"/>
  <ns prefix="dc" uri="http://purl.org/dc/elements/1.1/"/>
  <pattern>
    <rule context="/oai_dc:dc">
      <assert test="dc:title">A record has a title.</assert>
    </rule>
    <rule context="dc:title">
      <assert test="string-length(normalize-space()) &gt; 2">A title is longer than two
        characters: '<value-of select="."/>' is not.</assert>
      <report test="@xml:lang">A title with a language (a report, no error).</report>
    </rule>
  </pattern>
</schema>
"""
# Served records that fail SCH: no title, and a typo for the title.
FAILING = {"oai:t:dc-2", "oai:t:dc-3"}


@pytest.fixture(autouse=True)
def _no_reload(monkeypatch: pytest.MonkeyPatch) -> None:
    from oaipmh_dagster.operations import reload

    monkeypatch.setattr(reload, "reload_code_location", lambda **_: (True, "reloaded"))


@pytest.fixture
def sch(tmp_path: Path) -> Path:
    path = tmp_path / "dc.sch"
    path.write_text(SCH)
    return path


def test_failed_assertions_are_errors_with_text_and_location(sch: Path) -> None:
    validate = Validator(f"schematron:{sch}")
    assert validate.token.startswith(f"schematron:{sch}@")
    assert validate(DC.format('<dc:title xml:lang="en">Long enough</dc:title>')) == []
    assert validate(DC.format("")) == [{
        "type": "schematron", "message": "A record has a title.", "location": "/oai_dc:dc",
        "test": "dc:title"}]
    errors = validate(DC.format("<dc:title>Ab</dc:title><dc:title>Abc</dc:title>"
                                "<dc:title>X</dc:title>"))
    assert [e["location"] for e in errors] == ["/oai_dc:dc/dc:title[1]",
                                               "/oai_dc:dc/dc:title[3]"]
    assert errors[0]["message"] == ("A title is longer than two characters: 'Ab' is not.")
    assert validate("<oai_dc:dc")[0]["type"] == "schematron"  # not well-formed


def test_many_failed_assertions_are_capped(sch: Path) -> None:
    from oaipmh_dagster.transform.schematron import MAX_ASSERTIONS

    errors = Validator(f"schematron:{sch}")(DC.format("<dc:title>x</dc:title>" * 8))
    assert len(errors) == MAX_ASSERTIONS
    assert errors[-1]["message"].endswith(f"(and {8 - MAX_ASSERTIONS} more failed assertions)")


@pytest.mark.parametrize(("text", "needle"), [
    (SCH.replace('test="dc:title"', 'test="(("'), "does not compile"),
    ("<notschematron/>", "does not compile"),
    ("<schema", "cannot read schematron"),
    (SCH.replace("<pattern>", '<include href="http://example.org/x.sch"/><pattern>'),
     "only local files are loaded"),
])
def test_a_schematron_that_does_not_compile_is_one_line_and_writes_nothing(
        sqlite_url: str, tmp_path: Path, text: str, needle: str,
        run: Callable[..., Result]) -> None:
    bad = tmp_path / "bad.sch"
    bad.write_text(text)
    with pytest.raises(SchemaError, match=needle):
        check_schema(f"schematron:{bad}")
    r = run("harvester", "add", "x", "--url", URL, "--prefix", "oai_dc", "--no-check",
            "--validate", f"schematron:{bad}")
    assert r.code == 2 and needle in r.err and len(r.err.strip().splitlines()) == 1, r.err
    assert Registry(db.get_engine()).list() == []  # nothing written
    with pytest.raises(HarvestError, match=needle):  # at harvest time, before any request
        harvest(Harvester(id="x", base_url=URL, metadata_prefix="oai_dc",
                          schema=f"schematron:{bad}"), Store(), run_id="r")


def test_add_stores_the_absolute_path_and_refuses_a_missing_file(
        sqlite_url: str, sch: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    registry = Registry(db.get_engine())
    monkeypatch.chdir(tmp_path)
    done = add_harvester(registry, "s", url=URL, prefix="oai_dc", check=False,
                         validate="schematron:dc.sch")
    assert done.harvester.schema == f"schematron:{sch.resolve()}"
    with pytest.raises(AdminError, match="schematron file /nonexistent.sch does not exist"):
        update_harvester(registry, "s", validate="schematron:/nonexistent.sch")
    assert registry.get("s").schema == f"schematron:{sch.resolve()}"
    with pytest.raises(InvalidHarvester, match="invalid schema"):
        Harvester(id="r", base_url=URL, metadata_prefix="oai_dc", schema="schematron:rel.sch")


def test_a_harvest_keeps_the_failing_records_and_schema_valid_counts_them(
        database_url: str, sch: Path) -> None:
    store = Store()
    h = Harvester(id="sv", base_url=URL, metadata_prefix="oai_dc",
                  schema=f"schematron:{sch}")
    with OAIServer(dataset("oai_dc"), page_size=2) as srv:
        h = h.replace(base_url=srv.base_url)
        stats = harvest(h, store, run_id="r1", options=FAST)
    assert stats.new == 4 and stats.failed == 0  # invalid is not failed
    records = {r["oai_identifier"]: r for r in store.iter_records("sv")}
    flagged = {i for i, r in records.items()
               if any(e["type"] == "schematron" for e in r["errors"])}
    assert flagged == FAILING
    assert all(r["metadata"] is not None for r in records.values())  # still transformed
    assert store.counts("sv")["failed"] == 0 and store.failed_identifiers("sv") == []
    found = store.schema_invalid("sv")
    assert found.count == 2
    assert found.sample == [("oai:t:dc-2", "A record has a title."),
                            ("oai:t:dc-3", "A record has a title.")]
    check = schema_check_result(store, h, dg.AssetKey(["oaipmh", "sv", "raw_records"]))
    assert not check.passed and check.metadata["invalid"].value == 2


def test_a_schematron_reads_no_url(tmp_path: Path) -> None:
    """document() of a URL in an assertion is refused: no request leaves, the record
    gets a schematron error."""
    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the http.server hook
            hits.append(self.path)
            body = b"<ok/>"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}/list.xml"
        path = tmp_path / "net.sch"
        path.write_text(SCH.replace('test="dc:title"', f"test=\"document('{url}')/ok\""))
        errors = Validator(f"schematron:{path}")(DC.format("<dc:title>Title</dc:title>"))
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(timeout=5)
    assert hits == []
    assert errors and all(e["type"] == "schematron" for e in errors)
