"""What a restart of a component adds to the step it landed in, beyond the restart itself.

A step that was waiting on something (a job to end, a cloud operation to finish) when the
component went away could have completed as soon as both were true: the component back,
and what it waited for done. The *restart lag* is the time from then to the step's
completion as the run's own history records it. For Temporal it is what the restart costs
the incident beyond its downtime: a task lost with the server waits out a timeout
(heartbeat, workflow task), a worker's poll waits out its backoff. Read from
`OutageReport` (sandbox/drivers/outage.py); bench/temporal_restart.py prints it.
"""

from __future__ import annotations

from datetime import datetime

from autoclusters.sandbox.drivers.outage import OutageReport


def ready_at(r: OutageReport) -> datetime | None:
    """When the step could have completed: the component back, and what it waited for
    done (wait_idle: the node's job ended; repair: the cloud operations finished)."""
    if r.outage is None:
        return None
    ready = r.outage.up_at
    if r.at == "wait_idle":
        if r.job_end_time is None:
            return None  # when the job ended is unknown: no figure rather than a wrong one
        ready = max(ready, r.job_end_time)
    elif r.at == "repair":
        done = [o.completed_at for o in r.cloud_ops if o.completed_at is not None]
        if not done:
            return None
        ready = max(ready, *done)
    return ready


def spanned(r: OutageReport) -> bool:
    """The step was under way while the component was away: it started before the component
    was back and completed (the history's time) after it went. Not `hit_step`, which reads
    the step's end in workflow time: after a workflow task timed out with the server away,
    that is the time of the task before it, before the outage."""
    if r.outage is None or r.step_completed_at is None:
        return False
    starts = [s.started_at for s in r.steps if s.name == r.at]
    return (
        bool(starts) and min(starts) <= r.outage.up_at and r.step_completed_at >= r.outage.down_at
    )


def restart_lag_s(r: OutageReport) -> float | None:
    """Seconds from `ready_at` to the step's completion in the history; None where the
    outage missed the step or either end is unknown."""
    ready = ready_at(r)
    if ready is None or r.step_completed_at is None or not spanned(r):
        return None
    return (r.step_completed_at - ready).total_seconds()
