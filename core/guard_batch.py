"""Many incidents' fleet-guard calls in one update (`FleetGuard.batch`).

Temporal takes at most 10 updates in flight per workflow, and the guard is one workflow
per cluster: at a thousand concurrent incidents, one update per call ran into that limit
and incidents failed on it. A worker process now sends the calls its activities make at
the same moment together, a couple of batches in flight per cluster; the guard answers each item
as its own update would have, in order, all within one workflow task.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator

from autoclusters.core.guard import (
    Admission,
    AdmitRequest,
    IncidentOpened,
    Registration,
    ReleaseRequest,
)

BatchedUpdate = Literal[
    "register", "admit_quarantine", "admit_repair", "admit_held_drain", "release"
]
# Calls per batch: about half a KiB each, and Slurm's view (the nodes out of service) once
# per batch: far below Temporal's 2 MB limit on a payload.
MAX_BATCH_ITEMS = 100


class GuardCall(BaseModel):
    """One call, as its own update would have sent it."""

    update: BatchedUpdate
    opened: IncidentOpened | None = None
    admit: AdmitRequest | None = None
    release: ReleaseRequest | None = None

    @model_validator(mode="after")
    def _one_argument(self) -> GuardCall:
        want = {"register": "opened", "release": "release"}.get(self.update, "admit")
        given = [k for k in ("opened", "admit", "release") if getattr(self, k) is not None]
        if given != [want]:
            raise ValueError(f"{self.update} takes `{want}` only, got {given}")
        return self


class GuardBatch(BaseModel):
    calls: list[GuardCall] = Field(min_length=1, max_length=MAX_BATCH_ITEMS)


class GuardAnswer(BaseModel):
    """What the call's own update would have answered, or why the guard refused it (what
    its validator would have said: the call was malformed)."""

    registration: Registration | None = None
    admission: Admission | None = None
    refused: str | None = None
