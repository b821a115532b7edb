"""Switching validation on and off: the CLI and `admin` (refusals included), the
manage_harvesters config, the migration that adds the field, the schema loader (local
files only, one compiled schema per thread) and the shipped schemas in a built wheel."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa

from oaipmh_dagster.defs.manage import (
    AddHarvester,
    ManageConfig,
    UpdateHarvester,
    apply,
)
from oaipmh_dagster.operations.admin import AdminError, add_harvester, update_harvester
from oaipmh_dagster.storage import db
from oaipmh_dagster.storage.registry import Harvester, InvalidHarvester, Registry
from oaipmh_dagster.transform.validation import (
    SCHEMA_DIR,
    SHIPPED,
    SchemaError,
    Validator,
    check_schema,
    schema_for_prefix,
)
from oaipmh_dagster_tests.conftest import REPO_ROOT, Result

URL = "http://127.0.0.1:9/oai"
MINI = """<?xml version="1.0"?>
<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema" targetNamespace="urn:mini"
           elementFormDefault="qualified">
  <xs:element name="thing" type="xs:string"/>
</xs:schema>
"""


@pytest.fixture(autouse=True)
def _no_reload(monkeypatch: pytest.MonkeyPatch) -> None:
    from oaipmh_dagster.operations import reload

    monkeypatch.setattr(reload, "reload_code_location", lambda **_: (True, "reloaded"))


def _registry() -> Registry:
    return Registry(db.get_engine())


@pytest.mark.parametrize(("prefix", "schema"), [
    ("oai_dc", "oai_dc"), ("datacite", "datacite"), ("oai_datacite", "datacite"),
    ("datacite4", "datacite"), ("marc21", "marc21"), ("marcxml", "marc21"),
    ("MARC21", "marc21"), ("mods", None),
])
def test_schema_by_prefix(prefix: str, schema: str | None) -> None:
    assert schema_for_prefix(prefix) == schema


def test_cli_add_show_list_update(sqlite_url: str, run: Callable[..., Result],
                                  tmp_path: Path) -> None:
    r = run("harvester", "add", "a", "--url", URL, "--prefix", "marcxml", "--no-check",
            "--validate")
    assert r.code == 0, r.err
    assert _registry().get("a").schema == "marc21"
    shown = json.loads(run("harvester", "show", "a", "--json").out)
    assert shown["schema"] == "marc21"
    assert "schema: marc21" in run("harvester", "show", "a").out.replace("  ", " ")
    listed = run("harvester", "list").out
    assert "validate" in listed.splitlines()[0] and "marc21" in listed
    mini = tmp_path / "mini.xsd"
    mini.write_text(MINI)
    assert run("harvester", "update", "a", "--validate", str(mini)).code == 0
    assert _registry().get("a").schema == str(mini.resolve())
    assert run("harvester", "update", "a", "--no-validate").code == 0
    assert _registry().get("a").schema is None
    # Off by default.
    assert run("harvester", "add", "b", "--url", URL, "--prefix", "oai_dc",
               "--no-check").code == 0
    assert _registry().get("b").schema is None


@pytest.mark.parametrize(("argv", "message"), [
    (["add", "x", "--url", URL, "--prefix", "mods", "--no-check", "--validate"],
     "no schema is shipped for metadataPrefix 'mods'"),
    (["add", "x", "--url", URL, "--prefix", "mods", "--no-check", "--validate",
      "/nonexistent/s.xsd"], "schema file /nonexistent/s.xsd does not exist"),
])
def test_cli_add_refusals(sqlite_url: str, run: Callable[..., Result], argv: list[str],
                          message: str) -> None:
    r = run("harvester", *argv)
    assert r.code == 2 and message in r.err and len(r.err.strip().splitlines()) == 1
    assert _registry().list() == []  # nothing written


def test_refusals_of_bad_schemas(sqlite_url: str, tmp_path: Path) -> None:
    registry = _registry()
    broken = tmp_path / "broken.xsd"
    broken.write_text("<xs:schema xmlns:xs='http://www.w3.org/2001/XMLSchema'><xs:element/>"
                      "</xs:schema>")
    with pytest.raises(AdminError, match="does not compile") as info:
        add_harvester(registry, "x", url=URL, prefix="mods", check=False,
                      validate=str(broken))
    assert info.value.usage
    remote = tmp_path / "remote.xsd"
    remote.write_text(MINI.replace(
        '<xs:element', '<xs:import namespace="urn:o" schemaLocation="http://example.org/o.xsd"/>'
        '<xs:element', 1))
    with pytest.raises(AdminError, match="only local files are loaded"):
        add_harvester(registry, "x", url=URL, prefix="mods", check=False,
                      validate=str(remote))
    add_harvester(registry, "x", url=URL, prefix="oai_dc", check=False, validate="")
    with pytest.raises(AdminError, match="exclude each other"):
        update_harvester(registry, "x", validate="", no_validate=True)
    # A shipped schema follows the prefix; a prefix without one is refused.
    assert update_harvester(registry, "x", prefix="marc21", check=False).harvester.schema == (
        "marc21")
    with pytest.raises(AdminError, match="pass a schema file's path"):
        update_harvester(registry, "x", prefix="mods", check=False)
    assert registry.get("x").metadata_prefix == "marc21"  # nothing written
    with pytest.raises(InvalidHarvester, match="invalid schema"):
        Harvester(id="r", base_url=URL, metadata_prefix="oai_dc", schema="relative.xsd")


def test_manage_config_sets_and_clears_the_schema(sqlite_url: str) -> None:
    registry = _registry()
    apply(ManageConfig(action=AddHarvester(id="m", url=URL, prefix="oai_dc", no_check=True,
                                           validate_schema="shipped")),
          registry, None, None)  # type: ignore[arg-type]
    assert registry.get("m").schema == "oai_dc"
    apply(ManageConfig(action=UpdateHarvester(id="m", no_validate=True)), registry, None,
          None)  # type: ignore[arg-type]
    assert registry.get("m").schema is None


def test_migration_adds_the_field_off(database_url: str) -> None:
    engine = db.get_engine(database_url, migrate=False)
    assert db.upgrade(engine, "0005") == "0005"
    with engine.begin() as conn:
        conn.execute(sa.text(
            "INSERT INTO oaipmh_harvester (id, name, base_url, metadata_prefix, sets, "
            "transformer, cron, timezone, enabled, comment, timeout, delay, max_parallel, "
            "max_retries, created, updated) VALUES ('old', 'Old', 'https://x.org/oai', "
            "'oai_dc', '[]', 'oai_dc', NULL, 'UTC', TRUE, '', 60, 0, 1, 5, "
            "CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"))
    assert db.upgrade(engine) == db.head_revision()
    assert "schema" in {c["name"] for c in sa.inspect(engine).get_columns("oaipmh_harvester")}
    registry = Registry(engine)
    assert registry.get("old").schema is None
    assert registry.update("old", schema="datacite").schema == "datacite"


def test_shipped_schemas_compile_from_local_files() -> None:
    assert sorted(p.name for p in SCHEMA_DIR.glob("*.xsd")) == [
        "datacite-kernel-4.xsd", "dc-elements.xsd", "marc21-slim.xsd", "oai_dc.xsd", "xml.xsd"]
    for name in SHIPPED:
        check_schema(name)
    with pytest.raises(SchemaError, match="does not exist"):
        check_schema("/nonexistent/schema.xsd")


def test_one_compiled_schema_per_thread() -> None:
    validator = Validator("oai_dc")
    record = ('<oai_dc:dc xmlns:oai_dc="http://www.openarchives.org/OAI/2.0/oai_dc/" '
              'xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:{}>x</dc:{}></oai_dc:dc>')
    compiled: dict[str, object] = {}
    results: dict[str, list] = {}

    def work(name: str, tag: str) -> None:
        results[name] = [validator(record.format(tag, tag)) for _ in range(50)]
        compiled[name] = validator._compiled()  # noqa: SLF001 - the per-thread object

    threads = [threading.Thread(target=work, args=(f"t{i}", "title" if i % 2 else "bad"))
               for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len({id(c) for c in compiled.values()}) == 4
    for name, found in results.items():
        valid = int(name[1:]) % 2 == 1
        assert all((errors == []) == valid for errors in found)


def test_shipped_schemas_are_in_the_built_wheel(tmp_path: Path) -> None:
    """Built and unpacked, the package finds and compiles its schemas from there."""
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "w"),
         str(REPO_ROOT)], capture_output=True, text=True, timeout=300, check=False)
    if built.returncode != 0:
        pytest.skip(f"cannot build a wheel here: {built.stderr.strip()[-300:]}")
    (wheel,) = (tmp_path / "w").glob("*.whl")
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = ("import oaipmh_dagster, oaipmh_dagster.transform.validation as v; "
            f"assert oaipmh_dagster.__file__.startswith({str(site)!r}), oaipmh_dagster.__file__; "
            "[v.check_schema(n) for n in v.SHIPPED]; print(sorted(v.SHIPPED))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False, cwd=tmp_path,
                          env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['datacite', 'marc21', 'oai_dc']"
