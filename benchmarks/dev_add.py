"""Case 11: add-to-visible in a real deployment. `dagster dev` (webserver, daemon with
its scheduler and sensors, one proxy code server per location) on 127.0.0.1 over the
workspace of K shards of N harvesters, a `DAGSTER_HOME` of its own (the shipped
instance file); once every location is loaded, the daemon's first pass over the new
deployment is done (one freshness state recorded per asset, a few minutes at 3,000
harvesters on SQLite: a running deployment is past it) and the daemon has settled, each of
three new harvesters is added with `oaipmh-dagster harvester add` (through
`benchmarks.timed_cli`) and timed until the webserver's GraphQL lists its job. Each add
is split into the CLI's start, the registry write, the reload request, the location
load (the reload mutation) and the first listing, with the CPU seconds each process of
`dagster dev` spent meanwhile (and, for comparison, while idle)."""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.cases import ROOT, Bench, Row, _end_group, _free_port, _gql
from benchmarks.shards import (
    JOB_PREFIX,
    REPOSITORY,
    REPOSITORY_JOBS_QUERY,
    _cpu_seconds,
    _entries,
    _proc_stat,
    _wait_all_loaded,
    shard_count,
)

TARGET = 10.0
NEW_IDS = ("bench_dev_new_a", "bench_dev_new_b", "bench_dev_new_c")
STEADY = 0.25  # settled: the group's CPU rate within 25% of the window before
GAP = 20.0
ASSETS_PER = 3  # source, raw_records, records per harvester  # seconds between two adds (the reload's aftermath done)
PARTS = ("cli_start", "registry_write", "reload_request", "location_load", "listing")
HOME_EXTRA = """
code_servers:
  local_startup_timeout: 1800
  reload_timeout: 900
"""
DAEMON_QUERY = """
{ instance { daemonHealth { allDaemonStatuses { daemonType healthy required } } } }
"""


def _role(argv: list[bytes]) -> str:
    text = b" ".join(argv)
    for needle, role in ((b"dagster_webserver", "webserver"), (b"dagster._daemon", "daemon"),
                         (b"code-server", "proxy"), (b"api grpc", "code_server"),
                         (b"dagster dev", "dev"), (b"bin/dagster", "dev")):
        if needle in text:
            return role
    return "other"


def _group(leader: int) -> dict[int, tuple[str, float]]:
    """Role and CPU seconds of every process in `dagster dev`'s process group."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        stat = _proc_stat(pid)
        if stat is None or stat[0] != leader:
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        out[pid] = (_role(argv), _cpu_seconds(pid))
    return out


def _cpu_delta(before: dict[int, tuple[str, float]],
               after: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds per role between two `_group` snapshots (new processes from 0)."""
    roles: dict[str, float] = {}
    for pid, (role, cpu) in after.items():
        roles[role] = roles.get(role, 0.0) + cpu - before.get(pid, (role, 0.0))[1]
    return {r: round(v, 2) for r, v in sorted(roles.items())}


def _window(leader: int, seconds: float) -> dict[str, float]:
    before = _group(leader)
    time.sleep(seconds)
    return _cpu_delta(before, _group(leader))


def _settle(leader: int, window: float, limit: float) -> dict[str, Any]:
    """Wait (at most `limit` s) until the group's CPU rate over `window` s stays within
    STEADY of the window before (the daemon's first iterations done); the last window's
    rate (cores) and CPU seconds per role."""
    t0 = time.monotonic()
    last = None
    while True:
        roles = _window(leader, window)
        rate = sum(roles.values()) / window
        steady = last is not None and abs(rate - last) <= STEADY * max(last, 0.1)
        if steady or time.monotonic() - t0 > limit:
            return {"seconds": time.monotonic() - t0, "cores": rate, "roles": roles,
                    "window": window, "settled": steady}
        last = rate


def _freshness_events(home: Path) -> int:
    """FRESHNESS_STATE_CHANGE events in the instance's SQLite event log (the shipped
    dagster.yaml keeps it under `$DAGSTER_HOME/history/runs/index.db`)."""
    import sqlite3

    path = home / "history" / "runs" / "index.db"
    if not path.exists():
        return 0
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)) as c:
        row = c.execute("SELECT count(*) FROM event_logs WHERE dagster_event_type = "
                        "'FRESHNESS_STATE_CHANGE'").fetchone()
    return int(row[0])


def _first_passes(home: Path, assets: int, limit: float) -> dict[str, Any]:
    """Wait (at most `limit` s) for the daemon's first pass over a new deployment: its
    freshness daemon records one state per asset (`assets` of them) once, each in a
    transaction of its own, and the scheduler writes each schedule's first checkpoint.
    A deployment that has run for a while is past it; an add made during it competes
    with thousands of writes. Seconds waited and the states recorded."""
    t0 = time.monotonic()
    count = 0
    while time.monotonic() - t0 < limit:
        with contextlib.suppress(Exception):
            count = _freshness_events(home)
        if count >= assets:
            break
        time.sleep(5)
    return {"seconds": time.monotonic() - t0, "freshness_states": count,
            "assets": assets, "done": count >= assets}


