"""Shared fixtures: databases (SQLite and PostgreSQL), a Dagster home, the loopback server."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, settings

from oaipmh_dagster.storage import db

REPO_ROOT = Path(__file__).resolve().parents[1]
FIXTURES = REPO_ROOT.parent / "shared" / "oai-fixtures"
PG_URL = os.environ.get(
    "OAIPMH_TEST_POSTGRES_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432/test"
)
REQUIRE_PG = os.environ.get("OAIPMH_REQUIRE_POSTGRES") == "1"

_pg_checked: dict[str, str | None] = {}

# Property tests judge results, never speed: Hypothesis's default 200 ms deadline per
# example (and its "data generation too slow" check) failed them on a loaded machine.
settings.register_profile("oaipmh", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("oaipmh")


def postgres_unavailable() -> str | None:
    """None when PostgreSQL answers, else the reason (cached)."""
    if "reason" not in _pg_checked:
        try:
            engine = sa.create_engine(PG_URL, connect_args={"connect_timeout": 3})
            with engine.connect() as conn:
                conn.execute(sa.text("SELECT 1"))
            engine.dispose()
            _pg_checked["reason"] = None
        except Exception as exc:  # noqa: BLE001 - any failure means unavailable
            _pg_checked["reason"] = f"PostgreSQL at {db.redact(PG_URL)} unreachable: " + (
                str(exc).strip().splitlines()[0]
            )
    return _pg_checked["reason"]


def require_postgres() -> None:
    """Skip (or fail in CI, where OAIPMH_REQUIRE_POSTGRES=1) without PostgreSQL."""
    reason = postgres_unavailable()
    if reason:
        if REQUIRE_PG:
            pytest.fail(f"{reason} (OAIPMH_REQUIRE_POSTGRES=1 makes it mandatory)")
        pytest.skip(reason)


@contextlib.contextmanager
def fresh_pg_database() -> Iterator[str]:
    """A new PostgreSQL database (dropped afterwards); skips, or fails under
    OAIPMH_REQUIRE_POSTGRES=1, when PostgreSQL is unreachable."""
    require_postgres()
    name = f"oaipmh_test_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    try:
        yield sa.engine.make_url(PG_URL).set(database=name).render_as_string(
            hide_password=False)
    finally:
        db.dispose_all()
        drop_database(admin, name)


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """A fresh PostgreSQL database for this test session (dropped at the end): the
    project's tables only (a Dagster instance on PostgreSQL takes `fresh_pg_database`)."""
    with fresh_pg_database() as url:
        yield url


def drop_database(admin: sa.Engine, name: str) -> None:
    """End the connections to a test database and drop it."""
    with admin.connect() as conn:
        conn.execute(sa.text(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :n"
        ), {"n": name})
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}"'))
    admin.dispose()


def _clean_postgres(url: str) -> None:
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        for table in ("oaipmh_record", "oaipmh_harvest_state", "oaipmh_harvester",
                      "oaipmh_setting", "oaipmh_alembic_version"):
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {table} CASCADE"))
    engine.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest) -> str:
    """An empty database, SQLite and PostgreSQL, set as $OAIPMH_DATABASE_URL."""
    return str(request.getfixturevalue(f"{request.param}_url"))


@pytest.fixture
def sqlite_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An empty SQLite database only, set as $OAIPMH_DATABASE_URL."""
    url = f"sqlite:///{tmp_path / 'oaipmh.sqlite'}"
    monkeypatch.setenv(db.DATABASE_URL_ENV, url)
    yield url
    db.dispose_all()


@pytest.fixture
def postgres_url(pg_database: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An empty PostgreSQL database only, set as $OAIPMH_DATABASE_URL."""
    db.dispose_all()
    _clean_postgres(pg_database)
    monkeypatch.setenv(db.DATABASE_URL_ENV, pg_database)
    yield pg_database
    db.dispose_all()


