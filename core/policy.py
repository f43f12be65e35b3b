"""The remediation policy: which fault gets which action, what needs a human, how fast.

One YAML file per cluster (path configurable); validated at load with errors that name the
line and field. Every incident carries a snapshot of the policy it was opened under, so a
policy edit never changes an incident mid-flight and the workflow stays deterministic.
"""

from __future__ import annotations

import importlib.resources
import math
import re
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    model_validator,
)
from pydantic_core import PydanticCustomError

from autoclusters.core.faults import FAULT_PATTERN, NODE_PATTERN
from autoclusters.core.job_thresholds import JobThresholds
from autoclusters.core.ladder_figures import LadderFigures
from autoclusters.core.recovery_cost import RecoveryFigures
from autoclusters.core.recovery_history import FiguresFromHistory
from autoclusters.core.yaml_spec import (
    SpecError,
    SpecFormat,
    SpecProblem,
    load_yaml_model,
    parse_yaml_model,
)


class Rung(StrEnum):
    """The escalation ladder, cheapest first."""

    MONITOR = "monitor"  # record and notify; the node stays in service
    RESET_GPU = "reset_gpu"
    REBOOT = "reboot"
    REPLACE = "replace"


LADDER: list[Rung] = [Rung.MONITOR, Rung.RESET_GPU, Rung.REBOOT, Rung.REPLACE]

Severity = Literal["info", "warning", "critical"]
SEVERITY_ORDER: dict[str, int] = {"info": 0, "warning": 1, "critical": 2}
Mode = Literal["observe", "approve", "auto"]


def next_rung(rung: Rung) -> Rung | None:
    i = LADDER.index(rung)
    return LADDER[i + 1] if i + 1 < len(LADDER) else None


def _fault_kind(v: str) -> str:
    if FAULT_PATTERN.match(v):
        return v
    hint = ""
    if m := re.fullmatch(r"xid[_-]?(\d{1,3})", v.strip(), re.IGNORECASE):
        hint = f"; did you mean 'XID_{m.group(1)}'?"
    elif FAULT_PATTERN.match(v.strip().upper().replace("-", "_")):
        hint = f"; did you mean {v.strip().upper().replace('-', '_')!r}?"
    raise PydanticCustomError(
        "fault_kind",
        "{kind} is not a fault kind: write XID_<n> or an upper-case name such as "
        "GPU_FELL_OFF_BUS{hint}",
        {"kind": repr(v), "hint": hint},
    )


def _node_name(v: str) -> str:
    if NODE_PATTERN.match(v):
        return v
    raise PydanticCustomError(
        "node_name", "{node} is not a single Slurm node name", {"node": repr(v)}
    )


# Bounds that keep every policy usable: each duration finite and at most a week, each count
# small enough to mean something, so a policy that loads can always be encoded into a
# workflow input and never overflows inside one.
MAX_DURATION_S = 7 * 86400
MAX_COUNT = 100_000  # nodes, repairs, incidents: no cluster is larger
MAX_POLICY_BYTES = 1024 * 1024
# Nodes of the YAML document once aliases are expanded: a real policy has a few hundred.
MAX_POLICY_NODES = 50_000


def Duration(default: float) -> Any:  # noqa: N802 - reads as a type in the models below
    """Seconds: positive, finite, at most MAX_DURATION_S."""
    return Field(default=default, gt=0, le=MAX_DURATION_S, allow_inf_nan=False)


def Count(default: int, *, ge: int = 1, le: int = MAX_COUNT) -> Any:  # noqa: N802
    return Field(default=default, ge=ge, le=le)


FaultKind = Annotated[str, AfterValidator(_fault_kind)]
NodeName = Annotated[str, AfterValidator(_node_name)]
Approver = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=256)]


class _Strict(BaseModel):
    # A typo in a policy file must fail the load, not silently fall back to a default.
    model_config = ConfigDict(extra="forbid")