def _daemon_healthy(url: str, deadline: float) -> list[str]:
    """The daemon types reported healthy once the scheduler and the sensor daemon are."""
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, RuntimeError, ValueError, KeyError):
            data = _gql(url, DAEMON_QUERY, timeout=30)["instance"]["daemonHealth"]
            healthy = [d["daemonType"] for d in data["allDaemonStatuses"] if d["healthy"]]
            if {"SCHEDULER", "SENSOR"} <= set(healthy):
                return sorted(healthy)
        time.sleep(1)
    raise TimeoutError("the daemon's scheduler and sensor daemon never reported healthy")


def _listed(url: str, holder: str, job: str) -> bool:
    sel = {"repositoryLocationName": holder, "repositoryName": REPOSITORY}
    with contextlib.suppress(httpx.HTTPError, RuntimeError, ValueError):
        repo = _gql(url, REPOSITORY_JOBS_QUERY, {"sel": sel}, timeout=60)
        return job in {j["name"] for j in repo["repositoryOrError"].get("jobs") or []}
    return False


def _parts(t0: float, marks: dict[str, Any], visible: float) -> dict[str, float]:
    """The add split at the CLI's marks (seconds)."""
    requests = marks.get("requests") or []
    reload = next((r for r in requests if r[0] == "reload" and len(r) == 3), None)
    if reload is None or "written" not in marks:
        return {}
    return {"cli_start": marks["imported"] - t0,
            "registry_write": marks["written"] - marks["hooked"],
            "reload_request": reload[1] - marks["written"],
            "location_load": reload[2] - reload[1],
            "listing": t0 + visible - reload[2],
            "hook_import": marks["hooked"] - marks["imported"],
            "cli_exit": marks["done"] - t0, "cli_cpu": marks["cpu"]}


def _add(b: Bench, url: str, env: dict[str, str], leader: int, new_id: str, k: int,
         tag: str) -> dict[str, Any]:
    """Add `new_id` through the CLI and time it until its job is listed."""
    from oaipmh_dagster.operations.shards import DEFAULT_LOCATION, Shard, shard_of

    holder = Shard(shard_of(new_id, k), k).location_name() if k > 1 else DEFAULT_LOCATION
    job = JOB_PREFIX + new_id
    stamps = {n: e["updatedTimestamp"] for n, e in _entries(url).items()}
    marks_file = b.tmp / f"marks-{tag}.json"
    log = (b.logs / f"dev-add-{tag}.log").open("w", encoding="utf-8")
    cpu0 = _group(leader)
    t0 = time.monotonic()
    cli = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.timed_cli", str(marks_file), "harvester", "add",
         new_id, "--url", "http://127.0.0.1:9/oai", "--prefix", "oai_dc", "--cron",
         "17 3 * * *", "--no-check"], cwd=ROOT, env=env, stdout=log,
        stderr=subprocess.STDOUT, start_new_session=True)
    visible = None
    try:
        while time.monotonic() - t0 < 600:
            if _listed(url, holder, job):
                visible = time.monotonic() - t0
                break
            time.sleep(0.2)
        cli.wait(600)
    finally:
        _end_group(cli)
        log.close()
    roles = _cpu_delta(cpu0, _group(leader))
    if visible is None:
        raise TimeoutError(f"job {job} never appeared in {holder}")
    marks = json.loads(marks_file.read_text(encoding="utf-8"))
    if marks.get("exit") != 0:
        raise RuntimeError(f"harvester add exited with {marks.get('exit')} (log {log.name})")
    after = {n: e["updatedTimestamp"] for n, e in _entries(url).items()}
    reloaded = sorted(n for n in after if after[n] != stamps.get(n))
    return {"id": new_id, "holder": holder, "seconds": visible,
            "parts": _parts(t0, marks, visible), "cpu": roles, "reloaded": reloaded,
            "only_holder": reloaded == [holder], "cli_modules": marks.get("modules")}


def _start(b: Bench, n: int, k: int) -> tuple[Path, dict[str, str]]:
    """A registry of N harvesters (crons 12 hours away: no tick is due while measuring),
    a workspace of K shards and a `DAGSTER_HOME` of their own."""
    work = b.tmp / f"dev-{n}-{k}"
    home = work / "home"
    home.mkdir(parents=True)
    shipped = (ROOT / "dagster.yaml").read_text(encoding="utf-8")
    (home / "dagster.yaml").write_text(shipped + HOME_EXTRA, encoding="utf-8")
    db_url = f"sqlite:///{work / 'registry.sqlite'}"
    hour = (time.gmtime().tm_hour + 12) % 24
    b.child("registry", {"db": db_url, "n": n, "hour": hour}, timeout=1800)
    env = {**os.environ, "DAGSTER_HOME": str(home), "OAIPMH_DATABASE_URL": db_url}
    cli = Path(sys.executable).with_name("oaipmh-dagster")
    workspace = work / "workspace.yaml"
    workspace.write_text(subprocess.run(
        [str(cli), "workspace", "--shards", str(k)], cwd=ROOT, env=env, check=True,
        capture_output=True, text=True, timeout=120).stdout, encoding="utf-8")
    return workspace, env


