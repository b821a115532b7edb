"""``xslt:PATH[?name=value&...]``: an XSLT 1.0 crosswalk applied to each record.

The stylesheet is applied to the record's metadata element (the child of
``<metadata>``, seen by the stylesheet as the document's root element); the root
element of its result is stored through the lossless :mod:`xml <.xml>` mapping.

Parameters follow the path in URL-query style, ``?name=value&other=value``: ``%XX``
escapes are decoded (``+`` stays a plus), names match ``[A-Za-z_][A-Za-z0-9_.-]*``,
and each value reaches the stylesheet as a string (``etree.XSLT.strparam``). The path
itself cannot hold ``?``. :func:`normalize` makes a relative path absolute (the admin
commands do so when a harvester is added or updated).

Security: stylesheets come from the filesystem only. The stylesheet parser loads no
DTD, resolves no entity and uses no network; an ``xsl:include``/``xsl:import`` of a
URL other than a local file is refused before compiling; at run time libxslt's access
control refuses network reads (``document()``) and every write (``exsl:document``),
which fails that record.

Compiled stylesheets are cached per (path, parameters) and recompiled when the file
or a local file it includes changes (size, mtime or inode); each thread compiles its
own copy, as lxml's XSLT objects keep per-call state. :meth:`XsltTransformer.identity`
adds a digest of the stylesheet bytes to the transformer's name, so an edited
crosswalk re-transforms unchanged records on the next harvest.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import unquote, urljoin, urlsplit
from urllib.request import url2pathname

from lxml import etree

from . import xml
from ._util import TransformError

PREFIX = "xslt:"
XSL_NS = "http://www.w3.org/1999/XSL/Transform"
_PARAM_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_POSITION_SUFFIX = re.compile(r", line \d+, column \d+$")
# cast: lxml-stubs declare neither these keywords nor XSLT's error_log and parameters.
_ACCESS = cast(Any, etree.XSLTAccessControl)(
    read_file=True, write_file=False, create_dir=False, read_network=False,
    write_network=False,
)
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


def _log_text(log: Any, fallback: str) -> str:
    """libxslt's error log, shortened: distinct messages, the first one's line."""
    messages: list[str] = []
    line = 0
    for entry in log:
        message = (entry.message or "").strip()
        if not line and entry.line:
            line = entry.line
        if message and message not in messages:
            messages.append(message)
    text = "; ".join(messages[:3]) or fallback
    return f"{text} (stylesheet line {line})" if line else text


@dataclass(frozen=True)
class _Version:
    """One state of a stylesheet on disk: its bytes and what it was read from."""

    source: bytes
    signature: tuple[tuple[str, int, int, int], ...]  # (path, mtime_ns, size, inode)
    digest: str


def _stat(path: str) -> tuple[str, int, int, int]:
    st = os.stat(path)
    return (path, st.st_mtime_ns, st.st_size, st.st_ino)


class XsltTransformer:
    """A transformer ``(element) -> dict`` for one ``xslt:`` spec."""

    def __init__(self, spec: str) -> None:
        self.name = spec.strip()
        self.path, params = parse_spec(self.name)
        self.params = dict(params)
        self._strparams = {k: etree.XSLT.strparam(v) for k, v in params.items()}
        self._version: _Version | None = None
        self._lock = threading.Lock()
        self._local = threading.local()

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
        version = _Version(source, tuple(signature), digest.hexdigest())
        self._compile(version)  # refuses a stylesheet that does not compile
        return version

    def _compile(self, version: _Version) -> etree.XSLT:
        try:
            return etree.XSLT(self._parse(version.source, self.path), access_control=_ACCESS)
        except etree.XSLTParseError as exc:
            raise self._refuse(
                f"stylesheet {self.path} does not compile: {_log_text(exc.error_log, str(exc))}"
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
        """The name plus a digest of the stylesheet bytes (and of local includes)."""
        return f"{self.name}\x1fsha256:{self.current().digest}"

    def _xslt(self) -> Any:
        version = self.current()
        held = getattr(self._local, "held", None)
        if held is None or held[0] is not version:
            held = self._local.held = (version, self._compile(version))
        return held[1]

    def __call__(self, element: etree._Element) -> dict[str, Any]:
        xslt = self._xslt()
        try:
            result = xslt(element, **self._strparams)
        except etree.XSLTApplyError as exc:
            raise TransformError(
                "transform_failed", f"XSLT failed: {_log_text(xslt.error_log, str(exc))}",
                self.name,
            ) from None
        root = result.getroot()
        if root is None:
            what = "an empty result" if not str(result).strip() else "text, not XML"
            raise TransformError(
                "transform_failed", f"XSLT produced {what}: no root element", self.name
            )
        return xml.transform(root)

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
