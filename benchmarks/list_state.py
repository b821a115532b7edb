"""Case 13: `harvester list` and since resolution of N harvesters (1,000 and 10,000), on
SQLite and on PostgreSQL (a fresh database, created and dropped, when the server
answers), this checkout against a baseline one, on the same instance.

Per storage and size, the `list_fill` child writes a Dagster instance and a registry of
N harvesters in every shape of history (`benchmarks/list_fill.py`); then
`benchmarks/list_driver.py` runs once with this checkout and once with the baseline
first on PYTHONPATH (each a fresh process), and times `harvester list` (from process
start, and the command alone), `--json`, since resolution of every harvester, the since
sensor's first tick (empty cursor) and a quiet one, and the schedule's tick-time since of
200 harvesters, with the SQL statements each sent to the instance and a digest of what
each produced (the two checkouts must agree). The baseline is a checkout directory or a
git revision of this repository (exported with `git archive`):
`OAIPMH_BENCH_LIST_BASELINE` (default `BASELINE`, the code before the batched reads;
`none`: no baseline). Target: `harvester list` of 10,000 harvesters within 10 s from
process start."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from benchmarks.cases import ROOT, Bench, ChildFailed, Row, postgres_database

BASELINE = "67b1b1c"  # the code before the batched reads
TARGET_N, TARGET_SECONDS = 10_000, 10.0
MEASURES = (("list", "harvester list"), ("list_json", "harvester list --json"),
            ("since_all", "since resolution, every harvester"),
            ("sensor_first", "since sensor, first tick (empty cursor)"),
            ("sensor_quiet", "since sensor, quiet tick"),
            ("schedule", "schedule tick-time since, per tick"))


def _baseline(b: Bench) -> Path | None:
    """The baseline checkout's root (a directory holding `oaipmh_dagster`), or None."""
    given = os.environ.get("OAIPMH_BENCH_LIST_BASELINE", BASELINE)
    if given.lower() == "none":
        return None
    if Path(given).is_dir():
        return Path(given).resolve()
    out = b.tmp / f"baseline-{given}"
    if not out.exists():
        out.mkdir()
        archive = subprocess.run(["git", "archive", given, "oaipmh_dagster"], cwd=ROOT,
                                 capture_output=True, check=True, timeout=60).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as t:
            t.extractall(out, filter="data")
    return out


def _storage_yaml(url: str | None) -> str:
    """The instance file: telemetry off, and dagster-postgres on `url` when given."""
    text = "telemetry:\n  enabled: false\n"
    if url is None:
        return text
    u = sa.engine.make_url(url)
    db = {"username": u.username or "postgres", "hostname": u.host or "127.0.0.1",
          "db_name": u.database, "port": u.port or 5432, "scheme": "postgresql+psycopg2"}
    if u.password:
        db["password"] = u.password
    return text + "storage:\n  postgres:\n    postgres_db:\n" + "".join(
        f"      {k}: {v}\n" for k, v in db.items())


def _drive(b: Bench, root: Path, home: Path, registry: str) -> dict[str, Any]:
    """One run of the driver with `root`'s code first on PYTHONPATH."""
    env = {**os.environ, "PYTHONPATH": str(root), "DAGSTER_HOME": str(home),
           "OAIPMH_DATABASE_URL": registry}
    log = b.logs / f"list-driver-{time.monotonic_ns()}.log"
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "list_driver.py")],
                          cwd=home, env=env, capture_output=True, text=True, timeout=7200)
    wall = time.perf_counter() - t0
    log.write_text(f"$ PYTHONPATH={root} list_driver.py\n{proc.stderr}", encoding="utf-8")
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    if proc.returncode != 0 or not lines:
        raise ChildFailed(f"list_driver failed (exit {proc.returncode}, log {log})")
    out = json.loads(lines[-1])
    if not out["package"].startswith(str(root)):
        raise ChildFailed(f"the driver imported {out['package']}, not the code of {root}")
    return {**out, "process_seconds": wall}


def _measure(b: Bench, n: int, pg: str | None, base: Path | None) -> dict[str, Any]:
    home = b.tmp / f"list-{n}-{'postgres' if pg else 'sqlite'}"
    home.mkdir()
    (home / "dagster.yaml").write_text(_storage_yaml(pg), encoding="utf-8")
    registry = pg or f"sqlite:///{home / 'oaipmh.sqlite'}"
    filled = b.child("list_fill", {"n": n, "home": str(home), "registry": registry},
                     env={"DAGSTER_HOME": str(home)}, timeout=3600)
    out = {"fill": filled, "now": _drive(b, ROOT, home, registry)}
    if base is not None:
        out["baseline"] = _drive(b, base, home, registry)
    return out


def _figure(m: dict[str, Any], per: int, tick: bool) -> str:
    """Wall and CPU time: seconds in all, or milliseconds a tick."""
    if tick:
        return f"{m['seconds'] / per * 1000:.1f} ms (CPU {m['cpu'] / per * 1000:.1f} ms)"
    return f"{m['seconds']:.2f} s (CPU {m['cpu']:.2f} s)"


def _rows(b: Bench, n: int, storage: str, r: dict[str, Any]) -> None:
    now, base = r["now"], r.get("baseline")
    for key, label in MEASURES:
        tick = key == "schedule"
        per, unit = (now["sample"], "tick") if tick else (n, "harvester")
        m = now[key]
        parts = [f"{m['statements'] / per:.3f} statements per {unit}"]
        if base is not None:
            old = base[key]
            parts.append(f"baseline {_figure(old, per, tick)}, "
                         f"{old['statements'] / per:.2f} per {unit}")
            parts.append("same output" if old["digest"] == m["digest"] else "OUTPUT DIFFERS")
        row = Row("13", f"{label}, {n:,} harvesters, {storage}", _figure(m, per, tick),
                  "; ".join(parts), values={"now": m, "baseline": base[key] if base else None})
        if key == "list":
            row.result = f"{m['from_start']:.2f} s (CPU {m['cpu_from_start']:.2f} s)"
            row.compare = f"from process start; the command alone {_figure(m, per, tick)}; " \
                + row.compare + (f"; baseline from start {base['list']['from_start']:.2f} s"
                                 if base else "")
            if n == TARGET_N:
                row.target = f"<= {TARGET_SECONDS:.0f} s"
                row.ok = "ok" if m["from_start"] <= TARGET_SECONDS else "MISS"
        b.add(row)


def case_list_state(b: Bench) -> None:
    """Case 13 (see the module docstring)."""
    base = _baseline(b)
    out: dict[str, Any] = {"baseline": str(base) if base else None}
    for n in b.sizes.list_sizes:
        r = _measure(b, n, None, base)
        out[f"sqlite/{n}"] = r
        _rows(b, n, "SQLite", r)
        try:
            with postgres_database() as url:
                r = _measure(b, n, url, base)
        except (sa.exc.OperationalError, ChildFailed) as exc:
            out[f"postgres/{n}"] = {"error": str(exc)}
            b.add(Row("13", f"harvester list, {n:,} harvesters, PostgreSQL", "n/a",
                      f"error: {str(exc).splitlines()[0]}"))
            continue
        out[f"postgres/{n}"] = r
        _rows(b, n, "PostgreSQL", r)
    b.raw["list_state"] = out


def fill_child(args: dict[str, Any]) -> dict[str, Any]:
    """The `list_fill` child: the instance at $DAGSTER_HOME and the registry."""
    import dagster as dg

    from benchmarks.list_fill import fill

    with dg.DagsterInstance.get() as instance:
        return fill(instance, args["registry"], int(args["n"]))
