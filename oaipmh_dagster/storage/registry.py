"""The harvester table: the `Harvester` row, its validation, and CRUD."""

from __future__ import annotations

import builtins
import dataclasses
import functools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import InitVar, dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from oaipmh_dagster.contracts import SCHEMATRON_PREFIX as SCHEMATRON
from oaipmh_dagster.contracts import job_name
from oaipmh_dagster.errors import OAIPMHDagsterError
from oaipmh_dagster.fields import Bounds, declared, tuning
from oaipmh_dagster.formats import (
    FALLBACK,
    default_transformer,
    reads,
    shipped_schemas,
    shipped_schemas_help,
)
from oaipmh_dagster.storage import db

ID_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_]{0,47}$")
# OAI-PMH 2.0 schema: metadataPrefix and setSpec character classes.
PREFIX_PATTERN = re.compile(r"^[A-Za-z0-9\-_.!~*'()]+$")
SET_SPEC_PATTERN = re.compile(r"^[A-Za-z0-9\-_.!~*'()]+(:[A-Za-z0-9\-_.!~*'()]+)*$")
# A built-in name, a plugin path, or xslt:PATH[?name=value&...] (see transform/xslt.py).
TRANSFORMER_PATTERN = re.compile(
    r"^([a-z0-9_]+|[A-Za-z_][\w.]*:[A-Za-z_]\w*|xslt:[^\x00-\x1f\x7f?][^\x00-\x1f\x7f]*)$"
)
ENV_NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Endpoint credentials come only from variables of this namespace, never from any other
# variable of the worker (the database URL's, say): contract.
AUTH_ENV_PREFIX = "OAIPMH_AUTH_"
AUTH_ENV_RULE = (f"the variable's name must start with {AUTH_ENV_PREFIX} "
                 f"(for example {AUTH_ENV_PREFIX}ZENODO)")
# Column sizes, checked at input so a value never fails at the database.
MAX_URL = 2048
MAX_SHORT = 255
MAX_OVERLAP = 30 * 86400
MAX_RECONCILE_EVERY = 10_000
DEFAULT_MAX_DELETE = "10%"
_SHARE = re.compile(r"^(?:100|[0-9]{1,2})(?:\.[0-9]{1,2})?%$")
_COUNT = re.compile(r"^[0-9]{1,9}$")

harvester_table = sa.Table(
    "oaipmh_harvester",
    db.metadata,
    sa.Column("id", sa.String(48), primary_key=True),
    sa.Column("name", sa.String(255), nullable=False),
    sa.Column("base_url", sa.String(2048), nullable=False),
    sa.Column("metadata_prefix", sa.String(255), nullable=False),
    sa.Column("sets", sa.JSON, nullable=False),
    sa.Column("transformer", sa.String(255), nullable=False),
    sa.Column("cron", sa.String(255), nullable=True),
    sa.Column("timezone", sa.String(64), nullable=False),
    sa.Column("enabled", sa.Boolean, nullable=False),
    sa.Column("schema", sa.String(2048), nullable=True),
    sa.Column("created", sa.DateTime(timezone=True), nullable=False),
    sa.Column("updated", sa.DateTime(timezone=True), nullable=False),
    # and the columns of the tuning fields, from their declaration (after `Harvester`)
)

# Deployment-wide settings (migration 0007): key -> value.
setting_table = sa.Table(
    "oaipmh_setting",
    db.metadata,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
)
SHARDS_SETTING = "shards"


class RegistryError(OAIPMHDagsterError):
    """Base of the registry's errors."""


class InvalidHarvester(RegistryError, ValueError):
    """A harvester field does not validate."""


class HarvesterNotFound(RegistryError, LookupError):
    """No harvester with that id."""


class HarvesterExists(RegistryError):
    """A harvester with that id is already registered."""


def transformer_fits(transformer: str, metadata_prefix: str) -> bool | None:
    """Whether a transformer reads the records of a metadata prefix: a built-in made for
    one kind of record fits the prefixes whose default it is; `xml` fits any; None for
    the others (a stylesheet or a plugin says nothing about what it reads)."""
    if transformer == FALLBACK:
        return True
    made_for = reads(transformer)
    if made_for is None:
        return None
    return made_for == default_transformer(metadata_prefix)


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


