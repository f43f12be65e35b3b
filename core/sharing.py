"""Sharing GPU nodes between Slurm training and Kubernetes inference: pools, the policy, the
demand figures and the decision the sharing workflow takes from them.

A node is in exactly one pool at a time. `training`: a Slurm node that takes jobs (and a
Kubernetes node tainted so inference pods never land there). `inference`: a Kubernetes node
that takes inference pods, drained in Slurm with `LENT_REASON`. `moving`: between the two,
owned by the sharing workflow's current move. Slinky's slurm-bridge states the rule this keeps: a
node runs Slurm user work or Kubernetes user work, never both at once.

`decide` is pure (no clock, no I/O) so the workflow, the tests and `bench/sharing.py` take the
same decision from the same figures.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from autoclusters.core.models import REASON_PREFIX
from autoclusters.core.yaml_spec import SpecError, SpecFormat, load_yaml_model

# Kubernetes: the pool a node is in, as a label, and on training nodes a NoSchedule taint
# with the same key, so inference pods (which select the label and do not tolerate the
# taint) land only on lent nodes.
POOL_LABEL = "autoclusters.io/pool"
POOL_TAINT_KEY = "autoclusters.io/pool"
# Slurm: a lent node is drained under this reason; the runbook's return-to-service never
# undrains it (it is not an incident's reason) and a move's drain names the move.
LENT_REASON = f"{REASON_PREFIX} lent to inference"
# Keeps the feature's old name: nodes drained mid-move carry it in Slurm, and a retried
# drain or the runbook must still recognise them after an upgrade.
MOVE_REASON_PREFIX = f"{REASON_PREFIX} gpu-rebalance"
# The inference Deployment's pods carry this label; the sandbox's gateway routes to them.
INFERENCE_APP_LABEL = "app.kubernetes.io/name"
INFERENCE_APP = "autoclusters-inference"
# Kubernetes' own hint for which pod a scale-down removes first (ReplicaSet controller).
POD_DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"

# The GPU sharing workflow (`GpuSharing`) is registered, started and found under the
# feature's old name, "rebalance": recorded histories (tests/histories) and the workflows
# running now carry this type name, the id finds the running one per cluster, and Slack
# messages already sent carry the fault in their buttons. Renaming any of them would orphan
# what runs, so they stay.
SHARING_WORKFLOW = "GpuRebalance"
SHARING_ID_PREFIX = "gpu-rebalance-"
# The sharing workflow's notifications carry this fault; a move's Approve / Reject buttons
# carry this step (never a remediation rung), so a click is routed to the sharing workflow,
# not to an incident.
SHARING_FAULT = "gpu-rebalance"
MOVE_APPROVAL_STEP = "move"


def sharing_workflow_id(cluster: str) -> str:
    """One sharing workflow per cluster."""
    return f"{SHARING_ID_PREFIX}{cluster}"


def move_subject(cluster: str, move_id: str) -> str:
    """What a proof of a person's decision on a move names (core/decision_proof.py, with
    the step MOVE_APPROVAL_STEP): that move of that cluster's sharing workflow, nothing else."""
    return f"{sharing_workflow_id(cluster)}/{move_id}"


def move_reason(move_id: str) -> str:
    """The drain reason while a node moves to inference: the move's own, so a retried drain
    recognises itself and the runbook knows whose node it is."""
    return f"{MOVE_REASON_PREFIX} {move_id}"


def is_sharing_reason(reason: str) -> bool:
    """A drain written by the sharing workflow (a move under way, or a node lent)."""
    return reason == LENT_REASON or reason.startswith(MOVE_REASON_PREFIX)


class Pool(StrEnum):
    TRAINING = "training"
    INFERENCE = "inference"
    MOVING = "moving"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class InferenceTarget(_Strict):
    """Where inference runs in Kubernetes and how its demand is read from Prometheus."""

    namespace: str = Field(default="inference", min_length=1, max_length=63)
    deployment: str = Field(default="inference", min_length=1, max_length=253)
    # A PromQL expression whose value is compared with `slo`: above it the SLO is breached.
    # The default is the p95 request latency (seconds) the serving gateway measures.
    demand_query: str = Field(
        default=(
            "histogram_quantile(0.95, sum by (le) "
            "(rate(inference_request_duration_seconds_bucket[30s])))"
        ),
        min_length=1,
        max_length=2000,
    )
    slo: float = Field(default=0.5, gt=0, allow_inf_nan=False)
    # Requests per second the deployment serves (for the record and the benchmark).
    rate_query: str = Field(
        default="sum(rate(inference_requests_total[30s]))", min_length=1, max_length=2000
    )


