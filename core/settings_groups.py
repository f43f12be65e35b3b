"""The shared settings' groups, one per thing an operator configures (core/settings.py).

Each group is a TOML table (`[temporal]`) and an environment prefix with a double
underscore (`AUTOCLUSTERS_TEMPORAL__ADDRESS`). Plain models, not settings: only
`Settings` reads the environment and the file, and hands each group its part.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, SecretStr, field_validator

from autoclusters.core.handoff import MIN_SECRET_CHARS


class TemporalSettings(BaseModel):
    """Where the Temporal server is and how to reach it; the worker's task queue on it."""

    address: str = "127.0.0.1:7233"
    namespace: str = "default"
    ui_url: str = "http://127.0.0.1:8233"
    task_queue: str = "autoclusters"
    # A Temporal reached over TLS (Temporal Cloud, or a self-hosted frontend with TLS):
    # mTLS with a client certificate and key, or an API key (which implies TLS). Files, not
    # values, so they can be mounted from a Kubernetes Secret and rotated in place.
    tls: bool = Field(
        default=False, description="connect with TLS (implied by a client cert or API key)"
    )
    tls_cert: Path | None = Field(default=None, description="mTLS client cert (PEM)")
    tls_key: Path | None = Field(default=None, description="mTLS client key (PEM)")
    tls_ca: Path | None = Field(
        default=None, description="CA that signed the server's cert; None: the system roots"
    )
    tls_server_name: str | None = Field(
        default=None, description="the name the server's cert is checked against"
    )
    api_key: SecretStr | None = Field(
        default=None, description="Temporal Cloud API key (sent as a bearer token over TLS)"
    )

    @field_validator("tls_cert", "tls_key", "tls_ca", "tls_server_name", "api_key", mode="before")
    @classmethod
    def _empty_is_unset(cls, v: object) -> object:
        # A Secret or ConfigMap key left empty (a placeholder) means "not used", not the
        # path "." or an empty API key.
        return None if v == "" else v


class SlurmSettings(BaseModel):
    """The Slurm cluster's configuration file and commands."""

    conf: Path | None = Field(default=None, description="SLURM_CONF of the cluster")
    bin_dir: Path | None = Field(default=None, description="where sinfo, scontrol... are")


class KubernetesSettings(BaseModel):
    """Slurm on Kubernetes (Slinky): the cluster's kubeconfig; None: Slurm only."""

    kubeconfig: Path | None = None


class CrusoeSettings(BaseModel):
    """Crusoe: which project and cluster. Credentials come from CRUSOE_* or
    ~/.crusoe/config, never from here."""

    profile: str | None = None
    config_file: Path | None = None  # default ~/.crusoe/config
    project_id: str | None = None  # default: the credentials' default project
    cluster_id: str | None = None  # CMK cluster: replace through AutoClusters remediate
    node_pool_ids: list[str] = Field(default_factory=list)  # replace = delete, pool refills
    poll_s: float = 2
    replace_timeout_s: float = 840  # below remediation.repair_timeout_s


class SandboxSettings(BaseModel):
    """Set by `autoclusters sandbox up` for its own processes; unset in a deployment."""

    state_dir: Path | None = None
    boot_delay_s: float = Field(default=20.0, ge=0, description="replacement VM boot time")


class HealthSettings(BaseModel):
    """How a node is judged healthy: the GPUs it has, and the burn-in screen (policy
    burn_in) that runs on it."""

    expected_gpus: int = 8  # per node, for the health gate (and the screen's ranks per node)
    # A directory every node and the worker see, for the screen job's output and
    # rendezvous (None: the sandbox's state dir, else ~/.autoclusters/screens, which is
    # right only where that home is shared), and the Python with torch that runs it on the
    # nodes (None: the worker's own).
    screen_dir: Path | None = None
    screen_python: str | None = None


class RemediationSettings(BaseModel):
    """An incident's timings, given to each incident when it opens."""

    repair_timeout_s: float = 900
    # How often an incident held by the fleet guard asks again to be admitted.
    admission_poll_s: float = 30


