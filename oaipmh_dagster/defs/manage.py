"""The `manage_harvesters` job: add, update or remove a harvester from the Launchpad,
through `admin` (the command line's code path), then reload the code location that
holds it; and the `oaipmh/registry` asset, the registry's rows as a Markdown table.

With sharded code locations, only the unsharded location or shard 0 hosts the job and
the asset (`hosts_manage_job`): one job and one asset key for the whole deployment,
whichever shard the harvester lands in."""

import re
from collections.abc import Callable, Sequence
from typing import Any, Literal

import dagster as dg
from pydantic import Field, create_model

from oaipmh_dagster.contracts import ASSET_PREFIX
from oaipmh_dagster.defs.resources import OAIPMHDatabase
from oaipmh_dagster.fields import declared
from oaipmh_dagster.formats import shipped_schemas_help
from oaipmh_dagster.operations.admin import (
    AdminError,
    Change,
    add_harvester,
    remove_harvester,
    update_harvester,
)
from oaipmh_dagster.operations.bulk import plan_import, write_import
from oaipmh_dagster.operations.harvester_files import Row
from oaipmh_dagster.operations.shards import (
    DEFAULT_LOCATION,
    InvalidShard,
    Shard,
    parse_location,
    shard_of,
)
from oaipmh_dagster.storage.registry import Harvester, InvalidRow, Registry

__all__ = ["MANAGE_JOB", "MANAGE_OP", "REGISTRY_KEY", "AddHarvester", "DagsterInstanceSide",
           "HarvesterRow", "ImportHarvesters", "ManageConfig", "RemoveHarvester",
           "UpdateHarvester", "build_manage_job",
           "hosts_manage_job", "launchpad_terms", "registry_asset", "registry_markdown"]

MANAGE_JOB = "manage_harvesters"
MANAGE_OP = "manage_harvester"  # run config: ops: {manage_harvester: {config: ...}}
REGISTRY_KEY = dg.AssetKey([ASSET_PREFIX, "registry"])
TABLE_KEY = "registry"
ACTIONS = ("add", "update", "remove", "import")
# The runs of this job are not retried: a refused change stays refused, and a change
# applied before a failure must not be applied twice.
RUN_TAGS = {"dagster/max_retries": "0"}
# Refused harvesters of an import named in the run's failure (the log has each).
SHOWN_REFUSALS = 10


class _Selection(dg.Config):
    """The shared options before the tuning fields."""

    sets: list[str] = Field(default=[], description="Sets to harvest (add: none = all; "
                            "update: none = unchanged, else they replace the sets).")
    cron: str | None = Field(default=None, description="Schedule, a cron expression (add: "
                             "none = no scheduled runs; update: none = unchanged).")
    timezone: str | None = Field(default=None, description="Timezone of the cron (add: "
                                 "UTC).")
    enabled: bool | None = Field(default=None, description="Schedule running by default "
                                 "(add: true).")
    name: str | None = Field(default=None, description="Display name (add: the "
                             "repository's name from Identify).")
    transformer: str | None = Field(default=None, description="Built-in transformer, "
                                    "xslt:PATH[?name=value&...] (an XSLT stylesheet on the "
                                    "code server's filesystem), a plugin's entry-point name "
                                    "(group oaipmh_dagster.transformers) or "
                                    "package.module:function with the module listed in "
                                    "$OAIPMH_TRANSFORMER_MODULES (add: by prefix).")


def options_model(cls: type = Harvester) -> type[dg.Config]:
    """The shared options with one optional field per tuning field declared on `cls`
    (see `fields`), in their order."""
    tuning: dict[str, Any] = {
        f.name: (f.type | None, Field(default=None, description=f.config_help))
        for f in declared(cls)}
    return create_model("_Tuning", __base__=_Selection, **tuning)


