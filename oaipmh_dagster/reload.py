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
