"""Case 13's measurement, run as a script with the checkout under test first on
PYTHONPATH (this checkout, or the baseline one), DAGSTER_HOME and OAIPMH_DATABASE_URL set:

    python benchmarks/list_driver.py '{"n": 10000}'

Times, in one process, against the instance and registry the fill wrote:
`oaipmh-dagster harvester list` (the console script's `main`, its output kept), the
same with `--json`, since resolution of every harvester (`since.current_states`, what
the since sensor's first tick reads), the since sensor's first tick (`sensors.evaluate`
with an empty cursor) and a quiet one after it, and the schedule's tick-time since
(`since.run_mode`) of a sample of harvesters. Each figure comes with the process's CPU
seconds (the steadier figure on a busy machine), the SQL statements
sent to the Dagster instance's storages (those naming no `oaipmh_` table) and a digest
of what it produced, so that two checkouts' results can be compared. Prints one JSON
line."""

from __future__ import annotations

import time

UP = time.monotonic()

import contextlib  # noqa: E402 - the first mark comes before every import
import hashlib  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402
from datetime import UTC, datetime  # noqa: E402
from typing import Any  # noqa: E402

SAMPLE = 200  # schedule ticks timed
NOW = datetime(2099, 1, 1, tzinfo=UTC)  # the sensor ticks' clock: after every fill


class Statements:
    """SQL statements sent to the Dagster instance (every engine, `oaipmh_` tables aside)."""

    def __init__(self) -> None:
        import sqlalchemy as sa

        self.count = 0
        sa.event.listen(sa.engine.Engine, "before_cursor_execute", self._seen)

    def _seen(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "oaipmh_" not in statement:
            self.count += 1


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _timed(statements: Statements, fn: Callable[[], str]) -> dict[str, Any]:
    before = statements.count
    t0, c0 = time.perf_counter(), time.process_time()
    text = fn()
    return {"seconds": time.perf_counter() - t0, "cpu": time.process_time() - c0,
            "statements": statements.count - before, "digest": _digest(text)}


def _cli(*args: str) -> str:
    from oaipmh_dagster.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        main(list(args))
    return out.getvalue()


def main(args: dict[str, Any]) -> dict[str, Any]:
    import oaipmh_dagster
    from oaipmh_dagster.cli import commands

    imported = time.monotonic() - UP
    statements = Statements()
    result: dict[str, Any] = {"package": oaipmh_dagster.__file__, "imported": imported}
    result["list"] = _timed(statements, lambda: _cli("harvester", "list"))
    result["list"]["from_start"] = time.monotonic() - UP
    result["list"]["cpu_from_start"] = time.process_time()
    result["list_json"] = _timed(statements, lambda: _cli("harvester", "list", "--json"))
    instance = commands._instance()  # noqa: SLF001 - the instance the CLI reads
    rows = commands._registry().list()  # noqa: SLF001
    result["since_all"] = _timed(statements, lambda: _since_all(instance, rows))
    result["sensor_first"], cursor = _sensor(statements, instance, rows, None)
    result["sensor_quiet"], _ = _sensor(statements, instance, rows, cursor)
    result["schedule"] = _timed(statements, lambda: _schedule(instance, rows[:SAMPLE]))
    result["n"], result["sample"] = len(rows), min(SAMPLE, len(rows))
    return result


def _since_all(instance: Any, rows: list[Any]) -> str:
    from oaipmh_dagster.defs.assets import asset_keys
    from oaipmh_dagster.defs.since import current_states

    states = current_states(instance, [asset_keys(h.id)[1] for h in rows])
    return "\n".join(f"{key.to_user_string()} {state!r}" for key, state in
                     sorted(states.items(), key=lambda kv: kv[0].to_user_string()))


def _sensor(statements: Statements, instance: Any, rows: list[Any], cursor: str | None
            ) -> tuple[dict[str, Any], str]:
    from oaipmh_dagster.defs import sensors

    ticks: list[Any] = []

    def tick() -> str:
        ticks.append(sensors.evaluate(instance, cursor, rows, None, now=NOW))
        t = ticks[-1]
        return json.dumps([t.cursor, [repr(e) for e in t.events], t.lines])

    out = _timed(statements, tick)
    out["events"] = len(ticks[-1].events)
    return out, ticks[-1].cursor


def _schedule(instance: Any, rows: list[Any]) -> str:
    from oaipmh_dagster.defs.assets import asset_keys
    from oaipmh_dagster.defs.since import run_mode

    return "\n".join(f"{h.id} {run_mode(instance, h, asset_keys(h.id)[1])}" for h in rows)


if __name__ == "__main__":
    out = main(json.loads(sys.argv[1]) if len(sys.argv) > 1 else {})
    sys.stdout.write("\n" + json.dumps(out) + "\n")
