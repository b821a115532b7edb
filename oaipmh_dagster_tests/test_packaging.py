"""pyproject.toml: an SPDX license expression, every directly imported third-party
package declared, and the dev tools pinned with the Dagster set."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from oaipmh_dagster_tests.conftest import REPO_ROOT


def _project() -> dict[str, Any]:
    return tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())


def _pins(requirements: list[str]) -> dict[str, str]:
    """name -> version specifier of each requirement line."""
    out = {}
    for line in requirements:
        match = re.match(r"([A-Za-z0-9_.-]+)\s*(.*)", line)
        assert match, line
        out[match.group(1).lower()] = match.group(2)
    return out


def test_license_is_an_spdx_expression() -> None:
    data = _project()
    assert data["project"]["license"] == "MIT"
    # PEP 639 license expressions need setuptools 77 or newer as the build backend.
    backend = _pins(data["build-system"]["requires"])["setuptools"]
    assert re.fullmatch(r">=\s*(\d+)(\.\d+)*", backend)
    assert int(re.findall(r"\d+", backend)[0]) >= 77


def test_package_data_ships_every_schema() -> None:
    """Every .xsd of the package (the transformers' schemas, the OAI-PMH response schema
    of `serve`) matches a package-data pattern, so an installed wheel holds it."""
    import fnmatch

    patterns = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"][
        "setuptools"]["package-data"]["oaipmh_dagster"]
    package = REPO_ROOT / "oaipmh_dagster"
    schemas = [p.relative_to(package).as_posix() for p in package.rglob("*.xsd")]
    assert "serve/OAI-PMH.xsd" in schemas
    assert [s for s in schemas if not any(fnmatch.fnmatch(s, p) for p in patterns)] == []


def test_tabulate_is_declared() -> None:
    """cli.py imports tabulate itself: it may not ride on Dagster's dependencies."""
    assert "tabulate" in _pins(_project()["project"]["dependencies"])


def test_dg_cli_is_pinned_with_the_dagster_set() -> None:
    data = _project()
    dagster = _pins(data["project"]["dependencies"])["dagster"]
    dev = _pins(data["project"]["optional-dependencies"]["dev"])
    assert dev["dagster-dg-cli"] == dagster
    # The minor series, never open-ended (test_private.py checks the series it names).
    assert re.fullmatch(r">=1\.(\d+)\.\d+,<1\.(\d+)", dagster)


def test_run_launcher_extras_are_pinned_with_the_dagster_set() -> None:
    """Each deploy file's launcher package is an extra pinned at the library version of
    the Dagster set (the one dagster-postgres has), the dev extra installs them all so
    the tests check every deploy file against its launcher's schema, and the Dockerfile
    installs the extras it is built with."""
    data = _project()
    extras = data["project"]["optional-dependencies"]
    library = _pins(data["project"]["dependencies"])["dagster-postgres"]
    assert re.fullmatch(r">=0\.(\d+)\.\d+,<0\.(\d+)", library)
    packages = {"k8s": "dagster-k8s", "docker": "dagster-docker",
                "celery-k8s": "dagster-celery-k8s"}
    for extra, package in packages.items():
        assert _pins(extras[extra]) == {package: library}
    assert "oaipmh-dagster[k8s,docker,celery-k8s]" in extras["dev"]
    dockerfile = (REPO_ROOT / "Dockerfile").read_text()
    assert 'ARG EXTRAS=""' in dockerfile
    assert 'RUN test -z "$EXTRAS" || pip install --no-cache-dir ".$EXTRAS"' in dockerfile
    for extra in packages:
        assert f'EXTRAS="[{extra}]"' in (REPO_ROOT / "deploy" / "README.md").read_text()


def test_dg_project_points_at_the_definitions_module() -> None:
    dg = _project()["tool"]["dg"]
    assert dg["directory_type"] == "project"
    assert dg["project"]["code_location_target_module"] == "oaipmh_dagster.definitions"


def _make_dry_run(*args: str) -> str:
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    proc = subprocess.run([make, "-n", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "MAKEFLAGS": ""})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_make_demo_passes_the_ports() -> None:
    out = _make_dry_run("demo", "PORT=3111", "OAI_PORT=8111")
    assert "oaipmh-dagster demo --port 3111 --oai-port 8111" in out
    assert "oaipmh-dagster demo --port 3000 --oai-port 8765" in _make_dry_run("demo")


def test_make_test_checks_the_definitions_with_dg() -> None:
    lines = _make_dry_run("test").splitlines()
    dg_line = next(i for i, line in enumerate(lines) if "dg check defs" in line)
    pytest_line = next(i for i, line in enumerate(lines) if "-m pytest" in line)
    assert dg_line < pytest_line


