"""What the fleet guard (one workflow per cluster) is asked and answers.

The guard admits quarantines and repairs so that a flood of alerts never drains the
cluster: at most N repairs at once, never fewer than a minimum fraction of nodes in
service (the floor: quarantines and held critical drains count against it alike), and a
circuit breaker that holds every repair when too many incidents open at once (a switch,
power, a driver rollout — not N independent GPU failures).
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from autoclusters.core.policy import GuardPolicy, NodeTopology, TopologyLevel
from autoclusters.core.systemic_member import Membership

# The fleet guard's workflow type, as activities and clients name it.
GUARD_WORKFLOW = "FleetGuard"


# The signal the guard sends an incident it admitted from its queue.
GUARD_ADMITTED_SIGNAL = "guard_admitted"


def guard_workflow_id(cluster: str) -> str:
    return f"fleet-guard-{cluster}"


# A breaker reset is a person's decision (core/decision_proof.py): its proof names this step
# and `reset_subject`, the guard and the trip it resets, so a proof resets that trip of that
# cluster's breaker and no later one.
BREAKER_RESET_STEP = "breaker_reset"


def reset_subject(cluster: str, tripped_at: datetime) -> str:
    return f"{guard_workflow_id(cluster)}/trip-{round(tripped_at.timestamp() * 1000)}"


class GuardInput(BaseModel):
    cluster: str
    policy: GuardPolicy = Field(default_factory=GuardPolicy)
    topology: dict[str, NodeTopology] = Field(default_factory=dict)
    # Carried across continue-as-new.
    state: GuardState | None = None
    # Also continue as new once the history has this many events (None: only when the
    # server suggests it). Small values exercise continue-as-new in tests.
    max_history_events: int | None = Field(default=None, ge=1)
    # Who may reset the breaker (the policy's approvers, learnt from registrations).
    approvers: list[str] = Field(default_factory=list)


class OpenRecord(BaseModel):
    node: str
    incident_id: str
    fault: str
    at: datetime
    # What `register` answered for it, so a re-registration answers the same.
    recent_on_node: int = 0
    # False once a human reset the breaker after it opened: the sliding window restarts
    # from the reset, so the burst that tripped it does not trip it again at once.
    counts_for_breaker: bool = True
    # The incident's workflow, told when it becomes a member of a systemic incident (None:
    # an incident registered before systemic incidents: never told).
    workflow_id: str | None = None
    # Counted in a systemic incident already: never again in another.
    grouped: bool = False


class SystemicGroup(BaseModel):
    """An open systemic incident (policy guard.systemic): its members, node -> the
    member's incident id and workflow id."""

    membership: Membership
    members: dict[str, str] = Field(default_factory=dict)
    workflows: dict[str, str] = Field(default_factory=dict)

    def told(self) -> Membership:
        return self.membership.model_copy(update={"nodes": sorted(self.members)})


class SystemicNotice(BaseModel):
    """A member to tell that it belongs to a systemic incident (the `systemic_member`
    signal, sent from the guard's run loop)."""

    workflow_id: str
    membership: Membership


class BreakerStatus(BaseModel):
    tripped: bool = False
    # The last trip; kept after a reset (then `tripped` is False) as a record of it.
    tripped_at: datetime | None = None
    # The nodes whose incidents tripped it, and those that opened while it stayed tripped.
    nodes: list[str] = Field(default_factory=list)
    shared_leaf: str | None = None  # all of them behind one InfiniBand leaf?
    shared_pod: str | None = None
    reset_by: str | None = None
    reset_at: datetime | None = None


# `held_drain`: a critical node drained (no requeue) while its quarantine is held.
AdmissionKind = Literal["quarantine", "repair", "held_drain"]


class Waiter(BaseModel):
    """An incident waiting in the guard's queue for a quarantine or a repair."""

    kind: AdmissionKind
    node: str
    incident_id: str
    workflow_id: str | None  # where the admission is signalled (None: it asks again)
    ticket: int
    since: datetime


class AdmittedNotice(BaseModel):
    """What the guard tells a waiting incident (the `guard_admitted` signal)."""

    kind: AdmissionKind
    incident_id: str
    ticket: int


class PendingNotice(BaseModel):
    workflow_id: str
    notice: AdmittedNotice


class SlurmView(BaseModel):
    """What Slurm shows now: the cluster's size and the nodes not in service (drained,
    down or not responding). The guard reconciles its count on it."""

    cluster_nodes: int = Field(ge=0)
    out_of_service: list[str] = Field(default_factory=list)


