"""Endpoint credentials come only from variables of the project's own namespace
(`OAIPMH_AUTH_*`): naming any other variable of the worker (the database URL's, PATH) is
refused at input by every path that writes a row (the command, `manage_harvesters`), and a
row that names one anyway (written before the rule, or edited by hand) fails its run
before any request, so its value never reaches the harvester's host."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable, Iterator

import dagster as dg
import pytest

from oaipmh_dagster.demo.dataset import make_dataset
from oaipmh_dagster.harvesting.harvest import CredentialsError, harvest
from oaipmh_dagster.storage import db
from oaipmh_dagster.storage.registry import Harvester, InvalidHarvester, Registry, harvester_table
from oaipmh_dagster.storage.store import Store
from oaipmh_dagster_tests.conftest import Result
from oaipmh_dagster_tests.helpers import add_harvester
from oaipmh_dagster_tests.oaiserver import FaultyOAIServer as OAIServer

AUTH_ENV_PREFIX = "OAIPMH_AUTH_"  # the documented rule
SECRET = "db-user:pa55-S3CRET-41d7"
OUTSIDE = ("OAIPMH_DATABASE_URL", "PATH", "HOME", "ZENODO_TOKEN", "OAIPMH_AUTH_", "oaipmh_auth_x")


@pytest.fixture
def server() -> Iterator[OAIServer]:
    with OAIServer(make_dataset(30, seed=5), page_size=10) as srv:
        yield srv


def _carrying(server: OAIServer, value: str) -> list[str]:
    """The Authorization headers the server received that carry `value` (any at all
    when `value` is empty)."""
    encoded = base64.b64encode(value.encode()).decode()
    seen = [r.headers.get("Authorization") or "" for r in server.requests]
    return [h for h in seen if h and (not value or encoded in h or value in h)]


def _rows() -> list[dict]:
    return [h.to_dict() for h in Registry(db.get_engine()).list()]


def _force_auth_env(harvester_id: str, name: str) -> None:
    """Write `name` into the row's auth_env behind the registry's back (a hand edit)."""
    with db.get_engine().begin() as conn:
        conn.execute(harvester_table.update().where(harvester_table.c.id == harvester_id)
                     .values(auth_env=name))


# -- input -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", OUTSIDE)
def test_registry_refuses_a_variable_outside_the_namespace(name: str) -> None:
    with pytest.raises(InvalidHarvester) as err:
        Harvester(id="h", base_url="http://127.0.0.1/oai", metadata_prefix="oai_dc",
                  auth_env=name)
    message = str(err.value)
    assert "\n" not in message and AUTH_ENV_PREFIX in message
    ok = Harvester(id="h", base_url="http://127.0.0.1/oai", metadata_prefix="oai_dc")
    with pytest.raises(InvalidHarvester, match=AUTH_ENV_PREFIX):
        ok.replace(auth_env=name)


@pytest.mark.parametrize("name", ["OAIPMH_AUTH_ZENODO", "OAIPMH_AUTH_A1", "OAIPMH_AUTH_x_y"])
def test_registry_accepts_the_namespace(name: str) -> None:
    h = Harvester(id="h", base_url="http://127.0.0.1/oai", metadata_prefix="oai_dc",
                  auth_env=name)
    assert h.auth_env == name


@pytest.mark.parametrize("name", ["OAIPMH_DATABASE_URL", "PATH"])
def test_command_refuses_it_and_writes_nothing(database_url: str, server: OAIServer,
                                               run: Callable[..., Result],
                                               name: str) -> None:
    """add and update: exit 2, one line that says the rule, no row written or changed,
    and the endpoint is not even probed."""
    value = os.environ[name]
    result = run("harvester", "add", "x", "--url", server.base_url, "--prefix", "oai_dc",
                 "--auth-env", name)
    assert result.code == 2
    line = result.error_line
    assert AUTH_ENV_PREFIX in line and name in line and value not in result.err + result.out
    assert _rows() == []
    add_harvester("keep", server.base_url)
    before = _rows()
    result = run("harvester", "update", "keep", "--auth-env", name)
    assert result.code == 2 and AUTH_ENV_PREFIX in result.error_line
    assert _rows() == before
    assert server.requests == []


def test_manage_harvesters_refuses_it(database_url: str, instance: dg.DagsterInstance,
                                      server: OAIServer) -> None:
    from oaipmh_dagster_tests.defs.test_manage import failure, launch

    add_harvester("keep", server.base_url)
    before = _rows()
    for config in ({"action": "add", "id": "x", "url": server.base_url, "prefix": "oai_dc",
                    "auth_env": "OAIPMH_DATABASE_URL"},
                   {"action": "update", "id": "keep", "auth_env": "PATH"}):
        result = launch(instance, **config)
        assert AUTH_ENV_PREFIX in failure(result)
        assert _rows() == before
    assert server.requests == []


# -- run time ----------------------------------------------------------------------------


def test_a_row_forced_outside_the_namespace_sends_nothing(
    database_url: str, server: OAIServer, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A row edited by hand to name OAIPMH_DATABASE_URL still loads (it can be shown and
    repaired), but its harvest fails before any request with an error that names the rule
    and not the value; other updates are refused until auth_env is repaired."""
    monkeypatch.setenv("OAIPMH_AUTH_OK", "user:fine")
    add_harvester("forced", server.base_url, auth_env="OAIPMH_AUTH_OK")
    _force_auth_env("forced", "OAIPMH_DATABASE_URL")
    h = Registry(db.get_engine()).get("forced")
    assert h.auth_env == "OAIPMH_DATABASE_URL"
    with pytest.raises(CredentialsError) as err:
        harvest(h, Store(), run_id="r1")
    message = str(err.value)
    assert AUTH_ENV_PREFIX in message and "OAIPMH_DATABASE_URL" in message
    assert database_url not in message and server.requests == []
    with pytest.raises(InvalidHarvester, match=AUTH_ENV_PREFIX):
        h.replace(comment="x")
    repaired = Registry(db.get_engine()).update("forced", auth_env="OAIPMH_AUTH_OK")
    assert harvest(repaired, Store(), run_id="r2").records == len(server.dataset)
    assert _carrying(server, "user:fine") and not _carrying(server, database_url)


def test_a_forced_row_fails_its_dagster_run_and_leaks_nothing(
    database_url: str, server: OAIServer, monkeypatch: pytest.MonkeyPatch,
    run: Callable[..., Result],
) -> None:
    """Through the job: the run fails with the rule in its error, the server receives no
    request carrying the variable's value, and neither the event log nor `harvester show`
    holds it."""
    from dagster._serdes import serialize_value

    from oaipmh_dagster_tests.defs.test_job import _run as run_job

    monkeypatch.setenv("OAIPMH_SECRET_ELSEWHERE", SECRET)
    add_harvester("forced", server.base_url)
    _force_auth_env("forced", "OAIPMH_SECRET_ELSEWHERE")
    h = Registry(db.get_engine()).get("forced")
    with dg.instance_for_test() as instance:
        result = run_job(h, instance)
        assert not result.success
        text = "".join(serialize_value(e) for e in instance.all_logs(result.run_id))
        run_record = instance.get_run_by_id(result.run_id)
        text += json.dumps(run_record.run_config) + json.dumps(run_record.tags)
    assert AUTH_ENV_PREFIX in text
    assert "S3CRET" not in text and base64.b64encode(SECRET.encode()).decode() not in text
    assert not _carrying(server, "")
    shown = run("harvester", "show", "forced", "--json")
    assert shown.code == 0 and "S3CRET" not in shown.out + shown.err
