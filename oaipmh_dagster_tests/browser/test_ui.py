"""The Dagster UI as an operator uses it for the demo harvester, in headless Chromium.

The steps of the first-run tour, in order (they share one `oaipmh-dagster demo`):
launch the job from the Launchpad, read the asset graph and the materialization, the
records' field coverage and the schema_valid check (the demo serves three records whose
oai_dc its schema rejects), toggle the schedule, read the since sensor's cursor, see raw_records' freshness and the assets'
tags, add a harvester from the Launchpad of `manage_harvesters` and run its new job. Each
step saves screenshots (conftest).

The demo harvested once before the UI started, so the launched run is incremental: it
resolves its since when it starts from that harvest's `oai/next_since` (source `run`,
shown in its tags), and the since sensor then publishes the launched run's own."""

from __future__ import annotations

import json
import re
import time
import urllib.parse
from typing import Any

import pytest

try:
    from playwright.sync_api import expect
except ImportError:  # the fixtures skip (or fail in CI) with the reason
    expect = None

from oaipmh_dagster.demo.invalid import INVALID_OAI_DC
from oaipmh_dagster_tests.browser.conftest import ARTIFACTS, LOCATION, DagsterUI

pytestmark = pytest.mark.browser


HARVESTER = "demo"
JOB = f"harvest_oaipmh_records_{HARVESTER}"
GROUP = f"oaipmh_{HARVESTER}"
SENSOR = "oaipmh_since_sensor"
REPOSITORY = "__repository__"
RUN_ID = re.compile(r"/runs/([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})")

RUN_QUERY = """
query Run($runId: ID!) { runOrError(runId: $runId) { __typename
  ... on Run { status jobName tags { key value } } } }
"""
# The demo harvester's hourly schedule ("0 * * * *") may add a run of its own during the
# tour: the steps read the run the tour launched, and that run's materializations and
# checks, by its id (a scheduled run carries the tag dagster/schedule_name).
SCHEDULE_NAME_TAG = "dagster/schedule_name"
RECENT = 10  # more than the scheduled runs an hour-long tour could see
SUCCESS_QUERY = """
query Latest($job: String!, $limit: Int!) { runsOrError(
  filter: {pipelineName: $job, statuses: [SUCCESS]}, limit: $limit) {
  ... on Runs { results { runId tags { key value } } } } }
"""
MATERIALIZATION_QUERY = """
query Mat($path: [String!]!) { assetOrError(assetKey: {path: $path}) { __typename
  ... on Asset { assetMaterializations(limit: 10) { runId timestamp metadataEntries { label
    ... on TextMetadataEntry { text } ... on IntMetadataEntry { intValue }
    ... on BoolMetadataEntry { boolValue } ... on MarkdownMetadataEntry { mdStr }
    ... on JsonMetadataEntry { jsonString } } } } } }
"""
CHECK_QUERY = """
query Check($key: AssetKeyInput!, $name: String!) {
  assetCheckExecutions(assetKey: $key, checkName: $name, limit: 10) { runId status
    evaluation { severity success metadataEntries { label
      ... on IntMetadataEntry { intValue } ... on TextMetadataEntry { text }
      ... on MarkdownMetadataEntry { mdStr } } } } }
"""
GROUP_QUERY = """
query Group($group: String!, $location: String!, $repo: String!) {
  assetNodes(group: {groupName: $group, repositoryLocationName: $location,
                     repositoryName: $repo}) { assetKey { path } dependencyKeys { path } } }
"""
SCHEDULE_QUERY = """
query Schedule($location: String!, $repo: String!, $name: String!) {
  scheduleOrError(scheduleSelector: {repositoryLocationName: $location,
    repositoryName: $repo, scheduleName: $name}) { __typename
    ... on Schedule { scheduleState { status } } } }
"""
SENSOR_QUERY = """
query Sensor($location: String!, $repo: String!, $name: String!) {
  sensorOrError(sensorSelector: {repositoryLocationName: $location,
    repositoryName: $repo, sensorName: $name}) { __typename
    ... on Sensor { sensorState { status typeSpecificData {
      ... on SensorData { lastCursor } } } } } }
"""


# --------------------------------------------------------------------------- helpers


def run_status(ui: DagsterUI, run_id: str) -> str:
    return ui.graphql(RUN_QUERY, {"runId": run_id})["runOrError"]["status"]


def wait_for_run(ui: DagsterUI, run_id: str, timeout: float = 180.0) -> str:
    """Poll the run's status until it is finished; returns it."""
    deadline = time.monotonic() + timeout
    status = run_status(ui, run_id)
    while status not in ("SUCCESS", "FAILURE", "CANCELED"):
        assert time.monotonic() < deadline, f"run {run_id} still {status} after {timeout} s"
        time.sleep(1.0)
        status = run_status(ui, run_id)
    return status


def run_id_in(url: str) -> str:
    """The run id of a run page's address."""
    match = RUN_ID.search(url)
    assert match, f"not a run page: {url}"
    return match.group(1)


