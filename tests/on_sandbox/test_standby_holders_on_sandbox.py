"""Standbys held outside the job, end to end on the sandbox's Slurm (core/holders.py,
examples/training `HOLDERS=1`): the in-job example job (2 nodes training, 1 standby in its
allocation) and a holder job on the fourth node, under the shipped policy with
`standby_holders: 1`. The first fault uses the job's own standby, and the runbook gives
the job the holder, into which its batch shell starts a new standby (`srun --jobid
--overlap`); the second fault, with no standby left in the allocation, is recovered in
place from the holder: no requeue, no step lost, the holder's node training. And once the
run's ranks all run in holders but one, the fence of that one's node ends the job's own
step: the run goes on in the holders (the 30-minute ETTR run's fourth fault,
docs/recovery.md)."""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

if importlib.util.find_spec("torch") is None:
    pytest.skip("torch is not installed (the training extra)", allow_module_level=True)

from temporalio.client import Client  # noqa: E402

from autoclusters.core.settings import Settings  # noqa: E402
from autoclusters.sandbox.runtime.config import SandboxConfig  # noqa: E402
from tests.helpers import fresh_policy, resolve_incident  # noqa: E402
from tests.on_sandbox.test_training import SBATCH, sbatch_env, step_lines, until  # noqa: E402

pytestmark = pytest.mark.integration  # torch jobs on the session's real sandbox

HOLDER = "standby-holder"


@pytest.mark.timeout(420)
async def test_a_second_fault_is_recovered_in_place_from_a_holder(
    sandbox: SandboxConfig, sandbox_settings: Settings, sandbox_client: Client, tmp_path: Path
) -> None:
    env = {**sbatch_env(sandbox, tmp_path, ckpt_every=5), "SPARES": "1", "HOLDERS": "1",
           "MAX_RESTARTS": "10", "INJOB_DIR": str(tmp_path / "injob")}  # fmt: skip

    def slurm(*argv: str) -> str:
        return subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout

    def field(job: int, fmt: str) -> str:
        return slurm("squeue", "-h", "-j", str(job), "-o", fmt).strip()

    def holders() -> dict[int, tuple[str, str, str]]:
        """The holder jobs Slurm shows: id -> (state, node, comment)."""
        out = {}
        for line in slurm("squeue", "-h", f"--name={HOLDER}", "-o", "%i|%T|%N|%k").splitlines():
            i, state, node, comment = line.split("|")
            out[int(i)] = (state, node, comment)
        return out

    nodes = sandbox.node_names()
    holder = int(slurm("sbatch", "--parsable", f"--job-name={HOLDER}", f"--nodelist={nodes[-1]}",
                       "--exclusive", "--no-requeue", "--output=/dev/null", "--comment=holder=1",
                       "--wrap=exec sleep infinity").split(";")[0])  # fmt: skip
    log = tmp_path / "train.log"
    job = int(slurm("sbatch", "--parsable", "--nodes=3", "--no-kill", f"--output={log}",
                    f"--exclude={nodes[-1]}", str(SBATCH)).split(";")[0])  # fmt: skip
    # Each incident's own budget: beside other suites' torch jobs a re-forming may be slow;
    # what is checked here is the path (bench/ettr.py measures the time).
    policy = fresh_policy(in_job_budget_s=120, standby_holders=1)
    try:

        def training(elastic: int) -> set[str] | None:
            now = {d["node"] for d in step_lines(log) if d["elastic"] == elastic}
            return now if len(now) == 2 else None

        first = await asyncio.to_thread(until, lambda: training(0), 120, "steps on two nodes")
        assert "holders=1" in field(job, "%k")
        batch_host = field(job, "%B")
        # Whichever two nodes joined first train (the batch host may be the standby).
        victim = sorted(first - {batch_host})[0]

        # First fault: the job's own standby takes the seat; the holder is given to it and
        # a standby started in it.
        state = await resolve_incident(sandbox_client, sandbox_settings, victim, "XID_79", policy)
        assert state.status == "resolved", state.error
        assert state.recovery_path == {job: "in-job"} and state.requeued_jobs == []
        step = state.step("requeue")
        assert step is not None and f"{job} given holder {holder}" in step.detail
        second = await asyncio.to_thread(until, lambda: training(1), 60, "the re-formed group")
        assert victim not in second
        assert holders()[holder][2].split() == ["holder=1", f"holder_for={job}.0"]
        launched = await asyncio.to_thread(
            until, lambda: "event=holder" in log.read_text(), 30, "a standby in the holder"
        )
        assert launched
        # The victim, repaired and returned, got a new holder (the pool keeps one free).
        fresh = [i for i in holders() if i != holder]
        assert len(fresh) == 1 and holders()[fresh[0]][1] == victim

        # Second fault, on a training node that is not the batch host: no standby is left in
        # the allocation; the holder's takes the seat.
        victim = sorted(second - {batch_host})[0]
        fault_at = time.time()
        state = await resolve_incident(sandbox_client, sandbox_settings, victim, "XID_79", policy)
        assert state.status == "resolved", state.error
        step = state.step("requeue")
        assert state.recovery_path == {job: "in-job"}, step and step.detail
        assert state.requeued_jobs == []
        now = await asyncio.to_thread(until, lambda: training(2), 60, "steps from the holder")
        assert now == (second - {victim}) | {nodes[-1]}  # the holder's node trains
        after = [d for d in step_lines(log) if d["elastic"] == 2]
        print(f"second fault to the next step: {after[0]['ts'] - fault_at:.2f}s")
        # No step lost (it goes on from the newest step of the group before), no requeue.
        before = [d for d in step_lines(log) if d["elastic"] == 1]
        assert after[0]["resumed_from"] == max(d["step"] for d in before)
        assert after[0]["step"] == after[0]["resumed_from"] + 1
        assert {d["restart"] for d in after} == {0}
        assert "Restarts=0" in slurm("scontrol", "show", "job", str(job))
    finally:
        for i in [job, *holders()]:
            subprocess.run(["scancel", str(i)], env=env, capture_output=True)
        await asyncio.to_thread(
            until, lambda: not _queued(env, [job, *holders()]), 60, "the jobs to go"
        )


