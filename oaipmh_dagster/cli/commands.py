"""The `oaipmh-dagster` command: registry CRUD, harvest, records, export, demo.

Every bad input gives one line on stderr and exit code 2 (usage) or 1 (failure),
and writes nothing."""

from __future__ import annotations

import json
import logging
import os
import sys
import traceback
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn

import click
import sqlalchemy as sa

from oaipmh_dagster.cli.stdout import READER_GONE, guard_closed_stdout, quiet_stdout, reader_gone
from oaipmh_dagster.fields import declared
from oaipmh_dagster.formats import schema_prefixes_help, shipped_schemas_help
from oaipmh_dagster.operations.shards import DEFAULT_LOCATION, MAX_SHARDS
from oaipmh_dagster.storage import db
from oaipmh_dagster.storage.registry import (
    Harvester,
    HarvesterNotFound,
    InvalidHarvester,
    Registry,
    RegistryError,
    validate_url,
)
from oaipmh_dagster.words import count, datestamp, human


class UsageProblem(click.ClickException):
    """Bad input: exit code 2."""

    exit_code = 2


class Failure(click.ClickException):
    """Could not do it: exit code 1."""

    exit_code = 1


def _registry() -> Registry:
    try:
        return Registry(db.get_engine())
    except db.DatabaseUnavailable as exc:
        raise Failure(str(exc)) from exc


def _admin(do: Any, *args: Any, **kwargs: Any) -> Any:
    """`do(registry, ...)` of `admin`, its lines echoed (notes on stderr) and its refusal
    one error line: exit 2 for bad input, else 1."""
    from oaipmh_dagster.operations.admin import AdminError

    try:
        change = do(_registry, *args, **kwargs)
    except AdminError as exc:
        raise (UsageProblem if exc.usage else Failure)(str(exc)) from exc
    for line in change.lines:
        click.echo(f"note: {line.text}" if line.note else line.text, err=line.note)
    return change


class _Settings:
    """Options of the whole command, set by `cli` and read by `main` on an error."""

    verbose = False


class _ReaderGone(Exception):
    """stdout's reader went away (`| head`): the command ends quietly."""


def _reader_went_away(exc: BrokenPipeError) -> NoReturn:
    """Raise `_ReaderGone` when `exc` came from stdout, else `exc` itself."""
    if reader_gone():
        raise _ReaderGone from exc
    raise exc


