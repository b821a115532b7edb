"""Sharded code locations: the jump consistent hash (deterministic, minimal movement,
balance), shard names, the workspace file and its command, the location a reload picks,
and the definitions each shard's location loads."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml

from oaipmh_dagster.definitions import defs
from oaipmh_dagster.operations.reload import NoHoldingLocation, holding_location
from oaipmh_dagster.operations.shards import (
    DEFAULT_LOCATION,
    MAX_SHARDS,
    InvalidShard,
    Shard,
    ShardCountUnknown,
    location_names,
    parse_location,
    shard_of,
    workspace_yaml,
)
from oaipmh_dagster_tests.helpers import add_harvester

IDS = [f"h{i:05d}" for i in range(10_000)]


# -- the hash -----------------------------------------------------------------------------


def test_shard_of_is_deterministic_and_in_range() -> None:
    for count in (1, 2, 3, 7, 64, MAX_SHARDS):
        first = [shard_of(hid, count) for hid in IDS[:500]]
        assert first == [shard_of(hid, count) for hid in IDS[:500]]
        assert all(0 <= s < count for s in first)
    assert {shard_of(hid, 1) for hid in IDS[:500]} == {0}
    # Pinned: a harvester's shard depends on its id and the count alone, in every process
    # and every release (a change would move harvesters between deployed locations).
    ids = ("a", "b", "alpha", "h00000", "demo")
    assert [shard_of(h, 4) for h in ids] == [0, 0, 0, 3, 0]
    assert [shard_of(h, 10) for h in ids] == [6, 8, 6, 9, 7]
    assert [shard_of(h, MAX_SHARDS) for h in ids] == [379, 335, 991, 990, 82]


@pytest.mark.parametrize("count", [0, -1, MAX_SHARDS + 1])
def test_shard_of_refuses_a_count_out_of_range(count: int) -> None:
    with pytest.raises(InvalidShard):
        shard_of("a", count)


def test_adding_harvesters_moves_none() -> None:
    """A harvester's shard ignores the others: the same ids map the same way whether 10
    or 10,000 harvesters exist."""
    few = {hid: shard_of(hid, 8) for hid in IDS[:10]}
    many = {hid: shard_of(hid, 8) for hid in IDS}
    assert all(many[hid] == shard for hid, shard in few.items())


def test_one_more_shard_moves_only_its_share_to_the_new_shard() -> None:
    before = [shard_of(hid, 10) for hid in IDS]
    after = [shard_of(hid, 11) for hid in IDS]
    moved = [(b, a) for b, a in zip(before, after, strict=True) if a != b]
    assert {a for _, a in moved} == {10}
    assert 0.07 <= len(moved) / len(IDS) <= 0.11


def test_every_step_of_growth_moves_only_to_the_new_shard() -> None:
    sample = IDS[:2000]
    for count in range(1, 16):
        for hid in sample:
            old, new = shard_of(hid, count), shard_of(hid, count + 1)
            assert new in (old, count), (hid, count, old, new)


def test_balance() -> None:
    counts = Counter(shard_of(hid, 8) for hid in IDS)
    mean = len(IDS) / 8
    assert sorted(counts) == list(range(8))
    assert all(abs(n - mean) <= 0.15 * mean for n in counts.values()), counts


# -- names --------------------------------------------------------------------------------


def test_shard_names_do_not_carry_the_count() -> None:
    """K changes rename no location: names are PREFIX_shard_<i>, K comes from the
    registry."""
    assert Shard(2, 5).location_name() == "oaipmh_dagster_shard_2"
    assert Shard(2, 7).location_name() == Shard(2, 5).location_name()
    assert Shard(2, 5).location_name("prod") == "prod_shard_2"
    assert Shard.of_location("oaipmh_dagster_shard_2", 5) == Shard(2, 5)
    assert Shard.of_location("prod_shard_2", 3) == Shard(2, 3)
    assert Shard.of_location("shard_0", 1) == Shard(0, 1)
    assert parse_location("x_shard_10") == (10, None)


def test_a_name_without_the_count_needs_the_stored_one() -> None:
    with pytest.raises(ShardCountUnknown, match="workspace --shards K"):
        Shard.of_location("oaipmh_dagster_shard_1")
    with pytest.raises(InvalidShard):  # a location left over from a larger K
        Shard.of_location("oaipmh_dagster_shard_4", 4)


def test_names_of_earlier_versions_keep_their_count() -> None:
    """A deployment being migrated still loads with `..._shard_<i>_of_<K>` names: the
    K a name carries wins over the stored one."""
    assert Shard.of_location("oaipmh_dagster_shard_2_of_5") == Shard(2, 5)
    assert Shard.of_location("prod_shard_2_of_5", 9) == Shard(2, 5)
    assert Shard.of_location("shard_0_of_1") == Shard(0, 1)
    assert Shard.of_location("x_shard_10_of_11") == Shard(10, 11)
    assert parse_location("x_shard_10_of_11") == (10, 11)


@pytest.mark.parametrize("name", [None, "", "oaipmh_dagster", "shard", "shard1",
                                  "xshard_1_of_2", "shard_1_of_2_extra", "shard_a_of_2",
                                  "xshard_1", "shard_01", "shard_1_x"])
def test_a_plain_name_holds_every_harvester(name: str | None) -> None:
    assert Shard.of_location(name) is None


@pytest.mark.parametrize("name", ["shard_5_of_4", "shard_0_of_0", "loc_shard_4_of_4",
                                  f"loc_shard_0_of_{MAX_SHARDS + 1}"])
def test_an_impossible_shard_name_is_refused(name: str) -> None:
    with pytest.raises(InvalidShard):
        Shard.of_location(name)


def test_holds_agrees_with_shard_of() -> None:
    shards = [Shard(i, 3) for i in range(3)]
    for hid in IDS[:300]:
        assert [s.index for s in shards if s.holds(hid)] == [shard_of(hid, 3)]


@pytest.mark.parametrize(("index", "count"), [(-1, 2), (2, 2), (0, 0), (0, MAX_SHARDS + 1)])
def test_an_impossible_shard_is_refused(index: int, count: int) -> None:
    with pytest.raises(InvalidShard):
        Shard(index, count)


# -- the workspace file -------------------------------------------------------------------


def _locations(text: str) -> list[dict]:
    data = yaml.safe_load(text)
    return [entry["python_module"] for entry in data["load_from"]]


@pytest.mark.parametrize("count", [2, 3, 8])
def test_workspace_yaml_has_one_location_per_shard(count: int) -> None:
    entries = _locations(workspace_yaml(count))
    names = [e["location_name"] for e in entries]
    assert len(set(names)) == count
    assert {e["module_name"] for e in entries} == {"oaipmh_dagster.definitions"}
    shards = [Shard.of_location(n, count) for n in names]
    assert sorted((s.index, s.count) for s in shards if s is not None) == [
        (i, count) for i in range(count)]
    # Every harvester is held by exactly one of the locations.
    for hid in IDS[:300]:
        assert sum(s.holds(hid) for s in shards if s is not None) == 1


def test_workspace_yaml_of_one_shard_is_the_plain_location() -> None:
    assert _locations(workspace_yaml(1)) == [
        {"module_name": "oaipmh_dagster.definitions", "location_name": DEFAULT_LOCATION}]
    assert [e["location_name"] for e in _locations(workspace_yaml(2, "prod"))] == [
        "prod_shard_0", "prod_shard_1"]


def test_workspace_command(run, sqlite_url: str) -> None:  # noqa: ANN001 - fixture
    from oaipmh_dagster.storage.registry import Registry

    result = run("workspace", "--shards", "3")
    assert result.code == 0, result.err
    assert result.out == workspace_yaml(3)
    assert [e["location_name"] for e in _locations(result.out)] == [
        f"oaipmh_dagster_shard_{i}" for i in range(3)]
    assert Registry().shard_count() == 3  # stored once, read by every location
    assert "stored 3 shard(s) (was unset)" in result.err
    assert run("workspace", "--shards", "4", "--print-only").out == workspace_yaml(4)
    assert Registry().shard_count() == 3
    assert run("workspace").out == workspace_yaml(1)
    assert Registry().shard_count() == 1


def test_a_stored_count_that_is_not_a_number_is_an_error(sqlite_url: str) -> None:
    from oaipmh_dagster.storage.registry import SHARDS_SETTING, Registry, RegistryError

    registry = Registry()
    registry.set_setting(SHARDS_SETTING, "many")
    with pytest.raises(RegistryError, match="not a positive integer"):
        registry.shard_count()


def test_workspace_command_sizes(run, sqlite_url: str) -> None:  # noqa: ANN001 - fixture
    for hid in IDS[:30]:
        add_harvester(hid, "http://127.0.0.1:9/oai")
    counts = Counter(shard_of(hid, 3) for hid in IDS[:30])
    result = run("workspace", "--shards", "3", "--prefix", "p", "--sizes")
    assert result.code == 0, result.err
    assert result.out == workspace_yaml(3, "p")
    assert result.err.strip().splitlines()[-1] == (
        f"30 harvesters; per location: min {min(counts.values())}, "
        f"max {max(counts.values())}")


@pytest.mark.parametrize("argv", [["--shards", "0"], ["--shards", str(MAX_SHARDS + 1)],
                                  ["--shards", "x"], ["--prefix", "a.b"]])
def test_workspace_command_usage_errors(run, argv: list[str]) -> None:  # noqa: ANN001
    result = run("workspace", *argv)
    assert result.code == 2 and result.error_line
    assert result.out == ""


# -- the location a reload picks ----------------------------------------------------------


def test_holding_location_picks_the_holding_shard() -> None:
    names = [Shard(i, 4).location_name() for i in range(4)]
    for hid in IDS[:100]:
        assert holding_location(names, hid) == names[shard_of(hid, 4)]
    # Among other locations too, whatever their order.
    mixed = ["other_code", *reversed(names)]
    assert holding_location(mixed, "h00001") == names[shard_of("h00001", 4)]


def test_holding_location_of_an_unsharded_workspace() -> None:
    assert holding_location([DEFAULT_LOCATION], "a") == DEFAULT_LOCATION
    assert holding_location([], "a") == DEFAULT_LOCATION
    assert holding_location(["mine"], "a") == "mine"  # the only location
    assert holding_location(["mine", DEFAULT_LOCATION], "a") == DEFAULT_LOCATION
    assert holding_location(["one", "two"], "a") == DEFAULT_LOCATION
    assert holding_location([Shard(0, 2).location_name()], None) == DEFAULT_LOCATION


def test_holding_location_ignores_invalid_shard_names() -> None:
    hid = next(h for h in IDS if shard_of(h, 2) == 1)
    names = ["x_shard_5_of_4", "x_shard_0_of_0", Shard(0, 2).location_name(),
             Shard(1, 2).location_name()]
    assert holding_location(names, hid) == Shard(1, 2).location_name()
    assert holding_location(["x_shard_5_of_4"], hid) == "x_shard_5_of_4"  # the only one
    assert holding_location(["x_shard_5_of_4", DEFAULT_LOCATION], hid) == DEFAULT_LOCATION


def test_a_shard_missing_from_the_workspace_is_named() -> None:
    hid = next(h for h in IDS if shard_of(h, 2) == 1)
    with pytest.raises(NoHoldingLocation, match=f"harvester {hid} \\(shard 1 of 2\\)"):
        holding_location([Shard(0, 2).location_name()], hid, 2)
    legacy = "oaipmh_dagster_shard_0_of_2"
    with pytest.raises(NoHoldingLocation, match=f"harvester {hid} \\(shard 1 of 2\\)"):
        holding_location([legacy], hid)


def test_holding_location_among_names_of_earlier_versions() -> None:
    names = [f"oaipmh_dagster_shard_{i}_of_4" for i in range(4)]
    for hid in IDS[:50]:
        assert holding_location(names, hid) == names[shard_of(hid, 4)]


def test_kubernetes_style_names_name_shards_too() -> None:
    assert Shard.of_location("oaipmh-dagster-shard-2-of-4") == Shard(2, 4)
    assert Shard.of_location("oaipmh-dagster-shard-2", 4) == Shard(2, 4)
    assert Shard.of_location("shard-0-of-1") == Shard(0, 1)
    assert Shard.of_location("x_shard-2_of-4") is None  # one separator throughout
    with pytest.raises(InvalidShard):
        Shard.of_location("oaipmh-dagster-shard-4-of-4")


def test_a_hyphenated_prefix_gives_kubernetes_style_names() -> None:
    name = Shard(3, 8).location_name("oaipmh-dagster")
    assert name == "oaipmh-dagster-shard-3"
    assert Shard.of_location(name, 8) == Shard(3, 8)


def test_zero_padded_shard_numbers_name_no_shard() -> None:
    assert Shard.of_location("oaipmh_dagster_shard_01_of_3") is None
    assert Shard.of_location("oaipmh_dagster_shard_1_of_03") is None


# -- the definitions of each shard's location ---------------------------------------------


@contextmanager
def _code_location(name: str) -> Iterator[None]:
    """Load definitions as the code server of location `name` does."""
    from dagster._core.definitions.definitions_load_context import (
        DefinitionsLoadContext,
        DefinitionsLoadType,
    )
    from dagster._core.definitions.repository_definition import RepositoryLoadData

    context = DefinitionsLoadContext(DefinitionsLoadType.INITIALIZATION,
                                     RepositoryLoadData(code_location_name=name))
    with DefinitionsLoadContext.scoped(context):
        yield


def _harvester_jobs(d: dg.Definitions) -> set[str]:
    return {j.name for j in d.get_repository_def().get_all_jobs()
            if not j.name.startswith("__") and j.name != "manage_harvesters"}


def _job(hid: str) -> str:
    return f"harvest_oaipmh_records_{hid}"


def test_each_shard_location_loads_its_own_harvesters(sqlite_url: str) -> None:
    from oaipmh_dagster.contracts import SENSOR_NAME
    from oaipmh_dagster.storage.registry import SHARDS_SETTING, Registry

    ids = IDS[:24]
    for hid in ids:
        add_harvester(hid, "http://127.0.0.1:9/oai", cron="0 3 * * *")
    count = 3
    assert len({shard_of(hid, count) for hid in ids}) == count  # every shard holds some
    Registry().set_setting(SHARDS_SETTING, str(count))
    seen: list[str] = []
    for index in range(count):
        name = Shard(index, count).location_name()
        with _code_location(name):
            loaded = defs()
        repo = loaded.get_repository_def()
        jobs = _harvester_jobs(loaded)
        assert jobs == {_job(h) for h in ids if shard_of(h, count) == index}, name
        assert {s.name for s in repo.schedule_defs} == jobs
        assert [s.name for s in repo.sensor_defs] == [SENSOR_NAME]
        seen.extend(jobs)
    assert sorted(seen) == sorted(_job(h) for h in ids)  # each exactly once
    with _code_location(DEFAULT_LOCATION):
        assert _harvester_jobs(defs()) == {_job(h) for h in ids}
    with _code_location("other_name"):
        assert _harvester_jobs(defs()) == {_job(h) for h in ids}


def test_a_shard_location_hands_only_its_rows_to_run_workers(sqlite_url: str) -> None:
    import json

    from oaipmh_dagster.contracts import ROWS_KEY
    from oaipmh_dagster.storage.registry import SHARDS_SETTING, Registry

    ids = IDS[:12]
    for hid in ids:
        add_harvester(hid, "http://127.0.0.1:9/oai")
    Registry().set_setting(SHARDS_SETTING, "2")
    name = Shard(1, 2).location_name()
    with _code_location(name):
        loaded = defs()
    rows = json.loads(str(loaded.metadata[ROWS_KEY].value))
    assert [r["id"] for r in rows] == [h for h in ids if shard_of(h, 2) == 1]


def test_a_shard_location_reads_and_checks_only_its_own_rows(
        sqlite_url: str, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A shard's load is bounded by its own size: the other shards' rows are neither
    decoded nor validated, and a broken row of another shard is that shard's error."""
    from oaipmh_dagster.storage import db
    from oaipmh_dagster.storage.registry import SHARDS_SETTING, Harvester, Registry, harvester_table

    ids = IDS[:40]
    for hid in ids:
        add_harvester(hid, "http://127.0.0.1:9/oai")
    Registry().set_setting(SHARDS_SETTING, "4")
    mine = [h for h in ids if shard_of(h, 4) == 2]
    broken_elsewhere = next(h for h in ids if shard_of(h, 4) == 0)
    broken_here = mine[0]
    with db.get_engine().begin() as conn:
        for hid in (broken_elsewhere, broken_here):
            conn.execute(harvester_table.update().where(harvester_table.c.id == hid)
                         .values(cron="not a cron"))
    checked: list[str] = []
    real = Harvester.from_dict.__func__  # type: ignore[attr-defined]

    def counting(cls: type[Harvester], data: Any) -> Harvester:
        checked.append(data["id"])
        return real(cls, data)

    monkeypatch.setattr(Harvester, "from_dict", classmethod(counting))
    with _code_location(Shard(2, 4).location_name()):
        loaded = defs()
    assert _harvester_jobs(loaded) == {_job(h) for h in mine[1:]}
    assert sorted(checked) == sorted(mine)
    assert broken_here in caplog.text
    assert broken_elsewhere not in caplog.text


