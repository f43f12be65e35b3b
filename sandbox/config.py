"""Where a sandbox lives and which ports it uses; two sandboxes differ in both."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, Field

from autoclusters.settings import CONFIG_FILE_NAME, DEFAULT_SANDBOX_DIR

GPUS_PER_NODE = 8


class SandboxConfig(BaseModel):
    state_dir: Path = DEFAULT_SANDBOX_DIR
    cluster: str = Field(default="sandbox", pattern=r"^[a-z][a-z0-9]{0,30}$")
    nodes: int = Field(default=4, ge=2, le=64)
    port_base: int = Field(default=17200, ge=1024, le=65000)
    boot_delay_s: float = Field(default=20.0, ge=0)
    task_queue: str = "autoclusters"
    # Who may approve in the sandbox (the shipped default trusts nobody).
    approvers: list[str] = Field(default_factory=lambda: ["alice", "bob"])

    # Ports, all derived from port_base so one number moves a whole sandbox.
    @property
    def temporal_port(self) -> int:
        return self.port_base

    @property
    def temporal_ui_port(self) -> int:
        return self.port_base + 1

    @property
    def slurmctld_port(self) -> int:
        return self.port_base + 2

    def slurmd_port(self, index: int) -> int:
        return self.port_base + 10 + index

    @property
    def temporal_address(self) -> str:
        return f"127.0.0.1:{self.temporal_port}"

    @property
    def temporal_ui_url(self) -> str:
        return f"http://127.0.0.1:{self.temporal_ui_port}"

    def node_names(self) -> list[str]:
        return [f"gpu-{i:02d}" for i in range(1, self.nodes + 1)]

    # Paths.
    @property
    def slurm_conf(self) -> Path:
        return self.state_dir / "slurm" / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.state_dir / "munge" / "munge.socket"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "log"

    @property
    def settings_file(self) -> Path:
        return self.state_dir / CONFIG_FILE_NAME

    @property
    def policy_file(self) -> Path:
        return self.state_dir / "policy.yaml"

    @property
    def record_file(self) -> Path:
        return self.state_dir / "sandbox.json"

    def save(self) -> None:
        self.record_file.write_text(self.model_dump_json(indent=2))

    @classmethod
    def load(cls, state_dir: Path) -> SandboxConfig:
        return cls.model_validate(json.loads((state_dir / "sandbox.json").read_text()))

    def settings_toml(self) -> str:
        """The settings every AutoClusters process of this sandbox reads (AUTOCLUSTERS_CONFIG)."""
        lines = {
            "temporal_address": self.temporal_address,
            "temporal_ui_url": self.temporal_ui_url,
            "task_queue": self.task_queue,
            "cluster": self.cluster,
            "slurm_conf": str(self.slurm_conf),
            "cloud_provider": "sandbox",
            "sandbox_state_dir": str(self.state_dir),
            "boot_delay_s": self.boot_delay_s,
            "policy_file": str(self.policy_file),
            "admission_poll_s": 5,
        }
        return "".join(f"{k} = {json.dumps(v)}\n" for k, v in lines.items())
