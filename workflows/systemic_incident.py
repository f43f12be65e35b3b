"""SystemicIncident: faults that cluster in the topology (the nodes of one InfiniBand leaf,
one NVLink domain, one rack) as one incident that owns its members (docs/systemic.md).

The fleet guard decides who is a member; each member's NodeRemediation joins (`join`, the
first one starts this workflow), is drained by its own quarantine within the guard's floor,
and parks: no reboot, no replacement while this incident is open (the guard refuses their
repairs). This incident:

opens one Slack thread with the members → waits (up to `settle_s`) for the members to be
drained → posts the evidence (which nodes, ports, counters) → hands the domain off to the
provider (workflows/handoff_steps.py; without a provider's webhook, pages a human) → on
`fixed` (or `replaced`): screens the drained members together (one burn-in all-reduce
across them; a failed one is decided member by member, each screened alone) → tells the
guard it is over → tells each member its verdict: `returned` (the member returns its node),
`screen_failed` (the member climbs its own ladder), `fixed` (not drained in time: the
member screens itself), `declined` (left drained), `failed` (left drained for a human).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    FailureError,
    is_cancelled_exception,
)

with workflow.unsafe.imports_passed_through():
    from autoclusters.activities import contracts
    from autoclusters.core.handoff_answer import HandoffAnswer, HandoffRecord
    from autoclusters.core.kubernetes import CordonNodeInput, UncordonNodeInput
    from autoclusters.core.models import (
        Notification,
        ScreenInput,
        ScreenResult,
        Waiting,
        drain_reason,
        workflow_id,
    )
    from autoclusters.core.systemic import (
        SYSTEMIC_VERDICT_SIGNAL,
        CloseSystemicCall,
        JoinAck,
        MemberJoin,
        SystemicMember,
        SystemicRequest,
        SystemicState,
        SystemicStatus,
        SystemicVerdict,
        VerdictKind,
    )
    from autoclusters.core.systemic_evidence import evidence_text, systemic_bundle

from autoclusters.workflows.burn_in_steps import SCREEN_HEARTBEAT, screen_text
from autoclusters.workflows.handoff_steps import ProviderHandoff
from autoclusters.workflows.kubernetes_steps import K8S_CALL
from autoclusters.workflows.steps import NOTIFY_RETRY, Defaults, OnState, Steps, cause_of

NOTIFY_TIMEOUT = timedelta(seconds=30)


@workflow.defn
class SystemicIncident:
    @workflow.init
    def __init__(self, req: SystemicRequest) -> None:
        self._state = SystemicState(
            request=req, members=[SystemicMember(node=n) for n in sorted(req.nodes)]
        )
        p = req.policy
        self._steps = Steps(
            OnState(self._state),
            Defaults(
                timeout=timedelta(seconds=60),
                outage_budget_s=p.outage_budget_s,
                outage_notify_after_s=p.outage_notify_after_s,
            ),
            tell=self._notify,
            subject=self._subject(),
        )
        self._handoff = ProviderHandoff(p.handoff, self._steps, self._notify, self._show_handoff)

    # --- what members, people and the provider send ------------------------------------

    @workflow.query
    def status(self) -> SystemicState:
        return self._state

    @workflow.update
    def join(self, j: MemberJoin) -> JoinAck:
        """A member joins, or reports again (drained now; what it knows of its fault)."""
        s = self._state
        m = s.member(j.node)
        if m is None:
            m = SystemicMember(node=j.node)
            s.members.append(m)
        m.incident_id, m.workflow_id, m.fault = j.incident_id, j.workflow_id, j.fault
        m.joined_at = m.joined_at or workflow.now()
        m.drained = m.drained or j.drained
        m.repaired = m.repaired or j.repaired
        m.kubernetes = m.kubernetes or j.kubernetes
        if j.faults:
            m.faults = list(j.faults)
        if j.readings:
            m.readings = list(j.readings)
        return JoinAck(incident_id=s.request.incident_id, members=[x.node for x in s.members])

    @join.validator
    def _check_join(self, j: MemberJoin) -> None:
        if self._state.status != "open":
            raise ValueError(f"systemic incident {self._state.request.incident_id} is closed")
        if not j.node.strip() or not j.incident_id.strip():
            raise ValueError("node and incident_id must not be empty")

    @workflow.update
    def handoff_answer(self, answer: HandoffAnswer) -> HandoffRecord:
        """The provider's answer (the API verified its signature), or a person's."""
        return self._handoff.take(answer)

    @handoff_answer.validator
    def _check_handoff_answer(self, answer: HandoffAnswer) -> None:
        if self._state.status != "open":
            raise ValueError(f"systemic incident {self._state.request.incident_id} is closed")
        self._handoff.check(answer)

    # --- the runbook ---------------------------------------------------------------------

    @workflow.run
    async def run(self, req: SystemicRequest) -> SystemicState:
        s = self._state
        try:
            await self._notify(
                "opened",
                f"systemic incident: faults on {len(s.members)} nodes of {req.level} "
                f"{req.domain} ({', '.join(m.node for m in s.members)}); the members are "
                "drained within the fleet guard's floor and none is rebooted or replaced "
                "while it is open",
                "critical",
            )
            await self._steps.step("members_drained", self._settle, lambda n: n)
            await self._notify("evidence", evidence_text(s), "warning")
            rec = await self._hand_off()
            if rec.answer == "declined":
                why = "the provider declined the hand-off" + (
                    f" ({rec.ticket})" if rec.ticket else ""
                )
                return await self._close("handed_off", "declined", why, "warning")
            verdicts = await self._screen()
            await self._release_members()
            for m in s.members:
                kind, detail = verdicts.get(m.node, ("fixed", "not drained for the screen"))
                await self._tell_member(m, kind, detail)
            back = sum(1 for m in s.members if m.verdict == "returned")
            return await self._finish(
                "resolved",
                f"the fabric was fixed ({rec.answer}); {back} of {len(s.members)} members "
                "passed the screen together and go back; "
                + "; ".join(f"{m.node}: {m.verdict}" for m in s.members),
            )
        except (ActivityError, ApplicationError) as err:
            if s.status == "open" and is_cancelled_exception(err):
                return await self._cancelled()
            cause = cause_of(err)
            s.error = str(cause)
            return await self._close(
                "failed", "failed", f"{cause}; the members stay drained for a human", "critical"
            )
        except asyncio.CancelledError:
            if s.status != "open":
                raise
            return await self._cancelled()

    async def _cancelled(self) -> SystemicState:
        """Cancelled (the Temporal UI): the members must not wait for ever: each is told
        `failed` (left drained for a human), the guard that it is over."""
        self._state.waiting_for = None
        return await self._close(
            "cancelled",
            "failed",
            "the systemic incident was cancelled; the members stay drained for a human",
            "warning",
        )

    async def _settle(self) -> str:
        """Wait until every member known is drained, at most `settle_s`: a member the floor
        holds is not waited for (it is told `fixed` and screens itself)."""
        s = self._state
        settle = s.request.policy.guard.systemic.settle_s
        s.waiting_for = Waiting(
            kind="systemic",
            step="members_drained",
            detail=f"the members drained (up to {settle:.0f}s)",
            since=workflow.now(),
        )
        try:
            await workflow.wait_condition(
                lambda: bool(s.members) and all(m.drained for m in s.members),
                timeout=timedelta(seconds=settle),
            )
        except TimeoutError:
            pass
        s.waiting_for = None
        drained = [m.node for m in s.members if m.drained]
        return f"{len(drained)} of {len(s.members)} drained: {', '.join(drained) or 'none'}"

    async def _hand_off(self) -> HandoffRecord:
        s, p = self._state, self._state.request.policy
        summary = (
            f"faults on {len(s.members)} nodes of {s.request.level} {s.request.domain} "
            f"({', '.join(m.node for m in s.members)}) within "
            f"{self._window_s():.0f}s: the fabric, not the machines"
        )
        bundle = systemic_bundle(s, "provider_fault", summary, workflow.now())
        if p.handoff.enabled:
            return await self._handoff.hand_off(bundle, self._subject())
        return await self._handoff.ask_a_human(bundle, self._subject())

    def _window_s(self) -> float:
        r = self._state.request
        rule = r.policy.guard.systemic.level(r.level)
        return rule.window_s if rule is not None else 0

    # --- the screen ----------------------------------------------------------------------

    async def _screen(self) -> dict[str, tuple[VerdictKind, str]]:
        """The drained members screened together, then alone where that failed."""
        s = self._state
        drained = [m for m in s.members if m.drained and m.incident_id]
        verdicts: dict[str, tuple[VerdictKind, str]] = {}
        if not drained:
            return verdicts
        if len(drained) > 1:
            together = await self._screen_run(drained, "together")
            if together.passed:
                for m in drained:
                    m.screened = True
                    verdicts[m.node] = ("returned", screen_text(together))
                return verdicts
            await self._notify(
                "escalated",
                f"the members failed their screen together ({together.detail}): each is "
                "screened alone",
                "warning",
            )
        for m in drained:
            alone = await self._screen_run([m], m.node)
            m.screened = alone.passed
            verdicts[m.node] = ("returned" if alone.passed else "screen_failed", screen_text(alone))
        return verdicts

    async def _screen_run(self, members: list[SystemicMember], key: str) -> ScreenResult:
        s = self._state
        r, b = s.request, s.request.policy.burn_in
        first, *others = members
        inp = ScreenInput(
            node=first.node,
            incident_id=r.incident_id,
            key=f"{r.incident_id}:{key}",
            drain_reason=drain_reason(first.incident_id, first.fault),
            timeout_s=b.timeout_s,
            size_mib=b.size_mib,
            rounds=b.rounds,
            min_bus_gbps=b.min_bus_gbps,
            neighbour=False,  # together: the members with each other; alone: alone
            min_gemm_tflops=b.min_gemm_tflops,
            others={m.node: drain_reason(m.incident_id, m.fault) for m in others},
        )
        # On Slinky the operator drains a cordoned Node's slurmd, where the screen's job could
        # never start: the cordon is lifted for the screen (the remediation taint stays, so
        # no other pod lands on a node on trial), put back if it fails (as BurnIn does).
        on_k8s = [m for m in members if m.kubernetes]
        for m in on_k8s:
            await self._steps.activity(
                "k8s_uncordon",
                contracts.k8s_uncordon,
                UncordonNodeInput(node=m.node, incident_id=m.incident_id, keep_taint=True),
                f"uncordon Kubernetes Node {m.node} for the screen (taint kept)",
                lambda u: u.detail,
                timeout=K8S_CALL,
            )
        res: ScreenResult = await self._steps.activity(
            "burn_in_screen",
            contracts.burn_in_screen,
            inp,
            f"burn-in screen of {', '.join(m.node for m in members)} ({r.level} {r.domain})",
            screen_text,
            timeout=timedelta(seconds=b.timeout_s + 120),
            heartbeat=SCREEN_HEARTBEAT,
        )
        s.screens.append(res)
        if not res.passed:
            for m in on_k8s:
                await self._steps.activity(
                    "k8s_cordon",
                    contracts.k8s_cordon,
                    CordonNodeInput(
                        node=m.node,
                        incident_id=m.incident_id,
                        phase="burn-in",
                        reason=drain_reason(m.incident_id, m.fault),
                    ),
                    f"cordon Kubernetes Node {m.node} again (the screen failed)",
                    lambda c: c.detail or ("cordoned" if c.cordoned else ""),
                    timeout=K8S_CALL,
                )
        return res

    # --- the end -------------------------------------------------------------------------

    async def _release_members(self) -> None:
        """The guard first: a member told `screen_failed` asks it for its repair at once."""
        r = self._state.request
        await self._steps.activity(
            "guard_close",
            contracts.systemic_close,
            CloseSystemicCall(guard=r.guard, incident_id=r.incident_id),
            f"tell the fleet guard of {r.cluster} that {r.incident_id} is over",
            lambda members: f"members {', '.join(members) or 'none'}",
        )

    async def _tell_member(self, m: SystemicMember, kind: VerdictKind, detail: str) -> None:
        r = self._state.request
        m.verdict, m.detail = kind, detail
        target = m.workflow_id or r.member_workflows.get(m.node) or workflow_id(r.cluster, m.node)
        try:
            await workflow.get_external_workflow_handle(target).signal(
                SYSTEMIC_VERDICT_SIGNAL,
                SystemicVerdict(incident_id=r.incident_id, verdict=kind, detail=detail),
            )
        except FailureError as e:  # the member's incident is gone: nothing waits for it
            workflow.logger.warning("could not tell %s its verdict %s: %s", target, kind, e)

    async def _close(
        self, status: SystemicStatus, kind: VerdictKind, text: str, severity: str
    ) -> SystemicState:
        """Every member left drained (declined, failed): the guard, then each member."""
        try:
            await self._release_members()
        except ActivityError as e:  # the guard's reconcile frees the members' place later
            workflow.logger.warning("fleet guard not told of the close: %s", cause_of(e))
        for m in self._state.members:
            await self._tell_member(m, kind, text)
        return await self._finish(status, text, severity)

    async def _finish(
        self, status: SystemicStatus, text: str, severity: str = "info"
    ) -> SystemicState:
        s = self._state
        s.status, s.closed_at, s.current_step, s.waiting_for = status, workflow.now(), None, None
        await self._notify(status, text, severity)
        return s

    # --- what it says --------------------------------------------------------------------

    def _subject(self) -> str:
        r = self._state.request
        return f"{r.level} {r.domain}"

    def _show_handoff(self, rec: HandoffRecord, waiting: Waiting | None) -> None:
        self._state.handoff, self._state.waiting_for = rec, waiting

    async def _notify(self, event: str, text: str, severity: str = "info") -> None:
        """One Slack thread: every message under the systemic incident's id."""
        r = self._state.request
        note = Notification(
            incident_id=r.incident_id,
            cluster=r.cluster,
            node=r.domain,
            fault=next((m.fault for m in self._state.members if m.fault), "SYSTEMIC"),
            event=event,
            text=text,
            severity=severity,
        )
        try:
            await self._steps.step(
                f"notify_{event}",
                lambda: self._steps.call(
                    contracts.notify,
                    note,
                    f"notify {event}: {r.level} {r.domain} ({r.incident_id})",
                    timeout=NOTIFY_TIMEOUT,
                    retry=NOTIFY_RETRY,
                ),
                ride_out=False,
            )
        except ActivityError:
            workflow.logger.warning("notification %s for %s failed", event, r.incident_id)
