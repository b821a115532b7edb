"""Case 9: where the time goes on each road a harvest takes, as profiles kept in the
repository (`benchmarks/results/profiles/`, the one part of results/ under version
control), so that a change's effect on the top costs can be read in its diff.

Four profiles of the same 20,000 `oai_dc` records from the benchmark server, each in a
fresh process, with pyinstrument (wall clock; the main thread, where the harvest loop,
parsing of pages when prefetch is off, transforms and Dagster's events run):

- `harvest-sqlite.txt` and `harvest-postgresql.txt`: `harvest()` into a fresh store,
  prefetch off so fetch, parse, transform and store all show on the profiled thread
  (plus cProfile by this thread's CPU clock);
- `job-sqlite.txt`: the harvester's Dagster job through `execute_in_process` on a
  temporary instance, as the code location runs it (prefetch and the committer on);
- `cli-sqlite.txt`: `oaipmh-dagster harvest ID` as users run it, from interpreter start
  (imports, the instance, the run, the harvest, the summary)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from benchmarks.cases import ROOT, Bench, Row, postgres_database


def _cli_profile(b: Bench, url: str, out: Path) -> float:
    """pyinstrument over a whole `oaipmh-dagster harvest` process; its wall seconds."""
    import time

    home = b.tmp / "profile-cli-home"
    home.mkdir(parents=True, exist_ok=True)
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n", encoding="utf-8")
    env = {**os.environ, "DAGSTER_HOME": str(home),
           "OAIPMH_DATABASE_URL": b.sqlite_url("profile-cli")}
    cli = str(Path(sys.executable).with_name("oaipmh-dagster"))
    subprocess.run([cli, "harvester", "add", "profile_cli", "--url", url, "--prefix",
                    "oai_dc", "--no-check"], env=env, cwd=ROOT, check=True,
                   capture_output=True, timeout=300)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pyinstrument", "--interval", "0.0005",
                    "--renderer", "text", "--outfile", str(out), cli, "harvest", "profile_cli"],
                   env=env, cwd=ROOT, check=True, capture_output=True, timeout=900)
    return time.perf_counter() - t0


def case_profiles(b: Bench) -> None:
    n = b.sizes.e2e_records
    PROFILES = b.results / "profiles"  # noqa: N806 - benchmarks/results/profiles by default
    srv = b.server(n)
    PROFILES.mkdir(parents=True, exist_ok=True)
    written = []
    r = b.child("profile", {"url": srv.url, "db": b.sqlite_url("p1"), "db2": b.sqlite_url("p2"),
                            "profile": str(PROFILES / "harvest-sqlite.txt")})
    written.append(("harvest() -> SQLite", "harvest-sqlite.txt", r["seconds"]))
    with postgres_database() as url1, postgres_database() as url2:
        r = b.child("profile", {"url": srv.url, "db": url1, "db2": url2,
                                "profile": str(PROFILES / "harvest-postgresql.txt")})
    written.append(("harvest() -> PostgreSQL", "harvest-postgresql.txt", r["seconds"]))
    home = b.tmp / "profile-job-home"
    home.mkdir(exist_ok=True)
    r = b.child("profile_job", {"url": srv.url, "db": b.sqlite_url("p3"),
                                "profile": str(PROFILES / "job-sqlite.txt")},
                env={"DAGSTER_HOME": str(home)})
    written.append(("job execute_in_process -> SQLite", "job-sqlite.txt", r["seconds"]))
    seconds = _cli_profile(b, srv.url, PROFILES / "cli-sqlite.txt")
    written.append(("oaipmh-dagster harvest -> SQLite", "cli-sqlite.txt", seconds))
    for label, name, secs in written:
        b.add(Row("9", f"profile: {label}, {n:,} rec",
                  os.path.relpath(PROFILES / name, ROOT), f"{secs:.2f} s under the profiler"))
