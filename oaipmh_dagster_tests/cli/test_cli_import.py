"""`oaipmh-dagster harvester import` and `harvester export`: export -> import round trips
in CSV, JSON and YAML; one line per bad row with its number, exit 2 and nothing written;
--skip-invalid, --update, stdin; bad files; the probe against a loopback server."""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from oaipmh_dagster.demo.dataset import make_dataset
from oaipmh_dagster.demo.server import OAIServer
from oaipmh_dagster.operations.harvester_files import COLUMNS
from oaipmh_dagster.storage import db
from oaipmh_dagster.storage.registry import Registry
from oaipmh_dagster_tests.helpers import add_harvester

URL = "http://127.0.0.1:9/oai"
FORMATS = ("csv", "json", "yaml")


@pytest.fixture(scope="module")
def server() -> Iterator[OAIServer]:
    srv = OAIServer(make_dataset(5, seed=7), page_size=5).start()
    yield srv
    srv.stop()


def registered() -> list[dict[str, Any]]:
    return [{k: v for k, v in h.to_dict().items() if k not in ("created", "updated")}
            for h in Registry(db.get_engine()).list()]


def varied() -> None:
    """Harvesters that use every field, and one left at the defaults."""
    add_harvester("all_fields", URL, metadata_prefix="marc21", name='Ünï, "quoted"\nname',
                  sets=("a:b", "c-d.e"), cron="0 3 * * 1-5", timezone="Europe/Prague",
                  enabled=False, transformer="xml", schema="marc21",
                  comment="line one\nline two | three", timeout=12.5, delay=0.25,
                  max_parallel=3, max_retries=0, auth_env="OAIPMH_AUTH_X", overlap=600,
                  reconcile_every=7, max_delete="1000")
    add_harvester("plain", URL)
    add_harvester("yes", URL, name="no", comment="true", cron="*/5 * * * *",
                  max_delete="12.5%")


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def csv_of(*lines: str) -> str:
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("fmt", FORMATS)
def test_export_then_import_round_trips(run, sqlite_url: str, tmp_path: Path,
                                        fmt: str) -> None:
    varied()
    before = registered()
    out = tmp_path / f"h.{fmt}"
    r = run("harvester", "export", "-o", str(out))
    assert r.code == 0, r.err
    assert r.out == f"wrote 3 harvesters to {out}\n"
    text = out.read_text(encoding="utf-8")
    registry = Registry(db.get_engine())
    for h in registry.list():
        registry.remove(h.id)
    r = run("harvester", "import", str(out), "--no-check")
    assert r.code == 0, r.err
    assert r.out.splitlines()[-1] == f"{out}: 3 added, 0 updated, 0 unchanged, 0 skipped"
    assert registered() == before
    again = tmp_path / f"again.{fmt}"
    assert run("harvester", "export", "-o", str(again)).code == 0
    assert again.read_text(encoding="utf-8") == text
    # --update puts back what was changed since the export, and only that.
    registry.update("plain", cron="0 9 * * *", name="Changed", max_retries=9)
    registry.update("yes", sets=("z",))
    r = run("harvester", "import", str(out), "--no-check", "--update")
    assert r.code == 0, r.err
    assert "updated harvester plain: cron, max_retries, name" in r.out
    assert "updated harvester yes: sets" in r.out
    assert r.out.splitlines()[-1] == f"{out}: 0 added, 2 updated, 1 unchanged, 0 skipped"
    assert registered() == before


def test_export_formats(run, sqlite_url: str, tmp_path: Path) -> None:
    varied()
    r = run("harvester", "export")  # stdout: JSON
    assert r.code == 0 and r.err == "wrote 3 harvesters to stdout\n"
    data = json.loads(r.out)
    assert [list(d) for d in data] == [list(COLUMNS)] * 3
    assert data[0]["sets"] == ["a:b", "c-d.e"] and data[0]["validate"] == "marc21"
    assert data[1]["cron"] is None and data[1]["enabled"] is True
    r = run("harvester", "export", "--format", "csv")
    lines = r.out.splitlines()
    assert lines[0] == ",".join(COLUMNS)
    assert lines[-2] == (f"plain,{URL},oai_dc,,,UTC,true,plain,oai_dc,,,60.0,0.0,1,5,,,,10%")
    assert "a:b|c-d.e" in r.out
    r = run("harvester", "export", "-o", str(tmp_path / "h.txt"))
    assert r.code == 2 and "--format csv|json|yaml" in r.error_line
    assert not (tmp_path / "h.txt").exists()
    assert run("harvester", "export", "--format", "yaml", "-o", str(tmp_path / "h.txt")
               ).code == 0
    assert (tmp_path / "h.txt").read_text().startswith("- id: all_fields\n")