class SharePolicy(_Strict):
    """What the operator allows the sharing workflow to do."""

    enabled: bool = True
    inference: InferenceTarget = Field(default_factory=InferenceTarget)
    min_training_nodes: int = Field(default=1, ge=0, le=100_000)
    max_inference_nodes: int = Field(default=1, ge=0, le=100_000)
    # Inference keeps at least this many nodes however calm its demand (0: it may scale to
    # none and the first request waits for a lend).
    min_inference_nodes: int = Field(default=0, ge=0, le=100_000)
    # Hysteresis: lend when demand > slo * lend_above; return when demand < slo * return_below
    # (a value between the two changes nothing). Each must hold for `sustain` evaluations.
    lend_above: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    # 0.5: a latency demand never falls below an idle replica's own latency, so a low
    # threshold would never return a node.
    return_below: float = Field(default=0.5, ge=0, allow_inf_nan=False)
    sustain: int = Field(default=2, ge=1, le=1000)
    # No move starts within this many seconds of the previous move's end.
    cooldown_s: float = Field(default=60, ge=0, le=86_400, allow_inf_nan=False)
    evaluate_every_s: float = Field(default=15, gt=0, le=3600, allow_inf_nan=False)
    # A move waits for a human (Slack / CLI), as the runbook's approvals do.
    needs_approval: bool = False
    approval_timeout_s: float = Field(default=900, gt=0, le=86_400, allow_inf_nan=False)
    # A lent node's Slurm job: ask it to checkpoint (its checkpoint signal) and requeue, then
    # wait this long for the node to go idle before requeueing what still runs.
    checkpoint_signal: str = Field(default="USR1", pattern=r"^[A-Z0-9]{2,8}$")
    checkpoint_grace_s: float = Field(default=120, gt=0, le=3600, allow_inf_nan=False)
    # A node back from inference: requeue running jobs narrower than they asked for, so they
    # restart at full width from their checkpoint (a restart each).
    regrow_training_jobs: bool = True
    ready_timeout_s: float = Field(default=600, gt=0, le=7200, allow_inf_nan=False)
    # Borrowed from inference: a training node an incident drained, no spare free, and
    # inference calm enough to spare a node: lend one of its nodes to training for the
    # repair, given back when the repaired node returns (core/sharing_borrow.py).
    borrow_from_inference: bool = False
    # The share of the SLO inference must leave free to lend a node: its demand figure
    # at most slo * (1 - borrow_headroom), measured with that node still serving.
    borrow_headroom: float = Field(default=0.5, gt=0, lt=1, allow_inf_nan=False)
    # A borrow that outlasts this (a repair that never ends, a node replaced) is given back.
    borrow_max_s: float = Field(default=14_400, gt=0, le=7 * 86_400, allow_inf_nan=False)

    @model_validator(mode="after")
    def _hysteresis(self) -> SharePolicy:
        if self.borrow_from_inference and 1 - self.borrow_headroom >= self.lend_above:
            raise ValueError(
                f"borrow_headroom ({self.borrow_headroom}) leaves inference at or above "
                f"lend_above ({self.lend_above}) x SLO: a borrow would be given back at once"
            )
        if self.return_below >= self.lend_above:
            raise ValueError(
                f"return_below ({self.return_below}) must be below lend_above "
                f"({self.lend_above}): otherwise one value both lends and returns"
            )
        if self.min_inference_nodes > self.max_inference_nodes:
            raise ValueError(
                f"min_inference_nodes ({self.min_inference_nodes}) exceeds "
                f"max_inference_nodes ({self.max_inference_nodes})"
            )
        return self


class NodeShare(BaseModel):
    """One GPU node as the sharing workflow sees it."""

    name: str
    pool: Pool
    gpus: int = 0
    # Slurm: jobs running on it, and when the newest of them last checkpointed (epoch s;
    # None: unknown). Kubernetes: inference pods on it.
    jobs: list[int] = Field(default_factory=list)
    last_checkpoint_at: float | None = None
    pods: int = 0
    in_incident: bool = False  # a remediation incident owns it now
    # The incident, from its Slurm drain reason (None: down without one, or not read).
    incident_id: str | None = None
    incident_fault: str | None = None