@pytest.fixture
def memory_store(monkeypatch: pytest.MonkeyPatch) -> Any:
    """An empty in-memory record store (`memory_store.MemoryStore`); the test fails if it
    opens a database."""
    from oaipmh_dagster_tests.memory_store import MemoryStore

    def no_database(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a test on the in-memory store opened a database")

    monkeypatch.setattr(db, "get_engine", no_database)
    return MemoryStore()


def _forget_dagster_state_storage() -> None:
    """An earlier test's instance, gone since, would make the next definitions load fail.
    Until a test has imported Dagster there is nothing to forget (and no import to pay)."""
    if "dagster" not in sys.modules:
        return
    from oaipmh_dagster.defs._private import forget_defs_state_storage

    forget_defs_state_storage()


_TEMPLATE: list[Path] = []


def _empty_storage_template(tmp_path_factory: pytest.TempPathFactory) -> Path | None:
    """The SQLite run, event-log and schedule storage of an empty default Dagster home,
    created once per process (None until a test has imported Dagster). Creating them
    (schema, Alembic stamps) costs 0.3-0.5 s of CPU and many fsyncs a test; a copy of
    these few files is what Dagster then opens as it would its own."""
    if "dagster" not in sys.modules:
        return None
    if not _TEMPLATE:
        import dagster as dg

        template = tmp_path_factory.mktemp("empty_dagster_storage")
        instance = dg.DagsterInstance.from_config(str(template))
        try:
            instance.get_runs(limit=1)
            instance.get_latest_materialization_event(dg.AssetKey("template"))
            instance.all_instigator_state()
        finally:
            instance.dispose()
        _TEMPLATE.append(template)
    return _TEMPLATE[0]


def empty_dagster_home(home: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`home` (created), holding the empty storage of a default instance when Dagster is
    already imported; a Dagster instance on it behaves as one on a new directory."""
    home.mkdir(parents=True, exist_ok=True)
    template = _empty_storage_template(tmp_path_factory)
    if template is not None:
        shutil.copytree(template, home, dirs_exist_ok=True)
    return home


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory,
                   monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own $DAGSTER_HOME, no webserver to reload, and no op retries."""
    _forget_dagster_state_storage()
    home = empty_dagster_home(tmp_path / "dagster_home", tmp_path_factory)
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("OAIPMH_DAGSTER_WEBSERVER", "http://127.0.0.1:9")
    # Jobs that fail on purpose fail at once; tests of the op's retries set their own.
    monkeypatch.setenv("OAIPMH_OP_RETRIES", "0")
    return home


@pytest.fixture
def fixtures_dir() -> Path:
    """The third-party OAI-PMH responses, or a skip when the folder is absent."""
    if not FIXTURES.is_dir():
        pytest.skip(f"third-party fixtures not found at {FIXTURES}")
    return FIXTURES


# -- the command in this process --------------------------------------------------------

ERROR = "oaipmh-dagster: error: "


@dataclass
class Result:
    """Exit code, stdout and stderr of one command."""

    code: int
    out: str
    err: str

    @property
    def error_line(self) -> str:
        """The single error line (fails when stderr holds anything else)."""
        lines = self.err.splitlines()
        assert len(lines) == 1, f"expected one line on stderr, got {self.err!r}"
        assert lines[0].startswith(ERROR), lines[0]
        assert "Traceback" not in self.err
        return lines[0]


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str]) -> Callable[..., Result]:
    """The `oaipmh-dagster` command in this process."""
    from oaipmh_dagster.cli import commands as cli

    def call(*argv: str) -> Result:
        capsys.readouterr()
        with pytest.raises(SystemExit) as done:
            cli.main(list(argv))
        out = capsys.readouterr()
        code = done.value.code
        return Result(0 if code is None else int(code), out.out, out.err)

    return call


@pytest.fixture
def closed_port_url() -> str:
    """A loopback URL nothing listens on."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}/oai"


@pytest.fixture
def instance(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A throwaway Dagster instance (in-process runs, sensor ticks)."""
    import dagster as dg

    home = empty_dagster_home(tmp_path / "test_instance", tmp_path_factory)
    with dg.instance_for_test(temp_dir=str(home)) as inst:
        yield inst


