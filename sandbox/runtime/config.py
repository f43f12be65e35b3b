"""Where a sandbox lives and which ports it uses; two sandboxes differ in both."""

from __future__ import annotations

import hashlib
import json
import ssl
import tempfile
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, model_validator

from autoclusters.core.settings import CONFIG_FILE_NAME, DEFAULT_SANDBOX_DIR
from autoclusters.sandbox.runtime import api_tokens

GPUS_PER_NODE = 8
SLACK_TOKEN = "xoxb-sandbox"  # the emulator's bot token (a sandbox has no real secrets)
MAX_AGENT_PORTS = 72  # nodes (64) + spares (8): port_base + 100 .. + 171
PORT_SPAN = 100 + MAX_AGENT_PORTS  # a sandbox uses ports port_base .. port_base + PORT_SPAN - 1
# The training jobs' rendezvous ports (examples/training's RDZV_PORT_BASE, RDZV_PORTS),
# port_base + 82 .. + 89: after the last slurmd's, inside this sandbox's range, so another
# sandbox's job (its job ids are the same small numbers) never takes this one's store.
JOB_PORTS = 8


class SandboxConfig(BaseModel):
    state_dir: Path = DEFAULT_SANDBOX_DIR
    cluster: str = Field(default="sandbox", pattern=r"^[a-z][a-z0-9]{0,30}$")
    nodes: int = Field(default=4, ge=2, le=64)
    # Hot spares: extra nodes (after the `nodes`), healthy, kept drained as spares.
    spares: int = Field(default=0, ge=0, le=8)
    port_base: int = Field(default=17200, ge=1024, le=65000)
    boot_delay_s: float = Field(default=20.0, ge=0)
    task_queue: str = "autoclusters"
    # Slurm on Kubernetes (Slinky-style), emulated on loopback; the Crusoe Cloud API emulator
    # fronts the machines in both modes.
    k8s: bool = False
    # Kubernetes mode: the inference side too (its kubelet and gateway, the Deployment the
    # share demos grow). Off: a sandbox whose tests send no inference load.
    inference: bool = True
    # Where the cluster's Slurm runs: Crusoe Managed Slurm (the emulator's daemons), or Slinky
    # on a CMK cluster (provider crusoe-cmk: the emulated operator's pods run the daemons).
    # cmk implies Kubernetes mode.
    platform: Literal["managed-slurm", "cmk"] = "managed-slurm"
    # The CMK cluster `sandbox up` created through the Crusoe emulator (platform cmk).
    cmk_cluster_id: str = ""
    # The fleet guard's circuit breaker (more than this many incidents within its window).
    breaker_threshold: int = Field(default=5, ge=1)
    # Who may approve in the sandbox (the shipped default trusts nobody).
    approvers: list[str] = Field(default_factory=lambda: ["alice", "bob"])
    # Slurm accounting (slurmdbd on a private MariaDB) in the provisioned cluster.
    accounting: bool = True
    # The node agents POST their fault reports to the API; off: faults reach it only through
    # Prometheus -> Alertmanager -> the API's webhook (sandbox/monitoring.py).
    agent_reports: bool = True

    @model_validator(mode="after")
    def _cmk_is_kubernetes(self) -> SandboxConfig:
        if self.platform == "cmk":
            self.k8s = True
        return self

    @property
    def cmk(self) -> bool:
        return self.platform == "cmk"

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

    @property
    def api_port(self) -> int:
        return self.port_base + 7

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def slack_port(self) -> int:
        return self.port_base + 8

    def slack_secret(self) -> str:
        return (self.state_dir / "slack" / "secret").read_text().strip()

    def slack_users(self) -> dict[str, str]:
        """The sandbox workspace's Slack users, as the policy's approvers."""
        return {f"U_{name.upper()}": name for name in self.approvers}

    @property
    def ticket_desk_port(self) -> int:
        """The provider's ticket desk (sandbox/crusoe/ticket_desk.py), when started."""
        return self.port_base + 97

    @property
    def ticket_desk_url(self) -> str:
        return f"http://127.0.0.1:{self.ticket_desk_port}"

    @property
    def handoff_secret_file(self) -> Path:
        """The secret the worker, the API and the ticket desk share (docs/handoff.md)."""
        return self.state_dir / "handoff" / "secret"

    def api_token(self) -> str:
        return (self.state_dir / "api" / "token").read_text().strip()

    def agent_file(self, node: str) -> Path:
        return self.state_dir / "agent" / f"{node}.json"

    def agent_spool(self, node: str) -> Path:
        """The node's agent's spool and memory (its disk: a reboot keeps it, a new machine
        starts without it)."""
        return self.state_dir / "agent" / f"{node}.spool"

    @property
    def k8s_port(self) -> int:
        return self.port_base + 5

    @property
    def k8s_ca(self) -> Path:
        """The emulator's HTTPS certificate (and so its CA: it signs itself); made once by
        `sandbox up` beside its key, so a restarted emulator presents the same one."""
        return self.state_dir / "k8s" / "tls.crt"

    def k8s_tls(self) -> ssl.SSLContext:
        """What httpx's `verify=` needs to talk to the emulator."""
        return ssl.create_default_context(cafile=self.k8s_ca)

    def emulator_state(self, name: str) -> Path:
        """The JSON file an emulator (Kubernetes, Crusoe) keeps its world in, rewritten
        after every change, so that a restart loses nothing a request changed. A fresh
        `sandbox up` removes it (an empty world)."""
        return self.state_dir / "emulators" / f"{name}.json"

    @property
    def crusoe_port(self) -> int:
        return self.port_base + 6

    @property
    def k8s_url(self) -> str:
        """HTTPS only: kubectl sends its token only over TLS (sandbox/kubernetes/tls.py)."""
        return f"https://127.0.0.1:{self.k8s_port}"

    @property
    def crusoe_url(self) -> str:
        return f"http://127.0.0.1:{self.crusoe_port}/v1"

    # The sandbox's Kubernetes and Crusoe identities (written by `sandbox up`).
    crusoe_project: str = "sandbox-project"
    crusoe_access_key_id: str = "sandbox-key"
    nodeset_uid: str = "00000000-0000-4000-8000-00000000c0de"

    @property
    def kubeconfig(self) -> Path:
        """The one kubeconfig (HTTPS, the CA, the token): the worker's, the sandbox's own
        clients' and `KUBECONFIG=... kubectl get nodes`."""
        return self.state_dir / "k8s" / "kubeconfig"

    @property
    def crusoe_config(self) -> Path:
        return self.state_dir / "crusoe" / "config"

    def k8s_token(self) -> str:
        return (self.state_dir / "k8s" / "token").read_text().strip()

    def crusoe_secret(self) -> str:
        return (self.state_dir / "crusoe" / "secret").read_text().strip()

    def slurmd_port(self, index: int) -> int:
        return self.port_base + 10 + index

    @property
    def job_port_base(self) -> int:
        """The first of the training jobs' JOB_PORTS rendezvous ports."""
        return self.port_base + 82

    # The Managed Slurm cluster's own daemons: after the last slurmd port (64 + 8 nodes).
    @property
    def login_port(self) -> int:
        """The cluster's SSH login endpoint."""
        return self.port_base + 9

    @property
    def slurmdbd_port(self) -> int:
        return self.port_base + 90

    @property
    def mariadb_port(self) -> int:
        return self.port_base + 91

    # Monitoring (sandbox/monitoring.py): Prometheus, Alertmanager, the worker's /metrics,
    # and one /metrics port per agent after them (nodes + spares: 72 at most).
    @property
    def prometheus_port(self) -> int:
        return self.port_base + 92

    @property
    def alertmanager_port(self) -> int:
        return self.port_base + 93

    @property
    def worker_metrics_port(self) -> int:
        return self.port_base + 94

    @property
    def prometheus_url(self) -> str:
        return f"http://127.0.0.1:{self.prometheus_port}"

    @property
    def alertmanager_url(self) -> str:
        return f"http://127.0.0.1:{self.alertmanager_port}"

    # The inference side (Kubernetes mode): the gateway in front of the inference pods.
    @property
    def inference_gateway_port(self) -> int:
        return self.port_base + 95

    @property
    def inference_gateway_url(self) -> str:
        return f"http://127.0.0.1:{self.inference_gateway_port}"

    def agent_metrics_port(self, node: str) -> int:
        """gpu-NN's agent serves /metrics on port_base + 99 + NN (gpu-01: +100)."""
        number = int(node.rsplit("-", 1)[-1])
        if not 1 <= number <= MAX_AGENT_PORTS:
            raise ValueError(f"{node}: no agent metrics port (gpu-01 .. gpu-{MAX_AGENT_PORTS})")
        return self.port_base + 99 + number

    @property
    def temporal_address(self) -> str:
        return f"127.0.0.1:{self.temporal_port}"

    @property
    def temporal_ui_url(self) -> str:
        return f"http://127.0.0.1:{self.temporal_ui_port}"

    def node_names(self) -> list[str]:
        """Every Slurm node of the sandbox, the spares last."""
        return [f"gpu-{i:02d}" for i in range(1, self.nodes + self.spares + 1)]

    def spare_names(self) -> list[str]:
        return self.node_names()[self.nodes :]

    # Paths.
    @property
    def slurm_conf(self) -> Path:
        return self.state_dir / "slurm" / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.state_dir / "munge" / "munge.socket"

    @property
    def spool_dir(self) -> Path:
        """slurmd's spool: short on purpose, slurmstepd puts Unix sockets in it (108 bytes
        at most), and a state dir can be deep (pytest's are)."""
        digest = hashlib.sha1(str(self.state_dir.resolve()).encode()).hexdigest()[:10]
        return Path(tempfile.gettempdir()) / f"acspool-{digest}"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "log"

    @property
    def progress_dir(self) -> Path:
        """Where the sandbox's training jobs publish their ranks' progress
        (AUTOCLUSTERS_PROGRESS_DIR) and its agents read it (AUTOCLUSTERS_AGENT_PROGRESS_DIR):
        one directory per sandbox, since sandboxes share this host and their job ids are the
        same small numbers. Its nodes share it as a job's nodes would share its directory on
        shared storage: every agent sees the whole job (docs/detection.md)."""
        return self.state_dir / "jobs" / "progress"

    @property
    def settings_file(self) -> Path:
        return self.state_dir / CONFIG_FILE_NAME

    @property
    def policy_file(self) -> Path:
        return self.state_dir / "policy.yaml"

    @property
    def record_file(self) -> Path:
        return self.state_dir / "autoclusters.sandbox.json"

    def save(self) -> None:
        self.record_file.write_text(self.model_dump_json(indent=2))

    @classmethod
    def load(cls, state_dir: Path) -> SandboxConfig:
        return cls.model_validate(json.loads((state_dir / "autoclusters.sandbox.json").read_text()))

    def settings_toml(self) -> str:
        """The settings every AutoClusters process of this sandbox reads (AUTOCLUSTERS_CONFIG)."""
        top: dict[str, object] = {
            "cluster": self.cluster,
            "policy_file": str(self.policy_file),
            # The machines are the Crusoe emulator's VMs in every mode.
            "cloud_provider": "crusoe",
            "api_port": self.api_port,
            "api_inventory": "slurm",
            # The CLI's way to the API (`autoclusters approve`, with a person's own token).
            "api_url": self.api_url,
        }
        tables: dict[str, dict[str, object]] = {
            "temporal": {
                "address": self.temporal_address,
                "ui_url": self.temporal_ui_url,
                "task_queue": self.task_queue,
            },
            "slurm": {"conf": str(self.slurm_conf)},
            "crusoe": {
                "config_file": str(self.crusoe_config),
                "project_id": self.crusoe_project,
                "poll_s": 0.5,
            },
            "sandbox": {"state_dir": str(self.state_dir), "boot_delay_s": self.boot_delay_s},
            "remediation": {"admission_poll_s": 5},
            "worker": {"metrics_port": self.worker_metrics_port},
            # The console's GPU charts and the worker's GPU demand read Prometheus;
            # incidents silence their node's other alerts in Alertmanager; the agents'
            # series carry the node as `node` (sandbox/monitoring.py).
            "monitoring": {
                "prometheus_url": self.prometheus_url,
                "alertmanager_url": self.alertmanager_url,
                "alert_node_label": "node",
            },
            # The sandbox's console needs no login from this machine (the API binds loopback).
            "console": {"loopback_open": True},
        }
        if self.k8s:
            tables["kubernetes"] = {"kubeconfig": str(self.kubeconfig)}
        if self.cmk_cluster_id:
            # With the kubeconfig, the worker serves provider crusoe-cmk on this CMK cluster.
            tables["crusoe"]["cluster_id"] = self.cmk_cluster_id
        if (self.state_dir / "api" / "token").exists():
            top["api_tokens"] = api_tokens.grants(self)
        if self.handoff_secret_file.exists():
            tables["handoff"] = {"secret": self.handoff_secret_file.read_text().strip()}
        if (self.state_dir / "slack" / "secret").exists():
            top["api_public_url"] = self.api_url
            tables["slack"] = {
                "token": SLACK_TOKEN,
                "channel": "C00000001",  # the emulator's #incidents
                "base_url": f"http://127.0.0.1:{self.slack_port}/api/",
                "signing_secret": self.slack_secret(),
                "approvers": self.slack_users(),
                "store_dir": str(self.state_dir / "slack" / "threads"),
            }
        # Top-level keys first: in TOML, a key after a [table] header belongs to that table.
        out = "".join(f"{k} = {_toml(v)}\n" for k, v in top.items())
        for name, table in tables.items():
            out += f"\n[{name}]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in table.items())
        return out


def _toml(value: object) -> str:
    """A TOML value: JSON's scalars and arrays are TOML too; a table is written inline."""
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + " }"
    return json.dumps(value)