class Demand(BaseModel):
    """The figures one evaluation saw, kept in the history with the move they justified."""

    at: float  # epoch seconds
    inference_value: float | None  # the demand query's value (None: no data)
    slo: float
    inference_rps: float | None = None
    ready_replicas: int = 0
    training_pending_gpus: int = 0  # GPUs asked for by pending jobs
    training_running_gpus: int = 0  # GPUs held by running jobs
    nodes: list[NodeShare] = Field(default_factory=list)
    # Hot spares drained and waiting (the fleet guard's), and the jobs waiting to start.
    # None: not read (an older worker): a borrow never starts on an unknown.
    spares_free: int | None = None
    pending_jobs: list[int] | None = None

    def in_pool(self, pool: Pool) -> list[NodeShare]:
        return [n for n in self.nodes if n.pool == pool]


Direction = Literal["inference", "training"]


# Who asked for a move GPU sharing decided on itself (a person's move names the person).
# Moves recorded before the feature had one name say "rebalancer".
BY_SHARING = "GPU sharing"


class Move(BaseModel):
    """One node from one pool to the other, and why."""

    move_id: str
    node: str
    to: Direction
    reason: str
    requested_by: str = BY_SHARING  # or the person who asked (`share move`)
    demand: Demand | None = None


class Verdict(BaseModel):
    """The decision of one evaluation: a move, or why none."""

    to: Direction | None
    node: str | None = None
    why: str
    breach_streak: int = 0
    calm_streak: int = 0


def pick_to_lend(candidates: list[NodeShare]) -> NodeShare | None:
    """The training node whose loss costs least: idle first, then the one whose job
    checkpointed most recently (least work lost), never one in an incident."""
    ok = [n for n in candidates if n.pool == Pool.TRAINING and not n.in_incident]
    if not ok:
        return None
    idle = sorted((n for n in ok if not n.jobs), key=lambda n: n.name)
    if idle:
        return idle[0]
    return min(ok, key=lambda n: (-(n.last_checkpoint_at or 0.0), n.name))


def pick_to_return(candidates: list[NodeShare]) -> NodeShare | None:
    """The lent node to give back: one in an incident is the runbook's, otherwise the one
    serving least (fewest pods), by name for a stable choice."""
    ok = [n for n in candidates if n.pool == Pool.INFERENCE and not n.in_incident]
    return min(ok, key=lambda n: (n.pods, n.name)) if ok else None


def decide(
    demand: Demand,
    policy: SharePolicy,
    *,
    breach_streak: int,
    calm_streak: int,
    seconds_since_last_move: float | None,
    lend_rps: float | None = None,
) -> Verdict:
    """Lend, return, or hold, from one evaluation's figures and the streaks before it.

    Hysteresis: a value above `slo * lend_above` counts towards lending, below
    `slo * return_below` towards returning; `sustain` in a row are needed, and no move
    starts within `cooldown_s` of the last. The minimum training nodes and the maximum
    inference nodes are never crossed, whatever the demand.

    A return also waits for the request rate to fall below `return_below` times
    `lend_rps`, the rate that needed the last lend: with the lent node serving, the latency
    looks calm while that load is still there, and giving the node back breaches again (a
    lend, a return and a lend within a minute in the share demo).
    """
    value = demand.inference_value
    if value is None:
        # No data is not calm: a broken query must not hand every node back.
        return Verdict(to=None, why="no inference demand figure", breach_streak=0, calm_streak=0)
    breached = value > policy.inference.slo * policy.lend_above
    calm = value < policy.inference.slo * policy.return_below
    breach = breach_streak + 1 if breached else 0
    calm_n = calm_streak + 1 if calm else 0

    def hold(why: str) -> Verdict:
        return Verdict(to=None, why=why, breach_streak=breach, calm_streak=calm_n)

    if not breached and not calm:
        return hold(f"demand {value:.3g} within the band around the SLO {policy.inference.slo:g}")
    if not policy.enabled:
        return hold("sharing is disabled by policy")
    if (
        seconds_since_last_move is not None
        and seconds_since_last_move < policy.cooldown_s
        and (breach >= policy.sustain or calm_n >= policy.sustain)
    ):
        return hold(f"cooldown: last move {seconds_since_last_move:.0f}s ago")
    training = demand.in_pool(Pool.TRAINING)
    inference = demand.in_pool(Pool.INFERENCE)
    if breached:
        if breach < policy.sustain:
            return hold(f"SLO breached {breach}/{policy.sustain} evaluations")
        if len(inference) >= policy.max_inference_nodes:
            return hold(f"at the maximum of {policy.max_inference_nodes} inference nodes")
        # A node in an incident runs no training: it does not count towards the minimum.
        if len([n for n in training if not n.in_incident]) <= policy.min_training_nodes:
            return hold(f"at the minimum of {policy.min_training_nodes} training nodes")
        node = pick_to_lend(training)
        if node is None:
            return hold("no training node may be lent (all in incidents)")
        return Verdict(
            to="inference",
            node=node.name,
            why=f"demand {value:.3g} > SLO {policy.inference.slo:g} for {breach} evaluations",
            breach_streak=0,
            calm_streak=0,
        )
    if calm_n < policy.sustain:
        return hold(f"demand calm {calm_n}/{policy.sustain} evaluations")
    rps = demand.inference_rps
    if lend_rps is not None and rps is not None and rps > lend_rps * policy.return_below:
        return hold(
            f"request rate {rps:.3g}/s still above {policy.return_below:g} x the "
            f"{lend_rps:.3g}/s that needed the last lend"
        )
    if len(inference) <= policy.min_inference_nodes:
        return hold(f"at the minimum of {policy.min_inference_nodes} inference nodes")
    node = pick_to_return(inference)
    if node is None:
        return hold("no lent node to return")
    return Verdict(
        to="training",
        node=node.name,
        why=f"demand {value:.3g} < {policy.return_below:g} x SLO for {calm_n} evaluations",
        breach_streak=0,
        calm_streak=0,
    )


