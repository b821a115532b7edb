"""The `manage_harvesters` job: add, update or remove a harvester from the Launchpad,
through `admin` (the command line's code path), then reload the code location that
holds it; and the `oaipmh/registry` asset, the registry's rows as a Markdown table.

With sharded code locations, only the unsharded location or shard 0 hosts the job and
the asset (`hosts_manage_job`): one job and one asset key for the whole deployment,
whichever shard the harvester lands in."""

import re
from collections.abc import Callable, Sequence
from typing import Any

import dagster as dg
from pydantic import Field

from oaipmh_dagster.admin import (
    HTTP_FIELDS,
    AdminError,
    Change,
    add_harvester,
    remove_harvester,
    update_harvester,
)
from oaipmh_dagster.contracts import ASSET_PREFIX
from oaipmh_dagster.dagster_parts.resources import OAIPMHDatabase
from oaipmh_dagster.registry import Harvester, InvalidRow, Registry
from oaipmh_dagster.shards import DEFAULT_LOCATION, InvalidShard, Shard, shard_of

__all__ = ["MANAGE_JOB", "MANAGE_OP", "REGISTRY_KEY", "DagsterInstanceSide", "ManageConfig",
           "build_manage_job", "hosts_manage_job", "registry_asset", "registry_markdown"]

MANAGE_JOB = "manage_harvesters"
MANAGE_OP = "manage_harvester"  # run config: ops: {manage_harvester: {config: ...}}
REGISTRY_KEY = dg.AssetKey([ASSET_PREFIX, "registry"])
TABLE_KEY = "registry"
ACTIONS = ("add", "update", "remove")
_ADD = {"url", "prefix", "sets", "cron", "timezone", "enabled", "name", "transformer",
        "no_check", "validate_schema", *HTTP_FIELDS}
# Which fields each action reads (besides action and id); others must stay at default.
USED = {"add": _ADD, "update": _ADD | {"all_sets", "no_cron", "no_validate"},
        "remove": {"delete_records"}}


class ManageConfig(dg.Config):
    """What to do: the options of `oaipmh-dagster harvester add/update/remove`."""

    action: str = Field(description="add, update or remove.")
    id: str = Field(description="Harvester id: 1-48 characters a-z, 0-9 and _, starting "
                    "with a letter or digit (it names the job harvest_oaipmh_records_<id>).")
    url: str | None = Field(default=None, description="Base URL of the OAI-PMH endpoint "
                            "(add: required).")
    prefix: str | None = Field(default=None, description="metadataPrefix to harvest, e.g. "
                               "oai_dc (add: required).")
    sets: list[str] = Field(default=[], description="Sets to harvest (add: none = all; "
                            "update: none = unchanged, else they replace the sets).")
    all_sets: bool = Field(default=False, description="update: harvest the whole "
                           "repository (clear the sets).")
    cron: str | None = Field(default=None, description="Schedule, a cron expression (add: "
                             "none = no scheduled runs; update: none = unchanged).")
    no_cron: bool = Field(default=False, description="update: remove the cron.")
    timezone: str | None = Field(default=None, description="Timezone of the cron (add: "
                                 "UTC).")
    enabled: bool | None = Field(default=None, description="Schedule running by default "
                                 "(add: true).")
    name: str | None = Field(default=None, description="Display name (add: the "
                             "repository's name from Identify).")
    transformer: str | None = Field(default=None, description="Built-in transformer, "
                                    "xslt:PATH[?name=value&...] (an XSLT stylesheet on the "
                                    "code server's filesystem) or package.module:function "
                                    "(add: by prefix).")
    timeout: float | None = Field(default=None, description="Read timeout per request, "
                                  "seconds (add: 60).")
    delay: float | None = Field(default=None, description="Minimum seconds between requests "
                                "(add: 0).")
    max_parallel: int | None = Field(default=None, description="Parallel requests to the "
                                     "host (add: 1).")
    max_retries: int | None = Field(default=None, description="Retries per request (add: "
                                    "5).")
    auth_env: str | None = Field(default=None, description="Name of the environment "
                                 "variable that holds 'user:password' or 'Bearer <token>'.")
    overlap: int | None = Field(default=None, description="Seconds to ask before the "
                                "remembered since (add: one day at day granularity, 5 "
                                "minutes at seconds granularity).")
    comment: str | None = Field(default=None, description="Free text.")
    reconcile_every: int | None = Field(default=None, description="Every Nth scheduled run "
                                        "also reconciles the store (0: never, the default).")
    max_delete: str | None = Field(default=None, description="The most records a sweep (a "
                                   "reconcile, or the sweep after a changed URL, prefix or "
                                   "sets) may tombstone without allow_mass_delete: a share "
                                   "of the live records such as 10% (add: 10%) or a count "
                                   "such as 1000.")
    validate_schema: str | None = Field(
        default=None, description="Validate each record against an XML Schema (invalid "
        "records are kept, with a schema error): 'shipped' for the schema shipped for the "
        "prefix, oai_dc, datacite or marc21 for that shipped schema, else the path of a "
        "schema file (the command line's --validate).")
    no_validate: bool = Field(default=False, description="update: stop validating.")
    no_check: bool = Field(default=False, description="Do not probe the endpoint "
                           "(Identify, the prefix and the sets it offers).")
    delete_records: bool = Field(default=False, description="remove: also delete the "
                                 "harvester's harvested records (kept otherwise).")


