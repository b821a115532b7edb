"""Every exception the package raises to its callers has one root."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import oaipmh_dagster
from oaipmh_dagster.errors import OAIPMHDagsterError

# Internal signals that never leave their module (the demo server's protocol answer, the
# transport's deadline inside httpx, the window workers' stop, the XSLT worker process's
# per-record outcomes, sent to the harvest as messages) and the CLI's exit signals (its
# click exceptions, a stdout that is closed or whose reader went away), which `main` ends.
EXEMPT = {"oaipmh_dagster.demo.protocol.OAIError", "oaipmh_dagster.oai._deadline.DeadlineExceeded",
          "oaipmh_dagster.cli.commands.UsageProblem", "oaipmh_dagster.cli.commands.Failure",
          "oaipmh_dagster.harvesting.parallel._Stop", "oaipmh_dagster.transform._xslt_worker.Refused",
          "oaipmh_dagster.transform._xslt_worker.Failed", "oaipmh_dagster.cli.commands._ReaderGone",
          "oaipmh_dagster.cli.stdout.StdoutClosed",
          # An OAI-PMH error answer of `serve` (as the demo endpoint's OAIError).
          "oaipmh_dagster.serve.arguments.ProtocolError"}


def test_every_package_exception_is_under_the_root() -> None:
    stray = []
    for info in pkgutil.walk_packages(oaipmh_dagster.__path__, "oaipmh_dagster."):
        if ".migrations" in info.name:
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if (inspect.isclass(obj) and issubclass(obj, BaseException)
                    and obj.__module__ == module.__name__
                    and f"{obj.__module__}.{name}" not in EXEMPT
                    and not issubclass(obj, OAIPMHDagsterError)):
                stray.append(f"{obj.__module__}.{name}")
    assert stray == []