# -- the fast loop: `make check` runs every test not marked `slow` or `browser` -----------
#
# Marked `slow` here, in one place (measured with `pytest --durations=0`): the folders that
# start servers, subprocesses or `dagster dev` for every test, the modules whose tests mostly
# run Dagster jobs in-process, and single tests that took over 2 s on a loaded 2-core machine
# (about 0.6 s on a quiet one: a Dagster run, a CLI subprocess, a property search, a
# sensor tick over hundreds of harvesters). A test
# is named by its function (every parameter); a name that no longer exists fails the
# collection, so the list cannot silently rot. `make test` and CI still run everything.

SLOW_FOLDERS = ("browser", "e2e", "reliability")
SLOW_MODULES = (
    "defs/test_alerts.py", "cli/test_cli_list.py", "cli/test_cli_pipes.py", "harvesting/test_harvest.py",
    "harvesting/test_harvest_xslt.py", "defs/test_job.py", "defs/test_lineage.py", "defs/test_manage.py",
    "harvesting/test_reconcile.py", "defs/test_reshard.py", "defs/test_run_mode.py", "defs/test_schedule_mode.py",
    "harvesting/test_short_list.py", "defs/test_since.py", "harvesting/test_windows.py",
    "validation/test_schema_check.py",
)
SLOW_TESTS = {
    "demo/test_invalid.py": ("test_demo_harvest_reports_the_invalid_records",),
    "oai/test_datestamps.py": ("test_parse_datestamp_never_crashes",),
    "oai/test_datestamp_forms.py": ("test_any_text_reads_or_is_refused_cleanly",),
    "oai/test_deadline.py": ("test_slow_response_within_the_deadline_succeeds",
                             "test_trickling_response_fails_at_the_deadline"),
    "oai/test_paging.py": ("test_memory_bounded_one_page_at_a_time",),
    "oai/test_loopback.py": ("test_read_timeout_retried",),
    "cli/test_cli.py": ("test_add_loads_only_what_it_needs", "test_invalid_row",
                    "test_list_and_show", "test_records_after_a_real_harvest",
                    "test_remove_confirmed_on_stdin", "test_remove_yes",
                    "test_update_checks_the_sets", "test_update_url_checks_the_kept_sets"),
    "cli/test_cli_errors.py": ("test_broken_database_in_a_process",
                           "test_failed_harvest_in_a_bare_home",
                           "test_failed_harvest_in_a_process", "test_failed_harvest_is_one_line",
                           "test_failed_harvest_verbose", "test_harvest_bad_run_config",
                           "test_harvest_overflowing_date_in_a_process"),
    "cli/test_cli_inspect.py": ("test_unreachable_endpoint_in_a_process",),
    "cli/test_cli_output.py": ("test_show_has_no_python_reprs",),
    "cli/test_cli_records.py": ("test_filters",),
    "cli/test_cli_xslt.py": ("test_add_stores_an_absolute_path",),
    "defs/test_definitions.py": ("test_dagster_definitions_validate_cli",
                            "test_harvester_without_cron_has_stopped_schedule",
                            "test_names_per_harvester",
                            "test_reconstruction_uses_snapshot_not_registry"),
    "cli/test_demo_run.py": ("test_dagster_dev_does_not_warn_about_the_root_dagster_yaml",
                         "test_demo_prints_the_ui_line_after_it_answers",
                         "test_ui_line_waits_for_the_ui"),
    "test_deploy_configs.py": ("test_postgres_config_runs_a_job",
                               "test_retries_enable_the_daemon_that_launches_them",
                               "test_run_launcher_config_matches_its_class",
                               "test_shipped_dagster_yaml_concurrency_in_force"),
    "defs/test_op_retry.py": ("test_bad_retry_setting_fails_the_run_before_harvesting",
                         "test_interrupt_is_not_retried", "test_no_retries_by_default_in_tests",
                         "test_protocol_error_fails_at_once",
                         "test_retries_stop_after_the_configured_count",
                         "test_transient_failure_is_retried_from_the_checkpoint"),
    "operations/test_export.py": ("test_export_onto_a_full_disk",
                       "test_export_to_stdout_whose_reader_goes_away"),
    "test_formats.py": ("test_a_new_row_shows_in_the_help",),
    "harvesting/test_harvest_xslt_limits.py": ("test_a_hostile_record_fails_alone",),
    "test_packaging.py": ("test_dg_check_defs_loads_the_harvesters",),
    "operations/test_profile.py": ("test_coverage_carried_over_when_a_run_changes_nothing",
                        "test_records_asset_profiles_a_sample_past_its_cap",
                        "test_records_materialization_carries_coverage"),
    "defs/test_private.py": ("test_execute_in_location_gives_the_run_its_remote_origin",
                        "test_forget_defs_state_storage_lets_a_later_load_succeed",
                        "test_stored_schedule_statuses_one_running_state_wins"),
    "storage/test_registry.py": ("test_list_rows_keeps_rows_in_chunks_in_id_order",),
    "defs/test_schedule_stop.py": ("test_remove_without_webserver_stops_a_started_schedule",),
    "operations/test_shards.py": ("test_each_shard_location_loads_its_own_harvesters",),
    "defs/test_since_cursor.py": ("test_the_cursor_holds_at_most_64_bytes_per_harvester",
                             "test_an_empty_cursor_fills_every_entry_at_once"),
    "defs/test_since_dates.py": ("test_response_date_of_year_one_never_poisons_since",
                            "test_a_stored_since_before_earliest_is_asked_without_from",
                            "test_server_clock_minutes_ahead_loses_no_change",
                            "test_far_future_date_typed_into_the_cursor_is_refused",
                            "test_a_stored_far_future_since_harvests_in_full_then_heals",
                            "test_cursor_edit_of_since_alone_is_understood",
                            "test_run_config_since_ahead_of_the_clock_fails_the_run",
                            "test_run_config_since_before_earliest_is_asked_without_from",
                            "test_until_day_on_a_seconds_server_through_run_config_and_cli"),
    "harvesting/test_sweep.py": ("test_max_delete_default_and_cli",
                      "test_reconcile_against_a_broken_index_tombstones_nothing",
                      "test_reconcile_below_the_limit_is_unchanged",
                      "test_cli_holds_back_and_confirms",
                      "test_a_changed_set_sweeps_the_old_selection",
                      "test_a_changed_url_within_the_limit_sweeps_without_confirmation",
                      "test_a_resumed_harvest_of_the_new_selection_sweeps_on_the_next_full_run"),
    "defs/test_ui_launches.py": ("test_a_check_executes_alone_from_the_store",
                            "test_materialize_from_the_graph_tags_the_run",
                            "test_a_run_of_two_harvesters_is_not_tagged_as_either",
                            "test_a_cli_run_shows_in_its_jobs_runs_tab",
                            "test_the_harvest_command_names_the_location_it_knows"),
    "transform/test_plugin_sources.py": ("test_command_refuses_it_and_writes_nothing",
                                         "test_manage_harvesters_refuses_it"),
    "transform/test_xml.py": ("test_generated_trees_round_trip",),
    "validation/test_setup.py": ("test_shipped_schemas_are_in_the_built_wheel",),
}

