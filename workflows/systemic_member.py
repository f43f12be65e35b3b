"""A node's incident as a member of a systemic incident (policy guard.systemic,
docs/systemic.md): it joins, parks drained with no repair of its own, and acts on the
verdict the systemic incident tells it.

The fleet guard says a node is a member: in its registration's answer, by the
`systemic_member` signal (a member that registered before the group formed), or by refusing
its repair. The incident then yields wherever it is: drained (its own quarantine, within
the guard's floor) it joins and waits; a repair the guard held is given up; a repair that
had already started runs to its end (a machine is never stopped midway) and the incident
yields after it, with no gate and no next rung; a hand-off of its own that waits for an
answer is given up. The verdict: `returned` (passed the screen with the others: back to
service, no repair), `screen_failed` (its own incident from here: the ladder), `fixed`
(the fabric is fixed but it was not screened with the others: it screens itself first),
`declined` (left drained, closed `handed_off`), `failed` (left drained for a human).

Without the policy flag nothing here issues a command, so runs opened before it replay
unchanged (docs/versioning.md).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from autoclusters.activities import contracts
    from autoclusters.core.models import IncidentRequest, Waiting
    from autoclusters.core.policy import TOPOLOGY_LEVELS
    from autoclusters.core.systemic import JoinCall, MemberJoin, SystemicRequest
    from autoclusters.core.systemic_member import Membership, SystemicVerdict

from autoclusters.workflows.burn_in_steps import BurnIn
from autoclusters.workflows.guard_steps import GuardSeat
from autoclusters.workflows.handoff_steps import Declined
from autoclusters.workflows.health_gate_steps import Evidence
from autoclusters.workflows.incident import Incident


class YieldToSystemic(Exception):
    """Raised where the runbook learns it must yield (a held repair, a repair that ran,
    a hand-off given up); caught by `SystemicSeat.unless_yielding`."""

    def __init__(self, membership: Membership | None, *, repaired: str | None = None) -> None:
        super().__init__("a member of a systemic incident")
        self.membership = membership
        self.repaired = repaired


class SystemicSeat:
    def __init__(
        self, incident: Incident, guard: GuardSeat, evidence: Evidence, burn_in: BurnIn
    ) -> None:
        self.incident = incident
        self.on = incident.policy.guard.systemic.enabled
        self._guard = guard
        self._evidence = evidence
        self._burn_in = burn_in
        self._decided = False  # the verdict was acted on: nothing yields again
        self.registered_at: datetime | None = None  # when the guard counted its fault

    # --- what the guard and the systemic incident tell it (signals) ----------------------

    def told(self, membership: Membership) -> None:
        s = self.incident.state
        if self.on and s.systemic is None:
            s.systemic = membership
            self._guard.systemic = membership  # a repair held in the guard's queue wakes

    def verdict(self, verdict: SystemicVerdict) -> None:
        s = self.incident.state
        if self.on and s.systemic_verdict is None:
            s.systemic_verdict = verdict

    def pending(self) -> bool:
        """A member whose systemic incident has not told it its verdict yet."""
        s = self.incident.state
        return self.on and s.systemic is not None and s.systemic_verdict is None

    # --- the runbook's side ------------------------------------------------------------

    async def owns_it(self, req: IncidentRequest) -> bool:
        """Right after the quarantine: a member yields (or acts on the verdict it was told
        while it waited for its drain). True: back to service without a repair (passed a
        screen); False: not a member, or its own ladder from here."""
        s = self.incident.state
        if not self.on:
            return False
        await self._window(req)
        if self._decided or (s.systemic is None and s.systemic_verdict is None):
            return False
        return await self._yield(req, None)

    def _window_s(self, req: IncidentRequest) -> float:
        """The longest window of a level that would count this fault on this node (0:
        none: no domain known, or no level counts the fault)."""
        p = self.incident.policy
        topo = p.topology.get(req.node)
        windows = [
            rule.window_s
            for level in TOPOLOGY_LEVELS
            if (rule := p.guard.systemic.level(level)) is not None
            and topo is not None
            and topo.domain(level)
            and any(rule.counts(f.fault) for f in self.incident.state.faults)
        ]
        return max(windows, default=0.0)

    async def _window(self, req: IncidentRequest) -> None:
        """A fault that may yet be part of a systemic incident (its node's leaf, NVLink
        domain or rack counts it) is not repaired or handed off on its own before its
        window is over: the guard groups the faults of a bad switch as they come in
        (seconds apart), and the first ones must not reboot their machines meanwhile."""
        s = self.incident.state
        window_s = self._window_s(req)
        if s.systemic is not None or s.systemic_verdict is not None or not window_s:
            return
        since = self.registered_at or s.request.opened_at
        left = since + timedelta(seconds=window_s) - workflow.now()
        if left <= timedelta(0):
            return

        async def wait() -> str:
            try:
                await workflow.wait_condition(
                    lambda: s.systemic is not None or s.systemic_verdict is not None,
                    timeout=left,
                )
            except TimeoutError:
                return f"no systemic incident within {window_s:.0f}s: its own incident"
            m = s.systemic
            return f"a member of {m.incident_id}" if m is not None else "told a verdict"

        await self.incident.steps.step("systemic_window", wait, lambda why: why)

    async def unless_yielding(
        self,
        run: Callable[[], Awaitable[None]],
        req: IncidentRequest,
        ladder: Callable[[IncidentRequest], Awaitable[None]],
    ) -> None:
        """`run()`; where it learns it must yield: yield, then the verdict decides
        (returned: done; its own incident: `ladder`)."""
        try:
            await run()
            return
        except YieldToSystemic as y:
            if y.membership is not None:
                self.told(y.membership)
            if await self._yield(req, y.repaired):
                return
        await ladder(req)  # the verdict is in: nothing yields again

    async def join(self, *, drained: bool = False, repaired: str | None = None) -> None:
        """Join the systemic incident (the first member starts it); a refusal (it closed
        already) leaves the member to screen itself."""
        inc, s = self.incident, self.incident.state
        m, r = s.systemic, s.request
        assert m is not None
        call = JoinCall(
            start=SystemicRequest(
                incident_id=m.incident_id,
                cluster=r.cluster,
                level=m.level,
                domain=m.domain,
                opened_at=m.opened_at,
                nodes=m.nodes,
                policy=inc.policy,
                guard=self._guard.guard,
            ),
            join=MemberJoin(
                node=r.node,
                incident_id=r.incident_id,
                workflow_id=workflow.info().workflow_id,
                fault=r.fault,
                drained=drained,
                faults=list(s.faults),
                readings=list(self._evidence.snapshots)[-1:],
                repaired=repaired,
                kubernetes=r.kubernetes,
            ),
        )
        try:
            await inc.steps.activity(
                "systemic_join",
                contracts.systemic_join,
                call,
                f"join systemic incident {m.incident_id} ({m.level} {m.domain})"
                + (", drained" if drained else ""),
                lambda a: f"{a.incident_id}: members {', '.join(a.members)}",
            )
        except ActivityError as e:
            if s.systemic_verdict is None:
                s.systemic_verdict = SystemicVerdict(
                    incident_id=m.incident_id,
                    verdict="fixed",
                    detail=f"the systemic incident took no join ({e.cause or e})",
                )

    async def _yield(self, req: IncidentRequest, repaired: str | None) -> bool:
        inc, s = self.incident, self.incident.state
        self._decided = True
        m = s.systemic
        if s.systemic_verdict is None and m is not None:
            await self.join(drained=True, repaired=repaired)
        if s.systemic_verdict is None and m is not None:
            others = [n for n in m.nodes if n != req.node]
            await inc.notify(
                "systemic",
                f"{req.node} is a member of systemic incident {m.incident_id} ({m.level} "
                f"{m.domain}" + (f", with {', '.join(others)}" if others else "") + "): "
                "drained, no reboot or replacement of its own while it is open"
                + (f" (its {repaired} had already started)" if repaired else ""),
                "warning",
            )
            s.waiting_for = Waiting(
                kind="systemic",
                step="systemic_wait",
                detail=f"the verdict of systemic incident {m.incident_id} ({m.level} {m.domain})",
                since=workflow.now(),
            )
            inc.publish()
            await inc.steps.step(
                "systemic_wait",
                lambda: workflow.wait_condition(lambda: s.systemic_verdict is not None),
                lambda _: self._verdict_text(),
            )
            s.waiting_for = None
            inc.publish()
        v = s.systemic_verdict
        assert v is not None
        if v.verdict == "returned":
            return True
        if v.verdict == "declined":
            raise Declined(f"systemic incident {v.incident_id}: {v.detail}")
        if v.verdict == "failed":
            raise ApplicationError(
                f"systemic incident {v.incident_id} failed: {v.detail}",
                type="SystemicFailed",
                non_retryable=True,
            )
        if v.verdict == "fixed":
            # Not screened with the others: its own screen decides, as for a silent fault.
            await inc.notify(
                "systemic",
                f"systemic incident {v.incident_id} is over ({v.detail}): {req.node} is "
                "screened before any repair of its own",
                "info",
            )
            return await self._burn_in.before_repair()
        self._burn_in.must_pass = True  # every repair of its own is screened before return
        await inc.notify(
            "escalated",
            f"{req.node} failed its screen after systemic incident {v.incident_id} "
            f"({v.detail}): its own incident from here; next: {s.rung}",
            "warning",
        )
        return False

    def _verdict_text(self) -> str:
        v = self.incident.state.systemic_verdict
        return f"{v.verdict}: {v.detail}" if v is not None else ""
