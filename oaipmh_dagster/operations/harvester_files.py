"""Harvesters as a file: one row per harvester, the fields of `harvester add` as CSV
columns or as the keys of JSON and YAML objects (`COLUMNS`), read into `Row`s and
written back so that what `dump` writes, `read_rows` reads to the same rows.

CSV: a header row naming columns of `COLUMNS` (in any order; `id` is required); an
empty cell is the field's default; `enabled` is true/false (yes/no, 1/0); `sets` are
set specs joined by `|` (a set spec holds no `|`). JSON: a list of objects; YAML: a
list of mappings; null (or a key left out, or "") is the default. With `--update`, a
column (key) left out of the file keeps an existing harvester's stored value.

A file that cannot be read as its format is one `FileProblem`; a row with a bad value
is a `Row` with a `problem`, so that every bad row is told at once."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from oaipmh_dagster.errors import OAIPMHDagsterError
from oaipmh_dagster.fields import declared
from oaipmh_dagster.storage.registry import Harvester

__all__ = ["COLUMNS", "FORMATS", "SET_SEPARATOR", "FileProblem", "Row", "dump",
           "filled_from", "format_of", "harvester_record", "read_rows", "row_fields"]

FORMATS = ("csv", "json", "yaml")
_EXTENSIONS = {".csv": "csv", ".json": "json", ".yaml": "yaml", ".yml": "yaml"}
SET_SEPARATOR = "|"
# The fields of `harvester add`, dashes as underscores, and their types: `sets` is a
# list of set specs, `validate` the schema (a shipped schema's name, "shipped" for the
# one shipped for the prefix, or a schema file's path).
_TYPES: dict[str, Any] = {
    "id": str, "url": str, "prefix": str, "sets": list, "cron": str, "timezone": str,
    "enabled": bool, "name": str, "transformer": str, "validate": str,
    **{f.name: f.type for f in declared(Harvester)},
}
COLUMNS = tuple(_TYPES)
_WHOLE = re.compile(r"[+-]?[0-9]+")
_TRUE, _FALSE = ("true", "yes", "1"), ("false", "no", "0")


class FileProblem(OAIPMHDagsterError, ValueError):
    """The file cannot be read as harvesters (one line)."""


class _BadValue(OAIPMHDagsterError, ValueError):
    """A row's value that does not fit its field."""


@dataclass(frozen=True)
class Row:
    """One harvester of a file: `values` by column (CSV: text), or the `problem` that
    keeps it from being read. `label`: "row N" (1-based; CSV: and its line)."""

    number: int
    label: str
    values: Mapping[str, Any]
    text: bool = False  # values are CSV cells
    problem: str | None = None


def format_of(path: str) -> str | None:
    """The format a file's extension names (None: none of `FORMATS`)."""
    lowered = path.lower()
    return next((fmt for ext, fmt in _EXTENSIONS.items() if lowered.endswith(ext)), None)


def harvester_record(h: Harvester) -> dict[str, Any]:
    """A harvester as a row of `COLUMNS` (None: the default)."""
    record: dict[str, Any] = {
        "id": h.id, "url": h.base_url, "prefix": h.metadata_prefix, "sets": list(h.sets),
        "cron": h.cron, "timezone": h.timezone, "enabled": h.enabled, "name": h.name,
        "transformer": h.transformer, "validate": h.schema}
    record.update({f.name: getattr(h, f.name) for f in declared(Harvester)})
    return record


def filled_from(row: Row, h: Harvester) -> Row:
    """`row` with the columns it leaves out taken from the stored harvester `h` (an
    update: a file of `id,cron` changes the cron alone; an empty cell is the default)."""
    missing = {column: (_cell(value) if row.text else value)
               for column, value in harvester_record(h).items() if column not in row.values}
    return dataclasses.replace(row, values={**missing, **row.values}) if missing else row


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return SET_SEPARATOR.join(value)
    return repr(value) if isinstance(value, float) else str(value)


def dump(harvesters: Iterable[Harvester], fmt: str) -> str:
    """The harvesters as a `fmt` file's text, every column in `COLUMNS` order."""
    records = [harvester_record(h) for h in harvesters]
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(COLUMNS)
        writer.writerows([_cell(r[c]) for c in COLUMNS] for r in records)
        return out.getvalue()
    if fmt == "json":
        return json.dumps(records, indent=2, ensure_ascii=False) + "\n"
    if fmt == "yaml":
        import yaml

        return str(yaml.safe_dump(records, sort_keys=False, allow_unicode=True,
                                  default_flow_style=False))
    raise FileProblem(f"unknown format {fmt!r}: one of {', '.join(FORMATS)}")


