"""Plugin transformers come only from the entry-point group `oaipmh_dagster.transformers`
or from modules the operator lists in $OAIPMH_TRANSFORMER_MODULES: any other
`module:function` is refused at input (the command, `manage_harvesters`) and at run time
before anything is imported, with one line that is the same whether the module exists or
not. Built-ins and `xslt:PATH` are unchanged."""

from __future__ import annotations

import importlib
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from lxml import etree

from oaipmh_dagster import transform
from oaipmh_dagster.demo.dataset import make_dataset
from oaipmh_dagster.harvesting.harvest import harvest
from oaipmh_dagster.storage.registry import Harvester
from oaipmh_dagster.storage.store import Store
from oaipmh_dagster.transform import (
    TransformError,
    available_transformers,
    get_transformer,
    transform_record,
    transformer_version,
)
from oaipmh_dagster_tests.conftest import Result
from oaipmh_dagster_tests.oaiserver import FaultyOAIServer as OAIServer

ENV = "OAIPMH_TRANSFORMER_MODULES"  # the documented allowlist
GROUP = "oaipmh_dagster.transformers"  # the documented entry-point group
HERE = __name__
DC = b"""<oai_dc:dc xmlns:oai_dc="http://www.openarchives.org/OAI/2.0/oai_dc/"
  xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:title>A title</dc:title></oai_dc:dc>"""


def title_only(element: etree._Element) -> dict[str, Any]:
    """A plugin: the first title."""
    return {"title": element.findtext("{http://purl.org/dc/elements/1.1/}title")}


