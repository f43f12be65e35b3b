"""The sandbox's cloud: the Crusoe Cloud API emulator, in every mode.

The worker repairs sandbox machines the way it repairs real ones, with `CrusoeCloud` over
signed HTTP; the emulator's VM backend (`sandbox.machines.SandboxMachines`) makes what it
does to a VM happen to the sandbox node of the same name. Every node's machine is a VM of
one managed node pool, so replacing a node is deleting its VM and the pool boots a new one.
"""

from __future__ import annotations

import base64
import os
import secrets
import sys

import httpx

from autoclusters.sandbox.config import SandboxConfig
from autoclusters.sandbox.vms import VmRegistry

CRUSOE_EMULATOR = "crusoe-emulator"


def prepare(cfg: SandboxConfig) -> None:
    """The API secret, and the Crusoe CLI's config file (`~/.crusoe/config`) naming it."""
    (cfg.state_dir / "crusoe").mkdir(parents=True, exist_ok=True)
    secret_file = cfg.state_dir / "crusoe" / "secret"
    if not secret_file.exists():
        raw = base64.urlsafe_b64encode(secrets.token_bytes(32)).decode().rstrip("=")
        secret_file.write_text(raw)
        os.chmod(secret_file, 0o600)
    cfg.crusoe_config.write_text(
        "[default]\n"
        f'access_key_id = "{cfg.crusoe_access_key_id}"\n'
        f'secret_key = "{cfg.crusoe_secret()}"\n'
        f'default_project = "{cfg.crusoe_project}"\n'
        f'api_endpoint = "{cfg.crusoe_url}"\n'
    )
    os.chmod(cfg.crusoe_config, 0o600)


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
    """Every node's machine as a VM of the node pool, under the id the sandbox gave it."""
    vms = VmRegistry(cfg.state_dir)
    seed_vms = []
    for node in cfg.node_names():
        rec = vms.get(node)
        assert rec is not None, f"no VM record for {node}"
        seed_vms.append({"id": rec.vm_id, "name": node, "node_pool_id": cfg.crusoe_pool})
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


def answers(port: int, path: str) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}{path}", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False
