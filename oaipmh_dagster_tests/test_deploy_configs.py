"""The instance configurations under deploy/ (and the shipped dagster.yaml) load: each
validates against Dagster's instance schema, its classes import where their packages are
installed, and the Postgres one runs a job on a fresh PostgreSQL database."""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import re
import shlex
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import sqlalchemy as sa
import yaml
from dagster._config import validate_config
from dagster._core.instance.config import dagster_instance_config
from dagster._serdes.config_class import class_from_code_pointer
from dagster._utils import convert_dagster_submodule_name

from oaipmh_dagster.operations.shards import location_names
from oaipmh_dagster_tests.conftest import PG_URL, REPO_ROOT, drop_database, require_postgres

DEPLOY = REPO_ROOT / "deploy"
PG_ENV = ("DAGSTER_PG_HOST", "DAGSTER_PG_PORT", "DAGSTER_PG_DB", "DAGSTER_PG_USER",
          "DAGSTER_PG_PASSWORD")
LIMIT_KEYS = {"oaipmh/harvester": 1, "oaipmh/host": 2, "oaipmh/mode": None}
PER_VALUE = ("oaipmh/harvester", "oaipmh/host")
# The op-level host pools of the shipped dagster.yaml, which every deploy config repeats.
POOLS = {"default_limit": 2, "granularity": "op"}

# config file -> (launcher module, launcher class, the package that provides it)
CONFIGS: dict[str, tuple[str, str, str]] = {
    "postgres": ("dagster.core.launcher", "DefaultRunLauncher", "dagster"),
    "k8s": ("dagster_k8s.launcher", "K8sRunLauncher", "dagster-k8s"),
    "docker": ("dagster_docker", "DockerRunLauncher", "dagster-docker"),
    "celery": ("dagster_celery_k8s.launcher", "CeleryK8sRunLauncher", "dagster-celery-k8s"),
}


def _load(name: str) -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / name / "dagster.yaml").read_text())


def _shipped_pools() -> dict[str, Any]:
    return yaml.safe_load((REPO_ROOT / "dagster.yaml").read_text())["concurrency"]["pools"]


def _check_concurrency(config: dict[str, Any]) -> None:
    """Run limits only under `concurrency.runs` (per harvester and per host, one slot
    per unique value), none under the run coordinator's config."""
    assert not (config["run_coordinator"].get("config") or {}).get("tag_concurrency_limits")
    runs = config["concurrency"]["runs"]
    limits = {lim["key"]: lim for lim in runs["tag_concurrency_limits"]}
    assert set(limits) == set(LIMIT_KEYS)
    assert {k: limits[k]["limit"] for k in PER_VALUE} == {k: LIMIT_KEYS[k] for k in PER_VALUE}
    assert all(limits[k]["value"] == {"applyLimitPerUniqueValue": True} for k in PER_VALUE)
    _check_full_harvest_limit(limits["oaipmh/mode"], runs["max_concurrent_runs"])


def _check_full_harvest_limit(limit: dict[str, Any], max_runs: int) -> None:
    """Full harvests have their own limit, which leaves slots for incremental runs."""
    assert limit["value"] == "full"
    assert 1 <= limit["limit"] <= max_runs // 2


def _validate_instance_yaml(path: Path, tmp_path: Path) -> dict[str, Any]:
    """Dagster's own loading of a dagster.yaml: schema validation of every section."""
    home = tmp_path / f"home_{path.parent.name}"
    home.mkdir()
    shutil.copy(path, home / "dagster.yaml")
    config, custom_class = dagster_instance_config(str(home))
    assert custom_class is None
    return dict(config)


def _class(module: str, name: str) -> type:
    return class_from_code_pointer(convert_dagster_submodule_name(module, "private"), name)


