"""A harvester's live records as DataFrames: columns, lists, missing fields, batches."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pandas as pd
import pytest

from oaipmh_dagster.operations.frames import RecordBatches, records_frame, records_frames
from oaipmh_dagster.storage.ports import DATESTAMP_PLACEHOLDER
from oaipmh_dagster_tests.memory_store import MemoryStore

H = "frames"
WHEN = datetime(2025, 1, 1, tzinfo=UTC)


def _row(identifier: str, metadata: Any, *, deleted: bool = False,
         datestamp: str = "2024-01-02T03:04:05Z", sets: tuple[str, ...] = ()) -> dict:
    return {
        "harvester_id": H, "oai_identifier": identifier, "datestamp": datestamp,
        "deleted": deleted, "sets": json.dumps(list(sets)), "raw_xml": "<x/>",
        "metadata": None if deleted else json.dumps(metadata), "errors": "[]",
        "harvested_at": WHEN, "run_id": "r1", "transformed_at": WHEN, "content_hash": "d",
    }


@pytest.fixture
def store() -> MemoryStore:
    s = MemoryStore()
    with s.page(H, None) as page:
        page.upsert([
            _row("oai:x:2", {"title": ["Two"], "creator": ["A", "B"]}, sets=("s1", "s2")),
            _row("oai:x:1", {"title": ["One"], "date": ["2021"]},
                 datestamp="2021-05-06T07:08:09Z"),
            _row("oai:x:3", None, deleted=True),
            _row("oai:x:4", {"title": ["Four"], "sets": ["clash"]},
                 datestamp=DATESTAMP_PLACEHOLDER),
        ])
    return s


def test_frame_has_one_row_per_live_record_and_the_fields_as_columns(store: MemoryStore
                                                                     ) -> None:
    frame = records_frame(store, H)
    assert list(frame.columns) == ["oai_identifier", "datestamp", "sets", "title", "date",
                                   "creator", "metadata.sets"]
    assert frame["oai_identifier"].tolist() == ["oai:x:1", "oai:x:2", "oai:x:4"]
    assert frame["title"].tolist() == [["One"], ["Two"], ["Four"]]
    assert frame["creator"].tolist() == [None, ["A", "B"], None]
    assert frame["sets"].tolist() == [[], ["s1", "s2"], []]
    assert frame["metadata.sets"].tolist() == [None, None, ["clash"]]
    dtype = frame["datestamp"].dtype
    assert isinstance(dtype, pd.DatetimeTZDtype) and str(dtype.tz) == "UTC"
    assert frame["datestamp"][0] == pd.Timestamp("2021-05-06T07:08:09Z")
    assert pd.isna(frame["datestamp"][2])  # the placeholder of an unreadable datestamp


def test_columns_keep_the_identifier_and_the_named_ones(store: MemoryStore) -> None:
    frame = records_frame(store, H, columns=["title"])
    assert list(frame.columns) == ["oai_identifier", "title"]


def test_metadata_that_is_not_a_dict_is_one_column() -> None:
    s = MemoryStore()
    with s.page(H, None) as page:
        page.upsert([_row("a", ["x", "y"]), _row("b", {"title": ["B"]})])
    frame = records_frame(s, H)
    assert list(frame.columns) == ["oai_identifier", "datestamp", "sets", "title", "metadata"]
    assert frame["metadata"].tolist() == [["x", "y"], None]


def test_no_live_record_is_an_empty_frame_with_the_header_columns() -> None:
    frame = records_frame(MemoryStore(), H)
    assert list(frame.columns) == ["oai_identifier", "datestamp", "sets"]
    assert len(frame) == 0
    assert list(records_frames(MemoryStore(), H, batch_size=10)) == []


def test_batches_cover_the_frame_in_order(store: MemoryStore) -> None:
    batches = RecordBatches(store, H, batch_size=2)
    frames = list(batches)
    assert [len(f) for f in frames] == [2, 1]
    assert frames[1]["oai_identifier"].tolist() == ["oai:x:4"]
    assert "creator" not in frames[1].columns  # a batch has the fields of its records
    together = pd.concat(frames, ignore_index=True)
    assert together["oai_identifier"].tolist() == records_frame(store, H)[
        "oai_identifier"].tolist()
    assert [len(f) for f in batches] == [2, 1]  # iterable again
    assert batches.count() == 3


def test_a_batch_size_below_one_is_refused(store: MemoryStore) -> None:
    with pytest.raises(ValueError, match="positive"):
        next(records_frames(store, H, batch_size=0))