class FaultRule(_Strict):
    severity: Severity
    first_rung: Rung
    # A fault that degrades the node without killing its jobs yet (a pending row remap, a
    # retirement that takes effect at the next reset): ask the node's jobs to checkpoint
    # first and requeue them only once they have (or the budget is spent), so they lose no
    # steps; `drain` requeues them at once, as for a fatal fault.
    on_degraded: Literal["checkpoint_then_drain", "drain"] = "drain"
    # A fault that is as often software as hardware (a hung job, a straggler): once the
    # node's jobs are recovered, the node is screened (the burn-in screen, `burn_in`'s
    # figures) before any repair. Passed: it goes back without a repair, the incident
    # counted in its lemon record; failed: the repair ladder from `first_rung`, each repair
    # screened again. Off by default, so a recorded incident replays as it ran.
    screen_before_repair: bool = False
    # A fault after which the node cannot end its jobs' processes: a GPU fallen off the bus
    # holds its rank in the driver (SIGKILL does not free it until the reboot), a node that
    # lost its power or its link does not answer. `at_once`: a job requeued from it is
    # fenced (the node marked DOWN, activities/slurm.py `_fence_if_stuck`, with every
    # condition kept) as soon as Slurm shows it completing there; `when_stuck` (default)
    # first waits `fence_after_s`, as a node that can end the run does so in a second or two.
    fence: Literal["when_stuck", "at_once"] = "when_stuck"


class StepPolicy(_Strict):
    """How one repair rung is carried out."""

    needs_approval: bool = False
    # Never repair under a running job unless `force`: wait until the node is idle.
    wait_for_idle: bool = True
    idle_timeout_s: float = Duration(3600)
    # When the node is still busy after idle_timeout_s: cancel its jobs and go on (force),
    # or stop here, leave the node drained and page a human.
    on_idle_timeout: Literal["force", "leave_drained"] = "leave_drained"


# What may go below the guard's floor when the policy names it (GuardPolicy.below_floor).
BelowFloorPath = Literal["drain_held_critical"]


# The topology levels a systemic incident groups by: an InfiniBand leaf switch, an NVLink
# domain (GPU feature discovery's clique: on GB200 NVL72 one rack, not so on every system),
# a rack (its power, its cooling). A fault that counts at several levels joins the first
# that groups it, in this order. `nvlink` came last to the policy: a policy without it
# (every recorded incident's) groups as it did before.
TopologyLevel = Literal["leaf", "nvlink", "rack"]
TOPOLOGY_LEVELS: tuple[TopologyLevel, ...] = ("leaf", "nvlink", "rack")


class SystemicLevel(_Strict):
    """Faults on at least `min_nodes` nodes of one domain of this level within `window_s`
    are one systemic incident (a bad leaf switch, a rack's power or NVLink fabric)."""

    min_nodes: int = Count(3, ge=2)
    window_s: float = Duration(60)
    # The fault kinds that count at this level (empty: every fault).
    faults: list[FaultKind] = Field(default_factory=list, max_length=1024)

    def counts(self, fault: str) -> bool:
        return not self.faults or fault in self.faults


class SystemicPolicy(_Strict):
    """Systemic incidents (docs/systemic.md): faults that cluster in the topology become one
    incident that owns its members: drained within the floor, none rebooted or replaced
    while it is open, one hand-off to the provider, screened together once it is fixed.
    Off by default: an incident opened under a policy without it runs as it always did."""

    enabled: bool = False
    leaf: SystemicLevel | None = Field(default_factory=SystemicLevel)
    nvlink: SystemicLevel | None = None
    rack: SystemicLevel | None = None
    # How long a systemic incident waits for its members to be drained before it hands
    # off (a member held at the floor joins the screen only if drained by then).
    settle_s: float = Duration(60)

    def level(self, name: TopologyLevel) -> SystemicLevel | None:
        rule: SystemicLevel | None = getattr(self, name)
        return rule


