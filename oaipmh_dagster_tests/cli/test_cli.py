"""The `oaipmh-dagster` command as users see it: output, one error line on stderr, exit codes,
and nothing written on bad input (both databases, a real loopback OAI-PMH server)."""

from __future__ import annotations

import io
import json
import os
import sys
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from oaipmh_dagster.demo.dataset import make_dataset
from oaipmh_dagster.demo.server import OAIServer
from oaipmh_dagster.harvesting.rows import write_page
from oaipmh_dagster.storage import db
from oaipmh_dagster.storage.registry import Harvester, Registry
from oaipmh_dagster.storage.store import Store
from oaipmh_dagster_tests.conftest import Result
from oaipmh_dagster_tests.storage.test_registry import JSON_KEYS
from oaipmh_dagster_tests.storage.test_store import rec, title_of


@pytest.fixture(scope="module")
def server() -> Iterator[OAIServer]:
    srv = OAIServer(make_dataset(23, seed=7), page_size=5).start()
    yield srv
    srv.stop()


def registry() -> Registry:
    return Registry(db.get_engine())


def registered() -> list[dict]:
    return [h.to_dict() for h in registry().list()]


def add(run, hid: str = "demo", *extra: str, url: str = "http://127.0.0.1:9/oai") -> Result:
    return run("harvester", "add", hid, "--url", url, "--prefix", "oai_dc", "--no-check", *extra)


# -- init and add -------------------------------------------------------------------


def test_init(run, database_url: str) -> None:
    first = run("init")
    assert first.code == 0 and db.head_revision() in first.out
    second = run("init")
    assert second.code == 0 and db.head_revision() in second.out


def test_add_probes_the_server(run, database_url: str, server: OAIServer) -> None:
    server.clear_log()
    r = run("harvester", "add", "demo", "--url", server.base_url, "--prefix", "oai_dc",
            "--set", "publications", "--cron", "0 3 * * *", "--timezone", "Europe/Prague",
            "--disabled", "--max-retries", "2", "--timeout", "20", "--comment", "hi")
    assert r.code == 0, r.err
    assert "added harvester demo" in r.out
    assert "harvest_oaipmh_records_demo" in r.out
    verbs = [entry.verb for entry in server.requests]
    assert "Identify" in verbs and "ListMetadataFormats" in verbs and "ListSets" in verbs
    h = registry().get("demo")
    assert h.base_url == server.base_url and h.metadata_prefix == "oai_dc"
    assert h.sets == ("publications",) and h.cron == "0 3 * * *" and h.timezone == "Europe/Prague"
    assert not h.enabled and h.max_retries == 2 and h.timeout == 20 and h.comment == "hi"
    assert h.name == "Demo Research Repository"  # taken from Identify
    assert h.transformer == "oai_dc"