def _module_available(module: str) -> bool:
    top = module.split(".")[0]
    return importlib.util.find_spec(top) is not None


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_deploy_config_validates(name: str, tmp_path: Path) -> None:
    raw = _load(name)
    config = _validate_instance_yaml(DEPLOY / name / "dagster.yaml", tmp_path)
    # Postgres storage with the psycopg2 scheme, credentials from the environment.
    pg = config["storage"]["postgres"]["postgres_db"]
    assert pg["scheme"] == "postgresql+psycopg2"
    for key in ("hostname", "port", "db_name", "username", "password"):
        assert isinstance(raw["storage"]["postgres"]["postgres_db"][key], dict), key
        assert set(raw["storage"]["postgres"]["postgres_db"][key]) == {"env"}
    from dagster_postgres import DagsterPostgresStorage

    checked = validate_config(DagsterPostgresStorage.config_type(),
                              raw["storage"]["postgres"])
    assert checked.success, checked.errors
    # The queued run coordinator; its per-harvester and per-host limits and the host
    # pools are the shipped dagster.yaml's `concurrency` settings.
    coordinator = config["run_coordinator"]
    assert coordinator["class"] == "QueuedRunCoordinator"
    from dagster._core.run_coordinator import QueuedRunCoordinator

    assert _class(coordinator["module"], coordinator["class"]) is QueuedRunCoordinator
    _check_concurrency(config)
    assert config["concurrency"]["pools"] == _shipped_pools()
    assert config["schedules"]["use_threads"] and config["sensors"]["use_threads"]
    # The run launcher names the module and class its package documents.
    module, cls, _ = CONFIGS[name]
    launcher = config["run_launcher"]
    assert (launcher["module"], launcher["class"]) == (module, cls)
    assert isinstance(launcher.get("config", {}), dict)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_run_launcher_config_matches_its_class(name: str) -> None:
    module, cls, package = CONFIGS[name]
    if not _module_available(module):
        pytest.skip(f"{package} is not installed (an optional deployment dependency): "
                    f"{cls}'s own config schema is not checked, only the instance schema")
    launcher = _load(name)["run_launcher"]
    klass = _class(module, cls)
    checked = validate_config(klass.config_type(), launcher.get("config") or {})
    assert checked.success, checked.errors


def test_shipped_dagster_yaml_validates(tmp_path: Path) -> None:
    config = _validate_instance_yaml(REPO_ROOT / "dagster.yaml", tmp_path)
    _check_concurrency(config)
    assert config["concurrency"]["pools"] == POOLS


def test_shipped_dagster_yaml_concurrency_in_force(tmp_path: Path) -> None:
    """An instance of the shipped file enforces the run limits and the host pools."""
    from dagster._core.instance.config import PoolGranularity

    home = tmp_path / "shipped_home"
    home.mkdir()
    shutil.copy(REPO_ROOT / "dagster.yaml", home / "dagster.yaml")
    instance = dg.DagsterInstance.from_config(str(home))
    try:
        concurrency = instance.get_concurrency_config()
        limits = {lim["key"]: lim["limit"]
                  for lim in concurrency.run_queue_config.tag_concurrency_limits}
        assert limits == {**LIMIT_KEYS, "oaipmh/mode": 4}
        assert concurrency.pool_config.default_pool_limit == POOLS["default_limit"]
        assert concurrency.pool_config.pool_granularity == PoolGranularity.OP
    finally:
        instance.dispose()


@pytest.mark.parametrize("name", ["dagster.yaml", *(f"deploy/{c}/dagster.yaml"
                                                   for c in sorted(CONFIGS))])
def test_sensor_ticks_are_kept_one_to_three_days(name: str, tmp_path: Path) -> None:
    """Each since sensor tick row holds its whole cursor: skipped ticks (all of its
    ticks) are purged after 1 to 3 days in every shipped instance file."""
    config = _validate_instance_yaml(REPO_ROOT / name, tmp_path)
    assert 1 <= config["retention"]["sensor"]["purge_after_days"]["skipped"] <= 3


