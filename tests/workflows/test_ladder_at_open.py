"""The ladder's figures an incident opens with (clients/incident_history.py LadderAtOpen),
read through a stand-in for the Temporal client that serves recorded histories: the same
calls the real read makes (a visibility list, then each run's history), nothing else.

Aspects covered:
- a policy that skips no rung reads nothing and is unchanged;
- a skipping policy gets the cluster's figures in its snapshot, read by one visibility
  query for NodeRemediation runs of that cluster within the last LADDER_HISTORY;
- opens within LADDER_FRESH_S share one read; a later open reads again;
- a read that fails, or a first read slower than the wait, leaves the plain ladder (no
  figures), and a later open has them; a stale read is refreshed while the last figures
  serve;
- a history that is not an incident is listed as unreadable, never dropped silently;
- the console reads the same figures through the same reader (one read serves both); a
  read that fails raises there (unknown, never an empty ladder), and a slow first read
  says it is still reading.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from temporalio.client import WorkflowHistory

from autoclusters.clients.console.sources import LiveSource
from autoclusters.clients.incident_history import (
    LADDER_FRESH_S,
    LadderAtOpen,
    ladder_at_open,
    read_incidents,
)
from autoclusters.core.policy import FaultRule, Policy, Rung
from tests.helpers import eventually

HISTORIES = Path(__file__).parents[1] / "histories"
PATHS = sorted(HISTORIES.glob("remediation_0.2_*.json"))


@dataclass
class _Run:
    id: str
    run_id: str


class _Handle:
    def __init__(self, path: Path) -> None:
        self._path = path

    async def fetch_history(self) -> WorkflowHistory:
        return WorkflowHistory.from_json(self._path.stem, self._path.read_text())


class _Temporal:
    """Answers list_workflows with the runs of `paths` and each run's history."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths = {p.stem: p for p in paths}
        self.queries: list[str] = []
        self.fail: Exception | None = None
        self.go = asyncio.Event()  # a read lists nothing until it is set
        self.go.set()
        self.listed = 0

    async def _runs(self) -> AsyncIterator[_Run]:
        await self.go.wait()
        if self.fail is not None:
            raise self.fail
        for stem in self.paths:
            yield _Run(id=stem, run_id="r")
        self.listed += 1  # the read goes on to its figures without waiting again

    def list_workflows(self, query: str, limit: int | None = None) -> AsyncIterator[_Run]:
        self.queries.append(query)
        return self._runs()

    def get_workflow_handle(self, workflow_id: str, run_id: str | None = None) -> _Handle:
        return _Handle(self.paths[workflow_id])


async def _queries(temporal: _Temporal, n: int) -> bool:
    return len(temporal.queries) == n


async def _listed(temporal: _Temporal, n: int) -> bool:
    return temporal.listed == n


def _skipping(**fields: Any) -> Policy:
    faults = {"XID_79": FaultRule(severity="critical", first_rung=Rung.REBOOT)}
    return Policy(faults=faults, skip_rung_below=0.2, min_samples=1, **fields)


async def test_a_policy_that_skips_nothing_reads_nothing() -> None:
    temporal = _Temporal(PATHS)
    policy = Policy()
    assert await LadderAtOpen(temporal).policy_for_open("c1", policy) is policy  # type: ignore[arg-type]
    assert temporal.queries == []


async def test_opens_share_one_read_until_it_is_stale() -> None:
    temporal = _Temporal(PATHS)
    now = [1000.0]
    at_open = LadderAtOpen(temporal, clock=lambda: now[0])  # type: ignore[arg-type]
    first = await at_open.policy_for_open("c1", _skipping())
    assert first.ladder is not None and first.ladder.incidents == len(PATHS)
    reboot = first.ladder.of("XID_79", "reboot")
    assert reboot is not None and 0 < reboot.successes < reboot.attempts
    (query,) = temporal.queries
    assert "WorkflowType = 'NodeRemediation'" in query and "Cluster = 'c1'" in query
    assert "StartTime >= '" in query
    again = await at_open.policy_for_open("c1", _skipping())
    assert again.ladder == first.ladder and len(temporal.queries) == 1
    now[0] += LADDER_FRESH_S + 1
    await at_open.policy_for_open("c1", _skipping())
    await eventually(lambda: _listed(temporal, 2), what="a second read")
    assert len(temporal.queries) == 2


