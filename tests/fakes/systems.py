"""In-memory stand-ins for Slurm, the cloud provider and the notifiers, for workflow tests.

They keep the semantics the activities rely on, including Slurm's refusals: `scontrol`
refuses to requeue a job submitted with --no-requeue or one that is already pending, and
refuses to resume a node that is not drained. A test that makes an activity break one of
those rules fails on the fake's error instead of passing silently.

`FakeSlurm.log` is the cluster's audit trail: every mutation, from Slurm or from the cloud,
in the order it happened.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

from temporalio import activity
from temporalio.client import Client

from autoclusters.core import hostlist
from autoclusters.core.evidence import ActiveFault, EvidenceAck, HealthSnapshot, IbPortState
from autoclusters.core.models import (
    HealthCheck,
    HealthReport,
    Notification,
    RepairResult,
    ReplaceResult,
    SlurmJob,
    SlurmNode,
    workflow_id,
)
from autoclusters.core.node_report import NodeReport
from autoclusters.core.policy import LADDER, Rung
from autoclusters.integrations.cloud import CloudError
from autoclusters.integrations.slurm import SlurmError, SlurmUnavailable

_REQUEUEABLE_STATES = {"RUNNING", "CONFIGURING", "SUSPENDED"}
# A requeued job may start this long after (slurm.conf CredExpire + 1, by default ~2 min).
REQUEUE_DELAY_S = 121


def _held_by_hand(job: SlurmJob) -> bool:
    """`scontrol hold` (JobHeldAdmin) or the user's own (JobHeldUser)."""
    return job.state_reason.startswith("JobHeld")