def test_helm_values_keep_sensor_ticks_and_limit_full_harvests() -> None:
    values = yaml.safe_load((DEPLOY / "k8s" / "values.yaml").read_text())
    assert values["retention"]["enabled"] is True
    assert 1 <= values["retention"]["sensor"]["purgeAfterDays"]["skipped"] <= 3
    runs = values["concurrency"]["runs"]
    limits = {lim["key"]: lim for lim in runs["tagConcurrencyLimits"]}
    _check_full_harvest_limit(limits["oaipmh/mode"], runs["maxConcurrentRuns"])


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_deploy_config_refused_with_limits_in_both_places(name: str, tmp_path: Path) -> None:
    """Dagster refuses run limits under run_coordinator.config next to `concurrency`:
    the deploy configs must keep theirs under `concurrency.runs` only."""
    from dagster._core.errors import DagsterInvalidConfigError

    raw = _load(name)
    raw["run_coordinator"]["config"] = {
        "tag_concurrency_limits": raw["concurrency"]["runs"]["tag_concurrency_limits"]}
    path = tmp_path / name / "dagster.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(DagsterInvalidConfigError, match="incompatible"):
        _validate_instance_yaml(path, tmp_path)


def test_readme_covers_every_config() -> None:
    text = (DEPLOY / "README.md").read_text()
    for name, (_, cls, package) in CONFIGS.items():
        assert f"deploy/{name}/dagster.yaml" in text
        assert cls in text and package in text
    for command in ("dagster-webserver", "dagster-daemon", "dagster code-server start",
                    "dagster dev"):
        assert command in text


# -- the Postgres configuration, for real ------------------------------------------------


