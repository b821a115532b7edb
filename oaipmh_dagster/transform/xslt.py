"""``xslt:PATH[?name=value&...]``: an XSLT 1.0 crosswalk applied to each record.

The stylesheet is applied to the record's metadata element (the child of
``<metadata>``, seen by the stylesheet as the document's root element). The root
element of its result is read by the transformer of its format when the format table
knows that root (``oai_dc:dc``, a DataCite ``resource``, ``mods``, ...:
:func:`oaipmh_dagster.formats.format_of_root`), so a crosswalk to oai_dc stores what
harvested oai_dc would; any other root is stored as element paths (the generic
:mod:`xml <.xml>` mapping).

Parameters follow the path in URL-query style, ``?name=value&other=value``: ``%XX``
escapes are decoded (``+`` stays a plus), names match ``[A-Za-z_][A-Za-z0-9_.-]*``,
and each value reaches the stylesheet as a string (``etree.XSLT.strparam``). The path
itself cannot hold ``?``. :func:`normalize` makes a relative path absolute (the admin
commands do so when a harvester is added or updated).

Limits: records are transformed in a worker process (:mod:`._sandbox`), each within a
time budget (``xslt.timeout``, seconds, default 5), an output budget (``xslt.max-output``,
bytes of the serialized result, default 10M) and a memory ceiling (``xslt.max-memory``,
the worker's address space, default 1G). They are given as query parameters of those
names (not passed to the stylesheet) or by the environment variables
``OAIPMH_XSLT_TIMEOUT``, ``OAIPMH_XSLT_MAX_OUTPUT`` and ``OAIPMH_XSLT_MAX_MEMORY``; sizes
take a ``K``, ``M`` or ``G`` suffix (powers of 1024). A record over a budget fails with
``transform_failed`` and the next one goes on; an interrupt stops the worker at once.

Security: stylesheets come from the filesystem only. The stylesheet parser loads no
DTD, resolves no entity and uses no network; an ``xsl:include``/``xsl:import`` of a
URL other than a local file is refused before compiling; ``document()`` reads only
files under the stylesheet's own directory (and the local files it includes), parsed
the same way; libxslt's access control refuses every write (``exsl:document``). A
refused read or write fails that record.

Compiled stylesheets are cached per (path, parameters) and recompiled when the file
or a local file it includes changes (size, mtime or inode); each worker process keeps
its own compiled copies. :meth:`XsltTransformer.identity` adds a digest of the
stylesheet bytes to the transformer's name (without the limits), so an edited
crosswalk re-transforms unchanged records on the next harvest.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urljoin, urlsplit
from urllib.request import url2pathname

from lxml import etree

from oaipmh_dagster import formats

from . import _builtins, _sandbox, xml
from ._sandbox import Limits
from ._util import TransformError
from ._xslt_worker import ACCESS as _ACCESS  # noqa: F401 - the access control, for tests
from ._xslt_worker import compile_stylesheet, log_text

PREFIX = "xslt:"
XSL_NS = "http://www.w3.org/1999/XSL/Transform"
_PARAM_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_POSITION_SUFFIX = re.compile(r", line \d+, column \d+$")
# The limits: query parameter, environment variable, Limits field.
LIMITS = (("xslt.timeout", "OAIPMH_XSLT_TIMEOUT", "seconds"),
          ("xslt.max-output", "OAIPMH_XSLT_MAX_OUTPUT", "max_output"),
          ("xslt.max-memory", "OAIPMH_XSLT_MAX_MEMORY", "max_memory"))
_SIZE = re.compile(r"(\d+)\s*([KMG]?)(?:I?B)?", re.IGNORECASE)
_MIN_MEMORY = 64 * 2**20
# The worker's results: sized by the output budget, possibly deeper than 256 levels.
_RESULT_PARSER = etree.XMLParser(no_network=True, resolve_entities=False, load_dtd=False,
                                 huge_tree=True)
_cache: dict[str, XsltTransformer] = {}
_cache_lock = threading.Lock()


def is_xslt(name: str) -> bool:
    """Whether a transformer name is an ``xslt:`` spec."""
    return isinstance(name, str) and name.strip().startswith(PREFIX)


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """``xslt:PATH?a=1&b=2`` -> (PATH, {"a": "1", "b": "2"}); :class:`TransformError`
    (type ``bad_stylesheet``) when malformed."""
    spec = spec.strip()
    if not spec.startswith(PREFIX):
        raise TransformError("bad_stylesheet", f"not an xslt transformer: {spec!r}", spec)
    path, _, query = spec[len(PREFIX):].partition("?")
    if not path:
        raise TransformError("bad_stylesheet", f"{spec!r} names no stylesheet file", spec)
    params: dict[str, str] = {}
    for item in query.split("&") if query else ():
        name, eq, value = item.partition("=")
        name = unquote(name)
        if not eq or not _PARAM_NAME.fullmatch(name):
            raise TransformError(
                "bad_stylesheet",
                f"bad stylesheet parameter {item!r} in {spec!r}: expected name=value with a "
                "name matching [A-Za-z_][A-Za-z0-9_.-]*",
                spec,
            )
        if name in params:
            raise TransformError("bad_stylesheet", f"parameter {name!r} given twice in {spec!r}",
                                 spec)
        params[name] = unquote(value)
    return path, params


def normalize(spec: str) -> str:
    """The spec with its path made absolute (``~`` expanded), the query kept as given."""
    path, _ = parse_spec(spec)
    query = spec.strip()[len(PREFIX):].partition("?")[2]
    absolute = os.path.abspath(os.path.expanduser(path))
    return f"{PREFIX}{absolute}" + (f"?{query}" if query else "")


def _parser() -> etree.XMLParser:
    return etree.XMLParser(no_network=True, resolve_entities=False, load_dtd=False,
                           huge_tree=False)


def _limit_value(field: str, text: str) -> float | int | None:
    """A limit's value from its text, None when malformed or out of range."""
    text = text.strip()
    if field == "seconds":
        try:
            seconds = float(text)
        except ValueError:
            return None
        return seconds if 0 < seconds <= 86400 else None
    match = _SIZE.fullmatch(text)
    if match is None:
        return None
    size = int(match[1]) * 1024 ** " KMG".index(match[2].upper() or " ")
    low = _MIN_MEMORY if field == "max_memory" else 1
    return size if size >= low else None