class FakeSlurm:
    """A Slurm controller in memory: implements `autoclusters.integrations.slurm.SlurmClient`.

    fail_after_requeue_once: the first `requeue` call requeues the job and then raises a
    transient `SlurmError`, as if the worker lost its connection right after the side effect.
    """

    def __init__(self, *, fail_after_requeue_once: bool = False) -> None:
        self._nodes: dict[str, SlurmNode] = {}
        self._jobs: dict[int, SlurmJob] = {}
        self.fail_after_requeue_once = fail_after_requeue_once
        self.injected_failures = 0
        self.requeue_count: Counter[int] = Counter()
        self.release_count: Counter[int] = Counter()
        self.calls: Counter[str] = Counter()
        self.log: list[tuple[str, str]] = []
        self.when: dict[tuple[str, str], float] = {}  # the clock at each write's last record
        # What each release_hold was told of when the job was read PENDING: the real
        # client starts it only in a later second than that (its credential's rule).
        self.pending_seen_at: dict[int, float] = {}
        # Jobs that act on their checkpoint signal (train.sbatch's USR1 trap): they
        # checkpoint and requeue themselves; others ignore it.
        self.checkpointing: set[int] = set()
        # Reads of `jobs()` for which a job that requeued itself still shows COMPLETING
        # (its other nodes not done with it yet), before it is PENDING.
        self.completing_reads: Counter[int] = Counter()
        self.completing_on: dict[int, str] = {}  # the nodes a completing job still shows
        self.signals: Counter[int] = Counter()
        # In-job recovery (examples/training's hot spare): jobs whose survivors re-form with
        # their standby when their steps get the abandon signal (they write `resumed_at=`);
        # whether Slurm refuses to shrink a job (beyond the batch host, which it always
        # refuses); the signals sent to jobs' steps (never their batch shell).
        self.in_job_recovering: set[int] = set()
        self.refuse_shrink = False
        self.step_signals: list[tuple[int, str]] = []
        # slurmctld away (restarting, failing over): every call raises SlurmUnavailable, as
        # SlurmCli does on 22.05's errors document; `calls_while_down` counts the attempts.
        self.down = False
        self.calls_while_down: Counter[str] = Counter()
        # slurmctld's start (BOOT_TIME); `crash_to` moves it, as a restart does.
        self.started = "2026-01-01T00:00:00"
        self.restarts = 0
        # slurm.conf's ReturnToService (the sandbox's: 2); None: `scontrol` does not say.
        self.return_to_service_setting: int | None = 2

    # --- building the cluster -----------------------------------------------------------

    def add_node(
        self,
        name: str,
        *,
        state: str = "idle",
        state_flags: list[str] | None = None,
        reason: str = "",
        slurmd_start_time: int = 1_700_000_000,
    ) -> SlurmNode:
        node = SlurmNode(
            name=name,
            state=state,
            state_flags=list(state_flags or []),
            reason=reason,
            slurmd_start_time=slurmd_start_time,
        )
        self._nodes[name] = node
        return node.model_copy(deep=True)

    def add_job(
        self,
        job_id: int,
        *,
        nodes: str,
        job_state: str = "RUNNING",
        requeue: bool = True,
        batch_flag: bool = True,
        name: str = "train",
        restart_cnt: int = 0,
        admin_comment: str = "",
        comment: str = "",
        command: str = "",
        work_dir: str = "",
        batch_host: str | None = None,
    ) -> SlurmJob:
        """`batch_host`: the node running its batch script; by default, as Slurm does, the
        first node of its allocation (none while pending)."""
        running = job_state in _REQUEUEABLE_STATES
        first = hostlist.expand(nodes)[0] if running and nodes else ""
        job = SlurmJob(
            batch_host=first if batch_host is None else batch_host,
            comment=comment,
            command=command,
            work_dir=work_dir,
            job_id=job_id,
            name=name,
            job_state=job_state,
            nodes=nodes,
            requeue=requeue,
            batch_flag=batch_flag,
            state_reason="None",
            restart_cnt=restart_cnt,
            admin_comment=admin_comment,
        )
        self._jobs[job_id] = job
        for n in hostlist.expand(nodes):
            if n in self._nodes and self._nodes[n].state == "idle":
                self._nodes[n].state = "allocated"
        return job.model_copy(deep=True)

    # --- what tests read back -----------------------------------------------------------

    def node_now(self, name: str) -> SlurmNode:
        return self._nodes[name].model_copy(deep=True)

    def job_now(self, job_id: int) -> SlurmJob:
        return self._jobs[job_id].model_copy(deep=True)

    def record(self, what: str, subject: str) -> None:
        self.log.append((what, subject))
        self.when[(what, subject)] = time.time()

    def set_reason(self, node: str, reason: str) -> None:
        """Re-drain with another reason, as an admin running `scontrol update` would."""
        n = self._nodes[node]
        if "DRAIN" not in n.state_flags:
            n.state_flags.append("DRAIN")
        n.reason = reason
        self.record("admin_drain", node)

    def admin_resume(self, node: str) -> None:
        """Undrain, as an admin's `scontrol update nodename=X state=resume` would."""
        n = self._nodes[node]
        n.state_flags = [f for f in n.state_flags if f != "DRAIN"]
        n.reason = ""
        self.record("admin_resume", node)

    def set_comment(self, job_id: int, comment: str) -> None:
        """What the job's own processes write (`scontrol update Comment=`: ckpt_at,
        resumed_at), as examples/training does."""
        self._jobs[job_id].comment = comment

    def run_again(self, job_id: int, *, nodes: str) -> None:
        """Slurm starts a pending (requeued) job, on `nodes`."""
        job = self._jobs[job_id]
        job.job_state, job.state_reason, job.nodes = "RUNNING", "None", nodes
        job.batch_host = hostlist.expand(nodes)[0]
        for n in hostlist.expand(nodes):
            if self._nodes[n].state == "idle":
                self._nodes[n].state = "allocated"
        self.record("started", str(job_id))

    def finish_job(self, job_id: int) -> None:
        """The job ends on its own; the nodes it leaves go idle."""
        job = self._jobs[job_id]
        job.job_state = "COMPLETED"
        self.record("completed", str(job_id))
        for n in hostlist.expand(job.nodes):
            self._settle(n)

    def boot(self, node: str, *, slurmd_start_time: int) -> None:
        """A fresh machine's slurmd registers: the node answers again, DRAIN survives."""
        n = self._nodes[node]
        for j in self._jobs.values():
            # Whatever still ran on the old machine died with it.
            if j.job_state in _REQUEUEABLE_STATES and node in hostlist.expand(j.nodes):
                j.job_state, j.state_reason = "NODE_FAIL", "NodeDown"
        n.state = "idle"
        n.state_flags = [f for f in n.state_flags if f != "NOT_RESPONDING"]
        n.slurmd_start_time = slurmd_start_time
        self.record("registered", node)

    def saved_state(self) -> tuple[dict[str, SlurmNode], dict[int, SlurmJob]]:
        """What slurmctld has written to its StateSaveLocation: the state right now."""
        nodes = {k: v.model_copy(deep=True) for k, v in self._nodes.items()}
        jobs = {k: v.model_copy(deep=True) for k, v in self._jobs.items()}
        return nodes, jobs

    def crash_to(
        self, saved: tuple[dict[str, SlurmNode], dict[int, SlurmJob]], *, keep_nodes: bool = True
    ) -> None:
        """slurmctld killed and started again on its last saved state: the jobs as they
        were then (a requeue since is forgotten, a job submitted since is gone); the nodes
        as slurmd reports them when it registers again (`keep_nodes`), else as saved."""
        nodes, jobs = saved
        self._jobs = {k: v.model_copy(deep=True) for k, v in jobs.items()}
        if not keep_nodes:  # the drains and reasons saved; slurmd says when it started
            for name, was in nodes.items():
                now = self._nodes[name]
                now.state_flags, now.reason = list(was.state_flags), was.reason
        for j in self._jobs.values():  # what the restored jobs hold again
            if j.job_state in _REQUEUEABLE_STATES:
                for n in hostlist.expand(j.nodes):
                    if n in self._nodes and self._nodes[n].state == "idle":
                        self._nodes[n].state = "allocated"
        self.restarts += 1
        self.started = f"2026-01-01T00:{self.restarts:02d}:00"
        self.record("controller_restarted", self.started)

    # --- SlurmClient --------------------------------------------------------------------

    async def controller_started(self) -> str:
        self._reachable("controller_started")
        self.calls["controller_started"] += 1
        return self.started

    def _reachable(self, call: str) -> None:
        if self.down:
            self.calls_while_down[call] += 1
            raise SlurmUnavailable(f"{call}: Unable to contact slurm controller (connect failure)")

    def lose_drain(self, node: str) -> None:
        """The controller came back from an older saved state: the node's drain is gone."""
        n = self._nodes[node]
        n.state_flags = [f for f in n.state_flags if f != "DRAIN"]
        n.reason = ""
        self.record("drain_lost", node)

    def _node(self, name: str) -> SlurmNode:
        if name not in self._nodes:
            raise SlurmError(f"scontrol update NodeName={name}: Invalid node name specified")
        return self._nodes[name]

    def _job(self, job_id: int) -> SlurmJob:
        if job_id not in self._jobs:
            raise SlurmError(f"scontrol: job {job_id}: Invalid job id specified")
        return self._jobs[job_id]

    def _settle(self, node: str) -> None:
        """A busy node with no active jobs left goes idle (its flags stay)."""
        n = self._nodes.get(node)
        if n is None or n.state not in ("allocated", "mixed"):
            return
        if not any(
            j.job_state in _REQUEUEABLE_STATES and node in hostlist.expand(j.nodes)
            for j in self._jobs.values()
        ):
            n.state = "idle"

    async def nodes(self) -> list[SlurmNode]:
        self._reachable("nodes")
        self.calls["nodes"] += 1
        return [n.model_copy(deep=True) for n in self._nodes.values()]

    async def node(self, name: str) -> SlurmNode | None:
        self._reachable("node")
        self.calls["node"] += 1
        n = self._nodes.get(name)
        return n.model_copy(deep=True) if n else None

    async def jobs(self) -> list[SlurmJob]:
        self._reachable("jobs")
        self.calls["jobs"] += 1
        out = []
        for j in self._jobs.values():
            seen = j.model_copy(deep=True)
            if self.completing_reads[j.job_id] > 0 and j.job_state == "PENDING":
                self.completing_reads[j.job_id] -= 1
                seen.job_state = "COMPLETING"
                seen.nodes = self.completing_on.get(j.job_id, "")
            out.append(seen)
        return out

    async def jobs_on_node(self, name: str) -> list[SlurmJob]:
        self._reachable("jobs_on_node")
        self.calls["jobs_on_node"] += 1
        out = []
        for j in self._jobs.values():
            seen = j.model_copy(deep=True)
            if self.completing_reads[j.job_id] > 0 and j.job_state == "PENDING":
                seen.job_state, seen.nodes = "COMPLETING", self.completing_on.get(j.job_id, "")
            if name in hostlist.expand(seen.nodes):
                out.append(seen)
        return out

    async def drain(self, node: str, reason: str) -> None:
        self._reachable("drain")
        self.calls["drain"] += 1
        n = self._node(node)
        if not reason:
            raise SlurmError(f"scontrol update NodeName={node}: You must specify a reason")
        if "DRAIN" not in n.state_flags:
            n.state_flags.append("DRAIN")
        n.reason = reason
        self.record("drain", node)

    async def resume(self, node: str) -> None:
        self._reachable("resume")
        self.calls["resume"] += 1
        n = self._node(node)
        if "DRAIN" not in n.state_flags and n.state != "down":
            raise SlurmError(f"scontrol update NodeName={node}: Invalid node state specified")
        n.state_flags = [f for f in n.state_flags if f != "DRAIN"]
        if n.state == "down":
            n.state = "idle"
        n.reason = ""
        self.record("resume", node)

    async def signal_job(self, job_id: int, signal: str) -> None:
        self._reachable("signal_job")
        self.calls["signal_job"] += 1
        job = self._job(job_id)
        self.signals[job_id] += 1
        self.record(f"signal {signal}", str(job_id))
        if job_id in self.checkpointing and job.job_state in _REQUEUEABLE_STATES:
            # It saves, records when (train.py's `ckpt_at=` comment), and requeues itself.
            job.comment = f"ckpt_at={time.time():.0f}"
            self.back_in_queue(job_id)

    def back_in_queue(self, job_id: int) -> None:
        """What any requeue does to the job (Slurm's, or its own `scontrol requeue`): pending
        on its begin-time delay, its nodes let go, its restart count one on."""
        job = self._job(job_id)
        was_on = hostlist.expand(job.nodes)
        job.job_state, job.state_reason, job.nodes = "PENDING", "BeginTime", ""
        job.eligible_time = int(time.time()) + REQUEUE_DELAY_S
        job.batch_host = ""
        job.restart_cnt += 1
        for n in was_on:
            self._settle(n)

    async def requeue(self, job_id: int) -> None:
        self._reachable("requeue")
        self.calls["requeue"] += 1
        job = self._job(job_id)
        if not (job.requeue and job.batch_flag):
            raise SlurmError(
                f"scontrol requeue {job_id}: Requested operation is presently disabled"
            )
        if job.job_state not in _REQUEUEABLE_STATES:
            raise SlurmError(f"scontrol requeue {job_id}: Job is pending execution")
        if self.completing_reads[job_id] > 0:
            self.completing_on[job_id] = job.nodes  # shown there while it completes
        self.back_in_queue(job_id)
        self.requeue_count[job_id] += 1
        self.record("requeue", str(job_id))
        if self.fail_after_requeue_once and self.injected_failures == 0:
            self.injected_failures += 1
            raise SlurmError(f"scontrol requeue {job_id}: Socket timed out on send/recv operation")

    async def release_hold(self, job_id: int, seen_pending_at: float | None = None) -> None:
        self._reachable("release_hold")
        self.calls["release_hold"] += 1
        job = self._job(job_id)
        if job.job_state != "PENDING":
            raise SlurmError(f"scontrol update JobId={job_id}: Job is no longer pending execution")
        if not _held_by_hand(job):  # StartTime=now lifts no hold
            job.state_reason = "None"
        job.eligible_time = int(time.time())
        self.release_count[job_id] += 1
        self.pending_seen_at[job_id] = time.time() if seen_pending_at is None else seen_pending_at
        self.record("release_hold", str(job_id))

    async def hold(self, job_id: int) -> None:
        """A requeued job is PENDING to Slurm while it still completes: it can be held."""
        self._reachable("hold")
        job = self._job(job_id)
        if job.job_state != "PENDING":
            raise SlurmError(f"scontrol hold {job_id}: Job is no longer pending execution")
        job.state_reason = "JobHeldAdmin"
        self.record("hold", str(job_id))

    async def release(self, job_id: int) -> None:
        self._reachable("release")
        job = self._job(job_id)
        if _held_by_hand(job):
            job.state_reason = "None"
        self.record("release", str(job_id))

    async def set_admin_comment(self, job_id: int, text: str) -> None:
        self._reachable("set_admin_comment")
        self.calls["set_admin_comment"] += 1
        self._job(job_id).admin_comment = text

    async def shrink_job(self, job_id: int, nodes: list[str]) -> None:
        self._reachable("shrink_job")
        self.calls["shrink_job"] += 1
        job = self._job(job_id)
        had = hostlist.expand(job.nodes)
        if (
            self.refuse_shrink
            or job.job_state not in _REQUEUEABLE_STATES
            or not set(nodes) < set(had)
            or job.batch_host not in nodes  # "You cannot remove the batch host from a job"
        ):
            raise SlurmError(f"scontrol update JobId={job_id}: Invalid node name specified")
        job.nodes = ",".join(nodes)
        self.record("shrink", f"{job_id}:{job.nodes}")
        for n in had:
            self._settle(n)

    async def signal_steps(self, job_id: int, signal: str) -> None:
        self._reachable("signal_steps")
        self.calls["signal_steps"] += 1
        job = self._job(job_id)
        if job.job_state not in _REQUEUEABLE_STATES:
            raise SlurmError(
                f"scancel: Kill job error on job id {job_id}: Job/step already completing"
            )
        self.step_signals.append((job_id, signal))
        self.record(f"signal_steps {signal}", str(job_id))
        if job_id in self.in_job_recovering and signal == "USR2":
            # The survivors abandon their group and step again with the standby.
            job.comment = f"{job.comment} resumed_at={time.time():.3f}".strip()

    async def mark_down(self, node: str, reason: str) -> None:
        """DOWN, the drain and its reason kept; the jobs still completing there end."""
        self._reachable("mark_down")
        self.calls["mark_down"] += 1
        n = self._node(node)
        n.state, n.reason = "down", reason
        for job_id, nodes in list(self.completing_on.items()):
            if node in hostlist.expand(nodes):
                del self.completing_reads[job_id], self.completing_on[job_id]
                # Its completing ends with none of a requeue's begin-time delay: the
                # scheduler may start it at once, unless it is held.
                job = self._job(job_id)
                job.eligible_time = int(time.time())
                if not _held_by_hand(job):
                    job.state_reason = "None"
        self.record("mark_down", node)

    async def return_to_service(self) -> int | None:
        self._reachable("return_to_service")
        return self.return_to_service_setting

    async def cancel(self, job_id: int) -> None:
        self._reachable("cancel")
        self.calls["cancel"] += 1
        job = self._job(job_id)
        job.job_state = "CANCELLED"
        self.record("cancel", str(job_id))
        for n in hostlist.expand(job.nodes):
            self._settle(n)


