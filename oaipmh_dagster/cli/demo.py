"""`oaipmh-dagster demo`: the demo endpoint, the demo harvesters, one harvest, the UI."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from oaipmh_dagster.demo.dataset import make_dataset
from oaipmh_dagster.demo.invalid import add_invalid_records
from oaipmh_dagster.demo.server import OAIServer
from oaipmh_dagster.storage import db
from oaipmh_dagster.storage.registry import Harvester, HarvesterNotFound, Registry


def demo_harvesters(base_url: str) -> tuple[Harvester, ...]:
    """The harvesters the demo registers against its endpoint at ``base_url``."""
    return (
        Harvester(
            id="demo",
            base_url=base_url,
            metadata_prefix="oai_dc",
            cron="0 * * * *",
            name="Demo repository (Dublin Core)",
            schema="oai_dc",
        ),
        Harvester(
            id="demo_datacite",
            base_url=base_url,
            metadata_prefix="datacite",
            sets=("datasets",),
            cron="30 2 * * *",
            name="Demo repository, datasets (DataCite)",
            enabled=False,
        ),
    )


INSTANCE_YAML = """# Written by `oaipmh-dagster demo`: the repository's dagster.yaml without its
# comments (SQLite storage under this directory, the run queue's limits, host pools).
run_coordinator:
  module: dagster.core.run_coordinator
  class: QueuedRunCoordinator
concurrency:
  runs:
    max_concurrent_runs: 8
    tag_concurrency_limits:
      - key: "oaipmh/harvester"
        value: {applyLimitPerUniqueValue: true}
        limit: 1
      - key: "oaipmh/host"
        value: {applyLimitPerUniqueValue: true}
        limit: 2
      - key: "oaipmh/mode"
        value: "full"
        limit: 4
  pools:
    default_limit: 2
    granularity: op
run_monitoring:
  enabled: true
  poll_interval_seconds: 30
run_retries:
  enabled: true
  max_retries: 2
  retry_on_asset_or_op_failure: false
retention:
  schedule:
    purge_after_days: 90
  sensor:
    purge_after_days:
      skipped: 2
      failure: 90
      success: 90
telemetry:
  enabled: false