@pytest.fixture
def probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Path]]:
    """(name of an importable module that leaves a marker file when imported, marker)."""
    name = f"oaipmh_probe_{uuid.uuid4().hex[:8]}"
    marker = tmp_path / "imported"
    (tmp_path / f"{name}.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('x')\n"
        "def f(element):\n    return {'probe': True}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    yield name, marker
    sys.modules.pop(name, None)


@pytest.fixture
def entry_point(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An installed distribution (a dist-info on sys.path) that declares the transformer
    `test_ep_title` in the group."""
    dist = tmp_path / "site" / "oaipmh_test_plugins-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: oaipmh-test-plugins\n"
                                   "Version: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[{GROUP}]\ntest_ep_title = {HERE}:title_only\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    transform.forget_plugins()
    yield "test_ep_title"
    monkeypatch.undo()
    transform.forget_plugins()


REFUSED = ("os:system", "subprocess:run", "no_such_pkg.mod:func", f"{HERE}:title_only",
           "oaipmh_dagster.transform.xml:transform")


def _refusal(name: str) -> str:
    with pytest.raises(TransformError) as err:
        get_transformer(name)
    assert err.value.type == "bad_plugin"
    return str(err.value).replace(name, "NAME")


# -- refused ------------------------------------------------------------------------------


def test_unlisted_plugins_are_refused_alike(monkeypatch: pytest.MonkeyPatch,
                                            probe: tuple[str, Path]) -> None:
    """Installed or not, importable or not: the same one line naming the two ways to
    allow a plugin, and nothing imported."""
    monkeypatch.delenv(ENV, raising=False)
    name, marker = probe
    messages = {_refusal(n) for n in (*REFUSED, f"{name}:f")}
    assert len(messages) == 1
    (message,) = messages
    assert "\n" not in message and ENV in message and GROUP in message
    assert not marker.exists() and name not in sys.modules


def test_the_allowlist_matches_whole_module_names(monkeypatch: pytest.MonkeyPatch,
                                                   probe: tuple[str, Path]) -> None:
    name, marker = probe
    monkeypatch.setenv(ENV, f"{name[:-1]}, oaipmh_dagster_test ,{HERE}.other")
    assert len({_refusal(n) for n in (f"{name}:f", f"{HERE}:title_only")}) == 1
    assert not marker.exists()


def test_a_plugin_loaded_before_is_refused_once_unlisted(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, HERE)
    assert get_transformer(f"{HERE}:title_only") is title_only
    monkeypatch.setenv(ENV, "something_else")
    _refusal(f"{HERE}:title_only")
    with pytest.raises(TransformError, match=ENV):
        transform_record(f"{HERE}:title_only", DC)


def test_command_refuses_it_and_writes_nothing(database_url: str,
                                               run: Callable[..., Result],
                                               monkeypatch: pytest.MonkeyPatch,
                                               probe: tuple[str, Path]) -> None:
    from oaipmh_dagster_tests.helpers import add_harvester

    monkeypatch.delenv(ENV, raising=False)
    name, marker = probe
    lines = set()
    for transformer in ("os:system", f"{name}:f", "no_such_pkg.mod:func"):
        result = run("harvester", "add", "x", "--url", "http://127.0.0.1:9/oai", "--prefix",
                     "oai_dc", "--transformer", transformer, "--no-check")
        assert result.code == 2
        lines.add(result.error_line.replace(transformer, "NAME"))
    assert len(lines) == 1 and ENV in lines.pop()
    add_harvester("keep", "http://127.0.0.1:9/oai")
    result = run("harvester", "update", "keep", "--transformer", "os:system", "--no-check")
    assert result.code == 2 and ENV in result.error_line
    result = run("harvester", "list", "--json")
    assert '"os:system"' not in result.out and '"x"' not in result.out
    assert not marker.exists()


def test_manage_harvesters_refuses_it(database_url: str, monkeypatch: pytest.MonkeyPatch,
                                      instance: Any) -> None:
    from oaipmh_dagster_tests.defs.test_manage import failure, launch, rows

    monkeypatch.delenv(ENV, raising=False)
    result = launch(instance, action="add", id="x", url="http://127.0.0.1:9/oai",
                    prefix="oai_dc", transformer="os:system", no_check=True)
    assert ENV in failure(result) and rows() == []


def test_a_run_refuses_it_before_any_request(database_url: str,
                                             monkeypatch: pytest.MonkeyPatch,
                                             probe: tuple[str, Path]) -> None:
    """A row naming an unlisted plugin (listed when it was added, or edited by hand):
    the harvest fails before any request and imports nothing."""
    name, marker = probe
    monkeypatch.delenv(ENV, raising=False)
    with OAIServer(make_dataset(20, seed=2), page_size=10) as srv:
        h = Harvester(id="p", base_url=srv.base_url, metadata_prefix="oai_dc",
                      transformer=f"{name}:f")
        with pytest.raises(TransformError, match=ENV):
            harvest(h, Store(), run_id="r1")
        assert srv.requests == [] and not marker.exists()


# -- allowed ------------------------------------------------------------------------------


def test_a_listed_module_and_its_submodules_are_allowed(monkeypatch: pytest.MonkeyPatch,
                                                         probe: tuple[str, Path]) -> None:
    name, marker = probe
    monkeypatch.setenv(ENV, f"{name}, oaipmh_dagster_tests")
    assert transform_record(f"{name}:f", DC) == {"probe": True} and marker.exists()
    assert transform_record(f"{HERE}:title_only", DC) == {"title": "A title"}


def test_a_listed_plugin_harvests(database_url: str, monkeypatch: pytest.MonkeyPatch,
                                  run: Callable[..., Result]) -> None:
    monkeypatch.setenv(ENV, HERE)
    with OAIServer(make_dataset(20, seed=2, deleted_ratio=0.0), page_size=10) as srv:
        result = run("harvester", "add", "p", "--url", srv.base_url, "--prefix", "oai_dc",
                     "--transformer", f"{HERE}:title_only", "--no-check")
        assert result.code == 0, result.err
        from oaipmh_dagster.storage.registry import Registry

        store = Store()
        stats = harvest(Registry().get("p"), store, run_id="r1")
        assert stats.records == 20 and stats.failed == 0
        assert all(set(r["metadata"]) == {"title"} for r in store.iter_records("p"))


def test_an_entry_point_is_a_transformer_name(entry_point: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    assert entry_point in available_transformers()
    assert get_transformer(entry_point) is title_only
    assert transform_record(entry_point, DC) == {"title": "A title"}
    _refusal(f"{HERE}:title_only")  # the entry point allows its name, not the module


def test_an_entry_points_version_names_its_distribution(
        entry_point: str, tmp_path: Path) -> None:
    """The records asset's code version follows the release that declares the name."""
    first = transformer_version(entry_point)
    assert "oaipmh-test-plugins==0.1" in first and f"{HERE}:title_only" in first
    assert transformer_version(entry_point) == first
    metadata = tmp_path / "site" / "oaipmh_test_plugins-0.1.dist-info" / "METADATA"
    metadata.write_text(metadata.read_text().replace("Version: 0.1", "Version: 0.2"))
    transform.forget_plugins()
    assert "oaipmh-test-plugins==0.2" in transformer_version(entry_point)
    assert transformer_version("no_such_entry_point").endswith("unavailable")


def test_builtins_and_xslt_need_no_listing(monkeypatch: pytest.MonkeyPatch,
                                           tmp_path: Path) -> None:
    monkeypatch.delenv(ENV, raising=False)
    for name in ("oai_dc", "datacite", "marc21", "marcxml", "xml"):
        assert callable(get_transformer(name))
    sheet = tmp_path / "t.xsl"
    sheet.write_text(
        '<xsl:stylesheet version="1.0" xmlns:xsl="http://www.w3.org/1999/XSL/Transform">'
        '<xsl:template match="/"><out>x</out></xsl:template></xsl:stylesheet>')
    assert transform_record(f"xslt:{sheet}", DC)
