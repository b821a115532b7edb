"""The `oaipmh-dagster` command: commands, in-process runs, stdout rules, the demo.

`main` is the console script (`oaipmh_dagster.cli.commands:main`)."""

from oaipmh_dagster.cli.commands import cli, main

__all__ = ["cli", "main"]
