"""Fault effects on the real sandbox (sandbox/machines/fault_effects.py): a crash ends the rank's
process, a hang stops it and silences its connections until the machine's reboot through
the Crusoe emulator, a lost node's slurmd stops answering and Slurm marks it not responding.

The effects are applied alone (no agent reading, so no incident opens on the shared
sandbox); the reboot is the emulator's, as the runbook's would be."""

from __future__ import annotations

import asyncio
import os
import re
import socket
import subprocess
from pathlib import Path

import pytest

from autoclusters.core import hostlist
from autoclusters.integrations.crusoe import CrusoeClient, load_credentials
from autoclusters.integrations.slurm import SlurmCli
from autoclusters.sandbox.machines import fault_effects as fe
from autoclusters.sandbox.machines import names as machine_names
from autoclusters.sandbox.runtime.config import SandboxConfig
from autoclusters.sandbox.runtime.processes import ProcessTable
from tests.helpers import cancel, eventually, running, submit_progress_job

pytestmark = pytest.mark.integration  # the session's real sandbox

# One task that holds a TCP connection to itself and logs a line per exchange.
SOCKET_JOB = """#!/bin/bash
#SBATCH --nodes=1
#SBATCH --job-name=sockets
srun --ntasks=1 python3 -c '
import socket, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
c = socket.create_connection(s.getsockname()); a, _ = s.accept()
print("listening", s.getsockname()[1], flush=True)
while True:
    c.sendall(b"x"); a.recv(1); time.sleep(0.5)
'
"""