class GuardState(BaseModel):
    # The hot spares free now (None: not yet taken from the policy).
    spares: list[str] | None = None
    spare_claims: dict[str, str] = Field(default_factory=dict)  # incident id -> spare taken
    opens: list[OpenRecord] = Field(default_factory=list)  # pruned to the longest window
    out_of_service: dict[str, str] = Field(default_factory=dict)  # node -> incident id
    # Nodes drained while their quarantine is held (node -> incident id): out of service
    # too, counted against the floor, until the quarantine is admitted or the incident ends.
    held_drained: dict[str, str] = Field(default_factory=dict)
    repairing: dict[str, str] = Field(default_factory=dict)  # node -> incident id
    breaker: BreakerStatus = Field(default_factory=BreakerStatus)
    # The longest recurrence window asked about so far: opens are kept this long (or the
    # breaker window, if longer) so recurrence counts stay right.
    recurrence_window_s: float = 0
    continued_as_new: int = 0  # how many runs this state has been carried across
    # First come, first served: incidents waiting for a quarantine or a repair, in
    # arrival order; and the admissions not yet told to their incidents.
    queue: list[Waiter] = Field(default_factory=list)
    notices: list[PendingNotice] = Field(default_factory=list)
    next_ticket: int = 1
    # Nodes released "not back in service" (left drained for a human): node -> incident.
    # They count as out of service only while Slurm still shows them so.
    left_out: dict[str, str] = Field(default_factory=dict)
    cluster_nodes: int = 0  # the cluster's size, as Slurm last showed it (0: not yet known)
    reconciled_at: datetime | None = None
    # Open systemic incidents, and the members not told yet (policy guard.systemic).
    systemic: list[SystemicGroup] = Field(default_factory=list)
    systemic_notices: list[SystemicNotice] = Field(default_factory=list)

    def group_of(self, node: str) -> SystemicGroup | None:
        return next((g for g in self.systemic if node in g.members), None)

    def group(self, level: TopologyLevel, domain: str) -> SystemicGroup | None:
        return next(
            (
                g
                for g in self.systemic
                if (g.membership.level, g.membership.domain) == (level, domain)
            ),
            None,
        )

    def counted_out(self) -> set[str]:
        """The nodes the floor counts out of service: quarantined, left out, held drained."""
        return {*self.out_of_service, *self.held_drained}


def floor_of(policy: GuardPolicy, cluster_nodes: int) -> int:
    """The fewest nodes in service the guard allows (min_in_service_fraction of them)."""
    # The tolerance keeps e.g. 0.7 * 10 = 7.000000000000001 from asking for 8.
    return math.ceil(policy.min_in_service_fraction * cluster_nodes - 1e-9)


class IncidentOpened(BaseModel):
    node: str
    incident_id: str
    fault: str
    recurrence_window_s: float = 86400
    # The incident's guard policy, topology and approvers: the guard adopts the newest.
    policy: GuardPolicy | None = None
    topology: dict[str, NodeTopology] | None = None
    approvers: list[str] | None = None
    slurm: SlurmView | None = None  # Slurm's view when it registered
    # The incident's workflow id: told if it becomes a member of a systemic incident.
    workflow_id: str | None = None


class Registration(BaseModel):
    recent_on_node: int  # earlier incidents on this node within the recurrence window
    breaker: BreakerStatus
    # The systemic incident the node's fault belongs to (policy guard.systemic), if any.
    systemic: Membership | None = None


class AdmitRequest(BaseModel):
    node: str
    incident_id: str
    cluster_nodes: int  # nodes in the cluster now (from Slurm), for the in-service fraction
    # The asking incident's workflow id: held, it is queued and told by a signal when
    # admitted. None (incidents started before the queue): it asks again later.
    workflow_id: str | None = None
    out_of_service: list[str] | None = None  # Slurm's view: the nodes not in service now


class Admission(BaseModel):
    admitted: bool
    reason: str = ""
    queued: bool = False  # held and queued: a `guard_admitted` signal will follow
    position: int | None = None  # 1: next in line for this kind of admission
    ticket: int | None = None  # the queue ticket the signal will carry
    # A repair refused because the node is a member of an open systemic incident: the
    # incident yields to it (not queued).
    systemic: Membership | None = None


class ReleaseRequest(BaseModel):
    node: str
    incident_id: str
    back_in_service: bool  # False: the node stays out (left drained for a human)
    # True: only the repair slot is given back, the incident still holds the node.
    slot_only: bool = False


class CloseSystemic(BaseModel):
    """A systemic incident is over: its members repair (or not) on their own again."""

    incident_id: str


class SpareRequest(BaseModel):
    node: str  # the faulty node being replaced
    incident_id: str


class SpareClaim(BaseModel):
    spare: str | None  # the spare this incident put into service, or None: none free


class SpareCall(BaseModel):
    guard: GuardContext
    request: SpareRequest


class ResetRequest(BaseModel):
    by: str
    # Who resets, proven: the API's signed proof for this guard's trip and this person
    # (core/decision_proof.py). The guard refuses a reset without a valid one.
    proof: str = ""


class PolicyUpdate(BaseModel):
    """A newer guard policy (and topology, approvers) for the running guard."""

    policy: GuardPolicy
    topology: dict[str, NodeTopology] | None = None
    approvers: list[str] | None = None


class GuardStatus(BaseModel):
    cluster: str
    policy: GuardPolicy
    state: GuardState
    approvers: list[str] = Field(default_factory=list)


# --- what the guard activities take: the call, and the guard to send it to ----------------


class GuardContext(BaseModel):
    """Which cluster's guard, and what it starts with if it is not running yet.

    A guard already running adopts them from each new registration.
    """

    cluster: str
    policy: GuardPolicy = Field(default_factory=GuardPolicy)
    topology: dict[str, NodeTopology] = Field(default_factory=dict)
    approvers: list[str] = Field(default_factory=list)

    def guard_input(self) -> GuardInput:
        return GuardInput(
            cluster=self.cluster,
            policy=self.policy,
            topology=self.topology,
            approvers=self.approvers,
        )


class RegisterCall(BaseModel):
    guard: GuardContext
    incident: IncidentOpened


class AdmitCall(BaseModel):
    guard: GuardContext
    node: str
    incident_id: str
    workflow_id: str | None = None  # the incident's, to be told when admitted


class SlurmViewCall(BaseModel):
    cluster: str


class ReleaseCall(BaseModel):
    guard: GuardContext
    release: ReleaseRequest


GuardInput.model_rebuild()
