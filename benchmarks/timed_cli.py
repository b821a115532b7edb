"""`oaipmh-dagster ARGS` with timestamps, for case 11's breakdown of an add:

    python -m benchmarks.timed_cli OUT.json harvester add ID ...

runs the console script's `main` unchanged and writes to OUT.json the
`time.monotonic()` (one clock for every process of the machine) of: the interpreter
up, the CLI's modules imported, the registry row written, each GraphQL request of the
reload sent and answered, and the process's CPU seconds."""

from __future__ import annotations

import time

UP = time.monotonic()

import json  # noqa: E402 - the first mark comes before every import
import resource  # noqa: E402
import sys  # noqa: E402
from typing import Any  # noqa: E402


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _hook(marks: dict[str, Any]) -> None:
    """Time the registry write and the reload's GraphQL requests."""
    from oaipmh_dagster.operations import reload
    from oaipmh_dagster.storage import registry

    add = registry.Registry.add

    def timed_add(self: Any, *args: Any, **kwargs: Any) -> Any:
        marks["write_started"] = time.monotonic()
        try:
            return add(self, *args, **kwargs)
        finally:
            marks["written"] = time.monotonic()

    graphql = reload._graphql

    def timed_graphql(client: Any, url: str, query: str, variables: dict) -> dict:
        name = "reload" if query is reload.RELOAD_MUTATION else "query"
        marks.setdefault("requests", []).append([name, time.monotonic()])
        try:
            return graphql(client, url, query, variables)
        finally:
            marks["requests"][-1].append(time.monotonic())

    registry.Registry.add = timed_add  # type: ignore[method-assign]
    reload._graphql = timed_graphql


def main() -> int:
    out, argv = sys.argv[1], sys.argv[2:]
    marks: dict[str, Any] = {"up": UP}
    from oaipmh_dagster.cli import commands as cli

    marks["imported"] = time.monotonic()
    marks["modules"] = sorted(m for m in ("dagster", "httpx", "sqlalchemy")
                              if m in sys.modules)
    _hook(marks)
    marks["hooked"] = time.monotonic()  # the hook imports `reload` (httpx) early
    code = 0
    try:
        cli.main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    marks["done"] = time.monotonic()
    marks["cpu"] = _cpu()
    marks["exit"] = code
    with open(out, "w", encoding="utf-8") as f:
        json.dump(marks, f)
    return code


if __name__ == "__main__":
    sys.exit(main())