def _submit_socket_job(cfg: SandboxConfig, tmp_path: Path) -> int:
    script = tmp_path / "sockets.sh"
    script.write_text(SOCKET_JOB)
    out = subprocess.run(
        ["sbatch", "--parsable", f"--output={tmp_path}/sockets-%j.log", str(script)],
        env={**os.environ, "SLURM_CONF": str(cfg.slurm_conf)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return int(out.strip().split(";")[0])


async def _running_on(
    slurm: SlurmCli, cfg: SandboxConfig, job_id: int
) -> tuple[str, list[fe.Proc]]:
    """The job's node once its rank processes run there, and those processes."""
    job = await eventually(lambda: running(slurm, job_id), 60, f"job {job_id} running")
    node = hostlist.expand(job.nodes)[0]

    async def ranks() -> list[fe.Proc] | None:
        return fe.rank_processes(cfg, node, job_id) or None

    return node, await eventually(ranks, 30, f"job {job_id}'s ranks on {node}")


async def _reboot(cfg: SandboxConfig, node: str) -> None:
    """RESET through the Crusoe emulator: the machine's reboot, as the runbook's repair."""
    vm = machine_names.vm_of(cfg, node)
    assert vm is not None
    creds = load_credentials(config_path=cfg.crusoe_config)
    async with CrusoeClient(credentials=creds, project_id=cfg.crusoe_project, poll_s=0.2) as c:
        op = await c.patch_vm_action(vm.vm_id, "RESET")
        await c.wait_operation(op, "vm", timeout_s=120)


def _alive(p: fe.Proc) -> bool:
    return fe.start_ticks(p.pid) == p.ticks


async def test_crash_ends_the_ranks_process(sandbox: SandboxConfig, slurm: SlurmCli) -> None:
    job_id = submit_progress_job(sandbox, "--nodes=1")
    try:
        node, ranks = await _running_on(slurm, sandbox, job_id)
        fe.apply(sandbox, node, "crash", job_id=job_id)

        async def gone() -> bool:
            return not any(_alive(p) for p in ranks)

        await eventually(gone, 10, "the crashed rank's processes to be gone")
        assert fe.recorded(sandbox, node) is None  # nothing to lift at a reboot
        assert ProcessTable(sandbox.state_dir).alive(f"slurmd-{node}")  # the node is fine
    finally:
        cancel(sandbox, job_id)


async def test_hang_stops_and_silences_the_rank_until_the_reboot(
    sandbox: SandboxConfig, slurm: SlurmCli, tmp_path: Path
) -> None:
    job_id = _submit_socket_job(sandbox, tmp_path)
    try:
        node, ranks = await _running_on(slurm, sandbox, job_id)

        # The rank runs before it has made its connection (seconds apart under load).
        async def connected() -> bool:
            return len(fe.tcp_connections(fe.rank_processes(sandbox, node, job_id))) >= 2

        await eventually(connected, 60, f"job {job_id}'s rank connected to itself")
        rec = fe.apply(sandbox, node, "hang", job_id=job_id)
        # Every rank process still there (a step's short-lived helpers come and go).
        assert {p.pid for p in ranks if _alive(p)} <= {p.pid for p in rec.stopped}
        assert all(fe._state(p.pid) in ("T", None) for p in rec.stopped)  # noqa: SLF001
        # The client's connection and the one accepted for it: the same pair, both ways.
        log = tmp_path / f"sockets-{job_id}.log"

        async def listening_port() -> int | None:
            found = re.search(r"^listening (\d+)$", log.read_text(), re.M) if log.exists() else None
            return int(found[1]) if found else None

        listening = await eventually(listening_port, 30, "the job's listening port")
        (client,) = {local for local, remote in rec.connections if remote == listening}
        assert sorted(rec.connections) == sorted(
            [(client, listening), (listening, client), (listening, 0)]
        )
        rules = fe.table_rules(sandbox)
        assert rules is not None and f"{client} . {listening}" in rules
        # Those connections only (another socket may get one of their port numbers on this
        # shared host: connect() shares a port between destinations). Silent, not refused:
        # a SYN to the hung process's listening port gets no answer.
        with pytest.raises(TimeoutError):
            socket.create_connection(("127.0.0.1", listening), timeout=1).close()

        await _reboot(sandbox, node)
        assert fe.table_rules(sandbox) is None  # its chains, and the emptied table, gone
        assert fe.recorded(sandbox, node) is None
        assert not any(_alive(p) for p in ranks)  # the machine went down with them
    finally:
        cancel(sandbox, job_id)
        fe.lift(sandbox, node)


async def test_a_lost_node_stops_answering_slurm_until_the_reboot(
    sandbox: SandboxConfig, slurm: SlurmCli, tmp_path: Path
) -> None:
    job_id = _submit_socket_job(sandbox, tmp_path)
    node = ""
    try:
        node, ranks = await _running_on(slurm, sandbox, job_id)
        rec = fe.apply(sandbox, node, "lost")
        assert rec.slurmd is not None and fe._state(rec.slurmd.pid) == "T"  # noqa: SLF001
        # The ranks still there, and the rest of the node's job processes (slurmstepd...).
        assert {p.pid for p in ranks if _alive(p)} <= {p.pid for p in rec.stopped}
        assert rec.connections and fe.table_rules(sandbox) is not None

        async def not_responding() -> str | None:
            state = await _sinfo_state(sandbox, node)
            return state if state.endswith("*") or state.startswith("down") else None

        # SlurmdTimeout=15: slurmctld marks it after its next ping fails.
        print("slurm shows", await eventually(not_responding, 90, f"{node} not responding"))

        await _reboot(sandbox, node)
        assert fe.table_rules(sandbox) is None
        assert ProcessTable(sandbox.state_dir).alive(f"slurmd-{node}")

        async def responding() -> str | None:
            state = await _sinfo_state(sandbox, node)
            return state if not state.endswith("*") else None

        await eventually(responding, 60, f"{node} responding again")
    finally:
        cancel(sandbox, job_id)
        if node:
            fe.lift(sandbox, node)


async def _sinfo_state(cfg: SandboxConfig, node: str) -> str:
    out = await asyncio.to_thread(
        subprocess.run,
        ["sinfo", "-h", "-N", "-n", node, "-o", "%T"],
        env={**os.environ, "SLURM_CONF": str(cfg.slurm_conf)},
        capture_output=True,
        text=True,
    )
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else ""
