"""How the runbook marks the jobs it acts on, and which job states count as on the node.

The marks live in the job's AdminComment (only admins and the runbook write it), written
*before* the action with the restart count the job had then: a retried step that finds its
mark knows it acted, and a higher restart count says the job has left since.
"""

from __future__ import annotations

from autoclusters.core.models import REASON_PREFIX, SlurmJob

# Jobs that hold the node's resources and can be requeued.
ACTIVE = {"RUNNING", "CONFIGURING", "SUSPENDED"}
# Jobs with processes on the node: a repair under them would kill them.
BUSY = ACTIVE | {"COMPLETING"}


def requeue_marker(incident_id: str, restart_cnt: int) -> str:
    """The incident requeued the job (or asked it to requeue itself): its one requeue."""
    return f"{REASON_PREFIX}requeue:{incident_id}:{restart_cnt}"


def marked_for(job: SlurmJob, incident_id: str) -> int | None:
    """The restart count the incident's requeue marker recorded (None: not marked)."""
    prefix = f"{REASON_PREFIX}requeue:{incident_id}:"
    if job.admin_comment.startswith(prefix):
        return int(job.admin_comment[len(prefix) :])
    return None


def in_job_marker(incident_id: str, restart_cnt: int) -> str:
    """The incident took the node from the job, which went on with its spare."""
    return f"{REASON_PREFIX}injob:{incident_id}:{restart_cnt}"


def in_job_marked(job: SlurmJob, incident_id: str) -> bool:
    return job.admin_comment.startswith(f"{REASON_PREFIX}injob:{incident_id}:")


def requeue_claim(job: SlurmJob) -> str | None:
    """The incident whose requeue marker names the job's current run (its restart count):
    that incident requeues it, or has. None: no incident claims this run."""
    prefix = f"{REASON_PREFIX}requeue:"
    if not job.admin_comment.startswith(prefix):
        return None
    incident, _, count = job.admin_comment[len(prefix) :].rpartition(":")
    return incident if incident and count == str(job.restart_cnt) else None
