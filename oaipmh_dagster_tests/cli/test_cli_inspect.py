"""`identify`, `sets` and `formats`: looking at an endpoint before adding it (a loopback
OAI-PMH server; bad endpoints give one line on stderr, exit 1 and nothing on stdout)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from oaipmh_dagster.demo.dataset import make_dataset
from oaipmh_dagster_tests.oaiserver import FaultyOAIServer

COMMANDS = (["identify"], ["sets"], ["sets", "--json"], ["formats"], ["formats", "--json"],
            ["identify", "--json"])


@pytest.fixture(scope="module")
def server() -> Iterator[FaultyOAIServer]:
    srv = FaultyOAIServer(make_dataset(10, seed=1, sets=12), page_size=5).start()
    yield srv
    srv.stop()


@pytest.fixture
def faulty() -> Iterator[FaultyOAIServer]:
    srv = FaultyOAIServer(make_dataset(5, seed=2), page_size=5).start()
    yield srv
    srv.stop()


def test_identify_table(run, server: FaultyOAIServer) -> None:
    r = run("identify", server.base_url)
    assert r.code == 0, r.err
    assert r.err == ""
    for label in ("repository name", "base URL", "protocol version", "granularity",
                  "earliest datestamp", "deleted records", "admin emails", "compression"):
        assert label in r.out
    assert "Demo Research Repository" in r.out
    assert "YYYY-MM-DDThh:mm:ssZ" in r.out and "gzip" in r.out and "2.0" in r.out


def test_identify_json(run, server: FaultyOAIServer) -> None:
    r = run("identify", server.base_url, "--json")
    assert r.code == 0, r.err
    data = json.loads(r.out)
    assert set(data) == {"repository_name", "base_url", "protocol_version", "granularity",
                         "earliest_datestamp", "deleted_record", "admin_emails", "compression"}
    assert data["repository_name"] == "Demo Research Repository"
    assert data["base_url"] == server.base_url and data["protocol_version"] == "2.0"
    assert data["granularity"] == "YYYY-MM-DDThh:mm:ssZ"
    assert data["earliest_datestamp"].endswith("Z")
    assert data["admin_emails"] and data["compression"] == ["gzip"]
    assert data["deleted_record"] in ("no", "persistent", "transient")


def test_sets_follow_every_page(run, server: FaultyOAIServer) -> None:
    server.clear_log()
    r = run("sets", server.base_url, "--json")
    assert r.code == 0, r.err
    items = json.loads(r.out)
    assert [(i["spec"], i["name"]) for i in items] == list(server.dataset.sets.items())
    assert len(items) > 5  # more than one page of five
    assert sum(e.verb == "ListSets" for e in server.requests) == -(-len(items) // 5)
    r = run("sets", server.base_url)
    assert r.code == 0, r.err
    assert "setSpec" in r.out and "setName" in r.out
    assert "publications:articles" in r.out and "Journal articles" in r.out
    assert f"{len(items)} sets" in r.out


def test_sets_of_an_endpoint_without_sets(run) -> None:
    with FaultyOAIServer(make_dataset(3, sets=0)) as srv:
        srv.start()
        r = run("sets", srv.base_url)
        assert r.code == 0, r.err
        assert "no sets" in r.out
        r = run("sets", srv.base_url, "--json")
        assert r.code == 0 and json.loads(r.out) == []


def test_formats(run, server: FaultyOAIServer) -> None:
    r = run("formats", server.base_url, "--json")
    assert r.code == 0, r.err
    items = json.loads(r.out)
    assert [i["prefix"] for i in items] == ["oai_dc", "datacite"]
    assert all(set(i) == {"prefix", "schema", "namespace"} for i in items)
    assert items[0]["namespace"] == "http://www.openarchives.org/OAI/2.0/oai_dc/"
    r = run("formats", server.base_url)
    assert r.code == 0, r.err
    assert "metadataPrefix" in r.out and "schema" in r.out and "namespace" in r.out
    assert "oai_dc.xsd" in r.out


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_unreachable_endpoint(run, closed_port_url: str, argv: list[str]) -> None:
    r = run(*argv[:1], closed_port_url, *argv[1:], "--timeout", "5")
    assert r.code == 1
    assert closed_port_url in r.error_line
    assert r.out == ""


@pytest.mark.parametrize("argv", [["identify"], ["harvester", "add", "x", "--prefix", "oai_dc",
                                                "--url"]], ids=" ".join)
def test_unreachable_endpoint_in_a_process(sqlite_url: str, closed_port_url: str,
                                           argv: list[str]) -> None:
    """A real process: the client's retry notes stay off stderr."""
    from oaipmh_dagster_tests.cli.test_cli_errors import run_process

    r = run_process(*argv, closed_port_url, "--timeout", "5")
    assert r.code == 1
    assert closed_port_url in r.error_line
    assert r.out == ""


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
@pytest.mark.parametrize(("fault", "params", "needle"), [
    ("html", {}, "HTML"),
    ("malformed", {"body": "<OAI-PMH><unclosed"}, ""),
    ("oai_error", {"code": "badVerb", "message": "No such verb."}, "badVerb"),
    ("status", {"status": 404, "body": "not here"}, "404"),
])
def test_not_an_oai_endpoint(run, faulty: FaultyOAIServer, argv: list[str], fault: str,
                             params: dict, needle: str) -> None:
    faulty.faults.add(fault, times=None, **params)
    r = run(*argv[:1], faulty.base_url, *argv[1:], "--timeout", "5")
    assert r.code == 1
    line = r.error_line
    assert needle in line and faulty.base_url in line
    assert r.out == ""


@pytest.mark.parametrize("verb", ["identify", "sets", "formats"])
@pytest.mark.parametrize(("argv", "needle"), [
    (["ftp://x.org/oai"], "http or https"),
    (["not a url"], "URL"),
    ([], "URL"),
    (["http://127.0.0.1:9/oai", "--timeout", "0"], "timeout"),
    (["http://127.0.0.1:9/oai", "--timeout", "x"], "timeout"),
])
def test_bad_input(run, verb: str, argv: list[str], needle: str) -> None:
    r = run(verb, *argv)
    assert r.code == 2
    assert needle in r.error_line
    assert r.out == ""