class GuardPolicy(_Strict):
    """Blast-radius limits, enforced by the cluster's fleet guard."""

    max_concurrent_repairs: int = Count(2)
    min_in_service_fraction: float = Field(default=0.75, ge=0, le=1, allow_inf_nan=False)
    # Trips on more than K opens within the sliding window, K = the larger of
    # breaker_threshold (the floor) and breaker_threshold_fraction of the cluster's nodes.
    breaker_threshold: int = Count(5)
    breaker_threshold_fraction: float = Field(default=0.05, ge=0, le=1, allow_inf_nan=False)
    breaker_window_s: float = Duration(600)
    # While incidents wait or nodes are left drained, the guard re-reads Slurm this often
    # (a node a human resumed is in service again).
    reconcile_interval_s: float = Duration(300)
    # A critical fault whose quarantine is held: drain the node without requeueing (its
    # running jobs go on, it takes no new ones) until the guard admits the quarantine —
    # when the floor allows it: the held drain counts as out of service, and the guard
    # admits it against min_in_service_fraction like a quarantine.
    drain_held_critical: bool = True
    # The paths allowed to take the cluster below min_in_service_fraction (none by
    # default): a flood of alerts never drains the whole cluster unless a path is named
    # here. `drain_held_critical`: held critical nodes are drained whatever the floor.
    below_floor: list[BelowFloorPath] = Field(
        default_factory=list, max_length=len(get_args(BelowFloorPath))
    )
    # Hot spares: healthy nodes kept drained ("autoclusters: spare") out of the partition. A
    # replacement puts one into service at once; the replaced node, once healthy, becomes
    # the spare.
    spares: list[Annotated[str, AfterValidator(_node_name)]] = Field(
        default_factory=list, max_length=1024
    )
    # Faults that cluster in the topology are one systemic incident (off by default).
    systemic: SystemicPolicy = Field(default_factory=SystemicPolicy)

    def breaker_limit(self, cluster_nodes: int) -> int:
        """K: the breaker trips on more than K opens within the window."""
        return max(
            self.breaker_threshold, math.floor(self.breaker_threshold_fraction * cluster_nodes)
        )


class NodeTopology(_Strict):
    leaf: str | None = Field(default=None, max_length=256)  # InfiniBand leaf switch
    pod: str | None = Field(default=None, max_length=256)  # scalable unit / pod
    nvlink: str | None = Field(default=None, max_length=256)  # NVLink domain (clique)
    rack: str | None = Field(default=None, max_length=256)  # rack

    def domain(self, level: TopologyLevel) -> str | None:
        where: str | None = getattr(self, level)
        return where


# A Kubernetes label key: an optional DNS-subdomain prefix and `/`, then a name of at most
# 63 characters (alphanumerics, `-`, `_`, `.`; alphanumeric at both ends).
LabelKey = Annotated[
    str,
    StringConstraints(
        max_length=317,
        pattern=r"^(?:[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?/)?"
        r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$",
    ),
]
# What the defaults read (docs/systemic.md "Topology"): a rack label (not one of Kubernetes'
# well-known labels: the cluster's admin or provider sets it), NVIDIA GPU feature
# discovery's NVLink clique (`<cluster uuid>.<clique id>`: one NVLink partition), and what
# NVIDIA Topograph's Kubernetes engine labels Nodes with: its fabric tiers (tier 0 the
# leaf switch, tier 1 the one above it) and accelerator domain, or, before its 1.0
# release, its leaf and spine.
RACK_LABEL = "topology.kubernetes.io/rack"
GPU_CLIQUE_LABEL = "nvidia.com/gpu.clique"
TOPOGRAPH_LEAF_LABELS = ["fabric.topograph.run/tier-0", "network.topology.nvidia.com/leaf"]
TOPOGRAPH_POD_LABELS = ["fabric.topograph.run/tier-1", "network.topology.nvidia.com/spine"]
TOPOGRAPH_DOMAIN_LABEL = "accelerator.topograph.run/domain"