def test_one_bad_row_refuses_the_file(run, sqlite_url: str, tmp_path: Path) -> None:
    path = write(tmp_path, "h.csv", csv_of(
        "id,url,prefix,cron,timeout,enabled,sets",
        f"good,{URL},oai_dc,,,,",
        f"Bad-Id,{URL},oai_dc,,,,",
        "",
        f"late,{URL},oai_dc,every day,,,",
        f"slow,{URL},oai_dc,,soon,,",
        f"off,{URL},oai_dc,,,maybe,",
        f"sets,{URL},oai_dc,,,,a||b",
        f"short,{URL}",
        f"good,{URL},oai_dc,,,,"))
    r = run("harvester", "import", path, "--no-check")
    assert r.code == 2
    lines = r.err.splitlines()
    assert lines == [
        f"{path}: row 1 (line 2) (good): id 'good' is given more than once (row 1, row 8)",
        f"{path}: row 2 (line 3) (Bad-Id): invalid harvester id 'Bad-Id': use 1-48 "
        "characters a-z, 0-9 and _, starting with a letter or digit",
        f"{path}: row 3 (line 5) (late): invalid cron expression 'every day'",
        f"{path}: row 4 (line 6) (slow): timeout must be a number, not 'soon'",
        f"{path}: row 5 (line 7) (off): enabled must be true or false, not 'maybe'",
        f"{path}: row 6 (line 8) (sets): sets: an empty set spec in 'a||b' (set specs are "
        "separated by |)",
        f"{path}: row 7 (line 9) (short): 2 cells for the header's 7 columns",
        f"{path}: row 8 (line 10) (good): id 'good' is given more than once (row 1, row 8)",
        f"oaipmh-dagster: error: {path}: 8 of 8 rows refused, nothing written "
        "(--skip-invalid writes the valid rows)"]
    assert registered() == []


def test_skip_invalid_writes_the_valid_rows(run, sqlite_url: str, tmp_path: Path) -> None:
    add_harvester("taken", URL)
    path = write(tmp_path, "h.json", json.dumps([
        {"id": "one", "url": URL, "prefix": "oai_dc", "cron": "0 3 * * *"},
        {"id": "two", "url": URL, "prefix": "oai_dc", "max_parallel": 99},
        {"id": "taken", "url": URL, "prefix": "oai_dc"},
        {"id": "three", "url": URL, "prefix": "oai_dc", "enabled": False, "sets": []},
        {"id": "four", "url": URL, "prefix": "oai_dc", "colour": "red"},
        "five"]))
    r = run("harvester", "import", path, "--no-check", "--skip-invalid")
    assert r.code == 0, r.err
    assert r.err.splitlines() == [
        f"skipped {path}: row 2 (two): max_parallel must be in [1, 32], not 99",
        f"skipped {path}: row 3 (taken): harvester 'taken' already exists (--update "
        "changes it)",
        f"skipped {path}: row 5 (four): unknown field 'colour' (fields: "
        f"{', '.join(COLUMNS)})",
        f"skipped {path}: row 6: a harvester object was expected, not a string",
        "note: no Dagster webserver answered at http://127.0.0.1:9: reload the code "
        "location 'oaipmh_dagster' in the Dagster UI (Deployment > Reload), or set "
        "OAIPMH_DAGSTER_WEBSERVER to the webserver's address"]
    assert r.out.splitlines() == [
        f"added harvester one: {URL} (oai_dc)", f"added harvester three: {URL} (oai_dc)",
        f"{path}: 2 added, 0 updated, 0 unchanged, 4 skipped"]
    ids = [h["id"] for h in registered()]
    assert ids == ["one", "taken", "three"]
    assert not Registry(db.get_engine()).get("three").enabled