@pytest.fixture
def fresh_pg(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A new PostgreSQL database, exposed through the DAGSTER_PG_* variables."""
    require_postgres()
    name = f"oaipmh_deploy_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = sa.engine.make_url(PG_URL)
    values = {"DAGSTER_PG_HOST": url.host or "127.0.0.1", "DAGSTER_PG_PORT": str(url.port or 5432),
              "DAGSTER_PG_DB": name, "DAGSTER_PG_USER": url.username or "postgres",
              "DAGSTER_PG_PASSWORD": url.password or ""}
    for key in PG_ENV:
        monkeypatch.setenv(key, values[key])
    try:
        yield name
    finally:
        drop_database(admin, name)


@dg.op
def _ping() -> int:
    return 1


@dg.job(tags={"oaipmh/harvester": "deploy_check", "oaipmh/host": "127.0.0.1"})
def deploy_check_job() -> None:
    _ping()


@pytest.mark.postgres
def test_postgres_config_runs_a_job(fresh_pg: str, tmp_path: Path) -> None:
    from dagster._core.run_coordinator import QueuedRunCoordinator
    from dagster_postgres import (
        PostgresEventLogStorage,
        PostgresRunStorage,
        PostgresScheduleStorage,
    )

    home = tmp_path / "pg_home"
    home.mkdir()
    shutil.copy(DEPLOY / "postgres" / "dagster.yaml", home / "dagster.yaml")
    instance = dg.DagsterInstance.from_config(str(home))
    try:
        assert isinstance(instance.run_storage, PostgresRunStorage)
        assert isinstance(instance.event_log_storage, PostgresEventLogStorage)
        assert isinstance(instance.schedule_storage, PostgresScheduleStorage)
        assert isinstance(instance.run_coordinator, QueuedRunCoordinator)
        concurrency = instance.get_concurrency_config()
        assert {lim["key"]: lim["limit"] for lim in
                concurrency.run_queue_config.tag_concurrency_limits} == {
                    **LIMIT_KEYS, "oaipmh/mode": 8}
        assert concurrency.pool_config.default_pool_limit == POOLS["default_limit"]
        assert type(instance.run_launcher).__name__ == "DefaultRunLauncher"
        result = deploy_check_job.execute_in_process(instance=instance)
        assert result.success and result.output_for_node("_ping") == 1
        stored = instance.get_run_by_id(result.run_id)
        assert stored is not None and stored.status == dg.DagsterRunStatus.SUCCESS
        assert stored.tags["oaipmh/harvester"] == "deploy_check"
        # Dagster's tables were created in the fresh database named by the environment.
        engine = sa.create_engine(sa.engine.make_url(PG_URL).set(database=fresh_pg))
        try:
            with engine.connect() as conn:
                runs = conn.execute(sa.text("SELECT count(*) FROM runs")).scalar_one()
        finally:
            engine.dispose()
        assert runs == 1
    finally:
        instance.dispose()


# -- retries -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["dagster.yaml", *(f"deploy/{c}/dagster.yaml"
                                                   for c in sorted(CONFIGS))])
def test_run_retries_cover_infrastructure_failures_only(name: str, tmp_path: Path) -> None:
    """Every shipped instance relaunches a run whose worker died (the relaunch resumes
    from the checkpoint), but not a run whose op failed: the harvest op retries transient
    failures itself, and a protocol error or a held-back sweep must not run again."""
    config = _validate_instance_yaml(REPO_ROOT / name, tmp_path)
    retries = config["run_retries"]
    assert retries["enabled"] is True and retries["max_retries"] >= 1
    assert retries["retry_on_asset_or_op_failure"] is False
    text = (REPO_ROOT / name).read_text()
    comment = text[:text.index("\nrun_retries:")].rsplit("\n\n", 1)[-1]
    assert "checkpoint" in comment and "$OAIPMH_OP_RETRIES" in comment
    assert "an endpoint away for a while) up to twice" not in comment  # the old claim


def test_retries_enable_the_daemon_that_launches_them(tmp_path: Path) -> None:
    """An instance of these settings runs the daemon that launches the retries (SQLite
    storage stands in for Postgres here)."""
    raw = _load("postgres")
    del raw["storage"]
    home = tmp_path / "retry_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(yaml.safe_dump(raw))
    instance = dg.DagsterInstance.from_config(str(home))
    try:
        assert instance.run_retries_enabled
        assert instance.run_retries_max_retries == raw["run_retries"]["max_retries"]
        assert instance.run_retries_retry_on_asset_or_op_failure is False
        assert "EVENT_LOG_CONSUMER" in instance.get_required_daemon_types()
    finally:
        instance.dispose()


# -- the code location image, compose, Helm and the gRPC workspace ---------------------


def _dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) of the Dockerfile, continuation lines joined."""
    text = (REPO_ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            instruction, _, args = line.partition(" ")
            out.append((instruction.upper(), " ".join(args.split())))
    return out


def _dockerfile_cmd() -> list[str]:
    (cmd,) = [args for instruction, args in _dockerfile() if instruction == "CMD"]
    return json.loads(cmd)


def _readme_deploy_block() -> list[str]:
    """The command lines of the sh blocks of the README's "Deploy" section."""
    text = (REPO_ROOT / "README.md").read_text()
    section = text[text.index("\n## Deploy\n") + 1:]
    section = section[:section.index("\n## ")]
    lines = []
    for block in section.split("```sh\n")[1:]:
        block = block[:block.index("```")].replace("\\\n", " ")
        lines += [" ".join(line.split()) for line in block.splitlines()
                  if line.strip() and not line.strip().startswith("#")]
    return lines


def test_dockerfile_commands_are_the_readmes() -> None:
    lines = _readme_deploy_block()
    assert shlex.join(_dockerfile_cmd()) in lines
    for instruction, args in _dockerfile():
        if instruction == "RUN":
            for command in args.split("&&"):
                if command.strip().startswith("pip "):
                    assert command.strip() in lines, command
    assert "docker build -t oaipmh-dagster ." in lines


def test_dockerfile_serves_the_definitions_module() -> None:
    cmd = _dockerfile_cmd()
    assert cmd[:3] == ["dagster", "code-server", "start"]
    assert cmd[cmd.index("-m") + 1] == "oaipmh_dagster.definitions"
    workspace = _grpc_workspace()
    assert cmd[cmd.index("--location-name") + 1] == workspace["location_name"]
    assert int(cmd[cmd.index("-p") + 1]) == workspace["port"]
    assert ("EXPOSE", str(workspace["port"])) in _dockerfile()


def test_dockerignore_keeps_what_the_image_copies() -> None:
    ignored = [line.strip() for line in (REPO_ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    for instruction, args in _dockerfile():
        if instruction == "COPY":
            for source in args.split()[:-1]:
                assert (REPO_ROOT / source).exists(), source
                assert not any(fnmatch.fnmatch(source, pattern) for pattern in ignored), source
    assert "oaipmh_dagster_tests" in ignored and ".venv" in ignored


def _grpc_workspace() -> dict[str, Any]:
    (entry,) = yaml.safe_load((REPO_ROOT / "workspace-grpc.yaml").read_text())["load_from"]
    return entry["grpc_server"]


def test_grpc_workspace_is_accepted_by_dagster(monkeypatch: pytest.MonkeyPatch) -> None:
    from dagster._core.errors import DagsterInvalidConfigError
    from dagster._core.workspace.config_schema import ensure_workspace_config

    path = REPO_ROOT / "workspace-grpc.yaml"
    raw = yaml.safe_load(path.read_text())
    assert _grpc_workspace()["host"] == {"env": "OAIPMH_CODE_SERVER_HOST"}
    monkeypatch.delenv("OAIPMH_CODE_SERVER_HOST", raising=False)
    with pytest.raises(DagsterInvalidConfigError, match="OAIPMH_CODE_SERVER_HOST"):
        ensure_workspace_config(raw, str(path))
    monkeypatch.setenv("OAIPMH_CODE_SERVER_HOST", "127.0.0.1")
    checked = ensure_workspace_config(raw, str(path))
    (entry,) = checked["load_from"]  # type: ignore[misc]
    assert entry["grpc_server"]["host"] == "127.0.0.1"


def _compose() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "docker" / "compose.yaml").read_text())


def test_compose_runs_postgres_webserver_daemon_and_code_server() -> None:
    compose = _compose()
    services = compose["services"]
    assert set(services) == {"postgres", "code-server", "webserver", "daemon", "oai-provider"}
    build = services["code-server"]["build"]
    assert (DEPLOY / "docker" / build["context"] / build["dockerfile"]).resolve() == (
        REPO_ROOT / "Dockerfile")
    assert "command" not in services["code-server"]  # the image's CMD
    assert services["webserver"]["command"][:3] == ["dagster-webserver", "-w",
                                                    "workspace-grpc.yaml"]
    assert services["daemon"]["command"][:4] == ["dagster-daemon", "run", "-w",
                                                 "workspace-grpc.yaml"]
    for name in ("code-server", "webserver", "daemon"):
        service = services[name]
        env = service["environment"]
        assert env["OAIPMH_CODE_SERVER_HOST"] == "code-server"
        assert env["DAGSTER_PG_HOST"] == "postgres"
        assert set(PG_ENV) <= set(env)
        # The instance is deploy/postgres/dagster.yaml, mounted as $DAGSTER_HOME/dagster.yaml.
        (volume,) = service["volumes"]
        source, target, _ = volume.split(":")
        assert (DEPLOY / "docker" / source).resolve() == DEPLOY / "postgres" / "dagster.yaml"
        assert target == f"{env['DAGSTER_HOME']}/dagster.yaml"
        assert service["depends_on"]["postgres"]["condition"] == "service_healthy"
        # The records live in their own database, which initdb creates.
        url = sa.engine.make_url(env["OAIPMH_DATABASE_URL"].replace(
            "${DAGSTER_PG_PASSWORD:-dagster}", "x"))
        assert url.database != env["DAGSTER_PG_DB"] and url.host == "postgres"
        assert url.drivername == "postgresql+psycopg2"
        init = (DEPLOY / "docker" / "initdb" / "oaipmh.sql").read_text()
        assert f"CREATE DATABASE {url.database}" in init
    for name in ("webserver", "daemon"):
        assert services[name]["depends_on"]["code-server"]["condition"] == "service_healthy"


def _serve_settings_ok(env: dict[str, str]) -> None:
    """The provider's OAIPMH_SERVE_* defaults are settings `serve` accepts."""
    from oaipmh_dagster.serve import Settings

    def default(value: str) -> str:
        match = re.fullmatch(r"\$\{[A-Z_]+:-(.*)\}", value)
        return match.group(1) if match else value

    Settings.from_env({k: default(v) for k, v in env.items() if k.startswith("OAIPMH_SERVE_")})


def test_compose_runs_the_oai_provider() -> None:
    """`oaipmh-dagster serve` of the image, on the records database, published on
    loopback, health-checked through Identify."""
    services = _compose()["services"]
    provider = services["oai-provider"]
    assert provider["image"] == services["code-server"]["image"]
    command = provider["command"]
    assert command[:2] == ["oaipmh-dagster", "serve"]
    port = command[command.index("--port") + 1]
    assert command[command.index("--host") + 1] == "0.0.0.0"
    assert provider["ports"] == [f"127.0.0.1:{port}:{port}"]
    env = provider["environment"]
    assert env["OAIPMH_DATABASE_URL"] == services["code-server"]["environment"][
        "OAIPMH_DATABASE_URL"]
    _serve_settings_ok(env)
    assert f"{port}/oai?verb=Identify" in " ".join(provider["healthcheck"]["test"])
    assert provider["depends_on"]["postgres"]["condition"] == "service_healthy"


def test_kubernetes_manifests_run_the_oai_provider() -> None:
    """deploy/k8s/serve.yaml: the values' image and Secret, a probe through Identify, and a
    Service onto the container's port."""
    deployment, service = yaml.safe_load_all((DEPLOY / "k8s" / "serve.yaml").read_text())
    assert (deployment["kind"], service["kind"]) == ("Deployment", "Service")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    image = _values()["dagster-user-deployments"]["deployments"][0]["image"]
    assert container["image"] == f"{image['repository']}:{image['tag']}"
    assert container["command"][:2] == ["oaipmh-dagster", "serve"]
    port = int(container["command"][container["command"].index("--port") + 1])
    assert container["ports"] == [{"name": "http", "containerPort": port}]
    assert {"secretRef": {"name": "oaipmh-database"}} in container["envFrom"]
    _serve_settings_ok({e["name"]: e["value"] for e in container["env"]})
    assert container["readinessProbe"]["httpGet"]["path"] == "/oai?verb=Identify"
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"] == labels
    assert service["spec"]["selector"] == labels
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    assert "deploy/k8s/serve.yaml" in (DEPLOY / "k8s" / "values.yaml").read_text()


def _values() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "k8s" / "values.yaml").read_text())


