"""What a source said about a fault, kept on the incident: an alert's labels and annotations
(summary, description, runbook link, the GPU's UUID and PCI bus id), when it started, and
the node agent's readings; and the word that a fault cleared.

Everything is bounded (a label set or an annotation can be any size on the wire), so an
incident's history stays small whatever an alert carries. Text is kept as given: Unicode
(Japanese, emoji) passes through untouched.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, Field

MAX_ENTRIES = 32  # labels, annotations
MAX_KEY = 128
MAX_VALUE = 1024
MAX_TEXT = 4000  # summary, description
MAX_READINGS_BYTES = 8192
KEEP_PER_FAULT = 5  # the first evidence, and the latest ones


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def bounded_map(values: Mapping[str, Any]) -> dict[str, str]:
    """At most MAX_ENTRIES entries, keys and values cut to size, sorted by key."""
    out: dict[str, str] = {}
    for k in sorted(values)[:MAX_ENTRIES]:
        out[_cut(str(k), MAX_KEY)] = _cut(str(values[k]), MAX_VALUE)
    return out


def bounded_readings(readings: Mapping[str, Any]) -> dict[str, Any]:
    blob = json.dumps(readings, ensure_ascii=False, default=str)
    if len(blob.encode()) <= MAX_READINGS_BYTES:
        return dict(json.loads(blob))
    return {"truncated": True, "bytes": len(blob.encode())}


def utc(at: datetime) -> datetime:
    """The same instant in UTC (a naive time is taken as UTC): `+09:00` and `Z` compare equal."""
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)


class FaultEvidence(BaseModel):
    """One source's account of a fault."""

    source: str  # alertmanager, agent, cli
    key: str = Field(default="", max_length=256)  # the alert's fingerprint+start, report id
    starts_at: datetime | None = None  # when the source saw it start (the alert's startsAt)
    summary: str = Field(default="", max_length=MAX_TEXT)
    description: str = Field(default="", max_length=MAX_TEXT)
    runbook_url: str = Field(default="", max_length=MAX_VALUE)
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    readings: dict[str, Any] = Field(default_factory=dict)  # the agent's evidence

    @classmethod
    def from_alert(
        cls,
        *,
        key: str,
        starts_at: datetime,
        labels: Mapping[str, str],
        annotations: Mapping[str, str],
    ) -> FaultEvidence:
        return cls(
            source="alertmanager",
            key=_cut(key, 256),
            starts_at=utc(starts_at),
            summary=_cut(annotations.get("summary", ""), MAX_TEXT),
            description=_cut(annotations.get("description", ""), MAX_TEXT),
            runbook_url=_cut(annotations.get("runbook_url", ""), MAX_VALUE),
            labels=bounded_map(labels),
            annotations=bounded_map(annotations),
        )

    @classmethod
    def from_agent(
        cls, *, key: str, since: datetime, message: str, readings: Mapping[str, Any]
    ) -> FaultEvidence:
        return cls(
            source="agent",
            key=_cut(key, 256),
            starts_at=utc(since),
            summary=_cut(message, MAX_TEXT),
            readings=bounded_readings(readings),
        )

    def headline(self) -> str:
        """One line for people: the summary and the runbook link, when the source gave them."""
        parts = [self.summary] if self.summary else []
        if self.runbook_url:
            parts.append(f"runbook: {self.runbook_url}")
        return " — ".join(parts)


class FaultCleared(BaseModel):
    """A source says a fault stopped holding (a resolved alert, an agent's resolved report).

    Recorded on the incident; it never stops a repair already decided (a GPU that fell off
    the bus and came back is still suspect)."""

    fault: str
    source: str
    key: str = Field(default="", max_length=256)
    starts_at: datetime | None = None
    resolved_at: datetime
    detail: str = Field(default="", max_length=MAX_VALUE)
