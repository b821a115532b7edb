"""Ask a running Dagster webserver (GraphQL) to reload the code location that holds a
harvester, or to stop a harvester's schedule there.

With sharded locations (`shards`), the location is the one whose shard holds the
harvester, found among the webserver's locations: one shard reloads, not the deployment.
`OAIPMH_DAGSTER_LOCATION` names the location instead (no lookup)."""

from __future__ import annotations

import os

import httpx

from oaipmh_dagster.errors import OAIPMHDagsterError
from oaipmh_dagster.operations.shards import (
    DEFAULT_LOCATION,
    InvalidShard,
    Shard,
    parse_location,
    shard_of,
)

WEBSERVER_ENV = "OAIPMH_DAGSTER_WEBSERVER"
LOCATION_ENV = "OAIPMH_DAGSTER_LOCATION"
DEFAULT_WEBSERVER = "http://127.0.0.1:3000"

LOCATIONS_QUERY = """
{ workspaceOrError { __typename ... on Workspace { locationEntries { name } } } }
"""


class NoHoldingLocation(OAIPMHDagsterError, LookupError):
    """The webserver's locations are shards, but none of them holds the harvester."""


def _count(names: list[str]) -> int | None:
    """K of the shard locations among `names` whose names do not carry it: one more
    than the highest index (the webserver serves shards 0 to K-1)."""
    indexes = [p[0] for p in map(parse_location, names) if p is not None and p[1] is None]
    return max(indexes) + 1 if indexes else None


def holding_location(names: list[str], harvester_id: str | None,
                     count: int | None = None) -> str:
    """Of the webserver's location `names`, the one that holds `harvester_id`: the shard
    location whose shard holds it, else the default location (a single location
    deployment), else the only location. `count` is K for `..._shard_<i>` names
    (default: as many as the webserver serves). Raises NoHoldingLocation when the names
    are shards of which none holds the harvester (a location missing from the
    workspace)."""
    shards = []
    count = count or _count(names)
    for name in names:
        try:
            shard = Shard.of_location(name, count)
        except InvalidShard:
            continue
        if shard is not None:
            shards.append((name, shard))
    if harvester_id is not None:
        for name, shard in shards:
            if shard.holds(harvester_id):
                return name
        if shards:
            counts = sorted({shard.count for _, shard in shards})
            wanted = ", ".join(f"shard {shard_of(harvester_id, k)} of {k}" for k in counts)
            raise NoHoldingLocation(
                f"none of the webserver's code locations holds harvester {harvester_id} "
                f"({wanted}): add that location to the workspace")
    unsharded = [n for n in names if n not in {name for name, _ in shards}]
    if DEFAULT_LOCATION in unsharded or not unsharded:
        return DEFAULT_LOCATION
    return unsharded[0] if len(unsharded) == 1 else DEFAULT_LOCATION


def _location(client: httpx.Client, url: str, location: str | None,
              harvester_id: str | None) -> str:
    """The location named by the caller or the environment, else the one that holds
    the harvester among the webserver's locations."""
    named = location or os.environ.get(LOCATION_ENV)
    if named:
        return named
    data = _graphql(client, url, LOCATIONS_QUERY, {})["workspaceOrError"]
    names = [e["name"] for e in data.get("locationEntries") or []]
    return holding_location(names, harvester_id, _stored_count(names))


def _stored_count(names: list[str]) -> int | None:
    """The registry's K when some of `names` need it (None: unreadable, then inferred
    from the names)."""
    if _count(names) is None:
        return None
    import sqlalchemy as sa

    from oaipmh_dagster.storage.registry import Registry

    try:
        return Registry().shard_count()
    except (OAIPMHDagsterError, sa.exc.SQLAlchemyError):
        return None

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
    url: str | None = None, location: str | None = None, timeout: float = 120.0,
    harvester_id: str | None = None,
) -> tuple[bool, str]:
    """Reload `location`, or the location that holds `harvester_id`; returns (done,
    message). Never raises."""
    url = (url or os.environ.get(WEBSERVER_ENV) or DEFAULT_WEBSERVER).rstrip("/")
    target = location or os.environ.get(LOCATION_ENV) or DEFAULT_LOCATION
    try:
        with httpx.Client(timeout=httpx.Timeout(timeout, connect=2.0)) as client:
            target = _location(client, url, location, harvester_id)
            result = _graphql(client, url, RELOAD_MUTATION,
                              {"name": target})["reloadRepositoryLocation"]
    except NoHoldingLocation as exc:
        return False, str(exc)
    except (httpx.HTTPError, KeyError, TypeError, ValueError):
        return False, (f"no Dagster webserver answered at {url}: reload the code location "
                       f"'{target}' in the Dagster UI (Deployment > Reload), or set "
                       f"{WEBSERVER_ENV} to the webserver's address")
    if result.get("__typename") == "WorkspaceLocationEntry":
        return True, f"reloaded code location '{target}' at {url}"
    return False, f"reload of '{target}' at {url} failed: {result.get('message', result)}"


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
    name: str, url: str | None = None, location: str | None = None, timeout: float = 30.0,
    harvester_id: str | None = None,
) -> tuple[bool | None, str]:
    """Stop schedule `name` of `location` (or of the location that holds
    `harvester_id`) through the webserver (GraphQL). Returns (True, message) when stopped
    or not running, (False, message) when the webserver refused, (None, message) when no
    webserver answered. Never raises."""
    url = (url or os.environ.get(WEBSERVER_ENV) or DEFAULT_WEBSERVER).rstrip("/")
    try:
        with httpx.Client(timeout=httpx.Timeout(timeout, connect=2.0)) as client:
            target = _location(client, url, location, harvester_id)
            selector = {"repositoryLocationName": target, "repositoryName": "__repository__",
                        "scheduleName": name}
            found = _graphql(client, url, SCHEDULE_QUERY, {"selector": selector})
            schedule = found["scheduleOrError"]
            if schedule.get("__typename") != "Schedule":
                return True, f"no schedule {name} in '{target}' at {url}"
            if schedule["scheduleState"]["status"] != "RUNNING":
                return True, f"schedule {name} is not running"
            result = _graphql(client, url, STOP_SCHEDULE_MUTATION,
                              {"id": schedule["id"]})["stopRunningSchedule"]
    except NoHoldingLocation as exc:
        return False, str(exc)
    except (httpx.HTTPError, KeyError, TypeError, ValueError):
        return None, f"no Dagster webserver answered at {url}"
    if result.get("__typename") == "ScheduleStateResult":
        return True, f"stopped schedule {name}"
    return False, f"stopping schedule {name} at {url} failed: {result.get('message', result)}"


def holding_location_name(harvester_id: str, url: str | None = None,
                          timeout: float = 10.0) -> str | None:
    """The name of the code location that holds `harvester_id`: the one
    `OAIPMH_DAGSTER_LOCATION` names, else the one found among the webserver's locations;
    None when no webserver answers (or none of its locations holds it). Never raises."""
    url = (url or os.environ.get(WEBSERVER_ENV) or DEFAULT_WEBSERVER).rstrip("/")
    try:
        with httpx.Client(timeout=httpx.Timeout(timeout, connect=2.0)) as client:
            return _location(client, url, None, harvester_id)
    except (NoHoldingLocation, httpx.HTTPError, KeyError, TypeError, ValueError):
        return None


def _graphql(client: httpx.Client, url: str, query: str, variables: dict) -> dict:
    resp = client.post(f"{url}/graphql", json={"query": query, "variables": variables})
    resp.raise_for_status()
    return resp.json()["data"]