def test_helm_values_run_the_code_location() -> None:
    values = _values()
    users = values["dagster-user-deployments"]
    assert users["enabled"] is True
    deployments = users["deployments"]
    # K shards as user deployments, named as `workspace --shards K --prefix
    # oaipmh-dagster` names the locations (the K the comments describe).
    assert [d["name"] for d in deployments] == location_names(len(deployments),
                                                              "oaipmh-dagster")
    assert len(deployments) > 1
    for deployment in deployments:
        name = deployment["name"]
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name)  # a Kubernetes name
        args = deployment["codeServerArgs"]
        assert args[args.index("-m") + 1] == "oaipmh_dagster.definitions"
        # The chart names the location after the deployment: the server must use that name.
        assert args[args.index("--location-name") + 1] == name
        assert {"name": "oaipmh-database"} in deployment["envSecrets"]
        assert deployment["includeConfigInLaunchedRuns"] == {"enabled": True}
    launcher = values["runLauncher"]
    assert launcher["type"] == "K8sRunLauncher"
    assert {"name": "oaipmh-database"} in launcher["config"]["k8sRunLauncher"]["envSecrets"]


def test_helm_values_point_runs_at_the_webserver_service() -> None:
    """`manage_harvesters` runs and CLI commands in the pods reload through the webserver's
    Service, which the chart names `<release>-webserver` on its service port (80)."""
    text = (DEPLOY / "k8s" / "values.yaml").read_text(encoding="utf-8")
    release = re.search(r"helm upgrade --install (\S+) dagster/dagster", text)
    assert release is not None
    port = _values().get("dagsterWebserver", {}).get("service", {}).get("port", 80)
    for deployment in _values()["dagster-user-deployments"]["deployments"]:
        env = {e["name"]: e.get("value") for e in deployment["env"]}
        assert env["OAIPMH_DAGSTER_WEBSERVER"] == f"http://{release[1]}-webserver:{port}"


