"""ISO Schematron validation of harvested metadata (lxml's ``isoschematron``, XSLT 1.0
query binding), beside XML Schema: a harvester's schema field ``schematron:PATH``.

The Schematron file is parsed without DTDs, entities or network; every ``sch:include``
/ ``sch:extends`` must name a local file; the compiled validator runs under the access
control of the XSLT crosswalks (no network, no writes). Each failed assertion of a record becomes an
error of type ``schematron`` whose message is the assertion's text and whose location
is the failing node's path (``/oai_dc:dc/dc:title[2]``); at most `MAX_ASSERTIONS` per
record, the last one saying how many more failed. Successful reports (``sch:report``)
are not errors."""

from __future__ import annotations

import copy
import hashlib
import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from lxml import etree

from oaipmh_dagster.contracts import SCHEMATRON_ERROR, SCHEMATRON_PREFIX
from oaipmh_dagster.errors import OAIPMHDagsterError

from ._util import element_path
from ._xslt_worker import ACCESS

__all__ = ["MAX_ASSERTIONS", "PREFIX", "SCHEMATRON_ERROR", "LoadedSchematron",
           "SchematronError", "failed_assertions", "is_schematron", "load_schematron",
           "schematron_path"]

PREFIX = SCHEMATRON_PREFIX
MAX_ASSERTIONS = 5  # failed assertions stored per record
# lxml's stubs do not describe it.
isoschematron: Any = importlib.import_module("lxml.isoschematron")
_SCH = "{http://purl.oclc.org/dsdl/schematron}"
_SVRL = "{http://purl.oclc.org/dsdl/svrl}"


class SchematronError(OAIPMHDagsterError, ValueError):
    """A Schematron file cannot be found, read or compiled."""


def is_schematron(schema: str | None) -> bool:
    """Whether a schema field names a Schematron file (``schematron:PATH``)."""
    return isinstance(schema, str) and schema.startswith(PREFIX)


def schematron_path(schema: str) -> Path:
    """The file of a ``schematron:PATH`` field."""
    return Path(schema[len(PREFIX):]).expanduser()


def _parser() -> etree.XMLParser:
    return etree.XMLParser(no_network=True, resolve_entities=False, load_dtd=False)


@dataclass(frozen=True)
class LoadedSchematron:
    """A compiled Schematron (the XSLT that writes its SVRL report) and the digest of its
    files."""

    schematron: etree.XSLT
    digest: str


def _files(main: Path) -> tuple[etree._Element, list[Path]]:
    """The parsed main file and every local file it includes, transitively; a reference
    that is not a local file is refused (nothing is fetched)."""
    seen: list[Path] = []
    todo = [main.resolve()]
    root: etree._Element | None = None
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        if not path.is_file():
            raise SchematronError(f"schematron file {path} does not exist")
        seen.append(path)
        try:
            doc = etree.parse(str(path), _parser()).getroot()
        except (etree.XMLSyntaxError, OSError) as exc:
            raise SchematronError(f"cannot read schematron {path}: {exc}") from None
        root = doc if root is None else root
        for ref in doc.iter(f"{_SCH}include", f"{_SCH}extends"):
            href = ref.get("href")
            if href is None:
                continue
            if urlsplit(href).scheme not in ("", "file") or href.startswith("//"):
                raise SchematronError(f"schematron {path} refers to {href}: only local files "
                                      "are loaded")
            todo.append((path.parent / urlsplit(href).path).resolve())
    assert root is not None
    return root, seen


def load_schematron(schema: str) -> LoadedSchematron:
    """Compile a ``schematron:PATH``; `SchematronError` with one line when it cannot be."""
    main = schematron_path(schema)
    root, files = _files(main)
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.read_bytes())
    try:
        xslt = isoschematron.Schematron(root, store_xslt=True).validator_xslt
        # Run under the access control of the XSLT crosswalks: no network, no writes.
        compiled = etree.XSLT(xslt, access_control=ACCESS)
    except (etree.SchematronParseError, etree.XSLTParseError, etree.XSLTApplyError,
            etree.XMLSyntaxError) as exc:
        message = " ".join(str(exc).split()) or type(exc).__name__
        raise SchematronError(f"schematron {main} does not compile: {message}") from None
    return LoadedSchematron(compiled, digest.hexdigest()[:16])


def _where(doc: etree._ElementTree, location: str | None) -> str:
    """The failing node's readable path (the SVRL location when it cannot be found)."""
    if not location:
        return "metadata"
    try:
        found: Any = doc.xpath(location)
    except etree.XPathError:
        return location
    node = found[0] if isinstance(found, list) and found else None
    if isinstance(node, etree._Element):
        return element_path(node)
    parent = getattr(node, "getparent", lambda: None)()
    if isinstance(parent, etree._Element):  # an attribute or a text node
        name = getattr(node, "attrname", None)
        return element_path(parent) + (f"/@{etree.QName(name).localname}" if name else "")
    return location


def failed_assertions(compiled: etree.XSLT, element: etree._Element) -> list[dict[str, Any]]:
    """The errors of one record's element: one per failed assertion (at most
    `MAX_ASSERTIONS`), [] when every assertion holds."""
    if element.getparent() is not None:  # a record inside its page: validate it alone
        element = copy.deepcopy(element)
    doc = etree.ElementTree(element)
    try:
        report = compiled(doc).getroot()
    except etree.XSLTApplyError as exc:
        message = " ".join(str(exc).split()) or type(exc).__name__
        return [{"type": SCHEMATRON_ERROR, "message": f"Schematron failed: {message}",
                 "location": "metadata"}]
    failed = [] if report is None else list(report.iter(f"{_SVRL}failed-assert"))
    if not failed:
        return []
    errors: list[dict[str, Any]] = []
    for fail in failed[:MAX_ASSERTIONS]:
        text = " ".join("".join(fail.findtext(f"{_SVRL}text") or "").split())
        errors.append({"type": SCHEMATRON_ERROR,
                       "message": text or f"assertion failed: {fail.get('test')}",
                       "location": _where(doc, fail.get("location")),
                       "test": fail.get("test")})
    more = len(failed) - len(errors)
    if more > 0 and errors:
        errors[-1]["message"] += f" (and {more} more failed assertions)"
    return errors
