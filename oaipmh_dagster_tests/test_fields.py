"""A harvester's tuning field is declared once, on the `Harvester` dataclass: a field
added there reaches validation, the command line's options, the `manage_harvesters`
config, the update semantics and the table's column, with nothing else to edit but the
migration."""

from __future__ import annotations

import dataclasses
from typing import Any

import click
import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from oaipmh_dagster.cli import commands as cli
from oaipmh_dagster.defs import manage
from oaipmh_dagster.fields import Bounds, declared, tuning
from oaipmh_dagster.operations import admin
from oaipmh_dagster.storage import db
from oaipmh_dagster.storage.registry import Harvester, InvalidHarvester, harvester_table

BASE = {"id": "fake", "base_url": "https://example.org/oai", "metadata_prefix": "oai_dc"}


def fake_harvester() -> Any:
    """`Harvester` with one more declared field, `max_pages`."""
    return dataclasses.make_dataclass(
        "Harvester",
        [("max_pages", int, tuning(100, help="Most pages per harvest ({default}).",
                                    bounds=Bounds(1, 1000)))],
        bases=(Harvester,), frozen=True)


def test_the_declared_fields_are_the_tuning_fields() -> None:
    names = [f.name for f in declared(Harvester)]
    assert {"comment", "timeout", "delay", "max_parallel", "max_retries", "auth_env",
            "overlap", "reconcile_every", "max_delete"} <= set(names)
    assert not {"id", "base_url", "sets", "cron", "schema", "created"} & set(names)
    assert tuple(f.name for f in declared(Harvester)) == admin.HTTP_FIELDS


def test_the_migrations_make_the_table_the_declaration_derives(sqlite_url: str) -> None:
    """A declared field without its migration fails here."""
    engine = db.get_engine(sqlite_url)
    stored = {c["name"]: c["nullable"] for c in sa.inspect(engine).get_columns(
        harvester_table.name)}
    assert stored == {c.name: c.nullable for c in harvester_table.columns}


def test_a_new_field_has_its_column() -> None:
    column = next(f for f in declared(fake_harvester()) if f.name == "max_pages").column()
    assert (column.name, column.nullable, column.server_default) == ("max_pages", False, None)
    assert isinstance(column.type, sa.Integer)


def test_a_new_field_is_validated_from_its_declaration() -> None:
    fake = fake_harvester()
    assert fake(**BASE).max_pages == 100
    assert fake(**BASE, max_pages=1000).max_pages == 1000
    with pytest.raises(InvalidHarvester, match=r"^max_pages must be in \[1, 1000\], not 0$"):
        fake(**BASE, max_pages=0)
    with pytest.raises(InvalidHarvester, match="max_pages must be"):
        fake(**BASE).replace(max_pages=1001)


def test_a_new_field_is_a_command_line_option() -> None:
    got: dict[str, Any] = {}

    def command_body(**values: Any) -> None:
        got.update(values)

    command = click.command()(cli.tuning_options(fake_harvester())(command_body))
    option = next(p for p in command.params if p.name == "max_pages")
    assert option.opts == ["--max-pages"]
    assert getattr(option, "help", None) == "Most pages per harvest (100)."
    result = CliRunner().invoke(command, ["--max-pages", "7"])
    assert result.exit_code == 0, result.output
    assert got["max_pages"] == 7 and got["max_retries"] is None
    assert CliRunner().invoke(command, ["--max-pages", "x"]).exit_code == 2


def test_a_new_field_is_in_the_manage_config() -> None:
    model = manage.options_model(fake_harvester())
    field = model.model_fields["max_pages"]
    assert field.default is None
    assert field.description == "Most pages per harvest (add: 100)."
    assert model(max_pages=3).max_pages == 3


def test_a_new_field_follows_the_update_semantics() -> None:
    fake = fake_harvester()
    assert admin.tuning_values({"max_pages": 3, "timeout": None}, fake) == {"max_pages": 3}
    assert admin.tuning_values({"reconcile_every": 0}, fake) == {"reconcile_every": None}
    assert admin.tuning_values({"reconcile_every": 4, "name": None}, fake) == {
        "reconcile_every": 4}
