"""The node agent's health snapshot, and what the health gate concludes from snapshots.

The agent sends a `HealthSnapshot` every few seconds (and at once when what it sees
changes); the API forwards it to the node's open incident as the `health_evidence` update;
the incident's health gate (`workflows/health_gate_steps.py`) decides with `judge` whether
the machine that came back from its repair is healthy *according to its own agent*.

Shared by the agent, the API and the workflow, so this module imports only pydantic, the
standard library and core.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field

from autoclusters.core.faults import FAULT_PATTERN, NODE_PATTERN
from autoclusters.core.models import HealthCheck

_ID_NAMESPACE = uuid.UUID("0b6c2f5e-3d4a-4f7b-9e21-7c5d8a1f4e60")


def _node(v: str) -> str:
    if not NODE_PATTERN.match(v):
        raise ValueError(f"{v!r} is not a node name")
    return v


def _fault(v: str) -> str:
    if not FAULT_PATTERN.match(v):
        raise ValueError(f"{v!r} is not a fault kind (XID_<n> or an upper-case name)")
    return v


class ActiveFault(BaseModel):
    """A fault kind the node's hardware shows in this check (not the debounced alert state).

    last_at: when it was last seen: the check's time for a condition (an ECC count, a lost
    GPU, a port down), the latest event's time for an event fault (an Xid): an Xid that
    happened before a repair is no evidence against the machine that came back from it.
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    fault: Annotated[str, AfterValidator(_fault)]
    message: str = ""
    last_at: AwareDatetime