class _Options(options_model()):  # type: ignore[misc]
    """The options `harvester add` and `harvester update` share (left out: add's default;
    on update: unchanged)."""

    validate_schema: str | None = Field(
        default=None, description="Validate each record against an XML Schema (invalid "
        "records are kept, with a schema error): 'shipped' for the schema shipped for the "
        f"prefix, {shipped_schemas_help('or')} for that shipped schema, schematron:PATH for "
        "an ISO Schematron file (failed assertions become schematron errors), else the "
        "path of a schema file.")
    no_check: bool = Field(default=False, description="Do not probe the endpoint "
                           "(Identify, the prefix and the sets it offers).")


_ID_HELP = ("Harvester id: 1-48 characters a-z, 0-9 and _, starting with a letter or digit "
            "(it names the job harvest_oaipmh_records_<id>).")


class AddHarvester(_Options):
    """`oaipmh-dagster harvester add`."""

    kind: Literal["add"] = "add"
    id: str = Field(description=_ID_HELP)
    url: str = Field(description="Base URL of the OAI-PMH endpoint.")
    prefix: str = Field(description="metadataPrefix to harvest, e.g. oai_dc.")


class UpdateHarvester(_Options):
    """`oaipmh-dagster harvester update`: only the fields given change."""

    kind: Literal["update"] = "update"
    id: str = Field(description="The harvester to change.")
    url: str | None = Field(default=None, description="Base URL of the OAI-PMH endpoint.")
    prefix: str | None = Field(default=None, description="metadataPrefix to harvest.")
    all_sets: bool = Field(default=False, description="Harvest the whole repository (clear "
                           "the sets).")
    no_cron: bool = Field(default=False, description="Remove the cron.")
    no_validate: bool = Field(default=False, description="Stop validating.")


class HarvesterRow(options_model()):  # type: ignore[misc]
    """One harvester of an import: the fields of `add` (left out: add's default)."""

    id: str = Field(description=_ID_HELP)
    url: str = Field(description="Base URL of the OAI-PMH endpoint.")
    prefix: str = Field(description="metadataPrefix to harvest, e.g. oai_dc.")
    validate_schema: str | None = Field(
        default=None, description="Validate each record against an XML Schema: 'shipped' "
        f"for the schema shipped for the prefix, {shipped_schemas_help('or')}, else the "
        "path of a schema file (left out: no validation).")


class ImportHarvesters(dg.Config):
    """`oaipmh-dagster harvester import`: many harvesters in one run, validated (and
    probed) all before any is written, written in one transaction."""

    kind: Literal["import"] = "import"
    harvesters: list[HarvesterRow] = Field(description="The harvesters, each with the "
                                           "fields of add; a row is the whole harvester.")
    update: bool = Field(default=False, description="Replace the fields of harvesters "
                         "that exist (else an existing id fails the run).")
    no_check: bool = Field(default=False, description="Do not probe the endpoints.")
    skip_invalid: bool = Field(default=False, description="Write the valid harvesters and "
                               "log the refused ones (else one refusal fails the run).")


class RemoveHarvester(dg.Config):
    """`oaipmh-dagster harvester remove`."""

    kind: Literal["remove"] = "remove"
    id: str = Field(description="The harvester to remove.")
    delete_records: bool = Field(default=False, description="Also delete the harvester's "
                                 "harvested records (kept otherwise).")


Action = AddHarvester | UpdateHarvester | RemoveHarvester | ImportHarvesters


class ManageConfig(dg.Config):
    """What to do: one of add, update, remove or import, with the options of
    `oaipmh-dagster harvester add/update/remove/import` (dashes as underscores)."""

    action: Action = Field(discriminator="kind", description="add, update, remove or "
                           "import, with the fields that action takes.")


# The command line's options named in admin's messages, as this job's config calls them.
_LAUNCHPAD_TERMS = {"--validate": "validate_schema", "--set": "sets"}


def launchpad_terms(message: str) -> str:
    """`message` with the command line's `--option` names written as config fields."""
    return re.sub(r"--([a-z][a-z-]*)",
                  lambda m: _LAUNCHPAD_TERMS.get(m.group(0), m.group(1).replace("-", "_")),
                  message)