def read_rows(text: str, fmt: str) -> list[Row]:
    """The rows of a `fmt` file's text; `FileProblem` when it is no such file."""
    if fmt == "csv":
        return _csv_rows(text)
    if fmt == "json":
        try:
            data = json.loads(text, object_pairs_hook=_no_repeated_keys)
        except json.JSONDecodeError as exc:
            raise FileProblem(f"not valid JSON: {exc.msg} (line {exc.lineno}, column "
                              f"{exc.colno})") from None
    elif fmt == "yaml":
        data = _yaml(text)
    else:
        raise FileProblem(f"unknown format {fmt!r}: one of {', '.join(FORMATS)}")
    if data is None and fmt == "yaml":
        data = []
    if not isinstance(data, list):
        raise FileProblem(f"a {fmt.upper()} list of harvester objects was expected, not "
                          f"{_kind(data)}")
    return [_object_row(i, item) for i, item in enumerate(data, 1)]


def _no_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    repeated = sorted({k for k in keys if keys.count(k) > 1})
    if repeated:
        raise FileProblem(f"an object has key {repeated[0]!r} twice")
    return dict(pairs)


def _yaml(text: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise FileProblem(f"not valid YAML: {problem}{where}") from None


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "an object", str: "a string", list: "a list", bool: "a boolean",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)


def _object_row(number: int, item: Any) -> Row:
    label = f"row {number}"
    if not isinstance(item, dict):
        return Row(number, label, {}, problem=f"a harvester object was expected, not "
                   f"{_kind(item)}")
    unknown = [str(k) for k in item if k not in _TYPES]
    if unknown:
        return Row(number, label, item, problem=f"unknown field {unknown[0]!r} (fields: "
                   f"{', '.join(COLUMNS)})")
    return Row(number, label, item)


def _csv_rows(text: str) -> list[Row]:
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader, None)
        if header is None:
            raise FileProblem("the file is empty: a header row naming the columns was "
                              "expected")
        header = [h.strip() for h in header]
        unknown = [h for h in header if h not in _TYPES]
        if unknown:
            raise FileProblem(f"unknown column {unknown[0]!r} (columns: "
                              f"{', '.join(COLUMNS)})")
        repeated = sorted({h for h in header if header.count(h) > 1})
        if repeated:
            raise FileProblem(f"column {repeated[0]!r} is named twice in the header")
        if "id" not in header:
            raise FileProblem("the header has no id column")
        rows: list[Row] = []
        for cells in reader:
            if not any(c.strip() for c in cells):
                continue  # a blank line
            number = len(rows) + 1
            label = f"row {number} (line {reader.line_num})"
            values = dict(zip(header, cells, strict=False))
            problem = None
            if len(cells) != len(header):
                problem = f"{len(cells)} cells for the header's {len(header)} columns"
            rows.append(Row(number, label, values, text=True, problem=problem))
    except csv.Error as exc:
        raise FileProblem(f"not valid CSV: {exc} (line {reader.line_num})") from None
    return rows


def row_fields(row: Row) -> dict[str, Any]:
    """The row's values typed as `COLUMNS` say, None for the default (an empty cell,
    null, "" or a key left out): `ValueError` naming the first bad one."""
    return {column: _typed(column, kind, row.values.get(column), row.text)
            for column, kind in _TYPES.items()}


def _typed(column: str, kind: Any, value: Any, text: bool) -> Any:
    if value is None or value == "":
        return None
    if text:
        return _from_cell(column, kind, value)
    if kind is list:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise _BadValue(f"{column} must be a list of set specs, not {value!r}")
        return value or None
    if kind is bool and not isinstance(value, bool):
        raise _BadValue(f"{column} must be true or false, not {value!r}")
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise _BadValue(f"{column} must be a whole number, not {value!r}")
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _BadValue(f"{column} must be a number, not {value!r}")
        return float(value)
    if kind is str and not isinstance(value, str):
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)  # YAML reads `id: 2024` as a number
        raise _BadValue(f"{column} must be text, not {value!r}")
    return value


def _from_cell(column: str, kind: Any, cell: str) -> Any:
    plain = cell.strip()
    if kind is list:
        specs = [s.strip() for s in plain.split(SET_SEPARATOR)]
        if not all(specs):
            raise _BadValue(f"{column}: an empty set spec in {cell!r} (set specs are "
                            f"separated by {SET_SEPARATOR})")
        return specs
    if kind is bool:
        if plain.lower() in _TRUE + _FALSE:
            return plain.lower() in _TRUE
        raise _BadValue(f"{column} must be true or false, not {cell!r}")
    if kind is int:
        if not _WHOLE.fullmatch(plain):
            raise _BadValue(f"{column} must be a whole number, not {cell!r}")
        return int(plain)
    if kind is float:
        try:
            return float(plain)
        except ValueError:
            raise _BadValue(f"{column} must be a number, not {cell!r}") from None
    return cell
