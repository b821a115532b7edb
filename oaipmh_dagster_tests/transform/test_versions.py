"""The code version of a built-in transformer follows its module's source and the
package modules it imports: an edited built-in marks `records` stale."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from oaipmh_dagster import formats, transform
from oaipmh_dagster.defs.lineage import records_code_version
from oaipmh_dagster.transform import transformer_version
from oaipmh_dagster.transform.versions import _used_modules, package_identity

PACKAGE = "oaipmh_dagster.transform"


def _write(path: Path, text: str, stamp: int) -> None:
    path.write_text(text)
    os.utime(path, ns=(stamp, stamp))  # a new mtime even on coarse clocks


def test_an_edit_of_the_module_or_a_helper_it_imports_changes_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "pkgv27"
    pkg.mkdir()
    _write(pkg / "__init__.py", "", 1)
    _write(pkg / "a.py", "from ._h import X\nfrom . import _g\n", 1)
    _write(pkg / "_h.py", "X = 1\n", 1)
    _write(pkg / "_g.py", "Y = 1\n", 1)
    _write(pkg / "other.py", "Z = 1\n", 1)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert [n for n, _ in _used_modules("pkgv27.a", "pkgv27")] == [
        "pkgv27._g", "pkgv27._h", "pkgv27.a"]
    first = package_identity("pkgv27.a", "pkgv27")
    assert package_identity("pkgv27.a", "pkgv27") == first
    _write(pkg / "other.py", "Z = 2\n", 2)  # not imported by a
    assert package_identity("pkgv27.a", "pkgv27") == first
    _write(pkg / "_h.py", "X = 2\n", 3)
    second = package_identity("pkgv27.a", "pkgv27")
    assert second != first
    _write(pkg / "_g.py", "Y = 2\n", 4)
    assert package_identity("pkgv27.a", "pkgv27") not in (first, second)


def test_every_builtin_has_a_version_of_its_modules() -> None:
    versions = {}
    for row in formats.FORMATS:
        module = row.transformer.partition(":")[0]
        used = [n for n, _ in _used_modules(module, PACKAGE)]
        assert module in used, row.name
        versions[row.name] = transformer_version(row.name)
        assert versions[row.name].startswith(f"{row.name};"), row.name
    assert len(set(versions.values())) == len(versions)
    assert f"{PACKAGE}.oai_dc" in [n for n, _ in _used_modules(f"{PACKAGE}.qdc", PACKAGE)]
    assert f"{PACKAGE}._util" in [n for n, _ in _used_modules(f"{PACKAGE}.mods", PACKAGE)]


def test_records_go_stale_when_a_builtin_changes(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    before = {name: records_code_version(name) for name in ("mods", "qdc", "xml")}
    sheet = tmp_path / "s.xsl"
    sheet.write_text('<xsl:stylesheet version="1.0" xmlns:xsl="http://www.w3.org/1999/XSL/'
                     'Transform"><xsl:template match="/"><a/></xsl:template></xsl:stylesheet>')
    crosswalk = records_code_version(f"xslt:{sheet}")
    monkeypatch.setattr(transform, "package_identity", lambda module, package: "edited")
    for name, version in before.items():
        assert records_code_version(name) != version, name
    # A crosswalk's result may be read by any built-in: it goes stale too.
    assert records_code_version(f"xslt:{sheet}") != crosswalk
