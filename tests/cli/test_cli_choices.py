"""Options whose value comes from a fixed set refuse anything else themselves: Typer's usage
error (exit 2) naming the allowed values, before a setting is read, a query is built or
Temporal is asked. Hostile values (`incident list --state "x' OR 1=1"`) used to exit 0 with
an empty table. No server of any kind runs here.
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any, get_args

import pytest
from typer.testing import CliRunner

from autoclusters.clients.cli import connect, incidents
from autoclusters.clients.cli.app import app
from autoclusters.core.models import RETURNED_JOBS_STEP, IncidentStatus
from autoclusters.core.policy import LADDER, Rung

runner = CliRunner()
HOSTILE = "x' OR 1=1"


def _flat(text: str) -> str:
    """Rich's error box without its frame and line breaks."""
    return re.sub(r"[\s│╭╮╰╯─]+", " ", text)


@pytest.fixture(autouse=True)
def _no_temporal(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(_fn: Any, **_: Any) -> Any:
        raise AssertionError("a refused option must not reach Temporal")

    monkeypatch.setattr(connect, "run_client", refuse)


@pytest.mark.parametrize(
    ("argv", "option", "allowed"),
    [
        (
            ["incident", "list", "--state", HOSTILE],
            "--state",
            [
                "open", "waiting_approval", "resolved", "failed", "rejected", "observed",
                "monitored", "cancelled",
            ],
        ),
        (
            ["approve", "inc-20260101-000000-gpu-01", "--step", HOSTILE],
            "--step",
            ["reset_gpu", "reboot", "replace"],
        ),
        (["approve", "inc-20260101-000000-gpu-01", "--step", "monitor"],
         "--step", ["reset_gpu", "reboot", "replace"]),
        (["agent", "run", "--node", "gpu-01", "--backend", HOSTILE], "--backend",
         ["nvml", "fake"]),
        (["agent", "run", "--node", "gpu-01", "--log-level", "verbose"], "--log-level",
         ["debug", "info", "warning", "error", "critical"]),
        (["share", "move", "--node", "gpu-01", "--to", HOSTILE], "--to",
         ["inference", "training"]),
    ],
)  # fmt: skip
def test_a_value_outside_the_set_is_a_usage_error_naming_the_allowed_ones(
    argv: list[str], option: str, allowed: list[str]
) -> None:
    r = runner.invoke(app, argv)
    assert r.exit_code == 2, r.output
    out = _flat(r.output)
    assert f"Invalid value for '{option}'" in out, out
    for value in allowed:
        assert f"'{value}'" in out, (value, out)


def test_every_state_an_incident_publishes_can_be_listed_and_nothing_else() -> None:
    published = set(get_args(IncidentStatus)) | {"waiting_approval"}
    assert set(get_args(incidents.IncidentStateName)) == published


def test_the_approvable_steps_are_the_rungs_that_repair_and_returned_jobs() -> None:
    rungs = {r.value for r in LADDER if r != Rung.MONITOR}
    assert set(get_args(incidents.ApprovalStep)) == rungs | {RETURNED_JOBS_STEP}


class _Client:
    """Records the visibility queries `incident list` sends."""

    def __init__(self) -> None:
        self.queries: list[str] = []

    def list_workflows(self, query: str, limit: int | None = None) -> Any:
        self.queries.append(query)

        async def none() -> Any:
            return
            yield

        return none()


def test_an_allowed_state_still_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    client = _Client()
    monkeypatch.setattr(
        connect, "run_client", lambda fn, **_: asyncio.run(fn(client, connect.load_settings()))
    )
    r = runner.invoke(app, ["incident", "list", "--json", "--state", "waiting_approval"])
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == "[]"
    # The nodes' incidents by their search attribute; the systemic ones, whose state is
    # their status query's, are filtered after it (clients/incident_listing.py).
    node_query, systemic_query = sorted(client.queries, key=lambda q: "SystemicIncident" in q)
    assert "IncidentStatus = 'waiting_approval'" in node_query
    assert "WorkflowType = 'SystemicIncident'" in systemic_query


def test_log_level_is_still_case_insensitive(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logging, "basicConfig", lambda **_: None)  # leave pytest's logging be
    # Past option parsing: it stops later, for want of somewhere to send reports.
    r = runner.invoke(app, ["agent", "run", "--node", "gpu-01", "--log-level", "debug"])
    assert "Invalid value" not in r.output, r.output
    assert "say where reports go" in r.output


def test_help_stays_readable() -> None:
    r = runner.invoke(app, ["incident", "list", "--help"])
    assert r.exit_code == 0
    assert "open, waiting_approval, resolved" in _flat(r.output)