class TopologyLabels(_Strict):
    """The Kubernetes Node labels that say where a node sits, per level: a Node's domain at
    a level is the value of the first of that level's keys it carries (none: unknown at
    that level). Read only where the cluster has Kubernetes (clients/fabric_topology.py)."""

    leaf: list[LabelKey] = Field(default_factory=lambda: [*TOPOGRAPH_LEAF_LABELS], max_length=16)
    pod: list[LabelKey] = Field(default_factory=lambda: [*TOPOGRAPH_POD_LABELS], max_length=16)
    nvlink: list[LabelKey] = Field(
        default_factory=lambda: [GPU_CLIQUE_LABEL, TOPOGRAPH_DOMAIN_LABEL], max_length=16
    )
    rack: list[LabelKey] = Field(default_factory=lambda: [RACK_LABEL], max_length=16)


class BurnInScreen(_Strict):
    """The screen a repaired node passes before it returns: an all-reduce with a healthy
    idle neighbour (alone when none is idle) and the agent's active diagnostic, as one
    Slurm job in a breakfix reservation on the node. Off by default: recorded incidents
    replay unchanged."""

    enabled: bool = False
    # The whole screen (reservation, job, clean-up); a job still running then fails it.
    timeout_s: float = Field(default=600, gt=0, le=86400, allow_inf_nan=False)
    # The all-reduce's tensor (float32 MiB) and rounds after one warm-up round.
    size_mib: int = Field(default=64, ge=1, le=16384)
    rounds: int = Field(default=5, ge=1, le=1000)
    # The bus bandwidth the all-reduce must reach (GB/s, NCCL-tests' busbw); 0: no floor
    # (the sandbox's gloo over loopback says nothing about a fabric).
    min_bus_gbps: float = Field(default=0, ge=0, le=100000, allow_inf_nan=False)
    # The matrix-multiply rate every GPU of the screened nodes must reach (TFLOP/s, a bf16
    # GEMM on GPUs, float32 on CPU); 0: no floor. A slow GPU passes every diagnostic and
    # still holds back its job: this is the figure that shows it.
    min_gemm_tflops: float = Field(default=0, ge=0, le=100000, allow_inf_nan=False)
    # Screen with a healthy idle neighbour when Slurm shows one; off: always alone.
    neighbour: bool = True


HandoffWhen = Literal["health_gate_failed", "lemon"]


class HandoffPolicy(_Strict):
    """The hand-off to the provider (docs/handoff.md): when the runbook has done all it can,
    the incident's evidence goes to `url` (a signed webhook, retried, one per incident) and
    the incident waits, drained, for the provider's signed answer. Off by default: an
    incident opened under a policy without it issues exactly the commands it did before
    (docs/versioning.md)."""

    enabled: bool = False
    # The provider's (or a ticketing system's) webhook; required when enabled.
    url: str = Field(default="", max_length=2048, pattern=r"^(https?://\S+)?$")
    # When the runbook hands off: the ladder's last repair failed its health gate
    # (`health_gate_failed`), or a lemon node passed its gate (`lemon`, instead of asking
    # the approvers to release it).
    when: list[HandoffWhen] = Field(
        default_factory=lambda: list[HandoffWhen](["health_gate_failed"]), max_length=2
    )
    # Fault kinds only the provider can fix (a fabric fault, a leaf switch): handed off once
    # the node is drained, with no repair of ours first.
    faults: list[FaultKind] = Field(default_factory=list, max_length=1024)
    # While no answer comes: a reminder in Slack this often.
    reminder_interval_s: float = Duration(4 * 3600)
    # The webhook's delivery: tried this many times, 5 s apart at first, doubling up to
    # 5 min apart (100 tries: about 8 h); then the incident fails, drained, for a human.
    send_attempts: int = Count(100, le=10_000)

    @model_validator(mode="after")
    def _url_when_enabled(self) -> HandoffPolicy:
        if self.enabled and not self.url:
            raise PydanticCustomError(
                "handoff_url", "handoff.url is required when handoff.enabled is true", {}
            )
        return self

    def hands_off(self, fault: str) -> bool:
        """Is `fault` the provider's to fix, with no repair of ours first?"""
        return self.enabled and fault in self.faults


