"""A controller that forgets (time-skipping server, fake Slurm): slurmctld killed during
the repair comes back on its last saved state, from before the incident's requeue.

- the requeue it forgot (the job "runs" again on the machine just rebooted) is done again,
  once: Slurm's restart count says one requeue for the fault, and the node goes back idle;
- a requeue it forgot while the runbook waits for the node to go idle is seen by the wait
  (a new controller start) and done again there, never waited out;
- the drain it forgot is applied again before the node's health gate (the wait for its
  registration takes it back; the check after it reads it again);
- a job the incident cancelled that it shows again is cancelled again, never requeued;
- a job it no longer knows at all is reported by id, with how to submit it again, even when
  the requeue that saw it was retried after the crash (its first attempt's heartbeat);
- with no restart, nothing more is read than one look, and nothing is done;
- the return refuses a node Slurm shows busy after its repair, and lifts the Slinky
  operator's copy of the incident's drain (never another's).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment

from autoclusters.activities.job_markers import requeue_marker
from autoclusters.activities.slurm import SlurmActivities
from autoclusters.core.models import RequeueInput, ReturnInput, WaitIdleInput, drain_reason
from autoclusters.core.policy import Rung, StepPolicy
from autoclusters.integrations.slurm import SlurmUnavailable, boot_time
from tests.fakes.systems import FakeCloud, FakeSlurm
from tests.workflows.test_remediation_workflow import _fleet, _policy

REPAIRS = (Rung.RESET_GPU, Rung.REBOOT, Rung.REPLACE)

pytestmark = pytest.mark.workflow

Saved = tuple[Any, Any]


class CrashingCloud(FakeCloud):
    """The repair goes through while slurmctld is away; slurmctld then starts again on the
    state it had saved before the incident (`saved`, taken by the test)."""

    def __init__(self, slurm: FakeSlurm, *, keep_nodes: bool = True) -> None:
        super().__init__(slurm)
        self.saved: Saved | None = None
        self.keep_nodes = keep_nodes

    async def repair(self, node: str, rung: Rung, idempotency_key: str, **kw: Any) -> Any:
        first = idempotency_key not in self._repairs
        done = await super().repair(node, rung, idempotency_key, **kw)
        if first and self.saved is not None:
            self._slurm.crash_to(self.saved, keep_nodes=self.keep_nodes)
        return done


@pytest.mark.parametrize("keep_nodes", [True, False], ids=["drain-kept", "drain-forgotten"])
async def test_a_forgotten_requeue_is_done_again_once_and_the_node_returns_idle(
    env: WorkflowEnvironment, keep_nodes: bool
) -> None:
    async with _fleet(
        env, cloud=lambda s: CrashingCloud(s, keep_nodes=keep_nodes), fixed_by=Rung.REBOOT
    ) as f:
        assert isinstance(f.cloud, CrashingCloud)
        f.cloud.saved = f.slurm.saved_state()  # job 101 running on gpu-01, nothing drained
        handle = await f.start(f.request(policy=_policy()))
        result = await handle.result()

    assert result.status == "resolved", result.error
    job = f.slurm.job_now(101)
    assert job.restart_cnt == 1, "one requeue for the fault, as Slurm counts them"
    assert job.job_state == "PENDING"
    assert f.slurm.node_now("gpu-01").state == "idle"
    assert "DRAIN" not in f.slurm.node_now("gpu-01").state_flags  # returned
    names = [s.name for s in result.steps]
    assert names.index("recheck_after_restart") < names.index("health_gate")
    detail = result.step("recheck_after_restart").detail  # type: ignore[union-attr]
    assert "the controller restarted" in detail
    assert "forgot the requeue of job(s) [101]; requeued again" in detail
    if not keep_nodes:
        # The wait for the node's registration takes back a drain that is gone; the check
        # after it finds it in place.
        drains = [w for w, n in f.slurm.log if (w, n) == ("drain", "gpu-01")]
        assert len(drains) == 2
        assert f.slurm.log.index(
            ("drain", "gpu-01"), f.slurm.log.index(("controller_restarted", f.slurm.started))
        ) < f.slurm.log.index(("resume", "gpu-01"))
    assert result.vanished_jobs == []
    assert result.controller_started == f.slurm.started  # moved on to the new start


@pytest.mark.parametrize("when", ["before-the-wait", "during-the-wait", "at-its-timeout"])
async def test_a_requeue_forgotten_while_waiting_for_idle_is_done_again_not_waited_out(
    env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """slurmctld killed once the requeue step is done: the job "runs" on the node again (a
    ghost Slurm would only requeue by itself minutes later, with no marker). The idle wait
    sees the new controller start (at its first look, at a later drain check, or before it
    gives up: never a cancel of the ghost), the runbook requeues the job under its marker
    and waits on: one requeue as Slurm counts them, and no wait for the ghost."""
    # `during`: an idle timeout long enough for the wait's next drain check (10 s) to see it.
    idle_s = 60 if when == "during-the-wait" else 0.5
    steps = {r: StepPolicy(idle_timeout_s=idle_s, on_idle_timeout="force") for r in REPAIRS}
    async with _fleet(env, fixed_by=Rung.REBOOT) as f:
        saved = f.slurm.saved_state()  # job 101 running on gpu-01, nothing drained
        looks = {"controller_started": 0, "jobs_on_node": 0}
        # The requeue reads both once; the idle wait's first drain check reads the start,
        # then the jobs (`during`: still busy with the ghost, the wait polls on until its
        # next drain check).
        crash_at = ("controller_started", 2) if when == "before-the-wait" else ("jobs_on_node", 2)

        def crashing(name: str) -> Any:
            real = getattr(f.slurm, name)

            async def call(*args: Any) -> Any:
                looks[name] += 1
                if (name, looks[name]) == crash_at:
                    f.slurm.crash_to(saved)
                return await real(*args)

            return call

        for name in looks:
            monkeypatch.setattr(f.slurm, name, crashing(name))
        result = await (await f.start(f.request(policy=_policy(steps=steps)))).result()

    assert result.status == "resolved", result.error
    job = f.slurm.job_now(101)
    assert job.restart_cnt == 1, "one requeue for the fault, as Slurm counts them"
    assert f.slurm.calls["cancel"] == 0  # force was allowed, and never used on the ghost
    assert f.slurm.node_now("gpu-01").state == "idle"
    waited = result.step("wait_idle")
    assert waited is not None
    assert "forgot the requeue of job(s) [101]; requeued again" in waited.detail
    assert result.step("recheck_after_restart") is None  # handled where it was seen
    assert result.controller_started == f.slurm.started
    names = [s.name for s in result.steps]
    assert names.index("wait_idle") < names.index("repair")


async def test_a_cancel_the_controller_forgot_is_done_again_never_a_requeue(
    env: WorkflowEnvironment,
) -> None:
    """Job 105 cannot be requeued; the policy forces: the idle wait cancels it. slurmctld
    then comes back from before the incident: 105 "runs" on the node again, as does 101
    (its requeue forgotten). 105 is cancelled again (the incident's decision stands), 101
    requeued again; neither runs on the node returned."""
    steps = {r: StepPolicy(idle_timeout_s=0.5, on_idle_timeout="force") for r in REPAIRS}
    async with _fleet(env, cloud=CrashingCloud, fixed_by=Rung.REBOOT) as f:
        assert isinstance(f.cloud, CrashingCloud)
        f.slurm.add_job(105, nodes="gpu-01", requeue=False)  # sbatch --no-requeue
        f.cloud.saved = f.slurm.saved_state()  # 101 and 105 running on gpu-01
        result = await (await f.start(f.request(policy=_policy(steps=steps)))).result()

    assert result.status == "resolved", result.error
    assert result.cancelled_jobs == [105]
    assert f.slurm.job_now(105).job_state == "CANCELLED"
    assert f.slurm.requeue_count[105] == 0
    assert f.slurm.calls["cancel"] == 2  # by the wait's force, then again after the restart
    assert f.slurm.job_now(101).restart_cnt == 1
    detail = result.step("recheck_after_restart").detail  # type: ignore[union-attr]
    assert "forgot the cancel of job(s) [105]; cancelled again" in detail
    assert "forgot the requeue of job(s) [101]; requeued again" in detail
    assert f.slurm.node_now("gpu-01").state == "idle"


async def test_a_job_the_controller_lost_is_reported_with_how_to_resubmit(
    env: WorkflowEnvironment,
) -> None:
    async with _fleet(env, cloud=CrashingCloud, fixed_by=Rung.REBOOT) as f:
        assert isinstance(f.cloud, CrashingCloud)
        f.cloud.saved = f.slurm.saved_state()
        # Submitted seconds before the crash: never in the controller's saved state.
        f.slurm.add_job(
            201, nodes="gpu-01", command="/home/ada/train.sbatch", work_dir="/home/ada/run7"
        )
        handle = await f.start(f.request(policy=_policy()))
        result = await handle.result()

    assert result.status == "resolved", result.error
    assert [j.job_id for j in result.vanished_jobs] == [201]
    lost = result.vanished_jobs[0]
    assert lost.command == "/home/ada/train.sbatch" and lost.work_dir == "/home/ada/run7"
    told = [n for n in f.notes() if n.event == "jobs_vanished"]
    assert len(told) == 1 and told[0].severity == "critical"
    assert "no longer knows job(s) [201]" in told[0].text
    assert "sbatch /home/ada/train.sbatch (-D /home/ada/run7)" in told[0].text
    assert f.slurm.node_now("gpu-01").state == "idle"
    assert f.slurm.job_now(101).restart_cnt == 1


async def test_without_a_restart_nothing_is_done_again(env: WorkflowEnvironment) -> None:
    async with _fleet(env, fixed_by=Rung.REBOOT) as f:
        handle = await f.start(f.request(policy=_policy()))
        result = await handle.result()
    assert result.status == "resolved"
    assert result.step("recheck_after_restart") is None
    assert f.slurm.requeue_count[101] == 1
    # The requeue's, the idle wait's first look, two looks after.
    assert f.slurm.calls["controller_started"] == 4
    assert result.controller_started == f.slurm.started


async def test_the_return_refuses_a_node_slurm_shows_busy_after_its_repair() -> None:
    slurm = FakeSlurm()
    slurm.add_node("gpu-01", state_flags=["DRAIN"], reason=drain_reason("INC-1", "XID_79"))
    slurm.add_job(101, nodes="gpu-01")  # a job that cannot be running on the new machine
    back = await ActivityEnvironment().run(
        SlurmActivities(slurm).return_to_service, ReturnInput(node="gpu-01", incident_id="INC-1")
    )
    assert not back.returned
    assert "Slurm shows jobs [101] on it after its repair" in back.detail
    assert "DRAIN" in slurm.node_now("gpu-01").state_flags


@pytest.mark.parametrize(
    ("reason", "returned"),
    [
        ("slurm-operator: " + drain_reason("INC-1", "XID_79"), True),  # its copy of ours
        ("slurm-operator: " + drain_reason("INC-2", "XID_79"), False),  # another incident's
        ("slurm-operator: NodeSet scaling in", False),  # the operator's own
    ],
    ids=["our-reason-copied", "another-incidents", "the-operators-own"],
)
async def test_the_return_takes_back_the_slinky_operators_copy_of_our_drain(
    reason: str, returned: bool
) -> None:
    """slurmctld lost our drain in a crash; the Slinky operator drained the still-cordoned
    Node again with its prefix before ours came back: still the incident's to lift."""
    slurm = FakeSlurm()
    slurm.add_node("gpu-01", state_flags=["DRAIN"], reason=reason)
    back = await ActivityEnvironment().run(
        SlurmActivities(slurm).return_to_service, ReturnInput(node="gpu-01", incident_id="INC-1")
    )
    assert back.returned is returned
    assert ("DRAIN" in slurm.node_now("gpu-01").state_flags) is not returned
    assert slurm.calls["resume"] == int(returned)


async def test_a_requeue_retried_after_a_crash_keeps_what_its_first_attempt_saw() -> None:
    """The first attempt marks job 201 and fails (slurmctld killed); the controller comes
    back without the job at all (submitted after its last save) and with another start.
    The retry, from the first attempt's heartbeat, still names the job with its record and
    keeps the first start: the runbook then sees the restart and reports the job lost."""
    slurm = FakeSlurm()
    slurm.add_node("gpu-01")
    saved = slurm.saved_state()  # before the job was submitted
    slurm.add_job(201, nodes="gpu-01", command="/home/ada/train.sbatch")
    first_start = slurm.started
    beats: list[Any] = []
    first = ActivityEnvironment()
    first.on_heartbeat = lambda *details: beats.extend(details)
    real_requeue = slurm.requeue

    async def crash(job_id: int) -> None:
        slurm.crash_to(saved)  # the controller dies with the requeue in flight
        raise SlurmUnavailable("requeue: Unable to contact slurm controller")

    slurm.requeue = crash  # type: ignore[method-assign]
    acts = SlurmActivities(slurm)
    inp = RequeueInput(node="gpu-01", incident_id="INC-1", hold_watch_s=0, poll_s=0.01)
    with pytest.raises(SlurmUnavailable):
        await first.run(acts.requeue_jobs, inp)
    slurm.requeue = real_requeue  # type: ignore[method-assign]
    assert slurm.started != first_start  # it restarted

    retry = ActivityEnvironment()
    retry.info = dataclasses.replace(retry.info, attempt=2, heartbeat_details=beats[-1:])
    done = await retry.run(acts.requeue_jobs, inp)
    assert done.controller_started == first_start  # the first attempt's: a restart since
    assert done.requeued == [201]
    assert [(j.job_id, j.command) for j in done.records] == [(201, "/home/ada/train.sbatch")]
    assert done.requeued_now == []  # nothing of it left in Slurm to requeue


async def test_the_requeue_drains_again_a_drain_the_restart_forgot_before_it_requeues() -> None:
    """slurmctld crashed right after the drain step: it came back without the drain, and a
    requeued job would land on the faulty node again. The requeue reads the drain back
    first and applies it again."""
    slurm = FakeSlurm()
    slurm.add_node("gpu-01")
    slurm.add_node("gpu-02")
    slurm.add_job(101, nodes="gpu-01")
    reason = drain_reason("INC-1", "XID_79")
    done = await ActivityEnvironment().run(
        SlurmActivities(slurm).requeue_jobs,
        RequeueInput(node="gpu-01", incident_id="INC-1", drain_reason=reason, hold_watch_s=0),
    )
    assert done.redrained and done.requeued_now == [101]
    assert "drained again" in done.describe()
    assert slurm.node_now("gpu-01").reason == reason
    assert slurm.log.index(("drain", "gpu-01")) < slurm.log.index(("requeue", "101"))


async def test_the_idle_wait_ends_on_a_requeued_job_placed_on_the_node_again() -> None:
    """The drain was lost for a moment and Slurm put the job the incident requeued back on
    the node: the wait hands it to the runbook at once instead of waiting it out."""
    slurm = FakeSlurm()
    reason = drain_reason("INC-1", "XID_79")
    slurm.add_node("gpu-01", state_flags=["DRAIN"], reason=reason)
    # Requeued once under the incident's marker, running here again.
    slurm.add_job(101, nodes="gpu-01", admin_comment=requeue_marker("INC-1", 0), restart_cnt=1)
    inp = WaitIdleInput(node="gpu-01", timeout_s=600, force=False, drain_reason=reason)
    back = await ActivityEnvironment().run(
        SlurmActivities(slurm).wait_node_idle, inp.model_copy(update={"incident_id": "INC-1"})
    )
    assert back.came_back == [101]
    assert back.waited_s < 600
    with pytest.raises(ApplicationError, match="still runs jobs"):  # not this incident's
        await ActivityEnvironment().run(
            SlurmActivities(slurm).wait_node_idle, inp.model_copy(update={"timeout_s": 0})
        )


def test_the_controllers_start_is_read_from_scontrol_show_config() -> None:
    config = (
        "Configuration data as of 2026-12-05T06:10:00\n"
        "AccountingStorageBackupHost = (null)\n"
        "BOOT_TIME               = 2026-12-05T06:00:01\n"
        "BcastExclude            = /lib,/usr/lib\n"
    )
    assert boot_time(config) == "2026-12-05T06:00:01"
    assert boot_time("SlurmctldPort = 6817\n") == ""  # says none: unknown, never a guess
