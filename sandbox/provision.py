"""The sandbox's Slurm cluster, provisioned the way a customer's is: `ClusterProvisioning`
run by the sandbox's own worker with `examples/clusters/sandbox.yaml`, sized to the sandbox.

`sandbox up` starts only the infrastructure (Temporal, the emulators, Slack, the worker, the
API); everything Slurm (slurmctld, slurmdbd on MariaDB, the SSH login endpoint, one slurmd
per machine) is created by this workflow through the Crusoe emulator's Managed Slurm and
VM endpoints.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml
from temporalio.client import Client, WorkflowFailureError
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.contrib.pydantic import pydantic_data_converter

from autoclusters.core.cluster import (
    CLUSTER_PROVISIONING_WORKFLOW,
    ClusterProvisioningInput,
    ClusterState,
    provisioning_workflow_id,
)
from autoclusters.core.cluster_spec import ClusterSpec, parse_cluster_spec
from autoclusters.core.policy import Policy
from autoclusters.sandbox.runtime.config import SandboxConfig
from autoclusters.sandbox.runtime.daemon_failure import daemon_failed
from autoclusters.sandbox.runtime.daemons import SandboxError
from autoclusters.sandbox.runtime.processes import ProcessTable, _exited

# The repo's examples (autoclusters/sandbox links to <repo>/sandbox): the Managed Slurm
# platform's, and the CMK platform's (provider crusoe-cmk).
SANDBOX_SPEC = Path(__file__).resolve().parents[1] / "examples" / "clusters" / "sandbox.yaml"
CMK_SPEC = SANDBOX_SPEC.with_name("cmk.yaml")


def ssh_key(cfg: SandboxConfig) -> Path:
    """The sandbox operator's SSH key: root on the login endpoint (`ssh -i` it)."""
    return cfg.state_dir / "ssh" / "id_ed25519"


def ensure_ssh_key(cfg: SandboxConfig) -> str:
    key = ssh_key(cfg)
    if not key.exists():
        key.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "sandbox-operator",
             "-f", str(key)],
            check=True, capture_output=True, timeout=30,
        )  # fmt: skip
    return key.with_suffix(".pub").read_text().strip()


def sandbox_spec(cfg: SandboxConfig, policy: Policy) -> ClusterSpec:
    """The platform's example spec sized to this sandbox: its name, one `gpu` node set of the
    nodes and spares, the operator's key on the login endpoint, the sandbox's policy."""
    example = CMK_SPEC if cfg.cmk else SANDBOX_SPEC
    raw: dict[str, Any] = yaml.safe_load(example.read_text(encoding="utf-8"))
    raw["name"] = cfg.cluster
    raw["accounting"] = cfg.accounting
    (gpu,) = raw["node_sets"]
    gpu["count"] = cfg.nodes + cfg.spares
    raw["login"]["ssh_public_keys"] = [*raw["login"]["ssh_public_keys"], ensure_ssh_key(cfg)]
    raw["policy"] = policy.model_dump(mode="json")
    spec = parse_cluster_spec(yaml.safe_dump(raw, sort_keys=False), str(example))
    if spec.nodes() != cfg.node_names():
        raise SandboxError(f"the sandbox spec names {spec.nodes()}, not {cfg.node_names()}")
    return spec


class Provisioned:
    def __init__(self, state: ClusterState, seconds: float) -> None:
        self.state, self.seconds = state, seconds


async def provision(cfg: SandboxConfig, policy: Policy, timeout_s: float) -> Provisioned:
    """Run ClusterProvisioning for the sandbox and wait for it: the cluster ready, or a
    SandboxError with the workflow's failure."""
    spec = sandbox_spec(cfg, policy)
    client = await Client.connect(cfg.temporal_address, data_converter=pydantic_data_converter)
    started = time.monotonic()
    handle = await client.start_workflow(
        CLUSTER_PROVISIONING_WORKFLOW,
        ClusterProvisioningInput(
            spec=spec, policy=policy, boot_timeout_s=max(60.0, 6 * cfg.boot_delay_s)
        ),
        id=provisioning_workflow_id(spec.name),
        task_queue=cfg.task_queue,
        result_type=ClusterState,
        # A fresh sandbox is a fresh cluster: a run left by a sandbox that died mid-way
        # (its Temporal database is kept in the state dir) must not drive this one.
        id_conflict_policy=WorkflowIDConflictPolicy.TERMINATE_EXISTING,
        memo={"provider": spec.provider, "location": spec.location},  # `cluster list`
    )
    watch = asyncio.ensure_future(_a_machine_daemon_exits(cfg))
    try:
        state: ClusterState = await _first(handle.result(), watch, timeout_s)
    except WorkflowFailureError as e:
        cause = e.cause
        raise SandboxError(
            f"provisioning cluster {spec.name} failed: {getattr(cause, 'message', cause)} "
            f"(Temporal UI: {cfg.temporal_ui_url}/namespaces/default/workflows/{handle.id})"
        ) from None
    except TimeoutError:
        raise SandboxError(
            f"cluster {spec.name} not ready after {timeout_s:.0f}s "
            f"(Temporal UI: {cfg.temporal_ui_url}/namespaces/default/workflows/{handle.id})"
        ) from None
    finally:
        watch.cancel()
    return Provisioned(state, time.monotonic() - started)


# The machines' daemons that the provisioning's steps wait on (Slurm's registration, the
# health gate's first agent report), which nothing else would miss: one that exits (an
# agent whose /metrics port was taken, ci15 of 2026-12-06) leaves the gate waiting out its
# 300 s for a report that never comes. The boot stops at once instead, naming it.
_MACHINE_DAEMONS = ("agent-", "slurmd-")
# How long a daemon's record may stay dead before it counts as exited: a stop in progress
# removes its record at once, and on the CMK platform the emulated kubelet starts a pod's
# dead container again (restartPolicy Always) within a pass or two.
_DEAD_FOR_S = 5.0


async def _a_machine_daemon_exits(cfg: SandboxConfig, dead_for_s: float = _DEAD_FOR_S) -> None:
    """Raises once a machine's daemon has stayed exited for `dead_for_s`."""
    table = ProcessTable(cfg.state_dir)
    dead_since: dict[tuple[str, int], float] = {}
    while True:
        now = time.monotonic()
        dead = {
            (r.name, r.pid)
            for r in table.records()
            if r.name.startswith(_MACHINE_DAEMONS) and _exited(r)
        }
        dead_since = {d: dead_since.get(d, now) for d in dead}
        if gone := sorted(d for d, since in dead_since.items() if now - since >= dead_for_s):
            name = gone[0][0]
            raise daemon_failed(table, name, f"{name} exited while the cluster was provisioned")
        await asyncio.sleep(1.0)


async def _first(result: Any, watch: asyncio.Future[None], timeout_s: float) -> ClusterState:
    """The workflow's result, unless the watch raises first (or `timeout_s` passes)."""
    done = asyncio.ensure_future(result)
    try:
        await asyncio.wait({done, watch}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        if watch.done():
            watch.result()  # it raised
        if not done.done():
            raise TimeoutError
        state: ClusterState = done.result()
        return state
    finally:
        done.cancel()


async def provision_seconds(client: Client, cluster: str) -> float | None:
    """Spec -> cluster ready, as the provisioning workflow recorded it (None: not ready)."""
    handle = client.get_workflow_handle(provisioning_workflow_id(cluster))
    state: ClusterState = await handle.query("status", result_type=ClusterState)
    if state.ready_at is None or not state.steps:
        return None
    return round((state.ready_at - state.steps[0].started_at).total_seconds(), 3)
