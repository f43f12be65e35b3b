"""The sandbox's cloud: the Crusoe Cloud API emulator, in every mode.

The worker creates the sandbox's cluster and machines (`ClusterProvisioning`) and repairs
them the way it does real ones, over signed HTTP; the emulator's sandbox backend
(`sandbox.machines.backend.SandboxMachines`) makes what it does happen to local daemons: a Managed
Slurm cluster is slurmctld (with slurmdbd on MariaDB) and an SSH login endpoint, a VM is the
slurmd of the node of the same name. Replacing a node deletes its VM and creates one with
the same name and spec.
"""

from __future__ import annotations

import base64
import os
import secrets
import sys

import httpx

from autoclusters.integrations.tls import default_verify
from autoclusters.sandbox.runtime.config import SandboxConfig

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
    argv = [
        sys.executable, "-m", "autoclusters.sandbox.crusoe.emulator",
        "--port", str(cfg.crusoe_port),
        "--access-key-id", cfg.crusoe_access_key_id,
        "--project", cfg.crusoe_project,
        "--boot-delay-s", str(cfg.boot_delay_s),
        "--operation-s", "0.5",
        "--backend", "autoclusters.sandbox.machines.backend:SandboxMachines",
        "--backend-arg", str(cfg.state_dir),
        "--state", str(cfg.emulator_state(CRUSOE_EMULATOR)),
    ]  # fmt: skip
    if cfg.k8s:
        # A CMK cluster's get-credentials hands out the sandbox's one kubeconfig (HTTPS, its
        # CA), as Crusoe's does; `slinky.prepare` writes it before anything starts.
        argv += ["--kubeconfig", str(cfg.kubeconfig)]
    return argv


def crusoe_emulator_env(cfg: SandboxConfig) -> dict[str, str]:
    # The secret travels in the environment, not on the command line (`ps` shows that).
    return {"CRUSOE_SECRET_KEY": cfg.crusoe_secret()}


def answers(port: int, path: str) -> bool:
    try:
        return (
            httpx.get(
                f"http://127.0.0.1:{port}{path}", timeout=1, verify=default_verify()
            ).status_code
            == 200
        )
    except httpx.HTTPError:
        return False