class _Commands(click.Group):
    """The command group; a write to a stdout whose reader went away ends the command
    with `_ReaderGone` (click alone would exit 1)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError as exc:
            _reader_went_away(exc)


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="oaipmh-dagster")
@click.option("--verbose", "-v", is_flag=True, help="Show Dagster's run log and full "
              "tracebacks on stderr (otherwise an error is one line).")
def cli(verbose: bool) -> None:
    """OAI-PMH harvesters as a Dagster code location.

    The database is $OAIPMH_DATABASE_URL (default: a SQLite file in $DAGSTER_HOME)."""
    _Settings.verbose = verbose


@cli.command()
def init() -> None:
    """Create or upgrade the tables (idempotent)."""
    try:
        engine = db.get_engine(migrate=False)
        rev = db.upgrade(engine)
    except db.DatabaseUnavailable as exc:
        raise Failure(str(exc)) from exc
    click.echo(f"database {db.redact(str(engine.url))} at schema revision {rev}")


def _inspect_options(f):  # noqa: ANN001, ANN202 - click decorator plumbing
    f = click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=30.0,
                     show_default=True, help="Read timeout per request, seconds.")(f)
    f = click.option("--json", "as_json", is_flag=True, help="As JSON.")(f)
    return click.argument("url", metavar="URL")(f)


def _ask(url: str, timeout: float, what: Any) -> Any:
    """`what(client)` against the endpoint at `url`: bad URLs are usage errors, a failed
    request or an answer that is not OAI-PMH is one failure line."""
    from oaipmh_dagster.oai import OAIError
    from oaipmh_dagster.operations.endpoint import client

    try:
        validate_url(url)
    except InvalidHarvester as exc:
        raise UsageProblem(str(exc)) from exc
    try:
        with client(url, timeout) as c:
            return what(c)
    except OAIError as exc:
        raise Failure(f"{url} did not answer as an OAI-PMH endpoint: {exc}") from exc


def _echo_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, ensure_ascii=False))


@cli.command()
@_inspect_options
def identify(url: str, as_json: bool, timeout: float) -> None:
    """What the endpoint at URL says about itself (the Identify verb)."""
    from oaipmh_dagster.operations.endpoint import describe_identify

    data = describe_identify(_ask(url, timeout, lambda c: c.identify()))
    if as_json:
        _echo_json(data)
        return
    from tabulate import tabulate

    labels = {"repository_name": "repository name", "base_url": "base URL",
              "protocol_version": "protocol version", "granularity": "granularity",
              "earliest_datestamp": "earliest datestamp", "deleted_record": "deleted records",
              "admin_emails": "admin emails", "compression": "compression"}
    rows = [[label + ":", ", ".join(v) if isinstance(v, list) else v]
            for key, label in labels.items() for v in [data[key]]]
    click.echo(tabulate([[k, v if v not in (None, "") else "-"] for k, v in rows],
                        tablefmt="plain"))


@cli.command("sets")
@_inspect_options
def sets_(url: str, as_json: bool, timeout: float) -> None:
    """The sets of the endpoint at URL (ListSets, every page)."""
    from oaipmh_dagster.operations.endpoint import describe_sets

    items = describe_sets(_ask(url, timeout, lambda c: list(c.list_sets())))
    if as_json:
        _echo_json(items)
        return
    if not items:
        click.echo(f"{url} has no sets (it harvests as a whole)")
        return
    from tabulate import tabulate

    click.echo(tabulate([[i["spec"], i["name"]] for i in items],
                        headers=["setSpec", "setName"]))
    click.echo(f"{len(items)} sets")


@cli.command()
@_inspect_options
def formats(url: str, as_json: bool, timeout: float) -> None:
    """The metadata formats of the endpoint at URL (ListMetadataFormats)."""
    from oaipmh_dagster.operations.endpoint import describe_formats

    items = describe_formats(_ask(url, timeout, lambda c: c.list_metadata_formats()))
    if as_json:
        _echo_json(items)
        return
    from tabulate import tabulate

    click.echo(tabulate([[i["prefix"], i["schema"], i["namespace"]] for i in items],
                        headers=["metadataPrefix", "schema", "namespace"]))


@cli.group()
def harvester() -> None:
    """Add, list, show, update and remove harvesters."""


def tuning_options(cls: type = Harvester) -> Callable[[Any], Any]:
    """A decorator adding one option per tuning field declared on `cls` (see `fields`),
    in their order; an option left out gives None."""
    options = []
    for f in declared(cls):
        kind: Any = None if f.type is str else f.type
        if f.input_minimum is not None:
            kind = click.IntRange(min=f.input_minimum)
        options.append(click.option(f.flag, f.name, type=kind, metavar=f.metavar,
                                    help=f.cli_help))

    def decorate(command: Any) -> Any:
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


_VALIDATE_HELP = ("Validate each record against an XML Schema; invalid records are kept, "
                  "with an error of type schema. Alone: the schema shipped for the prefix "
                  f"({schema_prefixes_help()}); with a value: a shipped schema's name "
                  f"({shipped_schemas_help()}), the path of a schema file (its imports "
                  "and includes must be local files) or schematron:PATH, an ISO Schematron "
                  "file whose failed assertions become errors of type schematron.")


def _validate_option(f):  # noqa: ANN001, ANN202 - click decorator plumbing
    return click.option("--validate", is_flag=False, flag_value="", default=None,
                        metavar="[PATH]", help=_VALIDATE_HELP)(f)


@harvester.command("add")
@click.argument("harvester_id", metavar="ID")
@click.option("--url", required=True, help="Base URL of the OAI-PMH endpoint.")
@click.option("--prefix", required=True, help="metadataPrefix to harvest (e.g. oai_dc).")
@click.option("--set", "sets", multiple=True, help="A set to harvest (repeatable; none = all).")
@click.option("--cron", help="Schedule, a cron expression (none = no scheduled runs).")
@click.option("--timezone", default="UTC", show_default=True, help="Timezone of the cron.")
@click.option("--enabled/--disabled", default=True, help="Schedule running by default.")
@click.option("--name", help="Display name.")
@click.option("--transformer", help="Built-in transformer, xslt:PATH[?name=value&...] (an "
              "XSLT stylesheet, path made absolute), a plugin's entry-point name or "
              "package.module:function with the module listed in "
              "$OAIPMH_TRANSFORMER_MODULES (default by prefix).")
@click.option("--no-check", is_flag=True, help="Do not probe the endpoint.")
@_validate_option
@tuning_options()
def harvester_add(harvester_id: str, url: str, prefix: str, sets: tuple[str, ...],
                  cron: str | None, timezone: str, enabled: bool, name: str | None,
                  transformer: str | None, no_check: bool, validate: str | None,
                  **http: Any) -> None:
    """Register a harvester (probes the endpoint unless --no-check)."""
    from oaipmh_dagster.operations.admin import add_harvester

    _admin(add_harvester, harvester_id, url=url, prefix=prefix, sets=sets, cron=cron,
           timezone=timezone, enabled=enabled, name=name, transformer=transformer,
           check=not no_check, validate=validate, **http)


@harvester.command("update")
@click.argument("harvester_id", metavar="ID")
@click.option("--url", help="Base URL of the OAI-PMH endpoint.")
@click.option("--prefix", help="metadataPrefix to harvest.")
@click.option("--set", "sets", multiple=True, help="Replace the sets (repeatable).")
@click.option("--all-sets", is_flag=True, help="Harvest the whole repository (clear sets).")
@click.option("--cron", help="Schedule, a cron expression.")
@click.option("--no-cron", is_flag=True, help="Remove the cron (no scheduled runs).")
@click.option("--timezone", help="Timezone of the cron.")
@click.option("--enabled/--disabled", default=None, help="Schedule running by default.")
@click.option("--name", help="Display name.")
@click.option("--transformer", help="Built-in transformer, xslt:PATH[?name=value&...], a "
              "plugin's entry-point name or package.module:function (module listed in "
              "$OAIPMH_TRANSFORMER_MODULES).")
@click.option("--no-check", is_flag=True, help="Do not probe the endpoint.")
@_validate_option
@click.option("--no-validate", is_flag=True, help="Stop validating records (their schema "
              "errors go at the next full harvest).")
@tuning_options()
def harvester_update(harvester_id: str, sets: tuple[str, ...], all_sets: bool, no_cron: bool,
                     no_check: bool, url: str | None, prefix: str | None, **fields: Any) -> None:
    """Change fields of a harvester."""
    from oaipmh_dagster.operations.admin import update_harvester

    _admin(update_harvester, harvester_id, url=url, prefix=prefix, sets=sets,
           all_sets=all_sets, no_cron=no_cron, check=not no_check, **fields)


@harvester.command("remove")
@click.argument("harvester_id", metavar="ID")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option("--delete-records", is_flag=True, help="Also delete its harvested records.")
def harvester_remove(harvester_id: str, yes: bool, delete_records: bool) -> None:
    """Remove a harvester (its schedule is stopped first; records are kept unless asked)."""
    from oaipmh_dagster.defs.manage import DagsterInstanceSide
    from oaipmh_dagster.operations.admin import remove_harvester

    def confirm(label: str) -> None:
        if not yes and not _confirm(f"remove harvester {label}?"):
            raise Failure(f"harvester {harvester_id} not removed (confirm, or pass --yes)")

    _admin(remove_harvester, harvester_id, instance=DagsterInstanceSide(_instance),
           delete_records=delete_records, confirm=confirm)


_FILE_FORMATS = click.Choice(["csv", "json", "yaml"])


@harvester.command("import")
@click.argument("file", metavar="FILE")
@click.option("--format", "fmt", type=_FILE_FORMATS, help="The file's format (default: "
              "by its extension; needed for '-', stdin).")
@click.option("--update", is_flag=True, help="Replace the fields of harvesters that "
              "exist (else an existing id is a bad row).")
@click.option("--no-check", is_flag=True, help="Do not probe the endpoints.")
@click.option("--skip-invalid", is_flag=True, help="Write the valid rows and list the "
              "bad ones (else one bad row refuses the whole file).")
def harvester_import(file: str, fmt: str | None, update: bool, no_check: bool,
                     skip_invalid: bool) -> None:
    """Add (or with --update, change) the harvesters of a CSV, JSON or YAML file, one
    per row with the options of `harvester add` as columns: every row is validated, and
    the endpoints probed, before all are written at once."""
    from oaipmh_dagster.cli.harvester_io import import_harvesters

    import_harvesters(file, fmt, update=update, check=not no_check,
                      skip_invalid=skip_invalid)


@harvester.command("export")
@click.option("--format", "fmt", type=_FILE_FORMATS, help="Default: by the output's "
              "extension; json on stdout.")
@click.option("-o", "--output", default="-", show_default=True, metavar="FILE",
              help="A file (replaced only when the export succeeds) or '-' for stdout.")
def harvester_export(fmt: str | None, output: str) -> None:
    """Write every harvester as `harvester import` reads it (CSV, JSON or YAML)."""
    from oaipmh_dagster.cli.harvester_io import export_harvesters

    export_harvesters(fmt, output)


def _publish_since(harvester_id: str, value: str | None, source: str,
                   h: Harvester | None = None) -> None:
    """Publish an operator's since for the harvester (None: the next harvest is full)."""
    from oaipmh_dagster.defs.assets import asset_keys
    from oaipmh_dagster.defs.since import since_observation
    from oaipmh_dagster.harvesting import incremental

    scope = incremental.scope(h.base_url, h.metadata_prefix, h.sets) if h else None
    _instance().report_runless_asset_event(
        since_observation(asset_keys(harvester_id)[1], value, scope, source, operator=True)
    )