class DagsterInstanceSide:
    """`admin.InstanceSide` over a Dagster instance, opened only when needed."""

    def __init__(self, instance: Callable[[], dg.DagsterInstance]) -> None:
        self._instance = instance

    def stop_schedule(self, name: str) -> int:
        from oaipmh_dagster.defs._private import stop_schedule_states

        return stop_schedule_states(self._instance(), name)

    def forget_since(self, harvester_id: str) -> None:
        from oaipmh_dagster.defs.assets import asset_keys
        from oaipmh_dagster.defs.since import since_observation

        self._instance().report_runless_asset_event(since_observation(
            asset_keys(harvester_id)[1], None, None, "harvester removed", operator=True))


def hosts_manage_job(location_name: str | None) -> bool:
    """Whether the code location named `location_name` hosts the job and the asset: an
    unsharded location, or shard 0."""
    parsed = parse_location(location_name)
    if parsed is None:
        return True
    index, named = parsed
    try:
        if named is not None:
            Shard(index, named)  # a name of earlier versions that carries K: a valid shard?
    except InvalidShard:
        return False
    return index == 0


def holding_location(run_location: str | None, harvester_id: str,
                     count: int | None = None) -> str | None:
    """The name of the code location that holds the harvester, from the name of the one
    this run belongs to (None: unknown, e.g. a run in process); `count` is the stored
    K, for names that do not carry it (without it: the run's own location)."""
    parsed = parse_location(run_location) if run_location else None
    if run_location is None or parsed is None:
        return run_location
    index, named = parsed
    if named is not None:
        holder = shard_of(harvester_id, named)
        return re.sub(r"shard([_-])\d+\1of\1\d+$", rf"shard\g<1>{holder}\g<1>of\g<1>{named}",
                      run_location)
    if count is None:
        return run_location
    return re.sub(r"shard([_-])\d+$", rf"shard\g<1>{shard_of(harvester_id, count)}",
                  run_location)


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
    from oaipmh_dagster.defs.harvester_state import harvester_states

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


def _given(action: AddHarvester | UpdateHarvester) -> dict[str, Any]:
    """The fields set to something other than their default (`id` and `kind` aside)."""
    fields = type(action).model_fields
    return {k: v for k, v in action.model_dump().items()
            if k not in ("kind", "id") and v != fields[k].default}


def apply(config: ManageConfig, registry: Registry, instance: dg.DagsterInstance,
          location: str | None) -> Change:
    """The change `config` asks for, through `admin` (an add, update or remove)."""
    action = config.action
    if isinstance(action, ImportHarvesters):
        raise TypeError("an import is no single change: see `import_harvesters`")
    if isinstance(action, RemoveHarvester):
        return remove_harvester(registry, action.id, delete_records=action.delete_records,
                                instance=DagsterInstanceSide(lambda: instance),
                                location=location)
    given = _given(action)
    check = not given.pop("no_check", False)
    given["sets"] = tuple(given.get("sets", ()))
    if "validate_schema" in given:
        given["validate"] = given.pop("validate_schema")
    if isinstance(action, AddHarvester):
        return add_harvester(registry, action.id, url=given.pop("url"),
                             prefix=given.pop("prefix"), check=check, location=location,
                             **given)
    return update_harvester(registry, action.id, check=check, location=location, **given)


def job_url(location: str | None, job: str) -> str:
    """The job's page in the Dagster UI."""
    from oaipmh_dagster.defs.alerts import ui_url

    return f"{ui_url()}/locations/{location or DEFAULT_LOCATION}/jobs/{job}"


def _run_location(context: dg.OpExecutionContext) -> str | None:
    origin = context.dagster_run.remote_job_origin
    return origin.location_name if origin is not None else None


def _import_rows(action: ImportHarvesters) -> list[Row]:
    """The action's harvesters as the rows of a file (`validate_schema` is `validate`)."""
    rows = []
    for number, item in enumerate(action.harvesters, 1):
        values = item.model_dump()
        values["validate"] = values.pop("validate_schema")
        rows.append(Row(number, f"harvesters[{number - 1}]", values))
    return rows


