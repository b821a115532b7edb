"""Records whose oai_dc breaks the oai_dc schema the way real providers' does, served by
`oaipmh-dagster demo` on top of the generated data set so that the `demo` harvester's
`schema_valid` check has something to report (and its field coverage a gap)."""

from __future__ import annotations

from datetime import UTC, datetime

from oaipmh_dagster.demo.dataset import DC_NS, OAI_DC_NS, XSI_NS, Dataset, ServedRecord

__all__ = ["INVALID_OAI_DC", "add_invalid_records", "invalid_records"]

_OPEN = (f'<oai_dc:dc xmlns:oai_dc="{OAI_DC_NS}" xmlns:dc="{DC_NS}" xmlns:xsi="{XSI_NS}" '
         f'xsi:schemaLocation="{OAI_DC_NS} http://www.openarchives.org/OAI/2.0/oai_dc.xsd"')
_CLOSE = "</oai_dc:dc>"

# identifier -> (datestamp, what is wrong, the oai_dc XML)
INVALID_OAI_DC: dict[str, tuple[datetime, str, str]] = {
    "oai:demo.example.org:invalid-1": (
        datetime(2023, 3, 14, 9, 26, 53, tzinfo=UTC),
        "a misspelt element: dc:titel instead of dc:title (the record has no title)",
        _OPEN + ">"
        "<dc:titel>Field notes on alpine meadow pollinators</dc:titel>"
        "<dc:creator>Horváth, Eva</dc:creator>"
        "<dc:date>2023</dc:date>"
        "<dc:type>Text</dc:type>"
        "<dc:identifier>https://doi.org/10.5072/demo.invalid.1</dc:identifier>"
        + _CLOSE,
    ),
    "oai:demo.example.org:invalid-2": (
        datetime(2023, 8, 2, 16, 4, 11, tzinfo=UTC),
        "an element outside the 15 DC elements: dcterms:license",
        _OPEN + ' xmlns:dcterms="http://purl.org/dc/terms/">'
        "<dc:title>Survey of reading habits in public libraries</dc:title>"
        "<dc:creator>Okafor, Aisha</dc:creator>"
        "<dc:date>2022</dc:date>"
        "<dc:type>Dataset</dc:type>"
        "<dcterms:license>https://creativecommons.org/licenses/by/4.0/</dcterms:license>"
        "<dc:identifier>https://doi.org/10.5072/demo.invalid.2</dc:identifier>"
        + _CLOSE,
    ),
    "oai:demo.example.org:invalid-3": (
        datetime(2024, 1, 22, 11, 45, 0, tzinfo=UTC),
        "text directly inside oai_dc:dc (an abstract outside any element)",
        _OPEN + ">"
        "<dc:title>Sediment cores from the Elbe estuary</dc:title>"
        "<dc:creator>Larsen, Björn</dc:creator>"
        "Abstract: grain size and organic carbon in twelve cores."
        "<dc:date>2024</dc:date>"
        "<dc:type>Dataset</dc:type>"
        "<dc:identifier>https://doi.org/10.5072/demo.invalid.3</dc:identifier>"
        + _CLOSE,
    ),
}


def invalid_records() -> list[ServedRecord]:
    """The records of `INVALID_OAI_DC`, in oai_dc only, in no set."""
    return [ServedRecord(identifier, stamp, (), False, {"oai_dc": xml})
            for identifier, (stamp, _, xml) in INVALID_OAI_DC.items()]


def add_invalid_records(dataset: Dataset) -> int:
    """Add the invalid records to `dataset` when it serves oai_dc; how many were added."""
    if "oai_dc" not in dataset.prefixes:
        return 0
    records = invalid_records()
    dataset.extend(records)
    return len(records)
