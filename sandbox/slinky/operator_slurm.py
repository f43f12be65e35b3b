"""The Slurm side of the emulated Slinky NodeSet controller: what it may do to a Slurm node,
and how it reads a node's state.

Sources (github SlinkyProject/slurm-operator, HEAD f2ed3fc, 2026-08-20):
- the `slurm-operator: ` reason prefix, "ours" = no reason or a prefixed one:
  `internal/controller/nodeset/slurmcontrol/slurmcontrol.go` (`nodeReasonPrefix`,
  `IsNodeReasonOurs`);
- busy = ALLOCATED, MIXED or COMPLETING: same file, `IsNodeDrained`;
- DOWN / not responding nodes are left alone: same file, `IsNodeDownForUnresponsive`;
- the reason text is made safe (control characters out, at most 256 characters):
  `internal/controller/nodeset/nodeset_sync.go` `sanitizeSlurmReason`;
- the preStop hook's `state=down reason='slurm-operator: Pod is terminating'`:
  `internal/builder/workerbuilder/worker_app.go`.

The operator talks to slurmrestd; here it talks through the product's `SlurmClient`
interface, plus the one write that interface lacks (DOWN with a reason: the preStop hook's).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Coroutine
from typing import Any, Protocol

from autoclusters.core.models import SlurmNode
from autoclusters.integrations.slurm import SlurmCli, SlurmClient, SlurmError, SlurmUnavailable

REASON_PREFIX = "slurm-operator: "
TERMINATING_REASON = REASON_PREFIX + "Pod is terminating"
MAX_REASON = 256
BUSY_STATES = ("allocated", "mixed", "completing")


class OperatorSlurm(SlurmClient, Protocol):
    """What the operator needs of Slurm: the product's client and a DOWN with a reason."""

    async def mark_down(self, node: str, reason: str) -> None: ...


class OperatorSlurmCli(SlurmCli):
    """`SlurmCli` with the preStop hook's write (`scontrol update ... state=down`)."""

    async def mark_down(self, node: str, reason: str) -> None:
        await self._run("scontrol", "update", f"NodeName={node}", "State=DOWN", f"Reason={reason}")


def reason(text: str) -> str:
    """`slurm-operator: <text>`, the text made safe for a Slurm Reason (it may come from a
    Node annotation anyone can write)."""
    clean = "".join(
        " " if c in "\t\r\n" else c for c in text if c in "\t\r\n" or not _control(c)
    ).strip()
    return REASON_PREFIX + clean[:MAX_REASON].strip()


def _control(c: str) -> bool:
    return unicodedata.category(c) == "Cc"


def ours(node: SlurmNode) -> bool:
    """A reason the operator may change: none, or one it set (a drain by anyone else, an
    admin's or AutoClusters' own `autoclusters:` drain, is never modified)."""
    return not node.reason or node.reason.startswith(REASON_PREFIX)


def drained_by_us(node: SlurmNode) -> bool:
    return node.drained and node.reason.startswith(REASON_PREFIX)


def busy(node: SlurmNode) -> bool:
    """Jobs still on it: a scale-in waits for them before it removes the pod."""
    return node.state in BUSY_STATES or "COMPLETING" in node.state_flags


def unresponsive(node: SlurmNode) -> bool:
    """DOWN or not responding: the cordon sync skips it (its state is Slurm's, not ours)."""
    return not node.responding


def terminated(node: SlurmNode) -> bool:
    """Already DOWN by the preStop hook: marking it again would change nothing."""
    return node.state == "down" and node.reason == TERMINATING_REASON


class SlurmView:
    """One reconcile's view of Slurm: the nodes as read at its start, or unknown.

    Unknown is not empty: when the read fails nothing is decided from it, and a write that
    finds the controller away makes the view unknown too, so the rest of the pass writes
    nothing more. The view follows its own successful writes (a drain shows as drained),
    so later steps of the same pass decide on what Slurm now holds.
    """

    def __init__(self, slurm: OperatorSlurm, nodes: list[SlurmNode] | None, error: str) -> None:
        self._slurm = slurm
        self._nodes = {n.name: n for n in nodes or []}
        self.known = nodes is not None
        self.error = error
        self.refused: list[str] = []  # writes Slurm refused (an unknown node, a bad state)

    @classmethod
    async def read(cls, slurm: OperatorSlurm) -> SlurmView:
        try:
            return cls(slurm, await slurm.nodes(), "")
        except (SlurmError, OSError) as e:  # SlurmUnavailable is a SlurmError
            return cls(slurm, None, str(e) or type(e).__name__)

    def get(self, name: str) -> SlurmNode | None:
        return self._nodes.get(name)

    async def drain(self, name: str, why: str) -> bool:
        if not await self._write(self._slurm.drain(name, why)):
            return False
        node = self._nodes[name]
        node.state_flags = [*[f for f in node.state_flags if f != "DRAIN"], "DRAIN"]
        node.reason = why
        return True

    async def resume(self, name: str) -> bool:
        if not await self._write(self._slurm.resume(name)):
            return False
        node = self._nodes[name]
        node.state_flags = [f for f in node.state_flags if f != "DRAIN"]
        node.reason = ""
        return True

    async def mark_down(self, name: str) -> bool:
        if not await self._write(self._slurm.mark_down(name, TERMINATING_REASON)):
            return False
        node = self._nodes[name]
        node.state, node.reason = "down", TERMINATING_REASON
        return True

    async def _write(self, call: Coroutine[Any, Any, None]) -> bool:
        if not self.known:
            call.close()  # never awaited: nothing reaches Slurm
            return False
        try:
            await call
        except SlurmUnavailable as e:
            self.known, self.error = False, str(e)
            return False
        except SlurmError as e:
            self.refused.append(str(e))
            return False
        return True
