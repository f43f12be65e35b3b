"""Issue 12 on a real sandbox: the cluster `sandbox up` provisioned through
`ClusterProvisioning` (examples/clusters/sandbox.yaml) is a working Slurm cluster, and it is
scaled, torn down and created again by the workflows and the CLI.

One sandbox for the module, the tests in order: they tell one story (a job over SSH, scale
down under a running job, scale up through a failed boot, teardown, a quota refusal, a
`cluster create` from the example spec).
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from autoclusters.core import hostlist
from autoclusters.core.cluster import ClusterState, provisioning_workflow_id
from autoclusters.core.cluster_ops import OpsState, ScaleNodeSetInput, ops_workflow_id
from autoclusters.core.cluster_spec import load_cluster_spec
from autoclusters.core.evidence import HealthSnapshot
from autoclusters.integrations.slurm import SlurmCli
from autoclusters.sandbox import cluster, provision
from autoclusters.sandbox.runtime.config import SandboxConfig
from autoclusters.workflows.cluster_ops import ScaleNodeSet
from tests.conftest import free_port_base
from tests.helpers import eventually, job

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "clusters" / "sandbox.yaml"
CLI = [sys.executable, "-m", "autoclusters.clients.cli"]


@pytest_asyncio.fixture(scope="module")
async def cfg(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[SandboxConfig]:
    # Named as the example spec, so `cluster create -f examples/clusters/sandbox.yaml` makes
    # this sandbox's cluster again at the end.
    spec, _ = load_cluster_spec(EXAMPLE)
    c = SandboxConfig(
        state_dir=tmp_path_factory.mktemp("provisioned"), cluster=spec.name,
        nodes=spec.node_sets[0].count, port_base=free_port_base(), boot_delay_s=1,
        breaker_threshold=100, accounting=True,
    )  # fmt: skip
    await asyncio.to_thread(cluster.up, c)
    try:
        yield c
    finally:
        await asyncio.to_thread(cluster.down, c)


@pytest_asyncio.fixture(scope="module")
async def client(cfg: SandboxConfig) -> Client:
    return await Client.connect(cfg.temporal_address, data_converter=pydantic_data_converter)


def _env(cfg: SandboxConfig) -> dict[str, str]:
    return {**os.environ, "SLURM_CONF": str(cfg.slurm_conf)}


def _ssh(cfg: SandboxConfig, command: str) -> str:
    """`command` as root on the cluster's login endpoint, with the operator's key."""
    r = subprocess.run(
        ["ssh", "-i", str(provision.ssh_key(cfg)), "-p", str(cfg.login_port),
         "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
         "-o", "BatchMode=yes", "-o", "LogLevel=ERROR", "root@127.0.0.1", command],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return r.stdout


async def _provisioned(client: Client, cfg: SandboxConfig) -> ClusterState:
    handle = client.get_workflow_handle(provisioning_workflow_id(cfg.cluster))
    state: ClusterState = await handle.query("status", result_type=ClusterState)
    return state


def _emulator(cfg: SandboxConfig, path: str, body: dict[str, Any] | None = None) -> Any:
    url = f"http://127.0.0.1:{cfg.crusoe_port}/_emulator{path}"
    r = httpx.post(url, json=body, timeout=10) if body is not None else httpx.get(url, timeout=10)
    r.raise_for_status()
    return r.json()


def _vm_names(cfg: SandboxConfig) -> list[str]:
    return sorted(vm["name"] for vm in _emulator(cfg, "/state")["vms"].values())


async def test_a_job_submitted_over_ssh_runs_on_every_node(
    cfg: SandboxConfig, client: Client
) -> None:
    state = await _provisioned(client, cfg)
    assert state.status == "ready", state.failure
    nodes = cfg.node_names()
    assert sorted(state.nodes) == nodes and set(state.nodes.values()) == {"healthy"}
    # Every node's gate heard from the node's own agent (through the API), as remediation's.
    handle = client.get_workflow_handle(provisioning_workflow_id(cfg.cluster))
    heard = [
        e.workflow_execution_update_accepted_event_attributes.accepted_request.input
        async for e in handle.fetch_history_events()
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED
    ]
    assert {h.name for h in heard} == {"health_evidence"}
    snaps = [await client.data_converter.decode(h.args.payloads, [HealthSnapshot]) for h in heard]
    assert sorted({s.node for [s] in snaps}) == nodes
    out = cfg.state_dir / "jobs" / "over-ssh-%j.out"
    job_id = int(
        _ssh(
            cfg,
            f"sbatch --parsable -N{len(nodes)} --output={out} "
            f"--wrap 'srun -N{len(nodes)} --ntasks-per-node=1 printenv SLURMD_NODENAME'",
        ).strip()
    )
    slurm = SlurmCli(cfg.slurm_conf)

    async def completed() -> bool:
        j = await job(slurm, job_id)
        assert j is None or j.job_state not in ("FAILED", "CANCELLED", "NODE_FAIL"), j
        return j is not None and j.job_state == "COMPLETED"

    await eventually(completed, 60, "the job over SSH completes")
    ran_on = Path(str(out).replace("%j", str(job_id))).read_text().split()
    assert sorted(ran_on) == nodes

    topology = subprocess.run(
        ["scontrol", "show", "topology"], env=_env(cfg), capture_output=True, text=True, check=True
    ).stdout
    generated = re.findall(r"^SwitchName=(\S+)", state.topology_conf, re.M)
    assert generated, state.topology_conf
    for switch in generated:
        assert f"SwitchName={switch} " in topology, topology

    # slurmctld sends the job's end to slurmdbd on its own schedule: accounting catches up.
    async def accounted() -> str | None:
        out = subprocess.run(
            ["sacct", "-X", "-n", "-P", "-j", str(job_id), "--format=JobID,State,NodeList"],
            env=_env(cfg), capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        return out if out.startswith(f"{job_id}|COMPLETED|") else None

    await eventually(accounted, 60, "sacct shows the job COMPLETED")


async def _scale(client: Client, cfg: SandboxConfig, count: int) -> OpsState:
    from autoclusters.clients.clusters import provisioned_input
    from autoclusters.core.cluster import ClusterProvisioningInput

    desc = await client.get_workflow_handle(provisioning_workflow_id(cfg.cluster)).describe()
    inp: ClusterProvisioningInput = await provisioned_input(client, desc.id, desc.run_id)
    handle = await client.start_workflow(
        ScaleNodeSet.run,
        ScaleNodeSetInput(spec=inp.spec, node_set="gpu", count=count, incident_poll_s=1),
        id=ops_workflow_id(cfg.cluster),
        task_queue=cfg.task_queue,
    )
    return await asyncio.wait_for(handle.result(), 180)


async def test_scale_down_requeues_the_job_once_and_deletes_only_an_idle_node(
    cfg: SandboxConfig, client: Client
) -> None:
    slurm = SlurmCli(cfg.slurm_conf)
    nodes = cfg.node_names()
    # Every node busy with one checkpointing job that can also run one node short.
    job_id = int(
        subprocess.run(
            ["sbatch", "--parsable", "--requeue", f"--nodes={len(nodes) - 1}-{len(nodes)}",
             f"--output={cfg.state_dir}/jobs/scale-%j.out",
             "--wrap", "srun --ntasks-per-node=1 sleep 600"],
            env=_env(cfg), capture_output=True, text=True, check=True,
        ).stdout.strip()
    )  # fmt: skip

    async def on_all() -> bool:
        j = await job(slurm, job_id)
        return (
            j is not None
            and j.job_state == "RUNNING"
            and len(hostlist.expand(j.nodes)) == len(nodes)
        )

    await eventually(on_all, 60, "the job runs on every node")
    since = datetime.now().astimezone()
    ops = await _scale(client, cfg, len(nodes) - 1)
    assert ops.status == "done", ops.failure
    [gone] = ops.removed
    assert ops.requeued == [job_id]

    async def back_short() -> bool:
        j = await job(slurm, job_id)
        return j is not None and j.job_state == "RUNNING" and gone not in hostlist.expand(j.nodes)

    await eventually(back_short, 60, "the job runs again without the removed node")
    j = await job(slurm, job_id)
    assert j is not None and j.restart_cnt == 1
    assert gone not in _vm_names(cfg)
    # Its agent left with the machine, so Prometheus no longer scrapes it.
    await eventually(
        lambda: _scraped(cfg, lambda up: gone not in up), 30, f"{gone} out of Prometheus' targets"
    )
    # The machine went only once the node ran nothing: the deletion started after the
    # requeue took the job off it (the step that waited for idle finished first).
    [delete] = [
        o for o in _emulator(cfg, f"/operations?vm_name={gone}")["operations"]
        if o["action"] == "DELETE" and datetime.fromisoformat(o["started_at"]) >= since
    ]  # fmt: skip
    idle = next(s for s in ops.steps if s.name.startswith("remove_nodes"))
    assert idle.started_at <= datetime.fromisoformat(delete["started_at"])
    subprocess.run(["scancel", str(job_id)], env=_env(cfg), check=True)


async def test_scale_up_replaces_a_machine_that_fails_to_boot_and_gates_it(
    cfg: SandboxConfig, client: Client
) -> None:
    nodes = cfg.node_names()
    missing = sorted(set(nodes) - set(_vm_names(cfg)))
    assert len(missing) == 1
    _emulator(cfg, "/boot-faults", {"name": "*", "mode": "fail", "count": 1})
    ops = await _scale(client, cfg, len(nodes))
    assert ops.status == "done", ops.failure
    assert ops.replaced == 1 and ops.added == missing
    slurm = SlurmCli(cfg.slurm_conf)
    node = await slurm.node(missing[0])
    assert node is not None and node.responding and not node.drained, node
    assert _vm_names(cfg) == nodes
    # Registered drained and gated before it could take a job: the history says so.
    gate = [s.name for s in ops.steps]
    assert gate.index("register_and_gate") < gate.index(f"return_to_service {missing[0]}")
    # The new machine's agent is scraped (its GPU series reach the alert rules).
    await eventually(
        lambda: _scraped(cfg, lambda up: up.get(missing[0]) == "up"),
        30,
        f"Prometheus scraping {missing[0]}'s agent",
    )


async def _scraped(cfg: SandboxConfig, check: Callable[[dict[str, str]], bool]) -> bool:
    """`check` of {node: health} over Prometheus' active agent targets."""
    async with httpx.AsyncClient(base_url=cfg.prometheus_url, timeout=5) as prom:
        r = await prom.get("/api/v1/targets", params={"state": "active"})
    r.raise_for_status()
    up = {
        t["labels"]["node"]: t["health"]
        for t in r.json()["data"]["activeTargets"]
        if t["labels"].get("job") == "dcgm-exporter"
    }
    return bool(check(up))