def test_helm_values_say_how_to_create_the_database_secret() -> None:
    text = (DEPLOY / "k8s" / "values.yaml").read_text(encoding="utf-8")
    assert "kubectl create secret generic oaipmh-database" in text
    assert "--from-literal=OAIPMH_DATABASE_URL=" in text
    assert "one location holding every harvester" not in text  # sharded since #24


def test_helm_values_keep_the_instance_settings() -> None:
    """The chart's instance: the same limits, pools and retries as deploy/k8s/dagster.yaml."""
    values, instance = _values(), _load("k8s")
    concurrency = values["concurrency"]
    assert concurrency["enabled"] is True
    limits = {lim["key"]: lim for lim in concurrency["runs"]["tagConcurrencyLimits"]}
    assert {k: v["limit"] for k, v in limits.items()} == {
        k["key"]: k["limit"] for k in instance["concurrency"]["runs"]["tag_concurrency_limits"]}
    assert all(limits[k]["value"] == {"applyLimitPerUniqueValue": True} for k in PER_VALUE)
    assert values["retention"]["sensor"]["purgeAfterDays"]["skipped"] == (
        instance["retention"]["sensor"]["purge_after_days"]["skipped"])
    assert concurrency["runs"]["maxConcurrentRuns"] == (
        instance["concurrency"]["runs"]["max_concurrent_runs"])
    assert concurrency["pools"] == {"defaultLimit": POOLS["default_limit"],
                                    "granularity": POOLS["granularity"]}
    coordinator = values["dagsterDaemon"]["runCoordinator"]
    assert coordinator["type"] == "QueuedRunCoordinator"
    assert "config" not in coordinator  # limits only under `concurrency`
    daemon = values["dagsterDaemon"]
    for part in ("schedules", "sensors"):
        assert daemon[part] == {"useThreads": instance[part]["use_threads"],
                                "numWorkers": instance[part]["num_workers"]}
    monitoring = instance["run_monitoring"]
    assert daemon["runMonitoring"] == {
        "enabled": True, "startTimeoutSeconds": monitoring["start_timeout_seconds"],
        "pollIntervalSeconds": monitoring["poll_interval_seconds"]}
    assert values["telemetry"] == {"enabled": instance["telemetry"]["enabled"]}
    retries = values["dagsterDaemon"]["runRetries"]
    assert retries == {"enabled": True,
                       "maxRetries": instance["run_retries"]["max_retries"],
                       "retryOnAssetOrOpFailure": False}


def test_team_server_gives_many_code_servers_time_to_start(tmp_path: Path) -> None:
    """deploy/scale.md: K shard locations starting at once need more than Dagster's
    default 180 s; the team server's instance says so, and the note names the settings."""
    config = _validate_instance_yaml(DEPLOY / "postgres" / "dagster.yaml", tmp_path)
    servers = config["code_servers"]
    assert servers["local_startup_timeout"] >= 600 and servers["reload_timeout"] >= 600
    note = (DEPLOY / "scale.md").read_text(encoding="utf-8")
    for setting in ("local_startup_timeout", "DAGSTER_REPOSITORY_GRPC_TIMEOUT_SECONDS",
                    "DAGSTER_GRPC_MAX_RX_BYTES", "workspace --shards"):
        assert setting in note