class IbPortState(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    hca: str
    port: int
    state: str = ""  # "4: ACTIVE"
    phys_state: str = ""  # "5: LinkUp"
    healthy: bool


class HealthSnapshot(BaseModel):
    """What one agent check saw on its node, sent whether or not anything is wrong.

    Fields:
        snapshot_id: derived from (node, boot_id, observed_at): a resend is the same update.
        node: the node the agent runs on.
        observed_at: when the check ran (the node's clock, UTC).
        boot_id: the machine's identity for this boot (/proc/sys/kernel/random/boot_id; the
            fake backend's file may carry its own): a reboot or a new machine changes it.
        gpu_count: GPUs the backend sees now (None: no GPU backend, or it could not count).
        expected_gpus: what the agent expects (its setting, else the most it has seen).
        faults: the fault kinds the hardware shows in this check.
        firing: the fault kinds the agent's debouncer holds as firing (its alerts).
        infiniband: every port with its state (None: the node has no InfiniBand).
        backend: nvml or fake (none without a GPU backend).
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    snapshot_id: str = Field(min_length=1, max_length=64)
    node: Annotated[str, AfterValidator(_node)]
    observed_at: AwareDatetime
    boot_id: str = Field(default="", max_length=128)
    gpu_count: int | None = Field(default=None, ge=0)
    expected_gpus: int | None = Field(default=None, ge=0)
    faults: list[ActiveFault] = Field(default_factory=list, max_length=200)
    firing: list[str] = Field(default_factory=list, max_length=200)
    infiniband: list[IbPortState] | None = Field(default=None, max_length=512)
    backend: str = Field(default="none", max_length=32)

    @classmethod
    def build(
        cls,
        *,
        node: str,
        observed_at: datetime,
        boot_id: str = "",
        gpu_count: int | None = None,
        expected_gpus: int | None = None,
        faults: Iterable[ActiveFault] = (),
        firing: Iterable[str] = (),
        infiniband: Iterable[IbPortState] | None = None,
        backend: str = "none",
    ) -> HealthSnapshot:
        key = f"{node}|{boot_id}|{observed_at.isoformat()}"
        return cls(
            snapshot_id=str(uuid.uuid5(_ID_NAMESPACE, key)),
            node=node,
            observed_at=observed_at,
            boot_id=boot_id,
            gpu_count=gpu_count,
            expected_gpus=expected_gpus,
            faults=list(faults),
            firing=list(firing),
            infiniband=list(infiniband) if infiniband is not None else None,
            backend=backend,
        )


class EvidenceAck(BaseModel):
    """The incident's answer to a snapshot."""

    incident_id: str
    kept: bool  # False: not this node's, or a resend of one already kept
    snapshots: int  # how many the incident holds now


# --- the gate -------------------------------------------------------------------------------

Verdict = Literal["passed", "failed", "waiting"]


class Judgement(BaseModel):
    verdict: Verdict
    checks: list[HealthCheck]


def judge(
    snapshots: Iterable[HealthSnapshot],
    *,
    since: datetime,
    old_boot_id: str | None,
    expected_gpus: int | None,
    incident_faults: Iterable[str],
) -> Judgement:
    """The agent's part of the gate, from the snapshots an incident holds.

    Only snapshots observed at or after `since` (the machine stopped, or the repair ended)
    and, when `old_boot_id` is known (the machine rebooted or was replaced), from another
    boot count as fresh. The gate fails at once when a fresh snapshot still shows one of
    the incident's faults; it passes on the latest fresh snapshot when that one shows the
    expected GPU count, no fault seen since the repair and every InfiniBand port healthy;
    otherwise it waits (and the caller fails it at its timeout).
    """
    ours = set(incident_faults)
    fresh = sorted(
        (
            s
            for s in snapshots
            if s.observed_at >= since and (old_boot_id is None or s.boot_id != old_boot_id)
        ),
        key=lambda s: s.observed_at,
    )
    at = since.isoformat(timespec="seconds")
    if not fresh:
        return Judgement(
            verdict="waiting",
            checks=[
                HealthCheck(
                    name="agent_report",
                    passed=False,
                    detail=f"no agent report observed since {at}"
                    + (f" from a boot other than {old_boot_id}" if old_boot_id else ""),
                )
            ],
        )
    persisting = [(s, f) for s in fresh for f in s.faults if f.fault in ours and f.last_at >= since]
    if persisting:
        s, f = persisting[0]
        return Judgement(
            verdict="failed",
            checks=[
                HealthCheck(
                    name="agent_report",
                    passed=True,
                    detail=f"{s.backend} agent, boot {s.boot_id or '?'}, "
                    f"observed {s.observed_at.isoformat(timespec='seconds')}",
                ),
                HealthCheck(
                    name="gpu_faults",
                    passed=False,
                    detail=f"{f.fault} still reported by the agent after the repair"
                    + (f": {f.message}" if f.message else ""),
                ),
            ],
        )
    last = fresh[-1]
    want = expected_gpus if expected_gpus is not None else last.expected_gpus
    recent = [f.fault for f in last.faults if f.last_at >= since]
    bad_ports = [p for p in last.infiniband or [] if not p.healthy]
    gpus_ok = last.gpu_count is not None and last.gpu_count > 0
    gpus_ok = gpus_ok and (want is None or last.gpu_count == want)
    ports = last.infiniband
    checks = [
        HealthCheck(
            name="agent_report",
            passed=True,
            detail=f"{last.backend} agent, boot {last.boot_id or '?'}, "
            f"observed {last.observed_at.isoformat(timespec='seconds')}",
        ),
        HealthCheck(
            name="agent_gpu_count",
            passed=gpus_ok,
            detail=f"{last.gpu_count} of {want if want is not None else '?'} GPUs seen",
        ),
        HealthCheck(name="gpu_faults", passed=not recent, detail=", ".join(recent) or "none"),
        HealthCheck(
            name="infiniband",
            passed=not bad_ports,
            detail=(
                "no InfiniBand"
                if ports is None
                else (
                    ", ".join(f"{p.hca}/{p.port} {p.state} {p.phys_state}" for p in bad_ports)
                    or f"{len(ports)} port(s) active"
                )
            ),
        ),
    ]
    verdict: Verdict = "passed" if all(c.passed for c in checks) else "waiting"
    return Judgement(verdict=verdict, checks=checks)