def _confirm(question: str) -> bool:
    """Ask on a terminal; without one, read one answer line from stdin (none = no)."""
    try:
        if sys.stdin is not None and sys.stdin.isatty():
            return click.confirm(question, err=True)
        answer = sys.stdin.readline() if sys.stdin is not None else ""
    except (click.exceptions.Abort, OSError, ValueError):
        return False
    return answer.strip().lower() in ("y", "yes")


def _no_database_yet() -> bool:
    """Whether the default SQLite file does not exist: a read finds nothing there, and
    must not create it (a command run from another folder would leave a new one)."""
    path = db.default_sqlite_path()
    return path is not None and not path.exists()


@harvester.command("list")
@click.option("--json", "as_json", is_flag=True, help="A JSON list of harvester objects, "
              "each with a `state`: {schedule, last_run, since}.")
@click.option("--verbose", "-v", "where", is_flag=True, help="First say which database "
              "and Dagster instance are read.")
def harvester_list(as_json: bool, where: bool) -> None:
    """List harvesters: the schedule's state in the Dagster instance ("no cron", "on",
    "off"), the last run and the since the next run would use."""
    from oaipmh_dagster.defs.harvester_state import harvester_states

    if where and not as_json:
        click.echo(f"reading {db.where()}")
    rows = [] if _no_database_yet() else _registry().list_rows()
    if not rows:
        click.echo("[]" if as_json else f"no harvesters in {db.where()} (add one with "
                   "`oaipmh-dagster harvester add`, or point DAGSTER_HOME or "
                   "OAIPMH_DATABASE_URL at the database that holds them)")
        return
    states = harvester_states(_instance(), [r for r in rows if isinstance(r, Harvester)])
    if as_json:
        click.echo(json.dumps([r.to_dict() | {"state": states[r.id]} if isinstance(r, Harvester)
                               else {"id": r.id, "invalid": r.error} for r in rows], indent=2))
        return
    from tabulate import tabulate

    table = []
    for r in rows:
        if not isinstance(r, Harvester):
            table.append([r.id, f"INVALID: {r.error}"] + [""] * 8)
            continue
        state, last = states[r.id], states[r.id]["last_run"]
        table.append([r.id, r.base_url, r.metadata_prefix, ",".join(r.sets) or "-",
                      r.cron or "-", state["schedule"],
                      f"{last['status']} {last['at']}" if last else "-",
                      state["since"] or "full next", r.transformer, r.schema or "-"])
    click.echo(tabulate(table, headers=["id", "url", "prefix", "sets", "cron", "schedule",
                                        "last run", "since", "transformer", "validate"],
                        disable_numparse=True))