def split_limits(spec: str, params: dict[str, str],
                 environ: dict[str, str] | None = None) -> tuple[dict[str, str], Limits]:
    """The stylesheet's own parameters and the limits (query parameters win over the
    environment, which wins over the defaults); :class:`TransformError` (type
    ``bad_stylesheet``) for a malformed limit."""
    environ = dict(os.environ) if environ is None else environ
    values: dict[str, Any] = {}
    for name, variable, field in LIMITS:
        for where, text in ((f"parameter {name}", params.get(name)),
                            (f"${variable}", environ.get(variable))):
            if text is None or not text.strip() and where.startswith("$"):
                continue
            value = _limit_value(field, text)
            if value is None:
                what = ("a number of seconds (0-86400]" if field == "seconds" else
                        "a size in bytes, with an optional K, M or G suffix"
                        + (" (at least 64M)" if field == "max_memory" else ""))
                raise TransformError("bad_stylesheet",
                                     f"bad {where} {text!r} for {spec!r}: expected {what}",
                                     spec)
            values[field] = value
            break
    own = {k: v for k, v in params.items() if k not in {n for n, _, _ in LIMITS}}
    return own, Limits(**values)


def _without_limits(spec: str) -> str:
    """The spec with its limit parameters taken out (what identifies its output)."""
    head, sep, query = spec.partition("?")
    names = {n for n, _, _ in LIMITS}
    kept = [item for item in query.split("&")
            if item and unquote(item.partition("=")[0]) not in names]
    return head + ("?" + "&".join(kept) if kept else "")