class FakeCloud:
    """A cloud provider in memory: implements `autoclusters.integrations.cloud.CloudProvider`.

    A replacement boots the node's new machine at once: its slurmd registers with a start
    time after `stopped_at`, so `wait_node_registered` succeeds.

    fail: every `replace` raises `CloudError` (the provider has no capacity).
    admin_drain_reason: while the machine is replaced, an admin re-drains the node with this
      reason, so the drain is no longer ours.
    hold: `replace` signals `started` and then waits for `release`, so a test can look at an
      incident while its repair is in flight.
    """

    def __init__(
        self,
        slurm: FakeSlurm,
        *,
        fail: bool = False,
        admin_drain_reason: str | None = None,
        hold: bool = False,
    ) -> None:
        self._slurm = slurm
        self.fail = fail
        self.admin_drain_reason = admin_drain_reason
        self.hold = hold
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.replace_calls: list[tuple[str, str]] = []
        self._vms: dict[str, str] = {}
        self._done: dict[str, ReplaceResult] = {}
        self._repairs: dict[str, RepairResult] = {}
        self.repair_calls: list[tuple[str, Rung, str]] = []
        self.planned_vms: dict[str, str | None] = {}  # repair key -> the VM in its input
        self._serial = 0

    def _new_vm(self) -> str:
        self._serial += 1
        return f"vm-{self._serial:04d}"

    async def vm_id(self, node: str) -> str:
        if node not in self._vms:
            self._vms[node] = self._new_vm()
        return self._vms[node]

    async def machine_spec(self, node: str, vm_id: str) -> dict[str, Any]:
        return {"name": node}  # recorded in the plan; this fake needs none to replace

    async def repair(
        self,
        node: str,
        rung: Rung,
        idempotency_key: str,
        *,
        vm_id: str | None = None,
        **_: object,
    ) -> RepairResult:
        if idempotency_key in self._repairs:
            return self._repairs[idempotency_key]
        self.repair_calls.append((node, rung, idempotency_key))
        self.planned_vms[idempotency_key] = vm_id
        if self.fail:
            raise CloudError(f"{rung.value} {node}: no capacity for this instance type")
        if self.hold:
            self.started.set()
            await self.release.wait()
        old = vm_id or await self.vm_id(node)
        self._slurm.record(f"cloud.{rung.value}", node)
        if self.admin_drain_reason is not None:
            self._slurm.set_reason(node, self.admin_drain_reason)
        stopped_at: float | None = None
        new = old
        if rung != Rung.RESET_GPU:
            stopped_at = time.time()
            if rung == Rung.REPLACE:
                new = self._vms[node] = self._new_vm()
            self._slurm.boot(node, slurmd_start_time=math.ceil(stopped_at))
        result = RepairResult(
            node=node, rung=rung, old_vm_id=old, new_vm_id=new, stopped_at=stopped_at
        )
        self._repairs[idempotency_key] = result
        return result

    async def replace(self, node: str, idempotency_key: str) -> ReplaceResult:
        self.replace_calls.append((node, idempotency_key))
        if idempotency_key in self._done:
            return self._done[idempotency_key]
        if self.fail:
            raise CloudError(f"replace {node}: no capacity for this instance type")
        if self.hold:
            self.started.set()
            await self.release.wait()
        old = await self.vm_id(node)
        stopped_at = time.time()
        self._slurm.record("cloud.replace", node)
        if self.admin_drain_reason is not None:
            self._slurm.set_reason(node, self.admin_drain_reason)
        new = self._vms[node] = self._new_vm()
        self._slurm.boot(node, slurmd_start_time=math.ceil(stopped_at))
        result = ReplaceResult(node=node, old_vm_id=old, new_vm_id=new, stopped_at=stopped_at)
        self._done[idempotency_key] = result
        return result


