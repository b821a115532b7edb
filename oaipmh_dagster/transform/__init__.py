"""Metadata transformers: one record's metadata XML -> a flat, JSON-ready dict.

A transformer is a callable ``(element) -> dict``. It is named by a built-in name
(a row of the format table, :data:`oaipmh_dagster.formats.FORMATS`; see
:func:`available_transformers`), by ``xslt:PATH[?name=value&...]`` (an XSLT
stylesheet, see :mod:`.xslt`), by the name of an entry point of the group
``oaipmh_dagster.transformers`` that an installed distribution declares, or by a
dotted plugin path ``package.module:function`` whose module the operator lists in
``$OAIPMH_TRANSFORMER_MODULES`` (read where the transformer is resolved: the command,
the code server, the run worker). Both are loaded on first use; any other plugin path is
refused before anything is imported. :func:`transform_record` parses the metadata bytes
with a hardened parser, applies the transformer and turns every failure into a
:class:`TransformError` that says what went wrong and where.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import os
import re
from collections.abc import Callable
from typing import Any

from lxml import etree

from oaipmh_dagster import formats
from oaipmh_dagster.oai import hardened_parser

from . import _builtins, xslt
from ._util import TransformError, element_path
from .versions import module_identity, package_identity

__all__ = [
    "Transformer",
    "TransformError",
    "PLUGIN_GROUP",
    "PLUGIN_MODULES_ENV",
    "available_transformers",
    "element_path",
    "forget_plugins",
    "get_transformer",
    "parse_metadata",
    "register_transformer",
    "transform_element",
    "transform_record",
    "transformer_identity",
    "transformer_version",
]

Transformer = Callable[[etree._Element], dict[str, Any]]

# Names registered in this process (they shadow a built-in only with replace=True).
_registry: dict[str, Transformer] = {}
_plugins: dict[str, Transformer] = {}
# The built-ins loaded so far: trusted to return JSON-ready dicts.
_BUILTIN_FUNCS = _builtins.BUILTIN_FUNCS

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_DOTTED = re.compile(rf"^{_IDENT}(?:\.{_IDENT})*:{_IDENT}(?:\.{_IDENT})*$")

_POSITION_SUFFIX = re.compile(r", line \d+, column \d+$")

# Where plugins may come from (contract): the entry points of this group, and the modules
# (with their submodules) named in this comma-separated variable.
PLUGIN_GROUP = "oaipmh_dagster.transformers"
PLUGIN_MODULES_ENV = "OAIPMH_TRANSFORMER_MODULES"


def available_transformers() -> list[str]:
    """Names accepted by :func:`get_transformer` besides dotted plugin paths and
    ``xslt:`` specs: the built-ins, registered names and declared entry points."""
    return sorted(set(formats.transformer_refs()) | set(_registry) | set(_entry_points()))


_load_builtin = _builtins.load


for _ref in dict.fromkeys(formats.transformer_refs().values()):
    _load_builtin(_ref)  # built-ins load with the package: trusted from the first record


def _builtin(name: str) -> Transformer | None:
    """A registered name's transformer, else the built-in of the format table."""
    fn = _registry.get(name)
    if fn is None and (ref := formats.transformer_ref(name)) is not None:
        fn = _load_builtin(ref)
    return fn


@functools.cache
def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    """The transformers installed distributions declare (read once per process)."""
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=PLUGIN_GROUP)}


def forget_plugins() -> None:
    """Forget loaded plugins and the declared entry points (read again on next use)."""
    _entry_points.cache_clear()
    _plugins.clear()


def _allowed_modules() -> list[str]:
    raw = os.environ.get(PLUGIN_MODULES_ENV, "")
    return [item.strip() for item in raw.split(",") if item.strip()]


def _module_allowed(module_name: str) -> bool:
    """Whether the operator lists `module_name` or a package that holds it."""
    return any(module_name == allowed or module_name.startswith(allowed + ".")
               for allowed in _allowed_modules())


def _refused(name: str) -> TransformError:
    """The refusal of a plugin path that is not allowed: decided on the name alone, so
    it says nothing of whether such a module exists."""
    return TransformError(
        "bad_plugin",
        f"plugin transformer {name!r} is not allowed: declare it in the entry-point group "
        f"{PLUGIN_GROUP} or list its module in ${PLUGIN_MODULES_ENV}",
        name,
    )


def register_transformer(name: str, fn: Transformer, *, replace: bool = False) -> None:
    """Register ``fn`` under ``name`` in this process (plugins by path need no registration)."""
    if not re.fullmatch(r"[a-z0-9][a-z0-9_]*", name):
        raise ValueError(f"transformer name {name!r} must match [a-z0-9][a-z0-9_]*")
    if not callable(fn):
        raise TypeError(f"transformer {name!r} is not callable")
    if (name in _registry or formats.transformer_ref(name)) and not replace:
        raise ValueError(f"transformer {name!r} is already registered")
    _registry[name] = fn