class WorkerSettings(BaseModel):
    """The worker process: its Prometheus metrics and its stuck-run check."""

    # The worker's Prometheus metrics (workers/metrics.py) on this port; None: not served.
    # 0: a free port (tests).
    metrics_port: int | None = Field(
        default=None, ge=0, le=65535, description="worker /metrics port"
    )
    # Loopback unless a container or pod network, where Prometheus scrapes from another
    # address, asks for 0.0.0.0; off loopback the worker refuses to serve without a token.
    metrics_host: str = Field(
        default="127.0.0.1", description="address the worker's /metrics listens on"
    )
    metrics_token: SecretStr | None = Field(
        default=None, description="bearer token the worker's /metrics asks for; required "
        "off loopback"
    )  # fmt: skip
    # How often the worker looks for runs whose history its code cannot replay and resets
    # them (workers/stuck_runs.py); 0: never.
    stuck_run_check_s: float = Field(default=30, ge=0, description="stuck-run check interval")


class ConsoleSettings(BaseModel):
    """The web console (/ui, clients/console): who may see it without logging in, and how
    long a login lasts."""

    loopback_open: bool = Field(
        default=False,
        description="serve /ui without a login to loopback callers, only while the API "
        "itself binds a loopback address (a sandbox on one machine)",
    )
    session_s: int = Field(
        default=8 * 3600, ge=60, le=7 * 86400, description="console login lifetime, seconds"
    )
    secret: SecretStr | None = Field(
        default=None,
        description="key that signs console session cookies; None: a random one per API "
        "process (a restart logs everyone out). Set it when several API replicas serve /ui",
    )


class MonitoringSettings(BaseModel):
    """The cluster's Prometheus and Alertmanager, and how their alerts name a node."""

    prometheus_url: str | None = Field(
        default=None,
        description="Prometheus root (http://host:9090): the console's node pages chart its "
        "DCGM series, the worker reads GPU demand from it; None: neither",
    )
    alertmanager_url: str | None = Field(
        default=None,
        description="Alertmanager root (http://host:9093): from drain to close, an incident "
        "silences its node's other alerts there; None: no silences",
    )
    alert_node_label: str = Field(
        default="Hostname",
        pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$",
        description="the alert label that names the node (dcgm-exporter: Hostname; "
        "relabelled scrapes often use node)",
    )
    silence_max_s: int = Field(
        default=12 * 3600,
        ge=60,
        le=7 * 86400,
        description="a silence's end time from its start: one whose lift is lost still ends",
    )


class ApprovalSettings(BaseModel):
    """A person's decision (approve, reject) reaches a workflow with a proof of who made
    it, signed by the API once it verified them (Slack's signature, or their own operator
    token): core/decision_proof.py. The API and the worker hold the keys, never a CLI: the
    worker refuses every decision without a valid proof, so reaching Temporal is not enough
    to approve."""

    keys: list[SecretStr] = Field(
        default_factory=list,
        description="keys that sign (the first) and check (all) the proof of who decided "
        "(rotation); none: every decision is refused",
    )

    @field_validator("keys")
    @classmethod
    def _long_keys(cls, v: list[SecretStr]) -> list[SecretStr]:
        # HS256 with a key shorter than its hash is guessable offline from one proof.
        if any(len(k.get_secret_value()) < 32 for k in v):
            raise ValueError("each approval key needs at least 32 characters")
        return v


class HandoffSettings(BaseModel):
    """The hand-off to the provider (policy handoff, docs/handoff.md)."""

    # The worker signs the outbound webhook with it, the API verifies the provider's answers
    # with it; None: no hand-off can be sent, no answer is taken.
    secret: SecretStr | None = Field(
        default=None,
        description="secret shared with the provider: signs hand-offs, verifies answers",
    )

    @field_validator("secret")
    @classmethod
    def _long_secret(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None and len(v.get_secret_value()) < MIN_SECRET_CHARS:
            raise ValueError(f"the hand-off secret needs at least {MIN_SECRET_CHARS} characters")
        return v
