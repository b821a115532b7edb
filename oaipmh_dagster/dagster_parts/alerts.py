"""Run-failure alerts: a sensor that posts each failed harvest of this code location to a
webhook, as JSON `{harvester, job, run_id, error, url}` (`url` links to the run in the
UI). Off unless `OAIPMH_ALERT_WEBHOOK` names the webhook when the code location loads;
the UI's address comes from `OAIPMH_DAGSTER_UI_URL` (else `OAIPMH_DAGSTER_WEBSERVER`,
else http://127.0.0.1:3000)."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit

import dagster as dg
import httpx

from oaipmh_dagster.contracts import HARVESTER_TAG, harvester_of

__all__ = ["ALERT_SENSOR_NAME", "UI_URL_ENV", "WEBHOOK_ENV", "alert_payload",
           "build_alert_sensor"]

WEBHOOK_ENV = "OAIPMH_ALERT_WEBHOOK"
UI_URL_ENV = "OAIPMH_DAGSTER_UI_URL"
WEBSERVER_ENV = "OAIPMH_DAGSTER_WEBSERVER"
DEFAULT_UI_URL = "http://127.0.0.1:3000"
ALERT_SENSOR_NAME = "oaipmh_run_failure_alert"
TIMEOUT_SECONDS = 10.0
# Longer errors are cut (a chat message or a ticket title, not a log).
MAX_ERROR = 2000


def ui_url() -> str:
    """The Dagster UI's base address, for links to runs."""
    base = os.environ.get(UI_URL_ENV) or os.environ.get(WEBSERVER_ENV) or DEFAULT_UI_URL
    return base.rstrip("/")


def alert_payload(run: dg.DagsterRun, error: str) -> dict[str, Any]:
    """The JSON posted for a failed `run`."""
    harvester = run.tags.get(HARVESTER_TAG)
    if harvester is None:  # the asset graph's Materialize, a backfill: from the assets
        ids = {harvester_of(key.path) for key in run.asset_selection or ()} - {None}
        harvester = ", ".join(sorted(str(i) for i in ids)) or None
    return {"harvester": harvester, "job": run.job_name, "run_id": run.run_id,
            "error": error[:MAX_ERROR], "url": f"{ui_url()}/runs/{run.run_id}"}


def _error(context: dg.RunFailureSensorContext) -> str:
    """The failed steps' errors (what raised, under Dagster's wrapping), else the run's
    failure message."""
    messages = []
    for event in context.get_step_failure_events():
        error = event.step_failure_data.error
        while error is not None and error.cause is not None:
            error = error.cause
        if error is not None:
            messages.append(f"{event.step_key}: {error.message.strip()}")
    return "; ".join(messages) or (context.failure_event.message or "run failed")


def build_alert_sensor() -> dg.SensorDefinition | None:
    """The run-failure sensor, when `OAIPMH_ALERT_WEBHOOK` is set; else None."""
    if not os.environ.get(WEBHOOK_ENV):
        return None

    @dg.run_failure_sensor(
        name=ALERT_SENSOR_NAME,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Posts each failed run of this code location to the webhook in "
        f"${WEBHOOK_ENV} (JSON: harvester, job, run_id, error, url).",
    )
    def oaipmh_run_failure_alert(context: dg.RunFailureSensorContext) -> None:
        webhook = os.environ.get(WEBHOOK_ENV)
        if not webhook:
            context.log.info("%s is not set here: no alert sent", WEBHOOK_ENV)
            return
        payload = alert_payload(context.dagster_run, _error(context))
        # Never the whole URL in a log: a webhook's path often holds its secret.
        target = urlsplit(webhook).netloc
        try:
            response = httpx.post(webhook, json=payload, timeout=TIMEOUT_SECONDS)
            response.raise_for_status()
        except httpx.HTTPError as exc:
            # A failed tick is retried with the same run on the next evaluation.
            raise dg.Failure(f"the alert webhook at {target} refused or did not answer: "
                             f"{type(exc).__name__}") from None
        context.log.info("alert for run %s sent to %s", payload["run_id"], target)

    return oaipmh_run_failure_alert
