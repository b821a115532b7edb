"""Case 7: the whole harvest through the CLI against Sickle's bare fetch + parse loop.

`oaipmh-dagster harvest ID` runs as users run it (a fresh process: imports, the Dagster
job on an instance of its own, fetch, parse, transform, store), into SQLite and into
PostgreSQL, and is timed from process start to exit; Sickle's `ListRecords` loop over
the same pages touches every record in a process of its own (its import not counted).
Runs are interleaved (Sickle, SQLite, PostgreSQL, ...) and the median of each is
reported. A second, full harvest of the same store (every record unchanged) measures the
incremental path. With `OAIPMH_BENCH_BASELINE=/path/to/checkout`, the CLI of that
checkout runs too, in the same run, on the same server."""

from __future__ import annotations

import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.cases import (
    ROOT,
    Bench,
    Row,
    _expected_digest,
    _fmt_rate,
    postgres_database,
)

BASELINE_ENV = "OAIPMH_BENCH_BASELINE"
FLOOR_RECORDS = 100  # one page: what a harvest through the CLI costs before any volume
HARVESTER = "bench_cli"


def _cli(checkout: Path | None) -> list[str]:
    """The command line of `oaipmh-dagster` (of another checkout when given)."""
    if checkout is None:
        return [str(Path(sys.executable).with_name("oaipmh-dagster"))]
    return [sys.executable, "-c", "import sys; from oaipmh_dagster.cli.commands import main; main()"]


def _check_imports_from(checkout: Path, env: dict[str, str]) -> None:
    """Refuse a baseline whose `oaipmh_dagster` would not be the checkout's own (an
    installed copy or the working directory found first)."""
    found = subprocess.run(
        [sys.executable, "-c", "import oaipmh_dagster; print(oaipmh_dagster.__file__)"],
        env=env, cwd=checkout, capture_output=True, text=True, check=True, timeout=120,
    ).stdout.strip()
    if not Path(found).resolve().is_relative_to(checkout.resolve()):
        raise RuntimeError(f"the baseline imports oaipmh_dagster from {found}, not from "
                           f"{checkout}")


def _run_cli(b: Bench, db_url: str, url: str, home: Path, tag: str,
             checkout: Path | None, full: bool) -> dict[str, Any]:
    """One `harvest` through the CLI: register the harvester on first use, then time the
    process from start to exit and check what it stored."""
    env = {**os.environ, "DAGSTER_HOME": str(home), "OAIPMH_DATABASE_URL": db_url}
    cwd = ROOT
    if checkout is not None:
        env["PYTHONPATH"] = f"{checkout}{os.pathsep}{checkout / 'src'}"
        cwd = checkout  # `python -c` puts the working directory first on sys.path
        _check_imports_from(checkout, env)
    home.mkdir(parents=True, exist_ok=True)
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n", encoding="utf-8")
    cli = _cli(checkout)
    log = b.logs / f"cli-{tag}.log"
    with log.open("a", encoding="utf-8") as out:
        if not full:
            subprocess.run([*cli, "harvester", "add", HARVESTER, "--url", url, "--prefix",
                            "oai_dc", "--no-check"], env=env, cwd=cwd, stdout=out,
                           stderr=subprocess.STDOUT, check=True, timeout=300)
        args = [*cli, "harvest", HARVESTER, *(["--full"] if full else [])]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run(args, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                              timeout=1800)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"harvest through the CLI exited with {proc.returncode} (log {log})")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    stored = b.child("stored", {"db": db_url, "id": HARVESTER})
    return {"seconds": wall, "cpu": cpu, **stored}


def ceiling(sickle_seconds: float, floor: dict[str, float], run_cpu: float,
            cores: int) -> float:
    """The best ratio to Sickle a run of `run_cpu` CPU seconds could reach on `cores`
    cores if everything it did after the floor (the floor's CPU subtracted) ran
    perfectly in parallel, the floor staying serial. Optimistic: the CPU of the page
    server and of a database server, which share the same cores, is not counted."""
    rest = max(0.0, run_cpu - floor["cpu"])
    return sickle_seconds / (floor["seconds"] + rest / max(1, cores))


