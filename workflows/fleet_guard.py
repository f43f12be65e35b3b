"""FleetGuard: one long-running workflow per cluster that admits quarantines and repairs.

A flood of alerts must never drain the cluster. Every incident registers its open here and
asks before it takes a node out of service (quarantine) and before it repairs it:

- quarantine: never fewer than `min_in_service_fraction` of the nodes in service (the
  floor). A critical node drained while its quarantine is held (`admit_held_drain`) is out
  of service too: it asks against the same floor and counts until its quarantine is
  admitted or its incident ends. Only a path the policy names in `below_floor` may go
  below the floor, storm or not;
- repair: at most `max_concurrent_repairs` at once, and none while the circuit breaker is
  tripped. The breaker trips when more than `breaker_threshold` distinct incidents open
  within the sliding `breaker_window_s` (a switch, power, a driver rollout — not N
  independent GPU failures) and stays tripped until a human resets it. Quarantine is not
  held by the breaker: a faulty node still leaves service.

Every handler but the breaker reset is synchronous, so each runs whole within one workflow
task and they never interleave; the reset waits for the worker's check of its proof of who
resets (a local activity), then checks again and resets in one step. Admissions are answers
(`Admission.admitted`), not errors; validators reject malformed requests before they reach
the history. `batch` takes many incidents' calls in
one update (a worker sends its activities' concurrent calls together: Temporal allows 10
updates in flight per workflow) and answers each as its own update would have.

Held incidents do not poll: a held admission (held drains too) is queued,
first come first served per kind, and whenever capacity may have freed (a release, a
breaker reset, a reconcile with Slurm, a newer policy) the guard serves its queues in
arrival order, never past the floor, and tells each admitted incident with the
`guard_admitted` signal, sent from the run loop. The count is the guard's own: many held
incidents asking at once are answered one after the other from it, never from a read each
made elsewhere. Asking again while queued is idempotent (same answer, with the position).
The out-of-service count is reconciled with Slurm: a node left drained for a human counts
out only while Slurm still shows it out of service. The breaker threshold is a fraction
of the cluster with an absolute floor; each registration brings the incident's policy,
topology and approvers, and the guard adopts the newest. Only an approver resets the breaker,
with the API's proof that it is them (core/decision_proof.py): reaching Temporal is not enough.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, FailureError

with workflow.unsafe.imports_passed_through():
    from autoclusters.activities import contracts
    from autoclusters.core.guard import (
        BREAKER_RESET_STEP,
        GUARD_ADMITTED_SIGNAL,
        Admission,
        AdmissionKind,
        AdmitRequest,
        AdmittedNotice,
        BreakerStatus,
        CloseSystemic,
        GuardInput,
        GuardState,
        GuardStatus,
        IncidentOpened,
        OpenRecord,
        PendingNotice,
        PolicyUpdate,
        Registration,
        ReleaseRequest,
        ResetRequest,
        SlurmView,
        SlurmViewCall,
        SpareClaim,
        SpareRequest,
        SystemicGroup,
        SystemicNotice,
        Waiter,
        floor_of,
        reset_subject,
    )
    from autoclusters.core.guard_batch import GuardAnswer, GuardBatch, GuardCall
    from autoclusters.core.models import ProofCheck
    from autoclusters.core.policy import TOPOLOGY_LEVELS
    from autoclusters.core.systemic_member import (
        SYSTEMIC_MEMBER_SIGNAL,
        Membership,
        systemic_incident_id,
        systemic_workflow_id,
    )

from autoclusters.workflows.steps import Defaults, Steps, Unrecorded

SLURM_VIEW_RETRY = RetryPolicy(maximum_attempts=3, maximum_interval=timedelta(seconds=10))
# docs/versioning.md: a reset counted on the name it gave; now the worker checks the API's
# proof of who resets (`check_decision_proof`, a local activity) before it counts.
RESET_PROOF_PATCH = "fleet_guard-0.2-reset-proof"


def _require(**fields: str) -> None:
    for name, value in fields.items():
        if not value.strip():
            raise ValueError(f"{name} must not be empty")


@workflow.defn
class FleetGuard:
    @workflow.init
    def __init__(self, inp: GuardInput) -> None:
        # Built from the input (and the state carried over) so handlers see it at once.
        self._input = inp
        self._state = inp.state.model_copy(deep=True) if inp.state else GuardState()
        # Its one activity, the reconcile's read of Slurm (a guard keeps no step timeline).
        self._steps = Steps(Unrecorded(), Defaults(timedelta(seconds=60), SLURM_VIEW_RETRY))

    @workflow.run
    async def run(self, inp: GuardInput) -> None:
        await self._serve_loop()
        # Every handler is synchronous, but wait anyway: an update must never be left
        # unanswered by the run that accepted it.
        await workflow.wait_condition(workflow.all_handlers_finished)
        self._prune(workflow.now())
        self._state.continued_as_new += 1
        workflow.continue_as_new(self._input.model_copy(update={"state": self._state}))

    async def _serve_loop(self) -> None:
        """Tell admitted incidents; re-read Slurm now and then while it can free capacity."""
        while not self._should_continue_as_new():
            if self._state.notices:
                await self._send_notice(self._state.notices[0])
                continue
            if self._state.systemic_notices:
                await self._tell_member(self._state.systemic_notices[0])
                continue
            due = self._reconcile_in()
            try:
                await workflow.wait_condition(self._woken(due is None), timeout=due)
            except TimeoutError:
                await self._reconcile_from_slurm()

    def _woken(self, idle: bool) -> Callable[[], bool]:
        """Something to tell, time to continue as new, or reconciling starts/stops mattering."""
        return lambda: (
            bool(self._state.notices)
            or bool(self._state.systemic_notices)
            or self._should_continue_as_new()
            or (self._reconcile_in() is None) != idle
        )

    async def _send_notice(self, pending: PendingNotice) -> None:
        try:
            await workflow.get_external_workflow_handle(pending.workflow_id).signal(
                GUARD_ADMITTED_SIGNAL, pending.notice
            )
        except FailureError as e:
            # The incident is gone (closed, terminated): what it was admitted to is free.
            workflow.logger.warning(
                "fleet guard could not tell %s it was admitted (%s); freeing its place",
                pending.notice.incident_id,
                e,
            )
            self._forget(pending.notice.incident_id, pending.notice.kind)
        self._state.notices = [n for n in self._state.notices if n is not pending]

    async def _tell_member(self, pending: SystemicNotice) -> None:
        try:
            await workflow.get_external_workflow_handle(pending.workflow_id).signal(
                SYSTEMIC_MEMBER_SIGNAL, pending.membership
            )
        except FailureError as e:
            # The member's incident is gone: nothing to tell (the systemic incident tells
            # each member it knows of its verdict anyway).
            workflow.logger.warning(
                "fleet guard could not tell %s of %s (%s)",
                pending.workflow_id,
                pending.membership.incident_id,
                e,
            )
        st = self._state
        st.systemic_notices = [n for n in st.systemic_notices if n is not pending]

    def _forget(self, incident_id: str, kind: AdmissionKind) -> None:
        st = self._state
        held = {
            "quarantine": st.out_of_service,
            "repair": st.repairing,
            "held_drain": st.held_drained,
        }[kind]
        for node in [n for n, i in held.items() if i == incident_id]:
            del held[node]
        self._serve()

    def _reconcile_in(self) -> timedelta | None:
        """How long until the next periodic reconcile; None: nothing it could free."""
        st = self._state
        # A node resumed by hand frees room under the floor, for quarantines and held drains.
        if not st.left_out and not any(w.kind != "repair" for w in st.queue):
            return None
        every = timedelta(seconds=self._input.policy.reconcile_interval_s)
        last = st.reconciled_at or workflow.now()
        return max(last + every - workflow.now(), timedelta(seconds=1))

    async def _reconcile_from_slurm(self) -> None:
        try:
            view = await self._steps.call(
                contracts.guard_slurm_view,
                SlurmViewCall(cluster=self._input.cluster),
                f"read which nodes of cluster {self._input.cluster} Slurm has out of service",
            )
        except ActivityError as e:
            workflow.logger.warning("fleet guard could not read Slurm: %s", e.cause or e)
            self._state.reconciled_at = workflow.now()  # try again after the interval
            return
        self._reconcile(view)

    def _reconcile(self, view: SlurmView) -> None:
        """A node left drained for a human that Slurm shows in service again was resumed
        by hand: it counts as in service again."""
        st = self._state
        if view.cluster_nodes > 0:
            st.cluster_nodes = view.cluster_nodes
        out_now = set(view.out_of_service)
        for node, incident_id in list(st.left_out.items()):
            if node not in out_now:
                del st.left_out[node]
                if st.out_of_service.get(node) == incident_id:
                    del st.out_of_service[node]
        st.reconciled_at = workflow.now()
        self._serve()

    def _should_continue_as_new(self) -> bool:
        info = workflow.info()
        limit = self._input.max_history_events
        return info.is_continue_as_new_suggested() or (
            limit is not None and info.get_current_history_length() >= limit
        )

    # --- queries ---------------------------------------------------------------------

    @workflow.query
    def status(self) -> GuardStatus:
        return GuardStatus(
            cluster=self._input.cluster,
            policy=self._input.policy,
            state=self._state,
            approvers=self._input.approvers,
        )

    # --- policy ----------------------------------------------------------------------

    @workflow.update
    def update_policy(self, upd: PolicyUpdate) -> GuardStatus:
        """A newer guard policy (and topology, approvers): adopted at once."""
        self._adopt(upd)
        self._serve()
        return self.status()

    def _adopt(self, upd: PolicyUpdate) -> None:
        changes: dict[str, object] = {"policy": upd.policy}
        if upd.topology is not None:
            changes["topology"] = upd.topology
        if upd.approvers is not None:
            changes["approvers"] = [a.strip() for a in upd.approvers if a.strip()]
        self._input = self._input.model_copy(update=changes)

    # --- register --------------------------------------------------------------------

    @workflow.update
    def register(self, req: IncidentOpened) -> Registration:
        """Record an incident's open; say how often the node failed lately; maybe trip."""
        return self._register(req)

    def _register(self, req: IncidentOpened) -> Registration:
        state, now = self._state, workflow.now()
        self._prune(now)
        known = next((o for o in state.opens if o.incident_id == req.incident_id), None)
        if known is not None:  # a retried registration: same answer, nothing new
            group = state.group_of(req.node)
            return Registration(
                recent_on_node=known.recent_on_node,
                breaker=state.breaker,
                systemic=group.told() if group is not None else None,
            )

        if req.policy is not None:  # the newest incident's policy is the cluster's now
            self._adopt(
                PolicyUpdate(policy=req.policy, topology=req.topology, approvers=req.approvers)
            )
        if req.slurm is not None:
            self._reconcile(req.slurm)
        state.recurrence_window_s = max(state.recurrence_window_s, req.recurrence_window_s)
        since = now - timedelta(seconds=req.recurrence_window_s)
        recent = sum(1 for o in state.opens if o.node == req.node and o.at > since)
        state.opens.append(
            OpenRecord(
                node=req.node,
                incident_id=req.incident_id,
                fault=req.fault,
                at=now,
                recent_on_node=recent,
                workflow_id=req.workflow_id,
            )
        )
        self._check_breaker(req.node, now)
        systemic = self._systemic(req, now)
        if req.policy is not None:
            self._serve()  # a newer policy may admit more
        return Registration(recent_on_node=recent, breaker=state.breaker, systemic=systemic)

    @register.validator
    def _validate_register(self, req: IncidentOpened) -> None:
        _require(node=req.node, incident_id=req.incident_id)
        if req.recurrence_window_s <= 0:
            raise ValueError("recurrence_window_s must be positive")

    def _check_breaker(self, node: str, now: datetime) -> None:
        breaker, policy = self._state.breaker, self._input.policy
        if breaker.tripped:
            # Still tripped: the node joins the picture the human will look at.
            if node not in breaker.nodes:
                breaker.nodes = [*breaker.nodes, node]
                self._describe_topology(breaker)
            return
        since = now - timedelta(seconds=policy.breaker_window_s)
        burst = [o for o in self._state.opens if o.counts_for_breaker and o.at > since]
        if len({o.incident_id for o in burst}) <= policy.breaker_limit(self._state.cluster_nodes):
            return
        breaker.tripped = True
        breaker.tripped_at = now
        breaker.nodes = list(dict.fromkeys(o.node for o in burst))
        self._describe_topology(breaker)
        workflow.logger.warning(
            "circuit breaker of %s tripped: %d incidents within %.0f s on %s",
            self._input.cluster,
            len(burst),
            policy.breaker_window_s,
            ", ".join(breaker.nodes),
        )

    # --- systemic incidents (policy guard.systemic, docs/systemic.md) -----------------

    def _systemic(self, req: IncidentOpened, now: datetime) -> Membership | None:
        """Does this fault make (or join) a systemic incident? At least `min_nodes` nodes
        of one leaf (or NVLink domain, or rack) with a fault within the level's window are
        one: each member is told (the registering one by its answer, the others by a
        signal)."""
        st, sp = self._state, self._input.policy.systemic
        group = st.group_of(req.node)
        if group is not None:  # a member already: a second incident on the node joins too
            self._add_members(group, [self._open_of(req.incident_id)], req.incident_id)
            return group.told()
        topo = self._input.topology.get(req.node)
        if not sp.enabled or topo is None:
            return None
        for level in TOPOLOGY_LEVELS:
            rule, domain = sp.level(level), topo.domain(level)
            if rule is None or not domain or not rule.counts(req.fault):
                continue
            group = st.group(level, domain)
            if group is not None:
                self._add_members(group, [self._open_of(req.incident_id)], req.incident_id)
                return group.told()
            since = now - timedelta(seconds=rule.window_s)
            latest: dict[str, OpenRecord] = {}
            for o in st.opens:
                where = self._input.topology.get(o.node)
                if (
                    o.at > since
                    and where is not None
                    and where.domain(level) == domain
                    and rule.counts(o.fault)
                    and not o.grouped
                    and st.group_of(o.node) is None
                ):
                    latest[o.node] = o
            if len(latest) < rule.min_nodes:
                continue
            group = SystemicGroup(
                membership=Membership(
                    incident_id=systemic_incident_id(domain, now),
                    workflow_id=systemic_workflow_id(self._input.cluster, level, domain),
                    level=level,
                    domain=domain,
                    opened_at=now,
                )
            )
            st.systemic.append(group)
            self._add_members(group, list(latest.values()), req.incident_id)
            workflow.logger.warning(
                "systemic incident %s: %d nodes of %s %s within %.0f s (%s)",
                group.membership.incident_id,
                len(latest),
                level,
                domain,
                rule.window_s,
                ", ".join(sorted(latest)),
            )
            return group.told()
        return None

    def _open_of(self, incident_id: str) -> OpenRecord:
        return next(o for o in self._state.opens if o.incident_id == incident_id)

    def _add_members(self, group: SystemicGroup, opens: list[OpenRecord], asking: str) -> None:
        """Members from now on: no repair while the group is open. Each one but the asking
        incident (its registration's answer tells it) is told by a signal."""
        st = self._state
        for o in opens:
            o.grouped = True
            group.members[o.node] = o.incident_id
            if o.workflow_id is not None:
                group.workflows[o.node] = o.workflow_id
            self._dequeue(o.incident_id, "repair")  # the signal wakes it: it yields
        told = group.told()
        for o in opens:
            if o.incident_id != asking and o.workflow_id is not None:
                st.systemic_notices.append(
                    SystemicNotice(workflow_id=o.workflow_id, membership=told)
                )

    @workflow.update
    def close_systemic(self, req: CloseSystemic) -> list[str]:
        """A systemic incident is over: its members may be repaired again (a member that
        failed its screen climbs its own ladder). Returns the members it had."""
        st = self._state
        group = next((g for g in st.systemic if g.membership.incident_id == req.incident_id), None)
        if group is None:
            return []
        st.systemic = [g for g in st.systemic if g is not group]
        self._serve()
        return sorted(group.members)

    @close_systemic.validator
    def _validate_close_systemic(self, req: CloseSystemic) -> None:
        _require(incident_id=req.incident_id)

    def _describe_topology(self, breaker: BreakerStatus) -> None:
        """Do all the breaker's nodes share an InfiniBand leaf, or a pod?"""
        topo = [self._input.topology.get(n) for n in breaker.nodes]
        leaves = {t.leaf if t else None for t in topo}
        pods = {t.pod if t else None for t in topo}
        breaker.shared_leaf = leaves.pop() if len(leaves) == 1 else None
        breaker.shared_pod = pods.pop() if len(pods) == 1 else None

    # --- quarantine ------------------------------------------------------------------

    @workflow.update
    def admit_quarantine(self, req: AdmitRequest) -> Admission:
        """May this node leave service? Not if too few nodes would be left in service."""
        return self._admit_quarantine(req)

    def _admit_quarantine(self, req: AdmitRequest) -> Admission:
        self._take_view(req)
        out = self._state.out_of_service
        held = out.get(req.node)
        if held is not None:
            # Already out: taking it out again costs no capacity.
            self._take_out(req.node, req.incident_id)
            self._dequeue(req.incident_id, "quarantine")
            why = "already out of service" + ("" if held == req.incident_id else f" ({held})")
            return Admission(admitted=True, reason=why)
        why_not = self._quarantine_refusal(req.node, req.cluster_nodes)
        if why_not is None and not self._ahead(req.incident_id, "quarantine"):
            self._take_out(req.node, req.incident_id)
            self._dequeue(req.incident_id, "quarantine")
            return Admission(admitted=True)
        return self._hold(req, "quarantine", why_not)

    def _take_out(self, node: str, incident_id: str) -> None:
        """The node is quarantined: whatever held it drained before is the quarantine now."""
        st = self._state
        st.out_of_service[node] = incident_id
        st.left_out.pop(node, None)
        st.held_drained.pop(node, None)
        self._dequeue(incident_id, "held_drain")  # the quarantine drains it anyway

    def _quarantine_refusal(self, node: str, cluster_nodes: int) -> str | None:
        out = self._state.counted_out()
        floor = self._min_in_service(cluster_nodes)
        # A node drained while held counts already: its quarantine takes no more out.
        in_service_after = cluster_nodes - len(out | {node})
        if in_service_after >= floor:
            return None
        taking = (
            f"{node} counts already (drained while held), {in_service_after} in service"
            if node in out
            else f"taking {node} out would leave {in_service_after} in service"
        )
        return (
            f"{len(out)} of {cluster_nodes} nodes already out of service "
            f"({', '.join(sorted(out))}); {taking}, below the minimum {floor} "
            f"({self._input.policy.min_in_service_fraction:.0%})"
        )

    @admit_quarantine.validator
    def _validate_admit_quarantine(self, req: AdmitRequest) -> None:
        self._validate_admit(req)

    def _min_in_service(self, cluster_nodes: int) -> int:
        return floor_of(self._input.policy, cluster_nodes)

    # --- held critical drains ----------------------------------------------------------

    @workflow.update
    def admit_held_drain(self, req: AdmitRequest) -> Admission:
        """May this critical node, its quarantine held, be drained meanwhile (no new jobs,
        no requeue)? It leaves service as a quarantine would: only within the floor, unless
        the policy names `drain_held_critical` in `below_floor`."""
        return self._admit_held_drain(req)

    def _admit_held_drain(self, req: AdmitRequest) -> Admission:
        self._take_view(req)
        st = self._state
        if req.node in st.counted_out():
            # Drained already (this incident asking again, or the node is out): no cost.
            if req.node in st.held_drained:
                st.held_drained[req.node] = req.incident_id
            self._dequeue(req.incident_id, "held_drain")
            return Admission(admitted=True, reason="already out of service")
        why_not = self._held_drain_refusal(req.cluster_nodes)
        if why_not is None and not self._ahead(req.incident_id, "held_drain"):
            st.held_drained[req.node] = req.incident_id
            self._dequeue(req.incident_id, "held_drain")
            return Admission(admitted=True, reason=self._held_drain_grant(req.cluster_nodes))
        return self._hold(req, "held_drain", why_not)

    def _held_drain_refusal(self, cluster_nodes: int) -> str | None:
        """Why one more node may not be drained while held (None: it may)."""
        in_service = cluster_nodes - len(self._state.counted_out())
        floor = self._min_in_service(cluster_nodes)
        if in_service - 1 >= floor or "drain_held_critical" in self._input.policy.below_floor:
            return None
        where = "at" if in_service >= floor else "below"
        return (
            f"drain not allowed, the cluster is {where} its floor "
            f"({in_service} of {cluster_nodes} in service)"
        )

    def _held_drain_grant(self, cluster_nodes: int) -> str:
        """What an admitted held drain is told (counted: it is out of service now)."""
        in_service = cluster_nodes - len(self._state.counted_out())
        if in_service >= self._min_in_service(cluster_nodes):
            return f"within the floor ({in_service} of {cluster_nodes} in service)"
        return (
            f"below the floor ({in_service} of {cluster_nodes} in service): the policy "
            "allows it (guard.below_floor: drain_held_critical)"
        )

    @admit_held_drain.validator
    def _validate_admit_held_drain(self, req: AdmitRequest) -> None:
        self._validate_admit(req)

    # --- repair ----------------------------------------------------------------------

    @workflow.update
    def admit_repair(self, req: AdmitRequest) -> Admission:
        """May this node be repaired now? Not while the breaker is tripped or N repair."""
        return self._admit_repair(req)

    def _admit_repair(self, req: AdmitRequest) -> Admission:
        self._take_view(req)
        group = self._state.group_of(req.node)
        if group is not None:
            # The fault is the fabric's: no reboot or replacement while the systemic
            # incident is open. Not queued: the incident yields to it.
            self._dequeue(req.incident_id, "repair")
            m = group.membership
            return Admission(
                admitted=False,
                reason=f"{req.node} is a member of systemic incident {m.incident_id} "
                f"({m.level} {m.domain}): no repair while it is open",
                systemic=group.told(),
            )
        repairing = self._state.repairing
        if repairing.get(req.node) == req.incident_id:
            self._dequeue(req.incident_id, "repair")
            return Admission(admitted=True, reason="already repairing")
        why_not = self._repair_refusal(req.node)
        if why_not is None and not self._ahead(req.incident_id, "repair"):
            # A node repairing under another incident only changes hands: that incident ended.
            repairing[req.node] = req.incident_id
            self._dequeue(req.incident_id, "repair")
            return Admission(admitted=True)
        return self._hold(req, "repair", why_not)

    def _repair_refusal(self, node: str) -> str | None:
        repairing, breaker = self._state.repairing, self._state.breaker
        if breaker.tripped:
            return (
                f"circuit breaker tripped at {breaker.tripped_at:%Y-%m-%d %H:%M:%S} UTC "
                f"({len(breaker.nodes)} nodes: {', '.join(breaker.nodes)}); repairs are "
                "held until an approver resets it (`autoclusters breaker reset`)"
            )
        others = sorted(n for n in repairing if n != node)
        limit = self._input.policy.max_concurrent_repairs
        if len(others) >= limit:
            return (
                f"{len(others)} repairs already running ({', '.join(others)}), "
                f"the most allowed at once is {limit}"
            )
        return None

    # --- the queue -------------------------------------------------------------------

    def _take_view(self, req: AdmitRequest) -> None:
        self._state.cluster_nodes = req.cluster_nodes
        if req.out_of_service is not None:
            self._reconcile(
                SlurmView(cluster_nodes=req.cluster_nodes, out_of_service=req.out_of_service)
            )

    def _ahead(self, incident_id: str, kind: AdmissionKind) -> bool:
        """Does an earlier waiter of this kind come first? (Never overtaken.)"""
        for w in self._state.queue:
            if w.kind == kind:
                return w.incident_id != incident_id
        return False

    def _hold(self, req: AdmitRequest, kind: AdmissionKind, why_not: str | None) -> Admission:
        queue = self._state.queue
        mine = next((w for w in queue if w.kind == kind and w.incident_id == req.incident_id), None)
        if mine is None:
            mine = Waiter(
                kind=kind,
                node=req.node,
                incident_id=req.incident_id,
                workflow_id=req.workflow_id,
                ticket=self._state.next_ticket,
                since=workflow.now(),
            )
            self._state.next_ticket += 1
            queue.append(mine)
        elif req.workflow_id is not None:
            mine.workflow_id = req.workflow_id
        same = [w for w in queue if w.kind == kind]
        position = same.index(mine) + 1
        ahead = f"{position - 1} earlier incident(s) wait first" if position > 1 else ""
        reason = "; ".join(r for r in (why_not, ahead) if r)
        return Admission(
            admitted=False, reason=reason, queued=True, position=position, ticket=mine.ticket
        )

    def _dequeue(self, incident_id: str, kind: AdmissionKind | None = None) -> None:
        st = self._state
        st.queue = [
            w
            for w in st.queue
            if not (w.incident_id == incident_id and (kind is None or w.kind == kind))
        ]

    def _serve(self) -> None:
        """Admit waiters strictly in arrival order, per kind, while capacity allows."""
        st = self._state
        nodes = max(st.cluster_nodes, 1)
        # Quarantines first: one admitted makes its incident's held drain moot.
        for kind in ("quarantine", "held_drain", "repair"):
            for w in [w for w in st.queue if w.kind == kind]:
                if kind == "quarantine":
                    if w.node not in st.out_of_service:
                        if self._quarantine_refusal(w.node, nodes) is not None:
                            break
                    self._take_out(w.node, w.incident_id)
                elif kind == "held_drain":
                    if w.node not in st.counted_out():
                        if self._held_drain_refusal(nodes) is not None:
                            break
                        st.held_drained[w.node] = w.incident_id
                else:
                    if st.group_of(w.node) is not None:
                        continue  # a member of a systemic incident: told by its signal
                    if st.repairing.get(w.node) != w.incident_id:
                        if self._repair_refusal(w.node) is not None:
                            break
                        st.repairing[w.node] = w.incident_id
                st.queue.remove(w)
                if w.workflow_id is not None:
                    notice = AdmittedNotice(kind=w.kind, incident_id=w.incident_id, ticket=w.ticket)
                    st.notices.append(PendingNotice(workflow_id=w.workflow_id, notice=notice))

    @admit_repair.validator
    def _validate_admit_repair(self, req: AdmitRequest) -> None:
        self._validate_admit(req)

    @staticmethod
    def _validate_admit(req: AdmitRequest) -> None:
        _require(node=req.node, incident_id=req.incident_id)
        if req.cluster_nodes < 1:
            raise ValueError(f"cluster_nodes must be at least 1, not {req.cluster_nodes}")

    # --- release ---------------------------------------------------------------------

    @workflow.update
    def release(self, req: ReleaseRequest) -> None:
        """The incident is done with the node: it stops repairing; back in service, or
        left drained for a human (then it counts as out of service for as long as Slurm
        shows it so). `slot_only`: only the repair slot is given back.

        A release from an incident that no longer holds the node changes nothing.
        """
        self._release(req)

    def _release(self, req: ReleaseRequest) -> None:
        state = self._state
        if state.repairing.get(req.node) == req.incident_id:
            del state.repairing[req.node]
        if not req.slot_only and state.held_drained.get(req.node) == req.incident_id:
            # The incident ends with its node drained while held: back in service, or left
            # drained for a human (counted like any node left out, below).
            del state.held_drained[req.node]
            if not req.back_in_service:
                state.out_of_service.setdefault(req.node, req.incident_id)
        if req.back_in_service and state.out_of_service.get(req.node) == req.incident_id:
            del state.out_of_service[req.node]
        if req.slot_only:
            self._dequeue(req.incident_id, "repair")
        else:
            # The incident is done: out of the queues, and nothing left to tell it.
            self._dequeue(req.incident_id)
            state.notices = [n for n in state.notices if n.notice.incident_id != req.incident_id]
            if req.back_in_service:
                if state.left_out.get(req.node) == req.incident_id:
                    del state.left_out[req.node]
            elif state.out_of_service.get(req.node) == req.incident_id:
                state.left_out[req.node] = req.incident_id  # counted while Slurm shows it out
        self._serve()

    @release.validator
    def _validate_release(self, req: ReleaseRequest) -> None:
        _require(node=req.node, incident_id=req.incident_id)

    # --- many calls at once -------------------------------------------------------------

    @workflow.update
    def batch(self, batch: GuardBatch) -> list[GuardAnswer]:
        """Several incidents' calls, answered in order as their own updates would be
        (core/guard_batch.py). A malformed call is refused alone: the others still count."""
        return [self._answer(call) for call in batch.calls]

    def _answer(self, call: GuardCall) -> GuardAnswer:
        try:
            if call.opened is not None:
                self._validate_register(call.opened)
                return GuardAnswer(registration=self._register(call.opened))
            if call.release is not None:
                self._validate_release(call.release)
                self._release(call.release)
                return GuardAnswer()
            assert call.admit is not None  # GuardCall holds exactly its update's argument
            self._validate_admit(call.admit)
            admit = {
                "admit_quarantine": self._admit_quarantine,
                "admit_held_drain": self._admit_held_drain,
            }.get(call.update, self._admit_repair)
            return GuardAnswer(admission=admit(call.admit))
        except ValueError as e:
            return GuardAnswer(refused=str(e))

    # --- reset -----------------------------------------------------------------------

    @workflow.update
    def claim_spare(self, req: SpareRequest) -> SpareClaim:
        """A free hot spare for this incident's replacement (the same one if asked again)."""
        st = self._state
        if req.incident_id in st.spare_claims:
            return SpareClaim(spare=st.spare_claims[req.incident_id])
        free = self._free_spares()
        spare = next((n for n in free if n != req.node), None)
        if spare is not None:
            free.remove(spare)
            st.spare_claims[req.incident_id] = spare
        return SpareClaim(spare=spare)

    @claim_spare.validator
    def _validate_claim_spare(self, req: SpareRequest) -> None:
        _require(node=req.node, incident_id=req.incident_id)

    @workflow.update
    def refill_spare(self, req: SpareRequest) -> list[str]:
        """The replaced node, healthy again, is a spare now; returns the free spares."""
        free = self._free_spares()
        if req.node not in free:
            free.append(req.node)
        return list(free)

    @refill_spare.validator
    def _validate_refill_spare(self, req: SpareRequest) -> None:
        _require(node=req.node, incident_id=req.incident_id)

    def _free_spares(self) -> list[str]:
        if self._state.spares is None:
            self._state.spares = list(self._input.policy.spares)
        return self._state.spares

    @workflow.update
    async def reset_breaker(self, req: ResetRequest) -> BreakerStatus:
        """A human resets the tripped breaker; its window starts afresh from now. The
        worker checks first that the API vouched for this person resetting this trip
        (activities/decisions.py); a proof that does not hold fails the update (the
        failure is in the history) and the breaker stays as it is."""
        # Runs started before proofs reset on the name alone; their replays must issue no
        # check (docs/versioning.md).
        if workflow.patched(RESET_PROOF_PATCH):
            tripped_at = self._state.breaker.tripped_at
            assert tripped_at is not None  # the validator: it is tripped
            verdict = await workflow.execute_local_activity(
                contracts.check_decision_proof,
                ProofCheck(
                    proof=req.proof,
                    subject=reset_subject(self._input.cluster, tripped_at),
                    step=BREAKER_RESET_STEP,
                    approver=req.by.strip(),
                    approve=True,
                ),
                start_to_close_timeout=timedelta(seconds=10),
            )
            if not verdict.ok:
                workflow.logger.warning(
                    "breaker reset by %s refused: %s", req.by.strip(), verdict.reason
                )
                raise ApplicationError(
                    f"reset refused: {verdict.reason}", type="DecisionRefused", non_retryable=True
                )
            # Again: another reset, or a newer policy's approvers, may have come meanwhile;
            # the proof is for the trip it was checked against, no later one.
            self._check_reset(req)
            if self._state.breaker.tripped_at != tripped_at:
                raise ApplicationError(
                    "reset refused: the breaker tripped again while the proof was checked",
                    type="DecisionRefused",
                    non_retryable=True,
                )
        breaker, now = self._state.breaker, workflow.now()
        breaker.tripped = False
        breaker.reset_by, breaker.reset_at = req.by.strip(), now
        for o in self._state.opens:
            o.counts_for_breaker = False
        workflow.logger.info("circuit breaker of %s reset by %s", self._input.cluster, req.by)
        self._serve()
        return breaker

    @reset_breaker.validator
    def _validate_reset_breaker(self, req: ResetRequest) -> None:
        """A reset is an approval: only the policy's approvers may (it is in the history),
        with the API's proof of who they are (reset through the API: `autoclusters breaker
        reset`, `POST /v1/breaker/reset`)."""
        self._check_reset(req)
        if not req.proof:
            raise ApplicationError(
                "no proof of who resets: reset through the API (`autoclusters breaker reset` "
                "with your operator token); the breaker stays as it is",
                type="NoProof",
            )

    def _check_reset(self, req: ResetRequest) -> None:
        _require(by=req.by)
        if req.by.strip() not in self._input.approvers:
            raise ApplicationError(
                f"{req.by.strip()} is not an approver of cluster {self._input.cluster}; "
                "the breaker stays as it is",
                type="NotAnApprover",
            )
        if not self._state.breaker.tripped:
            raise ApplicationError(
                f"the circuit breaker of {self._input.cluster} is not tripped",
                type="BreakerNotTripped",
            )

    # --- housekeeping ----------------------------------------------------------------

    def _prune(self, now: datetime) -> None:
        keep_s = max(self._input.policy.breaker_window_s, self._state.recurrence_window_s)
        since = now - timedelta(seconds=keep_s)
        self._state.opens = [o for o in self._state.opens if o.at > since]
