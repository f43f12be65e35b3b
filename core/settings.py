"""Settings for every entry point: environment (AUTOCLUSTERS_*) over a TOML file over defaults.

The file is named by AUTOCLUSTERS_CONFIG; without it, the default sandbox's file is used
while that sandbox is running, so `autoclusters incident open ...` just works after
`autoclusters sandbox up`, and a stopped sandbox's leftover file (its kubeconfig, its API
tokens) is never read.
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from autoclusters.core.handoff import MIN_SECRET_CHARS
from autoclusters.core.policy import Policy, default_policy, load_policy
from autoclusters.core.process_start import start_ticks
from autoclusters.core.slack_config import SlackConfig

DEFAULT_SANDBOX_DIR = Path.home() / ".autoclusters" / "sandbox"
CONFIG_FILE_NAME = "autoclusters.toml"
# What `sandbox up` writes into its state dir (sandbox/runtime/config.py,
# sandbox/runtime/processes.py): the sandbox's record, and one JSON record per process under pids/.
SANDBOX_RECORD_NAME = "autoclusters.sandbox.json"
SANDBOX_LIVENESS_PROCESS = "temporal"  # every client of a sandbox talks to it


def default_sandbox_dir() -> Path:
    """The default sandbox's state dir, from HOME as it is now (not at import)."""
    return Path.home() / ".autoclusters" / "sandbox"