def _dev(b: Bench, n: int, k: int) -> dict[str, Any]:
    """`dagster dev` over K locations of N harvesters, three adds timed."""
    workspace, env = _start(b, n, k)
    port = _free_port()
    url = f"http://127.0.0.1:{port}/graphql"
    env["OAIPMH_DAGSTER_WEBSERVER"] = f"http://127.0.0.1:{port}"
    exe = Path(sys.executable).with_name("dagster")
    log = (b.logs / f"dev-{n}-{k}.log").open("w", encoding="utf-8")
    t0 = time.monotonic()
    proc = subprocess.Popen([str(exe), "dev", "-h", "127.0.0.1", "-p", str(port), "-w",
                             str(workspace)], cwd=workspace.parent, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_all_loaded(url, proc, k, t0 + 3600)
        out: dict[str, Any] = {"n": n, "k": k, "startup_seconds": time.monotonic() - t0}
        out["daemons"] = _daemon_healthy(url, time.monotonic() + 1800)
        out["first_pass"] = _first_passes(Path(env["DAGSTER_HOME"]), ASSETS_PER * n, 3600)
        # 60 s windows: the daemon refreshes every location's snapshot once a minute.
        out["settle"] = _settle(proc.pid, 60.0, 900)
        out["load"] = os.getloadavg()
        adds = []
        for i, new_id in enumerate(NEW_IDS):
            if i:
                time.sleep(GAP)
            b.echo(f"  11 N={n:,} K={k}: add {new_id} ...")
            adds.append(_add(b, url, env, proc.pid, new_id, k, f"{n}-{k}-{i}"))
        out["adds"] = adds
        out["load_after"] = os.getloadavg()
        return out
    finally:
        _end_group(proc)
        log.close()


def _median(adds: list[dict[str, Any]], key: str) -> float:
    return statistics.median(a["parts"].get(key, float("nan")) for a in adds)


def _rows(b: Bench, r: dict[str, Any]) -> None:
    n, k, adds = r["n"], r["k"], r["adds"]
    label = f"N={n:,}, K={k}"
    settle, first = r["settle"], r["first_pass"]
    idle = ", ".join(f"{role} {cpu / settle['window']:.2f}" for role, cpu in
                     settle["roles"].items() if cpu)
    b.add(Row("11", f"dagster dev start to all LOADED, {label}",
              f"{r['startup_seconds']:.0f} s",
              f"daemon's first pass {first['seconds']:.0f} s ({first['freshness_states']:,} "
              f"freshness states of {first['assets']:,} assets), then settled "
              f"{settle['seconds']:.0f} s later; idle cores by process: "
              f"{idle}; load average {r['load'][0]:.1f}", values=r))
    times = [a["seconds"] for a in adds]
    median = statistics.median(times)
    ok = median <= TARGET and all(a["only_holder"] for a in adds)
    parts = "; ".join(f"{p.replace('_', ' ')} {_median(adds, p):.1f}" for p in PARTS)
    roles: dict[str, list[float]] = {}
    for a in adds:
        for role, cpu in a["cpu"].items():
            roles.setdefault(role, []).append(cpu)
    cpu = ", ".join(f"{role} {statistics.median(v):.1f}" for role, v in sorted(roles.items()))
    b.add(Row("11", f"harvester add to job listed under dagster dev, {label}",
              f"{median:.1f} s (median of {len(times)}: "
              + ", ".join(f"{t:.1f}" for t in times) + ")",
              f"{parts} s; CPU s meanwhile: {cpu}, CLI {_median(adds, 'cli_cpu'):.1f}; "
              f"reloaded only the holder: {all(a['only_holder'] for a in adds)}; load "
              f"average {r['load'][0]:.1f} before, {r['load_after'][0]:.1f} after",
              f"<= {TARGET:.0f} s", "ok" if ok else "MISS"))


def case_dev_add(b: Bench) -> None:
    sizes = b.sizes
    out: dict[str, Any] = {}
    b.raw["dev_add"] = out
    for n in sizes.dev_sizes:
        k = sizes.dev_shards.get(n) or shard_count(n, sizes.per_shard)
        b.echo(f"  11 N={n:,} K={k}: dagster dev ...")
        try:
            result = out[f"{n}/{k}"] = _dev(b, n, k)
        except Exception as exc:  # noqa: BLE001 - report, go on
            out[f"{n}/{k}"] = {"error": str(exc)}
            b.add(Row("11", f"dagster dev, N={n:,}, K={k}", "n/a",
                      f"error: {str(exc).splitlines()[0]}"))
            continue
        _rows(b, result)
