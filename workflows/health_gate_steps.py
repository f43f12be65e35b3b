"""The health gate that proves the hardware: Slurm's side and the agent's.

After a repair the node passes only when slurmd registered again and answers with all its
GPUs (the `health_gate` activity) AND the node's own agent has sent a snapshot observed
after the machine came back (after it stopped, from another boot; after a GPU reset: after
the Slurm check) that shows the expected GPU count, no fault seen since, every InfiniBand
port healthy, and none of the incident's faults. Snapshots reach the incident through the
`health_evidence` update (the API forwards them); the gate waits for a fresh healthy one up
to the policy's `agent_report_timeout_s`, and fails at once when a fresh one still shows a
fault of the incident. Judging is `core.evidence.judge`: pure, so deterministic.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from autoclusters.activities import contracts
    from autoclusters.core.evidence import EvidenceAck, HealthSnapshot, Judgement, judge
    from autoclusters.core.models import (
        HealthGateInput,
        HealthReport,
        IncidentState,
        RepairResult,
        Waiting,
    )
    from autoclusters.core.policy import Policy

from autoclusters.workflows.timeline import HEARTBEAT, STEP_RETRY, Timeline

KEEP_SNAPSHOTS = 30  # the latest ones; older ones cannot be fresh for a gate still to come
KEEP_BOOTS = 20


class HealthGateSteps(Timeline):
    _state: IncidentState
    _policy: Policy
    # Set in the runbook's __init__: the latest snapshots kept, and every boot id seen with
    # when it was first seen (a machine's identity).
    _agent_snapshots: list[HealthSnapshot]
    _agent_boots: dict[str, datetime]

    # --- evidence in ---------------------------------------------------------------------

    def _evidence_is_news(self, snap: HealthSnapshot) -> bool:
        """Worth a place in the history: anything while the gate waits for it; otherwise
        only what changes the picture (another boot, GPUs, fault kinds, ports). Agents
        send every few seconds; an incident held for days must not record each one."""
        waiting = self._state.waiting_for
        if waiting is not None and waiting.kind == "agent_report":
            return True
        ev = self._agent_snapshots
        return not ev or _gist(snap) != _gist(ev[-1])

    def _take_evidence(self, snap: HealthSnapshot) -> EvidenceAck:
        ev, req = self._agent_snapshots, self._state.request
        kept = snap.node == req.node and all(s.snapshot_id != snap.snapshot_id for s in ev)
        if kept:
            ev.append(snap)
            del ev[:-KEEP_SNAPSHOTS]
            boots = self._agent_boots
            if snap.boot_id and (
                snap.boot_id not in boots or snap.observed_at < boots[snap.boot_id]
            ):
                boots[snap.boot_id] = snap.observed_at
                for old in sorted(boots, key=boots.__getitem__)[:-KEEP_BOOTS]:
                    del boots[old]
        return EvidenceAck(incident_id=req.incident_id, kept=kept, snapshots=len(ev))

    # --- the gate ------------------------------------------------------------------------

    async def _health_gate(self, done: RepairResult) -> HealthReport:
        s = self._state
        node = s.request.node

        async def gate() -> HealthReport:
            slurm: HealthReport = await workflow.execute_activity(
                contracts.health_gate,
                HealthGateInput(node=node),
                start_to_close_timeout=timedelta(minutes=2),
                heartbeat_timeout=HEARTBEAT,
                retry_policy=STEP_RETRY,
            )
            if done.stopped_at is not None:
                since = datetime.fromtimestamp(done.stopped_at, UTC)
                old_boot = self._boot_before(since)
            else:  # a GPU reset: the machine stayed up; evidence from after the reset
                at = slurm.checked_at
                since = datetime.fromtimestamp(at, UTC) if at is not None else workflow.now()
                old_boot = None
            faults = [f.fault for f in s.faults]

            def now() -> Judgement:
                return judge(
                    self._agent_snapshots,
                    since=since,
                    old_boot_id=old_boot,
                    expected_gpus=slurm.expected_gpus,
                    incident_faults=faults,
                )

            timeout = self._policy.agent_report_timeout_s
            if slurm.passed and now().verdict == "waiting":
                s.waiting_for = Waiting(
                    kind="agent_report",
                    step="health_gate",
                    detail=f"a healthy report from {node}'s agent, up to {timeout:.0f}s",
                    since=workflow.now(),
                )
                try:
                    await workflow.wait_condition(
                        lambda: now().verdict != "waiting", timeout=timedelta(seconds=timeout)
                    )
                except TimeoutError:
                    pass
                finally:
                    s.waiting_for = None
            j = now()
            agent = j.checks
            if slurm.passed and j.verdict == "waiting":
                waited = f"{agent[0].detail} (waited {timeout:.0f}s)"
                agent = [agent[0].model_copy(update={"detail": waited}), *agent[1:]]
            checks = [*slurm.checks, *agent]
            return HealthReport(
                node=node,
                passed=slurm.passed and j.verdict == "passed",
                checks=checks,
                checked_at=slurm.checked_at,
                expected_gpus=slurm.expected_gpus,
            )

        return await self._step(
            "health_gate",
            gate,
            detail=lambda r: "passed" if r.passed else f"FAILED: {r.failures()}",
        )

    def _boot_before(self, since: datetime) -> str | None:
        """The boot the agent reported from before the machine stopped (None: unknown)."""
        before = [(first, b) for b, first in self._agent_boots.items() if first < since]
        return max(before)[1] if before else None


def _gist(snap: HealthSnapshot) -> tuple[object, ...]:
    """What a snapshot says about the machine, without when it said it."""
    ib = tuple(sorted((p.hca, p.port, p.healthy) for p in snap.infiniband or []))
    return (
        snap.boot_id,
        snap.gpu_count,
        snap.expected_gpus,
        tuple(sorted({f.fault for f in snap.faults})),
        tuple(sorted(set(snap.firing))),
        ib,
    )