@harvester.command("show")
@click.argument("harvester_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="The harvester as a JSON object.")
def harvester_show(harvester_id: str, as_json: bool) -> None:
    """Show one harvester."""
    h = _harvester(harvester_id)
    data = h.to_dict()
    data["since"] = _since_report(h)
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    for key, value in data.items():
        if key != "since":
            click.echo(f"{key:>16}: {human(value)}")
    click.echo(f"{'job/schedule':>16}: {h.job_name}")
    click.echo(f"{'next run':>16}: {data['since']['next_run']}")


def _since_report(h: Harvester) -> dict[str, Any]:
    from oaipmh_dagster.defs.assets import asset_keys
    from oaipmh_dagster.defs.since import since_report

    return since_report(_instance(), h, asset_keys(h.id)[1])


@cli.group()
def since() -> None:
    """Show and steer where each harvester's next incremental harvest starts."""


def _not_found(exc: HarvesterNotFound) -> Failure:
    """The error for an unknown harvester, naming the database and instance read."""
    return Failure(f"{exc} in {db.where()}")


def _harvester(harvester_id: str) -> Harvester:
    if _no_database_yet():
        raise _not_found(HarvesterNotFound(f"no harvester {harvester_id!r}"))
    try:
        return _registry().get(harvester_id)
    except HarvesterNotFound as exc:
        raise _not_found(exc) from exc


def _records_of(harvester_id: str) -> Registry:
    """The registry, once `harvester_id` names a harvester or records stored under it
    (a removed harvester's kept records); else one failure line, before anything is
    written."""
    registry = _registry()
    try:
        registry.get(harvester_id)
        return registry
    except InvalidHarvester:
        return registry  # its row is broken, its records are not
    except HarvesterNotFound as exc:
        from oaipmh_dagster.operations.record_query import has_records

        if not has_records(registry.engine, harvester_id):
            raise Failure(f"{exc} and no records stored under that id in {db.where()} "
                          "(see `oaipmh-dagster harvester list`)") from exc
    return registry


@since.command("show")
@click.argument("harvester_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="As a JSON object.")
def since_show(harvester_id: str, as_json: bool) -> None:
    """The since the next run would use, its source, and the last successful run."""
    report = _since_report(_harvester(harvester_id))
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    last = report["last_success"]
    click.echo(f"since: {report['since'] or '-'} ({report['source']})")
    click.echo(f"recorded by: {report['recorded_by'] or '-'}")
    click.echo(f"next run: {report['next_run']}")
    click.echo(f"last successful harvest: {last['at'] + ' (run ' + last['run_id'] + ')' if last else '-'}")


@since.command("set")
@click.argument("harvester_id", metavar="ID")
@click.argument("date", metavar="DATE")
def since_set(harvester_id: str, date: str) -> None:
    """The next harvest asks from=DATE (YYYY-MM-DD or an ISO 8601 datetime, UTC unless
    it has an offset); runs that started before this do not move it."""
    from oaipmh_dagster.oai import Granularity, format_datestamp

    h = _harvester(harvester_id)
    when = _checked_since(date, "since set")
    value = format_datestamp(when, Granularity.DAY if len(date.strip()) == 10
                             else Granularity.SECOND)
    _publish_since(h.id, value, "operator (oaipmh-dagster since set)", h)
    click.echo(f"since of {h.id} set to {value}: the next harvest asks from={value}")


@since.command("reset")
@click.argument("harvester_id", metavar="ID")
def since_reset(harvester_id: str) -> None:
    """Forget the since: the next harvest is a full one."""
    h = _harvester(harvester_id)
    _publish_since(h.id, None, "operator (oaipmh-dagster since reset)", h)
    click.echo(f"since of {h.id} reset: the next harvest is a full one")


def _instance():  # noqa: ANN202 - DagsterInstance, imported lazily
    """The configured Dagster instance ($DAGSTER_HOME, default ./.dagster_home)."""
    import dagster as dg

    home = db.dagster_home()
    os.environ.setdefault("DAGSTER_HOME", str(home))
    home.mkdir(parents=True, exist_ok=True)
    dagster_log = logging.getLogger("dagster")
    level = dagster_log.level
    if not _Settings.verbose:  # Dagster's advice to add a dagster.yaml is not an error
        dagster_log.setLevel(logging.ERROR)
    try:
        return dg.DagsterInstance.get()
    finally:
        dagster_log.setLevel(level)


@cli.command()
@click.argument("harvester_id", metavar="ID")
@click.option("--since", help="Harvest records changed on or after this date.")
@click.option("--until", help="Harvest records changed on or before this date (a day "
              "without a time: up to its end, 23:59:59Z).")
@click.option("--full", is_flag=True, help="Ignore the remembered since: harvest everything.")
@click.option("--oai-id", "oai_ids", multiple=True, help="Re-harvest exactly this identifier "
              "(repeatable).")
@click.option("--set", "sets", multiple=True, help="Harvest this set instead of the "
              "harvester's own (repeatable).")
@click.option("--no-resume", is_flag=True, help="Do not continue an interrupted harvest.")
@click.option("--reconcile", is_flag=True, help="Then list every identifier the server has "
              "and repair the store: fetch missing and stale records, tombstone the ones "
              "no longer listed.")
@click.option("--allow-mass-delete", is_flag=True, help="Let a sweep (--reconcile, or the "
              "first complete harvest after a changed URL, prefix or sets) tombstone more "
              "records than the harvester's max_delete allows.")
def harvest(harvester_id: str, since: str | None, until: str | None, full: bool,
            oai_ids: tuple[str, ...], sets: tuple[str, ...], no_resume: bool,
            reconcile: bool, allow_mass_delete: bool) -> None:
    """Run the job harvest_oaipmh_records_<ID> in this process on the Dagster instance."""
    _check_run_config(since, until, full, oai_ids, sets)
    if reconcile and (oai_ids or until or sets):
        raise UsageProblem("--reconcile compares the harvester's whole selection: it cannot "
                           "be combined with --oai-id, --until or --set")
    _harvester(harvester_id)
    from oaipmh_dagster.cli.runner import run_harvest_job

    config: dict[str, Any] = {"full": full, "resume": not no_resume}
    if reconcile:
        config["reconcile"] = True
    if allow_mass_delete:
        config["allow_mass_delete"] = True
    if since:
        config["since"] = since
    if until:
        config["until"] = until
    if oai_ids:
        config["oai_ids"] = list(oai_ids)
    if sets:
        config["sets"] = list(sets)
    from oaipmh_dagster.operations.reload import holding_location_name

    # The run belongs to the location's job (its Runs tab) when the location is known.
    ok, message = run_harvest_job(_instance(), harvester_id, config, verbose=_Settings.verbose,
                                  location=holding_location_name(harvester_id),
                                  on_summary=click.echo)
    if not ok:
        raise Failure(message if _Settings.verbose else
                      f"{message} (the run's log has the details; --verbose shows them here)")
    click.echo(message)


def _check_run_config(since: str | None, until: str | None, full: bool,
                      oai_ids: tuple[str, ...], sets: tuple[str, ...]) -> None:
    """Refuse what the run would fail on, before a run exists."""
    from oaipmh_dagster.harvesting.plan import until_datetime
    from oaipmh_dagster.storage.registry import SET_SPEC_PATTERN

    if full and since:
        raise UsageProblem("--full and --since exclude each other")
    since_dt = _checked_since(since, "--since") if since else None
    until_dt = _user_datetime("until", until, until_datetime)
    if since_dt and until_dt and since_dt > until_dt:
        raise UsageProblem(f"--since {since} is after --until {until}")
    for spec in sets:
        if not SET_SPEC_PATTERN.fullmatch(spec):
            raise UsageProblem(f"--set: invalid set spec {spec!r}")
    if any(not oai_id.strip() for oai_id in oai_ids):
        raise UsageProblem("--oai-id: an OAI identifier cannot be empty")


def _user_datetime(label: str, value: str | None,
                   parse: Callable[[str], datetime] | None = None) -> datetime | None:
    """`value` of option `--label` as a UTC datetime (None when not given)."""
    from oaipmh_dagster.oai import parse_user_datetime

    if not value:
        return None
    try:
        return (parse or parse_user_datetime)(value)
    except ValueError as exc:
        raise UsageProblem(f"--{label}: {exc}") from exc


def _checked_since(value: str, label: str) -> datetime:
    """An operator's since, refused (usage) when unreadable or ahead of this machine's
    clock: the one rule of `incremental.check_since` (the earliestDatestamp is judged
    when a run asks the server)."""
    from datetime import UTC

    from oaipmh_dagster.harvesting import incremental

    check = incremental.check_since(value, label, now=datetime.now(UTC))
    if check.when is None:
        raise UsageProblem(check.message + (": nothing would be harvested"
                                            if check.verdict == "ahead" else ""))
    return check.when


@cli.command()
@click.argument("harvester_id", metavar="ID")
@click.option("--errors", "errors_only", is_flag=True, help="Only records with errors.")
@click.option("--since", metavar="DATE", help="Only records whose datestamp is on or after "
              "DATE (YYYY-MM-DD or ISO 8601; UTC unless it has an offset).")
@click.option("--set", "set_spec", metavar="SET", help="Only records whose header lists SET.")
@click.option("--deleted/--live", "deleted", default=None,
              help="Only tombstones, or only live records.")
@click.option("--id", "oai_id", metavar="OAI_ID", help="Only this record (exit 1 if no "
              "record matches).")
@click.option("--raw", is_flag=True, help="Print each record's stored XML, after a "
              "<!-- identifier datestamp --> line; with --id, the XML alone. With --json: a "
              "raw_xml field.")
@click.option("--json", "as_json", is_flag=True, help="A JSON list of record objects.")
@click.option("--limit", type=click.IntRange(min=0), help="At most this many records.")
def records(harvester_id: str, errors_only: bool, since: str | None, set_spec: str | None,
            deleted: bool | None, oai_id: str | None, raw: bool, as_json: bool,
            limit: int | None) -> None:
    """Show the stored records of a harvester, ordered by identifier."""
    from itertools import islice

    from oaipmh_dagster.operations.record_query import Selection, select_records
    from oaipmh_dagster.storage.registry import SET_SPEC_PATTERN

    if set_spec is not None and not SET_SPEC_PATTERN.fullmatch(set_spec):
        raise UsageProblem(f"--set: invalid set spec {set_spec!r}")
    if oai_id is not None and not oai_id.strip():
        raise UsageProblem("--id: an OAI identifier cannot be empty")
    selection = Selection(since=_user_datetime("since", since), set_spec=set_spec,
                          deleted=deleted, oai_id=oai_id, errors_only=errors_only)
    items = select_records(_records_of(harvester_id).engine, harvester_id, selection,
                           with_raw=raw)
    if limit is not None:
        items = islice(items, limit)
    if oai_id is not None:
        items = iter(list(items))  # at most one: checked before anything is printed
        found = next(items, None)
        if found is None:
            raise Failure(f"no record {oai_id!r} of harvester {harvester_id} matches")
        if raw and not as_json and found["raw_xml"] is None:
            raise Failure(f"record {oai_id!r} is deleted: no XML is stored")
        items = iter([found])
    if as_json:
        out = sys.stdout
        out.write("[")
        for i, item in enumerate(items):
            out.write(("," if i else "") + "\n  " + json.dumps(item, ensure_ascii=False))
        out.write("\n]\n")
        return
    if raw:
        _print_raw(items, alone=oai_id is not None)
        return
    _print_records(items)


def _print_raw(items: Any, alone: bool) -> None:
    """Each record's XML after a comment naming it (`alone`: the one record's XML only)."""
    for item in items:
        xml = item["raw_xml"]
        if alone:
            click.echo(xml)
            return
        label = f"{item['oai_identifier']} {item['datestamp']}".replace("--", "- -")
        if xml is None:
            click.echo(f"<!-- {label} deleted: no XML stored -->\n")
        else:
            click.echo(f"<!-- {label}{' deleted' if item['deleted'] else ''} -->\n{xml}\n")


def _print_records(items: Any) -> None:
    from tabulate import tabulate

    from oaipmh_dagster.operations.flat import display_title

    rows = []
    for item in items:
        title = display_title(item["metadata"])
        rows.append([item["oai_identifier"], datestamp(item["datestamp"]),
                     "deleted" if item["deleted"] else "live", ",".join(item["sets"]),
                     str(title)[:60],
                     "; ".join(e.get("message", "")[:60] for e in item["errors"])])
    click.echo(tabulate(rows, headers=["oai_identifier", "datestamp", "status", "sets",
                                       "title", "errors"], disable_numparse=True)
               if rows else "no records")


@cli.command()
@click.argument("harvester_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="A JSON object: coverage {field: "
              "fraction} (4 decimals, highest first), records (profiled), distinct {short "
              "field: count, or \"1000+\"}, live, sampled, fields_dropped.")
@click.option("--max-records", type=click.IntRange(min=0), default=20_000,
              show_default=True, help="Past this many live records, profile a systematic sample of this many "
              "(one in every k by identifier); 0: every record.")
def profile(harvester_id: str, as_json: bool, max_records: int) -> None:
    """Field coverage of a harvester's live records: the share of records in which each
    metadata field (nested ones as dotted paths) is present and non-empty, and the
    distinct values of short fields (every value at most 200 characters; counted up to
    1000)."""
    from oaipmh_dagster.operations.profile import bar, coverage_rows, note, percent, profile_store
    from oaipmh_dagster.storage import open_store

    registry = _records_of(harvester_id)
    p = profile_store(open_store(registry.engine), harvester_id, max_records=max_records or None)
    if as_json:
        _echo_json(p.to_json())
        return
    if not p.records:
        click.echo(f"no live records of {harvester_id}")
        return
    from tabulate import tabulate

    rows = [[name, bar(share), percent(share), distinct.removesuffix(" distinct")
             .removesuffix(" values")] for name, share, distinct in coverage_rows(p)]
    click.echo(tabulate(rows, headers=["field", "coverage", "share", "distinct"],
                        colalign=("left", "left", "right", "right")) if rows
               else "no field is present in any record")
    click.echo(note(p))


@cli.command()
@click.argument("harvester_id", metavar="ID")
@click.option("--format", "fmt", type=click.Choice(["parquet", "csv", "jsonl", "xml"]),
              required=True)
@click.option("--output", required=True, metavar="PATH",
              help="A file (replaced only when the export succeeds), a device or a named "
              "pipe (written in place), a symlink to one of them, or '-' for stdout.")
def export(harvester_id: str, fmt: str, output: str) -> None:
    """Export the records of a harvester, ordered by identifier.

    \b
    parquet: written batch by batch; datestamp and harvested_at are UTC timestamps
             (an unreadable datestamp is null), sets a list of strings, metadata
             and errors JSON strings.
    csv:     one column per metadata field (metadata.<field>, lists joined by ' | ').
    jsonl:   one JSON object per line, as `records --json`.
    xml:     one XML document of the records as harvested: an OAI-PMH <record>
             (header, metadata, about) per record under <records>, streamed."""
    from oaipmh_dagster.operations.export import BadDestination, Destination, ExportError
    from oaipmh_dagster.operations.export import export as do_export
    from oaipmh_dagster.storage import open_store

    try:
        to = Destination.resolve(output, fmt)  # before the database is touched
        n = do_export(open_store(_records_of(harvester_id).engine), harvester_id, fmt, output)
    except BadDestination as exc:
        raise UsageProblem(str(exc)) from exc
    except ExportError as exc:
        raise Failure(str(exc)) from exc
    click.echo(f"wrote {count(n, 'record')} of {harvester_id} to {output}",
               err=to.path is None)


@cli.command()
@click.option("--shards", default=1, show_default=True, type=click.IntRange(1, MAX_SHARDS),
              help="Number of code locations to spread the harvesters over (stored in the "
              "registry, where every location reads it).")
@click.option("--prefix", default=DEFAULT_LOCATION, show_default=True,
              help="Code location names: PREFIX_shard_<i> (PREFIX-shard-<i> when PREFIX "
              "has a hyphen, as Kubernetes names need).")
@click.option("--grpc-port", type=click.IntRange(1, 65535),
              help="Point at code servers started with `dagster code-server start` on "
              "ports GRPC_PORT, GRPC_PORT+1, ... (the file's comments give the commands), "
              "instead of letting the webserver start them.")
@click.option("--grpc-host", default="127.0.0.1", show_default=True,
              help="Host of those code servers.")
@click.option("--sizes", is_flag=True,
              help="Also say on stderr how many registered harvesters each location holds.")
@click.option("--print-only", is_flag=True,
              help="Print the file only: store nothing (the locations keep the stored K).")
@click.option("--helm-values", type=click.Path(exists=True, dir_okay=False),
              help="Print Helm values for Dagster's chart instead: one user deployment per "
              "location, each a copy of the first deployment in this values file (e.g. "
              "deploy/k8s/values.yaml).")
def workspace(shards: int, prefix: str, grpc_port: int | None, grpc_host: str,
              sizes: bool, print_only: bool, helm_values: str | None) -> None:
    """Print a workspace.yaml whose code locations hold every harvester exactly once,
    and store the number of shards in the registry.

    A harvester's location follows from its id and the number of shards alone (a jump
    consistent hash): adding one never moves another, and going from K to K+1 shards
    moves about 1/(K+1) of them. Location names do not carry K: a harvester that stays
    keeps its schedule state and run history; the schedule of one that moves keeps its
    on/off through the registry (stored states it leaves behind are copied into the
    harvester's `enabled`, then deleted). Reload or restart the webserver and the
    daemon with the printed file right after."""
    from oaipmh_dagster.operations.shards import (
        InvalidShard,
        helm_user_deployments,
        shard_of,
        workspace_yaml,
    )

    if not prefix.replace("_", "a").replace("-", "a").isalnum():
        raise UsageProblem(f"--prefix {prefix!r}: use letters, digits, underscores or "
                           "hyphens (a hyphen makes Kubernetes-style names)")
    if grpc_port is not None and grpc_port + shards - 1 > 65535:
        raise UsageProblem(f"--grpc-port {grpc_port}: {shards} ports from there pass 65535")
    if helm_values is not None:
        try:
            text = helm_user_deployments(Path(helm_values).read_text(encoding="utf-8"),
                                         shards, prefix)
        except InvalidShard as exc:
            raise UsageProblem(str(exc)) from None
    else:
        text = workspace_yaml(shards, prefix, grpc_host=grpc_host if grpc_port else None,
                              grpc_port=grpc_port)
    if not print_only:
        _store_shards(shards, prefix)
    click.echo(text, nl=False)
    if sizes:
        counts = [0] * shards
        for h in _registry().list():
            counts[shard_of(h.id, shards)] += 1
        click.echo(f"{sum(counts)} harvesters; per location: min {min(counts)}, "
                   f"max {max(counts)}", err=True)


def _store_shards(count: int, prefix: str) -> None:
    """Store K, carrying over the schedule states of harvesters that move (stderr)."""
    from oaipmh_dagster.defs.reshard import reshard

    done = reshard(_instance(), _registry(), count, prefix)
    if done.old_count != count:
        click.echo(f"stored {count} shard(s) (was {done.old_count or 'unset'}); "
                   f"{len(done.carried)} moving schedule state(s) kept in the registry, "
                   f"{done.forgotten} stale state(s) removed", err=True)
    for line in done.carried:
        click.echo(f"  {line}", err=True)


@cli.command()
@click.option("--port", default=3000, show_default=True, type=click.IntRange(1, 65535),
              help="Port of the Dagster UI.")
@click.option("--oai-port", default=8765, show_default=True, type=click.IntRange(0, 65535),
              help="Port of the demo endpoint (0: any free port).")
@click.option("--records", "n_records", default=300, show_default=True,
              type=click.IntRange(min=1),
              help="Records on the demo endpoint.")
@click.option("--hub-port", default=8766, show_default=True, type=click.IntRange(0, 65535),
              help="Port where the harvested records are served over OAI-PMH (`serve`) "
              "while the UI runs (0: no hub).")
@click.option("--no-ui", is_flag=True, help="Set up and harvest, but do not start the UI.")
def demo(port: int, oai_port: int, n_records: int, hub_port: int, no_ui: bool) -> None:
    """Start the demo endpoint, register the `demo` harvester, harvest once, serve the
    records as a hub, open the UI."""
    from oaipmh_dagster.cli.demo import run_demo

    code = run_demo(ui_port=port, oai_port=oai_port, n_records=n_records, ui=not no_ui,
                    instance_factory=_instance, hub_port=hub_port or None)
    sys.exit(code)


from oaipmh_dagster.cli.serve import serve  # noqa: E402 - registered after the group

cli.add_command(serve)


def _error(message: object, code: int) -> NoReturn:
    """Print `message` as one line on stderr and exit with `code`."""
    text = " ".join(part.strip() for part in str(message).splitlines() if part.strip())
    click.echo(f"oaipmh-dagster: error: {text}", err=True)
    sys.exit(code)


def _fail(exc: BaseException, message: object, code: int = 1) -> NoReturn:
    """One error line; with --verbose, the traceback of what caused it first."""
    if _Settings.verbose and (exc.__cause__ is not None
                              or not isinstance(exc, click.ClickException)):
        traceback.print_exception(exc, file=sys.stderr)
    _error(message, code)


def _flush_stdout() -> None:
    """Flush stdout before exiting, so that a failed write is reported, not ignored.

    A reader that leaves during one large write cuts it short without an error (the
    kernel returns the bytes it took, and Python's buffered writer drops the rest), so
    a reader gone by now is reported too: the output did not all arrive."""
    try:
        sys.stdout.flush()
    except BrokenPipeError as exc:
        _reader_went_away(exc)
    if reader_gone():
        raise _ReaderGone


def main(argv: list[str] | None = None) -> NoReturn:
    """Console entry point: one line on stderr per error, exit 2 (usage) or 1 (failure);
    141 without a word when stdout's reader went away (see `cli_stdout`)."""
    _Settings.verbose = False
    guard_closed_stdout()
    try:
        cli.main(args=argv, prog_name="oaipmh-dagster", standalone_mode=False)
        _flush_stdout()
    except _ReaderGone:
        quiet_stdout()
        sys.exit(READER_GONE)
    except click.exceptions.Abort:
        click.echo("oaipmh-dagster: aborted", err=True)
        sys.exit(1)
    except click.UsageError as exc:
        _error(exc.format_message(), 2)
    except click.ClickException as exc:
        _fail(exc, exc.format_message(), exc.exit_code)
    except (db.DatabaseUnavailable, RegistryError) as exc:
        _fail(exc, exc)
    except sa.exc.SQLAlchemyError as exc:
        _fail(exc, f"database error: {getattr(exc, 'orig', None) or exc}")
    except OSError as exc:
        _fail(exc, exc)
    except Exception as exc:  # noqa: BLE001 - the last resort: one line, not a traceback
        hint = "" if _Settings.verbose else " (--verbose shows the traceback)"
        _fail(exc, f"unexpected {type(exc).__name__}: {exc}{hint}")
    sys.exit(0)


if __name__ == "__main__":
    main()