# -- the soak set: `make soak` runs the tests marked `soak`; `make test` and `make check` do not
#
# Endurance cases, whose length is the point rather than a cost: a load of concurrent runs
# through a real `dagster dev`, many-round randomized convergence over dozens of seeds, a
# 200,000-record data set. Named as SLOW_TESTS are (a name that no longer exists fails the
# collection); CI runs `make test` and then `make soak`, so it still runs everything.

SOAK_TESTS = {
    "demo/test_server.py": ("test_make_dataset_200k_is_quick",),
    "reliability/test_convergence.py": ("test_store_converges_to_the_server_soak",),
    "reliability/test_load.py": ("test_load_through_run_queue_embedded",
                                 "test_load_through_run_queue_postgres"),
}
# -- the order: the longest files first -------------------------------------------------
#
# pytest-xdist's `--dist loadfile` hands each worker a whole file at a time, by default
# the files with the most tests first: the `dagster dev` sessions (a test or two each, but
# minutes long) came last, and one worker ran them alone while the other sat idle. Make
# passes `--no-loadscope-reorder`, and these files, the longest measured in `make test`
# (per-file sums of --durations), are collected first, longest first; the rest keep their
# order and fill the gaps. Listed names must exist (collection fails otherwise).

RUN_FIRST = (
    "e2e/test_dagster_dev.py", "defs/test_since.py", "e2e/test_shards_dev.py",
    "reliability/test_hangs.py", "browser/test_ui.py", "harvesting/test_sweep.py",
    "reliability/test_convergence.py", "e2e/test_ui_buttons.py", "defs/test_job.py",
    "reliability/test_faults.py", "harvesting/test_harvest_xslt_limits.py",
    "harvesting/test_windows.py", "harvesting/test_reconcile.py",
    "defs/test_ui_launches.py", "harvesting/test_short_list.py",
)
TESTS_DIR = Path(__file__).resolve().parent


