"""The CMK platform of the sandbox (`sandbox up --platform cmk`): Slurm as Slinky on a CMK
cluster, provisioned by provider `crusoe-cmk` as a customer's would be.

What a customer has before AutoClusters provisions anything, the sandbox makes at `up`:
- the CMK cluster, created through the Crusoe emulator's API with the add-ons the provider
  needs (`slurm_operator`, the Slinky operator; `autoclusters`, the replace path), and its
  id in the worker's and the API's settings (`[crusoe] cluster_id`, with the kubeconfig: the
  worker serves crusoe-cmk);
- the cluster's system node: the CPU node a CMK cluster runs its control workloads on
  (here, the Slurm control pods: slurmctld, slurmdbd, sshd);
- the Slinky operator with its kubelet (sandbox/slinky/operator.py `--state-dir`), and the
  Kubernetes emulator told that the Slurm pods are run by that kubelet;
- the node agent's DaemonSet, as shipped (deploy/kubernetes/agent.yaml), whose pods that
  kubelet runs as the agents (sandbox/slinky/agent_daemonset.py says what the sandbox substitutes).
"""

from __future__ import annotations

import httpx

from autoclusters.activities.crusoe_machines import op_meta
from autoclusters.core.sharing import INFERENCE_APP, INFERENCE_APP_LABEL
from autoclusters.integrations.crusoe import CrusoeClient, load_credentials
from autoclusters.integrations.crusoe.resources import SLURM_OPERATOR_ADD_ON
from autoclusters.sandbox.runtime.config import SandboxConfig
from autoclusters.sandbox.runtime.daemons import SandboxError
from autoclusters.sandbox.slinky import pool_size
from autoclusters.sandbox.slinky.agent_daemonset import APP as AGENT_APP
from autoclusters.sandbox.slinky.agent_daemonset import install as install_agent

AUTOCLUSTERS_ADD_ON = "autoclusters"
CMK_VERSION = "1.33.4-cmk.1"
# The pods the emulated kubelet runs (sandbox/slinky/kubelet.py: the Slurm daemons and the
# agent's DaemonSet pods), beside the inference pods the inference kubelet runs: the
# Kubernetes emulator leaves their status to them.
EXTERNAL_PODS = (
    f"{INFERENCE_APP_LABEL} in ({INFERENCE_APP},slurmctld,slurmdbd,login,slurmd,{AGENT_APP})"
)


def system_node(cfg: SandboxConfig) -> str:
    return f"{cfg.cluster}-system-1"


def emulator_args() -> list[str]:
    return ["--external-kubelet", EXTERNAL_PODS]


def operator_args(cfg: SandboxConfig) -> list[str]:
    return [
        "--state-dir", str(cfg.state_dir), "--system-node", system_node(cfg),
        "--max-pool-nodes", str(pool_size.max_nodes(cfg)),
    ]  # fmt: skip


def register_system_node(cfg: SandboxConfig) -> None:
    """The CMK cluster's CPU node, Ready (no GPUs: no NodeSet selects it, nor the agent's
    DaemonSet); and what the `autoclusters` add-on installs on the cluster: the agent's
    DaemonSet as shipped (deploy/kubernetes/agent.yaml: sandbox/slinky/agent_daemonset.py), whose
    pods the GPU Nodes get as they register."""
    with httpx.Client(base_url=cfg.k8s_url, timeout=10, verify=cfg.k8s_tls()) as k8s:
        r = k8s.post(
            "/_emulator/nodes",
            json={
                "name": system_node(cfg),
                "labels": {"node.kubernetes.io/instance-type": "c1a.4x"},
                "gpus": 0,
                "ready": True,
            },
        )
        r.raise_for_status()
    install_agent(cfg)


async def create_cluster(cfg: SandboxConfig) -> str:
    """The CMK cluster, through the Crusoe API as a customer makes it; its id."""
    creds = load_credentials(config_path=cfg.crusoe_config)
    client = CrusoeClient(credentials=creds, project_id=cfg.crusoe_project, poll_s=0.2)
    body = {
        "name": cfg.cluster,
        "location": "local",
        "version": CMK_VERSION,
        "add_ons": [SLURM_OPERATOR_ADD_ON, AUTOCLUSTERS_ADD_ON],
    }
    try:
        op = await client.create_kubernetes_cluster(body)
        done = await client.wait_operation(op, "kubernetes_cluster", timeout_s=60)
    finally:
        await client.aclose()
    cluster_id = op_meta(done, "cluster_id") or op_meta(op, "cluster_id")
    if cluster_id is None:
        raise SandboxError(f"CMK cluster {cfg.cluster} was created but its id is not known")
    return cluster_id
