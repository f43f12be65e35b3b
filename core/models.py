"""The shared vocabulary: what workflows, activities and clients pass to each other.

Every workflow and activity takes one model and returns one model, so fields can be
added later with defaults without breaking running incidents.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from autoclusters.core.fault_evidence import FaultEvidence
from autoclusters.core.faults import FAULT_PATTERN, NODE_PATTERN
from autoclusters.core.handoff_answer import HandoffRecord
from autoclusters.core.loss_clock import loss_starts
from autoclusters.core.policy import Policy, Rung
from autoclusters.core.recovery_cost import RecoveryCapacity, RecoveryFigures, RecoveryPlan
from autoclusters.core.recovery_loss import RecoveryLoss
from autoclusters.core.systemic_member import Membership, SystemicVerdict

REASON_PREFIX = "autoclusters:"


# A hot spare waits drained under this reason, out of the scheduler's reach.
SPARE_REASON = f"{REASON_PREFIX} spare"


# The decision asked for when jobs requeued once for a fault run on the node again:
# approve = cancel them, reject = wait for them to end.
RETURNED_JOBS_STEP = "returned_jobs"


def drain_reason(incident_id: str, fault: str) -> str:
    """The Slurm drain reason we own; return-to-service only undrains reasons we wrote."""
    return f"{REASON_PREFIX} {incident_id} {fault}"


def workflow_id(cluster: str, node: str) -> str:
    """One open incident per node: the workflow id is derived from the node, not the fault."""
    return f"remediation-{cluster}-{node}"


class RemediationTimeouts(BaseModel):
    """Per-step limits, chosen by whoever opens the incident (the workflow stays deterministic)."""

    slurm_step_s: float = 60
    repair_s: float = 900
    wait_registered_s: float = 600
    admission_poll_s: float = 30  # how often a held incident asks the fleet guard again


class IncidentRequest(BaseModel):
    incident_id: str
    cluster: str
    node: str
    fault: str
    opened_at: datetime
    opened_by: str = "cli"
    timeouts: RemediationTimeouts = Field(default_factory=RemediationTimeouts)
    # The policy this incident runs under (a snapshot; None: the built-in defaults).
    policy: Policy | None = None
    # Slurm on Kubernetes (Slinky): the node is also a Kubernetes Node to cordon and empty.
    kubernetes: bool = False
    # The opening caller's token (see FaultReport.open_token).
    open_token: str = ""
    # Earlier incidents that repaired this node within the policy's lemon window, read from
    # history when it opened (core/lemon.py); None: not read (the check is off, or the read
    # failed: unknown, which holds nothing back).
    prior_repairs: int | None = None
    # The alert(s) that opened it, recorded as a `report_fault` update would: the API's
    # storm path starts the incident without waiting for a worker, and this carries what
    # the update would have (key, evidence, how many alerts) in the start itself.
    opening: FaultReport | None = None

    @field_validator("fault")
    @classmethod
    def _fault_kind(cls, v: str) -> str:
        if not FAULT_PATTERN.match(v):
            raise ValueError(f"fault {v!r} is not a fault kind such as XID_79 or GPU_FELL_OFF_BUS")
        return v

    @field_validator("node")
    @classmethod
    def _node_name(cls, v: str) -> str:
        if not NODE_PATTERN.match(v):
            raise ValueError(f"node {v!r} is not a single Slurm node name")
        return v


StepOutcome = Literal["running", "ok", "failed"]


class StepRecord(BaseModel):
    name: str
    started_at: datetime
    finished_at: datetime | None = None
    outcome: StepOutcome = "running"
    detail: str = ""


# open: in progress; resolved: node back in service; failed: left drained, a human paged;
# rejected: a human said no, left drained; observed: observe mode, nothing touched;
# monitored: the fault only warrants watching, the node stayed in service; handed_off: the
# provider declined the hand-off (docs/handoff.md), left drained.
IncidentStatus = Literal[
    "open", "resolved", "failed", "rejected", "observed", "monitored", "cancelled",
    "handed_off",
]  # fmt: skip
# What incidents can be listed by (`incident list --state`, GET /v1/incidents?state=): their
# own statuses plus the search attribute's `waiting_approval`. Anything else is refused,
# never an empty list.
IncidentStateName = Literal[
    "open", "waiting_approval", "resolved", "failed", "rejected", "observed", "monitored",
    "cancelled", "handed_off",
]  # fmt: skip


class FaultSeen(BaseModel):
    fault: str
    source: str
    first_at: datetime
    last_at: datetime
    count: int = 1
    # What the sources said (the first account and the latest ones, bounded).
    evidence: list[FaultEvidence] = Field(default_factory=list)
    # A source said it stopped holding (recorded only: it never stops a repair).
    resolved_at: datetime | None = None
    resolved_by: str | None = None


class FaultReport(BaseModel):
    """An alert for a node: opens its incident, or joins the one already open."""

    incident_id: str  # the id a new incident would get
    fault: str
    source: str = "cli"
    at: datetime  # when the source saw it start (an alert's startsAt), else when received
    evidence: FaultEvidence | None = None
    # The caller's token: equal to the opening request's, this report opened the incident.
    open_token: str = ""
    key: str = ""  # the source's dedupe key: a report seen before is answered `repeat`
    # Alerts this report stands for: the API sends a node's alerts of one fault kind that
    # arrived together as one report (its key covers them all); the fault counts each.
    alerts: int = Field(default=1, ge=1)

    @field_validator("fault")
    @classmethod
    def _fault_kind(cls, v: str) -> str:
        if not FAULT_PATTERN.match(v):
            raise ValueError(f"fault {v!r} is not a fault kind such as XID_79 or GPU_FELL_OFF_BUS")
        return v


class FaultAck(BaseModel):
    incident_id: str
    joined: bool  # True: the node already had this incident open
    rung: str | None
    status: str
    opened: bool = False  # this report opened the incident: true for exactly one caller
    repeat: bool = False  # this report (its key) was recorded before: nothing new


class ApprovalRequest(BaseModel):
    step: str  # the rung waiting for a decision: reset_gpu, reboot, replace
    approver: str
    comment: str = ""
    # Who decided, proven: a short-lived token the API signed for exactly this incident,
    # step, person and decision (core/decision_proof.py). The workflow refuses a decision
    # without a valid one, whoever can reach Temporal.
    proof: str = ""


class ProofCheck(BaseModel):
    """What the worker checks a decision's proof against (activities/decisions.py)."""

    proof: str
    subject: str  # the incident (or move) the decision is for
    step: str
    approver: str
    approve: bool