@dataclass(frozen=True)
class Harvester:
    """One registered OAI-PMH harvester (a row of `oaipmh_harvester`)."""

    id: str
    base_url: str
    metadata_prefix: str
    name: str = ""
    sets: tuple[str, ...] = ()
    transformer: str = ""
    cron: str | None = None
    timezone: str = "UTC"
    enabled: bool = True
    # The tuning fields: each is declared once, here (see `fields`); the command line's
    # options, the manage_harvesters config, validation and updates follow.
    comment: str = tuning("", help="Free text.")
    timeout: float = tuning(
        60.0, bounds=Bounds(0, 3600, low_open=True, unit="seconds"),
        help="Read timeout per request, seconds ({default}).")
    delay: float = tuning(0.0, bounds=Bounds(0, 600, unit="seconds"),
                          help="Minimum seconds between requests ({default}).")
    max_parallel: int = tuning(1, bounds=Bounds(1, 32),
                               help="Parallel requests to the host ({default}).")
    max_retries: int = tuning(5, bounds=Bounds(0, 50), help="Retries per request ({default}).")
    # A variable of the AUTH_ENV_PREFIX namespace.
    auth_env: str | None = tuning(
        None, sql=sa.String(255), check=lambda value, stored: validate_auth_env(value, stored),
        help="Name of the environment variable that holds 'user:password' or 'Bearer "
        "<token>' for this endpoint; it must start with OAIPMH_AUTH_.",
        launchpad="Name of the environment variable that holds 'user:password' or 'Bearer "
        "<token>'; it must start with OAIPMH_AUTH_.")
    # Seconds to ask before since (None: one granule at day granularity, OVERLAP_SECONDS
    # at seconds granularity), so records whose datestamps trail the server's clock are
    # still asked for.
    overlap: int | None = tuning(
        None, bounds=Bounds(0, MAX_OVERLAP, unit="seconds", whole=True),
        help="Seconds to ask before the remembered since (default: one day at day "
        "granularity, 5 minutes at seconds granularity).",
        launchpad="Seconds to ask before the remembered since (add: one day at day "
        "granularity, 5 minutes at seconds granularity).")
    # Every Nth scheduled run also reconciles (lists every identifier and repairs the
    # store); None: only runs that ask for it.
    reconcile_every: int | None = tuning(
        None, bounds=Bounds(1, MAX_RECONCILE_EVERY, unit="scheduled runs", whole=True),
        zero_unsets=True, metavar="N",
        help="Every Nth scheduled run also reconciles the store with the identifiers the "
        "server lists (0: never, the default).",
        launchpad="Every Nth scheduled run also reconciles the store (0: never, the "
        "default).")
    # The XML Schema records are validated against: a shipped one (see `formats`) or the
    # absolute path of a schema file; None: no validation.
    schema: str | None = None
    # The most records a sweep (a reconcile, or the sweep after a changed selection) may
    # tombstone without the operator's confirmation: a share of the live records ("10%")
    # or a count ("1000"). See `DeleteLimit`.
    max_delete: str = tuning(
        DEFAULT_MAX_DELETE, sql=sa.String(16), server_default=True, metavar="LIMIT",
        check=lambda value, _: DeleteLimit.parse(value),
        help="The most records a sweep (a reconcile, or the sweep after a changed URL, "
        "prefix or sets) may tombstone without harvest --allow-mass-delete: a share of the "
        "live records such as {default} (the default) or a count such as 1000.",
        launchpad="The most records a sweep (a reconcile, or the sweep after a changed URL, "
        "prefix or sets) may tombstone without allow_mass_delete: a share of the live "
        "records such as {default} (add: {default}) or a count such as 1000.")
    created: datetime | None = field(default=None, compare=False)
    updated: datetime | None = field(default=None, compare=False)
    # Read back from storage: an auth_env outside the namespace (a row written before the
    # rule, or edited by hand) is let through so the row can be shown and repaired; the
    # harvest refuses it before any request. Any change (`replace`) validates in full.
    stored: InitVar[bool] = False

    def __post_init__(self, stored: bool) -> None:
        object.__setattr__(self, "sets", tuple(self.sets))
        if not self.transformer:
            object.__setattr__(self, "transformer", default_transformer(self.metadata_prefix))
        if not self.name:
            object.__setattr__(self, "name", self.id)
        validate(self, stored=stored)

    @property
    def job_name(self) -> str:
        """Name of the job and of the schedule (contract)."""
        return job_name(self.id)

    @property
    def host(self) -> str:
        """The endpoint's host (with port), for per-host limits."""
        return urlsplit(self.base_url).netloc.lower()

    def replace(self, **changes: Any) -> Harvester:
        """A copy with `changes` applied and validated."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Stable JSON form (documented in the README)."""
        data = dataclasses.asdict(self)
        data["sets"] = list(self.sets)
        for key in ("created", "updated"):
            value = data[key]
            data[key] = value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if value else None
        return data

    @classmethod
    def from_dict(cls, data: Mapping[Any, Any]) -> Harvester:
        """Inverse of `to_dict` (also accepts a database row mapping)."""
        values = {f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data}
        for key in ("created", "updated"):
            value = values.get(key)
            if isinstance(value, str):
                values[key] = datetime.fromisoformat(value.replace("Z", "+00:00"))
            elif isinstance(value, datetime) and value.tzinfo is None:
                values[key] = value.replace(tzinfo=UTC)
        sets = values.get("sets") or ()
        if isinstance(sets, str):
            raise InvalidHarvester(f"sets must be a list of set specs, not {sets!r}")
        values["sets"] = tuple(sets)
        return cls(**values, stored=True)


