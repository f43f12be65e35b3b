"""The report a node agent sends: `POST {api}/v1/reports` with a `NodeReport` JSON body.

Shared by the agent (which builds and sends it) and the API (which accepts exactly this
model): in core, below both, so neither imports the other; it imports only pydantic, the
standard library and core, which keeps the agent light.

One report says that one fault kind on one node started (`firing`) or stopped
(`resolved`) holding. A fault that keeps holding is re-sent as `firing` every re-report
interval with a higher `sequence`. Invariants the API may rely on:

- `report_id` is stable: a retried or replayed report (after an outage or an agent restart)
  carries the same id, so the API deduplicates on it. It is derived from
  (node, fault, since, state, sequence).
- `episode_id` is the same for every report of one firing period (its firing, re-reports
  and the resolved that ends it), derived from (node, fault, since).
- Reports of one node arrive in the order the agent made them (the spool replays in order).
- Unknown fields are ignored, so an agent newer than the API still gets through.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import StrEnum
from importlib import metadata
from typing import Annotated, Any

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field

from autoclusters.core.evidence import ActiveFault, HealthSnapshot, IbPortState
from autoclusters.core.faults import FAULT_PATTERN, NODE_PATTERN

__all__ = [
    "AGENT_VERSION", "REPORTS_PATH", "SNAPSHOTS_PATH", "ActiveFault", "HealthSnapshot",
    "IbPortState", "NodeReport", "ReportState", "episode_id", "report_id",
]  # fmt: skip

REPORTS_PATH = "/v1/reports"
# The agent's periodic health snapshot (`HealthSnapshot`, in core so that the incident
# workflow, which judges it, shares the model): `POST {api}/v1/health-snapshots`.
SNAPSHOTS_PATH = "/v1/health-snapshots"

# A fixed namespace: the same inputs give the same ids on every agent and across restarts.
_ID_NAMESPACE = uuid.UUID("6f1d3c0e-9a51-4d7e-8f43-2b8a4c9e0d17")


def _version() -> str:
    try:
        return metadata.version("autoclusters")
    except metadata.PackageNotFoundError:
        return "0+unknown"


AGENT_VERSION = _version()


def _fault(v: str) -> str:
    if not FAULT_PATTERN.match(v):
        raise ValueError(f"{v!r} is not a fault kind (XID_<n> or an upper-case name)")
    return v


def _node(v: str) -> str:
    if not NODE_PATTERN.match(v):
        raise ValueError(f"{v!r} is not a node name")
    return v


class ReportState(StrEnum):
    FIRING = "firing"
    RESOLVED = "resolved"


def episode_id(node: str, fault: str, since: datetime) -> str:
    """The id shared by every report of one firing period of `fault` on `node`."""
    return str(uuid.uuid5(_ID_NAMESPACE, f"{node}|{fault}|{since.isoformat()}"))


def report_id(
    node: str, fault: str, since: datetime, state: ReportState | str, sequence: int
) -> str:
    """The dedupe key of one report; the same inputs always give the same id."""
    key = f"{node}|{fault}|{since.isoformat()}|{ReportState(state).value}|{sequence}"
    return str(uuid.uuid5(_ID_NAMESPACE, key))


class NodeReport(BaseModel):
    """One fault kind on one node started or stopped holding.

    Fields:
        report_id: dedupe key, stable across retries, replays and agent restarts.
        episode_id: shared by the firing, re-reports and resolved of one firing period.
        node: the node (Slurm/Kubernetes node name) the agent runs on.
        fault: a policy fault kind: XID_<n>, GPU_FELL_OFF_BUS, ECC_DBE, IB_LINK_DOWN, ...
        state: firing (the fault holds) or resolved (it held and has now cleared).
        observed_at: when the check that produced this report ran (UTC).
        since: when the fault was first seen in this firing period (UTC).
        sequence: 0 for the first firing report, +1 per re-report; a resolved report carries
            the sequence of the last firing report before it.
        message: one line for humans, e.g. "GPU 3 (GPU-1a2b...): 2 uncorrected volatile ECC
            errors".
        evidence: what was read: {"subjects": [{"gpu": 3, "uuid": ..., <counters>}, ...]},
            plus "backend" (nvml or fake); on a resolved report, the evidence last seen.
        agent_version: the autoclusters version of the agent.
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    report_id: str = Field(min_length=1, max_length=64)
    episode_id: str = Field(min_length=1, max_length=64)
    node: Annotated[str, AfterValidator(_node)]
    fault: Annotated[str, AfterValidator(_fault)]
    state: ReportState
    observed_at: AwareDatetime
    since: AwareDatetime
    sequence: int = Field(default=0, ge=0)
    message: str = ""
    evidence: dict[str, Any] = Field(default_factory=dict)
    agent_version: str = AGENT_VERSION

    @classmethod
    def build(
        cls,
        *,
        node: str,
        fault: str,
        state: ReportState | str,
        observed_at: datetime,
        since: datetime,
        sequence: int = 0,
        message: str = "",
        evidence: dict[str, Any] | None = None,
    ) -> NodeReport:
        """A report with its ids derived from its content."""
        return cls(
            report_id=report_id(node, fault, since, state, sequence),
            episode_id=episode_id(node, fault, since),
            node=node,
            fault=fault,
            state=ReportState(state),
            observed_at=observed_at,
            since=since,
            sequence=sequence,
            message=message,
            evidence=evidence or {},
        )