class ProofVerdict(BaseModel):
    ok: bool
    reason: str = ""
    via: str = ""  # how the API knew the person: slack:<user id>, token:<name>


class ApprovalRecord(BaseModel):
    step: str
    approver: str
    approved: bool
    comment: str = ""
    at: datetime


class RefusedApproval(BaseModel):
    step: str
    approver: str
    approved: bool
    reason: str
    at: datetime


class Waiting(BaseModel):
    kind: Literal[
        "approval", "admission", "idle", "agent_report", "checkpoint", "handoff", "systemic"
    ]
    step: str | None = None
    detail: str = ""
    since: datetime


class IncidentState(BaseModel):
    """What the `status` query and the workflow result return: the incident's timeline."""

    request: IncidentRequest
    status: IncidentStatus = "open"
    current_step: str | None = None
    mode: str = "auto"
    rung: str | None = None  # the repair the incident is on now
    faults: list[FaultSeen] = Field(default_factory=list)
    waiting_for: Waiting | None = None
    approvals: list[ApprovalRecord] = Field(default_factory=list)
    refusals: list[RefusedApproval] = Field(default_factory=list)
    planned_steps: list[str] = Field(default_factory=list)
    health: list[HealthReport] = Field(default_factory=list)
    repair_attempts: int = 0
    spare_node: str | None = None  # the hot spare put into service in this node's place
    steps: list[StepRecord] = Field(default_factory=list)
    requeued_jobs: list[int] = Field(default_factory=list)
    # slurmctld's start when the jobs were requeued ("" unknown), what the incident knew
    # of them, and those a controller restart lost (workflows/controller_restart.py).
    controller_started: str = ""
    job_records: list[JobRecord] = Field(default_factory=list)
    vanished_jobs: list[JobRecord] = Field(default_factory=list)
    # Jobs the incident cancelled (a human's decision, or the policy's force after the idle
    # timeout): a controller that restarted and shows one on the node again is cancelled
    # again, never requeued.
    cancelled_jobs: list[int] = Field(default_factory=list)
    # Degraded faults: the jobs that checkpointed when asked, before their requeue.
    checkpointed_jobs: list[int] = Field(default_factory=list)
    # The Alertmanager silence of the node's other alerts, held from the drain to the close.
    silence_id: str | None = None
    # How each job on the node got going again: "in-job" (its hot spare) or "requeue".
    recovery_path: dict[int, str] = Field(default_factory=dict)
    # What each path was estimated to cost each job, and the one taken (core/recovery_cost.py).
    recovery_plans: list[RecoveryPlan] = Field(default_factory=list)
    # Measured when it closed (policy measure_recovery): each planned job's actual loss
    # beside the estimate of the path it took (core/recovery_loss.py).
    recovery_losses: list[RecoveryLoss] = Field(default_factory=list)
    old_vm_id: str | None = None
    new_vm_id: str | None = None
    # Repaired too often within the policy's lemon window: held out until a person says.
    lemon: bool = False
    # The burn-in screens after each repair that passed its health gate (policy burn_in).
    screens: list[ScreenResult] = Field(default_factory=list)
    # The hand-off to the provider, once the runbook made one (policy handoff).
    handoff: HandoffRecord | None = None
    # The systemic incident this node's fault belongs to (policy guard.systemic), and what
    # it told the incident (docs/systemic.md).
    systemic: Membership | None = None
    systemic_verdict: SystemicVerdict | None = None
    error: str | None = None
    closed_at: datetime | None = None

    def step(self, name: str) -> StepRecord | None:
        """The latest record of the step `name` (repairs and health gates can repeat)."""
        return next((s for s in reversed(self.steps) if s.name == name), None)

    def loss_starts(self) -> datetime:
        """When the fault that opened the incident began to cost its jobs: its start as its
        source saw it, within reason (core/loss_clock.py)."""
        first = next((f.first_at for f in self.faults if f.fault == self.request.fault), None)
        return loss_starts(self.request.opened_at, first)