def import_harvesters(action: ImportHarvesters, registry: Registry,
                      run_location: str | None, log: Any) -> str:
    """Plan and write an import (see `bulk`); each refused row logged as an error, and
    one refusal fails the run unless `skip_invalid`. Returns what was done."""
    plan = plan_import(registry, _import_rows(action), update=action.update,
                       check=not action.no_check)
    for bad in plan.bad:
        log.error(launchpad_terms(f"{'skipped ' if action.skip_invalid else ''}{bad}"))
    if plan.bad and not action.skip_invalid:
        shown = "; ".join(map(str, plan.bad[:SHOWN_REFUSALS]))
        more = len(plan.bad) - SHOWN_REFUSALS
        raise AdminError(f"{len(plan.bad)} of {plan.rows} harvesters refused, nothing "
                         f"written (skip_invalid writes the valid ones): {shown}"
                         + (f"; and {more} more (see the log)" if more > 0 else ""),
                         usage=plan.usage)
    count = registry.shard_count() if run_location is not None else None

    def locate(harvester_id: str) -> str | None:
        holder = holding_location(run_location, harvester_id, count)
        return run_location if holder == run_location else None

    done = write_import(registry, plan, locate=locate)
    for line in done.lines:
        (log.warning if line.note else log.info)(line.text)
    return (f"import: {len(done.added)} added, {len(done.updated)} updated, "
            f"{len(plan.unchanged)} unchanged, {len(plan.bad)} skipped")


@dg.op(name=MANAGE_OP, description="Add, update or remove one harvester, or import many.")
def manage_op(context: dg.OpExecutionContext, config: ManageConfig,
              oaipmh_db: OAIPMHDatabase) -> None:
    """Apply the change, log what changed and link the harvester's job, then refresh
    the registry table."""
    run_location = _run_location(context)
    registry = Registry(oaipmh_db.engine())
    action = config.action
    try:
        if isinstance(action, ImportHarvesters):
            said = import_harvesters(action, registry, run_location, context.log)
        else:
            said = _apply_one(context, config, registry, run_location)
    except AdminError as exc:
        message = launchpad_terms(str(exc))
        context.log.error(message)
        raise dg.Failure(description=message, allow_retries=False) from None
    context.log_event(dg.AssetMaterialization(
        REGISTRY_KEY, description=f"after {said}",
        metadata=_registry_metadata(context.instance, registry)))


def _apply_one(context: dg.OpExecutionContext, config: ManageConfig, registry: Registry,
               run_location: str | None) -> str:
    """An add, update or remove, its lines logged and the harvester's job linked."""
    assert not isinstance(config.action, ImportHarvesters)
    holder = holding_location(run_location, config.action.id, registry.shard_count())
    change = apply(config, registry, context.instance,
                   run_location if holder == run_location else None)
    for line in change.lines:
        (context.log.warning if line.note else context.log.info)(line.text)
    if change.harvester is not None:
        context.log.info(f"job {change.harvester.job_name}: "
                         f"{job_url(holder, change.harvester.job_name)}")
    return f"{change.action} {change.harvester_id}"


def build_manage_job() -> dg.JobDefinition:
    """The `manage_harvesters` job: one op whose config is a choice of action. It runs in
    the launching process (a one-op job gains nothing from a process of its own, which
    took most of a change's 18-39 s) and is never retried."""
    description = (
        "Add, update or remove a harvester, or import many: config `action`, one of "
        "`add`, `update`, `remove` or `import` with the fields it takes (`id`, and the "
        "options of `oaipmh-dagster harvester add/update/remove/import` with underscores; "
        "`import` takes a list `harvesters` of add's fields). The endpoint is probed as on "
        "the command line (unless no_check); a refusal fails the run and writes nothing. "
        "Then the code location holding the harvester (each shard holding an imported "
        "one) is reloaded, and the asset "
        f"{REGISTRY_KEY.to_user_string()} shows the registry.")

    @dg.job(name=MANAGE_JOB, executor_def=dg.in_process_executor, tags=RUN_TAGS,
            description=description)
    def manage_harvesters() -> None:
        manage_op()

    return manage_harvesters
