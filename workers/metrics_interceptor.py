"""An activity interceptor that measures the runbook from the worker's side.

- Every activity attempt is timed, by activity type and outcome.
- A fleet-guard admission activity's answer counts as admitted or held.
- When an incident's closing notification (`notify` with the incident's final status as
  its event) has run its first attempt, the incident's timeline is read with the `status`
  query, in the background: it counts the incident closed and observes its job and
  capacity recovery. The first attempt only, so a retried notification does not count
  the incident twice; the query, not the notification, so no workflow had to change.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import timedelta
from typing import Any

from temporalio import activity
from temporalio.client import Client
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from autoclusters.core.guard import Admission, AdmitCall
from autoclusters.core.models import IncidentState, Notification
from autoclusters.core.recovery import capacity_recovery, job_recovery
from autoclusters.workers.metrics import WorkerMetrics

log = logging.getLogger("autoclusters.worker.metrics")

# The incident statuses `_close` notifies with (core.models.IncidentStatus, less "open").
CLOSING_EVENTS = frozenset(
    {"resolved", "failed", "rejected", "observed", "monitored", "cancelled", "handed_off"}
)
ADMISSIONS = {
    "guard_admit_quarantine": "quarantine",
    "guard_admit_repair": "repair",
    "guard_admit_held_drain": "held_drain",
}
QUERY_TIMEOUT = timedelta(seconds=10)


class MetricsInterceptor(Interceptor):
    def __init__(self, metrics: WorkerMetrics, client: Client) -> None:
        self.metrics = metrics
        self.client = client
        # The close observations in flight (a task nobody holds may be collected).
        self._pending: set[asyncio.Task[None]] = set()

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Timed(next, self)

    def closed(self, workflow_id: str, run_id: str) -> None:
        task = asyncio.get_running_loop().create_task(self._observe_close(workflow_id, run_id))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _observe_close(self, workflow_id: str, run_id: str) -> None:
        handle = self.client.get_workflow_handle(workflow_id, run_id=run_id)
        try:
            s = await handle.query("status", result_type=IncidentState, rpc_timeout=QUERY_TIMEOUT)
        except Exception as e:  # noqa: BLE001 - a metric must never fail the worker
            log.warning("incident %s: timeline not read for metrics: %s", workflow_id, e)
            return
        r, m = s.request, self.metrics
        m.incidents_closed.labels(r.cluster, s.status, r.fault, s.rung or "none").inc()
        if (job := job_recovery(s)) is not None:
            m.job_recovery.labels(r.cluster, r.fault).observe(job)
        if (cap := capacity_recovery(s)) is not None:
            seconds, via = cap
            m.capacity_recovery.labels(r.cluster, r.fault, via).observe(seconds)


class _Timed(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, root: MetricsInterceptor) -> None:
        super().__init__(next)
        self._root = root

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        info = activity.info()
        started = time.monotonic()
        outcome = "failed"
        try:
            result = await super().execute_activity(input)
            outcome = "ok"
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            self._root.metrics.step_duration.labels(info.activity_type, outcome).observe(
                time.monotonic() - started
            )
            self._closing(info, input.args)
        self._admission(info.activity_type, input.args, result)
        return result

    def _closing(self, info: activity.Info, args: Any) -> None:
        note = args[0] if info.activity_type == "notify" and args else None
        if isinstance(note, Notification) and note.event in CLOSING_EVENTS and info.attempt == 1:
            self._root.closed(info.workflow_id or "", info.workflow_run_id or "")

    def _admission(self, activity_type: str, args: Any, result: Any) -> None:
        kind = ADMISSIONS.get(activity_type)
        call = args[0] if args else None
        if kind and isinstance(call, AdmitCall) and isinstance(result, Admission):
            outcome = "admitted" if result.admitted else "held"
            self._root.metrics.guard_admissions.labels(call.guard.cluster, kind, outcome).inc()