class HealthCheck(BaseModel):
    name: str
    passed: bool
    detail: str = ""


class ScreenInput(BaseModel):
    """A burn-in screen of `node` (activities/screen.py): `key` names its reservation's
    job, so a retried activity adopts the job it submitted instead of a second one."""

    node: str
    incident_id: str
    key: str
    drain_reason: str  # the incident's: put back before the reservation goes
    timeout_s: float = 600
    size_mib: int = 64
    rounds: int = 5
    min_bus_gbps: float = 0
    neighbour: bool = True
    poll_s: float = 1.0
    min_gemm_tflops: float = 0  # the GEMM rate's floor per rank; 0: none
    # Screened in the same job (a systemic incident's members, screened together): each
    # other node with its own incident's drain reason, put back as for `node`.
    others: dict[str, str] = Field(default_factory=dict)


class ScreenResult(BaseModel):
    """What the screen found; `passed` only when the job completed, the all-reduce ran and
    reached the floor, and every node's active diagnostic passed."""

    node: str
    passed: bool
    seconds: float  # the whole screen: reservation made to reservation gone
    reservation: str = ""
    job_id: int | None = None
    # The healthy idle node it ran the all-reduce with; None: none was idle, screened alone.
    neighbour: str | None = None
    allreduce_s: float | None = None  # the timed rounds, each round's mean
    algbw_gbps: float | None = None  # size / time
    busbw_gbps: float | None = None  # algbw * 2(n-1)/n, NCCL-tests' figure
    backend: str | None = None  # gloo | nccl
    diag: dict[str, str] = Field(default_factory=dict)  # node -> "pass" or what failed
    # node -> the slowest of its ranks' GEMM rate (TFLOP/s); absent: the job printed none.
    gemm_tflops: dict[str, float] = Field(default_factory=dict)
    detail: str = ""


