"""What the sharing workflow tells people: a move's messages under the move's id, a borrow's in
the Slack thread of the incident it serves. A notification never blocks a move.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from autoclusters.activities import contracts
    from autoclusters.core.models import Notification
    from autoclusters.core.sharing import SHARING_FAULT, Borrow, Move, MoveRecord

from autoclusters.workflows.steps import NOTIFY_RETRY, Steps


class Notices:
    """The sharing workflow's notifications, sent through its step kernel."""

    def __init__(self, cluster: str, steps: Steps) -> None:
        self._cluster = cluster
        self._steps = steps

    async def move(self, move: Move, event: str, text: str, severity: str) -> None:
        """A move's message (its id in place of an incident's)."""
        await self._tell(move.move_id, move.node, SHARING_FAULT, event, text, severity)

    async def outcome(self, rec: MoveRecord) -> None:
        """How a move people were asked about ended."""
        move = rec.move
        if rec.status == "done":
            by = f", approved by {rec.approved_by}" if rec.approved_by else ""
            text = f"move {move.move_id}: {move.node} is now in {move.to}{by}."
            await self.move(move, "move_done", text, "info")
        else:
            text = f"move {move.move_id}: {move.node} stays where it was: {rec.error}."
            await self.move(move, "move_stopped", text, "info")

    async def borrow(self, out: Borrow, event: str, text: str, severity: str) -> None:
        """A borrow is told in the incident's own Slack thread (its id), not a move's."""
        fault = out.fault or "unknown"
        await self._tell(out.incident_id, out.for_node, fault, event, text, severity)

    async def _tell(
        self, thread: str, node: str, fault: str, event: str, text: str, severity: str
    ) -> None:
        """`thread`: the id whose Slack thread it goes to (a move's, or an incident's)."""
        note = Notification(
            incident_id=thread,
            cluster=self._cluster,
            node=node,
            fault=fault,
            event=event,
            text=text,
            severity=severity,
        )
        await self.send(note)

    async def send(self, note: Notification) -> None:
        try:
            await self._steps.call(
                contracts.notify,
                note,
                f"notify {note.event.replace('_', ' ')}: {note.node} ({note.incident_id})",
                timeout=timedelta(seconds=30),
                heartbeat=None,
                retry=NOTIFY_RETRY,
            )
        except ActivityError as e:  # a notification never blocks a move
            workflow.logger.warning("notify failed: %s", e)
