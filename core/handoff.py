"""The hand-off to the provider: what automation cannot fix goes, with its evidence, to
whoever fixes hardware, and their answer resumes the incident (docs/handoff.md).

Both directions are signed the same way, as Slack signs its requests: HMAC-SHA256 with a
shared secret over `v1:<timestamp>:<raw body>`, sent as `X-AutoClusters-Signature:
v1=<hex>` beside `X-AutoClusters-Timestamp: <unix seconds>`. A signature is checked over
the raw bytes before anything is parsed, within a window on both sides of now (a replay
from the past and a timestamp from the future are refused alike).

Stdlib and pydantic only: the workflow builds the request, the worker's activity signs and
sends it, the API and the sandbox's ticket desk verify.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from autoclusters.core.evidence import HealthSnapshot
from autoclusters.core.handoff_answer import HandoffReason
from autoclusters.core.models import (
    FaultSeen,
    HealthReport,
    IncidentState,
    ScreenResult,
    StepRecord,
)

SCHEMA = "autoclusters.handoff/v1"
TIMESTAMP_HEADER = "X-AutoClusters-Timestamp"
SIGNATURE_HEADER = "X-AutoClusters-Signature"
IDEMPOTENCY_HEADER = "Idempotency-Key"
VERSION = "v1"
# A signed request older (or newer) than this is refused: long enough for a clock a little
# off, short enough that a captured request cannot be replayed later.
WINDOW_S = 300
# A secret shorter than its hash is guessable offline from one signed request.
MIN_SECRET_CHARS = 32
ANSWER_PATH = "/v1/handoffs/{incident_id}/answer"


class SignatureRefused(ValueError):
    """A request whose signature does not hold; the message says why (never the secret)."""


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The signature header's value for `body` sent at `timestamp` (unix seconds)."""
    base = f"{VERSION}:{timestamp}:".encode() + body
    mac = hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()
    return f"{VERSION}={mac}"


def signed_headers(secret: str, timestamp: int, body: bytes) -> dict[str, str]:
    return {
        TIMESTAMP_HEADER: str(timestamp),
        SIGNATURE_HEADER: sign(secret, timestamp, body),
        "Content-Type": "application/json",
    }


def verify(
    secret: str | None,
    timestamp: str | None,
    signature: str | None,
    body: bytes,
    now: float,
    window_s: float = WINDOW_S,
) -> None:
    """Raise SignatureRefused unless `signature` is `body`'s at `timestamp`, within
    `window_s` of `now` either way. `secret` None: nothing can be verified."""
    if not secret:
        raise SignatureRefused("no hand-off secret configured: nothing can be verified")
    if not timestamp or not signature:
        raise SignatureRefused(f"missing {TIMESTAMP_HEADER} or {SIGNATURE_HEADER}")
    if not timestamp.isdigit() or len(timestamp) > 12:
        raise SignatureRefused(f"{TIMESTAMP_HEADER} is not unix seconds")
    if abs(now - int(timestamp)) > window_s:
        raise SignatureRefused(f"{TIMESTAMP_HEADER} is more than {window_s:.0f} s from now")
    if not hmac.compare_digest(sign(secret, int(timestamp), body), signature.strip()):
        raise SignatureRefused("signature does not match the body")


# --- outbound: the hand-off --------------------------------------------------------------


class Machine(BaseModel):
    node: str
    vm_id: str | None = None  # the machine now behind the node (after our last replacement)
    previous_vm_id: str | None = None


class HandoffRequest(BaseModel):
    """The body of the outbound webhook: the incident's evidence bundle. Built in the
    workflow from what the incident holds, so every retry sends the same bytes."""

    schema_: str = Field(default=SCHEMA, alias="schema")
    idempotency_key: str  # the incident id: one hand-off per incident, the receiver dedupes
    incident_id: str
    cluster: str
    node: str
    fault: str
    reason: HandoffReason
    summary: str  # one line for a person: why automation stopped
    opened_at: datetime
    handed_off_at: datetime
    # Where and how to answer (docs/handoff.md); empty when the API has no public URL.
    answer_url: str = ""
    machine: Machine
    # The fault history: each kind with its first and last sighting, count and evidence
    # (the agent's Xid history and the alerts' labels).
    faults: list[FaultSeen] = Field(default_factory=list)
    # The agent's latest readings (GPUs, InfiniBand ports, faults seen), newest last.
    readings: list[HealthSnapshot] = Field(default_factory=list)
    health_gates: list[HealthReport] = Field(default_factory=list)  # each gate's verdict
    screens: list[ScreenResult] = Field(default_factory=list)
    steps: list[StepRecord] = Field(default_factory=list)  # what the runbook did
    repair_attempts: int = 0
    # A systemic incident's hand-off (docs/systemic.md): the topology level (leaf, rack)
    # whose domain is `node`, and the member nodes (empty: one node's incident).
    level: str | None = None
    members: list[str] = Field(default_factory=list)

    model_config = ConfigDict(populate_by_name=True)

    def body(self) -> bytes:
        return self.model_dump_json(by_alias=True).encode()


class HandoffCall(BaseModel):
    """The send activity's input."""

    url: str
    request: HandoffRequest


class HandoffSent(BaseModel):
    """What the receiver said: its ticket (if it named one) and whether it had the
    hand-off already (a retry after a lost answer)."""

    status: int
    ticket: str = ""
    duplicate: bool = False
    # Epoch seconds, the worker's clock, when the receiver took it: a replacement the
    # provider answers for is a machine whose slurmd started after this.
    accepted_at: float = 0.0


# How many of the agent's latest readings go with a hand-off: the picture before and after
# the last repair, not days of repeats.
READINGS_KEPT = 5


def incident_bundle(
    state: IncidentState,
    readings: Sequence[HealthSnapshot],
    reason: HandoffReason,
    summary: str,
    at: datetime,
) -> HandoffRequest:
    """A node incident's evidence bundle, from what its state holds (pure: the workflow
    calls it, so every retry of the send carries the same body)."""
    r = state.request
    return HandoffRequest(
        idempotency_key=r.incident_id,
        incident_id=r.incident_id,
        cluster=r.cluster,
        node=r.node,
        fault=r.fault,
        reason=reason,
        summary=summary,
        opened_at=r.opened_at,
        handed_off_at=at,
        machine=Machine(node=r.node, vm_id=state.new_vm_id, previous_vm_id=state.old_vm_id),
        faults=list(state.faults),
        readings=list(readings)[-READINGS_KEPT:],
        health_gates=list(state.health),
        screens=list(state.screens),
        steps=list(state.steps),
        repair_attempts=state.repair_attempts,
    )