async def test_a_failed_read_opens_with_the_plain_ladder(caplog: pytest.LogCaptureFixture) -> None:
    temporal = _Temporal(PATHS)
    temporal.fail = RuntimeError("Temporal away")
    at_open = LadderAtOpen(temporal)  # type: ignore[arg-type]
    policy = await at_open.policy_for_open("c1", _skipping())
    assert policy.ladder is None
    assert "no ladder figures for c1" in caplog.text
    temporal.fail = None  # it came back: the next open reads again at once
    assert (await at_open.policy_for_open("c1", _skipping())).ladder is not None
    assert len(temporal.queries) == 2


async def test_a_history_that_is_not_an_incident_is_named() -> None:
    guard = HISTORIES / "fleet_guard_0.2_batch.json"
    temporal = _Temporal([PATHS[0], guard])
    found = await read_incidents(temporal, "c1")  # type: ignore[arg-type]
    assert len(found.records) == 1
    assert len(found.unreadable) == 1 and "not an incident" in found.unreadable[0]


async def test_a_slow_first_read_opens_with_the_plain_ladder() -> None:
    temporal = _Temporal(PATHS)
    temporal.go.clear()
    at_open = LadderAtOpen(temporal, wait_s=0.05)  # type: ignore[arg-type]
    assert (await at_open.policy_for_open("c1", _skipping())).ladder is None
    temporal.go.set()

    async def figures() -> Policy | None:
        p = await at_open.policy_for_open("c1", _skipping())
        return p if p.ladder is not None else None

    await eventually(figures, what="the read to finish")
    assert len(temporal.queries) == 1  # the slow read went on; the second open used it


async def test_a_stale_read_is_refreshed_while_the_last_figures_serve() -> None:
    temporal = _Temporal(PATHS)
    now = [0.0]
    at_open = LadderAtOpen(temporal, clock=lambda: now[0], wait_s=0.05)  # type: ignore[arg-type]
    first = await at_open.policy_for_open("c1", _skipping())
    temporal.go.clear()
    now[0] += LADDER_FRESH_S + 1
    served = await at_open.policy_for_open("c1", _skipping())  # not waiting for the read
    assert served.ladder is not None and served.ladder == first.ladder
    await eventually(lambda: _queries(temporal, 2), what="the refresh")
    temporal.go.set()
    await eventually(lambda: _listed(temporal, 2), what="the refresh to end")


async def test_the_console_reads_the_figures_incidents_open_with() -> None:
    temporal = _Temporal(PATHS)

    async def client() -> Any:
        return temporal

    settings = cast(Any, SimpleNamespace(cluster="c1"))
    source = LiveSource(settings, client, cast(Any, None), timeout_s=30)
    shown = await source.ladder()
    opened = await ladder_at_open(cast(Any, temporal)).policy_for_open("c1", _skipping())
    assert opened.ladder == shown and shown.incidents == len(PATHS)
    assert len(temporal.queries) == 1  # one read served the page and the open

    failing = _Temporal(PATHS)
    failing.fail = RuntimeError("Temporal away")
    with pytest.raises(RuntimeError, match="Temporal away"):
        await LadderAtOpen(failing).figures("c1")  # type: ignore[arg-type]

    slow = _Temporal(PATHS)
    slow.go.clear()
    reader = ladder_at_open(cast(Any, slow))
    reader._wait_s = 0.05

    async def slow_client() -> Any:
        return slow

    with pytest.raises(TimeoutError, match="still reading the incidents' histories"):
        await LiveSource(settings, slow_client, cast(Any, None), timeout_s=30).ladder()
    slow.go.set()
    await eventually(lambda: _listed(slow, 1), what="the read to go on and finish")
    assert (await reader.figures("c1")).incidents == len(PATHS)
