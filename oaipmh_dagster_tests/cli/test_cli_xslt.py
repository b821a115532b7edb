"""`harvester add/update --transformer xslt:...`: paths made absolute, broken stylesheets
refused with one line that names the file and libxslt's error, nothing written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from oaipmh_dagster.storage import db
from oaipmh_dagster.storage.registry import Harvester, InvalidHarvester, Registry

XSL = Path(__file__).parents[1] / "transform" / "xsl"
BROKEN = """<xsl:stylesheet version="1.0" xmlns:xsl="http://www.w3.org/1999/XSL/Transform">
  <xsl:template match="/">
    <out><xsl:value-of select="concat(("/></out>
  </xsl:template>
</xsl:stylesheet>
"""


def registered() -> list[dict]:
    return [h.to_dict() for h in Registry(db.get_engine()).list()]


def add(run, *extra: str):  # noqa: ANN001, ANN201
    return run("harvester", "add", "demo", "--url", "http://127.0.0.1:9/oai", "--prefix",
               "oai_dc", "--no-check", *extra)


def test_add_stores_an_absolute_path(run, database_url: str, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    shutil.copy(XSL / "oai_dc_to_mods.xsl", tmp_path / "mods.xsl")
    monkeypatch.chdir(tmp_path)
    r = add(run, "--transformer", "xslt:mods.xsl?source=Here")
    assert r.code == 0, r.err
    shown = json.loads(run("harvester", "show", "demo", "--json").out)
    assert shown["transformer"] == f"xslt:{tmp_path / 'mods.xsl'}?source=Here"


@pytest.mark.parametrize(("content", "needles"), [
    (None, ["missing.xsl", "does not exist"]),
    ("<xsl:stylesheet", ["missing.xsl", "is not XML", "(line 1)"]),
    (BROKEN, ["missing.xsl", "does not compile", "could not compile select expression",
              "stylesheet line 3"]),
    ('<xsl:stylesheet version="1.0" xmlns:xsl="http://www.w3.org/1999/XSL/Transform">'
     '<xsl:include href="http://127.0.0.1:9/x.xsl"/></xsl:stylesheet>',
     ["missing.xsl", "not a local file"]),
])
def test_add_refuses_a_broken_stylesheet(run, database_url: str, tmp_path: Path,
                                         content: str | None, needles: list[str]) -> None:
    path = tmp_path / "missing.xsl"
    if content is not None:
        path.write_text(content)
    r = add(run, "--transformer", f"xslt:{path}")
    assert r.code == 2
    line = r.error_line
    assert "transformer refused" in line
    for needle in needles:
        assert needle in line
    assert registered() == []


def test_update_checks_and_normalizes(run, database_url: str, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    assert add(run).code == 0
    before = registered()
    (tmp_path / "broken.xsl").write_text(BROKEN)
    monkeypatch.chdir(tmp_path)
    r = run("harvester", "update", "demo", "--transformer", "xslt:broken.xsl")
    assert r.code == 2 and str(tmp_path / "broken.xsl") in r.error_line
    assert registered() == before
    r = run("harvester", "update", "demo", "--transformer", "xslt:b.xsl?x=1&x=2")
    assert r.code == 2 and "given twice" in r.error_line
    shutil.copy(XSL / "oai_dc_to_mods.xsl", tmp_path / "good.xsl")
    r = run("harvester", "update", "demo", "--transformer", "xslt:./good.xsl")
    assert r.code == 0, r.err
    assert registered()[0]["transformer"] == f"xslt:{tmp_path / 'good.xsl'}"


@pytest.mark.parametrize("good", ["xslt:/a/b.xsl", "xslt:rel/c d.xsl?x=1&y=%20"])
def test_registry_accepts_xslt_names(good: str) -> None:
    assert Harvester(id="a", base_url="http://x.org/oai", metadata_prefix="oai_dc",
                     transformer=good).transformer == good


@pytest.mark.parametrize("bad", ["xslt:", "xslt:?a=1", "xslt:/a.xsl\n"])
def test_registry_refuses_malformed_xslt_names(bad: str) -> None:
    with pytest.raises(InvalidHarvester, match="invalid transformer"):
        Harvester(id="a", base_url="http://x.org/oai", metadata_prefix="oai_dc",
                  transformer=bad)