class HealthReport(BaseModel):
    node: str
    passed: bool
    checks: list[HealthCheck] = Field(default_factory=list)
    # Set by the Slurm side of the gate: when it checked (epoch s) and the GPUs the node
    # must have; the agent's evidence is judged against them.
    checked_at: float | None = None
    expected_gpus: int | None = None

    def failures(self) -> str:
        return "; ".join(f"{c.name}: {c.detail}" for c in self.checks if not c.passed)


# --- Slurm, as parsed from `sinfo --json` / `squeue --json` -----------------------------


class SlurmNode(BaseModel):
    name: str
    state: str  # base state, lower case as Slurm prints it: idle, mixed, allocated, down, ...
    state_flags: list[str] = Field(default_factory=list)  # DRAIN, NOT_RESPONDING, ...
    reason: str = ""
    slurmd_start_time: int = 0
    gres: str = ""  # e.g. gpu:8 or gpu:h100:8

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.state_flags

    @property
    def responding(self) -> bool:
        return "NOT_RESPONDING" not in self.state_flags and self.state not in ("down", "unknown")

    @property
    def display_state(self) -> str:
        """The state as an operator reads it: IDLE, IDLE+DRAIN, MIXED+DRAIN, DOWN+NOT_RESPONDING."""
        return "+".join([self.state.upper(), *self.state_flags])


class SlurmJob(BaseModel):
    job_id: int
    name: str = ""
    job_state: str  # RUNNING, PENDING, COMPLETING, ...
    nodes: str = ""  # hostlist expression, e.g. gpu-[01-02]
    # The node that runs its batch script ("" while pending): Slurm never releases it from
    # the running job ("You cannot remove the batch host from a job when resizing").
    batch_host: str = ""
    restart_cnt: int = 0
    state_reason: str = ""
    # When a pending job may start (epoch seconds; 0: not said). A requeued job's is ~2
    # minutes on, and Slurm names the reason (BeginTime) only at its next scheduling pass.
    eligible_time: int = 0
    admin_comment: str = ""
    requeue: bool = False
    batch_flag: bool = True
    # Width: nodes it runs on now, and the most it asked for (`--nodes=min-max`); GPUs it
    # asked for (`gres/gpu` of its TRES request; 0 when it asked for none).
    node_count: int = 0
    max_nodes: int = 0
    gpus: int = 0
    comment: str = ""
    # What a person needs to submit it again (squeue's, where this Slurm gives them).
    user: str = ""
    command: str = ""  # the batch script
    work_dir: str = ""
    submit_line: str = ""

    def record(self) -> JobRecord:
        return JobRecord(
            job_id=self.job_id, name=self.name, user=self.user, command=self.command,
            work_dir=self.work_dir, submit_line=self.submit_line,
        )  # fmt: skip


class JobRecord(BaseModel):
    """A job the incident requeued, as it knew it then: enough for a person to submit it
    again if the controller loses it (a crash that rolled its state back)."""

    job_id: int
    name: str = ""
    user: str = ""
    command: str = ""
    work_dir: str = ""
    submit_line: str = ""

    def how_to_resubmit(self) -> str:
        if self.submit_line:
            where = f" in {self.work_dir}" if self.work_dir else ""
            return f"resubmit with `{self.submit_line}`{where}"
        if self.command:
            where = f" (-D {self.work_dir})" if self.work_dir else ""
            return f"resubmit its batch script: sbatch {self.command}{where}"
        return "its script is not known to the incident: ask its owner to resubmit"


