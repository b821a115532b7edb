"""How a harvester's tuning field is declared: once, as a field of the `Harvester`
dataclass made with `tuning(...)` (default, bounds or check, help texts). From
`declared(Harvester)` follow validation (`registry.validate`), the command line's
options (`cli.tuning_options`), the `manage_harvesters` config (`manage.options_model`),
the update semantics (`admin.tuning_values`) and the field's column of the harvester
table: a new field adds its declaration and a migration.

No import of click, pydantic or Dagster: the registry loads without them."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

__all__ = ["Bounds", "HarvesterField", "declared", "tuning"]

_KEY = "oaipmh_dagster.field"
_SQL_TYPES: dict[type, Any] = {float: sa.Float, int: sa.Integer, str: sa.Text}


@dataclass(frozen=True)
class Bounds:
    """A numeric field's interval `[low, high]` (`(low, high]` when `low_open`); `whole`:
    integers only (not bools), a value of another type is refused with the bounds;
    `unit` names what is counted ("seconds")."""

    low: float
    high: float
    low_open: bool = False
    unit: str = ""
    whole: bool = False

    def problem(self, name: str, value: Any) -> str | None:
        """Why `value` is out of bounds (None: it is within them)."""
        if self.whole:
            if (not isinstance(value, bool) and isinstance(value, int)
                    and self.low <= value <= self.high):
                return None
            return (f"{name} must be a whole number of {self.unit} in {self._interval()}, "
                    f"not {value!r}")
        above = self.low < value if self.low_open else self.low <= value
        if above and value <= self.high:
            return None
        unit = f" {self.unit}" if self.unit else ""
        return f"{name} must be in {self._interval()}{unit}, not {value}"

    def _interval(self) -> str:
        return f"{'(' if self.low_open else '['}{self.low}, {self.high}]"


@dataclass(frozen=True)
class HarvesterField:
    """One declared field. `help`: the command line's help, where `{default}` stands
    for the default; `launchpad`: the config's description (None: `help` with the
    default as "add: <default>"); `check(value, stored)` raises `InvalidHarvester`;
    `zero_unsets`: an input of 0 means None (the default); `metavar`: the option's;
    `sql`: the column's type (None: Float, Integer or Text after `type`);
    `server_default`: the column has the default (rows older than the column get it).
    `name`, `type` (without None), `default` and `optional` (None allowed) come from
    the dataclass field."""

    help: str
    launchpad: str | None = None
    bounds: Bounds | None = None
    check: Callable[[Any, bool], object] | None = None
    zero_unsets: bool = False
    metavar: str | None = None
    sql: Any = None
    server_default: bool = False
    name: str = ""
    type: Any = None
    default: Any = None
    optional: bool = False

    @property
    def flag(self) -> str:
        """The command line's option, `--max-retries` for `max_retries`."""
        return "--" + self.name.replace("_", "-")

    def _shown_default(self) -> str:
        value = self.default
        return f"{value:g}" if isinstance(value, float | int) else str(value)

    @property
    def cli_help(self) -> str:
        """The option's help text."""
        return self.help.format(default=self._shown_default())

    @property
    def config_help(self) -> str:
        """The `manage_harvesters` config field's description."""
        if self.launchpad is not None:
            return self.launchpad.format(default=self._shown_default())
        return self.help.format(default="add: " + self._shown_default())

    @property
    def input_minimum(self) -> int | None:
        """The lowest whole number an input may give (0 when 0 unsets the field), checked
        when the input is read; None for other fields."""
        if self.bounds is None or not self.bounds.whole:
            return None
        return 0 if self.zero_unsets else int(self.bounds.low)

    def column(self) -> sa.Column[Any]:
        """The field's column of the harvester table."""
        kind = self.sql if self.sql is not None else _SQL_TYPES[self.type]
        return sa.Column(self.name, kind, nullable=self.optional,
                         server_default=str(self.default) if self.server_default else None)

    def problem(self, value: Any) -> str | None:
        """Why `value` is out of the field's bounds (None: within, or no bounds)."""
        if self.bounds is None or (value is None and self.optional):
            return None
        return self.bounds.problem(self.name, value)


def tuning(default: Any, **spec: Any) -> Any:
    """A `Harvester` dataclass field declared as a tuning field (see `HarvesterField`)."""
    return dataclasses.field(default=default, metadata={_KEY: HarvesterField(**spec)})


_DECLARED: dict[type, tuple[HarvesterField, ...]] = {}


def declared(cls: type) -> tuple[HarvesterField, ...]:
    """The declared fields of the dataclass `cls`, in their order (every row's
    validation asks: read once per class)."""
    found = _DECLARED.get(cls)
    if found is None:
        found = _DECLARED[cls] = _read_declared(cls)
    return found


def _read_declared(cls: type) -> tuple[HarvesterField, ...]:
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        spec = f.metadata.get(_KEY)
        if spec is None:
            continue
        kinds = typing.get_args(hints[f.name]) if isinstance(
            hints[f.name], types.UnionType) else (hints[f.name],)
        plain = [k for k in kinds if k is not type(None)]
        out.append(dataclasses.replace(spec, name=f.name, type=plain[0], default=f.default,
                                       optional=len(plain) < len(kinds)))
    return tuple(out)
