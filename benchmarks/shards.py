"""Case 6: sharded code locations. For N harvesters over K = ceil(N / per_shard) code
locations (`oaipmh-dagster workspace --shards K`), a real `dagster-webserver`: start to
all locations loaded, every job and schedule listed once, add-to-visible latency of one
new harvester (only its shard reloads), RSS of the code servers and the webserver; in
child processes: the repository snapshot of one shard and one scheduler daemon
iteration over all N running schedules."""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from benchmarks.cases import RELOAD_MUTATION, ROOT, Bench, Row, _end_group, _free_port, _gql

JOB_PREFIX = "harvest_oaipmh_records_"
REPOSITORY = "__repository__"
ADD_TARGET = 10.0  # seconds from `harvester add` to the job listed
NEW_ID = "bench_new_harvester"

ENTRIES_QUERY = """
{ workspaceOrError { __typename ... on Workspace { locationEntries { name loadStatus
  updatedTimestamp locationOrLoadError { __typename ... on PythonError { message } } } } } }
"""
LISTING_QUERY = """
{ repositoriesOrError { __typename ... on RepositoryConnection { nodes { name
  location { name } jobs { name } schedules { name } } } } }
"""
REPOSITORY_JOBS_QUERY = """
query Jobs($sel: RepositorySelector!) { repositoryOrError(repositorySelector: $sel) {
  __typename ... on Repository { jobs { name } } } }
"""


def shard_count(n: int, per_shard: int) -> int:
    """K = ceil(N / per_shard), at least 1."""
    return max(1, math.ceil(n / per_shard))


def _entries(url: str) -> dict[str, dict[str, Any]]:
    data = _gql(url, ENTRIES_QUERY, timeout=30)["workspaceOrError"]
    return {e["name"]: e for e in data.get("locationEntries") or []}


def _wait_all_loaded(url: str, proc: subprocess.Popen, k: int,
                     deadline: float) -> dict[str, dict[str, Any]]:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"dagster-webserver exited with {proc.returncode}")
        try:
            entries = _entries(url)
        except (httpx.HTTPError, RuntimeError, ValueError):
            entries = {}
        if len(entries) == k and all(e["loadStatus"] == "LOADED" for e in entries.values()):
            failed = [n for n, e in entries.items()
                      if (e["locationOrLoadError"] or {}).get("__typename") == "PythonError"]
            if failed:
                raise RuntimeError(f"code location(s) failed to load: {', '.join(failed)}")
            return entries
        time.sleep(0.2)
    raise TimeoutError(f"the {k} code locations did not all load in time")


def _proc_stat(pid: int) -> tuple[int, int] | None:
    """(pgid, ppid) of a process, None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()
    return int(fields[2]), int(fields[1])


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (0 when it is gone)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return 0.0
    fields = text.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text(encoding="ascii").splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _group_rss(leader: int) -> dict[str, Any]:
    """RSS of the webserver (the group leader) and of its `dagster api grpc` code servers."""
    servers = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == leader:
            continue
        stat = _proc_stat(int(entry.name))
        if stat is None or stat[0] != leader:
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"api" in argv and b"grpc" in argv:
            servers.append(_rss_kib(int(entry.name)) * 1024)
    return {"webserver": _rss_kib(leader) * 1024, "code_servers": servers,
            "code_servers_max": max(servers, default=0), "code_servers_sum": sum(servers)}


def _listing(url: str, n_expected: int) -> dict[str, Any]:
    """Every harvester's job and schedule across locations: counts, duplicates."""
    nodes = _gql(url, LISTING_QUERY, timeout=600)["repositoriesOrError"].get("nodes") or []
    jobs: Counter[str] = Counter()
    schedules: Counter[str] = Counter()
    per_location: dict[str, int] = {}
    for node in nodes:
        names = [j["name"] for j in node["jobs"] if j["name"].startswith(JOB_PREFIX)]
        jobs.update(names)
        schedules.update(s["name"] for s in node["schedules"] if s["name"].startswith(JOB_PREFIX))
        per_location[node["location"]["name"]] = len(names)
    dup_jobs = sorted(n for n, c in jobs.items() if c > 1)
    dup_schedules = sorted(n for n, c in schedules.items() if c > 1)
    ok = (not dup_jobs and not dup_schedules and len(jobs) == n_expected
          and set(jobs) == set(schedules))
    return {"jobs": len(jobs), "schedules": len(schedules), "duplicate_jobs": dup_jobs[:10],
            "duplicate_schedules": dup_schedules[:10], "per_location": per_location, "ok": ok,
            "job_names": jobs}