class ControllerCheck(BaseModel):
    """Re-read after a possible controller restart: what the incident made true."""

    node: str
    incident_id: str
    jobs: list[int] = Field(default_factory=list)  # the jobs it requeued


class ControllerFacts(BaseModel):
    controller_started: str = ""  # slurmctld's start (BOOT_TIME); "" when it says none
    on_node: list[int] = Field(default_factory=list)  # jobs Slurm shows on the node now
    unknown: list[int] = Field(default_factory=list)  # of the requeued, those Slurm lost


# --- activity inputs and results --------------------------------------------------------


class Notification(BaseModel):
    incident_id: str
    cluster: str
    node: str
    fault: str
    event: str  # opened, held, approval_needed, escalated, failed, resolved, ...
    text: str
    severity: str = "info"  # info, warning, critical (critical pages a human)
    # The alert's runbook link, apart from `text`: a notifier may show it as a link, while
    # `text` is words from outside and is shown as words (integrations/slack/escape.py).
    runbook_url: str = ""


class DrainInput(BaseModel):
    node: str
    reason: str


class DrainResult(BaseModel):
    already_drained: bool
    previous_reason: str = ""


class InJobResult(BaseModel):
    """In-job recovery of the jobs on a faulty node (activities/in_job.py)."""

    # Lost the node and stepped again on their spare, no requeue.
    recovered: list[int] = Field(default_factory=list)
    # Requeued once by this incident instead, and why: the faulty node runs its batch
    # script, it lost more nodes than it has standbys, Slurm refused, or it did not step
    # again within the budget.
    fell_back: dict[int, str] = Field(default_factory=dict)
    # Requeued meanwhile by someone else (another incident's fault on the same job, the job
    # itself), and how this one knew: not requeued again.
    requeued_elsewhere: dict[int, str] = Field(default_factory=dict)
    # No hot spare announced (`injob=` in the comment): left to the requeue step.
    not_capable: list[int] = Field(default_factory=list)
    waited_s: float = 0.0
    # What each path was estimated to cost the job, and the one taken (core/recovery_cost.py).
    plans: list[RecoveryPlan] = Field(default_factory=list)
    # Standbys held outside the jobs (core/holders.py): holders on the node cancelled (a
    # fence, or one that served nobody), and the holder each recovered job was given.
    holders_cancelled: list[int] = Field(default_factory=list)
    holders_given: dict[int, int] = Field(default_factory=dict)

    def describe(self) -> str:
        parts = []
        if self.recovered:
            parts.append(f"{self.recovered} went on without the node ({self.waited_s:.1f}s)")
        parts += [f"{j} requeued instead: {why}" for j, why in self.fell_back.items()]
        parts += [f"{j} {why}" for j, why in self.requeued_elsewhere.items()]
        if self.not_capable:
            parts.append(f"no hot spare in {self.not_capable}: requeue")
        parts += [f"{j} given holder {h}" for j, h in self.holders_given.items()]
        if self.holders_cancelled:
            parts.append(f"holders {self.holders_cancelled} cancelled")
        return "; ".join(parts) or "no job on the node"


def job_comment(job: SlurmJob, key: str) -> str | None:
    """A `key=value` token of the job's Slurm comment (jobs announce what they can do and
    record what they did there: `ckpt_at=`, `injob=`, `resumed_at=`)."""
    for part in job.comment.replace(";", " ").split():
        k, sep, value = part.partition("=")
        if sep and k == key:
            return value
    return None


def job_stamp(job: SlurmJob, key: str) -> float | None:
    """A time the job wrote in its comment (`ckpt_at=<epoch s>`, `run_at=`, `resumed_at=`);
    None: not said, or not a time."""
    value = job_comment(job, key)
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


# A healthy node ends a requeued run in a second or two: a job still completing on the
# incident's node after this long is stuck there (RequeueInput.fence_after_s).
FENCE_AFTER_S = 3.0