for _field in declared(Harvester):
    harvester_table.append_column(_field.column())


@dataclass(frozen=True)
class DeleteLimit:
    """A harvester's `max_delete`: a share of its live records (`share`, percent) or a
    count; a sweep that would tombstone more than `allowed(live)` is held back."""

    text: str
    share: float | None = None
    count: int | None = None

    @classmethod
    def parse(cls, value: object) -> DeleteLimit:
        """`"10%"` (0-100, up to two decimals) or `"1000"`; `InvalidHarvester` else."""
        text = value if isinstance(value, str) else ""
        if _SHARE.fullmatch(text) and float(text[:-1]) <= 100:
            return cls(text, share=float(text[:-1]))
        if _COUNT.fullmatch(text):
            return cls(text, count=int(text))
        raise InvalidHarvester(
            f"invalid max_delete {value!r}: a share of the live records such as 10% "
            "(0-100%) or a count such as 1000")

    def allowed(self, live: int) -> int:
        """How many of `live` records a sweep may tombstone without confirmation."""
        if self.count is not None:
            return self.count
        assert self.share is not None
        return int(live * round(self.share * 100) // 10_000)


def validate_id(value: str) -> str:
    """Check a harvester id (it becomes part of Dagster names)."""
    if not isinstance(value, str) or not ID_PATTERN.fullmatch(value):
        raise InvalidHarvester(
            f"invalid harvester id {value!r}: use 1-48 characters a-z, 0-9 and _, "
            "starting with a letter or digit"
        )
    return value


def validate_url(value: str) -> str:
    """Check an endpoint URL: http(s), a host, no fragment, no credentials."""
    if isinstance(value, str) and len(value) > MAX_URL:
        raise InvalidHarvester(f"base URL is longer than {MAX_URL} characters ({len(value)})")
    try:
        parts = urlsplit(value)
        _ = parts.port
    except ValueError as exc:
        raise InvalidHarvester(f"invalid base URL {value!r}: {exc}") from exc
    if parts.scheme not in ("http", "https"):
        raise InvalidHarvester(f"invalid base URL {value!r}: the scheme must be http or https")
    if not parts.hostname:
        raise InvalidHarvester(f"invalid base URL {value!r}: no host")
    if parts.username is not None or parts.password is not None:
        raise InvalidHarvester(
            "invalid base URL: credentials must not be stored in the URL; "
            "put them in an environment variable and name it with --auth-env"
        )
    if parts.fragment or value.endswith("#"):
        raise InvalidHarvester(f"invalid base URL {value!r}: a fragment (#...) is not allowed")
    if any(c.isspace() for c in value):
        raise InvalidHarvester(f"invalid base URL {value!r}: contains whitespace")
    return value


def validate_cron(value: str | None) -> str | None:
    """Check a cron expression as Dagster reads it (None = no schedule ticks)."""
    if value is None:
        return None
    if not (_plainly_valid(value) or _valid_cron(value)):
        raise InvalidHarvester(f"invalid cron expression {value!r}")
    return value


# The ranges of a plain cron's five fields: minute, hour, day of month, month, weekday.
_PLAIN_RANGES = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 6))
_PLAIN_NUMBER = re.compile(r"0|[1-9][0-9]?")


