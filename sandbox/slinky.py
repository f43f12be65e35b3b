"""Kubernetes mode of the sandbox: a Slinky-style cluster on the emulated Kubernetes API,
fronted by the emulated Crusoe Cloud API.

Every Slurm node is also a Kubernetes Node (providerID `crusoe://<vm id>`) running a
slurmd pod owned by the NodeSet `gpu`; every node's machine is a VM of the managed node
pool, so replacing a node is deleting its VM and the pool boots a new one.
"""

from __future__ import annotations

import base64
import os
import secrets
import sys
import uuid

import httpx
import yaml

from autoclusters.core.kubernetes import INSTANCE_ID_LABEL
from autoclusters.sandbox.config import SandboxConfig
from autoclusters.sandbox.machines import NODESET, SLURM_NAMESPACE, ensure_slurmd_pod, provider_id
from autoclusters.sandbox.vms import VmRegistry

K8S_EMULATOR = "k8s-emulator"
CRUSOE_EMULATOR = "crusoe-emulator"


def prepare(cfg: SandboxConfig) -> None:
    """Credentials and the kubeconfig, as a real cluster hands them to an operator."""
    (cfg.state_dir / "k8s").mkdir(parents=True, exist_ok=True)
    (cfg.state_dir / "crusoe").mkdir(parents=True, exist_ok=True)
    token_file = cfg.state_dir / "k8s" / "token"
    if not token_file.exists():
        token_file.write_text(secrets.token_urlsafe(24))
        os.chmod(token_file, 0o600)
    secret_file = cfg.state_dir / "crusoe" / "secret"
    if not secret_file.exists():
        raw = base64.urlsafe_b64encode(secrets.token_bytes(32)).decode().rstrip("=")
        secret_file.write_text(raw)
        os.chmod(secret_file, 0o600)
    cfg.kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": cfg.cluster, "cluster": {"server": cfg.k8s_url}}],
                "users": [{"name": "autoclusters", "user": {"token": cfg.k8s_token()}}],
                "contexts": [
                    {
                        "name": cfg.cluster,
                        "context": {"cluster": cfg.cluster, "user": "autoclusters"},
                    }
                ],
                "current-context": cfg.cluster,
            }
        )
    )
    os.chmod(cfg.kubeconfig, 0o600)
    # The Crusoe CLI's own config format (~/.crusoe/config).
    cfg.crusoe_config.write_text(
        "[default]\n"
        f'access_key_id = "{cfg.crusoe_access_key_id}"\n'
        f'secret_key = "{cfg.crusoe_secret()}"\n'
        f'default_project = "{cfg.crusoe_project}"\n'
        f'api_endpoint = "{cfg.crusoe_url}"\n'
    )
    os.chmod(cfg.crusoe_config, 0o600)


def k8s_emulator_argv(cfg: SandboxConfig) -> list[str]:
    return [
        sys.executable, "-m", "autoclusters.sandbox.k8s_emulator",
        "--port", str(cfg.k8s_port), "--token", cfg.k8s_token(),
    ]  # fmt: skip


def crusoe_emulator_argv(cfg: SandboxConfig) -> list[str]:
    return [
        sys.executable, "-m", "autoclusters.sandbox.crusoe_emulator",
        "--port", str(cfg.crusoe_port),
        "--access-key-id", cfg.crusoe_access_key_id,
        "--project", cfg.crusoe_project,
        "--boot-delay-s", str(cfg.boot_delay_s),
        "--operation-s", "0.5",
        "--backend", "autoclusters.sandbox.machines:SandboxMachines",
        "--backend-arg", str(cfg.state_dir),
    ]  # fmt: skip


def crusoe_emulator_env(cfg: SandboxConfig) -> dict[str, str]:
    # The secret travels in the environment, not on the command line (`ps` shows that).
    return {"CRUSOE_SECRET_KEY": cfg.crusoe_secret()}


def seed(cfg: SandboxConfig) -> None:
    """The nodes as Kubernetes Nodes with their slurmd pods, and as VMs of one node pool."""
    vms = VmRegistry(cfg.state_dir)
    headers = {"Authorization": f"Bearer {cfg.k8s_token()}"}
    with httpx.Client(base_url=cfg.k8s_url, timeout=10) as k8s:
        k8s.post(
            "/api/v1/namespaces", json={"metadata": {"name": SLURM_NAMESPACE}}, headers=headers
        )
        r = k8s.post(
            f"/apis/slinky.slurm.net/v1beta1/namespaces/{SLURM_NAMESPACE}/nodesets",
            json={
                "apiVersion": "slinky.slurm.net/v1beta1",
                "kind": "NodeSet",
                "metadata": {"name": NODESET, "namespace": SLURM_NAMESPACE, "uid": cfg.nodeset_uid},
                "spec": {"replicas": cfg.nodes},
            },
            headers=headers,
        )
        if r.status_code not in (200, 201, 409):
            r.raise_for_status()
        for node in cfg.node_names():
            rec = vms.get(node)
            assert rec is not None
            k8s.post(
                "/_emulator/nodes",
                json={
                    "name": node,
                    "provider_id": provider_id(rec.vm_id),
                    "boot_id": str(uuid.uuid4()),
                    "labels": {INSTANCE_ID_LABEL: rec.vm_id, "nvidia.com/gpu.present": "true"},
                    "ready": True,
                },
            ).raise_for_status()
    _slurmd_pods(cfg)
    seed_vms = [
        {"id": vms.get(n).vm_id, "name": n, "node_pool_id": cfg.crusoe_pool}  # type: ignore[union-attr]
        for n in cfg.node_names()
    ]
    with httpx.Client(base_url=f"http://127.0.0.1:{cfg.crusoe_port}", timeout=10) as crusoe:
        crusoe.post(
            "/_emulator/vms",
            json={
                "node_pools": [
                    {
                        "id": cfg.crusoe_pool,
                        "name": "gpu",
                        "project_id": cfg.crusoe_project,
                        "count": cfg.nodes,
                        "instance_ids": [v["id"] for v in seed_vms],
                    }
                ],
                "vms": [{**v, "project_id": cfg.crusoe_project} for v in seed_vms],
            },
        ).raise_for_status()


def _slurmd_pods(cfg: SandboxConfig) -> None:
    import asyncio

    async def make() -> None:
        async with httpx.AsyncClient(base_url=cfg.k8s_url, timeout=10) as k8s:
            for node in cfg.node_names():
                await ensure_slurmd_pod(k8s, cfg, node)

    asyncio.run(make())


def answers(port: int, path: str) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}{path}", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False
