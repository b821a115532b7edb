"""Ask a running Dagster webserver to reload this code location (GraphQL)."""

from __future__ import annotations

import os

import httpx

WEBSERVER_ENV = "OAIPMH_DAGSTER_WEBSERVER"
LOCATION_ENV = "OAIPMH_DAGSTER_LOCATION"
DEFAULT_WEBSERVER = "http://127.0.0.1:3000"
DEFAULT_LOCATION = "oaipmh_dagster"

RELOAD_MUTATION = """
mutation Reload($name: String!) {
  reloadRepositoryLocation(repositoryLocationName: $name) {
    __typename
    ... on WorkspaceLocationEntry { name loadStatus }
    ... on PythonError { message }
    ... on RepositoryLocationNotFound { message }
    ... on UnauthorizedError { message }
  }
}
"""


def reload_code_location(
    url: str | None = None, location: str | None = None, timeout: float = 120.0
) -> tuple[bool, str]:
    """Reload the location; returns (done, message). Never raises."""
    url = (url or os.environ.get(WEBSERVER_ENV) or DEFAULT_WEBSERVER).rstrip("/")
    location = location or os.environ.get(LOCATION_ENV) or DEFAULT_LOCATION
    hint = (f"reload the code location '{location}' in the Dagster UI (Deployment > Reload), "
            f"or set {WEBSERVER_ENV} to the webserver's address")
    try:
        resp = httpx.post(f"{url}/graphql", json={"query": RELOAD_MUTATION,
                                                   "variables": {"name": location}},
                          timeout=httpx.Timeout(timeout, connect=2.0))
        resp.raise_for_status()
        result = resp.json()["data"]["reloadRepositoryLocation"]
    except (httpx.HTTPError, KeyError, TypeError, ValueError):
        return False, f"no Dagster webserver answered at {url}: {hint}"
    if result.get("__typename") == "WorkspaceLocationEntry":
        return True, f"reloaded code location '{location}' at {url}"
    return False, f"reload of '{location}' at {url} failed: {result.get('message', result)}"


SCHEDULE_QUERY = """
query Schedule($selector: ScheduleSelector!) {
  scheduleOrError(scheduleSelector: $selector) {
    __typename
    ... on Schedule { id scheduleState { status } }
    ... on PythonError { message }
  }
}
"""

STOP_SCHEDULE_MUTATION = """
mutation Stop($id: String!) {
  stopRunningSchedule(id: $id) {
    __typename
    ... on ScheduleStateResult { scheduleState { status } }
    ... on PythonError { message }
    ... on UnauthorizedError { message }
  }
}
"""


def stop_schedule(
    name: str, url: str | None = None, location: str | None = None, timeout: float = 30.0
) -> tuple[bool | None, str]:
    """Stop schedule `name` of the location through the webserver (GraphQL). Returns
    (True, message) when stopped or not running, (False, message) when the webserver
    refused, (None, message) when no webserver answered. Never raises."""
    url = (url or os.environ.get(WEBSERVER_ENV) or DEFAULT_WEBSERVER).rstrip("/")
    location = location or os.environ.get(LOCATION_ENV) or DEFAULT_LOCATION
    selector = {"repositoryLocationName": location, "repositoryName": "__repository__",
                "scheduleName": name}
    try:
        with httpx.Client(timeout=httpx.Timeout(timeout, connect=2.0)) as client:
            found = _graphql(client, url, SCHEDULE_QUERY, {"selector": selector})
            schedule = found["scheduleOrError"]
            if schedule.get("__typename") != "Schedule":
                return True, f"no schedule {name} in '{location}' at {url}"
            if schedule["scheduleState"]["status"] != "RUNNING":
                return True, f"schedule {name} is not running"
            result = _graphql(client, url, STOP_SCHEDULE_MUTATION,
                              {"id": schedule["id"]})["stopRunningSchedule"]
    except (httpx.HTTPError, KeyError, TypeError, ValueError):
        return None, f"no Dagster webserver answered at {url}"
    if result.get("__typename") == "ScheduleStateResult":
        return True, f"stopped schedule {name}"
    return False, f"stopping schedule {name} at {url} failed: {result.get('message', result)}"


def _graphql(client: httpx.Client, url: str, query: str, variables: dict) -> dict:
    resp = client.post(f"{url}/graphql", json={"query": query, "variables": variables})
    resp.raise_for_status()
    return resp.json()["data"]
