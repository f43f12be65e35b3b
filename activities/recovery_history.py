"""Read the recoveries the cluster's closed incidents measured, for the figures the next
recovery plan weighs (issue 42; core/recovery_history.py takes the statistic).

The history is Temporal's: the same closed NodeRemediation runs `autoclusters stats
recovery` reads. Each run's result (its incident state) carries the measured loss of every
job it planned (`recovery_losses`: the path, the seconds from the fault to stepping again);
a run is listed by the cluster's search attribute and its result read from its close event
alone, never its whole history. A closed run's result never changes: each is read once per
worker, so a read is one list call and the results of the runs that closed since; reads of
one cluster that overlap (a fault storm opens many incidents at once) share one.

A list or result that fails raises: the workflow weighs the policy's figures and says the
history could not be read, never that none was measured. A run whose result is not an
incident this code reads (an older shape, a failed run) is skipped and counted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

from pydantic import BaseModel, Field, ValidationError
from temporalio import activity
from temporalio.client import Client

from autoclusters.core.models import IncidentState
from autoclusters.core.recovery_history import (
    MeasuredRecovery,
    RecoveryFiguresCall,
    RecoveryFiguresRead,
    figures_from_history,
    measured_from,
)
from autoclusters.integrations.temporal import quoted

WORKFLOW_TYPE = "NodeRemediation"
# Runs read at most per read (newest first): more than `last` of every path needs.
MAX_RUNS = 200
# Results fetched at once on a first read.
FETCH_AT_ONCE = 8
# Closed runs remembered per worker (their results never change).
MAX_REMEMBERED = 5000


class HistoryRead(BaseModel):
    """What one read of the history found."""

    samples: list[MeasuredRecovery] = Field(default_factory=list)
    incidents: int = 0  # closed runs read
    unreadable: int = 0  # closed runs whose result is not an incident this code reads


Recent = Callable[[str, timedelta], Awaitable[HistoryRead]]


class TemporalRecoveries:
    """The measured recoveries of a cluster's closed incidents, read from Temporal."""

    def __init__(self, client: Client, *, max_runs: int = MAX_RUNS) -> None:
        self._client = client
        self._max_runs = max_runs
        # run id -> its measurements (None: its result is not an incident this code reads).
        self._runs: dict[str, list[MeasuredRecovery] | None] = {}
        self._reading: dict[tuple[str, timedelta], asyncio.Future[HistoryRead]] = {}

    async def recent(self, cluster: str, within: timedelta) -> HistoryRead:
        """The cluster's closed incidents within `within`, newest first, at most max_runs.
        Reads that overlap share one."""
        key = (cluster, within)
        reading = self._reading.get(key)
        if reading is None or reading.done():
            reading = asyncio.ensure_future(self._read(cluster, within))
            self._reading[key] = reading
        # Shielded: a caller that stops waiting does not cancel the read others share.
        return await asyncio.shield(reading)

    async def _read(self, cluster: str, within: timedelta) -> HistoryRead:
        since = datetime.now(UTC) - within
        query = (
            f"WorkflowType = '{WORKFLOW_TYPE}' AND Cluster = {quoted(cluster)} "
            f"AND ExecutionStatus = 'Completed' "
            f"AND CloseTime >= '{since.strftime('%Y-%m-%dT%H:%M:%SZ')}'"
        )
        runs = [wf async for wf in self._client.list_workflows(query, limit=self._max_runs)]
        new = [wf for wf in runs if wf.run_id not in self._runs]
        limit = asyncio.Semaphore(FETCH_AT_ONCE)

        async def fetch(wf_id: str, run_id: str, closed_at: datetime) -> None:
            async with limit:
                handle = self._client.get_workflow_handle(
                    wf_id, run_id=run_id, result_type=IncidentState
                )
                try:
                    state = await handle.result(follow_runs=False)
                except (ValidationError, TypeError, ValueError) as e:
                    activity.logger.warning("incident %s/%s unreadable: %r", wf_id, run_id, e)
                    self._runs[run_id] = None
                    return
                self._runs[run_id] = measured_from(state.recovery_losses, closed_at)

        await asyncio.gather(
            *(fetch(wf.id, wf.run_id, wf.close_time or datetime.now(UTC)) for wf in new)
        )
        if len(self._runs) > MAX_REMEMBERED:  # the oldest first out (insertion order)
            for run_id in list(self._runs)[: len(self._runs) - MAX_REMEMBERED]:
                del self._runs[run_id]
        out = HistoryRead(incidents=len(runs))
        for wf in runs:
            found = self._runs.get(wf.run_id)
            if found is None:
                out.unreadable += wf.run_id in self._runs
                continue
            out.samples.extend(found)
        return out


class RecoveryHistoryActivities:
    def __init__(self, recent: Recent) -> None:
        """`recent`: what reads the measured recoveries (TemporalRecoveries.recent)."""
        self._recent = recent

    @activity.defn(name="recovery_figures")
    async def recovery_figures(self, call: RecoveryFiguresCall) -> RecoveryFiguresRead:
        found = await self._recent(call.cluster, timedelta(days=call.spec.within_days))
        return figures_from_history(found.samples, call.prior, call.spec, incidents=found.incidents)
