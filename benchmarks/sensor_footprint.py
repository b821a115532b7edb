"""Case 10: the since sensor's footprint in the instance. Dagster stores the sensor's
whole cursor in every tick row (`job_ticks.tick_body`, a serialized `TickData`), so
what a deployment keeps is ticks a day x bytes a tick x days of retention.

Per code location of `per_location` harvesters (20-character ids, second-granularity
sinces published on each), in a throwaway instance: the cursor the sensor settles on
(it is re-evaluated until stable) and the tick row that holds it, serialized as the
daemon stores a skipped tick. N harvesters are ceil(N / per_location) such locations.
Compared with the cursor of the previous version (since and published, JSON with
spaces) at its interval (15 s) and the 30-day retention the deploy files had."""

from __future__ import annotations

import json
import math
import time
from typing import Any

from benchmarks.cases import Bench, Row, _fmt_bytes

PER_LOCATION = 200
OLD_INTERVAL, OLD_RETENTION_DAYS = 15, 30
CURSOR_TARGET = 64  # bytes of cursor per harvester
SKIP_REASON = "no newly successful harvest runs"


def _tick_bytes(cursor: str) -> int:
    """Bytes of the tick row body the daemon stores for a skipped tick with `cursor`."""
    from dagster._core.scheduler.instigation import InstigatorType, TickData, TickStatus
    from dagster._serdes import serialize_value

    now = time.time()
    tick = TickData(instigator_origin_id="0" * 40, instigator_name="oaipmh_since_sensor",
                    instigator_type=InstigatorType.SENSOR, status=TickStatus.SKIPPED,
                    timestamp=now, skip_reason=SKIP_REASON, cursor=cursor,
                    selector_id="0" * 40, log_key=["0" * 40, "0" * 40, "0" * 8],
                    failure_count=0, consecutive_failure_count=0, end_timestamp=now + 0.2)
    return len(serialize_value(tick).encode())


def _old_cursor(since: dict[str, str], watermark: str) -> str:
    """The cursor of the previous version for the same sinces."""
    return json.dumps({"since": since, "published": since, "watermark": watermark,
                       "seen": ["0" * 36], "refresh": 0}, sort_keys=True)


def measure_location(per_location: int) -> dict[str, Any]:
    """One location's settled cursor and tick row, and the CPU of a quiet tick."""
    import dagster as dg

    from oaipmh_dagster.defs import sensors
    from oaipmh_dagster.defs.assets import asset_keys
    from oaipmh_dagster.defs.since import set_since
    from oaipmh_dagster.storage.registry import Harvester

    hs = [Harvester(id=f"repository_{i:09d}", base_url="http://127.0.0.1:9/oai",
                    metadata_prefix="oai_dc") for i in range(per_location)]
    with dg.instance_for_test() as instance:
        for i, h in enumerate(hs):
            set_since(instance, h, asset_keys(h.id)[1], f"2026-03-{1 + i % 28:02d}T12:00:00Z")
        cursor: str | None = None
        for _ in range(math.ceil(per_location / sensors.REFRESH_PER_TICK) + 2):
            tick = sensors.evaluate(instance, cursor, hs, "oaipmh_dagster_shard_0")
            sensors.report(instance, tick)
            cursor = tick.cursor
        c0 = time.process_time()
        quiet = sensors.evaluate(instance, cursor, hs, "oaipmh_dagster_shard_0")
        tick_cpu = time.process_time() - c0
    assert cursor is not None
    data = json.loads(cursor)
    old = _old_cursor(data["since"], data["watermark"])
    return {"harvesters": per_location, "entries": len(data["since"]),
            "cursor_bytes": len(quiet.cursor.encode()), "tick_bytes": _tick_bytes(quiet.cursor),
            "old_cursor_bytes": len(old.encode()), "old_tick_bytes": _tick_bytes(old),
            "tick_cpu_seconds": tick_cpu}


def _per_day(tick_bytes: int, interval: int) -> float:
    return tick_bytes * 86400 / interval


def case_sensor_footprint(b: Bench) -> None:
    """Case 10: bytes of since-sensor tick rows a day at 200 and 10,000 harvesters."""
    from oaipmh_dagster.defs.sensors import SENSOR_INTERVAL_SECONDS

    loc = measure_location(PER_LOCATION)
    b.raw["sensor_footprint"] = loc
    per_harvester = loc["cursor_bytes"] / loc["harvesters"]
    b.add(Row("10", f"since sensor cursor per harvester ({PER_LOCATION} per location)",
              f"{per_harvester:.1f} B", f"previous: {loc['old_cursor_bytes'] / PER_LOCATION:.1f} B",
              f"<= {CURSOR_TARGET} B", "ok" if per_harvester <= CURSOR_TARGET else "MISSED",
              values={**loc, "per_harvester": per_harvester}))
    b.add(Row("10", f"quiet tick of one location of {PER_LOCATION} (CPU)",
              f"{loc['tick_cpu_seconds'] * 1000:.0f} ms", values=loc))
    retention = _retention_days()
    for n in (200, 10_000):
        k = math.ceil(n / PER_LOCATION)
        new = k * _per_day(loc["tick_bytes"], SENSOR_INTERVAL_SECONDS)
        old = k * _per_day(loc["old_tick_bytes"], OLD_INTERVAL)
        b.add(Row("10", f"since sensor tick rows a day, N={n:,} (K={k})",
                  f"{_fmt_bytes(new)}/day, {_fmt_bytes(new * retention)} kept "
                  f"({retention} days)",
                  f"previous: {_fmt_bytes(old)}/day, {_fmt_bytes(old * OLD_RETENTION_DAYS)} "
                  f"kept ({OLD_RETENTION_DAYS} days)",
                  values={"n": n, "k": k, "bytes_per_day": new, "kept": new * retention,
                          "old_bytes_per_day": old, "old_kept": old * OLD_RETENTION_DAYS}))


def _retention_days() -> int:
    """Skipped-tick retention of the shipped instance files (they agree; a test holds
    them to 1 to 3 days)."""
    import yaml

    from benchmarks.cases import ROOT

    config = yaml.safe_load((ROOT / "deploy" / "postgres" / "dagster.yaml").read_text())
    return int(config["retention"]["sensor"]["purge_after_days"]["skipped"])
