"""Case 7: the whole harvest through the CLI against Sickle's bare fetch + parse loop.

`oaipmh-dagster harvest ID` runs as users run it (a fresh process: imports, the Dagster
job on an instance of its own, fetch, parse, transform, store), into SQLite and into
PostgreSQL, and is timed from process start to exit; Sickle's `ListRecords` loop over
the same pages touches every record in a process of its own (its import not counted).
Runs are interleaved (Sickle, SQLite, PostgreSQL, ...; with a baseline, each checkout
goes first in every other repeat) and the median of each is reported. A second, full harvest of the same store (every record unchanged) measures the
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
# #26 restated #16's targets (1.0x and 0.8x at 60,000) at 500,000 records, where the CLI's
# fixed start-up no longer dominates.
TARGETS = {"sqlite": 0.8, "postgres": 0.7}


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


def postgres_cpu() -> float | None:
    """CPU seconds the PostgreSQL server of this machine has used so far: every live
    `postgres` process's own, plus what the postmaster collected of its exited children
    (each connection's backend ends with the CLI). None when no server runs here."""
    tick = os.sysconf("SC_CLK_TCK")
    procs: dict[int, tuple[int, list[str]]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:]
        if name.startswith("postgres"):
            fields = rest.split()
            procs[int(entry.name)] = (int(fields[1]), fields)
    if not procs:
        return None
    total = 0
    for ppid, fields in procs.values():
        total += int(fields[11]) + int(fields[12])  # utime, stime
        if ppid not in procs:  # the postmaster: its reaped children's time
            total += int(fields[13]) + int(fields[14])
    return total / tick


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
        postgres = db_url.startswith("postgresql")
        pg_before = postgres_cpu() if postgres else None
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run(args, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                              timeout=3600)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        pg_after = postgres_cpu() if postgres else None
    if proc.returncode != 0:
        raise RuntimeError(f"harvest through the CLI exited with {proc.returncode} (log {log})")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    stored = b.child("stored", {"db": db_url, "id": HARVESTER})
    result = {"seconds": wall, "cpu": cpu, **stored}
    if pg_before is not None and pg_after is not None:
        result["db_cpu"] = pg_after - pg_before
    return result


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
        # ours and the baseline take turns going first, so order effects (the page
        # cache, PostgreSQL's background work after a run) fall on both sides
        order = list(checkouts.items())
        for who, checkout in order if i % 2 == 0 else order[::-1]:
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


def _cpu_bill(n: int, results: list[dict[str, Any]], values: dict[str, Any]) -> str:
    """CPU seconds per 1,000 records of the whole path: the CLI process (start-up
    included) and, on PostgreSQL, the database server's own."""
    if not all("cpu" in r for r in results):
        return ""
    cli = statistics.median(r["cpu"] for r in results) / n * 1000
    values["cpu_per_1000"] = cli
    text = f"; CPU per 1,000 records {cli:.3f} s"
    if all("db_cpu" in r for r in results):
        db = statistics.median(r["db_cpu"] for r in results) / n * 1000
        values["db_cpu_per_1000"] = db
        text += f" + {db:.3f} s in the PostgreSQL server = {cli + db:.3f} s"
    return text


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
    sickle_cpu = [r["cpu"] / r["records"] * 1000 for r in runs["sickle"] if r.get("cpu")]
    if sickle_cpu:
        b.add(Row("7", "Sickle, CPU s per 1,000 records (peer)",
                  f"{statistics.median(sickle_cpu):.3f} s",
                  "its process alone; runs " + ", ".join(f"{x:.3f}" for x in sickle_cpu),
                  values={"cpu_per_1000": statistics.median(sickle_cpu)}))
    targets = TARGETS
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
                bound += _cpu_bill(n, results, values)
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