def test_stdin_needs_a_format(run, sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    r = run("harvester", "import", "-", "--no-check")
    assert r.code == 2 and "stdin has no extension: pass --format csv|json|yaml" in r.error_line
    text = f"- id: piped\n  url: {URL}\n  prefix: oai_dc\n  sets: [x]\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode())))
    r = run("harvester", "import", "-", "--format", "yaml", "--no-check")
    assert r.code == 0, r.err
    assert r.out.splitlines()[-1] == "stdin: 1 added, 0 updated, 0 unchanged, 0 skipped"
    assert Registry(db.get_engine()).get("piped").sets == ("x",)


@pytest.mark.parametrize(("name", "text", "message"), [
    ("h.csv", "id,url,colour\n", "unknown column 'colour' (columns: id, url, prefix,"),
    ("h.csv", "", "the file is empty: a header row naming the columns was expected"),
    ("h.csv", "url,prefix\nx,y\n", "the header has no id column"),
    ("h.csv", "id,id\n", "column 'id' is named twice in the header"),
    ("h.json", '{"id": "a"}', "a JSON list of harvester objects was expected, not an object"),
    ("h.json", "[{\"id\": \"a\",}]", "not valid JSON: Expecting property name enclosed in "
     "double quotes (line 1, column 13)"),
    ("h.json", '[{"id": "a", "id": "b"}]', "an object has key 'id' twice"),
    ("h.yaml", "- id: [a\n", "not valid YAML: "),
    ("h.yaml", "id: a\n", "a YAML list of harvester objects was expected, not an object"),
    ("h.txt", "[]", "cannot tell the format of"),
    ("h.json", b"\xff\xfe[]", "not UTF-8 text"),
    ("missing.csv", None, "cannot read"),
    ("dir.json", "DIR", "cannot read"),
])
def test_a_bad_file_is_one_line(run, sqlite_url: str, tmp_path: Path, name: str,
                                text: Any, message: str) -> None:
    path = tmp_path / name
    if text == "DIR":
        path.mkdir()
    elif isinstance(text, bytes):
        path.write_bytes(text)
    elif text is not None:
        path.write_text(text, encoding="utf-8")
    r = run("harvester", "import", str(path), "--no-check")
    assert r.code == 2
    assert message in r.error_line
    assert registered() == []


def test_import_probes_against_the_server(run, sqlite_url: str, tmp_path: Path,
                                          server: OAIServer, closed_port_url: str) -> None:
    first = sorted(server.dataset.sets)[0]
    path = write(tmp_path, "h.csv", csv_of(
        "id,url,prefix,sets,timeout",
        f"a,{server.base_url},oai_dc,{first},",
        f"b,{server.base_url},marc21,,"))
    server.clear_log()
    r = run("harvester", "import", path)
    assert r.code == 2
    assert r.err.splitlines()[0] == "probed 1/1 endpoint"
    assert f"{path}: row 2 (line 3) (b): {server.base_url} does not offer metadataPrefix " \
           "'marc21'" in r.err
    assert registered() == []
    path = write(tmp_path, "h.csv", csv_of(
        "id,url,prefix,sets,timeout",
        f"a,{server.base_url},oai_dc,{first},",
        f"c,{closed_port_url},oai_dc,,5"))
    r = run("harvester", "import", path)
    assert r.code == 1  # an endpoint that does not answer is no bad input
    assert f"cannot use {closed_port_url} as an OAI-PMH endpoint" in r.err
    assert registered() == []
    r = run("harvester", "import", path, "--skip-invalid")
    assert r.code == 0, r.err
    assert [(h["id"], h["name"]) for h in registered()] == [("a", "Demo Research Repository")]


def test_import_reloads_each_shard_once(run, sqlite_url: str, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from oaipmh_dagster.operations import reload
    from oaipmh_dagster.operations.shards import shard_of
    from oaipmh_dagster.storage.registry import SHARDS_SETTING

    calls: list[str] = []

    def fake(**kwargs: Any) -> tuple[bool, str]:
        calls.append(kwargs["harvester_id"])
        return True, f"reloaded the shard of {kwargs['harvester_id']}"

    monkeypatch.setattr(reload, "reload_code_location", fake)
    Registry(db.get_engine()).set_setting(SHARDS_SETTING, "2")
    ids = [f"h{i}" for i in range(12)]
    path = write(tmp_path, "h.csv", csv_of("id,url,prefix", *(f"{i},{URL},oai_dc" for i in ids)))
    r = run("harvester", "import", path, "--no-check")
    assert r.code == 0, r.err
    assert sorted(shard_of(i, 2) for i in calls) == [0, 1]
    assert sum(line.startswith("reloaded the shard of") for line in r.out.splitlines()) == 2