@dataclass(frozen=True)
class _Version:
    """One state of a stylesheet on disk: its bytes and what it was read from."""

    source: bytes
    signature: tuple[tuple[str, int, int, int], ...]  # (path, mtime_ns, size, inode)
    digest: str
    files: tuple[str, ...] = ()  # the local files it includes or imports


def _stat(path: str) -> tuple[str, int, int, int]:
    st = os.stat(path)
    return (path, st.st_mtime_ns, st.st_size, st.st_ino)


class XsltTransformer:
    """A transformer ``(element) -> dict`` for one ``xslt:`` spec."""

    def __init__(self, spec: str) -> None:
        self.name = spec.strip()
        self.path, params = parse_spec(self.name)
        self.params, self.limits = split_limits(self.name, params)
        self._version: _Version | None = None
        self._job: _sandbox.Job | None = None
        self._lock = threading.Lock()

    def _refuse(self, message: str, where: str | None = None) -> TransformError:
        return TransformError("bad_stylesheet", message, where or self.path)

    def _read(self, path: str) -> bytes:
        try:
            with open(path, "rb") as fh:
                return fh.read()
        except FileNotFoundError:
            raise self._refuse(f"stylesheet {path} does not exist", path) from None
        except IsADirectoryError:
            raise self._refuse(f"stylesheet {path} is a directory", path) from None
        except OSError as exc:
            raise self._refuse(f"cannot read stylesheet {path}: {exc.strerror or exc}",
                               path) from None

    def _parse(self, source: bytes, path: str) -> etree._Element:
        try:
            return etree.fromstring(source, _parser(), base_url=path)
        except etree.XMLSyntaxError as exc:
            line = exc.position[0] if exc.position else exc.lineno
            message = _POSITION_SUFFIX.sub("", exc.msg or "") or "not well-formed"
            raise self._refuse(f"stylesheet {path} is not XML: {message} (line {line})",
                               f"{path}, line {line}") from None

    def _local_files(self, root: etree._Element, seen: dict[str, bytes]) -> None:
        """Collect the local files that ``root`` includes or imports (recursively);
        refuse any other URL."""
        for el in root.iter(f"{{{XSL_NS}}}include", f"{{{XSL_NS}}}import"):
            href = el.get("href") or ""
            target = urljoin(el.base or self.path, href)
            parts = urlsplit(target)
            kind = etree.QName(el).localname
            if parts.scheme and parts.scheme != "file" and len(parts.scheme) > 1:
                raise self._refuse(
                    f"stylesheet {el.base or self.path} refused: xsl:{kind} of {href!r} "
                    f"(line {el.sourceline}) is not a local file; stylesheets are read "
                    "from the filesystem only",
                    f"{el.base or self.path}, line {el.sourceline}",
                )
            path = url2pathname(parts.path) if parts.scheme == "file" else target
            if path in seen or not os.path.isfile(path):
                continue  # a missing file is left to libxslt, which names it
            seen[path] = self._read(path)
            self._local_files(self._parse(seen[path], path), seen)

    def _load(self) -> _Version:
        """Read, check and compile the stylesheet as it is on disk now."""
        path = self.path
        try:
            main = _stat(path)
        except OSError:
            main = (path, 0, 0, 0)
        source = self._read(path)
        files: dict[str, bytes] = {path: source}
        self._local_files(self._parse(source, path), files)
        digest = hashlib.sha256()
        for name in sorted(files):
            digest.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
        signature = [main]
        for name in sorted(files):
            if name != path:
                try:
                    signature.append(_stat(name))
                except OSError:
                    signature.append((name, 0, 0, 0))
        includes = tuple(sorted(name for name in files if name != path))
        version = _Version(source, tuple(signature), digest.hexdigest(), includes)
        self._compile(version)  # refuses a stylesheet that does not compile
        return version

    def _compile(self, version: _Version) -> None:
        self._parse(version.source, self.path)  # says where it is not XML
        try:
            compile_stylesheet(version.source, self.path, version.files)
        except etree.XSLTParseError as exc:
            raise self._refuse(
                f"stylesheet {self.path} does not compile: {log_text(exc.error_log, str(exc))}"
            ) from None

    def _fresh(self, version: _Version) -> bool:
        try:
            return all(_stat(sig[0]) == sig for sig in version.signature)
        except OSError:
            return False

    def current(self) -> _Version:
        """The stylesheet's current version, reloaded when a file changed since."""
        version = self._version
        if version is not None and self._fresh(version):
            return version
        with self._lock:
            version = self._version
            if version is None or not self._fresh(version):
                version = self._version = self._load()
        return version

    def identity(self) -> str:
        """The name (without its limits) plus a digest of the stylesheet bytes (and of
        local includes)."""
        return f"{_without_limits(self.name)}\x1fsha256:{self.current().digest}"

    def _job_of(self, version: _Version) -> _sandbox.Job:
        job = self._job
        if job is None or job.source is not version.source:
            key = hashlib.sha256(json.dumps(
                [self.path, version.digest, self.params, self.limits.max_output,
                 self.limits.max_memory]).encode()).hexdigest()
            job = self._job = _sandbox.Job(self.name, key, self.path, version.source,
                                           version.files, self.params, self.limits)
        return job

    def transform_many(self, elements: Sequence[etree._Element]
                       ) -> list[dict[str, Any] | TransformError]:
        """Each element's dict or its :class:`TransformError`, in order: one worker
        process takes the whole batch (a failing record costs only itself)."""
        job = self._job_of(self.current())
        records = [etree.tostring(el, with_tail=False) for el in elements]
        return [self._result(out) if isinstance(out, bytes) else out
                for out in _sandbox.run(job, records)]

    def _result(self, result: bytes) -> dict[str, Any] | TransformError:
        """A result from the worker as the stored dict (or the error it raises): read
        by the transformer of its root's format, else as element paths."""
        try:
            root = etree.fromstring(result, _RESULT_PARSER)
            row = formats.format_of_root(root.tag)
            typed = _builtins.load(row.transformer) if row is not None else xml.transform
            return typed(root)
        except TransformError as exc:
            exc.location = f"{self.name}: {exc.location}" if exc.location else self.name
            return exc
        except RecursionError:
            return TransformError("transform_failed", "RecursionError: too deeply nested",
                                  self.name)
        except etree.XMLSyntaxError as exc:
            return TransformError("transform_failed", f"the XSLT result cannot be read: {exc}",
                                  self.name)
        except Exception as exc:  # noqa: BLE001 - a transformer's failure on one result
            return TransformError("transform_failed", f"{type(exc).__name__}: {exc}",
                                  self.name)

    def __call__(self, element: etree._Element) -> dict[str, Any]:
        (outcome,) = self.transform_many([element])
        if isinstance(outcome, TransformError):
            raise outcome
        return outcome

    def __repr__(self) -> str:
        return f"XsltTransformer({self.name!r})"


def get(spec: str) -> XsltTransformer:
    """The cached transformer of a spec, loaded and compiled (:class:`TransformError`
    of type ``bad_stylesheet`` when the stylesheet cannot be used)."""
    key = spec.strip()
    with _cache_lock:
        transformer = _cache.get(key)
        if transformer is None:
            transformer = _cache[key] = XsltTransformer(key)
    transformer.current()
    return transformer


def identity(spec: str) -> str:
    """What produced a record's metadata, for its content hash: the spec and the
    stylesheet's digest (the spec alone, marked, when the stylesheet cannot be read:
    the records then fail and are tried again)."""
    try:
        return get(spec).identity()
    except TransformError:
        return f"{spec.strip()}\x1funavailable"
