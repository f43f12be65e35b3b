"""`autoclusters sandbox restart COMPONENT` and `autoclusters chaos --kill X --at STEP`, on a
real Slurm-on-Kubernetes sandbox (Crusoe emulator included): one of the matrices' (tests/
matrix_sandbox.py), after their cases, in the group whose cases take least:

- the worker (SIGKILL) and the API (SIGTERM, through the CLI) come back with new PIDs, the
  API answers, and an incident opened afterwards resolves;
- slurmctld SIGKILLed and restarted: a drained node is still drained under its reason and a
  running job is still running, not requeued;
- the emulators come back with their worlds (VMs, Nodes), which are on disk as soon as a
  change is answered (a crash right after keeps it);
- chaos SIGKILLs the worker when the incident reaches `repair`: it resolves with exactly one
  cloud operation, counted from the Crusoe emulator's own record;
- a real kubectl reads the sandbox, and `kubectl cordon` / `uncordon` reach Slurm through
  the sandbox's Slinky operator.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable

import httpx
import pytest
from temporalio.client import Client

from autoclusters.clients import incidents
from autoclusters.core.models import IncidentState, SlurmNode
from autoclusters.core.settings import Settings, load_file
from autoclusters.integrations import temporal
from autoclusters.integrations.slurm import SlurmCli
from autoclusters.sandbox import restart
from autoclusters.sandbox.crusoe import cloud_api
from autoclusters.sandbox.drivers.chaos import ChaosError, run_chaos
from autoclusters.sandbox.runtime.config import SandboxConfig
from autoclusters.sandbox.runtime.daemons import SandboxError
from autoclusters.sandbox.runtime.processes import ProcessTable
from autoclusters.sandbox.slinky import kubernetes_mode as slinky
from autoclusters.workflows.remediation import NodeRemediation
from tests.helpers import cancel, eventually, job, running, submit_progress_job
from tests.matrix_sandbox import matrix_group

pytestmark = [pytest.mark.integration, matrix_group(2)]  # matrix-2: ~290 s of cases

CLI = [sys.executable, "-m", "autoclusters.clients.cli"]


def _settings(cfg: SandboxConfig) -> Settings:
    return load_file(cfg.settings_file)


async def _resolve(cfg: SandboxConfig, node: str, fault: str = "XID_48") -> IncidentState:
    settings = _settings(cfg)
    client: Client = await temporal.connect(settings)
    opened = await incidents.open_incident(client, settings, node, fault, opened_by="test")
    handle = client.get_workflow_handle_for(
        NodeRemediation.run, opened.workflow_id, run_id=opened.run_id
    )
    return await asyncio.wait_for(handle.result(), 240)


def _pid(cfg: SandboxConfig, name: str) -> int:
    rec = ProcessTable(cfg.state_dir).get(name)
    assert rec is not None
    return rec.pid


async def test_worker_and_api_restart_and_an_incident_still_resolves(
    matrix_sandbox: SandboxConfig,
) -> None:
    cfg = matrix_sandbox
    table = ProcessTable(cfg.state_dir)
    before = {name: _pid(cfg, name) for name in ("worker", "api", "temporal")}

    done = await asyncio.to_thread(restart.restart, cfg, "worker", kill=True)
    assert (done.old_pid, done.signal) == (before["worker"], "SIGKILL")
    assert done.new_pid != done.old_pid and table.alive("worker")

    r = subprocess.run(
        [*CLI, "sandbox", "restart", "api", "--state-dir", str(cfg.state_dir)],
        env={**os.environ, "AUTOCLUSTERS_CONFIG": str(cfg.settings_file)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert f"restarted api: pid {before['api']} (SIGTERM) -> pid {_pid(cfg, 'api')}" in r.stdout
    assert _pid(cfg, "api") != before["api"] and table.alive("api")
    async with httpx.AsyncClient() as http:
        assert (await http.get(f"{cfg.api_url}/healthz")).status_code == 200
    assert _pid(cfg, "temporal") == before["temporal"]  # nothing else was touched

    final = await _resolve(cfg, "gpu-03")
    assert final.status == "resolved", final


async def test_slurmctld_killed_keeps_drains_and_jobs(matrix_sandbox: SandboxConfig) -> None:
    cfg = matrix_sandbox
    slurm = SlurmCli(cfg.slurm_conf)
    env = {**os.environ, "SLURM_CONF": str(cfg.slurm_conf)}
    reason = "test: drained by an admin"
    saved = cfg.state_dir / "slurm" / "ctld"  # StateSaveLocation
    drained_at = time.time()
    subprocess.run(
        ["scontrol", "update", "NodeName=gpu-01", "State=DRAIN", f"Reason={reason}"],
        env=env, check=True,
    )  # fmt: skip
    job_id = submit_progress_job(cfg, "-w", "gpu-02")
    try:
        started = await eventually(lambda: running(slurm, job_id), 60, "job running")
        nodes_before = {n.name: (n.drained, n.reason) for n in await slurm.nodes()}
        assert nodes_before["gpu-01"] == (True, reason)

        # A change to the running job, so that the next save of the jobs holds it running: a
        # save made between its submission and its start (after the drain all the same)
        # once brought it back PENDING.
        marked_at = time.time()
        subprocess.run(
            ["scontrol", "update", f"JobId={job_id}", "Comment=test: saved running"],
            env=env, check=True,
        )  # fmt: skip

        async def state_saved() -> bool:
            # A SIGKILLed slurmctld keeps what it had saved: its state-save thread writes
            # within seconds of a change.
            since = {"node_state": drained_at, "job_state": marked_at}
            return all((saved / f).exists() and (saved / f).stat().st_mtime > t
                       for f, t in since.items())  # fmt: skip

        await eventually(state_saved, 30, "slurmctld to save the drain and the job")
        done = await asyncio.to_thread(restart.restart, cfg, "slurmctld", kill=True)
        assert done.new_pid != done.old_pid

        async def all_responding() -> bool:
            nodes = await slurm.nodes()
            return len(nodes) == len(cfg.node_names()) and all(n.responding for n in nodes)

        await eventually(all_responding, 60, "every slurmd registered with the new slurmctld")
        assert {n.name: (n.drained, n.reason) for n in await slurm.nodes()} == nodes_before
        after = await job(slurm, job_id)
        assert after is not None and after.job_state == "RUNNING"
        assert (after.restart_cnt, after.nodes) == (started.restart_cnt, started.nodes)
    finally:
        cancel(cfg, job_id)
        subprocess.run(["scontrol", "update", "NodeName=gpu-01", "State=RESUME"], env=env)


async def test_emulators_restart_with_their_worlds(matrix_sandbox: SandboxConfig) -> None:
    cfg = matrix_sandbox

    def world() -> tuple[dict[str, str], list[str]]:
        crusoe = httpx.get(f"http://127.0.0.1:{cfg.crusoe_port}/_emulator/state").json()
        k8s = httpx.get(f"{cfg.k8s_url}/_emulator/state", verify=cfg.k8s_tls()).json()
        vms = {vm["name"]: vm["id"] for vm in crusoe["vms"].values()}
        return vms, sorted(n["metadata"]["name"] for n in k8s["nodes"])

    before = world()
    assert sorted(before[0]) == cfg.node_names() and before[1] == cfg.node_names()
    for name in (cloud_api.CRUSOE_EMULATOR, slinky.K8S_EMULATOR):
        old = _pid(cfg, name)
        done = await asyncio.to_thread(restart.restart, cfg, name)
        assert done.old_pid == old and done.new_pid != old
    assert world() == before
    with pytest.raises(SandboxError, match="not running"):
        restart.restart(cfg, "no-such-thing")


async def test_a_change_is_on_disk_once_answered_and_a_crash_keeps_it(
    matrix_sandbox: SandboxConfig,
) -> None:
    """The restart used to save an emulator's live state just before its SIGTERM: a cloud
    operation started in between was lost, and the repair polling it got 404 (a red CI).
    Now each emulator rewrites its state file after every change."""
    cfg = matrix_sandbox
    node = cfg.node_names()[0]
    mark = {"test.autoclusters.io/mark": f"kept-{time.monotonic_ns()}"}
    headers = {
        "Authorization": f"Bearer {cfg.k8s_token()}",
        "Content-Type": "application/merge-patch+json",
    }
    url = f"{cfg.k8s_url}/api/v1/nodes/{node}"
    httpx.patch(
        url, json={"metadata": {"labels": mark}}, headers=headers, verify=cfg.k8s_tls()
    ).raise_for_status()

    saved = json.loads(cfg.emulator_state(slinky.K8S_EMULATOR).read_text())
    on_disk = {o["metadata"]["name"]: o for o in saved["objects"]["nodes"]}
    assert mark.items() <= on_disk[node]["metadata"]["labels"].items()
    crusoe = json.loads(cfg.emulator_state(cloud_api.CRUSOE_EMULATOR).read_text())
    assert sorted(vm["name"] for vm in crusoe["vms"].values()) == cfg.node_names()

    await asyncio.to_thread(restart.restart, cfg, slinky.K8S_EMULATOR, kill=True)
    labels = httpx.get(url, headers=headers, verify=cfg.k8s_tls()).json()["metadata"]["labels"]
    assert mark.items() <= labels.items()


async def test_chaos_kill_worker_at_repair_counts_one_cloud_operation(
    matrix_sandbox: SandboxConfig,
) -> None:
    report = await run_chaos(matrix_sandbox, "XID_48", node="gpu-02", kill="worker", at="repair")
    assert report.status == "resolved", report
    assert report.actions[0].startswith("killed worker ") and report.actions[0].endswith(
        "during repair"
    )
    assert report.actions[1].startswith("started worker ")
    assert report.repairs == ["reboot"]
    # The emulator's own record: one RESET of the node's VM, not two.
    assert report.cloud_operations == 1, report.cloud_operation_log
    assert report.cloud_operation_log[0].startswith("RESET ")
    assert report.machine_operations == report.cloud_operations
    r = subprocess.run(
        [*CLI, "chaos", "--kill", "scheduler", "--at", "repair", "--state-dir",
         str(matrix_sandbox.state_dir)],
        env={**os.environ, "COLUMNS": "300"}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    # Typer's own usage error (exit 2), naming what may be killed.
    assert r.returncode == 2, r.stderr
    assert all(f"'{w}'" in r.stderr for w in ("worker", "temporal", "api", "slurmctld"))
    with pytest.raises(ChaosError, match="go together"):
        await run_chaos(matrix_sandbox, "XID_48", node="gpu-02", kill="worker")


async def test_kubectl_reads_the_sandbox_through_the_kubeconfig_up_prints(
    matrix_sandbox: SandboxConfig,
) -> None:
    """`sandbox up` prints `KUBECONFIG=<state>/k8s/kubeconfig kubectl get nodes`: a real
    kubectl sees the sandbox's Nodes and slurmd pods through the kubeconfig the worker uses
    (HTTPS: kubectl sends its token only over TLS), after the restarts above too."""
    env = {**os.environ, "KUBECONFIG": str(matrix_sandbox.kubeconfig)}

    def kubectl(*args: str) -> list[str]:
        done = subprocess.run(
            ["kubectl", *args, "-o", "name"], env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        return sorted(done.stdout.split())

    names = matrix_sandbox.node_names()
    assert kubectl("get", "nodes") == [f"node/{n}" for n in names]
    assert kubectl("get", "pods", "-n", "slurm") == [f"pod/slurmd-{n}" for n in names]


async def test_kubectl_cordon_drains_the_slurm_node_and_uncordon_undrains_it(
    matrix_sandbox: SandboxConfig,
) -> None:
    """Slinky's semantics through a real kubectl: the sandbox's Slinky operator drains the
    Slurm node of a cordoned Node (the operator's reason), and undrains it on uncordon,
    because the drain was its own."""
    cfg = matrix_sandbox
    env = {**os.environ, "KUBECONFIG": str(cfg.kubeconfig)}
    slurm = SlurmCli(cfg.slurm_conf)
    node = cfg.node_names()[-1]

    def kubectl(*args: str) -> None:
        done = subprocess.run(
            ["kubectl", *args], env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr

    async def slurm_node() -> SlurmNode:
        n = await slurm.node(node)
        assert n is not None
        return n

    assert not (await slurm_node()).drained
    kubectl("cordon", node)
    drained = await eventually(
        lambda: _when(slurm_node(), lambda n: n.drained), 30, "the Slurm node drained"
    )
    assert drained.reason.startswith("slurm-operator: "), drained.reason
    kubectl("uncordon", node)
    back = await eventually(
        lambda: _when(slurm_node(), lambda n: not n.drained), 30, "the Slurm node undrained"
    )
    assert back.reason == ""


async def _when(read: Awaitable[SlurmNode], ok: Callable[[SlurmNode], bool]) -> SlurmNode | None:
    n = await read
    return n if ok(n) else None
