"""The harvest op's retries: a transient failure is retried in the same run and resumes
from the checkpoint; an OAI-PMH protocol error, an interrupt or an unknown error fails at
once; the retry count and delay come from the environment."""

from __future__ import annotations

from collections import Counter

import dagster as dg
import httpx
import pytest
import sqlalchemy as sa

from oaipmh_dagster.definitions import build_definitions
from oaipmh_dagster.defs.assets import op_name
from oaipmh_dagster.defs.listener import LISTENER_KEY, listener_resource
from oaipmh_dagster.defs.retry import (
    RETRIES_ENV,
    RETRY_DELAY_ENV,
    is_transient,
    retry_policy,
)
from oaipmh_dagster.demo.dataset import make_dataset
from oaipmh_dagster.harvesting.harvest import CredentialsError, Listener
from oaipmh_dagster.harvesting.plan import PlanError
from oaipmh_dagster.oai import (
    BadArgument,
    BadResumptionToken,
    Cancelled,
    CannotDisseminateFormat,
    NoSetHierarchy,
    OAIDataError,
    OAIHTTPStatusError,
    OAITransportError,
)
from oaipmh_dagster.storage.db import DatabaseUnavailable
from oaipmh_dagster.storage.lease import HarvestInProgress, LeaseLost, LeaseWaitCancelled
from oaipmh_dagster.storage.registry import Harvester, InvalidHarvester
from oaipmh_dagster.storage.store import Store
from oaipmh_dagster.transform import TransformError
from oaipmh_dagster_tests.helpers import add_harvester, expected_snapshot
from oaipmh_dagster_tests.oaiserver import FaultyOAIServer as OAIServer

PAGES = 5


@pytest.fixture
def server():  # noqa: ANN201
    with OAIServer(make_dataset(PAGES * 40, seed=11), page_size=40) as srv:
        yield srv