def launched_run(ui: DagsterUI) -> str:
    """The newest successful run of the demo job that no schedule launched (after test 1:
    the one the UI launched)."""
    runs = ui.graphql(SUCCESS_QUERY, {"job": JOB, "limit": RECENT})["runsOrError"]["results"]
    unscheduled = [r["runId"] for r in runs
                   if SCHEDULE_NAME_TAG not in {t["key"] for t in r["tags"]}]
    assert unscheduled, f"no successful run of {JOB} but scheduled ones: {runs}"
    return unscheduled[0]


def materializations(ui: DagsterUI, name: str) -> list[dict[str, Any]]:
    """An asset's newest materializations, newest first."""
    path = ["oaipmh", HARVESTER, name]
    asset = ui.graphql(MATERIALIZATION_QUERY, {"path": path})["assetOrError"]
    assert asset["__typename"] == "Asset", asset
    mats = asset["assetMaterializations"]
    assert mats, f"{'/'.join(path)} was never materialized"
    return mats


def latest_materialization(ui: DagsterUI, name: str) -> tuple[str, dict[str, Any]]:
    """(run id, {label: value}) of an asset's newest materialization."""
    newest = materializations(ui, name)[0]
    return newest["runId"], entry_values(newest["metadataEntries"])


def materialization_of(ui: DagsterUI, name: str, run_id: str) -> dict[str, Any]:
    """{label: value} of the asset's materialization by run `run_id`."""
    mats = [m for m in materializations(ui, name) if m["runId"] == run_id]
    assert mats, f"run {run_id} did not materialize {name}"
    return entry_values(mats[0]["metadataEntries"])


def materialization_before(ui: DagsterUI, name: str, run_id: str) -> dict[str, Any]:
    """{label: value} of the asset's materialization just before run `run_id`'s (the one
    whose since that run resolved: runs of one harvester never overlap)."""
    mats = materializations(ui, name)
    at = next(i for i, m in enumerate(mats) if m["runId"] == run_id)
    assert at + 1 < len(mats), f"no materialization of {name} before run {run_id}"
    return entry_values(mats[at + 1]["metadataEntries"])


