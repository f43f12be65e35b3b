"""Reading incidents back from Temporal: every NodeRemediation history of a cluster, turned
into incident records (core/incident_record.py) for the policy replay and the ladder.

Read-only: it lists runs by a visibility query and fetches each one's history; it never
starts, signals, queries or updates a workflow, and needs no worker (a query on a closed
run would replay it on one). A history read from a file (`WorkflowHistory.from_json`, as
tests/histories keeps them) goes through the same `record_from_history`.

What a history says, and where:
- the request (policy snapshot, fault, node): the workflow's input;
- recurrence and breaker: the `guard_register` result; held or admitted: each
  `guard_admit_*` result;
- the rung chosen at open, and each raise: the RepairAction search attribute upserts;
- each repair: `repair_node` (its rung); its verdict: failed when another repair followed
  (the runbook climbs only on a failed gate) or the repair itself failed, passed when the
  node was returned (or the incident resolved) after it;
- approvals asked: the `approval_needed` notifications; decided: the approve/reject updates;
- the end: the run's result, else its closing notification.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import time
import weakref
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError
from temporalio.api.common.v1 import Payload
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter

from autoclusters.core.guard import Admission as GuardAdmission
from autoclusters.core.guard import Registration
from autoclusters.core.incident_record import Admission, IncidentRecord, RepairAttempt
from autoclusters.core.ladder import figures_from
from autoclusters.core.ladder_figures import LadderFigures
from autoclusters.core.lemon import lemon_window, repairs_on_node
from autoclusters.core.models import (
    ApprovalRequest,
    FaultReport,
    IncidentRequest,
    IncidentState,
    Notification,
    RepairInput,
    RequeueResult,
    ScreenResult,
)
from autoclusters.core.policy import LADDER, Policy, Rung
from autoclusters.core.recovery_cost import RecoveryPlan
from autoclusters.core.recovery_loss import (
    MeasureRecoveryInput,
    MeasureRecoveryResult,
    actual_loss,
)
from autoclusters.core.systemic import JoinCall
from autoclusters.core.systemic_member import SYSTEMIC_VERDICT_SIGNAL, SystemicVerdict
from autoclusters.integrations.temporal import quoted

log = logging.getLogger("autoclusters.incident_history")

WORKFLOW_TYPE = "NodeRemediation"
CLOSING_EVENTS = {
    "resolved", "failed", "rejected", "observed", "monitored", "cancelled", "handed_off",
}  # fmt: skip
REPAIR_RUNGS = {r.value for r in LADDER if r != Rung.MONITOR}


class UnreadableHistory(ValueError):
    """A history that is not an incident this code can read (another type, a broken input)."""


class IncidentHistories(BaseModel):
    """What a read found: the records, and each run that could not be read, with why (never
    dropped silently: a replay over part of the history must say it is partial)."""

    cluster: str
    since: datetime | None = None
    records: list[IncidentRecord] = Field(default_factory=list)
    unreadable: list[str] = Field(default_factory=list)


def _decode(payloads: Sequence[Payload], kind: type[Any]) -> Any:
    return pydantic_data_converter.payload_converter.from_payloads(list(payloads), [kind])[0]


def _at(event: HistoryEvent) -> datetime:
    return event.event_time.ToDatetime(tzinfo=UTC)


class _Reader:
    """One pass over a history, in event order."""

    def __init__(self, req: IncidentRequest, started_at: datetime) -> None:
        self.rec = IncidentRecord(
            incident_id=req.incident_id,
            cluster=req.cluster,
            node=req.node,
            fault=req.fault,
            faults=[req.fault],
            started_at=started_at,
            policy=req.policy or Policy(),
        )
        self.scheduled: dict[int, tuple[str, HistoryEvent]] = {}
        self.rung: str | None = None  # the incident's rung as last published
        self.closing: str | None = None  # the last closing notification's event
        self.result: IncidentState | None = None
        self.workflow_failed = False
        self.returned = False
        # The plans of the last requeue that made any, and the measuring step's input: a
        # failed incident returns no state, and its losses are still read from its steps.
        self.plans: list[RecoveryPlan] = []
        self.paths: dict[int, str] = {}
        self.measuring: MeasureRecoveryInput | None = None

    def event(self, e: HistoryEvent) -> None:
        kind = e.WhichOneof("attributes")
        handler = getattr(self, f"_on_{kind}", None) if kind else None
        if kind and handler is not None:
            handler(e, getattr(e, kind))

    def _on_activity_task_scheduled_event_attributes(self, e: HistoryEvent, a: Any) -> None:
        name = a.activity_type.name
        self.scheduled[e.event_id] = (name, e)
        if name == "repair_node":
            inp: RepairInput = _decode(a.input.payloads, RepairInput)
            if self.rec.repairs and self.rec.repairs[-1].passed is None:
                self.rec.repairs[-1].passed = False  # the runbook climbs only on a failed gate
            self.rec.repairs.append(RepairAttempt(rung=inp.rung, at=_at(e)))
        elif name == "notify":
            note: Notification = _decode(a.input.payloads, Notification)
            rung = note.text.split(" ", 1)[0]
            if note.event == "approval_needed" and rung in REPAIR_RUNGS:
                self.rec.approvals_asked.append(rung)
            elif note.event in CLOSING_EVENTS:
                self.closing = note.event
        elif name == "burn_in_screen" and not self.rec.repairs:
            self.rec.screened_before_repair = True
        elif name == "return_to_service" and self.rec.repairs:
            self.returned = True
        elif name == "measure_recovery":
            self.measuring = _decode(a.input.payloads, MeasureRecoveryInput)
        elif name == "systemic_join" and self.rec.systemic is None:
            join: JoinCall = _decode(a.input.payloads, JoinCall)
            self.rec.systemic = join.start.incident_id

    def _on_workflow_execution_signaled_event_attributes(self, e: HistoryEvent, a: Any) -> None:
        if a.signal_name == SYSTEMIC_VERDICT_SIGNAL and self.rec.systemic_verdict is None:
            told: SystemicVerdict = _decode(a.input.payloads, SystemicVerdict)
            self.rec.systemic_verdict = told.verdict

    def _on_activity_task_completed_event_attributes(self, e: HistoryEvent, a: Any) -> None:
        name, scheduled = self.scheduled.get(a.scheduled_event_id, ("", None))
        if name == "guard_register":
            reg: Registration = _decode(a.result.payloads, Registration)
            self.rec.recent_on_node = reg.recent_on_node
            self.rec.breaker_tripped = reg.breaker.tripped
        elif name in ("guard_admit_quarantine", "guard_admit_repair"):
            adm: GuardAdmission = _decode(a.result.payloads, GuardAdmission)
            self.rec.admissions.append(
                Admission(
                    kind=name.removeprefix("guard_admit_"),
                    admitted=adm.admitted,
                    reason=adm.reason,
                    at=_at(e),
                )
            )
        elif name == "return_to_service" and self.rec.returned_at is None:
            self.rec.returned_at = _at(e)
        elif name == "requeue_jobs":
            requeued: RequeueResult = _decode(a.result.payloads, RequeueResult)
            if requeued.plans:
                self.plans, self.paths = requeued.plans, requeued.recovery_path()
        elif name == "measure_recovery" and self.measuring is not None:
            done = _decode(a.result.payloads, MeasureRecoveryResult)
            self._measured(done, self.measuring.lost_from)
        elif name == "burn_in_screen" and self.rec.screen_passed is None and not self.rec.repairs:
            screened: ScreenResult = _decode(a.result.payloads, ScreenResult)
            self.rec.screen_passed = screened.passed  # the screen before any repair

    def _measured(self, done: MeasureRecoveryResult, fault_at: float) -> None:
        seen = {x.job_id: x for x in done.seen}
        self.rec.recovery_losses = [
            actual_loss(p, self.paths.get(p.job_id, "requeue"), seen[p.job_id], fault_at)
            for p in self.plans
            if p.job_id in seen
        ]  # fmt: skip

    def _on_activity_task_failed_event_attributes(self, e: HistoryEvent, a: Any) -> None:
        name, _ = self.scheduled.get(a.scheduled_event_id, ("", None))
        if name == "repair_node" and self.rec.repairs:
            self.rec.repairs[-1].passed = False  # the repair itself failed: not fixed by it
            self.rec.repairs[-1].repair_failed = True

    def _on_upsert_workflow_search_attributes_event_attributes(
        self, e: HistoryEvent, a: Any
    ) -> None:
        field = a.search_attributes.indexed_fields.get("RepairAction")
        if field is None:
            return
        rung = _decode([field], str)
        if rung and rung != "none" and self.rec.rung is None:
            self.rec.rung = rung  # the first publish follows the choice at open
        self.rung = rung

    def _on_workflow_execution_update_accepted_event_attributes(
        self, e: HistoryEvent, a: Any
    ) -> None:
        inp = a.accepted_request.input
        if inp.name == "report_fault":
            rep: FaultReport = _decode(inp.args.payloads, FaultReport)
            if rep.fault not in self.rec.faults:
                self.rec.faults.append(rep.fault)
        elif inp.name in ("approve", "reject"):
            req: ApprovalRequest = _decode(inp.args.payloads, ApprovalRequest)
            self.rec.decisions.append((req.step, inp.name == "approve"))

    def _on_workflow_execution_completed_event_attributes(self, e: HistoryEvent, a: Any) -> None:
        self.rec.closed_at = _at(e)
        if a.result.payloads:
            self.result = _decode(a.result.payloads, IncidentState)

    def _on_workflow_execution_failed_event_attributes(self, e: HistoryEvent, a: Any) -> None:
        self.rec.closed_at = _at(e)
        self.workflow_failed = True

    def _ended(self, e: HistoryEvent, a: Any) -> None:
        self.rec.closed_at = _at(e)

    _on_workflow_execution_terminated_event_attributes = _ended
    _on_workflow_execution_timed_out_event_attributes = _ended
    _on_workflow_execution_canceled_event_attributes = _ended

    def finish(self) -> IncidentRecord:
        rec = self.rec
        if self.result is not None:
            rec.status = self.result.status
            rec.skipped = [s.detail for s in self.result.steps if s.name == "skip_rung"]
            rec.recovery_losses = self.result.recovery_losses or rec.recovery_losses
        elif self.closing is not None:
            rec.status = self.closing
        elif self.workflow_failed:
            rec.status = "failed"
        elif rec.closed_at is not None:
            rec.status = "cancelled"  # terminated or timed out: nobody closed it
        if rec.repairs and rec.repairs[-1].passed is None:
            if self.returned or rec.status == "resolved":
                rec.repairs[-1].passed = True
            elif rec.status == "failed":
                rec.repairs[-1].passed = False  # the gate failed and the ladder ended
        if rec.returned_at is None and rec.status == "resolved" and rec.repairs:
            rec.returned_at = rec.closed_at  # a hot spare serves: capacity back at the close
        return rec


def record_from_history(history: WorkflowHistory) -> IncidentRecord:
    """The incident record a NodeRemediation history tells; UnreadableHistory otherwise."""
    events = list(history.events)
    if not events:
        raise UnreadableHistory(f"{history.workflow_id}: empty history")
    first = events[0]
    started = first.workflow_execution_started_event_attributes
    if first.WhichOneof("attributes") != "workflow_execution_started_event_attributes":
        raise UnreadableHistory(f"{history.workflow_id}: does not begin with its start")
    if started.workflow_type.name != WORKFLOW_TYPE:
        raise UnreadableHistory(
            f"{history.workflow_id}: a {started.workflow_type.name}, not an incident"
        )
    try:
        req: IncidentRequest = _decode(started.input.payloads, IncidentRequest)
        reader = _Reader(req, _at(first))
        for e in events[1:]:
            reader.event(e)
        return reader.finish()
    except (ValidationError, ValueError, IndexError) as err:
        raise UnreadableHistory(f"{history.workflow_id}: {err}") from err


async def read_incidents(
    client: Client,
    cluster: str,
    since: timedelta | None = None,
    *,
    limit: int | None = None,
    node: str | None = None,
) -> IncidentHistories:
    """Every incident of `cluster` (of `node` alone, if given) started within `since`
    (None: all), oldest first.

    A list or fetch that fails raises (Temporal's RPCError): the caller must not take a
    failed read for a quiet cluster. A history that reads but is not an incident this code
    understands is listed in `unreadable`."""
    query = f"WorkflowType = '{WORKFLOW_TYPE}' AND Cluster = {quoted(cluster)}"
    if node is not None:
        query += f" AND Node = {quoted(node)}"
    start = None
    if since is not None:
        start = datetime.now(UTC) - since
        query += f" AND StartTime >= '{start.strftime('%Y-%m-%dT%H:%M:%SZ')}'"
    out = IncidentHistories(cluster=cluster, since=start)
    async for wf in client.list_workflows(query, limit=limit):
        handle = client.get_workflow_handle(wf.id, run_id=wf.run_id)
        history = await handle.fetch_history()
        try:
            out.records.append(record_from_history(history))
        except UnreadableHistory as e:
            log.warning("incident history %s/%s unreadable: %s", wf.id, wf.run_id, e)
            out.unreadable.append(str(e))
    out.records.sort(key=lambda r: r.started_at)
    return out


def read_history_files(paths: Sequence[Path], cluster: str | None = None) -> IncidentHistories:
    """Incidents from histories exported as JSON (`temporal workflow show --output json`,
    or tests/histories): the same records, for a replay away from the cluster's Temporal.
    `cluster`: keep only that cluster's incidents (None: every one in the files)."""
    out = IncidentHistories(cluster=cluster or "*")
    for path in paths:
        try:
            history = WorkflowHistory.from_json(path.stem, path.read_text())
            rec = record_from_history(history)
        except (OSError, ValueError, KeyError) as e:  # a bad file is named, never skipped
            out.unreadable.append(f"{path}: {e}")
            continue
        if cluster is None or rec.cluster == cluster:
            out.records.append(rec)
    out.records.sort(key=lambda r: r.started_at)
    return out


_SINCE = re.compile(r"^(\d{1,5})([dhm])$")


def parse_since(text: str) -> timedelta | None:
    """`30d`, `12h`, `90m`; `all`: no limit. ValueError names what is accepted."""
    if text == "all":
        return None
    m = _SINCE.match(text.strip())
    if not m or int(m.group(1)) == 0:
        raise ValueError(f"--since {text!r}: write a positive count and d, h or m (30d), or all")
    unit = {"d": "days", "h": "hours", "m": "minutes"}[m.group(2)]
    return timedelta(**{unit: int(m.group(1))})


# How far back the figures an incident opens with reach, how long one read serves the
# incidents that open after it (a fault storm opens hundreds in a minute: one read), and how
# long an open waits for a read before it goes on with the plain ladder.
LADDER_HISTORY = timedelta(days=90)
LADDER_FRESH_S = 600.0
LADDER_WAIT_S = 5.0


class LadderAtOpen:
    """The ladder's figures for the incidents a client opens: read from the cluster's
    history when the policy skips rungs, shared by the opens within LADDER_FRESH_S, and
    put in the policy snapshot the incident carries (core/ladder.py decides with them).

    An open never waits long for them: while a stale read is refreshed the last figures
    serve, and a first read that fails or takes over LADDER_WAIT_S opens the incident
    with the plain ladder (the log says so). Skipping is an economy, never a reason to
    hold an incident up."""

    def __init__(
        self,
        client: Client,
        *,
        clock: Callable[[], float] = time.monotonic,
        wait_s: float = LADDER_WAIT_S,
    ) -> None:
        self._client = client
        self._clock = clock
        self._wait_s = wait_s
        # cluster -> (when the read began, the read): opens within LADDER_FRESH_S share it.
        self._reads: dict[str, tuple[float, asyncio.Future[LadderFigures]]] = {}
        self._last: dict[str, LadderFigures] = {}  # cluster -> the last figures read

    async def _figures(self, cluster: str) -> LadderFigures:
        found = await read_incidents(self._client, cluster, LADDER_HISTORY)
        figures = figures_from(found.records)
        self._last[cluster] = figures
        return figures

    def _reading(self, cluster: str) -> asyncio.Future[LadderFigures]:
        now = self._clock()
        began, reading = self._reads.get(cluster, (0.0, None))
        if (
            reading is None
            or now - began > LADDER_FRESH_S
            or (reading.done() and reading.exception() is not None)
        ):
            reading = asyncio.ensure_future(self._figures(cluster))
            reading.add_done_callback(functools.partial(_log_failed, cluster=cluster))
            self._reads[cluster] = (now, reading)
        return reading

    async def figures(self, cluster: str) -> LadderFigures:
        """The cluster's figures over LADDER_HISTORY, the ones the next incident opens
        with: the last read while a refresh runs, else the read, waited for at most
        `wait_s` (TimeoutError). A failed read raises: unknown, never an empty ladder."""
        reading = self._reading(cluster)
        last = self._last.get(cluster)
        if last is not None and not reading.done():
            return last  # refreshed meanwhile
        # Shielded: a caller that stops waiting does not cancel the read the next uses.
        return await asyncio.wait_for(asyncio.shield(reading), self._wait_s)

    async def policy_for_open(self, cluster: str, policy: Policy) -> Policy:
        """`policy` with the cluster's figures when it skips rungs (a policy that already
        carries figures keeps them)."""
        if policy.skip_rung_below <= 0 or policy.ladder is not None:
            return policy
        try:
            figures = await self.figures(cluster)
        except Exception as e:  # Temporal away or slow: the plain ladder, loudly
            log.warning("no ladder figures for %s (the plain ladder): %r", cluster, e)
            return policy
        return policy.model_copy(update={"ladder": figures})


def _log_failed(reading: asyncio.Future[LadderFigures], cluster: str) -> None:
    # Read here, so a refresh nobody awaited never fails unseen.
    if not reading.cancelled() and (e := reading.exception()) is not None:
        log.warning("reading the ladder figures of %s failed: %r", cluster, e)


_AT_OPEN: weakref.WeakKeyDictionary[Client, LadderAtOpen] = weakref.WeakKeyDictionary()


def ladder_at_open(client: Client) -> LadderAtOpen:
    """The one LadderAtOpen of `client` (the API and a CLI each hold one client), so every
    incident they open shares its reads."""
    found = _AT_OPEN.get(client)
    if found is None:
        found = _AT_OPEN[client] = LadderAtOpen(client)
    return found


async def repairs_before(
    client: Client, cluster: str, node: str, policy: Policy, *, wait_s: float = LADDER_WAIT_S
) -> int | None:
    """The incidents that repaired `node` within the policy's lemon window (core/lemon.py),
    read from its own histories when an incident opens; None when the check is off, or the
    read failed or took over `wait_s` (unknown: logged, and it holds nothing back)."""
    if policy.lemon_repairs <= 0:
        return None
    window = lemon_window(policy)
    try:
        found = await asyncio.wait_for(read_incidents(client, cluster, window, node=node), wait_s)
    except Exception as e:  # noqa: BLE001  # Temporal away or slow: unknown, said so
        log.warning("reading the repairs of %s in %s failed: %r", node, cluster, e)
        return None
    return repairs_on_node(found.records, node, datetime.now(UTC) - window)