class RequeueInput(BaseModel):
    node: str
    incident_id: str
    poll_s: float = 0.25
    hold_watch_s: float = 5.0  # how long a late requeue hold is watched for at most
    # Jobs this incident requeued once that Slurm placed back on the node (its drain was
    # lost): requeue them a second time (the policy says so), or only report them.
    requeue_again: bool = False
    # The policy's job_recovery is in-job: a job holding a hot spare loses the node and goes
    # on instead (activities/in_job.py), or is requeued after in_job_budget_s.
    in_job: bool = False
    in_job_budget_s: float = 30.0
    # The policy's standby_holders: standbys held outside the jobs, by holder jobs
    # (core/holders.py); 0: none (holders are neither looked at nor given).
    standby_holders: int = 0
    # The incident's drain, read back right before the first requeue: a controller that
    # restarted since the drain step may have forgotten it, and a requeued job would land on
    # the node again. "": not checked.
    drain_reason: str = ""
    # A job this incident requeued still completing on the node after this long (or at
    # once where the node does not answer): the node is marked DOWN for it to end there
    # (activities/slurm.py, `_fence_if_stuck`). None: never.
    # `fence: at_once` in the fault's rule: 0 (the node cannot end the job's processes).
    fence_after_s: float | None = FENCE_AFTER_S
    # The cluster's seconds to stepping again per path: what the recovery plan weighs.
    figures: RecoveryFigures = Field(default_factory=RecoveryFigures)
    # What the incident knows of the capacity the jobs may restart on (a hot spare, the
    # repair's length from the cluster's history): the other paths the plan weighs.
    capacity: RecoveryCapacity = Field(default_factory=RecoveryCapacity)
    # The incident's opening (epoch s): a job's work since its checkpoint is counted to the
    # fault, when it stopped making progress, not to the plan a second or two later.
    # None: to now.
    fault_at: float | None = None


class RequeueResult(BaseModel):
    requeued: list[int] = Field(default_factory=list)  # every job this incident requeued
    not_requeueable: list[int] = Field(default_factory=list)
    holds_released: list[int] = Field(default_factory=list)
    requeued_now: list[int] = Field(default_factory=list)  # by this call
    # Requeued by themselves (their checkpoint signal's requeue) in the instant this call
    # requeued them, under this incident's marker: its one requeue all the same.
    requeued_itself: list[int] = Field(default_factory=list)
    # Requeued once for this incident and running on the node again (left running unless
    # `requeue_again`): the runbook asks what to do with them.
    came_back: list[int] = Field(default_factory=list)
    requeued_again: list[int] = Field(default_factory=list)
    in_job: InJobResult | None = None  # None: not tried (policy, or a client that cannot)
    # slurmctld's start, read before the first write: a later different one means the
    # controller restarted since and may have forgotten what this call did ("": unknown).
    controller_started: str = ""
    records: list[JobRecord] = Field(default_factory=list)  # of the jobs requeued now
    redrained: bool = False  # the drain was gone before the requeue: applied again
    # The node could not end its requeued jobs (stuck, or not answering): marked DOWN.
    marked_down: bool = False
    # Held over that DOWN and not released yet (the heartbeats carry it to a retry).
    fence_held: list[int] = Field(default_factory=list)
    # Every job's recovery plan: the estimates per path and the one taken.
    plans: list[RecoveryPlan] = Field(default_factory=list)
    # Holders claimed for an earlier run of a job requeued here: cancelled, so that the
    # requeued run gets their nodes (activities/holders.py `release_for_requeued`).
    holders_released: list[int] = Field(default_factory=list)

    def recovery_path(self) -> dict[int, str]:
        """How each job on the node got going again: "in-job" (its standby), or "requeue"
        (this incident's, or another's it found done and left alone)."""
        in_job = self.in_job or InJobResult()
        return {
            **dict.fromkeys(in_job.recovered, "in-job"),
            **dict.fromkeys([*in_job.fell_back, *in_job.requeued_elsewhere], "requeue"),
            **dict.fromkeys(self.requeued, "requeue"),
        }

    def describe(self) -> str:
        """Exactly what was done to which job."""
        parts = [f"requeued {self.requeued_now or 'no jobs'}"]
        if self.in_job is not None and (
            self.in_job.recovered or self.in_job.fell_back or self.in_job.requeued_elsewhere
        ):
            parts.insert(0, f"in-job: {self.in_job.describe()}")
        earlier = [j for j in self.requeued if j not in self.requeued_now]
        if earlier:
            parts.append(f"requeued earlier for this incident {earlier}")
        if self.requeued_itself:
            parts.append(f"requeued by themselves at that instant {self.requeued_itself}")
        if self.requeued_again:
            parts.append(f"requeued a second time {self.requeued_again}")
        if self.came_back:
            parts.append(f"back on the node after their requeue, left running {self.came_back}")
        if self.not_requeueable:
            parts.append(f"cannot requeue {self.not_requeueable}")
        if self.redrained:
            parts.insert(0, "the drain was gone (a controller restart?): drained again")
        if self.marked_down:
            parts.append("the node could not end its requeued jobs: marked DOWN so they could")
        if self.fence_held:
            parts.append(f"held over that DOWN and not yet seen let go {self.fence_held}")
        if self.holders_released:
            parts.append(f"holders {self.holders_released} of the requeued runs cancelled")
        parts += [f"plan {p.describe()}" for p in self.plans]
        return "; ".join(parts)


