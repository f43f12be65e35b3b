"""The shared vocabulary: what workflows, activities and clients pass to each other.

Every workflow and activity takes one model and returns one model, so fields can be
added later with defaults without breaking running incidents.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field, field_validator

# XID_<n> from the driver, or a named fault such as GPU_FELL_OFF_BUS / IB_LINK_DOWN / MANUAL.
FAULT_PATTERN = re.compile(r"^(XID_\d{1,3}|(?!XID_)[A-Z][A-Z0-9_]{1,63})$")
# Slurm node names as we accept them from outside: no spaces, no hostlist brackets.
NODE_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")

REASON_PREFIX = "autoclusters:"


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


class IncidentRequest(BaseModel):
    incident_id: str
    cluster: str
    node: str
    fault: str
    opened_at: datetime
    opened_by: str = "cli"
    timeouts: RemediationTimeouts = Field(default_factory=RemediationTimeouts)

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


IncidentStatus = Literal["open", "resolved", "failed"]


class IncidentState(BaseModel):
    """What the `status` query and the workflow result return: the incident's timeline."""

    request: IncidentRequest
    status: IncidentStatus = "open"
    current_step: str | None = None
    steps: list[StepRecord] = Field(default_factory=list)
    requeued_jobs: list[int] = Field(default_factory=list)
    old_vm_id: str | None = None
    new_vm_id: str | None = None
    error: str | None = None
    closed_at: datetime | None = None

    def step(self, name: str) -> StepRecord | None:
        return next((s for s in self.steps if s.name == name), None)


# --- Slurm, as parsed from `sinfo --json` / `squeue --json` -----------------------------


class SlurmNode(BaseModel):
    name: str
    state: str  # base state, lower case as Slurm prints it: idle, mixed, allocated, down, ...
    state_flags: list[str] = Field(default_factory=list)  # DRAIN, NOT_RESPONDING, ...
    reason: str = ""
    slurmd_start_time: int = 0

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
    restart_cnt: int = 0
    state_reason: str = ""
    admin_comment: str = ""
    requeue: bool = False
    batch_flag: bool = True


# --- activity inputs and results --------------------------------------------------------


class Notification(BaseModel):
    incident_id: str
    cluster: str
    node: str
    fault: str
    event: str  # opened, step, failed, resolved
    text: str


class DrainInput(BaseModel):
    node: str
    reason: str


class DrainResult(BaseModel):
    already_drained: bool
    previous_reason: str = ""


class RequeueInput(BaseModel):
    node: str
    incident_id: str
    poll_s: float = 0.25


class RequeueResult(BaseModel):
    requeued: list[int] = Field(default_factory=list)
    not_requeueable: list[int] = Field(default_factory=list)
    holds_released: list[int] = Field(default_factory=list)


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


class ReturnInput(BaseModel):
    node: str
    incident_id: str
    poll_s: float = 0.25


class ReturnResult(BaseModel):
    returned: bool
    state_after: str
    detail: str = ""