def case_cli(b: Bench) -> None:
    n = b.sizes.cli_records
    srv = b.server(n)
    expected = _expected_digest(n)
    repeats = b.sizes.cli_repeats
    baseline = os.environ.get(BASELINE_ENV)
    checkouts: dict[str, Path | None] = {"ours": None}
    if baseline:
        checkouts["baseline"] = Path(baseline).resolve()
    runs: dict[str, list[dict[str, Any]]] = {}
    out: dict[str, Any] = {"records": n, "runs": runs}
    b.raw["cli_e2e"] = out
    small = b.server(FLOOR_RECORDS)
    for i in range(repeats):
        sickle = b.child("sickle_harvest", {"url": srv.url})
        runs.setdefault("sickle", []).append({**sickle, "rate": sickle["records"] / sickle["seconds"]})
        home = b.tmp / f"cli-floor-{i}"
        try:
            runs.setdefault("floor", []).append(_run_cli(
                b, f"sqlite:///{home / 'oaipmh.sqlite'}", small.url, home, "floor", None,
                full=False))
        finally:
            shutil.rmtree(home, ignore_errors=True)
        for who, checkout in checkouts.items():
            for engine in ("sqlite", "postgres"):
                home = b.tmp / f"cli-{who}-{engine}-{i}"
                try:
                    if engine == "sqlite":
                        db_url = f"sqlite:///{home / 'oaipmh.sqlite'}"
                        first = _run_cli(b, db_url, srv.url, home, f"{who}-{engine}", checkout,
                                         full=False)
                        again = _run_cli(b, db_url, srv.url, home, f"{who}-{engine}",
                                         checkout, full=True)
                    else:
                        with postgres_database() as db_url:
                            first = _run_cli(b, db_url, srv.url, home, f"{who}-{engine}",
                                             checkout, full=False)
                            again = _run_cli(b, db_url, srv.url, home, f"{who}-{engine}",
                                             checkout, full=True)
                except Exception as exc:  # noqa: BLE001 - report, go on
                    runs.setdefault(f"{who}-{engine}", []).append({"error": str(exc)})
                    continue
                finally:
                    shutil.rmtree(home, ignore_errors=True)
                for kind, r in (("first", first), ("unchanged", again)):
                    r["rate"] = n / r["seconds"]
                    r["same"] = (r["stored"], r["digest"]) == expected
                    runs.setdefault(f"{who}-{engine}-{kind}", []).append(r)
    _rows(b, n, runs, checkouts)


def _median_rate(results: list[dict[str, Any]]) -> float | None:
    rates = [r["rate"] for r in results if "rate" in r]
    return statistics.median(rates) if rates else None


def _rows(b: Bench, n: int, runs: dict[str, list[dict[str, Any]]],
          checkouts: dict[str, Path | None]) -> None:
    sickle = _median_rate(runs.get("sickle", []))
    if sickle is None:
        b.add(Row("7", "Sickle fetch + parse", "n/a", "no run"))
        return
    b.add(Row("7", f"Sickle ListRecords fetch + parse, {n:,} rec (peer)", _fmt_rate(sickle),
              "median of " + ", ".join(_fmt_rate(r["rate"]) for r in runs["sickle"]),
              values={"runs": runs["sickle"]}))
    floors = [r["seconds"] for r in runs.get("floor", [])]
    floor_run: dict[str, float] | None = None
    if floors:
        floor = statistics.median(floors)
        floor_run = {"seconds": floor,
                     "cpu": statistics.median(r["cpu"] for r in runs["floor"])}
        sickle_seconds = n / sickle
        left = sickle_seconds - floor
        need = f"{n / left:,.0f} rec/s ({n / left / sickle:.1f}x Sickle's rate)" if left > 0 \
            else "impossible"
        b.add(Row("7", f"CLI floor: harvest of {FLOOR_RECORDS} records (one page) -> sqlite",
                  f"{floor:.2f} s", "runs " + ", ".join(f"{x:.2f} s" for x in floors)
                  + f"; for 1.0x at {n:,} records the rest must reach {need}",
                  values={"runs": runs["floor"], "seconds": floor}))
    targets = {"sqlite": 1.0, "postgres": 0.8}
    for who in checkouts:
        for engine, target in targets.items():
            for kind in ("first", "unchanged"):
                results = runs.get(f"{who}-{engine}-{kind}", [])
                rate = _median_rate(results)
                label = (f"CLI harvest ({who}), {n:,} rec -> {engine}, "
                         f"{'first harvest' if kind == 'first' else 'full again, all unchanged'}")
                if rate is None:
                    errors = runs.get(f"{who}-{engine}", [{}])
                    b.add(Row("7", label, "n/a", f"error: {errors[-1].get('error', '?')[:200]}"))
                    continue
                ratio = rate / sickle
                same = all(r["same"] for r in results)
                values: dict[str, Any] = {"runs": results, "ratio": ratio}
                bound = ""
                if floor_run is not None and all("cpu" in r for r in results):
                    cores = os.cpu_count() or 1
                    values["cpu"] = statistics.median(r["cpu"] for r in results)
                    values["ceiling"] = ceiling(n / sickle, floor_run, values["cpu"], cores)
                    bound = (f"; {values['cpu']:.1f} CPU s, so at best "
                             f"{values['ceiling']:.2f}x with all of it after the floor "
                             f"spread over {cores} cores")
                row = Row("7", label, _fmt_rate(rate),
                          f"{ratio:.2f}x Sickle; runs "
                          + ", ".join(f"{r['seconds']:.1f} s" for r in results)
                          + ("; store matches the data set" if same else "; STORE DIFFERS")
                          + bound,
                          values=values)
                if who == "ours" and kind == "first":
                    row.target = f">= {target:.1f}x Sickle"
                    row.ok = "ok" if ratio >= target and same else "MISS"
                b.add(row)