class Policy(_Strict):
    mode: Mode = "auto"
    approvers: list[Approver] = Field(default_factory=list, max_length=1024)
    approval_timeout_s: float = Duration(3600)
    # After the timeout and one reminder: leave the node drained and page (default), or go on.
    approval_timeout_action: Literal["leave_drained", "proceed"] = "leave_drained"
    recurrence_window_s: float = Duration(86400)
    max_repair_attempts: int = Count(3, le=len(LADDER) * 3)
    # The health gate waits this long after a repair for the node agent's fresh report.
    agent_report_timeout_s: float = Field(default=300, gt=0, le=3600)
    # A system the runbook reads (slurmctld restarting, an API away): each step waits the
    # outage out this long, then the incident fails with the node drained. People hear of
    # it in Slack once it has lasted outage_notify_after_s.
    outage_budget_s: float = Duration(900)
    outage_notify_after_s: float = Duration(60)
    # Jobs this incident requeued once that Slurm placed back on the node (its drain was
    # lost): ask a human in Slack (cancel them / wait for them), or requeue them again.
    # "Never requeue a job twice for one fault" holds unless the policy says `requeue`.
    returned_jobs: Literal["ask", "requeue"] = "ask"
    returned_jobs_timeout_s: float = Duration(1800)
    # For faults whose rule says `on_degraded: checkpoint_then_drain`: the signal the jobs'
    # batch shells take as "checkpoint now and requeue yourself" (train.sbatch traps USR1),
    # and how long the runbook waits for them to leave the node before it requeues them.
    # A job that holds a hot spare in its own allocation and says so in its Slurm comment
    # (`injob=<dir>`, examples/training) can lose the faulty node without a requeue: the
    # runbook stops the job's processes on the node and releases the node from the job;
    # the job goes on with its spare. `requeue`: always requeue. A job that has not
    # stepped again (`resumed_at=` in its comment) within in_job_budget_s is requeued.
    job_recovery: Literal["in-job", "requeue"] = "in-job"
    in_job_budget_s: float = Field(default=30, gt=0, le=3600, allow_inf_nan=False)
    # Standbys held outside the jobs (in-job only; core/holders.py, docs/recovery.md): how
    # many free holder jobs the pool keeps. A job that says `holders=1` and has used up its
    # standby is given a free holder, into which its launcher starts a new standby; a node
    # returned to service gets a holder when fewer are free. 0: off (holders untouched).
    standby_holders: int = Field(default=0, ge=0, le=64)
    # Recovery chosen by its cost (core/recovery_cost.py): this cluster's seconds from a
    # fault to the job stepping again per path (bench/mttr.py measures them), which with
    # the job's width and checkpoint age estimate the GPU-hours each path loses; the
    # cheapest possible path is taken. `announce_recovery`: the estimates and the choice
    # go to Slack once the jobs are on their way (off in a policy that does not say).
    recovery_figures: RecoveryFigures = Field(default_factory=RecoveryFigures)
    # The figures a plan weighs follow the cluster's measured history: per path, the
    # median of the last measured recoveries, `recovery_figures` standing in for missing
    # ones (core/recovery_history.py), read when the incident quarantines its node; a
    # failed read weighs `recovery_figures`, and the plan says so. None (a policy that does
    # not say): `recovery_figures` alone, and no read.
    figures_from_history: FiguresFromHistory | None = None
    announce_recovery: bool = False
    # When the incident closes, measure what each planned job lost (when it stepped again,
    # the work it redid: core/recovery_loss.py) and set it beside the estimate, on the
    # incident and in the closing message; a requeued job is waited for up to
    # measure_recovery_s. Off in a policy that does not say: one more step at the close.
    measure_recovery: bool = False
    measure_recovery_s: float = Field(default=300, gt=0, le=3600, allow_inf_nan=False)
    checkpoint_signal: str = Field(default="USR1", pattern=r"^[A-Z0-9]{2,8}$")
    checkpoint_budget_s: float = Field(default=120, gt=0, le=3600, allow_inf_nan=False)
    faults: dict[FaultKind, FaultRule] = Field(default_factory=dict)
    default_rule: FaultRule = FaultRule(severity="warning", first_rung=Rung.REBOOT)
    steps: dict[Rung, StepPolicy] = Field(default_factory=dict)
    guard: GuardPolicy = Field(default_factory=GuardPolicy)
    topology: dict[NodeName, NodeTopology] = Field(default_factory=dict, max_length=MAX_COUNT)
    # Where `topology` does not say, the Kubernetes Nodes' labels do (these keys), then
    # Slurm's topology.conf (docs/systemic.md "Topology").
    topology_labels: TopologyLabels = Field(default_factory=TopologyLabels)
    # An outcome-driven ladder: a rung that fixed a fault kind in fewer than this fraction
    # of at least min_samples tries (the cluster's history, `autoclusters stats ladder`) is
    # skipped for that kind, and the incident says why. 0: never skip.
    skip_rung_below: float = Field(default=0, ge=0, le=1, allow_inf_nan=False)
    min_samples: int = Count(10)
    # The figures skip_rung_below is judged on, filled in when an incident opens (never
    # written in a policy file: a file that has them pins them); None: no figures, no skip.
    ladder: LadderFigures | None = None
    # Lemon nodes: a node repaired this many times within lemon_window_days (this repair
    # counted) is not returned after its repair passes the gate: it is held drained and
    # the approvers are asked, until one releases it (or rejects: it stays out). 0: off.
    lemon_repairs: int = Count(0, ge=0)
    lemon_window_days: float = Field(default=30, gt=0, le=365, allow_inf_nan=False)
    # A burn-in screen before return (docs/configuration.md): after the health gate passes,
    # the node is screened in a breakfix reservation; a failed screen is a failed gate.
    burn_in: BurnInScreen = Field(default_factory=BurnInScreen)
    # The hand-off to the provider when automation has done all it can (docs/handoff.md).
    handoff: HandoffPolicy = Field(default_factory=HandoffPolicy)
    # The silent-fault rules' thresholds for the jobs each entry matches (by Slurm job name,
    # partition or account; the first match wins), over the agent's own settings
    # (core/job_thresholds.py). The agents read them from this file (their policy_file).
    job_thresholds: list[JobThresholds] = Field(default_factory=list, max_length=1000)

    def rule_for(self, fault: str) -> FaultRule:
        return self.faults.get(fault, self.default_rule)

    def step(self, rung: Rung) -> StepPolicy:
        return self.steps.get(rung, StepPolicy())

    def rung_for(self, fault: str, recent_incidents: int) -> Rung:
        """The fault's first rung, one up per earlier incident on the node in the window."""
        rung = self.rule_for(fault).first_rung
        if rung == Rung.MONITOR:
            return rung
        for _ in range(recent_incidents):
            rung = next_rung(rung) or rung
        return rung