def _queued(env: dict[str, str], jobs: list[int]) -> str:
    if not jobs:
        return ""
    ids = ",".join(map(str, jobs))
    return subprocess.run(
        ["squeue", "-h", "-j", ids, "-t", "PD,R,CG"], env=env, capture_output=True, text=True
    ).stdout.strip()


@pytest.mark.timeout(420)
async def test_the_run_goes_on_in_holders_when_its_own_step_loses_its_last_node(
    sandbox: SandboxConfig, tmp_path: Path
) -> None:
    """The 30-minute ETTR run's fourth fault, in small: once every rank of the run runs in
    holders but one, the fence of that one's node (the runbook's release of it from the
    job) takes the last node of the job's own step, and Slurm ends the step ("Killing JobId
    StepId=0 on failed node", srun "Force Terminated"). The survivors in the holders re-form
    and go on; the batch shell keeps the store up and requeues nothing (it used to take its
    srun's end for the run's: the store closed, the job requeued itself)."""
    env = {**sbatch_env(sandbox, tmp_path, ckpt_every=5), "SPARES": "1", "HOLDERS": "1",
           "LAUNCHER": "1", "TRAIN_NODES": "2", "MAX_RESTARTS": "10",
           "INJOB_DIR": str(tmp_path / "injob")}  # fmt: skip

    def slurm(*argv: str) -> str:
        return subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout

    def field(job: int, fmt: str) -> str:
        return slurm("squeue", "-h", "-j", str(job), "-o", fmt).strip()

    nodes = sandbox.node_names()
    held = [int(slurm("sbatch", "--parsable", f"--job-name={HOLDER}", f"--nodelist={node}",
                      "--exclusive", "--no-requeue", "--output=/dev/null", "--comment=holder=1",
                      "--wrap=exec sleep infinity").split(";")[0])
            for node in nodes[2:4]]  # fmt: skip
    log = tmp_path / "train.log"
    # A launcher (the batch host) and one node of its own step, which trains with a
    # holder's: the step's one node stands for the last of a run that lost the others.
    job = int(slurm("sbatch", "--parsable", "--nodes=2", "--no-kill", f"--output={log}",
                    f"--exclude={','.join(nodes[2:4])}", str(SBATCH)).split(";")[0])  # fmt: skip

    def give(holder: int) -> None:
        """What the runbook does to give the job a holder: claim it, SIGUSR2 the shell."""
        slurm("scontrol", "update", f"JobId={holder}", f"Comment=holder=1 holder_for={job}.0")
        slurm("scancel", "--batch", "--signal=USR2", str(job))

    def training(elastic: int) -> set[str] | None:
        now = {d["node"] for d in step_lines(log) if d["elastic"] == elastic}
        return now if len(now) == 2 else None

    try:
        await asyncio.to_thread(until, lambda: "holders=1" in field(job, "%k"), 120, "holders=1")
        batch_host = field(job, "%B")
        (own,) = set(slurm("scontrol", "show", "hostnames", field(job, "%N")).split()) - {
            batch_host
        }
        give(held[0])
        first = await asyncio.to_thread(until, lambda: training(0), 120, "steps with a holder")
        assert first == {own, nodes[2]}
        give(held[1])  # a standby in the second holder
        await asyncio.to_thread(
            until, lambda: log.read_text().count("event=holder ") == 2, 30, "the second holder"
        )

        # The fence of the step's last node (its process killed: the survivor's collective
        # fails), and the runbook's USR2 to the job's steps: none left, not an error.
        slurm("scontrol", "update", f"JobId={job}", f"NodeList={batch_host}")
        slurm("scancel", "--signal=USR2", str(job))

        def going_on() -> list[dict[str, Any]] | None:
            lines = [d for d in step_lines(log) if d["elastic"] >= 1]
            return lines if len({d["step"] for d in lines}) >= 3 else None

        after = await asyncio.to_thread(until, going_on, 90, "steps in the holders")
        text = log.read_text()
        assert "Force Terminated" in text  # Slurm ended the job's own step
        assert "event=own_step_ended" in text
        assert "event=requeue" not in text, text[-3000:]
        assert {d["node"] for d in after} == set(nodes[2:4])
        assert {d["restart"] for d in after} == {0}
        # No step lost: it goes on from the newest step completed before the fence.
        before = [d for d in step_lines(log) if d["elastic"] == 0]
        assert after[0]["resumed_from"] == max(d["step"] for d in before)
        assert "Restarts=0" in slurm("scontrol", "show", "job", str(job))
        assert field(job, "%T") == "RUNNING"
    finally:
        for i in [job, *held]:
            subprocess.run(["scancel", str(i)], env=env, capture_output=True)
        await asyncio.to_thread(until, lambda: not _queued(env, [job, *held]), 60, "the jobs to go")
