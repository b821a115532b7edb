"""`python -m oaipmh_dagster.cli`: the command."""

from oaipmh_dagster.cli.commands import main

if __name__ == "__main__":
    main()