# --- loading from YAML -------------------------------------------------------------------


# One problem with a policy file: where (1-based line, dotted field) and what.
PolicyProblem = SpecProblem


class PolicyError(SpecError):
    """A policy file that cannot be used; the message lists every problem, one per line."""


DEFAULT_POLICY_FILE = "policies/default.yaml"


def default_policy() -> Policy:
    """The policy shipped with AutoClusters (core/policies/default.yaml)."""
    resource = importlib.resources.files("autoclusters.core").joinpath(DEFAULT_POLICY_FILE)
    with importlib.resources.as_file(resource) as path:
        return load_policy(path)


def load_policy(path: Path) -> Policy:
    """Read and validate a policy file; PolicyError names the line and field of each problem."""
    return load_yaml_model(path, POLICY_FORMAT)


def parse_policy(text: str, source: str = "<policy>") -> Policy:
    """Validate policy YAML held in memory; `source` names it in errors."""
    return parse_yaml_model(text, source, POLICY_FORMAT)


POLICY_FORMAT = SpecFormat(
    model=Policy,
    error=PolicyError,
    what="a policy",
    max_bytes=MAX_POLICY_BYTES,
    max_nodes=MAX_POLICY_NODES,
    root_message="a policy file must be a mapping of policy fields (mode, faults, steps, ...)",
)
