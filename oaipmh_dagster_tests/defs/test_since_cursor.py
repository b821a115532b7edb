"""The since sensor's cursor: small (Dagster stores it whole in every tick row), read in
every version, and an operator's edit of it found without a second copy of the map."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import dagster as dg
import pytest

from oaipmh_dagster.definitions import build_definitions
from oaipmh_dagster.defs import sensors
from oaipmh_dagster.defs.assets import asset_keys
from oaipmh_dagster.defs.since import current_state, set_since
from oaipmh_dagster.storage.registry import Harvester

LOCATION = "oaipmh_dagster_shard_0"
SINCE = "2026-03-01T12:00:00Z"


def _harvesters(n: int, width: int = 20) -> list[Harvester]:
    return [Harvester(id=f"repository_{i:0{width - 11}d}", base_url="http://127.0.0.1:9/oai",
                      metadata_prefix="oai_dc") for i in range(n)]


def _tick(instance: dg.DagsterInstance, cursor: str | None, hs: list[Harvester],
          now: datetime | None = None) -> sensors.Tick:
    tick = sensors.evaluate(instance, cursor, hs, LOCATION, now=now)
    sensors.report(instance, tick)
    return tick


def _since(instance: dg.DagsterInstance, h: Harvester) -> str | None:
    state = current_state(instance, asset_keys(h.id)[1])
    return state.value if state is not None else None


def test_the_cursor_holds_at_most_64_bytes_per_harvester(instance: dg.DagsterInstance
                                                         ) -> None:
    """200 harvesters with 20-character ids and second-granularity sinces: the cursor
    the sensor settles on (every since mirrored) stays within 64 bytes each."""
    hs = _harvesters(200)
    for h in hs:
        set_since(instance, h, asset_keys(h.id)[1], SINCE)
    cursor = None
    for _ in range(5):  # enough ticks for any round robin to mirror every harvester
        cursor = _tick(instance, cursor, hs).cursor
    assert cursor is not None and len(json.loads(cursor)["since"]) == 200
    assert len(cursor.encode()) / 200 <= 64, len(cursor)


def _interval() -> int | None:
    return build_definitions([], LOCATION).get_repository_def().get_sensor_def(
        sensors.SENSOR_NAME).minimum_interval_seconds


def test_the_sensor_ticks_at_most_once_a_minute_by_default(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(sensors.SENSOR_INTERVAL_ENV, raising=False)
    assert _interval() == 60
    monkeypatch.setenv(sensors.SENSOR_INTERVAL_ENV, " ")
    assert _interval() == 60


def test_the_interval_is_set_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(sensors.SENSOR_INTERVAL_ENV, "5")
    assert _interval() == 5
    monkeypatch.setenv(sensors.SENSOR_INTERVAL_ENV, "3600")
    assert _interval() == 3600


@pytest.mark.parametrize("raw", ["4", "3601", "0", "-5", "30s", "1.5", "soon"])
def test_an_interval_out_of_bounds_is_refused(raw: str) -> None:
    with pytest.raises(ValueError, match=r"OAIPMH_SINCE_SENSOR_INTERVAL must be a whole "
                                         r"number of seconds in \[5, 3600\], not"):
        sensors.sensor_interval({sensors.SENSOR_INTERVAL_ENV: raw})


def test_an_empty_cursor_fills_every_entry_at_once(instance: dg.DagsterInstance) -> None:
    hs = _harvesters(120)
    for h in hs[:100]:
        set_since(instance, h, asset_keys(h.id)[1], SINCE)
    now = datetime(2026, 3, 2, tzinfo=UTC)
    cursor = json.loads(_tick(instance, None, hs, now=now).cursor)
    assert cursor["since"] == {h.id: SINCE for h in hs[:100]}
    assert cursor["watermark"] == now.isoformat()  # no replay of the run history


def test_an_edit_is_found_by_the_digest(instance: dg.DagsterInstance) -> None:
    a, b, c = hs = _harvesters(3)
    for h in hs:
        set_since(instance, h, asset_keys(h.id)[1], SINCE)
    first = _tick(instance, None, hs)
    quiet = _tick(instance, first.cursor, hs)
    assert not quiet.events and not quiet.lines  # nothing edited: nothing published
    edited = json.loads(quiet.cursor)
    edited["since"][a.id] = "2024-01-01"
    del edited["since"][b.id]
    result = _tick(instance, json.dumps(edited), hs)
    assert _since(instance, a) == "2024-01-01"
    assert _since(instance, b) is None  # a removed entry: a full harvest next
    assert _since(instance, c) == SINCE
    assert json.loads(result.cursor)["since"] == {a.id: "2024-01-01", c.id: SINCE}
    assert sorted(e.asset_key for e in result.events) == sorted(
        asset_keys(h.id)[1] for h in (a, b))


def test_an_edit_does_not_undo_a_since_set_after_the_cursor(instance: dg.DagsterInstance
                                                            ) -> None:
    """`since set` after the tick that wrote the cursor: the operator's copy of the
    cursor still shows the older value, which is not an edit."""
    a, b = hs = _harvesters(2)
    for h in hs:
        set_since(instance, h, asset_keys(h.id)[1], SINCE)
    written = _tick(instance, None, hs)
    set_since(instance, b, asset_keys(b.id)[1], "2025-01-01")
    edited = json.loads(written.cursor)
    edited["since"][a.id] = "2024-01-01"
    result = _tick(instance, json.dumps(edited), hs)
    assert (_since(instance, a), _since(instance, b)) == ("2024-01-01", "2025-01-01")
    assert json.loads(result.cursor)["since"][b.id] == "2025-01-01"


def test_a_cursor_of_the_previous_version_is_still_read(instance: dg.DagsterInstance
                                                        ) -> None:
    a, b = hs = _harvesters(2)
    for h in hs:
        set_since(instance, h, asset_keys(h.id)[1], SINCE)
    old = json.dumps({"since": {a.id: SINCE, b.id: "2024-06-01", "gone": SINCE},
                      "published": {a.id: SINCE, b.id: SINCE, "gone": SINCE},
                      "watermark": "2026-03-01T12:00:00+00:00", "seen": [], "refresh": 0})
    result = json.loads(_tick(instance, old, hs).cursor)
    assert _since(instance, b) == "2024-06-01"  # its one edit
    assert _since(instance, a) == SINCE
    assert result["since"] == {a.id: SINCE, b.id: "2024-06-01"}  # only its harvesters
    assert "published" not in result and result["watermark"] == "2026-03-01T12:00:00+00:00"
