"""What every part of the sharing workflow is given (workflows/sharing/): its cluster, policy
and the state it carries across continue-as-new, the move running now, and the step kernel
its activities run on outside a move. The parts take this explicitly and return what the
workflow acts on.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from autoclusters.core.sharing import (
        Move,
        MoveCall,
        MoveRecord,
        Pool,
        SharingInput,
        SharingState,
    )

from autoclusters.workflows.sharing.notices import Notices
from autoclusters.workflows.steps import Defaults, Steps, Unrecorded

RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=5,
    non_retryable_error_types=["UnknownNode", "NodeNotOurs"],
)
STEP_TIMEOUT = timedelta(minutes=5)


class SharingRun:
    """One cluster's sharing workflow: what it carries, and the move it runs now."""

    def __init__(self, inp: SharingInput) -> None:
        self.cluster = inp.cluster
        self.policy = inp.policy  # a person may set another (`set_policy`)
        self.state = inp.state or SharingState()
        self.current: MoveRecord | None = None  # the move running now
        self.running_step: str | None = None  # its step running now
        # The sharing workflow's activities outside a move; a move's steps are on its record.
        self.steps = Steps(Unrecorded(), Defaults(STEP_TIMEOUT, RETRY))
        self.notices = Notices(self.cluster, self.steps)

    def carried(self) -> SharingInput:
        """What the next run starts from (continue-as-new)."""
        return SharingInput(cluster=self.cluster, policy=self.policy, state=self.state)

    def inference_count(self) -> int:
        return sum(1 for p in self.state.pools.values() if p == Pool.INFERENCE)

    def next_move_id(self) -> str:
        self.state.seq += 1
        return f"{self.cluster}-move-{self.state.seq}"

    def call(self, move: Move) -> MoveCall:
        """The input of a move's step."""
        return MoveCall(
            cluster=self.cluster, node=move.node, move_id=move.move_id, policy=self.policy
        )

    def ready_timeout(self) -> timedelta:
        """How long a step that waits for inference pods may take (ready, or drained)."""
        return timedelta(seconds=self.policy.ready_timeout_s + 60)

    def moving(self, node: str) -> bool:
        """Is the move running now on `node`?"""
        return self.current is not None and self.current.move.node == node
