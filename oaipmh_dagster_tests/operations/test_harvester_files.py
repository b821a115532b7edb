"""Harvesters as CSV, JSON and YAML (`harvester_files`): the typed values of a row, the
CSV encoding, and what `dump` writes `read_rows` reads back."""

from __future__ import annotations

from typing import Any

import pytest

from oaipmh_dagster.operations.harvester_files import (
    COLUMNS,
    FileProblem,
    Row,
    dump,
    format_of,
    harvester_record,
    read_rows,
    row_fields,
)
from oaipmh_dagster.storage.registry import Harvester

URL = "http://127.0.0.1:9/oai"


def typed(values: dict[str, Any], text: bool = False) -> dict[str, Any]:
    return {k: v for k, v in row_fields(Row(1, "row 1", values, text=text)).items()
            if v is not None}


def test_columns_are_the_options_of_add() -> None:
    assert COLUMNS[:10] == ("id", "url", "prefix", "sets", "cron", "timezone", "enabled",
                            "name", "transformer", "validate")
    assert {"timeout", "max_retries", "auth_env", "max_delete", "comment"} <= set(COLUMNS)
    assert list(harvester_record(Harvester(id="a", base_url=URL, metadata_prefix="p"))
                ) == list(COLUMNS)


def test_json_and_yaml_values_are_typed() -> None:
    assert typed({"id": "a", "timeout": 30, "enabled": False, "sets": ["x"], "cron": "",
                  "max_retries": 2}) == {"id": "a", "timeout": 30.0, "enabled": False,
                                         "sets": ["x"], "max_retries": 2}
    # A whole number where text is expected is that text (YAML reads `id: 2024` so).
    assert typed({"id": 2024, "max_delete": 1000, "name": 7}) == {
        "id": "2024", "max_delete": "1000", "name": "7"}
    for values, message in [({"max_retries": 1.5}, "max_retries must be a whole number"),
                            ({"max_parallel": True}, "max_parallel must be a whole number"),
                            ({"timeout": "30"}, "timeout must be a number"),
                            ({"enabled": "yes"}, "enabled must be true or false"),
                            ({"sets": "a|b"}, "sets must be a list of set specs"),
                            ({"name": False}, "name must be text, not False"),
                            ({"comment": 1.5}, "comment must be text, not 1.5")]:
        with pytest.raises(ValueError, match=message):
            typed(values)


def test_csv_cells() -> None:
    assert typed({"id": "a", "sets": " x | y:z ", "enabled": "No", "timeout": " 2.5 ",
                  "overlap": "600", "name": " spaced "}, text=True) == {
        "id": "a", "sets": ["x", "y:z"], "enabled": False, "timeout": 2.5, "overlap": 600,
        "name": " spaced "}
    with pytest.raises(ValueError, match="overlap must be a whole number, not '6.5'"):
        typed({"overlap": "6.5"}, text=True)


@pytest.mark.parametrize("fmt", ["csv", "json", "yaml"])
def test_what_dump_writes_read_rows_reads(fmt: str) -> None:
    h = Harvester(id="a", base_url=URL, metadata_prefix="oai_dc", sets=("s:1", "t"),
                  name='say "yes", no\nmore', comment="", cron="*/5 * * * *",
                  timeout=0.1 + 0.2, auth_env="OAIPMH_AUTH_A")
    (row,) = read_rows(dump([h], fmt), fmt)
    record = harvester_record(h)
    assert {k: v for k, v in row_fields(row).items() if v is not None} == {
        k: v for k, v in record.items() if v not in (None, "")}
    assert row_fields(row)["timeout"] == 0.1 + 0.2  # exactly
    assert read_rows(dump([], fmt), fmt) == []


def test_format_by_extension() -> None:
    assert [format_of(p) for p in ("a.CSV", "b.json", "c.yml", "d.yaml", "e.txt")] == [
        "csv", "json", "yaml", "yaml", None]
    with pytest.raises(FileProblem, match="unknown format 'xml'"):
        read_rows("", "xml")
