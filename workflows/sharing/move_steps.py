"""One step of a move on the step kernel (workflows/steps.py): recorded as a MoveStep on
the move's record, shown in the Temporal UI in the operator's words, and the step a
yielding incident waits for while it runs. An incident that took the node stops the move
before its next step starts.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, TypeVar

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from autoclusters.core.models import StepRecord
    from autoclusters.core.sharing import MoveRecord, MoveStep

from autoclusters.workflows.sharing.run import STEP_TIMEOUT, SharingRun
from autoclusters.workflows.steps import Steps

T = TypeVar("T")

# What each step of a move does to its node, as the Temporal UI shows it.
MOVE_SUMMARIES = {
    "drain": "drain {node} in Slurm to lend it to inference",
    "checkpoint_and_requeue": "checkpoint and requeue the jobs on {node}",
    "k8s_lend": "hand {node} to Kubernetes inference (label, lift the pool taint)",
    "scale_up_inference": "scale inference up onto {node}",
    "wait_serving": "wait until the inference replica on {node} serves",
    "mark_lent": "mark {node} lent in Slurm",
    "scale_down_inference": "scale inference down off {node}",
    "k8s_reclaim": "give {node} back to the training pool in Kubernetes",
    "health_gate": "health-gate {node} before it returns to training",
    "resume_in_slurm": "resume {node} in Slurm",
    "regrow_jobs": "requeue the narrowed training jobs so they regrow onto {node}",
}


class MoveStopped(Exception):
    """The move ends early: an incident took the node, or a human said no."""


class MoveLog:
    """The StepLog of a move: its steps are MoveSteps on the move's record, and the step
    running now is what a yielding incident waits for."""

    def __init__(self, sh: SharingRun, rec: MoveRecord) -> None:
        self._sh, self._rec = sh, rec
        self._open: dict[int, MoveStep] = {}

    @property
    def current_step(self) -> str | None:
        return self._sh.running_step

    @current_step.setter
    def current_step(self, name: str | None) -> None:
        self._sh.running_step = name

    def begin(self, name: str) -> StepRecord:
        step = MoveStep(name=name, started_at=workflow.now().timestamp())
        self._rec.steps.append(step)
        rec = StepRecord(name=name, started_at=workflow.now())
        self._open[id(rec)] = step
        return rec

    def end(self, rec: StepRecord) -> None:
        step = self._open.pop(id(rec))
        step.ok, step.detail = rec.outcome == "ok", rec.detail
        step.finished_at = workflow.now().timestamp()


def stop_if_taken(sh: SharingRun, node: str) -> None:
    """An incident took the node: the move stops here."""
    if node in sh.state.yielded:
        raise MoveStopped(f"incident {sh.state.yielded[node]} took the node")


async def move_step(
    sh: SharingRun,
    rec: MoveRecord,
    name: str,
    fn: Callable[..., Awaitable[T]],
    arg: Any,
    *,
    timeout: timedelta = STEP_TIMEOUT,
) -> T:
    """One step of a move, recorded on it (the step kernel); an incident that took the
    node meanwhile stops the move before the next step starts."""
    stop_if_taken(sh, rec.move.node)
    steps = Steps(MoveLog(sh, rec), sh.steps.defaults)
    what = MOVE_SUMMARIES.get(name, name.replace("_", " ") + " {node}")
    summary = f"{what.format(node=rec.move.node)} (move {rec.move.move_id})"
    return await steps.activity(
        name,
        fn,
        arg,
        summary,
        lambda out: str(getattr(out, "detail", "") or ""),
        timeout=max(timeout, STEP_TIMEOUT),
    )