def test_a_location_reads_the_stored_count_and_names_of_earlier_versions_still_load(
    sqlite_url: str,
) -> None:
    from oaipmh_dagster.storage.registry import SHARDS_SETTING, Registry

    ids = IDS[:16]
    for hid in ids:
        add_harvester(hid, "http://127.0.0.1:9/oai")
    with _code_location("oaipmh_dagster_shard_1"):  # no K stored yet: holds nothing
        assert _harvester_jobs(defs()) == set()
    Registry().set_setting(SHARDS_SETTING, "2")
    with _code_location("oaipmh_dagster_shard_1"):
        assert _harvester_jobs(defs()) == {_job(h) for h in ids if shard_of(h, 2) == 1}
    with _code_location("oaipmh_dagster_shard_2"):  # left over from a larger K
        assert _harvester_jobs(defs()) == set()
    with _code_location("oaipmh_dagster_shard_2_of_3"):  # a name of an earlier version
        assert _harvester_jobs(defs()) == {_job(h) for h in ids if shard_of(h, 3) == 2}


# -- the Helm chart's user deployments ------------------------------------------------------

def test_helm_values_give_one_user_deployment_per_shard(run, sqlite_url: str,  # noqa: ANN001
                                                        tmp_path: Path) -> None:
    """`workspace --helm-values FILE` turns FILE's first user deployment into one per shard,
    each code server started under its own location name (which the chart requires to be
    the deployment's name), the rest (image, secrets, env) kept."""
    shipped = Path(__file__).resolve().parents[2] / "deploy" / "k8s" / "values.yaml"
    result = run("workspace", "--shards", "3", "--prefix", "oaipmh-dagster",
                 "--helm-values", str(shipped))
    assert result.code == 0, result.err
    deployments = yaml.safe_load(result.out)["dagster-user-deployments"]["deployments"]
    names = [d["name"] for d in deployments]
    assert names == location_names(3, "oaipmh-dagster")
    template = yaml.safe_load(shipped.read_text())["dagster-user-deployments"]["deployments"][0]
    for deployment in deployments:
        args = deployment["codeServerArgs"]
        assert args[args.index("--location-name") + 1] == deployment["name"]
        assert args[args.index("-m") + 1] == "oaipmh_dagster.definitions"
        assert deployment["image"] == template["image"]
        assert deployment["envSecrets"] == template["envSecrets"]
        assert deployment["env"] == template["env"]
    from oaipmh_dagster.storage.registry import Registry

    assert Registry().shard_count() == 3  # stored as for the workspace file


@pytest.mark.parametrize(("prefix", "body", "message"), [
    ("oaipmh_dagster", None, "Kubernetes"),
    ("oaipmh-dagster", "dagster-user-deployments: {deployments: []}\n", "no user deployment"),
    ("oaipmh-dagster", "[1, 2\n", "not a YAML"),
    ("oaipmh-dagster", "dagster-user-deployments:\n  deployments:\n    - name: x\n",
     "codeServerArgs"),
])
def test_helm_values_refuse_what_cannot_work(run, sqlite_url: str, tmp_path: Path,  # noqa: ANN001
                                             prefix: str, body: str | None,
                                             message: str) -> None:
    shipped = Path(__file__).resolve().parents[2] / "deploy" / "k8s" / "values.yaml"
    source = shipped
    if body is not None:
        source = tmp_path / "values.yaml"
        source.write_text(body)
    result = run("workspace", "--shards", "2", "--prefix", prefix,
                 "--helm-values", str(source))
    assert result.code == 2 and message in result.error_line, result.err
    assert result.out == ""
    from oaipmh_dagster.storage.registry import Registry

    assert Registry().shard_count() is None  # nothing stored
