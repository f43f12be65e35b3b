"""One worker process's fleet-guard calls, sent together (core/guard_batch.py).

The guard activities of a busy worker ask the same guard at the same moment. Each call
joins its cluster's queue; one sender per cluster takes what has queued (up to
MAX_BATCH_ITEMS) and sends it as one `batch` update, at most IN_FLIGHT at a time, so a
worker's updates in flight per guard stay bounded whatever its load, and every call still
gets its own answer. Temporal's "too many updates in flight" (other workers, the CLI) is
waited out, not failed on.

A guard run by a worker from before `batch` existed (a rolling upgrade) refuses the
update as unknown: the calls then go one by one, as they did.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from temporalio.client import WorkflowUpdateFailedError
from temporalio.service import RPCError, RPCStatusCode

from autoclusters.core.guard import Admission, GuardContext, Registration, SlurmView
from autoclusters.core.guard_batch import MAX_BATCH_ITEMS, GuardAnswer, GuardBatch, GuardCall

# Batches in flight per guard from one worker: the next fills while one is answered.
# Four workers stay below Temporal's 10 updates in flight per workflow.
IN_FLIGHT = 2
# How long to wait out "too many updates in flight" before the activity fails (it retries).
BUSY_WAIT_S = 60.0
# Too many updates in flight; Temporal busy; the guard's workflow task failed or timed out
# (FAILED_PRECONDITION: "Workflow Task in failed state", a busy worker): all pass.
_BUSY = {
    RPCStatusCode.RESOURCE_EXHAUSTED,
    RPCStatusCode.UNAVAILABLE,
    RPCStatusCode.ABORTED,
    RPCStatusCode.FAILED_PRECONDITION,
    RPCStatusCode.DEADLINE_EXCEEDED,
}

# An update-with-start, built fresh per send: (update name, argument, result type) -> answer.
Send = Callable[[GuardContext, str, Any, type], Any]


@dataclass
class _Waiting:
    guard: GuardContext
    call: GuardCall
    answer: asyncio.Future[GuardAnswer]


class GuardBatcher:
    def __init__(
        self, send: Send, *, max_items: int = MAX_BATCH_ITEMS, in_flight: int = IN_FLIGHT
    ) -> None:
        self._send = send
        self._max_items = max_items
        self._in_flight = in_flight
        self._queues: dict[str, list[_Waiting]] = {}
        self._arrived: dict[str, asyncio.Event] = {}
        self._senders: dict[str, asyncio.Task[None]] = {}
        self._batched = True  # False once a guard said it knows no `batch`
        self.batches = 0  # sent, for tests and the benchmark

    async def call(self, guard: GuardContext, call: GuardCall) -> GuardAnswer:
        waiting = _Waiting(guard, call, asyncio.get_running_loop().create_future())
        self._queues.setdefault(guard.cluster, []).append(waiting)
        self._arrived.setdefault(guard.cluster, asyncio.Event()).set()
        sender = self._senders.get(guard.cluster)
        if sender is None or sender.done():
            self._senders[guard.cluster] = asyncio.create_task(self._drain(guard.cluster))
        return await waiting.answer

    async def _drain(self, cluster: str) -> None:
        queue, arrived = self._queues[cluster], self._arrived[cluster]
        sending: set[asyncio.Future[Any]] = set()
        while queue or sending:
            if not queue or len(sending) >= self._in_flight:
                # Until a batch comes back, or (a slot free) a call arrives.
                arrived.clear()
                woken = asyncio.ensure_future(arrived.wait())
                wake = sending | ({woken} if len(sending) < self._in_flight else set())
                await asyncio.wait(wake, return_when=asyncio.FIRST_COMPLETED)
                woken.cancel()
                sending = {t for t in sending if not t.done()}
                continue
            # Calls whose activity was cancelled meanwhile are not sent.
            taken = [w for w in queue[: self._max_items] if not w.answer.done()]
            del queue[: self._max_items]
            if taken:
                sending.add(asyncio.create_task(self._deliver(taken)))

    async def _deliver(self, taken: list[_Waiting]) -> None:
        try:
            answers = await self._send_batch(taken)
        except BaseException as e:
            for w in taken:
                if not w.answer.done():
                    w.answer.set_exception(e)
            if isinstance(e, asyncio.CancelledError):
                raise
            return
        for w, a in zip(taken, answers, strict=True):
            if not w.answer.done():
                w.answer.set_result(a)

    async def _send_batch(self, taken: list[_Waiting]) -> list[GuardAnswer]:
        if not self._batched:
            return [await self._one(w) for w in taken]
        batch = GuardBatch(calls=one_view([w.call for w in taken]))
        # The newest context starts the guard if it is not running (any would do).
        guard = taken[-1].guard
        delay = 0.05
        waited = 0.0
        while True:
            try:
                answers: list[GuardAnswer] = await self._send(
                    guard, "batch", batch, list[GuardAnswer]
                )
                self.batches += 1
                return answers
            except RPCError as e:
                if e.status not in _BUSY or waited >= BUSY_WAIT_S:
                    raise
            except WorkflowUpdateFailedError as e:
                if "not found" not in str(e.cause or e):
                    raise
                self._batched = False  # an older guard: one update per call
                return [await self._one(w) for w in taken]
            pause = delay * (1 + random.random())
            await asyncio.sleep(pause)
            waited += pause
            delay = min(delay * 2, 2.0)

    async def _one(self, w: _Waiting) -> GuardAnswer:
        c = w.call
        if c.opened is not None:
            reg = await self._send(w.guard, "register", c.opened, Registration)
            return GuardAnswer(registration=reg)
        if c.release is not None:
            await self._send(w.guard, "release", c.release, type(None))
            return GuardAnswer()
        adm = await self._send(w.guard, c.update, c.admit, Admission)
        return GuardAnswer(admission=adm)


def one_view(calls: list[GuardCall]) -> list[GuardCall]:
    """Slurm's view (the nodes out of service: a long list on a big cluster) once per batch:
    the newest, on the first call that carries one, so the guard reconciles on it before
    it answers any call that brought one. The calls' views were read moments apart; sent
    with each, a batch of a 2,000-node cluster's admissions would write it dozens of times
    into the guard's history."""
    views = [v for c in calls if (v := _view(c)) is not None]
    if len(views) < 2:
        return calls
    newest, placed, out = views[-1], False, []
    for c in calls:
        view = newest if not placed and _view(c) is not None else None
        placed = placed or view is not None
        out.append(_with_view(c, view))
    return out


def _view(c: GuardCall) -> SlurmView | None:
    if c.opened is not None:
        return c.opened.slurm
    if c.admit is not None and c.admit.out_of_service is not None:
        return SlurmView(cluster_nodes=c.admit.cluster_nodes, out_of_service=c.admit.out_of_service)
    return None


def _with_view(c: GuardCall, view: SlurmView | None) -> GuardCall:
    if c.opened is not None:
        return c.model_copy(update={"opened": c.opened.model_copy(update={"slurm": view})})
    if c.admit is not None:
        oos = view.out_of_service if view is not None else None
        return c.model_copy(update={"admit": c.admit.model_copy(update={"out_of_service": oos})})
    return c