def _pytest_line(target: str, *args: str) -> str:
    (line,) = [line for line in _make_dry_run(target, *args).splitlines() if "-m pytest" in line]
    return line.split("-m pytest", 1)[1]


def test_make_check_is_lint_types_and_the_fast_tests() -> None:
    out = _make_dry_run("check", "JOBS=1")
    assert "ruff check" in out and "mypy" in out
    assert _pytest_line("check", "JOBS=1").split() == ["-q", "-m", '"not', "slow", "and",
                                                       "not", 'browser"']


def test_make_test_runs_every_test_but_the_soak_set() -> None:
    assert _pytest_line("test", "JOBS=1").split() == ["-m", '"not', 'soak"']


def test_make_soak_runs_the_soak_set_and_ci_runs_it_after_make_test() -> None:
    assert _pytest_line("soak", "JOBS=1").split() == ["-m", "soak"]
    commands = [line.strip() for line in (REPO_ROOT / ".ci" / "run").read_text().splitlines()
                if line.startswith("make ")]
    assert commands == ["make test", "make soak"]


def test_slow_marks_folders_modules_and_listed_tests() -> None:
    from oaipmh_dagster_tests.conftest import SLOW_MODULES, SLOW_TESTS, is_slow

    assert is_slow("e2e/test_dagster_dev.py", "test_anything")
    assert is_slow("reliability/test_faults.py", "test_anything")
    assert is_slow("defs/test_since.py", "test_anything")
    assert is_slow("cli/test_cli.py", "test_invalid_row") and not is_slow("cli/test_cli.py", "test_x")
    assert not is_slow("harvesting/test_plan.py", "test_anything")
    tests = REPO_ROOT / "oaipmh_dagster_tests"
    assert all((tests / module).is_file() for module in (*SLOW_MODULES, *SLOW_TESTS))


def test_soak_marks_listed_tests_only() -> None:
    from oaipmh_dagster_tests.conftest import SOAK_TESTS, is_soak

    assert is_soak("reliability/test_load.py", "test_load_through_run_queue_embedded")
    assert not is_soak("reliability/test_load.py", "test_anything")
    assert not is_soak("e2e/test_dagster_dev.py", "test_dagster_dev_end_to_end")
    tests = REPO_ROOT / "oaipmh_dagster_tests"
    assert all((tests / module).is_file() for module in SOAK_TESTS)


def test_the_longest_files_are_collected_first(request: pytest.FixtureRequest) -> None:
    """RUN_FIRST's files lead the collection, in its order (xdist then starts them first)."""
    from oaipmh_dagster_tests.conftest import RUN_FIRST, TESTS_DIR

    assert all((TESTS_DIR / module).is_file() for module in RUN_FIRST)
    assert len(set(RUN_FIRST)) == len(RUN_FIRST)
    order = [Path(str(item.fspath)).relative_to(TESTS_DIR).as_posix()
             for item in request.session.items]
    firsts = [module for module in dict.fromkeys(order) if module in RUN_FIRST]
    assert firsts == [module for module in RUN_FIRST if module in order]
    listed = [module in RUN_FIRST for module in order]
    assert listed == sorted(listed, reverse=True)  # before every other file


def test_property_tests_have_no_deadline() -> None:
    """A Hypothesis example is never failed for its time (a loaded machine is slow)."""
    from hypothesis import HealthCheck, settings

    assert settings().deadline is None
    assert HealthCheck.too_slow in settings().suppress_health_check


def test_dg_check_defs_loads_the_harvesters(tmp_path: Path) -> None:
    """`dg check defs` (as `make test` runs it) finds the project through [tool.dg] and
    loads the code location with its harvesters."""
    from oaipmh_dagster.storage import db
    from oaipmh_dagster.storage.registry import Harvester, Registry

    url = f"sqlite:///{tmp_path / 'reg.sqlite'}"
    registry = Registry(db.get_engine(url))
    for i in range(3):
        registry.add(Harvester(id=f"h{i}", base_url="http://127.0.0.1:9/oai",
                               metadata_prefix="oai_dc", cron="0 4 * * *"))
    venv = Path(sys.executable).parent.parent
    env = {**os.environ, db.DATABASE_URL_ENV: url, "DAGSTER_HOME": str(tmp_path),
           "VIRTUAL_ENV": str(venv)}
    proc = subprocess.run([str(Path(sys.executable).with_name("dg")), "check", "defs"],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "All definitions loaded successfully" in proc.stdout + proc.stderr