class FakeHealth:
    """The health gate over the fake cluster: the node fails its checks until it has had a
    repair at `fixed_by` or higher on the ladder (a GPU reset does not fix a lost GPU).

    fixed_by=None: no repair ever fixes it (the node fails every health gate).

    agent: the node's agent too: when the node passes, the check (run as the health_gate
      activity) sends its incident a healthy snapshot observed now, from a new boot, as the
      agent of a repaired machine would (False: no agent reports; the gate waits for one).
    """

    def __init__(
        self, cloud: FakeCloud, fixed_by: Rung | None = Rung.RESET_GPU, *, agent: bool = True
    ) -> None:
        self._cloud = cloud
        self.fixed_by = fixed_by
        self.agent = agent
        self.checks: list[str] = []

    async def check(self, node: str) -> HealthReport:
        self.checks.append(node)
        done = [r for n, r, _ in self._cloud.repair_calls if n == node]
        fixed_by = self.fixed_by
        ok = fixed_by is not None and any(LADDER.index(r) >= LADDER.index(fixed_by) for r in done)
        if ok:
            detail = "clean"
        elif fixed_by is None:
            detail = "fault persists whatever is repaired"
        else:
            detail = f"fault persists until {fixed_by.value}"
        report = HealthReport(
            node=node,
            passed=ok,
            checks=[HealthCheck(name="gpu_faults", passed=ok, detail=detail)],
            checked_at=time.time(),
            expected_gpus=GPUS,
        )
        if ok and self.agent and activity.in_activity():
            await send_evidence(agent_snapshot(node, boot_id=f"boot-after-repair-{len(done)}"))
        return report


