"""Add, update and remove a harvester: validation, the endpoint probe, the row, the
harvest state it leaves behind, and the reload of the code location that holds it.

The one code path of `oaipmh-dagster harvester add/update/remove` and of the
`manage_harvesters` job. A refusal is one `AdminError` raised before anything is
written. No Dagster import: what a remove needs from the Dagster instance (stopping the
schedule, forgetting the since) comes in as an `InstanceSide`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from oaipmh_dagster.contracts import job_name
from oaipmh_dagster.errors import OAIPMHDagsterError
from oaipmh_dagster.fields import declared
from oaipmh_dagster.formats import reads, schema_for_prefix, shipped_schemas, shipped_schemas_help
from oaipmh_dagster.storage.registry import (
    Harvester,
    HarvesterExists,
    HarvesterNotFound,
    InvalidHarvester,
    Registry,
    default_transformer,
    transformer_fits,
    validate_cron,
    validate_id,
    validate_timezone,
    validate_url,
)
from oaipmh_dagster.words import count

__all__ = ["HTTP_FIELDS", "SELECTION", "AdminError", "Change", "Endpoint", "InstanceSide",
           "Line", "add_harvester", "ask_endpoint", "check_offer", "new_harvester",
           "remove_harvester", "resolve_schema", "selection_changed",
           "transformer_for_prefix", "tuning_values", "update_harvester"]

# The tuning fields declared on the row (see `fields`), optional on add and update.
HTTP_FIELDS = tuple(f.name for f in declared(Harvester))
# A registry, or how to open one (an add opens it only once its input is valid).
Registries = Registry | Callable[[], Registry]
# Fields whose change makes the remembered since and harvest state meaningless.
SELECTION = frozenset({"base_url", "metadata_prefix", "sets"})


class AdminError(OAIPMHDagsterError):
    """A change refused or failed, with one line saying why. `usage`: the input was bad
    (the command's exit code 2), else the endpoint or the registry refused (1)."""

    def __init__(self, message: str, usage: bool = False) -> None:
        super().__init__(message)
        self.usage = usage


class InstanceSide(Protocol):
    """What a remove does in the Dagster instance."""

    def stop_schedule(self, name: str) -> int:
        """Stop the stored running states of schedule `name`; how many were stopped."""

    def forget_since(self, harvester_id: str) -> None:
        """Publish "no since" for the harvester (a later one of that id starts full)."""


@dataclass(frozen=True)
class Line:
    """One line of what happened; `note`: a warning (stderr on the command line)."""

    text: str
    note: bool = False


@dataclass
class Change:
    """What an add, update or remove did, in order."""

    action: str  # add | update | remove
    harvester_id: str
    harvester: Harvester | None = None  # the row written (None after a remove)
    fields: tuple[str, ...] = ()  # the fields an update changed
    reloaded: bool = False
    lines: list[Line] = field(default_factory=list)

    def say(self, text: str, note: bool = False) -> None:
        """Add a line."""
        self.lines.append(Line(text, note))


def tuning_values(given: dict[str, Any], cls: type = Harvester) -> dict[str, Any]:
    """The values an add or an update sets: those `given` but None (left out: the row's
    default, or unchanged), with 0 for a field declared `zero_unsets` as None."""
    values = {k: v for k, v in given.items() if v is not None}
    for f in declared(cls):
        if f.zero_unsets and values.get(f.name) == 0:
            values[f.name] = None
    return values


def _open(registry: Registries) -> Registry:
    return registry if isinstance(registry, Registry) else registry()


def _check_transformer(name: str) -> None:
    from oaipmh_dagster.transform import TransformError, get_transformer, xslt

    try:
        get_transformer(name)
    except TransformError as exc:
        if xslt.is_xslt(name) or exc.type == "bad_plugin":  # the message says it all
            raise AdminError(f"transformer refused: {exc.message}", usage=True) from exc
        raise AdminError(f"unknown transformer {name!r}: {exc}", usage=True) from exc
    except Exception as exc:  # noqa: BLE001 - any failure to load is bad input
        raise AdminError(f"unknown transformer {name!r}: {exc}", usage=True) from exc


def _absolute_transformer(name: str | None) -> str | None:
    """An xslt: transformer with its stylesheet path made absolute (a code server may
    run in another directory); any other name as given."""
    if name is None:
        return name
    from oaipmh_dagster.transform import TransformError, xslt

    if not xslt.is_xslt(name):
        return name
    try:
        return xslt.normalize(name)
    except TransformError as exc:
        raise AdminError(f"transformer refused: {exc.message}", usage=True) from exc


# `validate` values that ask for the schema shipped for the harvester's prefix.
BY_PREFIX = ("", "shipped")


def resolve_schema(validate: str, prefix: str) -> str:
    """The schema field for a `--validate` value: "" (or "shipped"): the schema shipped
    for `prefix`; a shipped schema's name; ``schematron:PATH``: an ISO Schematron file,
    its path made absolute; else a schema file's path, made absolute. The schema must
    exist and compile."""
    from oaipmh_dagster.transform.schematron import PREFIX as SCHEMATRON
    from oaipmh_dagster.transform.schematron import is_schematron, schematron_path
    from oaipmh_dagster.transform.validation import SchemaError, check_schema

    if validate.strip() in BY_PREFIX:
        schema = schema_for_prefix(prefix)
        if schema is None:
            raise AdminError(
                f"no schema is shipped for metadataPrefix {prefix!r} (shipped: "
                f"{shipped_schemas_help()}): pass a schema file's path, --validate PATH",
                usage=True)
    elif validate in shipped_schemas():
        schema = validate
    elif is_schematron(validate):
        path = schematron_path(validate)
        if not str(path) or not path.is_file():
            raise AdminError(f"schematron file {validate[len(SCHEMATRON):]} does not exist",
                             usage=True)
        schema = SCHEMATRON + str(path.resolve())
    else:
        from pathlib import Path

        path = Path(validate).expanduser()
        if not path.is_file():
            raise AdminError(f"schema file {validate} does not exist", usage=True)
        schema = str(path.resolve())
    try:
        check_schema(schema)
    except SchemaError as exc:
        raise AdminError(str(exc), usage=True) from exc
    return schema


def _schema_change(current: Harvester, changes: dict[str, Any], validate: str | None,
                   no_validate: bool) -> None:
    """Put the schema an update asks for into `changes`: `validate` resolved, None with
    `no_validate`; a shipped schema follows a changed prefix (refused when none is
    shipped for the new one)."""
    prefix = changes.get("metadata_prefix", current.metadata_prefix)
    if validate is not None and no_validate:
        raise AdminError("--validate and --no-validate exclude each other", usage=True)
    if no_validate:
        changes["schema"] = None
    elif validate is not None:
        changes["schema"] = resolve_schema(validate, prefix)
    elif current.schema in shipped_schemas() and prefix != current.metadata_prefix:
        changes["schema"] = resolve_schema("", prefix)


def transformer_for_prefix(current: Harvester, changes: dict[str, Any]) -> list[Line]:
    """Put into `changes` the transformer a changed prefix needs, and say so: the old
    prefix's default follows to the new prefix's default; a transformer chosen explicitly
    (given in `changes`, or set before to another than the old default) is kept, with a
    warning when it is a built-in made for other records."""
    prefix = changes.get("metadata_prefix", current.metadata_prefix)
    if prefix == current.metadata_prefix:
        return []
    default = default_transformer(prefix)
    lines = []
    if "transformer" not in changes:
        if current.transformer == default_transformer(current.metadata_prefix):
            if current.transformer != default:
                changes["transformer"] = default
                lines.append(Line(f"transformer follows the prefix: {current.transformer} "
                                  f"-> {default}"))
            return lines
        if current.transformer != default:
            lines.append(Line(f"transformer {current.transformer} kept: it was chosen "
                              f"explicitly (the default for {prefix} is {default})"))
    name = changes.get("transformer", current.transformer)
    if transformer_fits(name, prefix) is False:
        lines.append(Line(f"transformer {name} reads {reads(name)} records, not {prefix}: "
                          f"its records will fail to transform (--transformer {default} "
                          "sets the default)", note=True))
    return lines


@dataclass(frozen=True)
class Endpoint:
    """What a probe learned of an endpoint: its name, prefixes and (when asked) sets."""

    url: str
    repository_name: str
    prefixes: tuple[str, ...]
    sets: tuple[str, ...] = ()


def ask_endpoint(url: str, timeout: float, with_sets: bool = False) -> Endpoint:
    """Identify + ListMetadataFormats (+ ListSets `with_sets`); a failure is one
    `AdminError` (not bad input)."""
    from oaipmh_dagster.oai import OAIError
    from oaipmh_dagster.operations.endpoint import client as endpoint_client

    try:
        with endpoint_client(url, timeout) as client:
            ident = client.identify()
            formats = client.list_metadata_formats()
            offered_sets = [s.spec for s in client.list_sets()] if with_sets else []
    except OAIError as exc:
        raise AdminError(f"cannot use {url} as an OAI-PMH endpoint: {exc} "
                         "(use --no-check to register it anyway)") from exc
    return Endpoint(url, ident.repository_name, tuple(sorted(f.prefix for f in formats)),
                    tuple(offered_sets))


def check_offer(endpoint: Endpoint, prefix: str, sets: tuple[str, ...] = ()) -> None:
    """Refuse a prefix the endpoint does not offer or a set it does not list (`endpoint`
    asked `with_sets` when `sets` are given)."""
    from oaipmh_dagster.operations.endpoint import missing_sets, some

    url, offered = endpoint.url, endpoint.prefixes
    if prefix not in offered:
        raise AdminError(f"{url} does not offer metadataPrefix {prefix!r}; it offers: "
                         f"{', '.join(offered)}", usage=True)
    if sets and not endpoint.sets:
        raise AdminError(f"{url} does not support sets (it lists none): harvest it whole, "
                         "without --set (or use --no-check to register it anyway)")
    missing = missing_sets(sets, endpoint.sets)
    if missing:
        raise AdminError(f"{url} does not list set {', '.join(map(repr, missing))}; it "
                         f"lists: {some(list(endpoint.sets))} (see `oaipmh-dagster sets "
                         f"{url}`; --no-check registers it anyway)")


def probe(url: str, prefix: str, timeout: float, sets: tuple[str, ...] = ()) -> str:
    """Identify + ListMetadataFormats (+ ListSets when `sets` are given); refuse a prefix
    the server does not offer or a set it does not list. Returns the repository name."""
    endpoint = ask_endpoint(url, timeout, with_sets=bool(sets))
    check_offer(endpoint, prefix, sets)
    return endpoint.repository_name


def _reload(change: Change, location: str | None) -> None:
    """Reload the code location that holds the harvester (`location`, else the one the
    webserver's locations say); never fails the change."""
    from oaipmh_dagster.operations.reload import reload_code_location

    done, message = reload_code_location(timeout=300.0, harvester_id=change.harvester_id,
                                         location=location)
    change.reloaded = done
    change.say(message, note=not done)


def _forget_state(registry: Registry, harvester_id: str) -> None:
    """Drop the harvester's harvest state (lease and checkpoint of an interrupted
    harvest): it belongs to a selection that no longer exists."""
    from oaipmh_dagster.storage import open_store

    open_store(registry.engine).forget(harvester_id)


def selection_changed(registry: Registry, old: Harvester) -> None:
    """Forget the checkpoint and lease of a harvest of `old`'s selection (a running one
    stops at its next page: its lease is gone), and keep in the harvest state which
    selection the store holds records of (`old`'s, unless one is recorded already), so
    that the next complete harvest sweeps them (`sweep`)."""
    from oaipmh_dagster.harvesting.incremental import scope
    from oaipmh_dagster.storage import open_store

    open_store(registry.engine).selection_changed(
        old.id, scope(old.base_url, old.metadata_prefix, old.sets))


def new_harvester(
    harvester_id: str, *, url: str | None, prefix: str | None, sets: tuple[str, ...] = (),
    cron: str | None = None, timezone: str = "UTC", enabled: bool = True,
    name: str | None = None, transformer: str | None = None, validate: str | None = None,
    **http: Any,
) -> Harvester:
    """The row an add writes, validated (its transformer loaded, its schema resolved),
    before the endpoint probe; `AdminError` (bad input) else. See `add_harvester`."""
    if not url or not prefix:
        raise AdminError("adding a harvester needs a url and a prefix", usage=True)
    http = tuning_values(http)
    transformer = _absolute_transformer(transformer)
    try:
        validate_id(harvester_id)
        validate_url(url)
        validate_cron(cron)
        validate_timezone(timezone)
        h = Harvester(id=harvester_id, base_url=url, metadata_prefix=prefix, sets=sets,
                      cron=cron, timezone=timezone, enabled=enabled, name=name or "",
                      transformer=transformer or "", **http)
    except InvalidHarvester as exc:
        raise AdminError(str(exc), usage=True) from exc
    except TypeError as exc:  # a value of the wrong type (a number for a text field)
        raise AdminError(f"invalid value: {exc}", usage=True) from exc
    if transformer:  # else the built-in default for the prefix
        _check_transformer(h.transformer)
    if validate is not None:
        h = h.replace(schema=resolve_schema(validate, prefix))
    return h


def add_harvester(
    registries: Registries, harvester_id: str, *, url: str | None, prefix: str | None,
    sets: tuple[str, ...] = (), cron: str | None = None, timezone: str = "UTC",
    enabled: bool = True, name: str | None = None, transformer: str | None = None,
    check: bool = True, reload: bool = True, location: str | None = None,
    validate: str | None = None, **http: Any,
) -> Change:
    """Register a harvester (the endpoint probed unless not `check`); `http`: the
    `HTTP_FIELDS` (see `tuning_values`). `validate`: see
    `resolve_schema` (None: no validation)."""
    h = new_harvester(harvester_id, url=url, prefix=prefix, sets=sets, cron=cron,
                      timezone=timezone, enabled=enabled, name=name,
                      transformer=transformer, validate=validate, **http)
    registry = _open(registries)
    try:
        registry.get(h.id)
        raise AdminError(f"harvester {h.id!r} already exists (use `harvester update`)")
    except HarvesterNotFound:
        pass
    except InvalidHarvester as exc:
        raise AdminError(str(exc)) from exc
    if check:
        repo_name = probe(h.base_url, h.metadata_prefix, h.timeout, h.sets)
        if not name:
            h = h.replace(name=repo_name[:255] or h.id)
    try:
        h = registry.add(h)
    except HarvesterExists as exc:
        raise AdminError(str(exc)) from exc
    change = Change("add", h.id, h)
    change.say(f"added harvester {h.id}: {h.base_url} ({h.metadata_prefix}); "
               f"job and schedule {h.job_name}")
    if reload:
        _reload(change, location)
    return change


def _selection_change(changes: dict[str, Any], url: str | None, prefix: str | None,
                      sets: tuple[str, ...], all_sets: bool) -> None:
    """Put the URL, prefix and sets an update asks for into `changes`."""
    if url is not None:
        changes["base_url"] = url
    if prefix is not None:
        changes["metadata_prefix"] = prefix
    if sets and all_sets:
        raise AdminError("--set and --all-sets exclude each other", usage=True)
    if sets:
        changes["sets"] = tuple(sets)
    if all_sets:
        changes["sets"] = ()


def update_harvester(
    registries: Registries, harvester_id: str, *, url: str | None = None,
    prefix: str | None = None, sets: tuple[str, ...] = (), all_sets: bool = False,
    cron: str | None = None, no_cron: bool = False, check: bool = True, reload: bool = True,
    location: str | None = None, validate: str | None = None, no_validate: bool = False,
    **fields: Any,
) -> Change:
    """Change fields of a harvester: `fields` are timezone, enabled, name, transformer
    and the `HTTP_FIELDS` (see `tuning_values`; None: unchanged).
    `validate` sets the schema (see `resolve_schema`), `no_validate` turns it off.
    A changed URL, prefix or set is probed unless not `check`; a changed selection
    forgets the harvest state (the next harvest is a full one)."""
    registry = _open(registries)
    try:
        current = registry.get(harvester_id)
    except (HarvesterNotFound, InvalidHarvester) as exc:
        raise AdminError(str(exc)) from exc
    changes = tuning_values(fields)
    if "transformer" in changes:
        changes["transformer"] = _absolute_transformer(changes["transformer"])
    if cron is not None:
        changes["cron"] = cron
    _selection_change(changes, url, prefix, sets, all_sets)
    if no_cron:
        if changes.get("cron"):
            raise AdminError("--cron and --no-cron exclude each other", usage=True)
        changes["cron"] = None
    _schema_change(current, changes, validate, no_validate)
    said = transformer_for_prefix(current, changes)
    if not changes:
        raise AdminError("nothing to update: give at least one option", usage=True)
    try:
        new = current.replace(**changes)
    except (InvalidHarvester, TypeError) as exc:
        raise AdminError(str(exc), usage=True) from exc
    if "transformer" in changes:
        _check_transformer(new.transformer)
    if check and ("base_url" in changes or "metadata_prefix" in changes
                  or ("sets" in changes and new.sets)):
        probe(new.base_url, new.metadata_prefix, new.timeout, new.sets)
    try:
        new = registry.update(harvester_id, **changes)
    except (InvalidHarvester, HarvesterNotFound) as exc:
        raise AdminError(str(exc)) from exc
    change = Change("update", harvester_id, new, tuple(sorted(changes)))
    change.say(f"updated harvester {harvester_id}: {', '.join(change.fields)}")
    change.lines.extend(said)
    if SELECTION & changes.keys() and (
        (new.base_url, new.metadata_prefix, set(new.sets))
        != (current.base_url, current.metadata_prefix, set(current.sets))
    ):
        selection_changed(registry, current)
        change.say("the URL, prefix or sets changed: the next harvest is a full one, and "
                   "the next complete harvest tombstones the live records it does not find "
                   f"in the new selection (more than max_delete {new.max_delete} allows "
                   "only with harvest --allow-mass-delete, run config allow_mass_delete: "
                   "true)")
    if reload:
        _reload(change, location)
    return change


def _stop_schedule(change: Change, instance: InstanceSide, location: str | None) -> None:
    """Stop the harvester's schedule: through the running webserver (GraphQL), else in
    the instance itself (see defs/_private.py for why not `dagster schedule
    stop`). Never fails the remove."""
    from oaipmh_dagster.operations.reload import stop_schedule

    name = job_name(change.harvester_id)
    done, message = stop_schedule(name, timeout=60.0, location=location,
                                  harvester_id=change.harvester_id)
    if done is None:
        try:
            done = True
            message = f"stopped schedule {name}" if instance.stop_schedule(name) else ""
        except Exception as exc:  # noqa: BLE001 - removing the row must not depend on it
            done, message = False, str(exc)
    if not done:
        change.say(f"could not stop schedule {name}: {message}", note=True)
    elif message.startswith("stopped"):
        change.say(message)


def remove_harvester(
    registries: Registries, harvester_id: str, *, instance: InstanceSide,
    delete_records: bool = False, confirm: Callable[[str], None] | None = None,
    reload: bool = True, location: str | None = None,
) -> Change:
    """Remove a harvester: its schedule is stopped first, its harvest state and since
    forgotten; its records are kept unless `delete_records`. `confirm(label)` is asked
    first and raises to keep the harvester. A row stored with invalid values is
    removable too."""
    registry = _open(registries)
    try:
        h = registry.get(harvester_id)
        label = f"{h.id} ({h.base_url})"
    except HarvesterNotFound as exc:
        raise AdminError(str(exc)) from exc
    except InvalidHarvester:
        label = f"{harvester_id} (stored with invalid values)"
    if confirm is not None:
        confirm(label)
    change = Change("remove", harvester_id)
    _stop_schedule(change, instance, location)
    try:
        registry.remove(harvester_id)
    except HarvesterNotFound as exc:
        raise AdminError(str(exc)) from exc
    _forget_state(registry, harvester_id)
    instance.forget_since(harvester_id)
    if delete_records:
        from oaipmh_dagster.storage import open_store

        n = open_store(registry.engine).delete_harvester_records(harvester_id)
        change.say(f"deleted {count(n, 'record')} of {harvester_id}")
    change.say(f"removed harvester {harvester_id}")
    if reload:
        _reload(change, location)
    return change
