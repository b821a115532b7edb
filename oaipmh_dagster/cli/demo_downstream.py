"""The demo's code location: what `oaipmh_dagster.definitions` serves, plus an example of
an asset downstream of a harvest, `oaipmh/demo/records_by_year` (the demo harvester's
live records counted by the year of their datestamp), so the asset graph reads
source -> raw_records -> records -> records_by_year. `oaipmh-dagster demo` serves this
module instead of `oaipmh_dagster.definitions` (see `cli.demo.demo_workspace`); in a
sharded workspace only the location that holds the demo harvester gets the example."""

# No `from __future__ import annotations`: Dagster reads the asset's annotations as types.
import dagster as dg
import pandas as pd  # a real import: Dagster reads the input's annotation

from oaipmh_dagster.contracts import ASSET_PREFIX, group_name
from oaipmh_dagster.definitions import load_definitions
from oaipmh_dagster.defs.records_io import records_key, serves_records

__all__ = ["DEMO_ID", "MODULE", "RECORDS_BY_YEAR", "defs", "records_by_year", "with_example"]

DEMO_ID = "demo"
MODULE = __name__
RECORDS_BY_YEAR = dg.AssetKey([ASSET_PREFIX, DEMO_ID, "records_by_year"])


@dg.asset(
    key=RECORDS_BY_YEAR,
    ins={"records": dg.AssetIn(key=records_key(DEMO_ID))},
    group_name=group_name(DEMO_ID),
    kinds={"pandas"},
    description="Example of an asset downstream of a harvest: the demo harvester's live "
    "records counted by the year of their datestamp (materializing it alone reads the "
    "record store; nothing is harvested).",
)
def records_by_year(context: dg.AssetExecutionContext, records: pd.DataFrame) -> pd.DataFrame:
    """Live records per datestamp year, with the number that carry a creator."""
    years = records["datestamp"].dt.year.rename("year")
    with_creator = records["creator"].map(bool) if "creator" in records else False
    counts = (records.assign(year=years, with_creator=with_creator)
              .groupby("year")
              .agg(records=("oai_identifier", "size"), with_creator=("with_creator", "sum"))
              .reset_index())
    context.add_output_metadata({
        "dagster/row_count": len(counts),
        "records": len(records),
        "preview": dg.MetadataValue.md(counts.to_markdown(index=False)),
    })
    return counts


def with_example(base: dg.Definitions) -> dg.Definitions:
    """`base` with the example asset when `base` holds the demo harvester's records."""
    if not serves_records(base, DEMO_ID):
        return base
    return dg.Definitions.merge(base, dg.Definitions(assets=[records_by_year]))


@dg.definitions
def defs() -> dg.Definitions:
    """Entry point of the demo's code location(s)."""
    return with_example(load_definitions())
