"""What a systemic incident says of its members: which nodes, which ports, which counters
(pure: the workflow builds its Slack thread and its hand-off's bundle from it)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from autoclusters.core.evidence import HealthSnapshot
from autoclusters.core.handoff import HandoffRequest, Machine
from autoclusters.core.handoff_answer import HandoffReason
from autoclusters.core.models import FaultSeen
from autoclusters.core.systemic import SystemicMember, SystemicState

# The subject fields the agent gives a port (clients/agent/classify.py); any other numeric
# field of a subject is a counter.
_PORT_FIELDS = {"hca", "port", "state", "phys_state"}


def _subject_text(s: dict[str, Any]) -> str:
    where = f"{s.get('hca', '?')} port {s.get('port', '?')}"
    state = f"{s['state']} / {s.get('phys_state', '?')}" if "state" in s else ""
    counters = ", ".join(
        f"{k} {v}"
        for k, v in sorted(s.items())
        if k not in _PORT_FIELDS and isinstance(v, int | float)
    )
    return where + "".join(f": {x}" for x in (state, counters) if x)


def fault_text(seen: FaultSeen) -> str:
    """`IB_LINK_DOWN x2 (mlx5_0 port 1: 1: DOWN / 3: Disabled)`: the fault with the ports
    and counters its evidence names."""
    ports: list[str] = []
    for ev in seen.evidence:
        subjects = ev.readings.get("subjects")
        for s in subjects if isinstance(subjects, list) else []:
            if isinstance(s, dict) and "hca" in s:
                ports.append(_subject_text(s))
    named = list(dict.fromkeys(ports))
    return f"{seen.fault} x{seen.count}" + (f" ({'; '.join(named)})" if named else "")


def unhealthy_ports(readings: list[HealthSnapshot]) -> list[str]:
    """The unhealthy ports of the latest snapshot: `mlx5_0/1 1: DOWN / 3: Disabled`."""
    if not readings or readings[-1].infiniband is None:
        return []
    return [
        f"{p.hca}/{p.port} {p.state or '?'} / {p.phys_state or '?'}"
        for p in readings[-1].infiniband
        if not p.healthy
    ]


def member_text(m: SystemicMember) -> str:
    """One line per member for Slack and the timeline."""
    faults = "; ".join(fault_text(f) for f in m.faults) or m.fault or "no report yet"
    ports = unhealthy_ports(m.readings)
    where = f"; ports down now: {', '.join(ports)}" if ports else ""
    state = "drained" if m.drained else "not drained yet"
    repaired = f"; its {m.repaired} had started before it joined" if m.repaired else ""
    return f"{m.node} ({m.incident_id or 'not joined'}, {state}): {faults}{where}{repaired}"


def evidence_text(state: SystemicState) -> str:
    r = state.request
    lines = [
        f"{len(state.members)} nodes of {r.level} {r.domain} faulted within the policy's "
        "window: one fault of the fabric, not of each machine; no machine is rebooted or "
        "replaced while this incident is open."
    ]
    lines += [f"- {member_text(m)}" for m in state.members]
    return "\n".join(lines)


def systemic_bundle(
    state: SystemicState, reason: HandoffReason, summary: str, at: datetime
) -> HandoffRequest:
    """The hand-off's evidence bundle: the domain as its `node`, every member's faults and
    latest readings (each member's incident id in the evidence's step list)."""
    r = state.request
    faults = [f for m in state.members for f in m.faults]
    readings = [snap for m in state.members for snap in m.readings[-1:]]
    return HandoffRequest(
        idempotency_key=r.incident_id,
        incident_id=r.incident_id,
        cluster=r.cluster,
        node=r.domain,
        fault=next((m.fault for m in state.members if m.fault), "SYSTEMIC"),
        reason=reason,
        summary=summary,
        opened_at=r.opened_at,
        handed_off_at=at,
        machine=Machine(node=r.domain),
        faults=faults,
        readings=readings,
        steps=list(state.steps),
        members=sorted(m.node for m in state.members),  # the leaf's, not arrival order
        level=r.level,
    )