def _unknown(name: str) -> TransformError:
    return TransformError(
        "unknown_transformer",
        f"unknown transformer {name!r}: use one of {', '.join(available_transformers())} "
        f", xslt:PATH or a plugin path 'package.module:function' (its module listed in "
        f"${PLUGIN_MODULES_ENV})",
        name,
    )


def _load_entry_point(ep: importlib.metadata.EntryPoint) -> Transformer:
    try:
        obj = ep.load()
    except Exception as exc:  # a declared plugin that fails while loading
        raise TransformError(
            "bad_plugin",
            f"loading transformer {ep.name!r} ({ep.value}) failed: {type(exc).__name__}: "
            f"{exc}",
            ep.name,
        ) from exc
    if not callable(obj):
        raise TransformError("bad_plugin", f"transformer {ep.name!r} is not callable",
                             ep.name)
    return obj


def _load_plugin(path: str) -> Transformer:
    module_name, _, attr_path = path.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise TransformError(
            "bad_plugin",
            f"cannot import module {module_name!r} for transformer {path!r}: {exc}",
            path,
        ) from exc
    except Exception as exc:  # a plugin module that fails while importing
        raise TransformError(
            "bad_plugin",
            f"importing module {module_name!r} for transformer {path!r} failed: "
            f"{type(exc).__name__}: {exc}",
            path,
        ) from exc
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise TransformError(
                "bad_plugin", f"module {module_name!r} has no attribute {attr_path!r}", path
            ) from None
    if not callable(obj):
        raise TransformError("bad_plugin", f"transformer {path!r} is not callable", path)
    return obj


def get_transformer(name: str) -> Transformer:
    """Resolve a built-in name, an ``xslt:`` spec, a declared entry point's name or an
    allowed ``package.module:function`` path (checked on every call: a plugin loaded
    before is refused once its module is no longer listed).

    Raises :class:`TransformError` (a ``ValueError``) with type ``unknown_transformer``,
    ``bad_plugin`` or ``bad_stylesheet`` and a message that says what is wrong.
    """
    if not isinstance(name, str):
        raise TransformError(
            "unknown_transformer", f"transformer name must be a string, got {name!r}"
        )
    key = name.strip()
    fn = _builtin(key)
    if fn is not None:
        return fn
    if xslt.is_xslt(key):
        return xslt.get(key)
    if ":" not in key:
        return _entry_point_transformer(key, name)
    if not _DOTTED.match(key):
        raise TransformError(
            "bad_plugin",
            f"malformed plugin path {name!r}: expected 'package.module:function'",
            name,
        )
    if not _module_allowed(key.partition(":")[0]):
        raise _refused(key)
    fn = _plugins.get(key)
    if fn is None:
        fn = _plugins[key] = _load_plugin(key)
    return fn


def _entry_point_transformer(key: str, name: str) -> Transformer:
    """The transformer an installed distribution declares under `key`."""
    fn = _plugins.get(key)
    if fn is not None:
        return fn
    ep = _entry_points().get(key)
    if ep is None:
        raise _unknown(name)
    fn = _plugins[key] = _load_entry_point(ep)
    return fn


def transformer_identity(name: str) -> str:
    """What a transformer name stands for in records' content hashes: the name itself,
    plus the stylesheet's digest for ``xslt:`` (an edited crosswalk changes it)."""
    return xslt.identity(name) if xslt.is_xslt(name) else name


def _builtin_version(ref: str) -> str:
    """A digest of a built-in's module and the package modules it uses."""
    return package_identity(ref.partition(":")[0], __name__)


def transformer_version(name: str) -> str:
    """What the code behind a transformer name is, for the records asset's code version:
    a built-in's name and a digest of its module's source (with the package modules it
    uses), `transformer_identity` for ``xslt:`` (the stylesheet's digest) with a digest
    of every built-in (a result is read by the one of its format), and for a plugin its
    name, the version of the distribution that installs its module and a digest of the
    module's source. Never raises and imports no plugin: a name that resolves to nothing
    is marked ``unavailable``."""
    key = name.strip()
    ref = formats.transformer_ref(key)
    if ref is not None:
        return f"{key};{_builtin_version(ref)}"
    if xslt.is_xslt(key):
        builtins = sorted({_builtin_version(r) for r in formats.transformer_refs().values()})
        return f"{xslt.identity(key)};{','.join(builtins)}"
    fn = _registry.get(key)
    if fn is not None:  # registered in this process
        module = getattr(fn, "__module__", None) or ""
        return f"{key};{_name_of(fn)};{module_identity(module) if module else ''}"
    if ":" not in key:
        ep = _entry_points().get(key)
        if ep is None:
            return f"{key};unavailable"
        dist = f"{ep.dist.name}=={ep.dist.version}" if ep.dist is not None else ""
        return f"{key};{ep.value};{dist};{module_identity(ep.module)}"
    module_name = key.partition(":")[0]
    if not _DOTTED.match(key) or not _module_allowed(module_name):
        return f"{key};unavailable"
    return f"{key};{module_identity(module_name)}"