# --- activity inputs and results ----------------------------------------------------------


class DemandCall(BaseModel):
    cluster: str
    policy: SharePolicy
    prometheus_url: str | None = None  # None: the worker's own setting
    # Nodes the sharing workflow knows and the pool it holds them in (it is the owner of that
    # fact); nodes it has not seen yet are read from Kubernetes labels and Slurm reasons.
    pools: dict[str, Pool] = Field(default_factory=dict)


class MoveCall(BaseModel):
    """One step of one move on one node."""

    cluster: str
    node: str
    move_id: str
    policy: SharePolicy
    replicas: int = 0  # the inference Deployment's replicas this step sets (scale steps)
    # Jobs a lend narrowed (job id -> nodes it ran on before): a return regrows them.
    regrow: dict[int, int] = Field(default_factory=dict)


class CheckpointResult(BaseModel):
    signalled: list[int] = Field(default_factory=list)  # asked to checkpoint and requeue
    requeued: list[int] = Field(default_factory=list)  # requeued by us after the grace
    holds_released: list[int] = Field(default_factory=list)
    waited_s: float = 0.0
    # Each job asked to leave, with the nodes it ran on then (Slurm forgets a started job's
    # `--nodes` range, so this is what "full width" means when the node comes back).
    widths: dict[int, int] = Field(default_factory=dict)


class StepOutcome(BaseModel):
    """What a sharing step changed, for the move's record."""

    changed: bool
    detail: str = ""


class RegrowResult(BaseModel):
    requeued: list[int] = Field(default_factory=list)  # asked to checkpoint and requeue
    settled: list[int] = Field(default_factory=list)  # ended, or at full width
    # Not started again yet: it may start at full width, or narrower if a node is lent
    # again first, so the sharing workflow keeps it to regrow at a later return.
    pending: list[int] = Field(default_factory=list)


class YieldCall(BaseModel):
    """An incident asks the sharing workflow for a node it holds (lent, or in a move)."""

    cluster: str
    node: str
    incident_id: str


class YieldResult(BaseModel):
    held: bool  # the sharing workflow held the node (lent or moving) and now lets it go
    pool_before: Pool | None = None
    waited_for_step: str | None = None  # the move step the incident waited for, if any


class MoveRequest(BaseModel):
    """A person's move (`autoclusters share move`), through the same workflow."""

    node: str
    to: Direction
    requested_by: str


class ClearUnhealthy(BaseModel):
    """A human says a node that failed its gate on the way back is fixed: the sharing workflow
    may move it again (`autoclusters share clear NODE`)."""

    node: str
    by: str


class MoveDecision(BaseModel):
    """A human's answer to a move that needs approval."""

    move_id: str
    approve: bool
    by: str
    # Who decided, proven: the API's signed proof for this move, person and verdict
    # (core/decision_proof.py). The sharing workflow refuses a decision without a valid one.
    proof: str = ""