GPUS = 8


def agent_snapshot(
    node: str,
    *,
    observed_at: datetime | None = None,
    boot_id: str = "boot-1",
    gpus: int = GPUS,
    faults: dict[str, datetime | None] | None = None,
    ib_down: int = 0,
) -> HealthSnapshot:
    """What a node agent sends: healthy unless told otherwise. `faults`: fault kind ->
    when last seen (None: at `observed_at`); `ib_down`: that many ports down."""
    at = observed_at or datetime.now(UTC)
    ports = [
        IbPortState(
            hca=f"mlx5_{i}", port=1, healthy=i >= ib_down,
            state="4: ACTIVE" if i >= ib_down else "1: DOWN",
            phys_state="5: LinkUp" if i >= ib_down else "3: Disabled",
        )
        for i in range(8)
    ]  # fmt: skip
    return HealthSnapshot.build(
        node=node,
        observed_at=at,
        boot_id=boot_id,
        gpu_count=gpus,
        expected_gpus=GPUS,
        faults=[
            ActiveFault(fault=f, message=f"{f} seen", last_at=when or at)
            for f, when in (faults or {}).items()
        ],
        firing=list(faults or {}),
        infiniband=ports,
        backend="fake",
    )


async def send_evidence(
    snap: HealthSnapshot, *, client: Client | None = None, cluster: str | None = None
) -> EvidenceAck:
    """Send `snap` to its node's incident (the API's forward); inside an activity, to the
    activity's own workflow."""
    if client is None or cluster is None:
        own = activity.info().workflow_id
        assert own is not None, "an activity of a workflow"
        handle = activity.client().get_workflow_handle(own)
    else:
        handle = client.get_workflow_handle(workflow_id(cluster, snap.node))
    return await handle.execute_update("health_evidence", snap, result_type=EvidenceAck)


class RecordingNotifier:
    """A `Notifier` (integrations.notify) that keeps every notification it is sent."""

    def __init__(self) -> None:
        self.notes: list[Notification] = []

    async def send(self, note: Notification) -> None:
        self.notes.append(note)

    @property
    def events(self) -> list[str]:
        return [n.event for n in self.notes]


class ReportSink:
    """The agent's reporter, keeping what it would send (the agent's tests)."""

    def __init__(self) -> None:
        self.reports: list[NodeReport] = []

    def submit(self, reports: list[NodeReport]) -> None:
        self.reports += reports

    def flush(self) -> None:
        pass