def parse_metadata(metadata_xml: bytes | str) -> etree._Element:
    """Parse metadata XML with the hardened parser; :class:`TransformError` when broken.

    A ``str`` is encoded as UTF-8 first (pass bytes when the XML declares another
    encoding).
    """
    data = metadata_xml.encode("utf-8") if isinstance(metadata_xml, str) else metadata_xml
    try:
        root = etree.fromstring(data, hardened_parser())
    except etree.XMLSyntaxError as exc:
        line, column = exc.position if exc.position else (0, 0)
        message = _POSITION_SUFFIX.sub("", exc.msg or str(exc)) or "not well-formed XML"
        raise TransformError("xml_syntax", message, f"line {line}, column {column}") from None
    except (TypeError, ValueError) as exc:
        raise TransformError("xml_syntax", str(exc), None) from None
    if root is None:
        raise TransformError("xml_syntax", "no root element", None)
    return root


def _name_of(fn: Callable[..., Any]) -> str:
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{module}:{qualname}" if module else qualname


# Deeper output is refused: encoding it would overflow the stack.
MAX_OUTPUT_DEPTH = 200


def _check_json(value: Any, path: str, within: tuple[int, ...] = ()) -> str | None:
    """Where ``value`` is not JSON-ready (``None`` when it is): a value JSON cannot hold,
    a container inside itself (`within`: the ids of the containers on the path), or
    nesting deeper than `MAX_OUTPUT_DEPTH`."""
    if value is None or isinstance(value, str | bool | int):
        return None
    if isinstance(value, float):
        return None if value == value and value not in (float("inf"), float("-inf")) else path
    if not isinstance(value, dict | list | tuple):
        return path
    if id(value) in within or len(within) >= MAX_OUTPUT_DEPTH:
        return f"{path} (a cycle or nesting deeper than {MAX_OUTPUT_DEPTH})"
    within = (*within, id(value))
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                return f"{path}[{k!r}] (key)"
            bad = _check_json(v, f"{path}.{k}", within)
            if bad:
                return bad
        return None
    for i, v in enumerate(value):
        bad = _check_json(v, f"{path}[{i}]", within)
        if bad:
            return bad
    return None


def _resolve(name_or_fn: str | Transformer) -> tuple[Transformer, str]:
    if isinstance(name_or_fn, str):
        return get_transformer(name_or_fn), name_or_fn.strip()
    if callable(name_or_fn):
        return name_or_fn, _name_of(name_or_fn)
    raise TransformError("unknown_transformer", f"not a transformer: {name_or_fn!r}")


def transform_element(name_or_fn: str | Transformer, element: etree._Element) -> dict[str, Any]:
    """Apply a transformer to an already parsed metadata element.

    Built-in transformers are trusted to return JSON-ready dicts; the output of any
    other transformer is checked, so a plugin cannot store something unserializable.
    """
    fn, name = _resolve(name_or_fn)
    return _apply(fn, name, element)


def _apply(fn: Transformer, name: str, element: etree._Element) -> dict[str, Any]:
    try:
        result = fn(element)
    except TransformError as exc:
        if exc.location is None:
            exc.location = name
        raise
    except RecursionError:
        raise TransformError(
            "transform_failed", "RecursionError: too deeply nested", name
        ) from None
    except Exception as exc:
        raise TransformError("transform_failed", f"{type(exc).__name__}: {exc}", name) from exc
    if fn not in _BUILTIN_FUNCS and not isinstance(fn, xslt.XsltTransformer):
        if not isinstance(result, dict):
            raise TransformError(
                "bad_output", f"transformer returned {type(result).__name__}, not a dict", name
            )
        bad = _check_json(result, "$")
        if bad:
            raise TransformError(
                "bad_output", f"transformer output is not JSON-ready at {bad}", name
            )
    return result


def transform_record(name_or_fn: str | Transformer, metadata_xml: bytes | str) -> dict[str, Any]:
    """Parse one record's metadata XML (the child of ``<metadata>``) and transform it.

    Raises :class:`TransformError` on unknown transformers, broken XML and failing or
    misbehaving transformers; ``.to_dict()`` gives the form stored with the record.
    """
    fn, name = _resolve(name_or_fn)  # an unknown name fails before any parsing
    return _apply(fn, name, parse_metadata(metadata_xml))
