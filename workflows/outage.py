"""Waiting out a dependency's outage inside a workflow step: never act on what cannot be
seen, and never give up on a minute's outage either.

A step whose activity failed with an outage type (a `...Unavailable` ApplicationError: the
activity got no trustworthy answer from slurmctld, the Kubernetes API, the cloud API) is run
again, at first after 2 s, then every 10 s, until it succeeds or the outage has lasted the
budget. The caller shows the outage while it lasts (`on_outage`) and once it is over
(`on_back`); past the budget the step fails with OutageBudgetSpent, which is not an outage
type, so an enclosing step does not wait it out a second time.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TypeVar

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from autoclusters.core.unavailable import is_unavailable_type, outage_said

T = TypeVar("T")

OUTAGE_POLL_S = 2.0
OUTAGE_POLL_MAX_S = 10.0
OUTAGE_BUDGET_SPENT = "OutageBudgetSpent"
DEFAULT_BUDGET_S = 900.0


def outage_of(err: BaseException) -> ApplicationError | None:
    """The failure when `err` says a dependency was unreachable (a retryable outage)."""
    cause = err.cause if isinstance(err, ActivityError) and err.cause else err
    if (
        isinstance(cause, ApplicationError)
        and is_unavailable_type(cause.type)
        and not cause.non_retryable
    ):
        return cause
    return None


async def ride_out(
    what: str,
    run: Callable[[], Awaitable[T]],
    *,
    budget_s: float = DEFAULT_BUDGET_S,
    on_outage: Callable[[str, float], Awaitable[None]] | None = None,
    on_back: Callable[[str, float], Awaitable[None]] | None = None,
) -> T:
    """`run()`, tried again while the system it reads is unreachable (see the module)."""
    since: datetime | None = None
    tries = 0
    said = ""
    while True:
        try:
            out = await run()
        except ActivityError as err:
            outage = outage_of(err)
            if outage is None:
                raise
            now = workflow.now()
            since = since or now
            lasted = (now - since).total_seconds()
            said = outage_said(str(outage.message))
            if lasted >= budget_s:
                raise ApplicationError(
                    f"{said} for {lasted:.0f} s during {what}, over the outage "
                    f"budget of {budget_s:.0f} s: {outage.message}",
                    type=OUTAGE_BUDGET_SPENT,
                    non_retryable=True,
                ) from err
            if on_outage is not None:
                await on_outage(said, lasted)
            tries += 1
            await workflow.sleep(min(OUTAGE_POLL_S * 2 ** (tries - 1), OUTAGE_POLL_MAX_S))
            continue
        if since is not None and on_back is not None:
            await on_back(said, (workflow.now() - since).total_seconds())
        return out