class SilenceInput(BaseModel):
    node: str
    incident_id: str
    fault: str


class SilenceResult(BaseModel):
    silence_id: str | None = None  # None: not silenced (no Alertmanager, or it was away)
    detail: str = ""


class LiftSilenceInput(BaseModel):
    silence_id: str
    incident_id: str


class CheckpointInput(BaseModel):
    node: str
    incident_id: str
    signal: str = "USR1"
    budget_s: float = 120.0
    poll_s: float = 0.5


class CheckpointJobsResult(BaseModel):
    """What the jobs on a degraded node did when asked to checkpoint."""

    signalled: list[int] = Field(default_factory=list)  # asked (by this call or an earlier try)
    # Recorded a checkpoint after the signal (`ckpt_at=` in their comment).
    checkpointed: list[int] = Field(default_factory=list)
    left: list[int] = Field(default_factory=list)  # requeued themselves, off the node
    # Still on the node at the end of the budget: the requeue step takes them.
    stayed: list[int] = Field(default_factory=list)
    not_asked: list[int] = Field(default_factory=list)  # not requeueable: left running
    waited_s: float = 0.0

    def describe(self) -> str:
        if not self.signalled:
            return "no job to ask" + (
                f"; cannot requeue {self.not_asked}, left running" if self.not_asked else ""
            )
        parts = [f"asked {self.signalled} to checkpoint"]
        if self.checkpointed:
            parts.append(f"checkpointed {self.checkpointed}")
        if self.left:
            parts.append(f"requeued themselves {self.left} after {self.waited_s:.1f}s")
        if self.stayed:
            parts.append(f"still running after the budget {self.stayed}: requeued next")
        if self.not_asked:
            parts.append(f"cannot requeue {self.not_asked}, left running")
        return "; ".join(parts)


class ReplaceInput(BaseModel):
    node: str
    incident_id: str


class ReplaceResult(BaseModel):
    node: str
    old_vm_id: str
    new_vm_id: str
    stopped_at: float  # epoch seconds: the old machine was gone from here on


class WaitRegisteredInput(BaseModel):
    node: str
    since: float  # epoch seconds; the node's slurmd must have started at or after this
    poll_s: float = 0.5
    settle_s: float = 2.0
    # The incident's drain (`drain_reason`), kept on the node until its health gate: a
    # Slinky operator's DOWN or undrain of a replaced node is taken back. "": not checked.
    incident_id: str = ""
    drain_reason: str = ""