def _plainly_valid(value: str) -> bool:
    """Whether `value` is a plain cron that Dagster accepts, decided without importing
    Dagster (about 0.8 s of every `harvester add`): five fields separated by one space,
    the month `*` (Dagster refuses some day-month pairs, such as 30 February), each other
    field `*`, `*/step` or a comma list of numbers and ranges `a-b` (a <= b) within the
    field's range, without leading zeros. False says only "ask Dagster"."""
    fields = value.split(" ")
    if len(fields) != 5 or fields[3] != "*":
        return False
    return all(_plain_field(text, low, high)
               for text, (low, high) in zip(fields, _PLAIN_RANGES, strict=True))


def _plain_field(text: str, low: int, high: int) -> bool:
    if text == "*":
        return True
    if text.startswith("*/"):
        step = text[2:]
        return bool(_PLAIN_NUMBER.fullmatch(step)) and 1 <= int(step) <= high - low
    for item in text.split(","):
        ends = item.split("-")
        if len(ends) > 2 or not all(_PLAIN_NUMBER.fullmatch(e) for e in ends):
            return False
        numbers = [int(e) for e in ends]
        if not all(low <= n <= high for n in numbers) or numbers != sorted(numbers):
            return False
    return True


@functools.lru_cache(maxsize=4096)
def _valid_cron(value: str) -> bool:
    """Whether Dagster accepts `value` as a schedule's cron (its public constructor is the
    check; cached: registries repeat a handful of expressions).

    Dagster stays the judge although the registry sits below it: its cron parser is a
    private vendored croniter (no croniter distribution is installed), and an expression
    the registry let through but Dagster refused would fail loading every harvester's
    definitions. The import is lazy, so the registry loads without Dagster."""
    import dagster as dg

    try:
        dg.ScheduleDefinition(name="cron_check", cron_schedule=value, job_name="cron_check")
    except dg.DagsterInvalidDefinitionError:
        return False
    return True


def validate_timezone(value: str) -> str:
    """Check an IANA timezone name."""
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise InvalidHarvester(f"unknown timezone {value!r}") from exc
    return value


def validate_schema(value: str | None) -> str | None:
    """Check a schema field: None, a shipped schema's name, an absolute path or
    ``schematron:`` and an absolute path (whether the file exists and compiles is checked
    when it is set: see `admin`)."""
    if value is None or value in shipped_schemas():
        return value
    path = value[len(SCHEMATRON):] if isinstance(value, str) and value.startswith(
        SCHEMATRON) else value
    if not isinstance(path, str) or not path.startswith("/") or len(value) > MAX_URL:
        raise InvalidHarvester(
            f"invalid schema {value!r}: one of {shipped_schemas_help()}, the absolute path of "
            f"a schema file or schematron: and the absolute path of a Schematron file (at "
            f"most {MAX_URL} characters)")
    return value


