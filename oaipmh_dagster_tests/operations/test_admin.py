"""The one code path of harvester add/update/remove (`admin`): what it tells its callers,
which refusals are bad input, and what a remove asks of the Dagster instance."""

from __future__ import annotations

from typing import Any

import pytest

from oaipmh_dagster.operations.admin import (
    AdminError,
    add_harvester,
    remove_harvester,
    update_harvester,
)
from oaipmh_dagster.storage import db
from oaipmh_dagster.storage.registry import Registry


class FakeInstance:
    """Records what a remove asked of the instance."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def stop_schedule(self, name: str) -> int:
        self.calls.append(("stop", name))
        return 1

    def forget_since(self, harvester_id: str) -> None:
        self.calls.append(("forget", harvester_id))


@pytest.fixture
def reloads(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The reloads asked for (each answered as done)."""
    from oaipmh_dagster.operations import reload

    calls: list[dict[str, Any]] = []

    def fake(**kwargs: Any) -> tuple[bool, str]:
        calls.append(kwargs)
        return True, "reloaded"

    monkeypatch.setattr(reload, "reload_code_location", fake)
    return calls


def test_add_and_update_tell_what_changed(sqlite_url: str, reloads: list) -> None:
    registry = Registry(db.get_engine())
    change = add_harvester(registry, "demo", url="http://127.0.0.1:9/oai", prefix="oai_dc",
                           check=False, location="loc", reconcile_every=0, max_retries=None)
    assert change.harvester is not None and change.harvester.reconcile_every is None
    assert [line.text for line in change.lines] == [
        "added harvester demo: http://127.0.0.1:9/oai (oai_dc); job and schedule "
        "harvest_oaipmh_records_demo", "reloaded"]
    assert change.reloaded and reloads[-1]["location"] == "loc"
    assert reloads[-1]["harvester_id"] == "demo"
    change = update_harvester(registry, "demo", sets=("a",), cron="0 1 * * *", check=False)
    assert change.fields == ("cron", "sets")
    assert "the next harvest is a full one" in change.lines[1].text
    assert reloads[-1]["location"] is None


@pytest.mark.parametrize(("call", "usage"), [
    (lambda r: add_harvester(r, "Bad", url="http://x.org/oai", prefix="oai_dc"), True),
    (lambda r: add_harvester(r, "a", url="http://x.org/oai", prefix="oai_dc",
                             transformer="nosuch"), True),
    (lambda r: update_harvester(r, "nope", cron="0 * * * *"), False),
    (lambda r: update_harvester(r, "keep", sets=("a",), all_sets=True), True),
    (lambda r: remove_harvester(r, "nope", instance=FakeInstance()), False),
])
def test_refusals_say_whether_the_input_was_bad(sqlite_url: str, reloads: list, call: Any,
                                                usage: bool) -> None:
    registry = Registry(db.get_engine())
    add_harvester(registry, "keep", url="http://x.org/oai", prefix="oai_dc", check=False)
    with pytest.raises(AdminError) as caught:
        call(registry)
    assert caught.value.usage is usage
    assert len(str(caught.value).splitlines()) == 1


def test_remove_stops_the_schedule_and_forgets_the_since(sqlite_url: str, reloads: list
                                                         ) -> None:
    registry = Registry(db.get_engine())
    add_harvester(registry, "demo", url="http://x.org/oai", prefix="oai_dc", check=False)
    instance = FakeInstance()
    asked: list[str] = []
    change = remove_harvester(lambda: registry, "demo", instance=instance,
                              confirm=asked.append)
    assert asked == ["demo (http://x.org/oai)"]
    assert instance.calls == [("stop", "harvest_oaipmh_records_demo"), ("forget", "demo")]
    assert [line.text for line in change.lines] == [
        "stopped schedule harvest_oaipmh_records_demo", "removed harvester demo", "reloaded"]
    assert registry.list() == []


def test_a_refused_confirmation_keeps_the_harvester(sqlite_url: str, reloads: list) -> None:
    registry = Registry(db.get_engine())
    add_harvester(registry, "demo", url="http://x.org/oai", prefix="oai_dc", check=False)

    def refuse(label: str) -> None:
        raise AdminError("kept")

    with pytest.raises(AdminError, match="kept"):
        remove_harvester(registry, "demo", instance=FakeInstance(), confirm=refuse)
    assert [h.id for h in registry.list()] == ["demo"]


def test_a_new_prefix_brings_its_default_transformer(sqlite_url: str, reloads: list) -> None:
    """The old prefix's default transformer follows the prefix to the new one's default;
    a transformer chosen explicitly is kept, and said to be kept (with a warning when it
    is a built-in made for other records)."""
    registry = Registry(db.get_engine())
    url = "http://127.0.0.1:9/oai"
    add_harvester(registry, "dc", url=url, prefix="oai_dc", check=False)
    change = update_harvester(registry, "dc", prefix="datacite", check=False)
    assert change.harvester is not None and change.harvester.transformer == "datacite"
    assert change.fields == ("metadata_prefix", "transformer")
    assert change.lines[1].text == "transformer follows the prefix: oai_dc -> datacite"
    assert registry.get("dc").transformer == "datacite"
    # An explicit generic one is kept: it fits any prefix.
    add_harvester(registry, "gen", url=url, prefix="oai_dc", transformer="xml", check=False)
    change = update_harvester(registry, "gen", prefix="marc21", check=False)
    assert registry.get("gen").transformer == "xml" and change.fields == ("metadata_prefix",)
    kept = [line for line in change.lines if "transformer" in line.text]
    assert [(line.text, line.note) for line in kept] == [
        ("transformer xml kept: it was chosen explicitly (the default for marc21 is "
         "marc21)", False)]
    # An explicit built-in made for another prefix is kept, with a warning.
    add_harvester(registry, "odd", url=url, prefix="oai_dc", transformer="marc21", check=False)
    change = update_harvester(registry, "odd", prefix="datacite", check=False)
    assert registry.get("odd").transformer == "marc21"
    notes = [line.text for line in change.lines if line.note and "transformer" in line.text]
    assert notes == ["transformer marc21 reads marc21 records, not datacite: its records "
                     "will fail to transform (--transformer datacite sets the default)"]
    # A transformer given with the prefix wins, and is warned about when it does not fit.
    change = update_harvester(registry, "dc", prefix="oai_dc", transformer="datacite",
                              check=False)
    assert registry.get("dc").transformer == "datacite"
    assert any(line.note and "transformer datacite reads datacite records, not oai_dc"
               in line.text for line in change.lines)
    # A change that keeps the prefix leaves the transformer alone.
    change = update_harvester(registry, "odd", cron="0 1 * * *", check=False)
    assert not any("transformer" in line.text for line in change.lines)
