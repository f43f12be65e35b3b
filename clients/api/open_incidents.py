"""Which node has an incident open, as this API process last heard from Temporal.

An alert storm is mostly more of the same: the fault a node's open incident already has,
fired again (another GPU, a new startsAt, the agent's report beside Alertmanager's). Such
an alert joins that incident whatever it says, so waiting for Temporal to confirm it
adds latency and nothing else. After every report an incident accepted (its validator
refuses reports once it is not open), the node's entry says: incident X was open, with
these fault kinds, as of the moment that call was sent. For `ttl_s` after that, an alert
of one of those kinds is answered `joined` at once and delivered afterwards (see Intake).

A fault kind the incident does not have always goes to Temporal before the answer (it
may raise the rung). Any failed delivery to the node forgets its entry. Per process:
each API replica learns for itself, and Temporal stays the only shared truth.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class OpenIncident:
    incident_id: str
    workflow_id: str
    faults: set[str] = field(default_factory=set)
    as_of: float = 0.0  # time.monotonic() when the call that said so was sent
    run_id: str = ""  # its workflow run, where the answer said


class OpenIncidents:
    def __init__(self, ttl_s: float, max_nodes: int = 100_000) -> None:
        self._ttl_s = ttl_s
        self._max = max_nodes
        self._by_node: dict[str, OpenIncident] = {}
        # node -> when a call to it failed: older news of it being open is stale.
        self._failed_at: dict[str, float] = {}

    def __len__(self) -> int:
        return len(self._by_node)

    def joined(self, node: str, fault: str) -> OpenIncident | None:
        """The node's open incident if it has `fault` and was open less than ttl_s ago."""
        entry = self.open_on(node)
        return entry if entry is not None and fault in entry.faults else None

    def open_on(self, node: str) -> OpenIncident | None:
        """The node's incident if it was open less than ttl_s ago."""
        entry = self._by_node.get(node)
        if entry is None or time.monotonic() - entry.as_of > self._ttl_s:
            return None
        return entry

    def learn(
        self,
        node: str,
        incident_id: str,
        workflow_id: str,
        fault: str,
        as_of: float,
        run_id: str = "",
    ) -> None:
        """The incident (its run `run_id`) took a report of `fault` in a call sent at
        `as_of`."""
        if self._ttl_s <= 0 or as_of < self._failed_at.get(node, -1.0):
            return
        entry = self._by_node.get(node)
        if entry is None or entry.incident_id != incident_id:
            if entry is not None and entry.as_of > as_of:
                return  # an older call's answer: the newer incident stands
            if len(self._by_node) >= self._max:
                self._by_node.pop(next(iter(self._by_node)))
            entry = self._by_node[node] = OpenIncident(incident_id, workflow_id)
        entry.faults.add(fault)
        entry.as_of = max(entry.as_of, as_of)
        entry.run_id = run_id or entry.run_id

    def last(self, node: str) -> OpenIncident | None:
        """The node's entry however old (none after a failed call): in a storm, while a
        call to the incident is under way, that call is the check (intake.py)."""
        return self._by_node.get(node) if self._ttl_s > 0 else None

    def running(self, node: str, run_id: str, as_of: float) -> OpenIncident | None:
        """The node's entry, however old, fresh again as of `as_of`: Temporal's server said
        then that the run it was learnt from still runs (a start that found it, in a
        storm). A run that still runs is the same incident, open but for the moment it
        spends closing, when its update's check refuses what trails and the retry finds
        the node's next incident."""
        entry = self._by_node.get(node)
        if self._ttl_s <= 0 or entry is None or not run_id or entry.run_id != run_id:
            return None
        if as_of < self._failed_at.get(node, -1.0):
            return None
        entry.as_of = max(entry.as_of, as_of)
        return entry

    def forget(self, node: str) -> None:
        """A call to the node's incident failed (closing, gone, Temporal unreachable): ask
        Temporal again, and take no news sent before now (a call still in flight)."""
        self._by_node.pop(node, None)
        if self._ttl_s > 0:
            self._failed_at.pop(node, None)
            self._failed_at[node] = time.monotonic()
            now = time.monotonic()
            while self._failed_at:  # only news younger than ttl_s could be taken anyway
                oldest, at = next(iter(self._failed_at.items()))
                if now - at <= self._ttl_s and len(self._failed_at) <= self._max:
                    break
                del self._failed_at[oldest]