class DagsterInstanceSide:
    """`admin.InstanceSide` over a Dagster instance, opened only when needed."""

    def __init__(self, instance: Callable[[], dg.DagsterInstance]) -> None:
        self._instance = instance

    def stop_schedule(self, name: str) -> int:
        from oaipmh_dagster.dagster_parts._private import stop_schedule_states

        return stop_schedule_states(self._instance(), name)

    def forget_since(self, harvester_id: str) -> None:
        from oaipmh_dagster.dagster_parts.assets import asset_keys
        from oaipmh_dagster.dagster_parts.since import since_observation

        self._instance().report_runless_asset_event(since_observation(
            asset_keys(harvester_id)[1], None, None, "harvester removed", operator=True))


def hosts_manage_job(location_name: str | None) -> bool:
    """Whether the code location named `location_name` hosts the job and the asset: an
    unsharded location, or shard 0."""
    try:
        shard = Shard.of_location(location_name)
    except InvalidShard:
        return False
    return shard is None or shard.index == 0


def holding_location(run_location: str | None, harvester_id: str) -> str | None:
    """The name of the code location that holds the harvester, from the name of the one
    this run belongs to (None: unknown, e.g. a run in process)."""
    shard = Shard.of_location(run_location) if run_location else None
    if run_location is None or shard is None:
        return run_location
    holder = shard_of(harvester_id, shard.count)
    return re.sub(r"shard_\d+_of_\d+$", f"shard_{holder}_of_{shard.count}", run_location)