"""


def ensure_instance_yaml(home: Path) -> None:
    """Give $DAGSTER_HOME the shipped dagster.yaml (the repository's, else the built-in)."""
    target = home / "dagster.yaml"
    if target.exists():
        return
    shipped = Path.cwd() / "dagster.yaml"
    if shipped.is_file():
        shutil.copyfile(shipped, target)
    else:
        target.write_text(INSTANCE_YAML)


def register_demo_harvesters(base_url: str, registry: Registry) -> list[Harvester]:
    """Add (or point at `base_url`, with the demo's schema) the demo harvesters;
    idempotent."""
    out = []
    for harvester in demo_harvesters(base_url):
        try:
            current = registry.get(harvester.id)
            changes = {name: value for name, value in
                       (("base_url", base_url), ("schema", harvester.schema))
                       if getattr(current, name) != value}
            if changes:
                current = registry.update(harvester.id, **changes)
            out.append(current)
        except HarvesterNotFound:
            out.append(registry.add(harvester))
    return out


DEFINITIONS_MODULE = "oaipmh_dagster.definitions"
# What the demo's code locations serve: the definitions plus an example downstream asset.
DEMO_MODULE = "oaipmh_dagster.cli.demo_downstream"
DEMO_WORKSPACE = "demo_workspace.yaml"


def demo_workspace(home: Path, source: Path | None = None) -> Path:
    """Write the workspace the demo's `dagster dev` loads into `home`: the entries of
    `source` (the working directory's workspace.yaml, sharded or not) with each
    `oaipmh_dagster.definitions` module served by `DEMO_MODULE` under the same location
    name (schedule states, runs and sensor cursors are keyed by it) and working
    directory; without `source`, one location as `dagster dev -m` would name it."""
    import yaml

    entries: list[Any] = []
    if source is not None and source.is_file():
        loaded = yaml.safe_load(source.read_text(encoding="utf-8")) or {}
        for entry in loaded.get("load_from") or []:
            module = entry.get("python_module") if isinstance(entry, dict) else None
            if isinstance(module, str):
                module = {"module_name": module}
            if isinstance(module, dict) and module.get("module_name") == DEFINITIONS_MODULE:
                module = {"location_name": DEFINITIONS_MODULE, **module,
                          "module_name": DEMO_MODULE}
                module.setdefault("working_directory", str(source.resolve().parent))
                entry = {**entry, "python_module": module}
            entries.append(entry)
    else:
        entries.append({"python_module": {"module_name": DEMO_MODULE,
                                          "location_name": DEFINITIONS_MODULE}})
    path = home / DEMO_WORKSPACE
    path.write_text("# Written by `oaipmh-dagster demo`: the code locations of "
                    f"{source or DEFINITIONS_MODULE},\n# served by {DEMO_MODULE} (an example "
                    "asset downstream of the demo's records).\n"
                    + yaml.safe_dump({"load_from": entries}, sort_keys=False), encoding="utf-8")
    return path


def dagster_dev_command(port: int, home: Path) -> tuple[list[str], Path]:
    """`dagster dev`'s command line and working directory: $DAGSTER_HOME, whose
    dagster.yaml is the instance's. Started from the repository root instead, Dagster
    would warn that the root's dagster.yaml is ignored (it is only used once copied into
    $DAGSTER_HOME, which `ensure_instance_yaml` did). It loads `demo_workspace`, written
    into $DAGSTER_HOME from the working directory's workspace.yaml."""
    cmd = [
        str(Path(sys.executable).with_name("dagster")),
        "dev",
        "-h",
        "127.0.0.1",
        "-p",
        str(port),
    ]
    source = Path.cwd().resolve() / "workspace.yaml"
    workspace = demo_workspace(home, source if source.is_file() else None)
    return [*cmd, "-w", str(workspace)], home


def materialize_example(instance: Any, registry: Registry) -> tuple[bool, str]:
    """Materialize the example downstream asset from the demo harvester's stored records
    (in process, as the asset graph's Materialize would); (success, summary line)."""
    from oaipmh_dagster.cli.demo_downstream import DEMO_ID, RECORDS_BY_YEAR, with_example
    from oaipmh_dagster.definitions import build_definitions

    defs = with_example(build_definitions([registry.get(DEMO_ID)]))
    result = defs.resolve_implicit_global_asset_job_def().execute_in_process(
        instance=instance, asset_selection=[RECORDS_BY_YEAR], raise_on_error=False)
    name = RECORDS_BY_YEAR.to_user_string()
    if not result.success:
        return False, f"{name}: failed (see run {result.run_id} in the UI)"
    metadata = result.get_asset_materialization_events()[0].materialization.metadata
    return True, (f"{name}: {metadata['records'].value} live records in "
                  f"{metadata['dagster/row_count'].value} datestamp years")


def dagster_dev_env(port: int) -> dict[str, str]:
    """The environment of `dagster dev` and so of its runs: `manage_harvesters` and the
    alerts' links reach this UI, on whatever port it was given."""
    return {**os.environ, "OAIPMH_DAGSTER_WEBSERVER": f"http://127.0.0.1:{port}"}


def _dagster_dev(port: int, home: Path) -> subprocess.Popen:
    cmd, cwd = dagster_dev_command(port, home)
    # Default signal handlers in the child: a shell that backgrounds us may have set
    # SIGINT/SIGTERM to ignored, and dagster dev would inherit that.
    return subprocess.Popen(cmd, cwd=cwd, env=dagster_dev_env(port),  # noqa: PLW1509
                            start_new_session=True, preexec_fn=_default_signals)


def _default_signals() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def stop_group(proc: subprocess.Popen, timeout: float = 20.0) -> None:
    """End a process and everything it started (its own process group)."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)
    except ProcessLookupError:
        pass


def port_in_use(port: int) -> bool:
    """Whether something listens on 127.0.0.1:`port` (a port left in TIME_WAIT is free:
    servers bind with SO_REUSEADDR, as this probe does)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def _busy(what: str, port: int, option: str, variable: str) -> str:
    return (f"oaipmh-dagster: error: {what} port {port} on 127.0.0.1 is in use: choose "
            f"another with {option} (make demo {variable}=...)")


def wait_for_ui(url: str, proc: subprocess.Popen, poll: float = 0.5) -> bool:
    """Wait until the UI at `url` answers (True), or until `proc` ends (False)."""
    while proc.poll() is None:
        try:
            with urllib.request.urlopen(f"{url}/server_info", timeout=2):  # noqa: S310 - loopback
                return True
        except (OSError, ValueError):
            time.sleep(poll)
    return False


HUB_NAME = "oaipmh-dagster demo hub"


def start_hub(port: int) -> subprocess.Popen:
    """`oaipmh-dagster serve` on 127.0.0.1:`port` over the demo's store (the same
    database: the environment is inherited), in a process group of its own."""
    env = {**os.environ}
    env.setdefault("OAIPMH_SERVE_REPOSITORY_NAME", HUB_NAME)
    return subprocess.Popen(  # noqa: PLW1509 - default signals, as for dagster dev
        [sys.executable, "-m", "oaipmh_dagster.cli", "serve", "--host", "127.0.0.1",
         "--port", str(port), "--no-access-log"], env=env, start_new_session=True,
        preexec_fn=_default_signals, stdout=subprocess.DEVNULL)


def wait_for_hub(url: str, proc: subprocess.Popen, timeout: float = 60.0,
                 poll: float = 0.3) -> bool:
    """Wait until the hub at `url` answers Identify (True), or it ends or `timeout`."""
    end = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < end:
        try:
            with urllib.request.urlopen(f"{url}?verb=Identify", timeout=2):  # noqa: S310
                return True
        except (OSError, ValueError):
            time.sleep(poll)
    return False


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _started_server(dataset: Any, oai_port: int) -> OAIServer | None:
    """The demo endpoint, serving; None (the reason said on stderr) when it cannot listen."""
    server = OAIServer(dataset, port=oai_port)
    try:
        server.start()
    except OSError as exc:
        if oai_port and port_in_use(oai_port):
            click.echo(_busy("the demo endpoint's", oai_port, "--oai-port", "OAI_PORT"),
                       err=True)
        else:
            click.echo(f"oaipmh-dagster: error: cannot listen on 127.0.0.1:{oai_port}: {exc}",
                       err=True)
        return None
    return server


def run_demo(
    *, ui_port: int, oai_port: int, n_records: int, ui: bool, instance_factory: Callable[[], Any],
    hub_port: int | None = None,
) -> int:
    """Set everything up, then serve until Ctrl-C (or SIGTERM); returns the exit code.
    With the UI and a `hub_port`, the harvested records are also served over OAI-PMH
    there (`oaipmh-dagster serve`), for a second harvester to harvest."""
    from oaipmh_dagster.cli.runner import run_harvest_job

    signal.signal(signal.SIGTERM, _interrupt)
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)

    home = db.dagster_home()
    home.mkdir(parents=True, exist_ok=True)
    # Absolute: `dagster dev` runs in it, where a relative path would name another folder.
    os.environ["DAGSTER_HOME"] = str(home)
    ensure_instance_yaml(home)
    # Before any harvest: a busy UI port would only show once `dagster dev` fails.
    if ui and port_in_use(ui_port):
        click.echo(_busy("the Dagster UI's", ui_port, "--port", "PORT"), err=True)
        return 1
    if ui and hub_port and port_in_use(hub_port):
        click.echo(_busy("the hub's", hub_port, "--hub-port", "HUB_PORT"), err=True)
        return 1
    dataset = make_dataset(n_records, seed=1)
    invalid = add_invalid_records(dataset)  # for the demo harvester's schema_valid check
    server = _started_server(dataset, oai_port)
    if server is None:
        return 1
    proc = hub = None
    try:
        click.echo(f"demo OAI-PMH endpoint: {server.base_url} ({n_records} records, plus "
                   f"{invalid} whose oai_dc the oai_dc schema rejects)")
        registry = Registry(db.get_engine())
        for h in register_demo_harvesters(server.base_url, registry):
            sets = f"set {', '.join(h.sets)}" if h.sets else "all sets"
            click.echo(f"harvester {h.id}: {h.metadata_prefix}, {sets}")
        instance = instance_factory()
        for harvester in demo_harvesters(server.base_url):
            ok, message = run_harvest_job(instance, harvester.id, {}, registry)
            click.echo(message)
            if not ok:
                return 1
        ok, message = materialize_example(instance, registry)
        click.echo(message)
        if not ok:
            return 1
        if not ui:
            return 0
        if hub_port is not None:
            hub = start_hub(hub_port)
            hub_url = f"http://127.0.0.1:{hub_port}/oai"
            if wait_for_hub(hub_url, hub):
                click.echo(f"hub: {hub_url} serves the harvested records over OAI-PMH "
                           "(each harvester a set; see README, The hub)")
            else:
                click.echo(f"oaipmh-dagster: warning: the hub on port {hub_port} did not "
                           "start; the demo goes on without it", err=True)
        proc = _dagster_dev(ui_port, home)
        url = f"http://127.0.0.1:{ui_port}"
        click.echo("starting the Dagster UI ...")
        if wait_for_ui(url, proc):
            click.echo(f"Dagster UI: {url} (Ctrl-C stops everything)")
        while proc.poll() is None:
            time.sleep(0.5)
        return proc.returncode or 0
    except KeyboardInterrupt:
        return 0
    finally:
        if proc is not None:
            stop_group(proc)
        if hub is not None:
            stop_group(hub)
        server.stop()