def validate_auth_env(value: str | None, stored: bool = False) -> str | None:
    """Check the name of the variable that holds a harvester's credentials: a variable
    name of the `AUTH_ENV_PREFIX` namespace (`stored`: any variable name, see
    `Harvester.stored`). The refusal names a plausible variable name, never a value that
    looks like anything else (a pasted secret)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidHarvester("--auth-env must be the name of an environment variable")
    if len(value) > MAX_SHORT:
        raise InvalidHarvester(f"--auth-env name is longer than {MAX_SHORT} characters")
    if not ENV_NAME_PATTERN.fullmatch(value):
        raise InvalidHarvester(
            f"invalid --auth-env: not an environment variable name; {AUTH_ENV_RULE}")
    if not stored and not auth_env_allowed(value):
        raise InvalidHarvester(f"--auth-env {value!r} refused: {AUTH_ENV_RULE}")
    return value


def auth_env_allowed(name: str) -> bool:
    """Whether credentials may be read from the variable `name` (run-time check too)."""
    return (name.startswith(AUTH_ENV_PREFIX) and len(name) > len(AUTH_ENV_PREFIX)
            and ENV_NAME_PATTERN.fullmatch(name) is not None)


def validate(h: Harvester, stored: bool = False) -> None:
    """Validate every field of `h`; raise `InvalidHarvester` naming the first bad one
    (`stored`: a row read back, see `Harvester.stored`)."""
    validate_id(h.id)
    validate_url(h.base_url)
    if len(h.metadata_prefix or "") > MAX_SHORT:
        raise InvalidHarvester(f"metadata prefix is longer than {MAX_SHORT} characters")
    if not PREFIX_PATTERN.fullmatch(h.metadata_prefix or ""):
        raise InvalidHarvester(f"invalid metadata prefix {h.metadata_prefix!r}")
    for spec in h.sets:
        if not isinstance(spec, str) or not SET_SPEC_PATTERN.fullmatch(spec):
            raise InvalidHarvester(f"invalid set spec {spec!r}")
        if len(spec) > MAX_SHORT:
            raise InvalidHarvester(f"set spec is longer than {MAX_SHORT} characters")
    if len(set(h.sets)) != len(h.sets):
        raise InvalidHarvester("a set is listed twice")
    if len(h.transformer) > MAX_SHORT:
        raise InvalidHarvester(f"transformer is longer than {MAX_SHORT} characters")
    if not TRANSFORMER_PATTERN.fullmatch(h.transformer):
        raise InvalidHarvester(
            f"invalid transformer {h.transformer!r}: a built-in name, xslt:PATH or "
            "'package.module:function'"
        )
    validate_cron(h.cron)
    validate_timezone(h.timezone)
    for f in declared(type(h)):
        value = getattr(h, f.name)
        problem = f.problem(value)
        if problem is not None:
            raise InvalidHarvester(problem)
        if f.check is not None:
            f.check(value, stored)
    validate_schema(h.schema)
    if len(h.name) > MAX_SHORT:
        raise InvalidHarvester(f"name is longer than {MAX_SHORT} characters")
    if h.cron is not None and len(h.cron) > MAX_SHORT:
        raise InvalidHarvester(f"cron expression is longer than {MAX_SHORT} characters")


def _row_values(h: Harvester) -> dict[str, Any]:
    values = dataclasses.asdict(h)
    values["sets"] = list(h.sets)
    return values


class Registry:
    """CRUD over `oaipmh_harvester` on one engine."""

    def __init__(self, engine: Engine | None = None) -> None:
        self.engine = engine or db.get_engine()

    def add(self, h: Harvester) -> Harvester:
        """Insert `h`; `HarvesterExists` when the id is taken."""
        now = _now()
        h = dataclasses.replace(h, created=now, updated=now)
        try:
            with self.engine.begin() as conn:
                conn.execute(harvester_table.insert().values(**_row_values(h)))
        except sa.exc.IntegrityError as exc:
            raise HarvesterExists(f"harvester {h.id!r} already exists") from exc
        return h

    def get(self, harvester_id: str) -> Harvester:
        """The harvester `harvester_id`; `HarvesterNotFound` otherwise."""
        try:
            with self.engine.connect() as conn:
                row = conn.execute(
                    harvester_table.select().where(harvester_table.c.id == harvester_id)
                ).mappings().first()
            if row is None:
                raise HarvesterNotFound(f"no harvester {harvester_id!r}")
            return Harvester.from_dict(row)
        except (TypeError, ValueError) as exc:
            raise InvalidHarvester(
                f"harvester {harvester_id!r} is stored with an invalid value: {exc}"
            ) from exc

    def list(self) -> builtins.list[Harvester]:
        """Every valid harvester, ordered by id (see `list_rows` for invalid ones)."""
        return [h for h in self.list_rows() if isinstance(h, Harvester)]

    def list_rows(
        self, keep: Callable[[str], bool] | None = None,
    ) -> builtins.list[Harvester | InvalidRow]:
        """Every row, ordered by id; rows that fail validation come back as `InvalidRow`.
        `keep`: only the rows whose id it accepts, chosen on the ids alone, so the other
        rows are neither read nor validated (a shard's load costs its own size)."""
        table = harvester_table
        with self.engine.connect() as conn:
            ids: builtins.list[str] | None = None
            if keep is not None:
                ids = [i for i in conn.execute(sa.select(table.c.id).order_by(table.c.id))
                       .scalars() if keep(str(i))]
            try:
                rows: Sequence[Mapping[Any, Any] | InvalidRow] = (
                    self._read_rows(conn, ids))
            except (TypeError, ValueError):
                # A hand-edited value the column type cannot even read (bad JSON, a bad
                # date on SQLite): read the rows one by one so only that row is invalid.
                if ids is None:
                    ids = list(conn.execute(sa.select(table.c.id).order_by(table.c.id)
                                            ).scalars())
                one_by_one: builtins.list[Mapping[Any, Any] | InvalidRow] = []
                rows = one_by_one
                for harvester_id in ids:
                    try:
                        one_by_one.append(conn.execute(
                            table.select().where(table.c.id == harvester_id)
                        ).mappings().one())
                    except (TypeError, ValueError) as exc:
                        one_by_one.append(InvalidRow(str(harvester_id), f"unreadable row: {exc}"))
            out: builtins.list[Harvester | InvalidRow] = []
            for row in rows:
                if isinstance(row, InvalidRow):
                    out.append(row)
                    continue
                try:
                    out.append(Harvester.from_dict(row))
                except (InvalidHarvester, TypeError, ValueError) as exc:
                    out.append(InvalidRow(str(row.get("id")), str(exc)))
        return out

    @staticmethod
    def _read_rows(conn: sa.Connection, ids: builtins.list[str] | None,
                   ) -> builtins.list[Mapping[Any, Any]]:
        """The rows of `ids` (None: all), ordered by id; in chunks that stay below every
        backend's limit on bound parameters."""
        table = harvester_table
        query = table.select().order_by(table.c.id)
        if ids is None:
            return list(conn.execute(query).mappings().all())
        rows: builtins.list[Mapping[Any, Any]] = []
        for start in range(0, len(ids), 500):
            chunk = ids[start:start + 500]
            rows.extend(conn.execute(query.where(table.c.id.in_(chunk))).mappings().all())
        return rows

    def update(self, harvester_id: str, **changes: Any) -> Harvester:
        """Apply `changes` (validated) to a harvester and return the new row."""
        if "id" in changes or "created" in changes:
            raise InvalidHarvester("the id and creation time of a harvester cannot change")
        current = self.get(harvester_id)
        new = dataclasses.replace(current, **changes, updated=_now())
        values = _row_values(new)
        values.pop("id")
        values.pop("created")
        with self.engine.begin() as conn:
            done = conn.execute(
                harvester_table.update().where(harvester_table.c.id == harvester_id).values(**values)
            )
        if done.rowcount == 0:
            raise HarvesterNotFound(f"no harvester {harvester_id!r}")
        return new

    def write_many(self, new: Sequence[Harvester], changed: Sequence[Harvester],
                   ) -> builtins.list[Harvester]:
        """Insert `new` and replace the rows of `changed` (every field but the creation
        time) in one transaction: all or nothing. `HarvesterExists` for a taken id of
        `new`, `HarvesterNotFound` for a missing one of `changed`. Returns the rows
        written, `new` then `changed`."""
        now = _now()
        added = [dataclasses.replace(h, created=now, updated=now) for h in new]
        replaced = [dataclasses.replace(h, updated=now) for h in changed]
        table = harvester_table
        try:
            with self.engine.begin() as conn:
                if added:
                    conn.execute(table.insert(), [_row_values(h) for h in added])
                for h in replaced:
                    values = _row_values(h)
                    values.pop("id")
                    values.pop("created")
                    done = conn.execute(table.update().where(table.c.id == h.id)
                                        .values(**values))
                    if done.rowcount == 0:
                        raise HarvesterNotFound(f"no harvester {h.id!r}")
        except sa.exc.IntegrityError as exc:
            raise HarvesterExists("a harvester of the same id was added meanwhile: nothing "
                                  "written") from exc
        return added + replaced

    def remove(self, harvester_id: str) -> None:
        """Delete a harvester row (its harvested records are kept)."""
        with self.engine.begin() as conn:
            done = conn.execute(
                harvester_table.delete().where(harvester_table.c.id == harvester_id)
            )
        if done.rowcount == 0:
            raise HarvesterNotFound(f"no harvester {harvester_id!r}")

    def setting(self, key: str) -> str | None:
        """The stored value of setting `key` (None: unset, or no settings table yet)."""
        if not db.table_exists(self.engine, setting_table.name):
            return None
        with self.engine.connect() as conn:
            value = conn.execute(sa.select(setting_table.c.value)
                                 .where(setting_table.c.key == key)).scalar()
        return None if value is None else str(value)

    def set_setting(self, key: str, value: str) -> None:
        """Store `value` under `key` (replacing any value)."""
        with self.engine.begin() as conn:
            done = conn.execute(setting_table.update().where(setting_table.c.key == key)
                                .values(value=value))
            if done.rowcount == 0:
                conn.execute(setting_table.insert().values(key=key, value=value))

    def shard_count(self) -> int | None:
        """The number of shards code locations split the harvesters into (None: never
        stored; an unreadable value is an error, not a guess)."""
        value = self.setting(SHARDS_SETTING)
        if value is None:
            return None
        if not value.isdigit() or int(value) < 1:
            raise RegistryError(f"the stored number of shards {value!r} is not a positive "
                                "integer: run `oaipmh-dagster workspace --shards K`")
        return int(value)


@dataclass(frozen=True)
class InvalidRow:
    """A row in the table that does not validate (edited by hand, say)."""

    id: str
    error: str