class ReturnInput(BaseModel):
    node: str
    incident_id: str
    poll_s: float = 0.25
    # The policy's standby_holders: once returned, a holder job is submitted on the node
    # when fewer than this many are free (activities/holders.py); 0: never.
    standby_holders: int = 0


class ReturnResult(BaseModel):
    returned: bool
    state_after: str
    detail: str = ""


class RepairInput(BaseModel):
    node: str
    rung: Rung
    key: str  # idempotency key: one incident attempt; a retry never repairs twice
    # From `plan_repair` (runbook v5 on), so they are in the workflow's history: the VM to
    # repair (never another one) and when the repair was planned (operations on that VM
    # started since then are this repair's). None: an older runbook, the VM named now.
    vm_id: str | None = None
    planned_at: float | None = None
    # A replace's: what recreating the machine needs, recorded with the VM (below).
    machine_spec: dict[str, Any] = Field(default_factory=dict)


class PlanRepairInput(BaseModel):
    node: str
    rung: Rung
    key: str


class RepairPlan(BaseModel):
    """The machine a repair is about, recorded in the workflow's history before it starts."""

    node: str
    vm_id: str
    planned_at: float  # epoch seconds, taken before the VM was looked up
    # For a replace: what recreating the machine needs (the cloud's words; {}: the cloud
    # replaces it itself). In the history, so a retry that finds the VM already deleted,
    # its own progress lost with a crashed worker, can still create the successor.
    machine_spec: dict[str, Any] = Field(default_factory=dict)


class RepairResult(BaseModel):
    node: str
    rung: Rung
    old_vm_id: str
    new_vm_id: str
    stopped_at: float | None = None  # epoch s the machine went down (None: it never did)


class HealthGateInput(BaseModel):
    node: str


class WaitIdleInput(BaseModel):
    node: str
    timeout_s: float
    force: bool  # on timeout: cancel what still runs (True) or give up (False)
    poll_s: float = 1.0
    # The incident's drain: while waiting, a drain Slurm lost (a controller restarted from
    # an older state, an admin's resume) is applied again, so no new job lands meanwhile.
    drain_reason: str = ""
    drain_check_s: float = 10.0  # how often the drain is read back while waiting
    # slurmctld's start when the incident requeued (BOOT_TIME): read with the drain, a
    # different one ends the wait at once, so what the restart forgot (a requeue: the job
    # "runs" here again, a ghost) is re-established before waiting on. "": not compared.
    controller_started: str = ""
    incident_id: str = ""  # whose requeued jobs back on the node end the wait ("": none)


class WaitIdleResult(BaseModel):
    waited_s: float
    cancelled: list[int] = Field(default_factory=list)
    redrained: int = 0  # times the drain was found lost and applied again
    # The wait ended because slurmctld restarted (its new start); the node may not be idle.
    controller_restarted: str = ""
    # The wait ended on jobs the incident requeued that Slurm placed on the node again (its
    # drain was lost meanwhile): the runbook's to decide on, never waited out.
    came_back: list[int] = Field(default_factory=list)
    # What the runbook re-established after each restart seen while waiting.
    rechecked: list[str] = Field(default_factory=list)

    def describe(self) -> str:
        waited = f"idle after {self.waited_s:.0f}s"
        text = f"cancelled {self.cancelled}" if self.cancelled else waited
        if self.redrained:
            text += f"; the drain was lost and applied again x{self.redrained}"
        return "; ".join([text, *self.rechecked])


class CancelJobsInput(BaseModel):
    node: str
    job_ids: list[int]


class CancelJobsResult(BaseModel):
    cancelled: list[int] = Field(default_factory=list)  # still on the node, now cancelled
    gone: list[int] = Field(default_factory=list)  # had already left the node or ended


class SpareInput(BaseModel):
    node: str  # the spare, or the replaced node to park as one
    incident_id: str
