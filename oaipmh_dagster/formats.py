"""The metadata formats the package knows, one row each in `FORMATS`.

A row names a format's metadataPrefixes, its built-in transformer, its shipped XML
Schema and the wrapper servers put around its records. The default transformer of a
prefix, the shipped schemas, the unwrapping of wrapped records and the help texts that
list formats all derive from the table: a new format is a transformer module in
`transform/`, a row here (with its schema file in `schemas/`) and a test.

Bottom layer: plain data and functions over element tags. Transformers are named by
``module:function`` and loaded by `transform`, so nothing here imports upwards; every
lookup reads `FORMATS` when called.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["FALLBACK", "FORMATS", "MetadataFormat", "default_transformer", "format_named",
           "format_of_root",
           "reads", "schema_for_prefix", "schema_prefixes_help", "shipped_schemas",
           "shipped_schemas_help", "transformer_ref", "transformer_refs", "unwrap"]


@dataclass(frozen=True)
class MetadataFormat:
    """One metadata format.

    `name` is its built-in transformer's name and its shipped schema's name; `prefixes`
    (lower case) are the metadataPrefixes whose default transformer it is; `transformer`
    is ``module:function``; `schema` a file in ``oaipmh_dagster/transform/schemas/`` (None: none
    shipped); `unwrap` the local names from a wrapper's root down to the element whose
    first child is the format's own element (``()``: never wrapped); `aliases` other
    names of the transformer; `schema_skips` prefixes the shipped schema does not
    describe (another version of the format, a loose alias); `roots` the root elements
    (Clark notation, ``{namespace}local``) of the format's records, by which an XSLT
    result is known to be of the format (:func:`format_of_root`)."""

    name: str
    prefixes: tuple[str, ...]
    transformer: str
    schema: str | None = None
    unwrap: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    schema_skips: tuple[str, ...] = ()
    roots: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        """The names the transformer is resolved by."""
        return (self.name, *self.aliases)

    @property
    def schema_prefixes(self) -> tuple[str, ...]:
        """The prefixes the shipped schema is taken for (none when none is shipped)."""
        if self.schema is None:
            return ()
        return tuple(p for p in self.prefixes if p not in self.schema_skips)


_T = "oaipmh_dagster.transform."
# The built-in transformer for a prefix no row names: it reads any record.
FALLBACK = "xml"

_DATACITE = "http://datacite.org/schema/"
_MARC = "{http://www.loc.gov/MARC21/slim}"
_MODS = "{http://www.loc.gov/mods/v3}"

FORMATS: tuple[MetadataFormat, ...] = (
    MetadataFormat("oai_dc", ("oai_dc",), _T + "oai_dc:transform", "oai_dc.xsd",
                   roots=("{http://www.openarchives.org/OAI/2.0/oai_dc/}dc",)),
    MetadataFormat("datacite", ("datacite", "oai_datacite", "datacite3", "datacite4"),
                   _T + "datacite:transform", "datacite-kernel-4.xsd",
                   unwrap=("oai_datacite", "payload"), schema_skips=("datacite3",),
                   roots=tuple(f"{{{_DATACITE}kernel-{v}}}resource"
                               for v in ("4", "3", "2.2", "2.1", "2.0"))
                   + ("{http://schema.datacite.org/oai/oai-1.1/}oai_datacite",
                      "{http://schema.datacite.org/oai/oai-1.0/}oai_datacite")),
    MetadataFormat("marc21", ("marc21", "marcxml", "marc"), _T + "marc21:transform",
                   "marc21-slim.xsd", aliases=("marcxml",), schema_skips=("marc",),
                   roots=(f"{_MARC}record", f"{_MARC}collection")),
    MetadataFormat("mods", ("mods",), _T + "mods:transform",
                   roots=(f"{_MODS}mods", f"{_MODS}modsCollection")),
    MetadataFormat("qdc", ("qdc", "oai_qdc"), _T + "qdc:transform",
                   roots=("{http://worldcat.org/xmlschemas/qdc-1.0/}qualifieddc",
                          "{http://dspace.org/qualifieddc/}qualifieddc",
                          "{http://purl.org/dc/terms/}qualifieddc")),
    MetadataFormat("oai_openaire", ("oai_openaire",), _T + "openaire:transform",
                   roots=("{http://namespace.openaire.eu/schema/oaire/}resource",)),
    MetadataFormat(FALLBACK, (), _T + "xml:transform"),
)


def format_named(name: str) -> MetadataFormat | None:
    """The row whose transformer is called `name` (a name or an alias)."""
    return next((f for f in FORMATS if name in f.names), None)


def format_of_root(tag: Any) -> MetadataFormat | None:
    """The row whose records have this root element (Clark notation), None when none."""
    return next((f for f in FORMATS if tag in f.roots), None)


def _for_prefix(prefix: str) -> MetadataFormat | None:
    key = prefix.strip().lower()
    return next((f for f in FORMATS if key in f.prefixes), None)


def default_transformer(metadata_prefix: str) -> str:
    """The built-in transformer for a metadata prefix (`FALLBACK` when none fits)."""
    row = _for_prefix(metadata_prefix)
    return row.name if row else FALLBACK


def reads(transformer: str) -> str | None:
    """The format a built-in transformer is made for (its row's name); None for the
    fallback, which reads any record, and for every other transformer."""
    row = format_named(transformer)
    return row.name if row is not None and row.prefixes else None


def transformer_refs() -> dict[str, str]:
    """Built-in transformer name (and alias) -> ``module:function``."""
    return {name: f.transformer for f in FORMATS for name in f.names}


def transformer_ref(name: str) -> str | None:
    """The ``module:function`` of a built-in transformer, None when `name` is none."""
    row = format_named(name)
    return row.transformer if row else None


def shipped_schemas() -> dict[str, str]:
    """Shipped schema name -> its file in ``oaipmh_dagster/transform/schemas/``."""
    return {f.name: f.schema for f in FORMATS if f.schema is not None}


def schema_for_prefix(prefix: str) -> str | None:
    """The shipped schema for a metadata prefix, None when none is shipped."""
    row = _for_prefix(prefix)
    return row.name if row and prefix.strip().lower() in row.schema_prefixes else None


def unwrap(element: Any) -> Any:
    """A record's own element: the first element inside a known wrapper (the DataCite
    ``<resource>`` in ``<oai_datacite><payload>``), else `element` itself."""
    for path in (f.unwrap for f in FORMATS if f.unwrap):
        inner = _follow(element, path)
        if inner is not None:
            return inner
    return element


def _follow(element: Any, path: tuple[str, ...]) -> Any:
    """The first element child of the end of `path` (local names, the first one the
    root's), None when `element` is not such a wrapper or holds nothing there."""
    if _local(element.tag) != path[0]:
        return None
    if len(path) == 1:
        return next(_children(element), None)
    for child in _children(element):
        inner = _follow(child, path[1:])
        if inner is not None:
            return inner
    return None


def _children(element: Any) -> Iterator[Any]:
    return iter(c for c in element if isinstance(c.tag, str))


def _local(tag: Any) -> str | None:
    return tag.rpartition("}")[2] if isinstance(tag, str) else None


# -- help texts ---------------------------------------------------------------------------


def schema_prefixes_help() -> str:
    """The prefixes that have a shipped schema, grouped by schema:
    ``oai_dc; datacite, oai_datacite, datacite4; ...``."""
    return "; ".join(", ".join(f.schema_prefixes) for f in FORMATS if f.schema_prefixes)


def shipped_schemas_help(last: str = ",") -> str:
    """The shipped schemas' names, ``a, b, c`` (`last` ``or``: ``a, b or c``)."""
    names = list(shipped_schemas())
    if last == "," or len(names) < 2:
        return ", ".join(names)
    return f"{', '.join(names[:-1])} {last} {names[-1]}"