def _escape(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def registry_markdown(rows: Sequence[Harvester | InvalidRow],
                      since: dict[str, str | None]) -> str:
    """The registry as a Markdown table: id, url, prefix, sets, cron, enabled, since."""
    lines = ["| id | url | prefix | sets | cron | enabled | since |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        if isinstance(r, InvalidRow):
            lines.append(f"| {_escape(r.id)} | invalid: {_escape(r.error)} | | | | | |")
            continue
        cells = [r.id, r.base_url, r.metadata_prefix, ", ".join(r.sets) or "(all)",
                 r.cron or "(none)", "yes" if r.enabled else "no",
                 since.get(r.id) or "(full next)"]
        lines.append("| " + " | ".join(_escape(c) for c in cells) + " |")
    if not rows:
        lines.append("| (no harvesters) | | | | | | |")
    return "\n".join(lines)


def _registry_metadata(instance: dg.DagsterInstance, registry: Registry) -> dict[str, Any]:
    from oaipmh_dagster.dagster_parts.harvester_state import harvester_states

    rows = registry.list_rows()
    states = harvester_states(instance, [r for r in rows if isinstance(r, Harvester)])
    since = {hid: state["since"] for hid, state in states.items()}
    return {"harvesters": len(rows),
            TABLE_KEY: dg.MetadataValue.md(registry_markdown(rows, since))}


@dg.asset(key=REGISTRY_KEY, group_name=ASSET_PREFIX, description=(
    "The harvester registry as a table (id, url, prefix, sets, cron, enabled, since): "
    f"materialized by {MANAGE_JOB} after each change; materialize it to refresh it after "
    "changes made with the oaipmh-dagster command."))
def registry_asset(context: dg.AssetExecutionContext,
                   oaipmh_db: OAIPMHDatabase) -> dg.MaterializeResult:
    """The registry's current rows as the materialization's metadata."""
    return dg.MaterializeResult(
        metadata=_registry_metadata(context.instance, Registry(oaipmh_db.engine())))


def _given(config: ManageConfig) -> dict[str, Any]:
    """The fields set to something other than their default."""
    defaults = ManageConfig.model_fields
    return {k: v for k, v in config.model_dump().items()
            if k not in ("action", "id") and v != defaults[k].default}


def apply(config: ManageConfig, registry: Registry, instance: dg.DagsterInstance,
          location: str | None) -> Change:
    """The change `config` asks for, through `admin`."""
    if config.action not in ACTIONS:
        raise AdminError(f"unknown action {config.action!r}: use add, update or remove",
                         usage=True)
    given = _given(config)
    unused = sorted(given.keys() - USED[config.action])
    if unused:
        raise AdminError(f"{config.action} does not take {', '.join(unused)}", usage=True)
    check = not given.pop("no_check", False)
    if config.action == "remove":
        return remove_harvester(registry, config.id, delete_records=config.delete_records,
                                instance=DagsterInstanceSide(lambda: instance),
                                location=location)
    given["sets"] = tuple(given.get("sets", ()))
    if "validate_schema" in given:
        given["validate"] = given.pop("validate_schema")
    if config.action == "add":
        return add_harvester(registry, config.id, url=given.pop("url", None),
                             prefix=given.pop("prefix", None), check=check,
                             location=location, **given)
    return update_harvester(registry, config.id, check=check, location=location, **given)


def job_url(location: str | None, job: str) -> str:
    """The job's page in the Dagster UI."""
    from oaipmh_dagster.dagster_parts.alerts import ui_url

    return f"{ui_url()}/locations/{location or DEFAULT_LOCATION}/jobs/{job}"


def _run_location(context: dg.OpExecutionContext) -> str | None:
    origin = context.dagster_run.remote_job_origin
    return origin.location_name if origin is not None else None


@dg.op(name=MANAGE_OP, description="Add, update or remove one harvester.")
def manage_op(context: dg.OpExecutionContext, config: ManageConfig,
              oaipmh_db: OAIPMHDatabase) -> None:
    """Apply the change, log what changed and link the harvester's job, then refresh
    the registry table."""
    run_location = _run_location(context)
    holder = holding_location(run_location, config.id)
    registry = Registry(oaipmh_db.engine())
    try:
        change = apply(config, registry, context.instance,
                       run_location if holder == run_location else None)
    except AdminError as exc:
        context.log.error(str(exc))
        raise dg.Failure(description=str(exc), allow_retries=False) from None
    for line in change.lines:
        (context.log.warning if line.note else context.log.info)(line.text)
    if change.harvester is not None:
        context.log.info(f"job {change.harvester.job_name}: "
                         f"{job_url(holder, change.harvester.job_name)}")
    context.log_event(dg.AssetMaterialization(
        REGISTRY_KEY, description=f"after {change.action} {change.harvester_id}",
        metadata=_registry_metadata(context.instance, registry)))


def build_manage_job() -> dg.JobDefinition:
    """The `manage_harvesters` job: one op, its config flat."""

    @dg.job(name=MANAGE_JOB, description=(
        "Add, update or remove a harvester: config `action` (add, update or remove), `id`, "
        "and the options of `oaipmh-dagster harvester add/update/remove`. The endpoint is "
        "probed as on the command line (unless no_check); a refusal fails the run and "
        "writes nothing. Then the code location holding the harvester is reloaded, and "
        f"the asset {REGISTRY_KEY.to_user_string()} shows the registry."))
    def manage_harvesters() -> None:
        manage_op()

    return manage_harvesters
