"""Asset tags, owners and freshness policies of a harvester's assets."""

from __future__ import annotations

from datetime import timedelta

import dagster as dg
import pytest

from oaipmh_dagster.definitions import build_definitions
from oaipmh_dagster.defs import catalog
from oaipmh_dagster.defs.freshness import cron_period, freshness_policy
from oaipmh_dagster.storage.registry import Harvester

KINDS = ("source", "raw_records", "records")


def _harvester(**changes: object) -> Harvester:
    fields: dict = {"id": "alpha", "base_url": "http://127.0.0.1:8765/oai",
                    "metadata_prefix": "oai_dc", "cron": "17 4 * * *"}
    fields.update(changes)
    return Harvester(**fields)


def _specs(*harvesters: Harvester) -> dict[str, dg.AssetSpec]:
    graph = build_definitions(list(harvesters)).get_repository_def().asset_graph
    return {node.key.to_user_string(): node.to_asset_spec() for node in graph.asset_nodes}


@pytest.mark.parametrize(("text", "value"), [
    ("127.0.0.1:8765", "127.0.0.1_8765"),
    ("repo.example.org", "repo.example.org"),
    ("oai_dc", "oai_dc"),
    ("publications:articles", "publications_articles"),
    ("a b/c~d", "a_b_c_d"),
])
def test_tag_values_are_valid(text: str, value: str) -> None:
    assert catalog.tag_value(text) == value


def test_long_tag_values_keep_apart() -> None:
    one, two = catalog.tag_value("x" * 80 + "1"), catalog.tag_value("x" * 80 + "2")
    assert len(one) == len(two) == 63 and one != two
    dg.AssetSpec("k", tags={"oaipmh/set": one})  # Dagster accepts it


@pytest.mark.parametrize(("sets", "value"), [((), "all"), (("datasets",), "datasets"),
                                             (("a", "b"), "several")])
def test_three_assets_carry_host_prefix_and_set(sets: tuple[str, ...], value: str) -> None:
    specs = _specs(_harvester(sets=sets))
    for kind in KINDS:
        tags = specs[f"oaipmh/alpha/{kind}"].tags
        assert tags["oaipmh/host"] == "127.0.0.1_8765"
        assert tags["oaipmh/prefix"] == "oai_dc"
        assert tags["oaipmh/set"] == value


def test_owners_from_the_environment(monkeypatch: pytest.MonkeyPatch,
                                     caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv(catalog.OWNERS_ENV, "team:harvesting, ops@example.org, not an owner")
    specs = _specs(_harvester())
    for kind in KINDS:
        assert list(specs[f"oaipmh/alpha/{kind}"].owners) == ["team:harvesting",
                                                              "ops@example.org"]
    assert "not an owner" in caplog.text


def test_no_owners_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(catalog.OWNERS_ENV, raising=False)
    assert not _specs(_harvester())["oaipmh/alpha/raw_records"].owners


@pytest.mark.parametrize(("cron", "timezone", "period"), [
    ("17 4 * * *", "UTC", timedelta(days=1)),
    ("0 3 * * 1-5", "UTC", timedelta(days=3)),  # Friday to Monday
    ("*/5 * * * *", "UTC", timedelta(minutes=5)),
    ("0 * * * *", "Europe/Berlin", timedelta(hours=1)),
    ("@daily", "UTC", timedelta(days=1)),
    ("@weekly", "UTC", timedelta(days=7)),
    ("0 3 1 * *", "UTC", timedelta(days=31)),
    ("0 0 29 2 *", "UTC", timedelta(days=1461)),
    ("*/10 8-17 * * 1-5", "UTC", timedelta(days=2, hours=14, minutes=10)),
])
def test_cron_period_is_the_longest_gap(cron: str, timezone: str, period: timedelta) -> None:
    assert cron_period(cron, timezone) == period


def test_raw_records_freshness_follows_the_cron() -> None:
    specs = _specs(_harvester(cron="0 3 * * 1-5"))
    policy = specs["oaipmh/alpha/raw_records"].freshness_policy
    assert policy == dg.FreshnessPolicy.time_window(fail_window=timedelta(days=6),
                                                    warn_window=timedelta(days=3, hours=18))
    assert specs["oaipmh/alpha/records"].freshness_policy is None
    assert specs["oaipmh/alpha/source"].freshness_policy is None


@pytest.mark.parametrize("changes", [{"cron": None}, {"enabled": False}])
def test_no_freshness_without_a_running_schedule(changes: dict) -> None:
    assert freshness_policy(_harvester(**changes)) is None
    specs = _specs(_harvester(**changes))
    assert specs["oaipmh/alpha/raw_records"].freshness_policy is None


def test_harvesters_share_policy_objects() -> None:
    """Staggered crons of one shape share one policy (built once, not per harvester)."""
    one = freshness_policy(_harvester(cron="5 1 * * *"))
    two = freshness_policy(_harvester(id="beta", cron="40 22 * * *"))
    assert one is two