@pytest.fixture
def retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two op retries without waiting (the suite's default is none)."""
    monkeypatch.setenv(RETRIES_ENV, "2")
    monkeypatch.setenv(RETRY_DELAY_ENV, "0")


def _run(h: Harvester, instance: dg.DagsterInstance,
         listener: Listener | None = None) -> dg.ExecuteInProcessResult:
    job = build_definitions([h]).resolve_job_def(h.job_name)
    resources = {LISTENER_KEY: listener_resource(listener)} if listener else None
    return job.execute_in_process(run_config={"ops": {op_name(h.id): {"config": {}}}},
                                  instance=instance, raise_on_error=False,
                                  resources=resources)


def _retries(result: dg.ExecuteInProcessResult) -> int:
    return sum(1 for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_UP_FOR_RETRY)


def _asked(server: OAIServer) -> Counter:
    """(verb, page) -> how many times the server was asked for it."""
    return Counter((r.verb, r.page) for r in server.requests)


@pytest.mark.usefixtures("retries")
def test_transient_failure_is_retried_from_the_checkpoint(
    sqlite_url: str, server: OAIServer, instance: dg.DagsterInstance
) -> None:
    """Page 3 fails with HTTP 500 once; the client does not retry (max_retries 0), the op
    does: the second attempt resumes with page 3's token, so pages 1 and 2 are asked once."""
    h = add_harvester("flaky", server.base_url, max_retries=0)
    server.faults.add("status", verb="ListRecords", page=3, status=500)
    result = _run(h, instance)
    assert result.success
    assert _retries(result) == 1
    asked = _asked(server)
    assert asked[("Identify", None)] == 2  # once per attempt
    assert [asked[("ListRecords", p)] for p in range(1, PAGES + 1)] == [1, 1, 2, 1, 1]
    (mat,) = [m.materialization for m in result.get_asset_materialization_events()
              if m.asset_key.path[-1] == "raw_records"]
    assert mat.metadata["oai/mode"].value == "resumed"
    assert mat.metadata["oai/resumed_from_token"].value
    assert Store().snapshot("flaky") == expected_snapshot(server.dataset)


@pytest.mark.usefixtures("retries")
def test_the_listener_hears_each_retry(sqlite_url: str, server: OAIServer,
                                      instance: dg.DagsterInstance) -> None:
    """A run's listener (the CLI's progress line) is told of each retry as it is asked
    for: the cause, which retry of how many, and the wait; a harvest that goes on after a
    failure does not wait in silence."""
    h = add_harvester("told", server.base_url, max_retries=0)
    server.faults.add("status", verb="ListRecords", page=2, status=503)
    heard: list[str] = []
    result = _run(h, instance, Listener(on_retry=heard.append))
    assert result.success
    assert len(heard) == 1
    assert "503" in heard[0] and "retry 1 of 2" in heard[0] and "in 0 s" in heard[0]


def test_retries_stop_after_the_configured_count(
    sqlite_url: str, server: OAIServer, instance: dg.DagsterInstance,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(RETRIES_ENV, "1")
    monkeypatch.setenv(RETRY_DELAY_ENV, "0")
    h = add_harvester("down", server.base_url, max_retries=0)
    server.faults.add("status", verb="ListRecords", page=2, status=503, times=None)
    result = _run(h, instance)
    assert not result.success
    assert _retries(result) == 1
    asked = _asked(server)
    assert (asked[("ListRecords", 1)], asked[("ListRecords", 2)]) == (1, 2)
    (failure,) = [e for e in result.all_events if e.is_step_failure]
    assert "HTTP 503" in str(failure.step_failure_data.error)


def test_no_retries_by_default_in_tests(sqlite_url: str, server: OAIServer,
                                        instance: dg.DagsterInstance) -> None:
    """The suite runs with $OAIPMH_OP_RETRIES=0: a failing job fails at once."""
    h = add_harvester("once", server.base_url, max_retries=0)
    server.faults.add("status", verb="ListRecords", status=500, times=None)
    result = _run(h, instance)
    assert not result.success and _retries(result) == 0
    assert _asked(server)[("ListRecords", 1)] == 1


@pytest.mark.usefixtures("retries")
@pytest.mark.parametrize("code", ["badArgument", "cannotDisseminateFormat", "noSetHierarchy"])
def test_protocol_error_fails_at_once(sqlite_url: str, server: OAIServer,
                                      instance: dg.DagsterInstance, code: str) -> None:
    h = add_harvester("refused", server.base_url)
    server.faults.add("oai_error", verb="ListRecords", code=code, times=None)
    result = _run(h, instance)
    assert not result.success
    assert _retries(result) == 0
    asked = _asked(server)
    assert asked[("Identify", None)] == 1 and asked[("ListRecords", 1)] == 1
    (failure,) = [e for e in result.all_events if e.is_step_failure]
    assert code in str(failure.step_failure_data.error)


@pytest.mark.usefixtures("retries")
def test_interrupt_is_not_retried(sqlite_url: str, server: OAIServer,
                                  instance: dg.DagsterInstance) -> None:
    """Ctrl-C (or a terminate) stops the harvest: a retry policy on the op would start it
    again after the delay."""
    def stop(_: object) -> None:
        raise KeyboardInterrupt

    h = add_harvester("stopped", server.base_url)
    result = _run(h, instance, Listener(on_page=stop))
    assert not result.success
    assert _retries(result) == 0
    assert _asked(server)[("ListRecords", 1)] == 1


def _status(code: int) -> OAIHTTPStatusError:
    return OAIHTTPStatusError(f"HTTP {code}", status_code=code)


def _db_unreachable() -> DatabaseUnavailable:
    try:
        try:
            raise sa.exc.OperationalError("SELECT 1", {}, Exception("connection refused"))
        except sa.exc.OperationalError as exc:
            raise DatabaseUnavailable("cannot reach database") from exc
    except DatabaseUnavailable as exc:
        return exc


@pytest.mark.parametrize("exc", [
    OAITransportError("HTTP 503; gave up after 6 attempts"),
    _status(500), _status(502), _status(429),
    OAIDataError("truncated; gave up after 6 attempts", retryable=True),
    BadResumptionToken("expired"),
    HarvestInProgress("run abc holds the lease"),
    httpx.ConnectError("refused"),
    sa.exc.OperationalError("SELECT 1", {}, Exception("server closed the connection")),
    _db_unreachable(),
    ConnectionResetError(),
], ids=type)
def test_transient(exc: Exception) -> None:
    assert is_transient(exc)


@pytest.mark.parametrize("exc", [
    BadArgument("bad"), CannotDisseminateFormat(prefix="x"), NoSetHierarchy(),
    Cancelled("stopping"), LeaseWaitCancelled("stopping"), LeaseLost("taken over"),
    _status(404), _status(401),
    OAIDataError("response too large"),
    CredentialsError("$TOKEN is not set"), PlanError("until before since"),
    InvalidHarvester("bad id"), TransformError("unknown_transformer", "no such transformer"),
    DatabaseUnavailable("invalid database URL"),
    dg.Failure("held back"), ValueError("a bug"),
], ids=type)
def test_permanent(exc: Exception) -> None:
    assert not is_transient(exc)


def test_retry_policy_from_the_environment() -> None:
    policy = retry_policy({})
    assert (policy.max_retries, policy.delay) == (2, 30.0)
    assert policy.backoff == dg.Backoff.EXPONENTIAL and policy.jitter == dg.Jitter.PLUS_MINUS
    assert retry_policy({RETRIES_ENV: "0", RETRY_DELAY_ENV: "1.5"}).max_retries == 0
    # exponential with +-delay jitter: about 1x, then 3x the delay
    delays = [retry_policy({RETRY_DELAY_ENV: "10"}).calculate_delay(n) for n in (1, 2)]
    assert 0 <= delays[0] <= 20 and 20 <= delays[1] <= 40


@pytest.mark.parametrize("env", [{RETRIES_ENV: "two"}, {RETRIES_ENV: "-1"},
                                 {RETRIES_ENV: "11"}, {RETRY_DELAY_ENV: "-5"}])
def test_bad_retry_settings_are_one_clear_line(env: dict[str, str]) -> None:
    with pytest.raises(ValueError, match=r"\$OAIPMH_OP_RETRIES must be") as err:
        retry_policy(env)
    assert "\n" not in str(err.value)


def test_bad_retry_setting_fails_the_run_before_harvesting(
    sqlite_url: str, server: OAIServer, instance: dg.DagsterInstance,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(RETRIES_ENV, "many")
    h = add_harvester("misconfigured", server.base_url)
    result = _run(h, instance)
    assert not result.success and server.requests == []
    (failure,) = [e for e in result.all_events if e.is_step_failure]
    assert RETRIES_ENV in str(failure.step_failure_data.error)