def is_slow(module: str, function: str) -> bool:
    """Whether the test `function` of `module` (a path below oaipmh_dagster_tests/) is
    left out of the fast loop."""
    return (module.split("/")[0] in SLOW_FOLDERS or module in SLOW_MODULES
            or function in SLOW_TESTS.get(module, ()))


def is_soak(module: str, function: str) -> bool:
    """Whether the test `function` of `module` is left out of `make test` (`make soak`)."""
    return function in SOAK_TESTS.get(module, ())


def _check_listed(item: pytest.Item, module: str, lists: dict[str, dict[str, tuple[str, ...]]],
                  checked: set[tuple[str, str]]) -> None:
    """Fail the collection on a listed test that `module` no longer has."""
    for list_name, listed in lists.items():
        if module not in listed or (list_name, module) in checked:
            continue
        checked.add((list_name, module))
        gone = [name for name in listed[module]
                if not hasattr(getattr(item, "module", None), name)]
        if gone:
            raise pytest.UsageError(
                f"conftest.{list_name} names tests that {module} no longer has: "
                + ", ".join(gone))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests of the lists above `slow` or `soak` (a soak is slow too); fail on a
    listed test that is gone."""
    checked: set[tuple[str, str]] = set()
    lists = {"SLOW_TESTS": SLOW_TESTS, "SOAK_TESTS": SOAK_TESTS}
    modules: dict[str, str] = {}
    for item in items:
        module = Path(str(item.fspath)).resolve().relative_to(TESTS_DIR).as_posix()
        modules[item.nodeid] = module
        function = getattr(item, "originalname", item.name)
        soak = is_soak(module, function)
        if soak or is_slow(module, function):
            item.add_marker(pytest.mark.slow)
        if soak:
            item.add_marker(pytest.mark.soak)
        _check_listed(item, module, lists, checked)
    missing = [module for module in RUN_FIRST if not (TESTS_DIR / module).is_file()]
    if missing:
        raise pytest.UsageError("conftest.RUN_FIRST names files that do not exist: "
                                + ", ".join(missing))
    rank = {module: i for i, module in enumerate(RUN_FIRST)}
    items.sort(key=lambda item: rank.get(modules[item.nodeid], len(RUN_FIRST)))


@pytest.fixture
def reloads(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The code-location reloads asked for, each answered as done (no webserver is
    asked): `operations/test_bulk.py`, `defs/test_manage_import.py`."""
    from oaipmh_dagster.operations import reload

    calls: list[dict[str, Any]] = []

    def fake(**kwargs: Any) -> tuple[bool, str]:
        calls.append(kwargs)
        return True, f"reloaded for {kwargs['harvester_id']}"

    monkeypatch.setattr(reload, "reload_code_location", fake)
    return calls