def _add_to_visible(b: Bench, url: str, env: dict[str, str], holder: str,
                    proc: subprocess.Popen, tag: str) -> dict[str, Any]:
    """`oaipmh-dagster harvester add` of one new harvester until its job is listed."""
    before = {n: e["updatedTimestamp"] for n, e in _entries(url).items()}
    cpu0 = _cpu_seconds(proc.pid)
    exe = Path(sys.executable).with_name("oaipmh-dagster")
    sel = {"repositoryLocationName": holder, "repositoryName": REPOSITORY}
    log = (b.logs / f"shards-add-{tag}.log").open("w", encoding="utf-8")
    t0 = time.monotonic()
    cli = subprocess.Popen([str(exe), "harvester", "add", NEW_ID, "--url",
                            "http://127.0.0.1:9/oai", "--prefix", "oai_dc", "--cron",
                            "17 3 * * *", "--no-check"], cwd=ROOT, env=env, stdout=log,
                           stderr=subprocess.STDOUT, start_new_session=True)
    visible = cli_seconds = None
    try:
        while time.monotonic() - t0 < 600:
            if proc.poll() is not None:
                raise RuntimeError(f"dagster-webserver exited with {proc.returncode}")
            if cli_seconds is None and cli.poll() is not None:
                cli_seconds = time.monotonic() - t0
            with contextlib.suppress(httpx.HTTPError, RuntimeError, ValueError):
                repo = _gql(url, REPOSITORY_JOBS_QUERY, {"sel": sel}, timeout=60)
                names = {j["name"] for j in repo["repositoryOrError"].get("jobs") or []}
                if JOB_PREFIX + NEW_ID in names:
                    visible = time.monotonic() - t0
                    break
            time.sleep(0.2)
        if visible is None:
            raise TimeoutError(f"job {JOB_PREFIX + NEW_ID} never appeared in {holder}")
        cli.wait(600)
        if cli_seconds is None:
            cli_seconds = time.monotonic() - t0
    finally:
        _end_group(cli)
        log.close()
    if cli.returncode != 0:
        raise RuntimeError(f"harvester add exited with {cli.returncode} (log {log.name})")
    webserver_cpu = _cpu_seconds(proc.pid) - cpu0
    after = {n: e["updatedTimestamp"] for n, e in _entries(url).items()}
    reloaded = sorted(n for n in after if after[n] != before.get(n))
    # The reload alone (what the CLI waits for after writing the row), for the breakdown.
    t1 = time.monotonic()
    res = _gql(url, RELOAD_MUTATION, {"name": holder}, timeout=600)["reloadRepositoryLocation"]
    if res.get("__typename") != "WorkspaceLocationEntry":
        raise RuntimeError(f"reload of {holder} failed: {res}")
    return {"seconds": visible, "cli_seconds": cli_seconds, "holder": holder,
            "reloaded": reloaded, "only_holder": reloaded == [holder],
            "reload_seconds": time.monotonic() - t1, "webserver_cpu": webserver_cpu}