def _cli(cfg: SandboxConfig, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AUTOCLUSTERS_CONFIG": str(cfg.settings_file)}
    return subprocess.run(
        [*CLI, "cluster", *args], env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.timeout(600)  # three whole workflows, one after the other
async def test_teardown_then_a_quota_refusal_then_create_from_the_example(
    cfg: SandboxConfig, client: Client
) -> None:
    r = _cli(cfg, "delete", cfg.cluster, "--yes", "--wait")
    assert r.returncode == 0, r.stdout + r.stderr
    assert _vm_names(cfg) == []
    assert _emulator(cfg, "/state")["slurm_clusters"] == {}

    _emulator(cfg, "/quota", {"max_vms": 2})
    r = _cli(cfg, "create", "-f", str(EXAMPLE))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "quota exceeded" in (r.stdout + r.stderr)
    assert _vm_names(cfg) == [] and _emulator(cfg, "/state")["slurm_clusters"] == {}

    _emulator(cfg, "/quota", {"max_vms": None})
    # One machine will not boot: it is replaced and the cluster still becomes ready.
    _emulator(cfg, "/boot-faults", {"name": "gpu-03", "mode": "fail", "count": 1})
    r = _cli(cfg, "create", "-f", str(EXAMPLE))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{cfg.temporal_ui_url}/namespaces/default/workflows/" in r.stdout
    state = await _provisioned(client, cfg)
    assert state.status == "ready" and _vm_names(cfg) == cfg.node_names()
    assert state.progress["gpu"].replaced == 1 and state.progress["gpu"].healthy == 4
