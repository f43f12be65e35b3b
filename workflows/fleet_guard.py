"""FleetGuard: one long-running workflow per cluster that admits quarantines and repairs.

A flood of alerts must never drain the cluster. Every incident registers its open here and
asks before it takes a node out of service (quarantine) and before it repairs it:

- quarantine: never fewer than `min_in_service_fraction` of the nodes in service;
- repair: at most `max_concurrent_repairs` at once, and none while the circuit breaker is
  tripped. The breaker trips when more than `breaker_threshold` distinct incidents open
  within the sliding `breaker_window_s` (a switch, power, a driver rollout — not N
  independent GPU failures) and stays tripped until a human resets it. Quarantine is not
  held by the breaker: a faulty node still leaves service.

Every handler is synchronous, so each runs whole within one workflow task and they never
interleave. Admissions are answers (`Admission.admitted`), not errors; validators reject
malformed requests before they reach the history.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from autoclusters.core.guard import (
        Admission,
        AdmitRequest,
        BreakerStatus,
        GuardInput,
        GuardState,
        GuardStatus,
        IncidentOpened,
        OpenRecord,
        Registration,
        ReleaseRequest,
        ResetRequest,
        SpareClaim,
        SpareRequest,
    )


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

    @workflow.run
    async def run(self, inp: GuardInput) -> None:
        await workflow.wait_condition(self._should_continue_as_new)
        # Every handler is synchronous, but wait anyway: an update must never be left
        # unanswered by the run that accepted it.
        await workflow.wait_condition(workflow.all_handlers_finished)
        self._prune(workflow.now())
        self._state.continued_as_new += 1
        workflow.continue_as_new(self._input.model_copy(update={"state": self._state}))

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
            cluster=self._input.cluster, policy=self._input.policy, state=self._state
        )

    # --- register --------------------------------------------------------------------

    @workflow.update
    def register(self, req: IncidentOpened) -> Registration:
        """Record an incident's open; say how often the node failed lately; maybe trip."""
        state, now = self._state, workflow.now()
        self._prune(now)
        known = next((o for o in state.opens if o.incident_id == req.incident_id), None)
        if known is not None:  # a retried registration: same answer, nothing new
            return Registration(recent_on_node=known.recent_on_node, breaker=state.breaker)

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
            )
        )
        self._check_breaker(req.node, now)
        return Registration(recent_on_node=recent, breaker=state.breaker)

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
        if len({o.incident_id for o in burst}) <= policy.breaker_threshold:
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
        out = self._state.out_of_service
        held = out.get(req.node)
        if held is not None:
            # Already out: taking it out again costs no capacity.
            out[req.node] = req.incident_id
            why = "already out of service" + ("" if held == req.incident_id else f" ({held})")
            return Admission(admitted=True, reason=why)
        floor = self._min_in_service(req.cluster_nodes)
        in_service_after = req.cluster_nodes - len(out) - 1
        if in_service_after < floor:
            return Admission(
                admitted=False,
                reason=(
                    f"{len(out)} of {req.cluster_nodes} nodes already out of service "
                    f"({', '.join(sorted(out))}); taking {req.node} out would leave "
                    f"{in_service_after} in service, below the minimum {floor} "
                    f"({self._input.policy.min_in_service_fraction:.0%})"
                ),
            )
        out[req.node] = req.incident_id
        return Admission(admitted=True)

    @admit_quarantine.validator
    def _validate_admit_quarantine(self, req: AdmitRequest) -> None:
        self._validate_admit(req)

    def _min_in_service(self, cluster_nodes: int) -> int:
        # The tolerance keeps e.g. 0.7 * 10 = 7.000000000000001 from asking for 8.
        return math.ceil(self._input.policy.min_in_service_fraction * cluster_nodes - 1e-9)

    # --- repair ----------------------------------------------------------------------

    @workflow.update
    def admit_repair(self, req: AdmitRequest) -> Admission:
        """May this node be repaired now? Not while the breaker is tripped or N repair."""
        repairing = self._state.repairing
        if repairing.get(req.node) == req.incident_id:
            return Admission(admitted=True, reason="already repairing")
        breaker = self._state.breaker
        if breaker.tripped:
            return Admission(
                admitted=False,
                reason=(
                    f"circuit breaker tripped at {breaker.tripped_at:%Y-%m-%d %H:%M:%S} UTC "
                    f"({len(breaker.nodes)} nodes: {', '.join(breaker.nodes)}); repairs are "
                    "held until a human resets it (`autoclusters breaker reset`)"
                ),
            )
        others = sorted(n for n in repairing if n != req.node)
        limit = self._input.policy.max_concurrent_repairs
        if len(others) >= limit:
            return Admission(
                admitted=False,
                reason=f"{len(others)} repairs already running ({', '.join(others)}), "
                f"the most allowed at once is {limit}",
            )
        # A node repairing under another incident only changes hands: that incident ended.
        repairing[req.node] = req.incident_id
        return Admission(admitted=True)

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
        left drained for a human (then it stays out of service and keeps counting).

        A release from an incident that no longer holds the node changes nothing.
        """
        state = self._state
        if state.repairing.get(req.node) == req.incident_id:
            del state.repairing[req.node]
        if req.back_in_service and state.out_of_service.get(req.node) == req.incident_id:
            del state.out_of_service[req.node]

    @release.validator
    def _validate_release(self, req: ReleaseRequest) -> None:
        _require(node=req.node, incident_id=req.incident_id)

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
    def reset_breaker(self, req: ResetRequest) -> BreakerStatus:
        """A human resets the tripped breaker; its window starts afresh from now."""
        breaker, now = self._state.breaker, workflow.now()
        breaker.tripped = False
        breaker.reset_by, breaker.reset_at = req.by.strip(), now
        for o in self._state.opens:
            o.counts_for_breaker = False
        workflow.logger.info("circuit breaker of %s reset by %s", self._input.cluster, req.by)
        return breaker

    @reset_breaker.validator
    def _validate_reset_breaker(self, req: ResetRequest) -> None:
        _require(by=req.by)
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