def test_add_loads_only_what_it_needs(database_url: str, closed_port_url: str) -> None:
    """`harvester add` with a plain cron and the default transformer, on a database
    already at the newest schema, imports neither Dagster (0.8 s), nor alembic, nor the
    transformers: it is the first part of add-to-visible at 10,000 harvesters."""
    import subprocess

    db.upgrade(db.get_engine())
    code = ("import sys\nfrom oaipmh_dagster import cli\n"
            "try:\n    cli.main(sys.argv[1:])\nexcept SystemExit as e:\n"
            "    assert not e.code, e.code\n"
            "print(sorted(m for m in ('dagster', 'alembic', 'oaipmh_dagster.transform', "
            "'pandas') if m in sys.modules))")
    env = {**os.environ, "OAIPMH_DAGSTER_WEBSERVER": closed_port_url.rsplit("/", 1)[0]}
    out = subprocess.run(
        [sys.executable, "-c", code, "harvester", "add", "plain", "--url",
         "http://127.0.0.1:9/oai", "--prefix", "oai_dc", "--cron", "17 3 * * 1-5",
         "--no-check"], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "[]", out.stdout
    assert registry().get("plain").cron == "17 3 * * 1-5"


def test_add_refuses_a_prefix_the_server_does_not_offer(run, database_url: str,
                                                        server: OAIServer) -> None:
    r = run("harvester", "add", "demo", "--url", server.base_url, "--prefix", "marc21")
    assert r.code == 2
    line = r.error_line
    assert "marc21" in line and "datacite" in line and "oai_dc" in line
    assert registered() == []


def test_add_no_check_skips_the_probe(run, database_url: str, server: OAIServer) -> None:
    server.clear_log()
    r = run("harvester", "add", "demo", "--url", server.base_url, "--prefix", "marc21",
            "--no-check", "--name", "Mine")
    assert r.code == 0, r.err
    assert server.requests == []
    assert registry().get("demo").name == "Mine"


def test_add_unreachable_server(run, database_url: str, closed_port_url: str) -> None:
    r = run("harvester", "add", "demo", "--url", closed_port_url, "--prefix", "oai_dc",
            "--timeout", "5")
    assert r.code == 1
    assert "--no-check" in r.error_line
    assert registered() == []


@pytest.fixture(scope="module")
def many_sets() -> Iterator[OAIServer]:
    srv = OAIServer(make_dataset(5, seed=1, sets=12), page_size=5).start()
    yield srv
    srv.stop()


def test_add_refuses_a_set_the_server_does_not_list(run, database_url: str,
                                                    many_sets: OAIServer) -> None:
    offered = list(many_sets.dataset.sets)
    assert len(offered) == 12
    r = run("harvester", "add", "demo", "--url", many_sets.base_url, "--prefix", "oai_dc",
            "--set", offered[3], "--set", "publicatons")
    assert r.code == 1
    line = r.error_line
    assert "'publicatons'" in line and f"'{offered[3]}'" not in line
    assert ", ".join(offered[:10]) + " and 2 more" in line  # every page was read
    assert offered[11] not in line.split("and 2 more")[0]
    assert "--no-check" in line
    assert r.out == "" and registered() == []
    r = run("harvester", "add", "demo", "--url", many_sets.base_url, "--prefix", "oai_dc",
            "--set", offered[3], "--set", offered[11])
    assert r.code == 0, r.err
    assert registry().get("demo").sets == (offered[3], offered[11])


def test_add_refuses_sets_when_the_server_has_none(run, database_url: str) -> None:
    with OAIServer(make_dataset(3, sets=0)) as srv:
        r = run("harvester", "add", "demo", "--url", srv.base_url, "--prefix", "oai_dc",
                "--set", "any")
        assert r.code == 1
        assert "does not support sets" in r.error_line
        assert registered() == []
        r = run("harvester", "add", "demo", "--url", srv.base_url, "--prefix", "oai_dc")
        assert r.code == 0, r.err


def test_add_set_no_check(run, database_url: str, many_sets: OAIServer) -> None:
    many_sets.clear_log()
    r = run("harvester", "add", "demo", "--url", many_sets.base_url, "--prefix", "oai_dc",
            "--set", "nosuch", "--no-check")
    assert r.code == 0, r.err
    assert many_sets.requests == []
    assert registry().get("demo").sets == ("nosuch",)


def test_update_checks_the_sets(run, database_url: str, many_sets: OAIServer) -> None:
    offered = list(many_sets.dataset.sets)
    add(run, "demo", "--set", offered[0], url=many_sets.base_url)
    before = registered()
    r = run("harvester", "update", "demo", "--set", "nosuch")
    assert r.code == 1
    assert "'nosuch'" in r.error_line and "and 2 more" in r.error_line
    assert r.out == "" and registered() == before
    many_sets.clear_log()
    r = run("harvester", "update", "demo", "--set", offered[5])
    assert r.code == 0, r.err
    assert "ListSets" in {e.verb for e in many_sets.requests}
    assert registry().get("demo").sets == (offered[5],)
    r = run("harvester", "update", "demo", "--set", "nosuch", "--no-check")
    assert r.code == 0, r.err
    assert registry().get("demo").sets == ("nosuch",)


def test_update_url_checks_the_kept_sets(run, database_url: str, many_sets: OAIServer) -> None:
    add(run, "demo", "--set", "nosuch")
    before = registered()
    r = run("harvester", "update", "demo", "--url", many_sets.base_url)
    assert r.code == 1
    assert "'nosuch'" in r.error_line
    assert registered() == before


@pytest.mark.parametrize(("argv", "code", "needle"), [
    (["Bad-Id", "--url", "http://x.org/oai", "--prefix", "oai_dc"], 2, "invalid harvester id"),
    (["_x", "--url", "http://x.org/oai", "--prefix", "oai_dc"], 2, "invalid harvester id"),
    (["a" * 49, "--url", "http://x.org/oai", "--prefix", "oai_dc"], 2, "invalid harvester id"),
    (["demo", "--url", "ftp://x.org/oai", "--prefix", "oai_dc"], 2, "http or https"),
    (["demo", "--url", "http://user:pass@x.org/oai", "--prefix", "oai_dc"], 2, "credentials"),
    (["demo", "--url", "http://x.org/oai#frag", "--prefix", "oai_dc"], 2, "fragment"),
    (["demo", "--url", "http://x.org/oai", "--prefix", "oai dc"], 2, "metadata prefix"),
    (["demo", "--url", "http://x.org/oai", "--prefix", "oai_dc", "--set", "a b"], 2, "set"),
    (["demo", "--url", "http://x.org/oai", "--prefix", "oai_dc", "--cron", "every day"], 2,
     "cron"),
    (["demo", "--url", "http://x.org/oai", "--prefix", "oai_dc", "--timezone", "Mars/Base"], 2,
     "timezone"),
    (["demo", "--url", "http://x.org/oai", "--prefix", "oai_dc", "--transformer", "nosuch"], 2,
     "unknown transformer"),
    (["demo", "--url", "http://x.org/oai", "--prefix", "oai_dc", "--transformer",
      "no_such_pkg.mod:func"], 2, "transformer"),
    (["demo", "--url", "http://x.org/oai", "--prefix", "oai_dc", "--transformer", "Bad-Name"],
     2, "transformer"),
    (["demo", "--url", "http://x.org/oai", "--prefix", "oai_dc", "--max-parallel", "0"], 2,
     "max_parallel"),
    (["demo", "--url", "http://x.org/oai", "--prefix", "oai_dc", "--auth-env", "A-B"], 2,
     "environment variable"),
    (["demo", "--url", "http://x.org/oai", "--prefix", "oai_dc", "--timeout", "abc"], 2,
     "timeout"),
    (["demo", "--prefix", "oai_dc"], 2, "--url"),
    (["demo", "--url", "http://x.org/oai"], 2, "--prefix"),
])
def test_add_bad_input(run, database_url: str, argv: list[str], code: int, needle: str) -> None:
    r = run("harvester", "add", *argv, "--no-check")
    assert r.code == code
    assert needle in r.error_line
    assert r.out == ""
    assert registered() == []


def test_add_credentials_not_echoed(run, database_url: str) -> None:
    r = run("harvester", "add", "demo", "--url", "http://alice:s3cret@x.org/oai",
            "--prefix", "oai_dc", "--no-check")
    assert r.code == 2 and "s3cret" not in r.err


def test_add_duplicate_id(run, database_url: str) -> None:
    assert add(run).code == 0
    before = registered()
    r = add(run, "demo", url="https://other.example.org/oai")
    assert r.code == 1
    assert "already exists" in r.error_line
    assert registered() == before


# -- list, show, update, remove --------------------------------------------------------


def test_list_and_show(run, database_url: str) -> None:
    r = run("harvester", "list")
    assert r.code == 0 and "no harvesters" in r.out
    assert json.loads(run("harvester", "list", "--json").out) == []
    add(run, "beta", "--set", "s1", "--set", "s2", "--cron", "*/10 * * * *")
    add(run, "alpha")
    r = run("harvester", "list")
    assert r.code == 0 and "alpha" in r.out and "s1,s2" in r.out
    items = json.loads(run("harvester", "list", "--json").out)
    assert [i["id"] for i in items] == ["alpha", "beta"]
    assert all(set(i) == JSON_KEYS | {"state"} for i in items)
    r = run("harvester", "show", "beta", "--json")
    assert r.code == 0
    shown = json.loads(r.out)
    assert set(shown) == JSON_KEYS | {"since"}
    assert shown["since"]["source"] == "none" and shown["since"]["since"] is None
    assert shown["sets"] == ["s1", "s2"] and shown["cron"] == "*/10 * * * *"
    assert shown["created"].endswith("Z")
    assert Harvester.from_dict(shown) == registry().get("beta")
    r = run("harvester", "show", "beta")
    assert r.code == 0 and "harvest_oaipmh_records_beta" in r.out


def test_show_unknown(run, database_url: str) -> None:
    r = run("harvester", "show", "nope")
    assert r.code == 1 and "nope" in r.error_line


def test_update(run, database_url: str, server: OAIServer) -> None:
    add(run, "demo", "--set", "a", "--cron", "0 1 * * *")
    r = run("harvester", "update", "demo", "--cron", "0 2 * * *", "--set", "b", "--set", "c",
            "--disabled", "--name", "New name", "--no-check")
    assert r.code == 0, r.err
    h = registry().get("demo")
    assert h.cron == "0 2 * * *" and h.sets == ("b", "c") and not h.enabled
    assert h.name == "New name"
    assert run("harvester", "update", "demo", "--no-cron", "--all-sets").code == 0
    h = registry().get("demo")
    assert h.cron is None and h.sets == ()
    # A new URL is probed like on add.
    server.clear_log()
    r = run("harvester", "update", "demo", "--url", server.base_url)
    assert r.code == 0, r.err
    assert {"Identify", "ListMetadataFormats"} <= {e.verb for e in server.requests}
    assert registry().get("demo").base_url == server.base_url


def test_update_prefix_says_what_becomes_of_the_transformer(run, database_url: str) -> None:
    add(run, "demo")
    r = run("harvester", "update", "demo", "--prefix", "datacite", "--no-check")
    assert r.code == 0, r.err
    assert "transformer follows the prefix: oai_dc -> datacite" in r.out
    assert registry().get("demo").transformer == "datacite"
    r = run("harvester", "update", "demo", "--prefix", "marc21", "--transformer", "oai_dc",
            "--no-check")
    assert r.code == 0, r.err
    assert registry().get("demo").transformer == "oai_dc"
    assert "note: transformer oai_dc reads oai_dc records, not marc21" in r.err


@pytest.mark.parametrize(("argv", "code"), [
    (["--cron", "bad cron"], 2),
    (["--timezone", "Nowhere/Land"], 2),
    (["--url", "ftp://x.org/oai"], 2),
    (["--url", "http://u:p@x.org/oai", "--no-check"], 2),
    (["--transformer", "nosuch"], 2),
    (["--set", "a", "--all-sets"], 2),
    (["--cron", "0 * * * *", "--no-cron"], 2),
    ([], 2),
    (["--prefix", "marc21"], 2),  # probed: the server does not offer it
])
def test_update_bad_input(run, database_url: str, server: OAIServer, argv: list[str],
                          code: int) -> None:
    add(run, "demo", url=server.base_url)
    before = registered()
    r = run("harvester", "update", "demo", *argv)
    assert r.code == code
    r.error_line  # noqa: B018 - asserts a single error line
    assert registered() == before


def test_update_unreachable_and_unknown(run, database_url: str, closed_port_url: str) -> None:
    add(run, "demo")
    before = registered()
    r = run("harvester", "update", "demo", "--url", closed_port_url, "--timeout", "5")
    assert r.code == 1 and r.error_line
    assert registered() == before
    r = run("harvester", "update", "nope", "--cron", "0 * * * *")
    assert r.code == 1 and "nope" in r.error_line


def test_remove_yes(run, database_url: str) -> None:
    add(run, "demo")
    add(run, "keep")
    store = Store(db.get_engine())
    write_page(store, "demo", [rec("a")], run_id="r")
    r = run("harvester", "remove", "demo", "--yes")
    assert r.code == 0 and "removed harvester demo" in r.out
    assert [h["id"] for h in registered()] == ["keep"]
    assert store.count("demo") == 1  # records are kept unless asked
    add(run, "demo")
    r = run("harvester", "remove", "demo", "--yes", "--delete-records")
    assert r.code == 0 and store.count("demo") == 0


def test_remove_without_yes_and_no_stdin(run, database_url: str,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    add(run, "demo")
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    r = run("harvester", "remove", "demo")
    assert r.code == 1
    assert "not removed" in r.error_line
    assert [h["id"] for h in registered()] == ["demo"]


def test_remove_confirmed_on_stdin(run, database_url: str,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    add(run, "demo")
    monkeypatch.setattr(sys, "stdin", io.StringIO("n\n"))
    assert run("harvester", "remove", "demo").code == 1
    assert len(registered()) == 1
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))
    assert run("harvester", "remove", "demo").code == 0
    assert registered() == []


def test_remove_unknown(run, database_url: str) -> None:
    r = run("harvester", "remove", "nope", "--yes")
    assert r.code == 1 and "nope" in r.error_line


def test_invalid_row(run, database_url: str) -> None:
    add(run, "good")
    add(run, "broken")
    engine = sa.create_engine(database_url)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE oaipmh_harvester SET cron = 'nope' WHERE id = 'broken'"))
    engine.dispose()
    r = run("harvester", "list")
    assert r.code == 0 and "INVALID" in r.out and "good" in r.out
    items = json.loads(run("harvester", "list", "--json").out)
    assert items[0]["id"] == "broken" and "cron" in items[0]["invalid"]
    assert items[1]["id"] == "good" and set(items[1]) == JSON_KEYS | {"state"}
    r = run("harvester", "show", "broken")
    assert r.code == 1 and "broken" in r.error_line
    r = run("harvester", "update", "broken", "--cron", "0 * * * *")
    assert r.code == 1 and "broken" in r.error_line
    r = add(run, "broken")
    assert r.code == 1 and "broken" in r.error_line
    r = run("harvester", "remove", "broken", "--yes")
    assert r.code == 0, r.err
    assert [h["id"] for h in registered()] == ["good"]


def test_usage_errors(run, database_url: str) -> None:
    r = run("nosuchcommand")
    assert r.code == 2 and r.error_line
    r = run("harvester", "show")
    assert r.code == 2 and r.error_line
    assert run("--help").code == 0


# -- records ------------------------------------------------------------------------


def test_records_json(run, database_url: str) -> None:
    add(run, "demo")
    store = Store(db.get_engine())
    write_page(store, "demo", [rec("oai:x:1", "2024-01-02T04:04:05+01:00", sets=("s1", "s2")),
                               rec("oai:x:2", deleted=True),
                               rec("oai:x:3")],
                      run_id="r1", transform=lambda raw, el: (
                          title_of(raw) if "x:3" not in raw else {}[raw]))
    r = run("records", "demo", "--json")
    assert r.code == 0, r.err
    items = json.loads(r.out)
    assert [i["oai_identifier"] for i in items] == ["oai:x:1", "oai:x:2", "oai:x:3"]
    for item in items:
        assert {"oai_identifier", "datestamp", "deleted", "sets", "metadata", "errors"} <= set(item)
        assert item["datestamp"].endswith("Z")
    one, two, three = items
    assert one["datestamp"] == "2024-01-02T03:04:05Z"
    assert one["sets"] == ["s1", "s2"] and one["metadata"] == {"title": "oai:x:1"}
    assert one["deleted"] is False and one["errors"] == []
    assert two["deleted"] is True and two["metadata"] is None
    assert three["metadata"] is None and three["errors"][0]["type"] == "KeyError"
    errors = json.loads(run("records", "demo", "--errors", "--json").out)
    assert [i["oai_identifier"] for i in errors] == ["oai:x:3"]
    assert len(json.loads(run("records", "demo", "--json", "--limit", "2").out)) == 2
    r = run("records", "demo")
    assert r.code == 0 and "oai:x:1" in r.out and "deleted" in r.out
    r = run("records", "unknown", "--json")  # neither registered nor holding records
    assert (r.code, r.out) == (1, "") and "no harvester 'unknown'" in r.error_line


def test_records_after_a_real_harvest(run, database_url: str, server: OAIServer) -> None:
    from oaipmh_dagster.harvesting.harvest import harvest

    assert run("harvester", "add", "demo", "--url", server.base_url, "--prefix",
               "oai_dc").code == 0
    stats = harvest(registry().get("demo"), Store(), run_id="t")
    assert stats.records == len(server.dataset)
    items = json.loads(run("records", "demo", "--json").out)
    assert len(items) == len(server.dataset)
    served = {r.identifier: r for r in server.dataset.records}
    for item in items:
        source = served[item["oai_identifier"]]
        assert item["deleted"] == source.deleted
        assert item["datestamp"] == source.datestamp.strftime("%Y-%m-%dT%H:%M:%SZ")
        assert item["sets"] == list(source.sets)
        if source.deleted:
            assert item["metadata"] is None
        else:
            assert item["metadata"] and item["errors"] == []