def sandbox_running(state_dir: Path) -> bool:
    """Whether the sandbox in `state_dir` runs: its record exists and its Temporal server's
    recorded PID is alive with the recorded start time (a reused PID is not ours).

    A minimal, read-only copy of sandbox/runtime/processes.py's check: core imports no sandbox code.
    """
    if not (state_dir / SANDBOX_RECORD_NAME).is_file():
        return False
    try:
        rec = json.loads((state_dir / "pids" / f"{SANDBOX_LIVENESS_PROCESS}.json").read_text())
        pid, ticks = int(rec["pid"]), int(rec["start_ticks"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return pid > 0 and start_ticks(pid) == ticks


def config_file() -> Path | None:
    """AUTOCLUSTERS_CONFIG; else the default sandbox's file while that sandbox runs."""
    if os.environ.get("AUTOCLUSTERS_CONFIG"):
        return Path(os.environ["AUTOCLUSTERS_CONFIG"])
    state_dir = default_sandbox_dir()
    default = state_dir / CONFIG_FILE_NAME
    return default if default.exists() and sandbox_running(state_dir) else None


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AUTOCLUSTERS_", extra="ignore")

    temporal_address: str = "127.0.0.1:7233"
    temporal_namespace: str = "default"
    temporal_ui_url: str = "http://127.0.0.1:8233"
    # A Temporal reached over TLS (Temporal Cloud, or a self-hosted frontend with TLS):
    # mTLS with a client certificate and key, or an API key (which implies TLS). Files, not
    # values, so they can be mounted from a Kubernetes Secret and rotated in place.
    temporal_tls: bool = Field(
        default=False, description="connect with TLS (implied by a client cert or API key)"
    )
    temporal_tls_cert: Path | None = Field(default=None, description="mTLS client cert (PEM)")
    temporal_tls_key: Path | None = Field(default=None, description="mTLS client key (PEM)")
    temporal_tls_ca: Path | None = Field(
        default=None, description="CA that signed the server's cert; None: the system roots"
    )
    temporal_tls_server_name: str | None = Field(
        default=None, description="the name the server's cert is checked against"
    )
    temporal_api_key: SecretStr | None = Field(
        default=None, description="Temporal Cloud API key (sent as a bearer token over TLS)"
    )
    task_queue: str = "autoclusters"
    cluster: str = "sandbox"

    slurm_conf: Path | None = Field(default=None, description="SLURM_CONF of the cluster")
    slurm_bin_dir: Path | None = None

    # Slurm on Kubernetes (Slinky): the cluster's kubeconfig; None: Slurm only.
    kubeconfig: Path | None = None

    cloud_provider: Literal["crusoe"] = "crusoe"
    # Crusoe: credentials come from CRUSOE_* or ~/.crusoe/config, never from here.
    crusoe_profile: str | None = None
    crusoe_config_file: Path | None = None  # default ~/.crusoe/config
    crusoe_project_id: str | None = None  # default: the credentials' default project
    crusoe_cluster_id: str | None = None  # CMK cluster: replace through AutoClusters remediate
    crusoe_node_pool_ids: list[str] = Field(default_factory=list)  # replace = delete, pool refills
    crusoe_poll_s: float = 2
    crusoe_replace_timeout_s: float = 840  # below repair_timeout_s
    sandbox_state_dir: Path | None = None
    boot_delay_s: float = Field(default=20.0, ge=0, description="replacement VM boot time")

    # Slack: one thread per incident, approval buttons; None: Slack is off.
    slack: SlackConfig | None = None
    # Where people reach the API (the incident links in Slack).
    api_public_url: str | None = None
    expected_gpus: int = 8  # per node, for the health gate (and the screen's ranks per node)
    # The burn-in screen (policy burn_in): a directory every node and the worker see, for
    # its job's output and rendezvous (None: the sandbox's state dir, else
    # ~/.autoclusters/screens, which is right only where that home is shared), and the
    # Python with torch that runs it on the nodes (None: the worker's own).
    screen_dir: Path | None = None
    screen_python: str | None = None
    repair_timeout_s: float = 900
    policy_file: Path | None = Field(default=None, description="remediation policy (YAML)")
    admission_poll_s: float = 30
    # How often the worker looks for runs whose history its code cannot replay and resets
    # them (workers/stuck_runs.py); 0: never.
    stuck_run_check_s: float = Field(default=30, ge=0, description="stuck-run check interval")
    log_level: str = "INFO"
    # The worker's Prometheus metrics (workers/metrics.py) on this port; None: not served.
    # 0: a free port (tests).
    worker_metrics_port: int | None = Field(
        default=None, ge=0, le=65535, description="worker /metrics port"
    )
    # Loopback unless a container or pod network, where Prometheus scrapes from another
    # address, asks for 0.0.0.0; off loopback the worker refuses to serve without a token.
    worker_metrics_host: str = Field(
        default="127.0.0.1", description="address the worker's /metrics listens on"
    )
    worker_metrics_token: SecretStr | None = Field(
        default=None, description="bearer token the worker's /metrics asks for; required "
        "off loopback"
    )  # fmt: skip

    # The web console (/ui, clients/console): who may see it without logging in, how long
    # a login lasts, and where the node pages read GPU metrics from.
    console_loopback_open: bool = Field(
        default=False,
        description="serve /ui without a login to loopback callers, only while the API "
        "itself binds a loopback address (a sandbox on one machine)",
    )
    console_session_s: int = Field(
        default=8 * 3600, ge=60, le=7 * 86400, description="console login lifetime, seconds"
    )
    console_secret: SecretStr | None = Field(
        default=None,
        description="key that signs console session cookies; None: a random one per API "
        "process (a restart logs everyone out). Set it when several API replicas serve /ui",
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
    # The CLI's way to the API (`autoclusters approve`): its address (default: api_public_url,
    # else the API's default address) and the person's own operator token, which says who
    # they are (AUTOCLUSTERS_API_TOKEN).
    api_url: str | None = Field(default=None, description="the API, for the CLI's decisions")
    api_token: SecretStr | None = Field(
        default=None, description="your own operator token: the CLI decides as its person"
    )
    # A person's decision (approve, reject) reaches a workflow with a proof of who made it,
    # signed by the API once it verified them (Slack's signature, or their own operator
    # token): core/decision_proof.py. The first key signs, every key verifies (rotation).
    # The API and the worker hold them, never a CLI: the worker refuses every decision
    # without a valid proof, so reaching Temporal is not enough to approve.
    approval_keys: list[SecretStr] = Field(
        default_factory=list,
        description="keys that sign (the first) and check (all) the proof of who decided; "
        "none: every decision is refused",
    )
    # The hand-off to the provider (policy handoff, docs/handoff.md): the secret shared with
    # the provider. The worker signs the outbound webhook with it, the API verifies the
    # provider's answers with it; None: no hand-off can be sent, no answer is taken.
    handoff_secret: SecretStr | None = Field(
        default=None,
        description="secret shared with the provider: signs hand-offs, verifies answers",
    )
    prometheus_url: str | None = Field(
        default=None,
        description="Prometheus root (http://host:9090) whose HTTP API the console's node "
        "pages query for the last hour of DCGM series; None: no charts",
    )

    @field_validator("approval_keys")
    @classmethod
    def _long_keys(cls, v: list[SecretStr]) -> list[SecretStr]:
        # HS256 with a key shorter than its hash is guessable offline from one proof.
        if any(len(k.get_secret_value()) < 32 for k in v):
            raise ValueError("each approval key needs at least 32 characters")
        return v

    @field_validator("handoff_secret")
    @classmethod
    def _long_handoff_secret(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None and len(v.get_secret_value()) < MIN_SECRET_CHARS:
            raise ValueError(f"the hand-off secret needs at least {MIN_SECRET_CHARS} characters")
        return v

    def api_base_url(self) -> str:
        return (self.api_url or self.api_public_url or "http://127.0.0.1:8480").rstrip("/")

    @field_validator(
        "temporal_tls_cert",
        "temporal_tls_key",
        "temporal_tls_ca",
        "temporal_tls_server_name",
        "temporal_api_key",
        mode="before",
    )
    @classmethod
    def _empty_is_unset(cls, v: object) -> object:
        # A Secret or ConfigMap key left empty (a placeholder) means "not used", not the
        # path "." or an empty API key.
        return None if v == "" else v

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        path = config_file()
        if path is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=path))
        return tuple(sources)


def load(**overrides: object) -> Settings:
    return Settings(**overrides)  # type: ignore[arg-type]


def load_file(path: Path) -> Settings:
    """Exactly the settings in one TOML file (a sandbox's), whatever the environment says."""
    with open(path, "rb") as f:
        return Settings(**tomllib.load(f))


def policy_for(settings: Settings) -> Policy:
    """The cluster's remediation policy: the configured file, or the shipped default."""
    if settings.policy_file is None:
        return default_policy()
    return load_policy(settings.policy_file)