def _webserver(b: Bench, n: int, k: int) -> dict[str, Any]:
    """Start a webserver over K locations of N harvesters and measure it."""
    from oaipmh_dagster.operations.shards import DEFAULT_LOCATION, Shard, shard_of

    work = b.tmp / f"shards-{n}-{k}"
    home = work / "home"
    home.mkdir(parents=True)
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n", encoding="utf-8")
    db_url = f"sqlite:///{work / 'registry.sqlite'}"
    filled = b.child("registry", {"db": db_url, "n": n}, timeout=1800)
    env = {**os.environ, "DAGSTER_HOME": str(home), "OAIPMH_DATABASE_URL": db_url}
    cli = Path(sys.executable).with_name("oaipmh-dagster")
    workspace = work / "workspace.yaml"
    workspace.write_text(subprocess.run(
        [str(cli), "workspace", "--shards", str(k)], cwd=ROOT, env=env, check=True,
        capture_output=True, text=True, timeout=120).stdout, encoding="utf-8")
    port = _free_port()
    url = f"http://127.0.0.1:{port}/graphql"
    env["OAIPMH_DAGSTER_WEBSERVER"] = f"http://127.0.0.1:{port}"
    exe = Path(sys.executable).with_name("dagster-webserver")
    log = (b.logs / f"webserver-shards-{n}-{k}.log").open("w", encoding="utf-8")
    t0 = time.monotonic()
    proc = subprocess.Popen([str(exe), "-h", "127.0.0.1", "-p", str(port), "-w",
                             str(workspace)], cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_all_loaded(url, proc, k, t0 + 1800)
        out: dict[str, Any] = {"n": n, "k": k, "registry": filled,
                               "startup_seconds": time.monotonic() - t0,
                               "webserver_cpu_at_loaded": _cpu_seconds(proc.pid)}
        listing = _listing(url, n)
        listing.pop("job_names")
        out["listing"] = listing
        out["rss"] = _group_rss(proc.pid)
        out["webserver_cpu_before_add"] = _cpu_seconds(proc.pid)
        holder = (Shard(shard_of(NEW_ID, k), k).location_name() if k > 1
                  else DEFAULT_LOCATION)
        out["add"] = _add_to_visible(b, url, env, holder, proc, f"{n}-{k}")
        again = _listing(url, n + 1)
        out["add"]["listed_once"] = again["job_names"].get(JOB_PREFIX + NEW_ID) == 1
        return out
    finally:
        _end_group(proc)
        log.close()


def _mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


def _kib(n: float) -> str:
    return f"{n / 1024:,.1f} KiB"


def _scheduler(b: Bench, n: int, k: int) -> dict[str, Any]:
    """One scheduler daemon iteration over the K locations in a child process."""
    work = b.tmp / f"shards-sched-{n}-{k}"
    home = work / "home"
    home.mkdir(parents=True)
    # The shipped instance settings (queued run coordinator, so a due tick only queues).
    (home / "dagster.yaml").write_text((ROOT / "dagster.yaml").read_text(encoding="utf-8"),
                                       encoding="utf-8")
    db_url = f"sqlite:///{work / 'registry.sqlite'}"
    b.child("registry", {"db": db_url, "n": n}, timeout=1800)
    from oaipmh_dagster.operations.shards import workspace_yaml
    from oaipmh_dagster.storage import db
    from oaipmh_dagster.storage.registry import SHARDS_SETTING, Registry

    Registry(db.get_engine(db_url)).set_setting(SHARDS_SETTING, str(k))  # as `workspace`
    workspace = work / "workspace.yaml"
    workspace.write_text(workspace_yaml(k), encoding="utf-8")
    return b.child("scheduler", {"workspace": str(workspace)}, timeout=3600,
                   env={"DAGSTER_HOME": str(home), "OAIPMH_DATABASE_URL": db_url})


def _rows_webserver(b: Bench, r: dict[str, Any], base: dict[str, Any] | None) -> None:
    n, k = r["n"], r["k"]
    label = f"N={n:,}, K={k}"
    compare = ""
    if base is not None and base is not r:
        compare = (f"K=1 at N={base['n']:,}: {base['startup_seconds']:.1f} s")
    b.add(Row("6", f"webserver start to all locations LOADED, {label}",
              f"{r['startup_seconds']:.1f} s", compare,
              values={"n": n, "k": k, "seconds": r["startup_seconds"]}))
    lst = r["listing"]
    sizes = sorted(lst["per_location"].values())
    b.add(Row("6", f"jobs and schedules listed once across locations, {label}",
              f"{lst['jobs']:,} jobs, {lst['schedules']:,} schedules",
              f"per location {sizes[0]}-{sizes[-1]} harvesters; duplicates: "
              f"{len(lst['duplicate_jobs']) + len(lst['duplicate_schedules'])}",
              f"== {n:,}, none twice", "ok" if lst["ok"] else "MISS",
              values={"n": n, "k": k, **lst}))
    add = r["add"]
    ok = add["seconds"] <= ADD_TARGET and add["only_holder"] and add["listed_once"]
    others = [x for x in add["reloaded"] if x != add["holder"]]
    compare = (f"CLI exited after {add['cli_seconds']:.1f} s; a GraphQL reload of that "
               f"location alone {add['reload_seconds']:.1f} s; webserver CPU during the add "
               f"{add.get('webserver_cpu', 0):.1f} s; reloaded: "
               + ("only the holding location" if add["only_holder"]
                  else f"{len(add['reloaded'])} locations ({len(others)} others)"))
    if base is not None and base is not r:
        compare += f"; K=1 at N={base['n']:,}: {base['add']['seconds']:.1f} s"
    b.add(Row("6", f"harvester add to job listed, {label}", f"{add['seconds']:.1f} s", compare,
              f"<= {ADD_TARGET:.0f} s, one location reloaded", "ok" if ok else "MISS",
              values={"n": n, "k": k, **add}))
    rss = r["rss"]
    b.add(Row("6", f"RSS, {label}",
              f"code servers max {_mib(rss['code_servers_max'])}, "
              f"sum {_mib(rss['code_servers_sum'])}",
              f"{len(rss['code_servers'])} code servers; webserver {_mib(rss['webserver'])}",
              values={"n": n, "k": k, **rss}))


def _rows_snapshot(b: Bench, n: int, k: int, s: dict[str, Any]) -> None:
    b.add(Row("6", f"repository snapshot of one shard, N={n:,}, K={k}",
              f"{_kib(s['bytes'])} ({s['harvesters']} harvesters, "
              f"{_kib(s['bytes'] / max(1, s['harvesters']))} each)",
              f"{s['cpu_seconds']:.2f} CPU s, {s['per_job_ms']:.2f} ms per job; one job "
              f"snapshot {_kib(s['job_bytes'])} ({s['job_cpu_seconds'] * 1000:.0f} ms CPU)",
              values={"n": n, "k": k, **s}))


def _rows_scheduler(b: Bench, n: int, k: int, s: dict[str, Any]) -> None:
    first, restart, steady = s["iterations"]
    queued = [it.get("runs_after", s["runs"]) for it in s["iterations"]]
    ticks = [queued[0], queued[1] - queued[0], queued[2] - queued[1]]
    due = ("crons not due" if not s["runs"] else
           f"due ticks queued runs: {ticks[0]} / {ticks[1]} / {ticks[2]} "
           "(first / restart / steady)")
    b.add(Row("6", f"scheduler iteration, {s['running']:,} RUNNING schedules, N={n:,}, K={k}",
              f"{steady['seconds']:.2f} s steady ({steady['cpu']:.2f} CPU s)",
              f"daemon restart {restart['seconds']:.1f} s ({restart['cpu']:.1f} CPU s); "
              f"first ever (stores the states) {first['seconds']:.1f} s; workspace load "
              f"{s['load_seconds']:.1f} s; {due}",
              values={"n": n, "k": k, **s}))


def case_shards(b: Bench) -> None:
    sizes = b.sizes
    per = sizes.per_shard
    out: dict[str, Any] = {"per_shard": per, "runs": {}}
    b.raw["shards"] = out
    base: dict[str, Any] | None = None
    try:
        base = _webserver(b, sizes.shard_baseline, 1)
        out["runs"][f"{sizes.shard_baseline}/1"] = base
        _rows_webserver(b, base, None)
    except Exception as exc:  # noqa: BLE001 - report, go on
        out["runs"][f"{sizes.shard_baseline}/1"] = {"error": str(exc)}
        b.add(Row("6", f"N={sizes.shard_baseline:,}, K=1", "n/a",
                  f"error: {str(exc).splitlines()[0]}"))
    for n in sizes.shard_sizes:
        k = shard_count(n, per)
        out["runs"][f"{n}/{k}"] = _one_size(b, n, k, base)


def _snapshot(b: Bench, n: int, k: int) -> dict[str, Any]:
    return b.child("shard_snapshot", {"n": n, "k": k, "index": 0})


def _one_size(b: Bench, n: int, k: int, base: dict[str, Any] | None) -> dict[str, Any]:
    """Webserver, snapshot and scheduler measurements of N harvesters over K locations;
    a failed step becomes an error row and the next one runs."""
    run: dict[str, Any] = {}
    steps: tuple[tuple[str, Any], ...] = (("webserver", _webserver), ("snapshot", _snapshot))
    if b.sizes.shard_scheduler:
        steps = (*steps, ("scheduler", _scheduler))
    for name, step in steps:
        b.echo(f"  6 N={n:,} K={k}: {name} ...")
        try:
            result = run[name] = step(b, n, k)
        except Exception as exc:  # noqa: BLE001 - report, go on
            run[name] = {"error": str(exc)}
            b.add(Row("6", f"{name}, N={n:,}, K={k}", "n/a",
                      f"error: {str(exc).splitlines()[0]}"))
            continue
        if name == "webserver":
            _rows_webserver(b, result, base)
        elif name == "snapshot":
            _rows_snapshot(b, n, k, result)
        else:
            _rows_scheduler(b, n, k, result)
    return run