def entry_values(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """{label: value} of GraphQL metadata entries (JSON ones decoded)."""
    values: dict[str, Any] = {}
    for entry in entries:
        for key in ("text", "intValue", "boolValue", "mdStr", "jsonString"):
            if key in entry:
                value = entry[key]
                values[entry["label"]] = json.loads(value) if key == "jsonString" else value
    return values


def check_of(ui: DagsterUI, asset: str, check: str, run_id: str) -> dict[str, Any]:
    """The execution of an asset check in run `run_id`: runId, status, evaluation (its
    metadata as {label: value} under `metadata`)."""
    key = {"path": ["oaipmh", HARVESTER, asset]}
    executions = ui.graphql(CHECK_QUERY, {"key": key, "name": check})["assetCheckExecutions"]
    executions = [e for e in executions if e["runId"] == run_id]
    assert executions, f"{check} on {asset} did not run in run {run_id}"
    execution = executions[0]
    execution["metadata"] = entry_values(execution["evaluation"]["metadataEntries"])
    return execution


def materialization_events_url(ui: DagsterUI, name: str, run_id: str) -> str:
    """The asset's Events tab focused on its materialization by run `run_id` (the since
    sensor's observations of raw_records are newer events: without `time` the tab shows
    those)."""
    (stamp,) = [m["timestamp"] for m in materializations(ui, name) if m["runId"] == run_id]
    return f"/assets/oaipmh/{HARVESTER}/{name}?view=events&time={stamp}"


def schedule_status(ui: DagsterUI, name: str) -> str:
    data = ui.graphql(SCHEDULE_QUERY, {"location": LOCATION, "repo": REPOSITORY, "name": name})
    schedule = data["scheduleOrError"]
    assert schedule["__typename"] == "Schedule", schedule
    return schedule["scheduleState"]["status"]


def wait_for_schedule(ui: DagsterUI, name: str, status: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while (current := schedule_status(ui, name)) != status:
        assert time.monotonic() < deadline, f"schedule {name} is {current}, not {status}"
        time.sleep(0.5)


def sensor_cursor(ui: DagsterUI) -> dict[str, Any]:
    data = ui.graphql(SENSOR_QUERY, {"location": LOCATION, "repo": REPOSITORY, "name": SENSOR})
    sensor = data["sensorOrError"]
    assert sensor["__typename"] == "Sensor", sensor
    cursor = sensor["sensorState"]["typeSpecificData"]["lastCursor"]
    return json.loads(cursor) if cursor else {}


def row_value(pg: Any, label: str) -> Any:
    """The value cell of the two-column definition table row whose first cell is `label`."""
    row = pg.locator("tr").filter(
        has=pg.locator("td").first.filter(has_text=re.compile(rf"^\s*{re.escape(label)}\s*$"))
    )
    return row.locator("td").nth(1)


def markdown_of(pg: Any, cell: Any) -> Any:
    """Where a Markdown metadata value shows: the cell itself (the Events tab renders one
    shorter than 1,000 characters in place), else the dialog its *Show Markdown* opens."""
    expect(cell).to_be_visible(timeout=60_000)
    if cell.get_by_text("Show Markdown").count():
        cell.get_by_text("Show Markdown").click()
        return pg.get_by_role("dialog")
    return cell


def show_whole_job_graph(pg: Any) -> None:
    """Cosmetic, for the screenshot: widen the job page's graph panel (drag the divider)
    and pan so both assets show. Best effort: a changed layout only makes it a no-op."""
    divider = pg.locator("[class*=horizontalHitArea]").first
    box = divider.bounding_box() if divider.count() else None
    if box is None:
        return
    pg.mouse.move(box["x"] + box["width"] / 2, 500)
    pg.mouse.down()
    pg.mouse.move(1000, 500, steps=10)
    pg.mouse.up()
    pg.mouse.move(420, 300)
    pg.mouse.down()
    pg.mouse.move(220, 300, steps=10)
    pg.mouse.up()


def expect_materialized(pg: Any, count: int | None = None, *, before_count: Any = None) -> None:
    """The graph's asset nodes show "Materialized" (`count` of them when given). The
    nodes' status comes from a live-data query of their own: when the page missed it
    (a busy webserver), reload and wait again, at most three times, and say what the
    nodes showed if it never came."""
    label = pg.get_by_text("Materialized", exact=True)
    for attempt in range(3):
        try:
            expect(label.first).to_be_visible(timeout=40_000)
            if before_count is not None:
                before_count(pg)
            if count is not None:
                expect(label).to_have_count(count, timeout=20_000)
            return
        except AssertionError:
            if attempt == 2:
                nodes = pg.locator("svg foreignObject").all_inner_texts()
                raise AssertionError(f"asset nodes never showed 'Materialized': {nodes}") from None
            pg.reload()


# --------------------------------------------------------------------------- steps


def test_launch_demo_job_from_launchpad(dagster_ui: DagsterUI, page: Any, shot: Any) -> None:
    """Step 1: the job page, its Launchpad with the default config, Launch, run success."""
    page.goto(f"/locations/{LOCATION}/jobs/{JOB}")
    expect(page.get_by_role("button", name="Materialize all")).to_be_visible(timeout=60_000)
    expect(page.get_by_text("Harvest Demo repository (Dublin Core) from")).to_be_visible()
    expect(page.get_by_text(f"oaipmh/harvester: {HARVESTER}").first).to_be_visible()
    # the graph only draws the nodes in view: widen it before counting both
    expect_materialized(page, 2, before_count=show_whole_job_graph)
    shot(page, "01-job")

    page.get_by_role("button", name="arrow_drop_down").click()
    page.get_by_role("menuitem", name="Open launchpad").click()
    dialog = page.get_by_role("dialog")
    expect(dialog.get_by_text("Launchpad")).to_be_visible()
    editor = dialog.locator(".CodeMirror").first
    expect(editor).to_contain_text(f"harvest_{HARVESTER}")
    expect(editor).to_contain_text(re.compile(r"full:\s*false"))
    expect(dialog.get_by_text("No errors")).to_be_visible()
    launch = dialog.get_by_role("button", name=re.compile(r"Materialize$"))
    expect(launch).to_be_enabled()
    # With the cursor inside `config:`, the right-hand panel documents each field.
    editor.locator(".CodeMirror-line", has_text="resume").click()
    expect(dialog.get_by_text("Ignore the remembered since")).to_be_visible()
    shot(page, "02-launchpad")

    launch.click()
    page.wait_for_url(RUN_ID, timeout=60_000)
    run_id = run_id_in(page.url)

    assert wait_for_run(dagster_ui, run_id) == "SUCCESS", dagster_ui.log_tail()
    # The demo's harvest (or a scheduled run after it): what the launched run followed.
    before = materialization_before(dagster_ui, "raw_records", run_id)
    assert before["oai/advances_since"] is True and before["oai/next_since"], before
    run = dagster_ui.graphql(RUN_QUERY, {"runId": run_id})["runOrError"]
    assert run["jobName"] == JOB
    tags = {t["key"]: t["value"] for t in run["tags"]}
    assert tags["oaipmh/harvester"] == HARVESTER
    # No since in the config: the run resolved the demo harvest's since when it started.
    assert (tags["oaipmh/since"], tags["oaipmh/since_source"]) == (
        before["oai/next_since"], "run")

    # The run page follows the run live; reload once if it missed the last events.
    success = page.get_by_text("Success", exact=True).first
    try:
        expect(success).to_be_visible(timeout=30_000)
    except AssertionError:
        page.reload()
        expect(success).to_be_visible(timeout=60_000)
    expect(page.get_by_text("RUN_SUCCESS").first).to_be_visible(timeout=30_000)
    expect(page.get_by_text(f"Run of {JOB}")).to_be_visible()
    shot(page, "03-run-success")

    # The harvest logs where its since came from, one line per page and a summary (INFO);
    # hide Dagster's own events to see just those.
    page.get_by_role("button", name=re.compile(r"Levels \(")).click()
    page.get_by_role("menuitem", name=re.compile(r"^event")).click()
    page.keyboard.press("Escape")
    expect(page.get_by_text("RUN_SUCCESS")).to_have_count(0)
    expect(page.get_by_text(re.compile(
        rf"^harvesting {HARVESTER} .*since=\S+ \(from run, asked with the harvester's overlap\)"
    )).first).to_be_visible()
    expect(page.get_by_text(re.compile(r"^page 1: \d+ records so far")).first).to_be_visible()
    expect(page.get_by_text(re.compile(rf"^harvest finished: {HARVESTER}: \d+ records"))
           .first).to_be_visible()
    shot(page, "04-run-logs")


def test_asset_graph_and_materialization(dagster_ui: DagsterUI, page: Any, shot: Any) -> None:
    """Step 2: source -> raw_records -> records (-> the demo's example downstream asset,
    records_by_year), and the latest materialization's metadata."""
    run_id = launched_run(dagster_ui)
    nodes = dagster_ui.graphql(GROUP_QUERY, {"group": GROUP, "location": LOCATION,
                                             "repo": REPOSITORY})["assetNodes"]
    deps = {n["assetKey"]["path"][-1]: sorted(d["path"][-1] for d in n["dependencyKeys"])
            for n in nodes}
    assert deps == {"source": [], "raw_records": ["source"], "records": ["raw_records"],
                    "records_by_year": ["records"]}

    page.goto(f"/locations/{LOCATION}/asset-groups/{GROUP}")
    for name in ("source", "raw_records", "records", "records_by_year"):
        expect(page.get_by_text(name, exact=True).first).to_be_visible(timeout=60_000)
    # raw_records, records and records_by_year (the demo materialized it once) show their
    # latest materialization; source is external.
    expect_materialized(page, 3)
    shot(page, "05-asset-graph")

    raw = materialization_of(dagster_ui, "raw_records", run_id)
    page.goto(materialization_events_url(dagster_ui, "raw_records", run_id))
    expect(page.get_by_text("Materialized in run")).to_be_visible(timeout=60_000)
    expect(page.get_by_role("link", name=run_id[:8]).first).to_be_visible()
    for label in ("oai/next_since", "oai/advances_since", "oai/scope", "oai/response_date",
                  "oai/mode", "records", "new", "deleted", "pages"):
        expect(row_value(page, label).first).to_be_visible()
    assert raw["oai/next_since"] and raw["oai/mode"] == "incremental", raw
    expect(row_value(page, "oai/next_since").first).to_have_text(raw["oai/next_since"])
    expect(row_value(page, "oai/response_date").first).to_have_text(raw["oai/response_date"])
    expect(row_value(page, "oai/since_source").first).to_have_text("run")
    shot(page, "06-raw-records-metadata")

    records = materialization_of(dagster_ui, "records", run_id)
    assert records["dagster/row_count"] > 0
    page.goto(materialization_events_url(dagster_ui, "records", run_id))
    expect(page.get_by_role("link", name=run_id[:8]).first).to_be_visible(timeout=60_000)
    expect(row_value(page, "dagster/row_count").first).to_have_text(
        str(records["dagster/row_count"]))
    expect(row_value(page, "transformer").first).to_have_text("oai_dc")
    shot(page, "07-records-metadata")

    row_value(page, "preview").first.get_by_text("Show Markdown").click()
    preview = page.get_by_role("dialog")
    expect(preview.get_by_role("table")).to_be_visible()
    expect(preview.get_by_role("columnheader", name="oai_identifier")).to_be_visible()
    expect(preview.get_by_text(re.compile(r"^oai:demo\.example\.org:")).first).to_be_visible()
    # Every row has as many cells as the header (a '|' in a value must not split a cell).
    headers = preview.get_by_role("columnheader").count()
    rows = preview.locator("tbody tr")
    assert rows.count() > 0
    assert {rows.nth(i).locator("td").count() for i in range(rows.count())} == {headers}
    shot(page, "08-records-preview")
    preview.get_by_role("button", name="Close").click()

    # The asset checks of the run: completeListSize on raw_records.
    page.goto(f"/assets/oaipmh/{HARVESTER}/raw_records?view=checks")
    expect(page.get_by_text("complete_list_size_matches").first).to_be_visible(timeout=60_000)
    expect(page.get_by_text("Passed").first).to_be_visible()
    shot(page, "09-asset-checks")


def test_coverage_and_schema_check(dagster_ui: DagsterUI, page: Any, shot: Any) -> None:
    """Step 2b: the records' field coverage (the record whose dc:titel the demo serves has
    no title), and the schema_valid check on raw_records: a warning naming the three
    records whose oai_dc the schema rejects."""
    run_id = launched_run(dagster_ui)
    records = materialization_of(dagster_ui, "records", run_id)
    live = records["dagster/row_count"]
    coverage = records["coverage"]
    # One live record (the misspelt dc:titel) lacks a title; every other one has one.
    assert coverage["title"] == round((live - 1) / live, 4) < 1, coverage
    assert records["coverage_note"] == f"All {live} live records."

    page.goto(materialization_events_url(dagster_ui, "records", run_id))
    expect(page.get_by_role("link", name=run_id[:8]).first).to_be_visible(timeout=60_000)
    shown_json = row_value(page, "coverage").first
    expect(shown_json).to_contain_text('"title"')
    text = shown_json.inner_text()
    assert json.loads(text[text.index("{"):text.rindex("}") + 1]) == coverage
    table = markdown_of(page, row_value(page, "coverage_table").first)
    expect(table.get_by_role("table")).to_be_visible()
    title = table.locator("tr").filter(has=page.locator("td").first.filter(
        has_text=re.compile(r"^\s*title\s*$")))
    expect(title).to_have_count(1)
    cells = title.locator("td")
    shown = re.fullmatch(r"\s*([█·▏]{10})\s+(\d+(?:\.\d)?)%\s*", cells.nth(1).inner_text())
    assert shown, f"title's coverage cell: {cells.nth(1).inner_text()!r}"
    # The percentage shown is GraphQL's fraction (to one decimal), the bar has that many
    # tenths full, and the row is the Markdown's.
    assert abs(float(shown.group(2)) - coverage["title"] * 100) <= 0.05 + 1e-9, shown.group(0)
    assert shown.group(1).count("█") == int(coverage["title"] * 10 + 0.5)
    md = re.search(r"^\| title \| `([^`]+)` ([^|]+?) \| ([^|]+?) \|$",
                   records["coverage_table"], flags=re.M)
    assert md, records["coverage_table"]
    assert (shown.group(1), f"{shown.group(2)}%") == (md.group(1), md.group(2))
    expect(cells.nth(1).locator("code")).to_have_text(md.group(1))
    expect(cells.nth(2)).to_have_text(md.group(3))
    expect(table).to_contain_text(f"All {live} live records.")
    table.scroll_into_view_if_needed()
    shot(page, "07b-records-coverage")
    if page.get_by_role("dialog").count():
        page.get_by_role("dialog").get_by_role("button", name="Close").click()

    check = check_of(dagster_ui, "raw_records", "schema_valid", run_id)  # with the harvest
    assert check["status"] == "FAILED"
    assert (check["evaluation"]["severity"], check["evaluation"]["success"]) == ("WARN", False)
    found = check["metadata"]
    assert (found["invalid"], found["live"], found["schema"]) == (
        len(INVALID_OAI_DC), live, "oai_dc")
    sample = re.findall(r"^- (\S+): ", found["invalid_sample"], flags=re.M)
    assert sample == sorted(INVALID_OAI_DC)

    page.goto(f"/assets/oaipmh/{HARVESTER}/raw_records?view=checks")
    listed = page.locator("[class*=checkRow]").filter(has_text="schema_valid")
    expect(listed).to_be_visible(timeout=60_000)
    # A warning: the yellow warning icon, not the red one of a failed error check.
    expect(listed.get_by_role("img", name="warning_outline")).to_be_visible()
    expect(listed).to_contain_text("Failed")
    listed.click()
    expect(page).to_have_url(re.compile(r"checkDetail=schema_valid"))
    expect(page.get_by_text("Every live record is valid against the schema oai_dc")
           ).to_be_visible()
    result = page.locator(".BaseTag").filter(has_text="Failed").first
    expect(result.get_by_role("img", name="warning_outline")).to_be_visible()
    expect(row_value(page, "invalid").first).to_have_text(str(len(INVALID_OAI_DC)))
    expect(row_value(page, "live").first).to_have_text(str(live))
    expect(row_value(page, "schema").first).to_have_text("oai_dc")
    shot(page, "09b-schema-valid-check")

    row_value(page, "invalid_sample").first.get_by_text("Show Markdown").click()
    dialog = page.get_by_role("dialog")
    expect(dialog.get_by_role("listitem")).to_have_count(len(INVALID_OAI_DC))
    for identifier, item in zip(sorted(INVALID_OAI_DC), dialog.get_by_role("listitem").all(),
                                strict=True):
        expect(item).to_contain_text(f"{identifier}: Element")
    expect(dialog).to_contain_text(re.compile(r"titel'?: This element is not expected"))
    expect(dialog).to_contain_text("Character content other than whitespace")
    shot(page, "09c-schema-valid-sample")
    dialog.get_by_role("button", name="Close").click()
    expect(dialog).to_have_count(0)


@pytest.mark.parametrize(("harvester", "first", "second"), [
    ("demo", "STOPPED", "RUNNING"),  # enabled harvester: its schedule starts running
    ("demo_datacite", "RUNNING", "STOPPED"),  # disabled harvester: starts stopped
])
def test_toggle_schedule(dagster_ui: DagsterUI, page: Any, shot: Any,
                         harvester: str, first: str, second: str) -> None:
    """Step 3: switch the schedule in the UI; GraphQL and a reload agree each time."""
    name = f"harvest_oaipmh_records_{harvester}"
    assert schedule_status(dagster_ui, name) == second, "unexpected default status"
    page.goto(f"/locations/{LOCATION}/schedules/{name}")
    expect(page.get_by_text(name).first).to_be_visible(timeout=60_000)
    running = row_value(page, "Running").first
    switch = running.get_by_role("checkbox")
    expect(switch).to_be_checked(checked=second == "RUNNING", timeout=30_000)
    for step, status in enumerate((first, second)):
        running.locator("label").click()
        wait_for_schedule(dagster_ui, name, status)
        page.reload()
        expect(page.get_by_text(name).first).to_be_visible(timeout=60_000)
        expect(switch).to_be_checked(checked=status == "RUNNING", timeout=30_000)
        assert schedule_status(dagster_ui, name) == status
        state = "on" if status == "RUNNING" else "off"
        shot(page, f"{10 + step:02d}-schedule-{harvester}-{state}",
             docs=harvester == HARVESTER)


def test_since_sensor_cursor(dagster_ui: DagsterUI, page: Any, shot: Any) -> None:
    """Step 4: the since sensor's cursor holds the launched run's `oai/next_since`."""
    run_id = launched_run(dagster_ui)
    raw = materialization_of(dagster_ui, "raw_records", run_id)
    expected = raw["oai/next_since"]
    assert expected and raw["oai/advances_since"] is True, raw
    run = dagster_ui.graphql(RUN_QUERY, {"runId": run_id})["runOrError"]
    started_from = {t["key"]: t["value"] for t in run["tags"]}["oaipmh/since"]
    assert expected > started_from, "the launched run did not advance since"

    page.goto(f"/locations/{LOCATION}/sensors/{SENSOR}")
    cursor_cell = row_value(page, "Cursor").first
    # The daemon evaluates the sensor every 5 s here: reload until its cursor has the run.
    deadline = time.monotonic() + 120.0
    while True:
        expect(cursor_cell).to_be_visible(timeout=60_000)
        text = cursor_cell.inner_text()
        shown = json.loads(text[text.index("{"):text.rindex("}") + 1]) if "{" in text else {}
        if shown.get("since", {}).get(HARVESTER) == expected:
            break
        # A later successful run (the demo harvester's schedule) may advance since again:
        # the cursor then holds that run's next_since, never an older one.
        latest = latest_materialization(dagster_ui, "raw_records")[1]["oai/next_since"]
        if latest != expected:
            assert latest > expected, (latest, expected)
            expected = latest
            continue
        assert time.monotonic() < deadline, f"cursor never showed {HARVESTER}={expected}: {text}"
        page.wait_for_timeout(5_000)
        page.reload()
    assert run_id in shown.get("seen", []) or shown.get("watermark")
    assert sensor_cursor(dagster_ui)["since"][HARVESTER] >= expected
    expect(page.get_by_text(re.compile(r"edit a date there \(or delete it for a full "
                                       r"harvest\) to steer the next run"))).to_be_visible()
    shot(page, "12-since-sensor")

    cursor_cell.get_by_role("button", name=re.compile("Edit")).click()
    dialog = page.get_by_role("dialog")
    expect(dialog).to_contain_text(expected)
    expect(dialog.get_by_role("button", name=re.compile("Set cursor value"))).to_be_visible()
    shot(page, "13-since-sensor-edit-cursor")
    dialog.get_by_role("button", name=re.compile("Cancel")).click()
    expect(dialog).to_have_count(0)


ASSET_NODE_QUERY = """
query Node($path: [String!]!) { assetNodeOrError(assetKey: {path: $path}) { __typename
  ... on AssetNode { tags { key value }
    internalFreshnessPolicy { __typename
      ... on TimeWindowFreshnessPolicy { failWindowSeconds warnWindowSeconds } }
    freshnessStatusInfo { freshnessStatus } } } }
"""


def asset_node(ui: DagsterUI, name: str) -> dict[str, Any]:
    node = ui.graphql(ASSET_NODE_QUERY, {"path": ["oaipmh", HARVESTER, name]})
    node = node["assetNodeOrError"]
    assert node["__typename"] == "AssetNode", node
    return node


def test_freshness_and_tags(dagster_ui: DagsterUI, page: Any, shot: Any) -> None:
    """Step 5: raw_records' freshness (from the demo's hourly cron) turns healthy once
    Dagster's freshness daemon has seen the harvest; the assets' tags name the endpoint."""
    host = dagster_ui.oai_url.split("//")[1].split("/")[0].replace(":", "_")
    for name in ("source", "raw_records", "records"):
        tags = {t["key"]: t["value"] for t in asset_node(dagster_ui, name)["tags"]}
        assert {k: tags.get(k) for k in ("oaipmh/host", "oaipmh/prefix", "oaipmh/set")} == {
            "oaipmh/host": host, "oaipmh/prefix": "oai_dc", "oaipmh/set": "all"}, tags
    node = asset_node(dagster_ui, "raw_records")
    # "0 * * * *": warn after 1.25 hours, fail after 2 without a harvest.
    assert node["internalFreshnessPolicy"] == {"__typename": "TimeWindowFreshnessPolicy",
                                               "failWindowSeconds": 7200,
                                               "warnWindowSeconds": 4500}
    deadline = time.monotonic() + 120  # the daemon evaluates freshness every 30 s
    while (status := asset_node(dagster_ui, "raw_records")["freshnessStatusInfo"][
            "freshnessStatus"]) != "HEALTHY":
        assert time.monotonic() < deadline, f"raw_records freshness is {status}"
        time.sleep(2.0)

    page.goto(f"/assets/oaipmh/{HARVESTER}/raw_records")
    expect(page.get_by_text("oaipmh/prefix").first).to_be_visible(timeout=60_000)
    expect(page.get_by_text(host).first).to_be_visible()
    expect(page.get_by_text("Freshness policy").first).to_be_visible()
    expect(page.get_by_text("Passing").first).to_be_visible(timeout=60_000)
    expect(page.get_by_text("Fails if more than 2 hours since last materialization")
           ).to_be_visible()
    shot(page, "14-raw-records-freshness-tags")

    # The catalog filtered by the endpoint's host tag (a value with dots is quoted).
    selection = urllib.parse.quote(f'tag:oaipmh/host="{host}"')
    page.goto(f"/assets?asset-selection={selection}")
    # Both demo harvesters ask the same host: the assets of both groups are listed.
    expect(page.get_by_text("oaipmh / demo / source").first).to_be_visible(timeout=60_000)
    expect(page.get_by_text("oaipmh / demo / records").first).to_be_visible()
    expect(page.get_by_text("oaipmh_demo_datacite").first).to_be_visible()
    expect(page.get_by_text(re.compile(r"^Loading"))).to_have_count(0, timeout=60_000)
    shot(page, "15-catalog-by-host-tag")
    # The demo started `dagster dev` in $DAGSTER_HOME: no warning about an ignored
    # dagster.yaml in its log.
    assert "will not be used to configure Dagster" not in dagster_ui.log_path.read_text()


MANAGE_JOB = "manage_harvesters"
MANAGE_OP = "manage_harvester"
ADDED = "added_in_ui"  # no other harvester's id starts with it: text matches stay exact
ADDED_JOB = f"harvest_oaipmh_records_{ADDED}"
JOB_QUERY = """
query Job($selector: PipelineSelector!) { pipelineOrError(params: $selector) { __typename } }
"""
REGISTRY_QUERY = """
query Registry { assetOrError(assetKey: {path: ["oaipmh", "registry"]}) { __typename
  ... on Asset { assetMaterializations(limit: 1) { runId metadataEntries { label
    ... on MarkdownMetadataEntry { mdStr } } } } } }
"""


def report_figure(label: str, value: float, **context: object) -> None:
    """A figure this tour measured, for the benchmarks' notes (not a pass criterion):
    appended to test-artifacts/browser/figures.txt."""
    line = f"{label}: {value:.1f} " + " ".join(f"{k}={v}" for k, v in context.items())
    with (ARTIFACTS / "figures.txt").open("a") as fh:
        fh.write(line + "\n")


def job_exists(ui: DagsterUI, name: str) -> bool:
    selector = {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY,
                "pipelineName": name}
    found = ui.graphql(JOB_QUERY, {"selector": selector})["pipelineOrError"]
    return found["__typename"] == "Pipeline"


def set_editor_text(pg: Any, editor: Any, text: str) -> None:
    """Replace the whole text of a CodeMirror editor: through the editor's own API (no
    auto-indent or bracket closing on the way), else select all and insert the text."""
    done = editor.evaluate("""(el, text) => {
        const cm = el.CodeMirror;
        if (!cm) return false;
        cm.setValue(text);
        cm.focus();
        return true;
    }""", text)
    if not done:
        editor.click()
        pg.keyboard.press("Control+A")
        pg.keyboard.insert_text(text)
    expect(editor).to_contain_text(text.splitlines()[-1].strip())


def show_info_logs(pg: Any, line: re.Pattern[str]) -> None:
    """On a run page whose log shows `line`, hide Dagster's own events: only the op's log
    lines stay. The browser keeps the choice of levels for later run pages."""
    expect(pg.get_by_text(line).first).to_be_visible()
    if pg.get_by_text("RUN_SUCCESS").count():
        pg.get_by_role("button", name=re.compile(r"Levels \(")).click()
        pg.get_by_role("menuitem", name=re.compile(r"^event")).click()
        pg.keyboard.press("Escape")
    expect(pg.get_by_text("RUN_SUCCESS")).to_have_count(0)


def expect_run_page_success(pg: Any, job: str) -> None:
    """The run page shows the run's success (reloaded once if it missed the last events)."""
    success = pg.get_by_text("Success", exact=True).first
    try:
        expect(success).to_be_visible(timeout=30_000)
    except AssertionError:
        pg.reload()
        expect(success).to_be_visible(timeout=60_000)
    expect(pg.get_by_text(f"Run of {job}")).to_be_visible()


def test_add_harvester_from_launchpad(dagster_ui: DagsterUI, page: Any, shot: Any) -> None:
    """Step 6: the Launchpad of manage_harvesters adds a harvester of the demo endpoint;
    the run reloads the code location (the demo's `dagster dev` has
    OAIPMH_DAGSTER_WEBSERVER pointing at itself), so the harvester's job appears in the UI
    without a restart, and a run of it launched there succeeds."""
    assert not job_exists(dagster_ui, ADDED_JOB)
    config = (f"ops:\n  {MANAGE_OP}:\n    config:\n      action:\n        add:\n"
              f"          id: {ADDED}\n          url: {dagster_ui.oai_url}\n"
              "          prefix: oai_dc\n")
    page.goto(f"/locations/{LOCATION}/jobs/{MANAGE_JOB}/playground")
    editor = page.locator(".CodeMirror").first
    expect(editor).to_be_visible(timeout=60_000)
    set_editor_text(page, editor, config)
    expect(editor).to_contain_text(f"id: {ADDED}")
    expect(page.get_by_text("No errors")).to_be_visible()
    # With the cursor on a field, the right-hand panel documents the op's config.
    editor.locator(".CodeMirror-line", has_text="prefix").click()
    expect(page.get_by_text("metadataPrefix to harvest").first).to_be_visible()
    shot(page, "16-manage-launchpad")

    launch = page.get_by_role("button", name=re.compile(r"Launch Run"))
    expect(launch).to_be_enabled()
    launched = time.monotonic()
    launch.click()
    page.wait_for_url(RUN_ID, timeout=60_000)
    run_id = run_id_in(page.url)
    # The run probes the endpoint, writes the row and waits for the location's reload.
    assert wait_for_run(dagster_ui, run_id, timeout=300.0) == "SUCCESS", dagster_ui.log_tail()
    report_figure("launchpad add to job listed (s)", time.monotonic() - launched,
                  listed=job_exists(dagster_ui, ADDED_JOB))
    assert dagster_ui.graphql(RUN_QUERY, {"runId": run_id})["runOrError"]["jobName"] == (
        MANAGE_JOB)
    expect_run_page_success(page, MANAGE_JOB)
    show_info_logs(page, re.compile(
        rf"^added harvester {ADDED}: {re.escape(dagster_ui.oai_url)} \(oai_dc\); "
        rf"job and schedule {ADDED_JOB}"))
    expect(page.get_by_text(re.compile(
        rf"^reloaded code location '{LOCATION}' at {re.escape(dagster_ui.base_url)}"))
        .first).to_be_visible()
    expect(page.get_by_text(re.compile(
        rf"^job {ADDED_JOB}: {re.escape(dagster_ui.base_url)}/locations/{LOCATION}/jobs/"
        rf"{ADDED_JOB}")).first).to_be_visible()
    shot(page, "17-manage-run-log")
    registry = dagster_ui.graphql(REGISTRY_QUERY)["assetOrError"]
    (mat,) = registry["assetMaterializations"]
    table = next(e["mdStr"] for e in mat["metadataEntries"] if e["label"] == "registry")
    assert mat["runId"] == run_id and f"| {ADDED} | {dagster_ui.oai_url} | oai_dc |" in table

    # The reload happened inside the run: the job is there, no restart, no manual reload.
    assert job_exists(dagster_ui, ADDED_JOB)
    page.goto("/jobs")
    link = page.locator(f'a[href$="/locations/{LOCATION}/jobs/{ADDED_JOB}"]').first
    try:
        expect(link).to_be_visible(timeout=30_000)
    except AssertionError:  # the page may have shown a workspace cached before the reload
        page.reload()
        expect(link).to_be_visible(timeout=60_000)
    link.click()
    expect(page.get_by_role("button", name="Materialize all")).to_be_visible(timeout=60_000)
    expect(page.get_by_text(f"oaipmh/harvester: {ADDED}").first).to_be_visible()
    shot(page, "added-harvester-job", docs=False)

    page.get_by_role("button", name="arrow_drop_down").click()
    page.get_by_role("menuitem", name="Open launchpad").click()
    dialog = page.get_by_role("dialog")
    expect(dialog.locator(".CodeMirror").first).to_contain_text(f"harvest_{ADDED}")
    expect(dialog.get_by_text("No errors")).to_be_visible()
    dialog.get_by_role("button", name=re.compile(r"Materialize$")).click()
    page.wait_for_url(RUN_ID, timeout=60_000)
    harvest_id = run_id_in(page.url)
    assert wait_for_run(dagster_ui, harvest_id) == "SUCCESS", dagster_ui.log_tail()
    run = dagster_ui.graphql(RUN_QUERY, {"runId": harvest_id})["runOrError"]
    assert run["jobName"] == ADDED_JOB
    tags = {t["key"]: t["value"] for t in run["tags"]}
    assert tags["oaipmh/harvester"] == ADDED
    expect_run_page_success(page, ADDED_JOB)
    # Its first harvest is a full one: nothing was recorded for it before.
    expect(page.get_by_text(re.compile(
        rf"^harvesting {ADDED} .*since=- \(from none\)")).first).to_be_visible()
    show_info_logs(page, re.compile(rf"^harvest finished: {ADDED}: \d+ records"))
    shot(page, "18-added-harvester-run")
