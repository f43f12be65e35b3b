"""The floor holds on the real sandbox (issue 38): a storm of critical alerts over its 4
nodes trips the breaker, and Slurm (`sinfo`, read all along) never shows fewer than the
guard's floor (half the nodes) in service, with `drain_held_critical` on. The incidents
held at the floor say why; the guard holds their drains in its queue.

It runs on the session's shared sandbox (no boot of its own) through the same client path
as the CLI and the API (update-with-start per alert), and leaves the sandbox as it found it:
incidents cancelled, nodes resumed, the breaker reset, the sandbox's guard policy back.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle

from autoclusters.clients import breaker, incidents
from autoclusters.clients.inventory import StaticInventory
from autoclusters.core.guard import PolicyUpdate, floor_of, guard_workflow_id
from autoclusters.core.models import IncidentState, drain_reason, workflow_id
from autoclusters.core.policy import GuardPolicy
from autoclusters.core.settings import Settings
from autoclusters.integrations.slurm import SlurmCli
from autoclusters.sandbox.runtime import api_tokens
from autoclusters.sandbox.runtime.config import SandboxConfig
from autoclusters.workflows.fleet_guard import FleetGuard
from autoclusters.workflows.remediation import NodeRemediation
from tests.helpers import eventually, fresh_policy

pytestmark = pytest.mark.integration  # the session's real sandbox

ALERTS_PER_NODE = 10
Incident = WorkflowHandle[NodeRemediation, IncidentState]
AT_THE_FLOOR = "held: drain not allowed, the cluster is at its floor (2 of 4 in service)"


async def test_a_storm_over_the_sandbox_leaves_at_least_the_floor_in_service(
    sandbox: SandboxConfig, sandbox_settings: Settings, sandbox_client: Client, slurm: SlurmCli
) -> None:
    nodes = sandbox.node_names()
    sandbox_guard = fresh_policy().guard
    # The sandbox's policy (half the nodes in service), a breaker that trips at once.
    policy = fresh_policy(guard=sandbox_guard.model_copy(update={"breaker_threshold": 1}))
    assert policy.guard.drain_held_critical and policy.guard.below_floor == []
    floor = floor_of(policy.guard, len(nodes))
    assert (len(nodes), floor) == (4, 2)
    in_service: list[int] = []  # what sinfo showed, all along
    done = asyncio.Event()

    async def look() -> None:
        shown = await slurm.nodes()
        in_service.append(sum(1 for n in shown if n.responding and not n.drained))

    async def watch() -> None:
        while not done.is_set():
            await look()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), 0.5)  # the sampling interval

    watcher = asyncio.create_task(watch())
    handles: dict[str, Incident] = {
        n: sandbox_client.get_workflow_handle_for(
            NodeRemediation.run, workflow_id(sandbox.cluster, n)
        )
        for n in nodes
    }
    try:
        known = StaticInventory(nodes)  # the API's inventory read once, not per alert
        await asyncio.gather(
            *(
                incidents.open_incident(
                    sandbox_client,
                    sandbox_settings,
                    node,
                    ("XID_79", "XID_48")[i % 2],
                    "alertmanager",
                    policy,
                    inventory=known,
                    key=f"storm-{node}-{i}",
                )
                for node in nodes
                for i in range(ALERTS_PER_NODE)
            )
        )

        async def settled() -> dict[str, IncidentState] | None:
            states = {n: await h.query(NodeRemediation.status) for n, h in handles.items()}
            told = all(
                st.waiting_for is not None
                and st.waiting_for.kind == "admission"
                and (step := st.step("notify_held")) is not None
                and step.finished_at is not None
                for st in states.values()
            )
            return states if told else None

        states = await eventually(settled, 120, "every incident quarantined or held")
        await look()  # once more, after the last step
        guard = await breaker.breaker_status(sandbox_client, sandbox.cluster)

        assert guard.state.breaker.tripped
        assert in_service and min(in_service) >= floor, in_service  # the floor held
        waiting = {n: st.waiting_for for n, st in states.items() if st.waiting_for}
        held = sorted(n for n, w in waiting.items() if w.step == "quarantine")
        assert len(held) == 2, waiting
        for node in held:
            assert waiting[node].detail.startswith(AT_THE_FLOOR)
            assert states[node].step("drain_held") is None
            shown = await slurm.node(node)
            assert shown is not None and not shown.drained  # still in service
        assert sorted(w.node for w in guard.state.queue if w.kind == "held_drain") == held
        assert guard.state.held_drained == {}
    finally:
        done.set()
        await watcher
        await _leave_as_found(sandbox, sandbox_client, slurm, handles, sandbox_guard)
    after = await breaker.breaker_status(sandbox_client, sandbox.cluster)
    assert not after.state.breaker.tripped and after.policy == sandbox_guard
    assert not [n.name for n in await slurm.nodes() if n.drained]


async def _leave_as_found(
    sandbox: SandboxConfig,
    client: Client,
    slurm: SlurmCli,
    handles: dict[str, Incident],
    guard: GuardPolicy,
) -> None:
    """Cancel the storm's incidents, resume what they drained, reset the breaker and give
    the guard the sandbox's own policy back: the next test finds the sandbox as it was."""
    ours: list[str] = []
    for h in handles.values():
        with contextlib.suppress(Exception):  # never started, or closed already
            st = await h.query(NodeRemediation.status)
            ours.append(drain_reason(st.request.incident_id, ""))
            await h.cancel()
    for h in handles.values():
        with contextlib.suppress(WorkflowFailureError):
            await h.result()
    for n in await slurm.nodes():
        if n.drained and any(n.reason.startswith(r) for r in ours):
            await slurm.resume(n.name)  # left drained by the cancel, for a human: us
    with contextlib.suppress(breaker.BreakerNotTripped):
        key = api_tokens.read(sandbox, api_tokens.APPROVAL_KEY)  # as the sandbox's API signs
        await breaker.reset_breaker(
            client, sandbox.cluster, sandbox.approvers[0], key=key, via="token:tests"
        )
    handle = client.get_workflow_handle_for(FleetGuard.run, guard_workflow_id(sandbox.cluster))
    await handle.execute_update(FleetGuard.update_policy, PolicyUpdate(policy=guard))
