"""One owner per node: a remediation incident that opens on a node the sharing workflow holds
(lent, or moving) asks for it (`yield_node`), gets it once the move's current step has
finished, and the move stops there. The node then leaves the inference pool for good.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from autoclusters.activities import contracts
    from autoclusters.core.sharing import MoveCall, Pool, YieldCall, YieldResult

from autoclusters.workflows.sharing.run import SharingRun


async def hand_over(sh: SharingRun, call: YieldCall) -> YieldResult:
    """The incident gets the node once the move on it (if any) has stopped."""
    s = sh.state
    pool = s.pools.get(call.node)
    if pool not in (Pool.INFERENCE, Pool.MOVING) and call.node not in s.yielded:
        return YieldResult(held=False, pool_before=pool)
    s.yielded[call.node] = call.incident_id
    waited = sh.running_step if sh.moving(call.node) else None
    await workflow.wait_condition(lambda: not sh.moving(call.node))
    return YieldResult(held=True, pool_before=pool, waited_for_step=waited)


async def settle_yielded(sh: SharingRun) -> None:
    """A node an incident took is no longer lent: its Kubernetes side goes back to the
    training pool and the Deployment no longer counts it (the incident cordons it and
    evicts its pod; this keeps the pod from being recreated there)."""
    s = sh.state
    for node, incident in list(s.yielded.items()):
        if sh.moving(node):
            continue
        # A node yielded while lent (no move to end) is out of the inference pool too:
        # the Deployment keeps a replica per node still lent, not one for this node.
        s.pools.pop(node, None)
        call = MoveCall(
            cluster=sh.cluster,
            node=node,
            move_id=f"yield-{incident}",
            policy=sh.policy,
            replicas=sh.inference_count(),
        )
        try:
            await sh.steps.call(
                contracts.share_scale_inference,
                call,
                f"scale inference to {call.replicas} without {node} (incident {incident})",
            )
            await sh.steps.call(
                contracts.share_k8s_reclaim,
                call,
                f"give {node} back to the training pool (incident {incident})",
            )
        except ActivityError as e:
            workflow.logger.warning("settling %s after incident %s: %s", node, incident, e)
            return  # tried again at the next turn
        del s.yielded[node]
