"""XML Schema and ISO Schematron validation of harvested metadata.

The package ships the schemas its format table names (`formats.FORMATS`, files in
`oaipmh_dagster/transform/schemas/`); a harvester may name one of them or a schema file of its
own. Schemas are loaded from local files only: every xs:import and xs:include must
name a local file, and the parser never touches the network. A `Validator` checks one
record's own element (the `<resource>` inside an oai_datacite wrapper: `formats.unwrap`)
and returns its violations in the store's error form, type `schema`. A schema field
``schematron:PATH`` names an ISO Schematron file instead (:mod:`.schematron`): each
failed assertion becomes an error of type `schematron`."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

from lxml import etree

from oaipmh_dagster.errors import OAIPMHDagsterError
from oaipmh_dagster.formats import schema_for_prefix, shipped_schemas, unwrap

from .schematron import (
    SCHEMATRON_ERROR,
    LoadedSchematron,
    SchematronError,
    failed_assertions,
    is_schematron,
    load_schematron,
)

__all__ = ["MAX_VIOLATIONS", "SCHEMA_DIR", "SHIPPED", "SchemaError",
           "Validator", "check_schema", "load_schema", "schema_for_prefix", "schema_path"]

SCHEMA_DIR = Path(__file__).with_name("schemas")
# Shipped schema name -> its file in SCHEMA_DIR (the table in `formats`).
SHIPPED = shipped_schemas()
MAX_VIOLATIONS = 3  # violations named in a record's error
_XS = "{http://www.w3.org/2001/XMLSchema}"


class SchemaError(OAIPMHDagsterError, ValueError):
    """A schema cannot be found, read or compiled."""


def schema_path(schema: str) -> Path:
    """The file of a harvester's schema: a shipped name, else a path."""
    shipped = shipped_schemas()
    if schema in shipped:
        return SCHEMA_DIR / shipped[schema]
    return Path(schema)


def _parser() -> etree.XMLParser:
    return etree.XMLParser(no_network=True, resolve_entities=False, load_dtd=False)


def _schema_files(main: Path) -> list[Path]:
    """The schema file and every file it includes or imports, transitively; a
    schemaLocation that is not a local file is refused (nothing is fetched)."""
    seen: list[Path] = []
    todo = [main.resolve()]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        if not path.is_file():
            raise SchemaError(f"schema file {path} does not exist")
        seen.append(path)
        try:
            root = etree.parse(str(path), _parser()).getroot()
        except (etree.XMLSyntaxError, OSError) as exc:
            raise SchemaError(f"cannot read schema {path}: {exc}") from exc
        for ref in root.iter(f"{_XS}import", f"{_XS}include", f"{_XS}redefine"):
            location = ref.get("schemaLocation")
            if location is None:
                continue
            if urlsplit(location).scheme not in ("", "file") or location.startswith("//"):
                raise SchemaError(f"schema {path} refers to {location}: only local files "
                                  "are loaded (copy it next to the schema and refer to it "
                                  "by a relative path)")
            todo.append((path.parent / urlsplit(location).path).resolve())
    return seen


@dataclass(frozen=True)
class LoadedSchema:
    """A compiled schema, its target namespace, and the digest of its files."""

    schema: etree.XMLSchema
    namespace: str | None
    digest: str


def load_schema(schema: str) -> LoadedSchema:
    """Compile a harvester's schema (a shipped name or a path); `SchemaError` when it
    cannot be."""
    main = schema_path(schema)
    files = _schema_files(main)
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.read_bytes())
    try:
        doc = etree.parse(str(files[0]), _parser())
        compiled = etree.XMLSchema(doc)
    except (etree.XMLSchemaParseError, etree.XMLSyntaxError, OSError) as exc:
        raise SchemaError(f"schema {main} does not compile: {exc}") from exc
    return LoadedSchema(compiled, doc.getroot().get("targetNamespace"),
                        digest.hexdigest()[:16])


def _load_schematron(schema: str) -> LoadedSchematron:
    try:
        return load_schematron(schema)
    except SchematronError as exc:
        raise SchemaError(str(exc)) from None


def check_schema(schema: str) -> None:
    """Raise `SchemaError` unless the schema (or ``schematron:PATH``) exists and
    compiles."""
    if is_schematron(schema):
        _load_schematron(schema)
    else:
        load_schema(schema)


def _error(message: str, violations: list[dict[str, Any]] | None = None,
           kind: str = "schema") -> dict[str, Any]:
    error: dict[str, Any] = {"type": kind, "message": message, "location": "metadata"}
    if violations:
        error["violations"] = violations
    return error


@dataclass
class Validator:
    """Validates records against one schema or Schematron (compiled once per thread:
    lxml's schema objects keep their error log, a Schematron its report, on the
    object). `token` names the schema and its content: it is part of what produced a
    stored row."""

    schema: str
    _loaded: LoadedSchema | LoadedSchematron = field(init=False, repr=False)
    _local: threading.local = field(init=False, repr=False, default_factory=threading.local)

    def __post_init__(self) -> None:
        if is_schematron(self.schema):
            self._loaded = _load_schematron(self.schema)
            self._local.schematron = self._loaded.schematron
        else:
            self._loaded = load_schema(self.schema)
            self._local.schema = self._loaded.schema

    @property
    def token(self) -> str:
        return f"{self.schema}@{self._loaded.digest}"

    @property
    def namespace(self) -> str | None:
        return self._loaded.namespace if isinstance(self._loaded, LoadedSchema) else None

    def _schematron(self) -> Any:
        compiled = getattr(self._local, "schematron", None)
        if compiled is None:
            compiled = self._local.schematron = _load_schematron(self.schema).schematron
        return compiled

    def _compiled(self) -> etree.XMLSchema:
        compiled: etree.XMLSchema | None = getattr(self._local, "schema", None)
        if compiled is None:
            compiled = self._local.schema = load_schema(self.schema).schema
        return compiled

    def __call__(self, raw: str | None, element: Any = None) -> list[dict[str, Any]]:
        """The schema errors of one record's metadata (`element` when already parsed,
        else `raw`): [] when valid, else one error naming the first violations."""
        if element is None:
            if not raw:
                return []
            try:
                element = etree.fromstring(raw.encode("utf-8"), _parser())
            except etree.XMLSyntaxError as exc:
                kind = SCHEMATRON_ERROR if is_schematron(self.schema) else "schema"
                return [_error(f"not well-formed XML: {exc}", kind=kind)]
        element = unwrap(element)
        if is_schematron(self.schema):
            return failed_assertions(self._schematron(), element)
        namespace = etree.QName(element).namespace
        if namespace != self.namespace:
            return [_error(
                f"the metadata element <{etree.QName(element).localname}> is in namespace "
                f"{namespace or '(none)'}; the schema expects {self.namespace or '(none)'}")]
        compiled = self._compiled()
        if compiled.validate(element):
            return []
        entries: list[Any] = [*cast(Iterable[Any], compiled.error_log)]
        violations = [{"line": e.line, "path": e.path, "message": e.message}
                      for e in entries[:MAX_VIOLATIONS]]
        more = len(entries) - len(violations)
        message = "; ".join(f"line {v['line']} {v['path']}: {v['message']}" for v in violations)
        if more > 0:
            message += f" (and {more} more)"
        return [_error(message, violations)]
