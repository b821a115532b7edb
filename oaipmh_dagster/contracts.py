"""The names Dagster, operators and tools see: jobs, schedules, assets, ops, pools, run
tags, the since sensor and the materialization metadata keys. Plain strings and
functions (no Dagster import), so every layer and tool spells them one way."""

from __future__ import annotations

from collections.abc import Sequence

# -- jobs, schedules, ops, groups, pools ------------------------------------------------

JOB_PREFIX = "harvest_oaipmh_records_"
# Dagster's implicit asset job (the asset graph's Materialize button, backfills).
ASSET_JOB_PREFIX = "__ASSET_JOB"
OP_PREFIX = "harvest_"
# The op that evaluates a code location's asset checks (see defs/checks.py).
CHECKS_OP = "oaipmh_checks"
HOST_POOL_PREFIX = "oaipmh/host/"


def job_name(harvester_id: str) -> str:
    """Name of the harvester's job and of its schedule (Dagster allows both)."""
    return JOB_PREFIX + harvester_id


def op_name(harvester_id: str) -> str:
    """Name of the op that materializes a harvester's assets (run config goes under it)."""
    return OP_PREFIX + harvester_id


def group_name(harvester_id: str) -> str:
    """Asset group of a harvester's assets."""
    return f"oaipmh_{harvester_id}"


def host_pool(host: str) -> str:
    """Concurrency pool of every op that harvests from `host` (`dagster.yaml` sets its
    default limit), whichever job runs the op."""
    return HOST_POOL_PREFIX + host


# -- assets ------------------------------------------------------------------------------

ASSET_PREFIX = "oaipmh"
SOURCE = "source"
RAW_RECORDS = "raw_records"
RECORDS = "records"


def asset_paths(harvester_id: str) -> tuple[list[str], list[str], list[str]]:
    """Key paths of a harvester's (source, raw_records, records) assets."""
    return ([ASSET_PREFIX, harvester_id, SOURCE], [ASSET_PREFIX, harvester_id, RAW_RECORDS],
            [ASSET_PREFIX, harvester_id, RECORDS])


def harvester_of(path: Sequence[str], name: str | None = None) -> str | None:
    """The harvester id in an asset key path of ours (of asset `name` when given)."""
    if (len(path) == 3 and path[0] == ASSET_PREFIX
            and path[2] in (SOURCE, RAW_RECORDS, RECORDS) and name in (None, path[2])):
        return path[1]
    return None


CHECK_NO_FAILED = "no_failed_records"
CHECK_COMPLETE = "complete_list_size_matches"
CHECK_SCHEMA_VALID = "schema_valid"  # on raw_records, for harvesters that validate

# -- run tags ----------------------------------------------------------------------------

HARVESTER_TAG = "oaipmh/harvester"
HOST_TAG = "oaipmh/host"
# Set by the op when the run starts: the since it harvests from, and where that came from.
SINCE_TAG = "oaipmh/since"
SINCE_SOURCE_TAG = "oaipmh/since_source"
# Set by the schedule from the since in force at tick time, by the op when it starts
# on a harvest launched without it: `full` (none, or asked) or `incremental`; the
# deploy files limit concurrent full harvests on it.
MODE_TAG = "oaipmh/mode"
MODE_FULL = "full"
MODE_INCREMENTAL = "incremental"
# Set by the op on runs that reconcile.
RECONCILE_TAG = "oaipmh/reconcile"
# Dagster's own tag on scheduled runs.
SCHEDULE_TAG = "dagster/schedule_name"

# -- the since sensor --------------------------------------------------------------------

SENSOR_NAME = "oaipmh_since_sensor"

# -- metadata keys -----------------------------------------------------------------------

# raw_records materialization metadata written by a harvest
RESPONSE_DATE_KEY = "oai/response_date"
NEXT_SINCE_KEY = "oai/next_since"
ADVANCES_SINCE_KEY = "oai/advances_since"
SCOPE_KEY = "oai/scope"
SINCE_NOTE_KEY = "oai/since_note"
# the lists whose completeListSize the harvest judged, and those that ended short of it
LISTS_JUDGED_KEY = "oai/lists_judged"
SHORT_LISTS_KEY = "oai/short_lists"
# raw_records observation metadata: the since in force (SINCE_KEY also on materializations)
SINCE_KEY = "oai/since"
SINCE_SOURCE_KEY = "oai/since_source"
OPERATOR_KEY = "oai/set_by_operator"
# Definitions metadata: the harvester rows the code location was built from.
ROWS_KEY = "oaipmh/harvesters"
# A harvester's schema field naming an ISO Schematron file: this prefix and its path.
SCHEMATRON_PREFIX = "schematron:"
# The error types of a record that is kept although invalid: XML Schema, Schematron.
SCHEMA_ERROR = "schema"
SCHEMATRON_ERROR = "schematron"