class MoveDecided(BaseModel):
    """The API's answer to a person's decision on a move (`POST /v1/moves/{id}/decisions`)."""

    cluster: str
    move_id: str
    outcome: str  # approved | rejected
    by: str


class MoveStep(BaseModel):
    name: str
    started_at: float
    finished_at: float | None = None
    ok: bool | None = None
    detail: str = ""


class MoveRecord(BaseModel):
    move: Move
    status: Literal["waiting_approval", "running", "done", "failed", "rejected", "yielded"] = (
        "running"
    )
    started_at: float
    finished_at: float | None = None
    steps: list[MoveStep] = Field(default_factory=list)
    error: str = ""
    approved_by: str | None = None


class LostNode(BaseModel):
    """A training node a remediation incident took while it ran jobs."""

    node: str
    incident_id: str
    fault: str = ""
    jobs: dict[int, int] = Field(default_factory=dict)  # job -> nodes it ran on before
    seen_at: float  # workflow time, epoch s


BorrowStatus = Literal["borrowing", "lent", "giving_back", "returned", "failed", "taken"]


class Borrow(BaseModel):
    """An inference node lent to training while a training node is repaired."""

    node: str  # the inference node lent
    for_node: str  # the training node under repair
    incident_id: str
    fault: str = ""
    jobs: dict[int, int] = Field(default_factory=dict)  # the jobs it keeps at full width
    status: BorrowStatus = "borrowing"
    why: str = ""
    started_at: float  # workflow time, epoch s
    move_id: str  # the move that lent it to training
    lent_at: float | None = None  # back in Slurm for the job
    give_back_move: str | None = None  # the move that gives it back to inference
    returned_at: float | None = None  # serving inference again
    ended_why: str = ""

    @property
    def active(self) -> bool:
        return self.status in ("borrowing", "lent", "giving_back")


class SharingState(BaseModel):
    """Everything the sharing workflow carries across continue-as-new."""

    pools: dict[str, Pool] = Field(default_factory=dict)
    breach_streak: int = 0
    calm_streak: int = 0
    last_move_end: float | None = None  # workflow time, epoch s
    moves: list[MoveRecord] = Field(default_factory=list)  # newest last, bounded
    queued: list[Move] = Field(default_factory=list)  # a person's moves, in order
    last_demand: Demand | None = None
    last_verdict: Verdict | None = None
    evaluations: int = 0
    seq: int = 0  # moves started (for move ids)
    # Nodes an incident took from the sharing workflow, and whether their Kubernetes side has
    # been put back in the training pool since.
    yielded: dict[str, str] = Field(default_factory=dict)  # node -> incident id
    unhealthy: list[str] = Field(default_factory=list)  # failed the gate on return
    narrowed: dict[int, int] = Field(default_factory=dict)  # job -> width before a lend
    # Borrowed from inference (only with `borrow_from_inference`): training nodes an
    # incident holds, and the inference nodes lent for them (newest last, bounded).
    lost: dict[str, LostNode] = Field(default_factory=dict)
    borrows: list[Borrow] = Field(default_factory=list)
    last_borrow_verdict: str = ""


class SharingInput(BaseModel):
    cluster: str
    policy: SharePolicy = Field(default_factory=SharePolicy)
    state: SharingState | None = None


class ShareStatus(BaseModel):
    cluster: str
    policy: SharePolicy
    pools: dict[str, Pool]
    last_demand: Demand | None
    last_verdict: Verdict | None
    current: MoveRecord | None
    moves: list[MoveRecord]
    queued: list[Move]
    evaluations: int
    unhealthy: list[str]
    # Borrowed from inference: what the console shows beside the incident it serves.
    borrows: list[Borrow] = Field(default_factory=list)
    lost: list[LostNode] = Field(default_factory=list)
    last_borrow_verdict: str = ""


class SharePolicyError(SpecError):
    """A share policy file that cannot be used; each problem with its line and field."""


SHARE_POLICY_FORMAT = SpecFormat(
    model=SharePolicy,
    error=SharePolicyError,
    what="a share policy",
    max_bytes=256 * 1024,
    max_nodes=10_000,
    root_message="a share policy must be a mapping (inference, min_training_nodes, ...)",
)


def load_share_policy(path: Path | str) -> SharePolicy:
    return load_yaml_model(path, SHARE_POLICY_FORMAT)
